"""The plan's low/high split, executed naively, equals the reference evaluator.

A plain-numpy stand-in for the two stages follows the plan only: the "low level" evaluates the
LowLevelPlan (WHERE, pane id, keys, sub-aggregates) and cuts every (pane, group) into several
partial rows at random, like hash-table evictions; the "high level" combines partials with the
super-aggregates, assembles panes into windows (Paned-WID), finalises, applies HAVING and
computes the outputs. Whatever the cut, the result must equal `tests.oracles.reference`
(docs/semantics.md: results never depend on how many partial rows the low level produced;
"Sub-aggregates and super-aggregates").
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capture.schema import protocol_mask
from lowlevel.evaluate import evaluate, evaluate_columns, evaluate_predicate, pane_ids
from lowlevel.hll import registers_of
from lowlevel.values import truthy
from queries.parser import parse
from queries.plan import HighLevelPlan, LowLevelPlan
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file, group_codes
from tests.oracles.samples import random_batch

_UFUNC = {"sum": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
          "or": np.bitwise_or, "xor": np.bitwise_xor}


def _take(v, idx):
    return (v[0][idx], v[1][idx]) if isinstance(v, tuple) else v[idx]


def _cat(parts):
    if isinstance(parts[0], tuple):
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return np.concatenate(parts)


def _reduce(fn, values, codes, n):
    out = None
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(np.r_[True, codes[order][1:] != codes[order][:-1]])
    with np.errstate(over="ignore"):
        out = fn.reduceat(values[order], starts)
    assert len(out) == n
    return out


def _pick(values, times, codes, n, last):
    order = np.lexsort((values, times, codes))
    sc = codes[order]
    edge = np.r_[sc[1:] != sc[:-1], True] if last else np.r_[True, sc[1:] != sc[:-1]]
    idx = order[np.flatnonzero(edge)]
    return values[idx], times[idx]


def _combine(frame: dict, keys: list[str], states, n: int, sub_of: dict) -> tuple[dict, int]:
    """Group rows by `keys` and combine every state column (the super-aggregates)."""
    codes, groups = group_codes([frame[k] for k in keys], n)
    first = np.full(groups, -1, np.int64)
    first[codes[::-1]] = np.arange(n)[::-1]
    out = {k: _take(frame[k], first) for k in keys}
    for name, kind in states:
        v = frame[name]
        if sub_of[name] == "distinct":
            regs = np.zeros((groups, v.shape[1]), np.uint8)
            np.maximum.at(regs, codes, v)
            out[name] = regs
        elif kind in ("first", "last"):
            out[name], out[name + "_t"] = _pick(v, frame[name + "_t"], codes, groups, kind == "last")
        else:
            out[name] = _reduce(_UFUNC[kind], v, codes, groups)
    return out, groups


def low_level(plan: LowLevelPlan, rows, n: int, rng, times=None) -> tuple[dict, int]:
    """Partial rows of one low plan; `rows` is a PacketBatch or (query input) a column dict."""
    if plan.source_kind == "link":
        need = protocol_mask(plan.protocol)
        mask = ((rows["layers"] & need) != 0) if need else np.ones(rows.n, bool)
        rows = rows.take(mask & evaluate_predicate(plan.predicate, rows))
        n = rows.n
        ev = lambda e: evaluate(e, rows)  # noqa: E731
        pane = pane_ids(plan.window, rows)
        times = rows["timestamp"]
    else:
        if plan.predicate is not None:
            keep = np.flatnonzero(truthy(evaluate_columns(plan.predicate, rows, n)))
            rows, n = {k: _take(v, keep) for k, v in rows.items()}, len(keep)
        ev = lambda e: evaluate_columns(e, rows, n)  # noqa: E731
        pane = np.asarray(ev(plan.window.expr)).astype(np.int64)
        times = np.zeros(n, np.int64)
    frame = {"_pane": pane}
    for k in plan.keys:
        frame[k.name] = ev(k.expr)
    # evictions: every row goes to one of up to 4 partial rows of its (pane, group)
    frame["_cut"] = rng.integers(0, 4, n)
    codes, groups = group_codes([frame[c] for c in frame], n)
    first = np.full(groups, -1, np.int64)
    first[codes[::-1]] = np.arange(n)[::-1]
    out = {c: _take(v, first) for c, v in frame.items() if c != "_cut"}
    for s in plan.subaggs:
        if s.kind == "count":
            out[s.name] = np.bincount(codes, minlength=groups).astype(np.uint64)
            continue
        arg = ev(s.arg)
        if s.kind == "distinct":
            out[s.name] = registers_of(arg, codes, groups, plan.distinct_registers)
            continue
        arg = arg.astype(np.dtype(s.dtype))
        if s.kind in ("first", "last"):
            out[s.name], out[s.name + "_t"] = _pick(arg, times, codes, groups, s.kind == "last")
        else:
            out[s.name] = _reduce(_UFUNC[s.kind], arg, codes, groups)
    return out, groups


def high_level(h: HighLevelPlan, partials: list[tuple[dict, int]]) -> tuple[dict, int]:
    n = sum(p[1] for p in partials)
    cols = list(partials[0][0])
    frame = {c: _cat([p[0][c] for p in partials]) for c in cols}
    states = [(s.name, s.kind) for s in h.superaggs]
    sub_of = {s.name: s.sub_kind for s in h.superaggs}
    keys = ["_pane"] + [k.name for k in h.keys]
    frame, n = _combine(frame, keys, states, n, sub_of)
    w = h.window
    if w.sliding:
        per_slide, per_window = w.slide_ns // w.pane_ns, w.range_ns // w.pane_ns
        p = frame["_pane"]
        lo = np.floor_divide(p, per_slide)
        count = np.floor_divide(p + per_window, per_slide) - lo
        idx = np.repeat(np.arange(n), count)
        wid = np.repeat(lo, count) + (np.arange(len(idx)) - np.repeat(np.cumsum(count) - count, count))
        frame = {c: _take(v, idx) for c, v in frame.items()}
        frame["_pane"] = wid
        frame, n = _combine(frame, keys, states, len(idx), sub_of)
    frame[w.column] = (frame["_pane"] * w.scale + w.shift).astype(np.int64)
    for f in h.finals:
        frame[f.name] = evaluate_columns(f.expr, frame, n) if n else np.zeros(0)
    if h.having is not None and n:
        keep = np.flatnonzero(truthy(evaluate_columns(h.having, frame, n)))
        frame, n = {c: _take(v, keep) for c, v in frame.items()}, len(keep)
    return {o.name: evaluate_columns(o.expr, frame, n) for o in h.outputs}, n


def run_split(fp, batches, seed):
    rng = np.random.default_rng(seed)
    tables = {}
    for q in fp.queries:
        if q.high.input_kind == "links":
            parts = [low_level(lp, batches[lp.link], 0, rng) for lp in q.low]
        else:
            (rp,) = q.high.row_plans
            src, n = tables[rp.link]
            parts = [low_level(rp, src, n, rng)]
        tables[q.name] = high_level(q.high, parts)
    return tables


def as_sorted_frame(cols: dict, names: list[str]) -> pd.DataFrame:
    data = {}
    for k in names:
        v = cols[k]
        if isinstance(v, tuple):
            v = [(int(a) << 64) | int(b) for a, b in zip(*v)]
        data[k] = [round(x, 6) if isinstance(x, float) else x for x in np.asarray(v, dtype=object).tolist()]
    df = pd.DataFrame(data, columns=names)
    return df.sort_values(names).reset_index(drop=True) if len(df) else df


QUERIES = [
    "SELECT tb, srcIP, destIP, count(*) FROM main.IPV4 GROUP BY time/60 AS tb, srcIP, destIP",
    "SELECT tb, srcPort, count(*), SUM(len), AVG(len), MIN(ttl), MAX(len), AND_AGGR(flags), "
    "OR_AGGR(flags), XOR_AGGR(seq), FIRST(seq), LAST(seq), COUNT_DISTINCT(destPort) "
    "FROM main.TCP WHERE ttl > 1 GROUP BY (time + 30)/120*2 - 1 AS tb, srcPort HAVING count(*) > 20",
    "SELECT srcIP, count(*) [RANGE 5 minutes, SLIDE 2 minutes] AS n, "
    "MAX(len) [RANGE 5 minutes, SLIDE 2 minutes] AS big, AVG(len) [RANGE 5 minutes, SLIDE 2 minutes] AS a "
    "FROM main.IP GROUP BY srcIP",
    "SELECT prefix(srcIP, 24) AS net, count(*) [RANGE 10 seconds, SLIDE 10 seconds, WA timestamp_ms] "
    "FROM main.IP GROUP BY prefix(srcIP, 24) AS net",
    "SELECT tb, protocol, SUM(LLONG(len) - 700) AS excess, ip_str(IP_VAL '10.0.0.1') AS s "
    "FROM [main, other].IP GROUP BY timestamp_ms/45000 AS tb, protocol HAVING SUM(len) > 1000",
    "DEFINE { query_name m1; } SELECT tb, srcIP, count(*) AS c, SUM(len) AS b FROM main.IP "
    "GROUP BY time/60 AS tb, srcIP;"
    "DEFINE { query_name m5; } SELECT t5, srcIP, SUM(c) AS c, MAX(b) AS b, AVG(c) AS avg_c "
    "FROM m1 WHERE c > 1 GROUP BY tb/5 AS t5, srcIP HAVING SUM(c) > 5",
]


@pytest.mark.parametrize("text", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
@pytest.mark.parametrize("seed", [1, 2])
def test_split_equals_reference(text, seed):
    batches = {"main": random_batch(6000, seed=seed, span_s=900, sort=False),
               "other": random_batch(2000, seed=seed + 100, link="other", span_s=900)}
    fp = plan_file(parse(text), list(batches), source=text)
    expected = evaluate_file(fp, batches)
    got = run_split(fp, batches, seed)
    for q in fp.queries:
        names = q.output_names
        want = expected[q.name]
        want_sorted = as_sorted_frame({k: want[k].to_numpy() for k in names}, names)
        have_sorted = as_sorted_frame(got[q.name][0], names)
        assert len(want_sorted) > 0
        assert want_sorted.astype(str).equals(have_sorted.astype(str)), q.name


def test_sliding_window_over_a_query_column():
    text = ("DEFINE { query_name m1; } SELECT tb, srcIP, count(*) AS c FROM main.IP "
            "GROUP BY time/60 AS tb, srcIP;"
            "DEFINE { query_name s5; } SELECT srcIP, SUM(c) [RANGE 5 minutes, SLIDE 2 minutes, WA tb] AS n "
            "FROM m1 GROUP BY srcIP;"
            "DEFINE { query_name direct; } SELECT srcIP, count(*) [RANGE 5 minutes, SLIDE 2 minutes] AS n "
            "FROM main.IP GROUP BY srcIP")
    batches = {"main": random_batch(5000, seed=9, span_s=900)}
    fp = plan_file(parse(text), ["main"], source=text)
    (rp,) = fp.query("s5").high.row_plans
    assert rp.window.pane_ns == 60 * 10**9 and rp.window.expr is not None
    expected = evaluate_file(fp, batches)
    got = run_split(fp, batches, 3)
    names = fp.query("s5").output_names
    a = as_sorted_frame({k: expected["s5"][k].to_numpy() for k in names}, names)
    b = as_sorted_frame(got["s5"][0], names)
    assert a.astype(str).equals(b.astype(str)) and len(a)
    # tb counts minutes, so the window ends are in minutes: the same windows as over packets
    d = expected["direct"]
    assert sorted(zip((d["window_end"] // 60).tolist(), d["srcIP"].tolist(), d["n"].tolist())) == \
        sorted(zip(expected["s5"]["window_end"].tolist(), expected["s5"]["srcIP"].tolist(),
                   expected["s5"]["n"].tolist()))


# --- random aggregation queries ------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

AGGS = ["count(*)", "SUM(len)", "AVG(ip_len)", "MIN(ttl)", "MAX(seq)", "AND_AGGR(flags)",
        "OR_AGGR(tos)", "XOR_AGGR(ack)", "FIRST(win)", "LAST(srcPort)", "COUNT_DISTINCT(destPort)",
        "SUM(LLONG(len) - 1000)", "MAX(if_else(flags & 2 = 2, len, 0))"]
KEYS = ["srcIP", "destIP", "srcPort", "protocol", "prefix(srcIP, 24) AS net", "flags & 0x12 AS sa"]
WHERES = ["", "WHERE ttl > 1", "WHERE len > 500 OR destPort IN [53, 443]",
          "WHERE NOT (flags & 4 = 4) AND prefix(destIP, 16) <> IP_VAL '10.1.0.0'"]


@st.composite
def aggregation_queries(draw):
    aggs = draw(st.lists(st.sampled_from(AGGS), min_size=1, max_size=4, unique=True))
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=2, unique=True))
    where = draw(st.sampled_from(WHERES))
    names = [k.split(" AS ")[-1] for k in keys]
    if draw(st.booleans()):
        r = draw(st.sampled_from([60, 120, 300]))
        s = draw(st.sampled_from([x for x in (20, 60, 90, 120, 300) if x <= r]))
        spec = f" [RANGE {r} seconds, SLIDE {s} seconds]"
        items = names + [a + spec for a in aggs]
        group = f"GROUP BY {', '.join(keys)}" if keys else ""
        if not keys:
            items = [a + spec for a in aggs]
            return f"SELECT {', '.join(items)} FROM main.TCP {where}"
        return f"SELECT {', '.join(items)} FROM main.TCP {where} {group}"
    tb = draw(st.sampled_from(["time/60", "time/120*2", "(time + 7)/30", "timestamp_ms/45000 + 3"]))
    having = draw(st.sampled_from(["", "HAVING count(*) > 3", f"HAVING {aggs[0]} >= 0"]))
    group = ", ".join([f"{tb} AS tb"] + keys)
    return f"SELECT {', '.join(['tb'] + names + aggs)} FROM [main, other].TCP {where} GROUP BY {group} {having}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(aggregation_queries(), st.integers(0, 1000))
def test_random_aggregations_split_equals_reference(text, seed):
    batches = {"main": random_batch(1500, seed=seed, span_s=600, sort=False),
               "other": random_batch(500, seed=seed + 1, link="other", span_s=600)}
    links = ["main", "other"]
    fp = plan_file(parse(text), links, source=text)
    expected = evaluate_file(fp, {k: batches[k] for k in links})
    got = run_split(fp, batches, seed)
    (q,) = fp.queries
    names = q.output_names
    want = as_sorted_frame({k: expected[q.name][k].to_numpy() for k in names}, names)
    have = as_sorted_frame(got[q.name][0], names)
    assert want.astype(str).equals(have.astype(str)), text
