"""Property tests of the low level: any table size, flush policy and arrival order give the same
combined result as a plain pandas pass, and punctuation/order promises hold."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.engine import HashAggregator
from lowlevel.hll import hash64
from lowlevel.testing import (
    ORDERS,
    Stream,
    arrival_order,
    combined,
    grammatical_punctuation,
    reference_groups,
    run_stream,
)

ALL_AGGS = StateLayout([
    AggSpec("cnt", "count"), AggSpec("s_i", "sum", "int64"), AggSpec("s_u", "sum", "uint64"),
    AggSpec("s_f", "sum", "float64"), AggSpec("mi_i", "min", "int64"),
    AggSpec("mi_u", "min", "uint64"), AggSpec("mx_f", "max", "float64"),
    AggSpec("mx_i", "max", "int64"), AggSpec("a_u", "and", "uint64"),
    AggSpec("o_i", "or", "int64"), AggSpec("x_u", "xor", "uint64"),
    AggSpec("fi_i", "first", "int64"), AggSpec("fi_f", "first", "float64"),
    AggSpec("la_u", "last", "uint64"), AggSpec("d", "distinct", registers=16),
])
COUNT_ONLY = StateLayout([AggSpec("cnt", "count")])


def make_stream(layout: StateLayout, seed: int, n: int, ngroups: int, nkeys: int, span: int,
                order: str, valid_frac: float, punct_every: int) -> Stream:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, span, n)).astype(np.int64)
    perm = arrival_order(ts, order, rng, band=int(rng.integers(1, span // 4 + 2)),
                         block=int(rng.integers(2, 12)))
    ts = ts[perm]
    groups = rng.integers(0, 1 << 63, (ngroups, nkeys), dtype=np.uint64)
    keys = groups[rng.integers(0, ngroups, n)] if ngroups else np.zeros((n, nkeys), np.uint64)
    ai, au, af, ad = layout.empty_args(n)
    ai[:] = rng.integers(-1000, 1000, ai.shape)
    au[:] = rng.integers(0, 1 << 63, au.shape, dtype=np.uint64)
    af[:] = rng.integers(-50, 50, af.shape)          # integral: float sums are exact
    ad[:] = hash64(rng.integers(0, 40, ad.shape))
    # ties in time are common at this scale: first/last must break them by value
    valid = rng.random(n) < valid_frac
    return Stream(ts, keys, (ai, au, af, ad), valid, grammatical_punctuation(ts, rng, punct_every))


def check_run(layout, stream, agg, pane, m, policy, order):
    run = run_stream(agg, stream, batch=int(stream.ts[:1].sum() % 5) + 3)
    got = combined(layout, run.rows)
    want = reference_groups(layout, stream, pane)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    assert run.counters["late"] == 0
    assert run.counters["rows_out"] == len(run.rows)
    assert run.counters["resident"] == 0
    # emitted punctuation: strictly increasing, never violated by a later row
    puncts = [p for _, p in run.out_puncts]
    assert all(a < b for a, b in zip(puncts, puncts[1:])), puncts
    end = (run.rows.window + 1) * pane
    for event, p in run.out_puncts:
        later = run.row_event > event
        assert np.all(end[later] > p), (event, p)
    if run.out_puncts:
        last_event, final = run.out_puncts[-1]
        assert final >= end.max(initial=np.iinfo(np.int64).min)
    if policy == "iop_slow" and order == "in_order":
        assert np.all(np.diff(run.rows.window) >= 0), run.rows.window
    if policy != "iop_slow":
        # every row of window w leaves before the input punctuation passes end(w + m) ...
        assert np.all(run.row_in_punct < (run.rows.window + 1 + m) * pane)
        # ... so the output punctuation lags the input by at most m windows
        for p_in, p_out in run.punct_pairs:
            closed = p_in // pane - 1
            assert p_out >= min(p_in, (closed - m + 1) * pane), (p_in, p_out)
    for p_in, p_out in run.punct_pairs:
        assert p_out <= p_in
    return run


params = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(0, 400),
    "ngroups": st.integers(1, 40),
    "nkeys": st.integers(0, 3),
    "panes": st.integers(1, 12),
    "order": st.sampled_from(ORDERS),
    "valid_frac": st.sampled_from([1.0, 0.8]),
    "punct_every": st.integers(1, 40),
    "policy": st.sampled_from(["oop_lazy", "oop_slow", "iop_slow"]),
    "slots_factor": st.floats(0.0, 2.0),
    "slow_flush": st.integers(1, 6),
    "m": st.integers(0, 3),
    "probes": st.integers(1, 3),
    "pane": st.sampled_from([10, 10, 1]),     # 1: up to 120 panes, beyond the pane ring (64)
    "hold_rows": st.sampled_from([0, 0, 1, 25]),  # rows kept in the engine across appends
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params)
@pytest.mark.slow
def test_any_table_any_policy_equals_reference(prm):
    pane = prm["pane"]
    stream = make_stream(ALL_AGGS, prm["seed"], prm["n"], prm["ngroups"], prm["nkeys"],
                         prm["panes"] * 10, prm["order"], prm["valid_frac"],
                         prm["punct_every"])
    groups = prm["ngroups"] * prm["panes"] * 10 // pane
    slots = max(2, int(prm["slots_factor"] * groups))  # from 2 slots to twice the groups
    agg = HashAggregator(ALL_AGGS, prm["nkeys"], slots, pane_ns=pane, flush=prm["policy"],
                         slow_flush=prm["slow_flush"], max_disorder=prm["m"],
                         probes=prm["probes"], hold_rows=prm["hold_rows"])
    check_run(ALL_AGGS, stream, agg, pane, prm["m"], prm["policy"], prm["order"])


@settings(max_examples=40, deadline=None)
@given(params)
def test_iop_in_order_output_is_window_ordered_with_many_windows(prm):
    """Count only, in order, many small windows and tiny tables: the IOP order promise."""
    pane = 5
    stream = make_stream(COUNT_ONLY, prm["seed"], prm["n"], prm["ngroups"], 2,
                         prm["panes"] * pane * 3, "in_order", 1.0, prm["punct_every"])
    agg = HashAggregator(COUNT_ONLY, 2, max(2, int(prm["slots_factor"] * prm["ngroups"])),
                         pane_ns=pane, flush="iop_slow", slow_flush=prm["slow_flush"],
                         probes=prm["probes"])
    run = check_run(COUNT_ONLY, stream, agg, pane, 0, "iop_slow", "in_order")
    assert run.counters["forced_full_flushes"] <= run.counters["windows"]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(["oop_lazy", "oop_slow", "iop_slow"]),
       st.integers(2, 64))
def test_late_packets_are_counted_and_dropped(seed, policy, slots):
    """Punctuation that later packets violate: those packets are late, counted, dropped; the
    rest equals the reference over the packets that were on time."""
    rng = np.random.default_rng(seed)
    pane, n = 10, 300
    stream = make_stream(COUNT_ONLY, seed, n, 10, 1, 100, "band", 1.0, 1000)
    cuts = np.sort(rng.choice(n, 6, replace=False))
    stream.puncts = [(int(j), int(stream.ts[j]) + int(rng.integers(-5, 15))) for j in cuts]
    seen = np.full(n, np.iinfo(np.int64).min)
    last = np.iinfo(np.int64).min
    for j, p in stream.puncts:
        last = max(last, p)
        seen[j + 1:] = last
    keep = stream.ts >= seen
    agg = HashAggregator(COUNT_ONLY, 1, slots, pane_ns=pane, flush=policy)
    run = run_stream(agg, stream)
    assert run.counters["late"] == int(np.count_nonzero(~keep))
    pd.testing.assert_frame_equal(combined(COUNT_ONLY, run.rows),
                                  reference_groups(COUNT_ONLY, stream, pane, keep=keep),
                                  check_dtype=False)
    end = (run.rows.window + 1) * pane
    for event, p in run.out_puncts:
        assert np.all(end[run.row_event > event] > p)
