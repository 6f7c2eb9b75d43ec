"""Final partial rows (`lowlevel.finality`): a row left after its pane closed, and the only
one of its (pane, group), is marked final; one that left an open pane, or followed such a
one, is not. (The property over random streams, every flush policy, resizes, disorder and
late data is in test_lowlevel_sizing's `check_final`.)"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from common.spool import FINAL, FINAL_ROWS_KEY, SpoolWriter
from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.engine import HashAggregator, Partials

LAYOUT = StateLayout([AggSpec("cnt", "count")])


def _rows(chunks: list[Partials]) -> Partials:
    return Partials.concat(chunks, LAYOUT, 1)


def _agg(slots: int, **kw) -> HashAggregator:
    return HashAggregator(LAYOUT, 1, slots, pane_ns=10, probes=1, **kw)


def test_rows_of_closed_panes_are_final():
    """A table that fits: every group leaves once, after the punctuation closed its pane (at
    the punctuation, as the appliance flushes, or by the m bound a pane later)."""
    for flush in (True, False):
        agg = _agg(1024, punctuation_flush=flush, max_disorder=0)
        out: list[Partials] = []
        for w in range(3):
            ts = np.arange(w * 10, w * 10 + 10, dtype=np.int64)
            out += agg.append(ts, (np.arange(10) % 4).astype(np.uint64).reshape(-1, 1))
            out += agg.punctuate((w + 1) * 10)[0]
        rows = _rows(out)
        assert len(rows) == 12 and rows.final.all()


def test_a_group_evicted_while_its_pane_is_open_is_never_final():
    """Eight groups cycling through a table of two slots in one open pane: every group is
    evicted while the pane is open, so no piece of any of them is final, not even the last
    ones, left at the close."""
    agg = _agg(2, punctuation_flush=True)
    keys = np.tile(np.arange(8, dtype=np.uint64), 3).reshape(-1, 1)
    out = agg.append(np.sort(np.arange(24, dtype=np.int64) % 10), keys)
    out += agg.punctuate(10)[0]
    rows = _rows(out)
    cnt = LAYOUT.state_columns(rows.banks)["cnt"]
    assert {k: int(cnt[rows.keys[:, 0] == k].sum()) for k in range(8)} == dict.fromkeys(range(8), 3)
    assert len(rows) > 8 and not rows.final.any()
    # the next pane, with a table to itself: final again
    out = agg.append(np.array([11, 12], np.int64), np.array([[1], [1]], np.uint64))
    out += agg.punctuate(20)[0]
    assert len(_rows(out)) == 1 and _rows(out).final.all()


def test_rows_left_before_the_punctuation_are_not_final():
    """oop_lazy without punctuation: pane 0's entries leave when pane 2 begins (the m
    bound), before any punctuation closed pane 0: not final, though alone; the end of input
    closes every pane, so what `finish` lets out is final."""
    agg = _agg(1024, max_disorder=1)
    out = agg.append(np.array([1, 2, 25], np.int64), np.array([[1], [2], [3]], np.uint64))
    early = _rows(out)
    assert sorted(early.keys[:, 0]) == [1, 2] and not early.final.any()
    rows = _rows(agg.finish()[0])
    assert list(rows.keys[:, 0]) == [3] and rows.final.all()


def test_the_spool_counts_final_rows(tmp_path):
    """The operator's Arrow rows carry the flags; the spool file's footer counts them."""
    table = pa.table({"window": [1, 1, 2], "k": [1, 2, 3], FINAL: [True, False, True]})
    path = SpoolWriter(tmp_path, "q", "main", fsync=False).write(table, 30)
    meta = pq.read_schema(path).metadata
    assert meta[FINAL_ROWS_KEY] == b"2"
