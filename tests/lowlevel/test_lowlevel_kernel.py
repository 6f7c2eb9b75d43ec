"""Kernel tests: each sub-aggregate against plain numpy, wide (IPv6) keys, empty input, the
IOP collision case of the thesis (Fig 8-6), and running without the JIT."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from lowlevel.aggregates import (
    AggSpec,
    StateLayout,
    average,
    combine_states,
    distinct_hashes,
    hll_estimate,
    hll_registers,
)
from lowlevel.engine import HashAggregator, Partials
from lowlevel.flush import CAUSE_EVICT, CAUSE_FORCED
from lowlevel.hashtable import home_slot, round_slots
from lowlevel.hll import registers_of
from lowlevel.testing import Stream, combined, reference_groups, run_stream

KINDS = [("count", "int64"), ("sum", "int64"), ("sum", "uint64"), ("sum", "float64"),
         ("min", "int64"), ("min", "uint64"), ("min", "float64"), ("max", "int64"),
         ("max", "uint64"), ("max", "float64"), ("and", "int64"), ("and", "uint64"),
         ("or", "int64"), ("or", "uint64"), ("xor", "int64"), ("xor", "uint64"),
         ("first", "int64"), ("first", "uint64"), ("first", "float64"), ("last", "int64"),
         ("last", "uint64"), ("last", "float64"), ("distinct", "uint64")]


def _values(rng, dtype, n):
    if dtype == "int64":
        return rng.integers(-(1 << 62), 1 << 62, n)
    if dtype == "uint64":
        return rng.integers(0, 1 << 64, n, dtype=np.uint64)
    return rng.normal(size=n) * 1e6


@pytest.mark.parametrize("slots", [2, 1 << 12])
@pytest.mark.parametrize("kind,dtype", KINDS)
def test_each_subaggregate_matches_numpy(kind, dtype, slots):
    rng = np.random.default_rng(7)
    n, pane = 3000, 100
    layout = StateLayout([AggSpec("a", kind, dtype, registers=32)])
    ts = np.sort(rng.integers(0, 1000, n))
    ts[::3] = ts[1::3][: len(ts[::3])]            # many time ties for first/last
    ts = np.sort(ts)
    keys = rng.integers(0, 20, (n, 1)).astype(np.uint64)
    args = list(layout.empty_args(n))
    raw = rng.integers(0, 300, n)
    if kind == "distinct":
        args[3][:, 0] = distinct_hashes(raw)
    elif kind != "count":
        bank = "iuf".index(layout.arg_columns["a"][0])
        args[bank][:, 0] = _values(rng, dtype, n)
    stream = Stream(ts, keys, tuple(args), np.ones(n, bool))
    agg = HashAggregator(layout, 1, slots, pane_ns=pane, flush="oop_lazy")
    run = run_stream(agg, stream, batch=500)
    got = combined(layout, run.rows)
    # the oracle: a plain numpy loop over groups, no shared code path with the kernel
    win = ts // pane
    rows = []
    for (w, k) in sorted(set(zip(win.tolist(), keys[:, 0].tolist()))):
        sel = (win == w) & (keys[:, 0] == k)
        if kind == "count":
            rows.append(sel.sum())
            continue
        v = raw[sel] if kind == "distinct" else args["iuf".index(
            layout.arg_columns["a"][0])][sel, 0]
        t = ts[sel]
        if kind == "sum":
            rows.append(v.sum(dtype=v.dtype))
        elif kind in ("min", "max"):
            rows.append(getattr(v, kind)())
        elif kind in ("and", "or", "xor"):
            rows.append(getattr(np, f"bitwise_{kind}").reduce(v))
        elif kind == "first":
            rows.append(v[t == t.min()].min())      # ties: the smaller value
        elif kind == "last":
            rows.append(v[t == t.max()].max())      # ties: the larger value
        else:  # the reference evaluator's own sketch is the oracle
            rows.append(bytes(registers_of(v, np.zeros(len(v), np.int64), 1, 32)[0]))
    assert len(got) == len(rows)
    if kind == "sum" and dtype == "float64":
        np.testing.assert_allclose(got["a"].to_numpy(), np.array(rows), rtol=1e-9)
    else:
        assert list(got["a"]) == rows
    if slots == 2:
        assert run.counters["evictions"] > 0


def test_hll_estimate_is_close():
    rng = np.random.default_rng(3)
    for true in (0, 10, 1000, 100_000):
        v = rng.choice(1 << 40, true, replace=False)
        regs = hll_registers(distinct_hashes(v), 1024)
        est = float(hll_estimate(regs)[0])
        assert abs(est - true) <= max(2, 4 * 1.04 / 32 * true), (true, est)
    # register-wise max of two halves equals the registers of the union
    h = distinct_hashes(rng.integers(0, 1 << 62, 5000))
    assert np.array_equal(np.maximum(hll_registers(h[:2000], 64), hll_registers(h[2000:], 64)),
                          hll_registers(h, 64))


def test_average_building_block():
    assert np.allclose(average(np.array([10, 9]), np.array([4, 3])), [2.5, 3.0])
    assert np.isnan(average(np.array([1.0]), np.array([0]))[0])


def test_ipv6_keys_two_columns_each():
    """Two ip keys = four uint64 columns; addresses differing in one half only stay apart."""
    rng = np.random.default_rng(11)
    n = 2000
    hi = np.array([0, 0x20010DB8 << 32, 0x20010DB8 << 32, 0xFE80 << 48], np.uint64)
    lo = np.array([0xFFFF_0A00_0001, 1, 2, 1], np.uint64)
    a = rng.integers(0, 4, n)
    b = rng.integers(0, 4, n)
    keys = np.stack([hi[a], lo[a], hi[b], lo[b]], axis=1)
    layout = StateLayout([AggSpec("cnt", "count")])
    ts = np.sort(rng.integers(0, 50, n))
    stream = Stream(ts, keys, layout.empty_args(n), np.ones(n, bool))
    for slots in (2, 64):
        run = run_stream(HashAggregator(layout, 4, slots, pane_ns=25), stream)
        got = combined(layout, run.rows)
        want = reference_groups(layout, stream, 25)
        pd.testing.assert_frame_equal(got, want, check_dtype=False)
        assert len(got) == len(set(zip(ts // 25, a, b)))


def test_empty_batches_and_empty_table():
    layout = StateLayout([AggSpec("cnt", "count"), AggSpec("d", "distinct", registers=16)])
    agg = HashAggregator(layout, 2, 8, pane_ns=10)
    assert agg.append(np.zeros(0, np.int64), np.zeros((0, 2), np.uint64),
                      layout.empty_args(0), np.zeros(0, bool)) == []
    rows, p = agg.punctuate(25)
    assert rows == [] and p == 25            # nothing resident: input punctuation passes
    rows, final = agg.finish()
    assert rows == [] and final >= 25
    empty = Partials.concat([], layout, 2)
    k, s = combine_states(layout, [empty.window, empty.keys[:, 0]], layout.state_columns(empty.banks))
    assert len(k[0]) == 0 and s["d"].shape == (0, 16)


def test_table_rounds_to_power_of_two():
    assert [round_slots(x) for x in (0, 1, 2, 3, 5, 1000, 1 << 20)] == [2, 2, 2, 4, 8, 1024, 1 << 20]


def _home(pane, keys, i, slots):
    return int(home_slot(pane, keys, i, 64 - (slots.bit_length() - 1)))


def _keys_with_home(pane, slots, want_homes):
    """Small key values whose home slot (for `pane`) is each of `want_homes`, distinct keys."""
    found = {}
    cand = np.arange(1, 100_000, dtype=np.uint64).reshape(-1, 1)
    for i in range(len(cand)):
        h = _home(pane, cand, i, slots)
        if h in want_homes and h not in found:
            found[h] = int(cand[i, 0])
        if len(found) == len(want_homes):
            break
    return [found[h] for h in want_homes]


def _collision_stream(slots):
    """Window 0: groups A, B, C in slots 1, 2, 3. Window 1: D in slot 5, then E whose only
    probe slot is D's: a new-window entry of another group."""
    a, b, c = _keys_with_home(0, slots, [1, 2, 3])
    d, e1 = _keys_with_home(1, slots, [5, 6])
    e = [k for k in _keys_with_home(1, slots, [5]) if k != d] or None
    # a second key with home 5 in window 1
    cand = np.arange(d + 1, 200_000, dtype=np.uint64).reshape(-1, 1)
    e = next(int(cand[i, 0]) for i in range(len(cand))
             if _home(1, cand, i, slots) == 5)
    keys = np.array([[a], [b], [c], [d], [e]], np.uint64)
    ts = np.array([1, 2, 3, 11, 12], np.int64)
    return keys, ts


