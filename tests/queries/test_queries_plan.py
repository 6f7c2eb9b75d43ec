"""The planner: golden plans (query in, explain text out) and the plan's numbers checked one by one.

Regenerate the golden files with `OOPSCOPE_REGEN_GOLDEN=1 python -m pytest tests/queries/test_queries_plan.py`
and review the diff.
"""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path

import pytest

from common.errors import ConfigError
from queries import expressions as E
from queries.errors import QueryError
from queries.explain import explain_text
from queries.parser import parse
from queries.planner import plan_file

GOLDEN = Path(__file__).parent / "golden" / "plan"
CASES = sorted(GOLDEN.glob("*.gsql"))
REGEN = os.environ.get("OOPSCOPE_REGEN_GOLDEN") == "1"


def _options(text: str) -> tuple[list[str] | None, dict[str, str], dict[str, str]]:
    links, params, sets = [], {}, {}
    for line in text.splitlines():
        if line.startswith("-- explain:"):
            args = shlex.split(line.split(":", 1)[1])
            for opt, val in zip(args[::2], args[1::2]):
                if opt == "--link":
                    links.append(val)
                elif opt == "--param":
                    params.update([val.split("=", 1)])
                elif opt == "--set":
                    sets.update([val.split("=", 1)])
    return links or None, params, sets


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden_plan(case: Path):
    text = case.read_text()
    links, params, sets = _options(text)
    got = explain_text(text, path=case.name, links=links, params=params, overrides=sets)
    expected_path = case.with_suffix(".plan.txt")
    if REGEN or not expected_path.exists():
        if not REGEN:
            pytest.fail(f"no golden plan {expected_path.name}: run with OOPSCOPE_REGEN_GOLDEN=1")
        expected_path.write_text(got)
    assert got == expected_path.read_text()


def test_golden_cases_cover_every_construct():
    kinds = set()
    for case in CASES:
        links, params, sets = _options(case.read_text())
        fp = plan_file(parse(case.read_text(), path=case.name), links or ["main"], params, sets)
        for q in fp.queries:
            kinds.add(q.kind)
            w = q.high.window
            if w is not None:
                kinds.add("sliding" if w.sliding else "tumbling")
            if q.high.union:
                kinds.add(q.high.union)
            if q.high.join is not None:
                kinds.add("band" if q.high.join.temporal is None else "join_tumbling")
            if q.high.row_plans:
                kinds.add("query_on_query")
    assert kinds >= {"aggregate", "select", "join", "merge", "sliding", "tumbling", "meld",
                     "band", "join_tumbling", "query_on_query"}


def plan(text: str, links=("main",), params=None, sets=None):
    return plan_file(parse(text), list(links), params, sets, source=text)


def test_tumbling_window_numbers():
    q = plan("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb").queries[0]
    (low,) = q.low
    w = low.window
    assert (w.pane_ns, w.range_ns, w.slide_ns, w.column, w.scale, w.shift, w.offset_ns) == \
        (60 * 10**9, 60 * 10**9, 60 * 10**9, "tb", 1, 0, 0)
    q = plan("SELECT tb, count(*) FROM main.IP GROUP BY time/60*60 AS tb").queries[0]
    assert (q.low[0].window.pane_ns, q.low[0].window.scale) == (60 * 10**9, 60)
    q = plan("SELECT tb, count(*) FROM main.IP GROUP BY timestamp_ms/250 + 7 AS tb").queries[0]
    w = q.low[0].window
    assert (w.pane_ns, w.scale, w.shift) == (250 * 10**6, 1, 7)
    q = plan("SELECT tb, count(*) FROM main.IP GROUP BY (time + 30)/60 AS tb").queries[0]
    assert (q.low[0].window.pane_ns, q.low[0].window.offset_ns) == (60 * 10**9, 30 * 10**9)


