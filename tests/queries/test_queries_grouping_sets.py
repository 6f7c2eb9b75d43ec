"""GS-lite's CUBE / ROLLUP / GROUPING_SETS, FILTER_JOIN: patterns, plans, errors, low level vs reference."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queries.errors import QueryError
from queries.explain import format_plan
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch


def patterns(text: str):
    return plan_text(text, ["main"]).queries[0].analysed.patterns


HEAD = "SELECT tb, count(*) AS n FROM main.IPV4 GROUP BY time/60 AS tb, "


def test_cube_rollup_grouping_sets_patterns():
    assert patterns(HEAD + "CUBE(srcIP, destIP)") == (
        ("tb", "srcIP", "destIP"), ("tb", "srcIP"), ("tb", "destIP"), ("tb",))
    assert patterns(HEAD + "ROLLUP(srcIP, destIP, protocol)") == (
        ("tb", "srcIP", "destIP", "protocol"), ("tb", "srcIP", "destIP"), ("tb", "srcIP"),
        ("tb",))
    assert patterns(HEAD + "GROUPING_SETS((srcIP, destIP), (srcIP), (destIP))") == (
        ("tb", "srcIP", "destIP"), ("tb", "srcIP"), ("tb", "destIP"))
    # the product of the entries' patterns (the manual's 16-pattern example has 4 x 4)
    ps = patterns(HEAD + "Cube(srcIP, prefix(destIP, 24) AS net), rollup(protocol, ttl, tos)")
    assert len(ps) == 16
    assert patterns(HEAD + "srcIP") is None


def test_plan_keeps_a_hidden_pattern_key_and_defaults():
    fp = plan_text(HEAD + "CUBE(srcIP, ttl)", ["main"])
    low = fp.queries[0].low[0]
    assert [k.name for k in low.keys] == ["srcIP", "ttl", "_pattern"]
    assert len(low.patterns) == 4
    # pattern 3: both absent, at the type's default (0.0.0.0 and 0)
    absent = low.patterns[3]
    assert absent[0].value == 0 and absent[0].kind == "ip"
    assert absent[1].value == 0 and absent[2].value == 3
    assert fp.queries[0].output_names == ["tb", "n"]
    text = format_plan(fp)
    assert "grouping patterns: 4" in text
    assert "_pattern 1: (tb, srcIP, -); ttl = 0" in text


def _error(text: str) -> tuple[str, tuple[int, int]]:
    marker = text.index("@")
    src = text.replace("@", "", 1)
    with pytest.raises(QueryError) as info:
        plan_text(src, ["main"])
    line = src.count("\n", 0, marker) + 1
    col = marker - (src.rfind("\n", 0, marker) + 1) + 1
    return str(info.value), (line, col)


ERRORS = [
    (HEAD.replace("tb, ", "tb, ", 1) + "srcIP, ROLLUP(@srcIP, destIP)",
     "'srcIP' is referenced in two entries"),
    (HEAD + "CUBE(srcIP, @srcIP)", "appears twice in one CUBE"),
    (HEAD + "GROUPING_SETS((srcIP), (srcIP, @srcIP))", "appears twice in one grouping set"),
    ("SELECT n FROM main.IPV4 GROUP BY CUBE(@time/60 AS tb, srcIP)",
     "temporal group item 'tb' cannot stand in CUBE"),
    ("DEFINE { idle_timeout 10s; } " + HEAD + "@CUBE(srcIP)", "not for flow queries"),
    ("SELECT R.time FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S "
     "WHERE R.time @= S.time", "no join predicate on temporal fields"),
    ("SELECT R.time FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S "
     "WHERE R.len @> 1", "at least one predicate"),
    ("SELECT R.time, @S.len FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S "
     "WHERE R.srcIP = S.srcIP", "reads the result stream R only"),
    ("SELECT R.time FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S "
     "WHERE R.srcIP = S.srcIP AND R.len @< S.len", "have the form (expression of R)"),
    ("SELECT R.time FILTER_JOIN(@len, 15) FROM main.TCP R, main.TCP S "
     "WHERE R.srcIP = S.srcIP", "must be an increasing (temporal) field"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb HAVING count(*) > 1;\n"
     "MERGE a.tb : b.tb SLACK @-2 FROM query_1 a, query_1 b", "non-negative integer constant"),
]


@pytest.mark.parametrize("text,fragment", ERRORS)
def test_errors_are_located(text, fragment):
    message, where = _error(text)
    assert fragment in message
    assert f"{where[0]}:{where[1]}:" in message


def test_filter_join_plans_a_semi_band_join():
    fp = plan_text("SELECT R.time, R.srcIP FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S "
                   "WHERE R.srcIP = S.srcIP AND S.flags & 2 = 2", ["main"])
    j = fp.queries[0].high.join
    assert j.type == "semi" and (j.left.range, j.right.range) == (1, 15)
    assert fp.queries[0].low[1].predicate is not None      # S's WHERE in its low level
    assert "FILTER_JOIN: each R row with a match in S passes once" in format_plan(fp)


def _union_of_group_bys(text_of, sets, batch) -> pd.DataFrame:
    """CUBE by its definition: one plain GROUP BY per pattern, absent columns at 0."""
    frames = []
    for present in sets:
        fp = plan_text(text_of(present), ["main"])
        frames.append(evaluate_file(fp, {"main": batch})["q"])
    return pd.concat(frames, ignore_index=True)


def _low_level_combined(fp, batch, chunk: int) -> pd.DataFrame:
    """The real low-level operator (batches of `chunk`) + a sum by (window, keys)."""
    import pyarrow as pa

    from lowlevel.operator import LowLevelOperator

    low = fp.queries[0].low[0]
    op = LowLevelOperator(low)
    out = []
    for i in range(0, len(batch), chunk):
        out += op.process(batch.take(np.arange(i, min(i + chunk, len(batch)))))
    rest, _ = op.finish()
    t = pa.Table.from_batches(out + rest).to_pandas()
    keys = [c for c in t.columns if c not in ("cnt", "sum_len")]
    return t.groupby(keys, as_index=False)[["cnt", "sum_len"]].sum()


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), kind=st.sampled_from(["CUBE", "ROLLUP"]),
       slots=st.sampled_from([2, 16, 4096]), chunk=st.sampled_from([7, 100, 1000]))
def test_cube_rollup_low_level_and_reference_agree(seed, kind, slots, chunk):
    batch = random_batch(400, seed=seed, span_s=240)
    text = (f"DEFINE {{ query_name q; aggregate_slots {slots}; }} "
            f"SELECT tb, srcIP, protocol, count(*) AS n, SUM(len) AS s FROM main.IPV4 "
            f"GROUP BY time/60 AS tb, {kind}(srcIP, protocol)")
    fp = plan_text(text, ["main"])
    got = evaluate_file(fp, {"main": batch})["q"]
    sets = [("srcIP", "protocol"), ("srcIP",), ()] if kind == "ROLLUP" else \
        [("srcIP", "protocol"), ("srcIP",), ("protocol",), ()]

    def plain(present):
        cols = ", ".join(("srcIP" if "srcIP" in present else "IP_VAL '0.0.0.0' AS srcIP",
                          "protocol" if "protocol" in present else "UINT(0) AS protocol"))
        group = ", ".join(("time/60 AS tb",) + present)
        return (f"DEFINE {{ query_name q; }} SELECT tb, {cols}, count(*) AS n, SUM(len) AS s "
                f"FROM main.IPV4 GROUP BY {group}")

    want = _union_of_group_bys(plain, sets, batch)
    cols = ["tb", "srcIP", "protocol", "n", "s"]

    def norm(f):
        return sorted(tuple(int(v) for v in row) for row in f[cols].itertuples(index=False))

    assert norm(got) == norm(want)
    # the low level's partial rows, combined, give the same groups per pattern
    low = _low_level_combined(fp, batch, chunk)
    assert len(low) == len(got)
    assert int(low["cnt"].sum()) == int(got["n"].sum())
    assert int(low["sum_len"].sum()) == int(got["s"].sum())