@pytest.mark.parametrize("policy", ["iop_slow", "oop_lazy", "oop_slow"])
def test_thesis_iop_collision_forces_full_flush(policy):
    slots = 8
    keys, ts = _collision_stream(slots)
    layout = StateLayout([AggSpec("cnt", "count")])
    # slow_flush large: the walk takes no step during these few packets
    agg = HashAggregator(layout, 1, slots, pane_ns=10, flush=policy, slow_flush=1000, probes=1)
    rows = Partials.concat(agg.append(ts, keys, layout.empty_args(5)), layout, 1)
    c = agg.counters
    if policy == "iop_slow":
        # all old groups (A, B, C) first, then the evicted new-window group D
        assert c["forced_full_flushes"] == 1 and c["rows_forced"] == 3
        assert rows.window.tolist() == [0, 0, 0, 1]
        assert sorted(rows.keys[:3, 0].tolist()) == sorted(keys[:3, 0].tolist())
        assert rows.keys[3, 0] == keys[3, 0]
        assert rows.cause.tolist() == [CAUSE_FORCED] * 3 + [CAUSE_EVICT]
    else:
        # out of order: only D leaves; the old groups wait for collisions or the m bound
        assert c["forced_full_flushes"] == 0
        assert rows.window.tolist() == [1] and rows.keys[0, 0] == keys[3, 0]
    # either way nothing is lost
    rest, _ = agg.finish()
    allrows = Partials.concat([rows] + rest, layout, 1)
    assert allrows.banks[0][:, 0].sum() == 5


