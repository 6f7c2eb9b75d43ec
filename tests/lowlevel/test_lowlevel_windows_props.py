"""Sliding windows: window ids vs extents, and Paned-WID (low level + window level) = WID = reference.

Window-id property (docs/semantics.md "Windows"): for any RANGE r, SLIDE s (s need not divide
r), origin offset and time t, `w in wids(t) <=> t in extent(w)`, for each place that computes window ids:
the planner's `WindowPlan` with `lowlevel.evaluate.pane_ids`, the high level's `WindowLogic`,
and `tools.experiments.windowgrid.WindowGrid`; the oracle is the extent definition checked window by window.

Results (docs/semantics.md: its guarantees, and "Windows" on Paned-WID): the real low level
(`LowLevelOperator`) over packets in a random arrival order with grammatical punctuation every 10 ms, every second or only at the end, its
pane rows assembled into windows when its punctuation passes their end (a plain pandas window
level written here), equals the WID model (`tools.experiments.windowgrid.WidOperator`) fed the same arrivals,
equals the reference evaluator, for COUNT, SUM, AVG, MIN, MAX per group.
"""

from __future__ import annotations

from math import gcd

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture.batch import PacketBatch
from highlevel.windows import WindowLogic
from lowlevel.evaluate import pane_ids
from lowlevel.operator import LowLevelOperator
from lowlevel.testing import arrival_order
from queries.plan import WindowPlan
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch
from tools.experiments.windowgrid import WidOperator, WindowGrid, source_punctuation

MS = 1_000_000


