"""The disorder bench: the slack model against a tuple-at-a-time simulation, and a small run's report."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.experiments.disorder import (
    Workload,
    format_report,
    plot_report,
    run_workload,
)
from tools.experiments.windowgrid import WindowGrid, exact_windows, slack_windows


def simulate(ts, values, grid: WindowGrid, slack: int, mode: str):
    """The buffering operator one tuple at a time: a frontier (max seen - slack) closes window
    w at the first arrival that lifts it to end(w) (empty or not); a tuple behind the frontier
    is dropped (consistent) or still counts in its windows that are open (generous)."""
    seen = None
    frontiers = []
    state: dict[int, list] = {}
    for t, v in zip(ts.tolist(), values.tolist()):
        seen = t if seen is None else max(seen, t)
        frontier = seen - slack
        frontiers.append(frontier)
        if mode == "consistent" and t < frontier:
            continue
        first, count = grid.first_and_count(np.array([t]))
        for w in range(int(first[0]), int(first[0] + count[0])):
            if int(grid.end(w)) <= frontier:          # already closed
                continue
            s = state.setdefault(w, [0, 0.0])
            s[0] += 1
            s[1] += v
    out = {}
    for w in set(state) | set(grid.expand(ts)[1].tolist()):
        e = next((j for j, f in enumerate(frontiers) if f >= int(grid.end(w))), len(ts))
        c, tot = state.get(w, (0, 0.0))
        out[w] = (c, tot, e)
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 60), seed=st.integers(0, 2**31), k=st.integers(1, 4),
       extra=st.integers(0, 5), slack=st.integers(0, 30), mode=st.sampled_from(["consistent", "generous"]))
def test_slack_model_equals_tuple_simulation(n, seed, k, extra, slack, mode):
    rng = np.random.default_rng(seed)
    s = 4
    grid = WindowGrid(s * k + extra, s)
    ts = rng.integers(0, 100, n)
    values = rng.integers(1, 50, n).astype(float)
    got = slack_windows(ts, values, grid, slack, mode)
    want = simulate(ts, values, grid, slack, mode)
    for w, c, tot, e in zip(got.wid, got.count, got.total, got.emitted_after):
        wc, wt, we = want.get(int(w), (0, 0.0, len(ts)))
        assert (int(c), float(tot)) == (wc, wt), f"window {w}"
        assert int(e) == we, f"window {w} emitted"
    exact = exact_windows(ts, values, grid)
    assert set(exact.wid.tolist()) == set(got.wid.tolist())
    if slack >= 100:
        assert got.dropped == 0


def test_slack_model_in_order_input_is_exact():
    ts = np.arange(0, 10_000, 7)
    values = (ts % 13).astype(float)
    grid = WindowGrid(100, 30)
    exact = exact_windows(ts, values, grid)
    for mode in ("consistent", "generous"):
        got = slack_windows(ts, values, grid, 0, mode)
        assert np.array_equal(got.count, exact.count) and np.allclose(got.total, exact.total)
        assert got.dropped == 0


SMALL = [
    Workload("band", "band", 3000, 200, 64, 6.4, "avg", (0.0, 1.28, 3.2),
             ("consistent", "generous"), max_delay_s=3.2, late_share=0.2),
    Workload("block", "block", 3000, 3000, 600, 60, "count", (0.0, 218.2, 490.9),
             ("consistent",), block_s=490, punct_every_s=1.0),
]


@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.name)
def test_bench_report_is_well_formed(w, tmp_path):
    report = run_workload(w)
    rows = report["rows"]
    assert [r["method"] for r in rows] == \
        [f"slack-{m}" for m in w.modes for _ in w.slacks_s] + ["oop-punctuation", "oop-lazy-m2"]
    for r in rows:
        assert r["windows"] > 5
        assert r["mean_error_pct"] >= 0 and r["latency_s"] >= 0
    oop = rows[-2]
    # punctuation: no error, and sooner than the slack that is needed for no error
    assert oop["mean_error_pct"] == 0 and oop["wrong_pct"] == 0 and oop["dropped"] == 0
    assert rows[-1]["mean_error_pct"] == 0
    for m in w.modes:
        rs = [r for r in rows if r["method"] == f"slack-{m}"]
        assert rs[0]["mean_error_pct"] > 0                   # no slack: disorder costs answers
        assert rs[-1]["mean_error_pct"] == 0                 # slack >= the disorder: exact
        assert [r["latency_s"] for r in rs] == sorted(r["latency_s"] for r in rs)
        assert oop["latency_s"] <= rs[-1]["latency_s"]
    full = {"benchmark": "disorder", "quick": True, "workloads": [report]}
    text = format_report(full)
    assert "oop-punctuation" in text and w.name in text
    json.loads(json.dumps(full))
    png = plot_report(full, tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