def test_iop_with_second_probe_uses_the_old_neighbour():
    """The deployed Gigascope checks the next entry: with 2 probes, E takes the old entry in
    D's neighbour slot instead of forcing a full flush."""
    slots = 8
    layout = StateLayout([AggSpec("cnt", "count")])
    a, b, c = _keys_with_home(0, slots, [1, 2, 6])   # C is in slot 6, next to D's slot 5
    d = _keys_with_home(1, slots, [5])[0]
    cand = np.arange(d + 1, 200_000, dtype=np.uint64).reshape(-1, 1)
    e = next(int(cand[i, 0]) for i in range(len(cand))
             if _home(1, cand, i, slots) == 5)
    keys = np.array([[a], [b], [c], [d], [e]], np.uint64)
    agg = HashAggregator(layout, 1, slots, pane_ns=10, flush="iop_slow", slow_flush=1000,
                         probes=2)
    rows = Partials.concat(agg.append(np.array([1, 2, 3, 11, 12]), keys, layout.empty_args(5)),
                           layout, 1)
    assert agg.counters["forced_full_flushes"] == 0
    assert rows.window.tolist() == [0] and rows.keys[0, 0] == c


NOJIT_SCRIPT = textwrap.dedent("""
    import numpy as np, pandas as pd
    from lowlevel.hll import hash64
    from lowlevel.aggregates import AggSpec, StateLayout
    from lowlevel.engine import HashAggregator
    from lowlevel.testing import (Stream, arrival_order, combined, grammatical_punctuation,
                                  reference_groups, run_stream)
    layout = StateLayout([AggSpec("c", "count"), AggSpec("s", "sum", "int64"),
                          AggSpec("f", "first", "uint64"), AggSpec("d", "distinct", registers=16)])
    for seed in range(6):
        rng = np.random.default_rng(seed)
        n = 120
        ts = np.sort(rng.integers(0, 60, n))
        ts = ts[arrival_order(ts, ["in_order", "band", "block"][seed % 3], rng, band=8, block=5)]
        keys = rng.integers(0, 6, (n, 2)).astype(np.uint64)
        args = layout.empty_args(n)
        args[0][:] = rng.integers(-9, 9, args[0].shape)
        args[1][:] = rng.integers(0, 99, args[1].shape)
        args[3][:] = hash64(rng.integers(0, 20, args[3].shape))
        st = Stream(ts, keys, args, rng.random(n) < 0.9, grammatical_punctuation(ts, rng, 9))
        for policy in ("oop_lazy", "oop_slow", "iop_slow"):
            agg = HashAggregator(layout, 2, 2 + seed * 3, pane_ns=10, flush=policy,
                                 slow_flush=2, max_disorder=1)
            run = run_stream(agg, st)
            pd.testing.assert_frame_equal(combined(layout, run.rows),
                                          reference_groups(layout, st, 10), check_dtype=False)
    import numba
    print("NOJIT-OK", numba.config.DISABLE_JIT)
""")


