"""Output holding in the engine (`HashAggregator(hold_rows=...)`): rows kept in the output buffer
across appends come out unchanged and in the same order as without holding, all of them by the
punctuation that covers them; and the kernels' own late-packet dropping (both tables)."""

from __future__ import annotations

import numpy as np
import pytest

from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.engine import DRAIN_ROWS, HashAggregator, Partials
from lowlevel.flowtable import FlowAggregator
from lowlevel.testing import Stream, arrival_order, grammatical_punctuation, run_stream

LAYOUT = StateLayout([AggSpec("cnt", "count"), AggSpec("s", "sum", "int64"),
                      AggSpec("d", "distinct", registers=16)])


def _stream(seed: int, n: int, ngroups: int, order: str, punct_every: int) -> Stream:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 200, n)).astype(np.int64)
    ts = ts[arrival_order(ts, order, rng, band=15, block=6)]
    keys = rng.integers(0, ngroups, (n, 2)).astype(np.uint64)
    ai, au, af, ad = LAYOUT.empty_args(n)
    ai[:, 0] = rng.integers(-1000, 1000, n)
    ad[:, 0] = rng.integers(0, 1 << 63, n, dtype=np.uint64)
    valid = rng.random(n) < 0.9
    return Stream(ts, keys, (ai, au, af, ad), valid,
                  grammatical_punctuation(ts, rng, punct_every))


def _same_rows(a: Partials, b: Partials) -> None:
    np.testing.assert_array_equal(a.window, b.window)
    np.testing.assert_array_equal(a.keys, b.keys)
    for x, y in zip(a.banks, b.banks):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a.cause, b.cause)


@pytest.mark.parametrize("policy", ["oop_lazy", "oop_slow", "iop_slow"])
@pytest.mark.parametrize("order", ["in_order", "band", "block"])
@pytest.mark.parametrize("slots", [2, 64])
@pytest.mark.parametrize("hold_rows", [1, 40, DRAIN_ROWS])
def test_held_rows_equal_unheld_rows_and_leave_by_each_punctuation(policy, order, slots,
                                                                     hold_rows):
    stream = _stream(slots + len(order), 3000, 150, order, punct_every=60)

    def engine(hold):
        return HashAggregator(LAYOUT, 2, slots, pane_ns=10, flush=policy, slow_flush=3,
                              max_disorder=1, hold_rows=hold)

    now, held = engine(0), engine(hold_rows)
    direct = run_stream(now, stream, batch=13)
    kept = run_stream(held, stream, batch=13)
    # the kernels do the same work: the same rows in the same order, only handed out later
    _same_rows(kept.rows, direct.rows)
    assert kept.counters == direct.counters
    assert kept.out_puncts == direct.out_puncts
    # every row that left before a punctuation event is out by that event
    for event, _ in direct.out_puncts:
        assert np.count_nonzero(kept.row_event <= event) == \
            np.count_nonzero(direct.row_event <= event)
    # and never later than the punctuation it precedes: none after it violates it
    end = (kept.rows.window + 1) * 10
    for event, p in kept.out_puncts:
        assert np.all(end[kept.row_event > event] > p)


def test_appends_hand_out_held_rows_in_chunks_of_hold_rows():
    stream = _stream(1, 4000, 400, "band", punct_every=10_000)
    agg = HashAggregator(LAYOUT, 2, 2, pane_ns=10, hold_rows=100)      # evicts nearly always
    sizes = []
    for a in range(0, 4000, 50):
        sl = slice(a, a + 50)
        got = agg.append(stream.ts[sl], stream.keys[sl], tuple(x[sl] for x in stream.args),
                         stream.valid[sl])
        assert len(got) <= 1
        sizes += [len(c) for c in got]
        assert 0 <= agg.held < 100
        assert agg.counters["rows_out"] == sum(sizes) + agg.held
    assert sizes and min(sizes) >= 100


def test_more_rows_than_the_output_buffer_in_one_append():
    """Every packet evicts: one append produces ~3 x DRAIN_ROWS rows, so the kernel stops
    early for room several times; nothing is lost or reordered."""
    n = 3 * DRAIN_ROWS
    layout = StateLayout([AggSpec("cnt", "count")])
    ts = np.zeros(n, np.int64)
    keys = np.arange(n, dtype=np.uint64).reshape(n, 1)
    args, valid = layout.empty_args(n), np.ones(n, bool)
    out = {}
    for hold in (0, DRAIN_ROWS):
        agg = HashAggregator(layout, 1, 2, pane_ns=10, probes=1, hold_rows=hold)
        chunks = agg.append(ts, keys, args, valid)
        assert len(chunks) >= 2
        rows, _ = agg.finish()
        out[hold] = Partials.concat(chunks + rows, layout, 1)
    _same_rows(out[DRAIN_ROWS], out[0])
    assert sorted(out[0].keys[:, 0].tolist()) == list(range(n))


@pytest.mark.parametrize("flow", [False, True])
@pytest.mark.slow
def test_kernels_count_and_drop_late_packets(flow):
    layout = StateLayout([AggSpec("cnt", "count")])
    if flow:
        agg = FlowAggregator(layout, 1, 64, pane_ns=100, link="main")
    else:
        agg = HashAggregator(layout, 1, 64, pane_ns=100, hold_rows=5)
    ts = np.array([10, 20, 30, 40], np.int64)
    keys = np.array([[1], [2], [1], [3]], np.uint64)
    agg.append(ts, keys, valid=np.ones(4, bool))
    agg.punctuate(35)
    agg.append(np.array([5, 36, 34, 200], np.int64), np.array([[1], [1], [9], [2]], np.uint64),
               valid=np.array([True, True, True, False]))
    rows, _ = agg.finish()
    rows = Partials.concat(rows, layout, agg.nkeys)
    assert agg.counters["late"] == 2                 # 5 and 34; the invalid packet is not late
    cnt = layout.state_columns(rows.banks)["cnt"]
    assert int(cnt.sum()) == 5