@pytest.mark.parametrize("r,s", [(10, 4), (5, 1), (6, 6), (9, 6), (7, 3)])
def test_sliding_window_panes_are_the_gcd(r, s):
    text = (f"SELECT srcIP, count(*) [RANGE {r} minutes, SLIDE {s} minutes] "
            f"FROM main.IP GROUP BY srcIP")
    q = plan(text).queries[0]
    w = q.high.window
    g = math.gcd(r, s) * 60 * 10**9
    assert (w.pane_ns, w.range_ns, w.slide_ns) == (g, r * 60 * 10**9, s * 60 * 10**9)
    assert w.sliding == (r != s)
    assert q.high.outputs[0].name == "window_end"


def test_avg_shares_count_and_sum():
    q = plan("SELECT tb, count(*), AVG(len), SUM(len), AVG(ttl) FROM main.IP "
             "GROUP BY time/60 AS tb").queries[0]
    subs = [(s.kind, None if s.arg is None else s.arg.name) for s in q.low[0].subaggs]
    assert sorted(subs, key=str) == sorted([("count", None), ("sum", "len"), ("sum", "ttl")], key=str)
    supers = {s.name: s.kind for s in q.high.superaggs}
    assert set(supers.values()) == {"sum"}
    assert [c.name for c in q.high.outputs] == ["tb", "Cnt", "AVG_len", "SUM_len", "AVG_ttl"]


def test_superaggregates_follow_semantics_table():
    q = plan("SELECT tb, MIN(ttl), MAX(ttl), AND_AGGR(flags), OR_AGGR(flags), XOR_AGGR(flags), "
             "FIRST(len), LAST(len), COUNT_DISTINCT(srcPort) FROM main.TCP "
             "GROUP BY time/60 AS tb").queries[0]
    pairs = {(s.sub_kind, s.kind) for s in q.high.superaggs}
    assert pairs == {("min", "min"), ("max", "max"), ("and", "and"), ("or", "or"), ("xor", "xor"),
                     ("first", "first"), ("last", "last"), ("distinct", "max")}


@pytest.mark.parametrize("slots,expected", [(1, 1), (1000, 1024), (1024, 1024), (65537, 131072)])
def test_hash_table_size_rounds_up_to_a_power_of_two(slots, expected):
    q = plan(f"DEFINE {{ aggregate_slots {slots}; }} SELECT tb, count(*) FROM main.IP "
             f"GROUP BY time/60 AS tb").queries[0]
    assert q.low[0].slots == expected


@pytest.mark.parametrize("flush,i", [("oop_lazy", 160), ("oop_slow", 160), ("iop_slow", 1)])
def test_flush_defaults(flush, i):
    q = plan("SELECT tb, count(*) FROM [l1, l2].IP GROUP BY time/60 AS tb", links=("l1", "l2"),
             sets={"flush": flush}).queries[0]
    assert {(p.flush, p.slow_flush, p.max_disorder, p.slots) for p in q.low} == {(flush, i, 2, 65536)}
    assert q.high.union == ("merge" if flush == "iop_slow" else "meld")
    assert [p.link for p in q.low] == ["l1", "l2"]


def test_set_overrides_defines_and_is_validated():
    text = "DEFINE { slow_flush 16; } SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb"
    assert plan(text).queries[0].low[0].slow_flush == 16
    assert plan(text, sets={"slow_flush": "8"}).queries[0].low[0].slow_flush == 8
    with pytest.raises(ConfigError, match="slow_flush"):
        plan(text, sets={"slow_flush": "-3"})
    with pytest.raises(ConfigError, match="unknown DEFINE key"):
        plan(text, sets={"nosuch": "1"})