@pytest.mark.slow
def test_logic_passes_without_jit():
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    res = subprocess.run([sys.executable, "-c", NOJIT_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "NOJIT-OK 1" in res.stdout


@pytest.mark.parametrize("policy", ["oop_lazy", "oop_slow"])
def test_oop_bound_sweep_is_paced_through_the_pane(policy):
    """m = 1, in-order packets, 40 groups per pane in a 4096-slot table (no collisions): the
    entries of pane 0 become due when pane 2 starts, and the paced sweep has them out while
    pane 1 runs, in step with the packets' time, so pane 2's start finds none left."""
    slots, pane, groups = 4096, 1000, 40
    layout = StateLayout([AggSpec("cnt", "count")])
    agg = HashAggregator(layout, 1, slots, pane_ns=pane, flush=policy, slow_flush=10**6,
                         max_disorder=1)
    rng = np.random.default_rng(7)

    def fold(q, lo, hi, n=groups):
        ts = np.sort(rng.integers(q * pane + lo, q * pane + hi, n)).astype(np.int64)
        keys = rng.permutation(np.arange(1, n + 1, dtype=np.uint64))[:, None]
        return Partials.concat(agg.append(ts, keys, layout.empty_args(n)), layout, 1)

    first = fold(0, 0, pane)
    assert len(first) == 0
    # half-way through pane 1 about half of the table has been swept: some but not all of
    # pane 0's entries are out, and nothing younger
    half = fold(1, 0, pane // 2)
    out0 = len(half)
    assert 0 < out0 < groups and set(half.window.tolist()) == {0}
    # the last packet is at the pane's end: the sweep has passed every slot
    rest = Partials.concat([fold(1, pane // 2, pane), fold(1, pane - 1, pane, 1)], layout, 1)
    assert set(rest.window.tolist()) == {0} and len(rest) == groups - out0
    assert agg.counters["rows_bound"] == groups
    # pane 2 starts: nothing left for the boundary
    start = fold(2, 0, 1, 1)
    assert len(start) == 0 and agg.counters["rows_out"] == groups
    # nothing lost or duplicated
    final, _ = agg.finish()
    every = Partials.concat([half, rest] + final, layout, 1)
    assert int(every.banks[0][:, 0].sum()) == 3 * groups + 2