def _extent_windows(t: int, r: int, s: int, offset: int) -> set[int]:
    """Oracle: every w with (w+1)s - r <= t + offset < (w+1)s, by scanning the ids near t."""
    x = t + offset
    centre = x // s
    return {w for w in range(centre - 3, centre + r // s + 3)
            if (w + 1) * s - r <= x < (w + 1) * s}


@st.composite
def grids(draw):
    unit = draw(st.sampled_from([1, 7, 1000, 250 * MS]))
    s = draw(st.integers(1, 12)) * unit
    r = s * draw(st.integers(1, 4)) + draw(st.integers(0, 11)) * unit   # s often not dividing r
    offset = draw(st.integers(-3 * r, 3 * r))
    return r, s, offset


@settings(max_examples=300, deadline=None)
@given(grids(), st.lists(st.integers(-10**12, 10**12), min_size=1, max_size=8))
def test_window_ids_match_extents(grid, times):
    r, s, offset = grid
    g = gcd(r, s)
    plan = WindowPlan(pane_ns=g, range_ns=r, slide_ns=s, offset_ns=offset)
    logic = WindowLogic(r, s, offset)
    wg = WindowGrid(r, s, offset)
    batch = PacketBatch.empty("main", len(times))
    batch.columns["timestamp"][:] = times
    panes = pane_ids(plan, batch)
    rows, wid = wg.expand(np.array(times, np.int64))
    for j, t in enumerate(times):
        want = _extent_windows(t, r, s, offset)
        p = int(panes[j])
        # the pane holds t, and its windows are exactly those whose extent holds t
        assert p * g - offset <= t < plan.pane_end_ns(p)
        assert set(plan.windows_of_pane(p)) == want
        assert set(logic.windows_of_pane(p)) == want
        assert logic.last_window_of_pane(p) == max(want)
        assert set(wid[rows == j].tolist()) == want
        # in floor(r/s) or ceil(r/s) windows, every one ending after t, at the same instants
        assert len(want) in (r // s, -(-r // s))
        for w in want:
            assert plan.window_end_ns(w) == logic.window_end(w) == int(wg.end(w))
            assert wg.start(w) <= t < plan.window_end_ns(w)


# --- results under disorder and punctuation frequency ---------------------------------------------

QUERY = """DEFINE {{ query_name sw; }}
SELECT srcPort, COUNT(*) [RANGE {r} ms, SLIDE {s} ms, WA timestamp] AS cnt, SUM(len) AS total,
       AVG(len) AS mean, MIN(len) AS lo, MAX(len) AS hi
FROM main.IP GROUP BY srcPort;"""
EVERY = {"10ms": 10 * MS, "1s": 1000 * MS, "end": None}
COLUMNS = ["window_end", "srcPort", "cnt", "total", "mean", "lo", "hi"]


def feed(op: LowLevelOperator, batch: PacketBatch, punct: list[tuple[int, int]], rows: int = 37):
    """Arrivals in batches (split at punctuation); returns pane rows with the event after
    which each left the operator and the operator's punctuation [(event, P)]."""
    n = len(batch)
    at = {j + 1: p for j, p in punct}
    cuts = sorted(set(at) | set(range(rows, n, rows)) | {n})
    out, events, puncts = [], [], []

    def keep(parts, event):
        for b in parts:
            if b.num_rows:
                out.append(b.to_pandas())
                events.append(np.full(b.num_rows, event))

    a0 = 0
    for a1 in cuts:
        keep(op.process(batch.slice(a0, a1)), a1 - 1)
        a0 = a1
        if a1 in at:
            parts, p = op.punctuate(at[a1])
            keep(parts, a1 - 1)
            if p is not None:
                puncts.append((a1 - 1, p))
    parts, p = op.finish()
    keep(parts, n)
    puncts.append((n, np.iinfo(np.int64).max))   # end of input: every window may close
    frame = pd.concat(out, ignore_index=True)
    frame["event"] = np.concatenate(events)
    return frame, puncts


def window_level(frame: pd.DataFrame, puncts, plan, grid: WindowGrid) -> pd.DataFrame:
    """Paned-WID's window level: each window from the pane rows that had arrived when the
    first punctuation >= its end came (rows arriving later would be lost: checked below)."""
    w = plan.window
    start = frame["window"].to_numpy() * w.pane_ns - w.offset_ns
    rows, wid = grid.expand(start)
    pe = np.array([e for e, _ in puncts])
    pv = np.maximum.accumulate(np.array([p for _, p in puncts], np.int64))
    closing = pe[np.searchsorted(pv, grid.end(wid), side="left")]
    assert (frame["event"].to_numpy()[rows] <= closing).all(), "a pane row came after its window closed"
    names = {s.kind: s.name for s in plan.subaggs}
    x = frame.iloc[rows].assign(wid=wid)
    out = x.groupby(["wid", "srcPort"]).agg(cnt=(names["count"], "sum"),
                                            total=(names["sum"], "sum"),
                                            lo=(names["min"], "min"), hi=(names["max"], "max"))
    out = out.reset_index()
    out["window_end"] = grid.end(out["wid"].to_numpy())
    out["mean"] = out["total"] / out["cnt"]
    return normal(out)


def normal(df: pd.DataFrame) -> pd.DataFrame:
    df = df[COLUMNS].astype({"window_end": np.int64, "srcPort": np.int64, "cnt": np.int64,
                             "total": np.int64, "mean": np.float64, "lo": np.int64, "hi": np.int64})
    return df.sort_values(["window_end", "srcPort"]).reset_index(drop=True)


def run_wid(grid: WindowGrid, batch: PacketBatch, punct) -> pd.DataFrame:
    op = WidOperator(grid)
    ts = batch["timestamp"].astype(np.int64)
    keys, vals = batch["srcPort"].astype(np.int64), batch["len"].astype(np.int64)
    out = []
    at = dict(punct)
    a0 = 0
    for j in sorted(at) + [len(ts) - 1]:
        op.process(ts[a0:j + 1], keys[a0:j + 1], vals[a0:j + 1])
        a0 = j + 1
        if j in at:
            closed = op.punctuate(at[j])
            assert all(int(grid.end(w)) <= at[j] for w, *_ in closed)
            out += closed
    out += op.finish()
    assert op.late == 0
    df = pd.DataFrame(out, columns=["wid", "srcPort", "cnt", "total", "lo", "hi"])
    df["window_end"] = grid.end(df["wid"].to_numpy())
    df["mean"] = df["total"] / df["cnt"]
    return normal(df)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k_s=st.integers(1, 6), k_r=st.integers(0, 14), n=st.integers(20, 400),
       seed=st.integers(0, 2**31), order=st.sampled_from(["band", "block", "random"]))
@pytest.mark.slow
def test_paned_wid_equals_wid_equals_reference(k_s, k_r, n, seed, order):
    s = 250 * k_s
    r = max(s, 250 * k_r + s * (k_r % 3))        # in ms; s divides r or not
    fp = plan_text(QUERY.format(r=r, s=s), ["main"])
    plan = fp.queries[0].low[0]
    grid = WindowGrid(r * MS, s * MS)
    sorted_batch = random_batch(n, seed, span_s=12, hosts=4)
    want = normal(evaluate_file(fp, {"main": sorted_batch})["sw"])
    rng = np.random.default_rng(seed)
    ts = sorted_batch["timestamp"]
    if order == "random":
        perm = rng.permutation(n)
    else:
        perm = arrival_order(ts, order, rng, band=3000 * MS, block=max(1, n // 5))
    batch = sorted_batch.take(perm)
    results = {}
    for name, every in EVERY.items():
        punct = [] if every is None else source_punctuation(batch["timestamp"], every)
        op = LowLevelOperator(plan)
        frame, puncts = feed(op, batch, punct)
        assert op.counters["late"] == 0          # grammatical punctuation: nothing is late
        results[name] = window_level(frame, puncts, plan, grid)
        pd.testing.assert_frame_equal(results[name], want, check_exact=False, rtol=1e-12)
        pd.testing.assert_frame_equal(run_wid(grid, batch, punct), want, check_exact=False,
                                      rtol=1e-12)
    assert len(want) > 0


def test_source_punctuation_is_grammatical_and_tight():
    rng = np.random.default_rng(3)
    ts = np.sort(rng.integers(0, 10**10, 2000))
    ts = ts[arrival_order(ts, "band", rng, band=10**9)]
    punct = source_punctuation(ts, 10**7)
    assert punct, "no punctuation at all"
    for j, p in punct:
        assert ts[j + 1:].min() == p           # every later tuple has time >= p, and one == p
    assert all(b[1] - a[1] >= 10**7 for a, b in zip(punct, punct[1:]))


@pytest.mark.parametrize("r,s", [(64, 6.4), (600, 60), (5, 2)])
def test_window_grid_windows_per_tuple(r, s):
    # the count of windows per tuple is r/s when s divides r, else floor or ceil of it
    grid = WindowGrid(int(r * 10**9), int(s * 10**9))
    ts = np.random.default_rng(0).integers(-10**13, 10**13, 5000)
    _, count = grid.first_and_count(ts)
    assert set(np.unique(count)) <= {int(r // s), -int(-r // s)}
    assert count.mean() == pytest.approx(r / s, rel=0.05)