def test_parameters_are_bound_into_plan_expressions():
    text = ("PARAM { w uint; min ullong = 10; } SELECT tb, count(*) FROM main.IP "
            "GROUP BY time/$w AS tb HAVING count(*) > $min")
    q = plan(text, params={"w": "30"}).queries[0]
    assert q.low[0].window.pane_ns == 30 * 10**9
    assert not list(q.high.having.find_all(E.Param))
    assert q.params == {"w": 30, "min": 10}
    with pytest.raises(ConfigError, match="not a uint"):
        plan(text, params={"w": "thirty"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        plan(text, params={"w": "30", "other": "1"})


def test_ip_str_stays_in_the_high_level():
    q = plan("SELECT ip_str(srcIP) AS s, len FROM main.IP").queries[0]
    for p in q.low:
        for k in p.projections:
            assert not any(isinstance(n, E.Func) and n.name == "ip_str" for n in k.expr.walk())
    assert any(isinstance(n, E.Func) and n.name == "ip_str" for n in q.high.outputs[0].expr.walk())


def test_query_reading_a_query_is_marked_and_rolls_up():
    text = ("DEFINE { query_name m1; } SELECT tb, srcIP, count(*) AS Cnt FROM main.IP "
            "GROUP BY time/60 AS tb, srcIP; "
            "DEFINE { query_name m5; } SELECT tb5, SUM(Cnt) FROM m1 GROUP BY tb/5 AS tb5")
    fp = plan(text)
    assert fp.query("m1").read_by == ("m5",)
    m5 = fp.query("m5")
    assert m5.low == () and m5.high.input_kind == "queries" and m5.high.inputs == ("m1",)
    (rp,) = m5.high.row_plans
    assert rp.source_kind == "query" and rp.window.pane_ns == 300 * 10**9


def test_outputs_carry_types_and_temporal_forms():
    q = plan("SELECT tb, srcIP, SUM(len), AVG(len), MAX(timestamp) FROM main.IPV4 "
             "GROUP BY time/60 AS tb, srcIP").queries[0]
    assert [(c.name, c.type) for c in q.high.outputs] == [
        ("tb", "uint"), ("srcIP", "ipv4"), ("SUM_len", "ullong"), ("AVG_len", "float"),
        ("MAX_timestamp", "llong")]
    assert q.high.outputs[0].temporal is not None and q.high.outputs[1].temporal is None


def test_generated_names_are_unique():
    q = plan("SELECT tb, count(*), count(*) + 1, SUM(len), SUM(len) AS SUM_len_2, SUM(len * 2) "
             "FROM main.IP GROUP BY time/60 AS tb").queries[0]
    names = [c.name for c in q.high.outputs]
    assert len(set(names)) == len(names)
    assert names[:2] == ["tb", "Cnt"]


def test_join_plan_splits_the_condition():
    text = ("DEFINE { query_name a1; } SELECT tb, srcIP, count(*) AS c FROM main.IP "
            "GROUP BY time/60 AS tb, srcIP; "
            "DEFINE { query_name b1; } SELECT tb, destIP, count(*) AS c FROM main.IP "
            "GROUP BY time/60 AS tb, destIP; "
            "DEFINE { query_name j; } SELECT x.tb, x.c, y.c LEFT_OUTER_JOIN FROM a1 x, b1 y "
            "WHERE y.tb = x.tb AND x.srcIP = y.destIP AND x.c + 1 > y.c")
    j = plan(text).query("j").high.join
    assert j.type == "left"
    assert [(a.table, b.table) for a, b in j.keys] == [("x", "y")]
    assert (j.temporal[0].table, j.temporal[1].table) == ("x", "y")
    assert j.residual is not None and j.residual.op == ">"


def test_band_join_ranges():
    text = ("SELECT a.time, b.time INNER_JOIN FROM l1.IP [RANGE 3 minutes] a, "
            "l2.IP [RANGE 2 minutes] b WHERE a.srcIP = b.destIP")
    q = plan(text, links=("l1", "l2")).queries[0]
    j = q.high.join
    assert (j.left.range, j.right.range, j.temporal) == (180, 120, None)
    assert {(p.link, p.side) for p in q.low} == {("l1", "a"), ("l2", "b")}


def test_errors_for_unknown_links_are_query_errors():
    with pytest.raises(QueryError, match="unknown link 'nope'") as e:
        plan("SELECT tb, count(*) FROM nope.IP GROUP BY time/60 AS tb")
    assert (e.value.line, e.value.column) == (1, 26)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "queries" / "library").glob("*.gsql")),
                         ids=lambda p: p.stem)
def test_plans_pickle_for_other_processes(path):
    import pickle

    from queries.explain import format_plan, mentioned_links

    text = path.read_text()
    tree = parse(text, path=path.name)
    fp = plan_file(tree, mentioned_links(tree) or ["main"], source=text)
    again = pickle.loads(pickle.dumps(fp))
    assert again == fp
    assert format_plan(again) == format_plan(fp)
