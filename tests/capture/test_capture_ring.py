"""The packet ring: drop accounting, order, punctuation order, threads, processes and a Numba producer."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture.batch import PacketBatch
from capture.errors import RingError
from capture.ring import PacketRing, copy_rows, ring_commit, ring_reserve


def ids_batch(first: int, n: int) -> PacketBatch:
    b = PacketBatch.empty("t", n)
    b.columns["timestamp"][:] = np.arange(first, first + n)
    b.columns["len"][:] = (np.arange(first, first + n) % 1500).astype(np.uint32)
    return b


class RingModel:
    """A plain-Python reference of the ring's rules (the module docstring), one operation at a time."""

    def __init__(self, cap: int, pslots: int):
        self.cap, self.pslots = cap, pslots
        self.head = self.tail = self.lent = 0
        self.offered = self.dropped = 0
        self.rows: list[int] = []          # ids at positions tail .. head
        self.queue: list[tuple[int, int]] = []
        self.pending = None
        self.newest = None
        self.delivered = None

    def _publish(self):
        if self.pending is not None and len(self.queue) < self.pslots:
            self.queue.append((self.head, self.pending))
            self.pending = None

    def push(self, first: int, n: int) -> int:
        self._publish()
        k = max(0, min(n, self.cap - (self.head - self.tail)))
        self.rows += list(range(first, first + k))
        self.head += k
        self.offered += n
        self.dropped += n - k
        return k

    def punctuate(self, p: int) -> bool:
        if self.newest is not None and p <= self.newest:
            return False
        self.newest = p
        self.pending = p
        self._publish()
        return True

    def take(self, m: int):
        self.rows = self.rows[self.lent:]
        self.tail += self.lent
        k = min(self.head - self.tail, m, self.cap - self.tail % self.cap)
        self.lent = k
        best = None
        while self.queue and self.queue[0][0] <= self.tail + k:
            best = self.queue.pop(0)[1]
        if best is not None and (self.delivered is None or best > self.delivered):
            self.delivered = best
        else:
            best = None
        return self.rows[:k], best


ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.integers(0, 40)),
    st.tuples(st.just("punct"), st.integers(-3, 20)),
    st.tuples(st.just("take"), st.integers(1, 50)),
), max_size=60)


@settings(max_examples=150, deadline=None)
@given(cap=st.integers(1, 48), pslots=st.integers(1, 4), script=ops)
def test_ring_follows_the_reference_model(cap, pslots, script):
    ring = PacketRing.create(cap, punct_slots=pslots)
    model = RingModel(cap, pslots)
    next_id = 0
    for op, arg in script:
        if op == "push":
            assert ring.push(ids_batch(next_id, arg)) == model.push(next_id, arg)
            next_id += arg
        elif op == "punct":
            p = next_id + arg
            assert ring.punctuate(p) == model.punctuate(p)
        else:
            batch, p = ring.take(arg)
            want, want_p = model.take(arg)
            assert (batch["timestamp"].tolist() if batch is not None else []) == want
            assert p == want_p
            if batch is not None:
                assert batch["len"].tolist() == [i % 1500 for i in want]
        st_ = ring.stats()
        assert st_.offered == model.offered and st_.dropped == model.dropped
        assert st_.offered == st_.processed + st_.dropped + st_.occupancy
        assert st_.occupancy <= cap and st_.high_water <= cap


def test_punctuation_waits_for_the_rows_before_it():
    ring = PacketRing.create(100)
    ring.push(ids_batch(0, 30))
    ring.punctuate(30)
    ring.push(ids_batch(30, 10))
    b, p = ring.take(20)
    assert b.n == 20 and p is None                  # 10 rows before the punctuation still in the ring
    b, p = ring.take(5)
    assert b["timestamp"].tolist() == list(range(20, 25)) and p is None
    b, p = ring.take(5)
    assert b["timestamp"][-1] == 29 and p == 30     # the batch ends exactly at the punctuation
    assert ring.punctuate(30) is False and ring.punctuate(12) is False
    ring.finish()
    assert not ring.done                            # finished, but 10 rows not taken yet
    b, p = ring.take(100)
    assert b.n == 10 and p is None and ring.done
    b, p = ring.take(100)
    assert b is None and p is None and ring.done
    s = ring.stats()
    assert (s.offered, s.processed, s.dropped, s.occupancy) == (40, 40, 0, 0)


def test_final_punctuation_survives_a_full_queue():
    ring = PacketRing.create(10, punct_slots=1)
    ring.push(ids_batch(0, 3))
    assert ring.punctuate(3) and ring.punctuate(5)    # the second waits: the queue holds one
    ring.finish()
    got = []
    while not ring.done:
        b, p = ring.take(2)
        got.append(p)
    assert got == [None, 5]     # 3 is superseded by 5, which comes once row 2 is handed out


def test_copy_take_releases_at_once_and_views_wait():
    ring = PacketRing.create(8)
    ring.push(ids_batch(0, 8))
    view, _ = ring.take(4)
    assert ring.push(ids_batch(100, 4)) == 0        # lent rows are still occupied
    copy, _ = ring.take(4, copy=True)               # releases the views, then copies and releases
    assert ring.push(ids_batch(100, 8)) == 8
    assert copy["timestamp"].tolist() == [4, 5, 6, 7]
    assert view["timestamp"].tolist() == [100, 101, 102, 103]   # views: overwritten after release
    s = ring.stats()
    assert s.offered == s.processed + s.dropped + s.occupancy == 20 and s.dropped == 4


def test_taken_columns_are_views_sliced_on_first_read():
    """A take's columns (`RingColumns`): every column holds the pushed rows, and the mapping
    behaves as the dict of a PacketBatch does."""
    from capture.schema import COLUMNS

    src = ids_batch(0, 12)
    rng = np.random.default_rng(1)
    for c in COLUMNS:
        src.columns[c.name][:] = rng.integers(0, 200, 12).astype(c.dtype)
    ring = PacketRing.create(16)
    ring.push(ids_batch(0, 6))
    ring.take(6)
    ring.push(src, 0, 10)                        # at ring position 6: the take cannot wrap
    batch, _ = ring.take(16)
    cols = batch.columns
    assert len(batch) == 10 and list(cols) == [c.name for c in COLUMNS] == list(cols.keys())
    assert "srcIP_lo" in cols and "nope" not in cols and cols.get("nope") is None
    with pytest.raises(KeyError):
        cols["nope"]
    for c in COLUMNS:
        assert cols[c.name].dtype == c.dtype
        assert np.array_equal(cols[c.name], src.columns[c.name][:10]), c.name
    assert cols["ttl"] is cols.get("ttl")       # sliced once
    plain = dict(cols)
    assert plain.keys() == {c.name for c in COLUMNS}
    kept = batch.copy()
    picked = batch.take(np.arange(10) % 2 == 0)
    ring.release()
    assert ring.push(ids_batch(500, 16)) == 16   # overwrites the rows the views show
    assert np.array_equal(kept["ttl"], src.columns["ttl"][:10])
    assert np.array_equal(picked["len"], src.columns["len"][:10:2])


def _wait_offered(ring, rows, deadline=60.0):
    """Let the producer run ahead: once it has offered more than the capacity, drops are certain."""
    t0 = time.monotonic()
    while ring.stats().offered < rows:
        assert time.monotonic() - t0 < deadline, "the producer did not start"
        time.sleep(0.001)


def _consume(ring, max_rows, pause, deadline=60.0):
    """Take until done; returns the ids in order and the (index into ids, punctuation) events."""
    ids, events = [], []
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        b, p = ring.take(max_rows)
        if b is not None:
            ids.extend(b["timestamp"].tolist())
        if p is not None:
            events.append((len(ids), p))
        if b is None and p is None and ring.done:
            break
        if pause:
            time.sleep(pause)
    else:
        raise AssertionError("the producer did not finish in time")
    ring.release()
    return ids, events


def check_stream(ring, ids, events, offered):
    s = ring.stats()
    assert s.offered == offered
    assert s.offered == s.processed + s.dropped and s.occupancy == 0
    assert s.processed == len(ids)
    assert all(a < b for a, b in zip(ids, ids[1:])), "rows out of order or duplicated"
    last = None
    for at, p in events:
        assert last is None or p > last
        last = p
        assert all(i >= p for i in ids[at:]), "a row below a punctuation came after it"
    return s


def test_threads_fast_producer_slow_consumer_counts_exactly():
    ring = PacketRing.create(5000)
    n_batches, size = 200, 1000

    def produce():
        for k in range(n_batches):
            ring.push(ids_batch(k * size, size))
            ring.punctuate((k + 1) * size)
        ring.finish()

    th = threading.Thread(target=produce)
    th.start()
    _wait_offered(ring, 20_000)
    ids, events = _consume(ring, 700, pause=0.002)
    th.join()
    s = check_stream(ring, ids, events, n_batches * size)
    assert s.dropped > 0 and s.high_water == 5000
    assert events[-1][1] == n_batches * size and events[-1][0] == len(ids)


@numba.njit(nogil=True)
def _numba_producer(ctrl, ts_ring, len_ring, ts, lens, batch):
    sent = 0
    accepted = 0
    while sent < ts.shape[0]:
        m = min(batch, ts.shape[0] - sent)
        pos, k = ring_reserve(ctrl, m)
        copy_rows(ts_ring, ts, sent, pos, k)
        copy_rows(len_ring, lens, sent, pos, k)
        ring_commit(ctrl, k, m)
        accepted += k
        sent += m
    return accepted


def test_numba_nogil_producer_in_a_thread():
    ring = PacketRing.create(4096)
    ts = np.arange(300_000, dtype=np.int64)
    lens = (ts % 1500).astype(np.uint32)
    _numba_producer(ring.ctrl, ring.columns["timestamp"], ring.columns["len"], ts[:0], lens[:0], 64)  # compile
    result = {}

    def produce():
        result["accepted"] = _numba_producer(ring.ctrl, ring.columns["timestamp"], ring.columns["len"], ts, lens, 997)
        ring.finish()

    th = threading.Thread(target=produce)
    th.start()
    got, lens_got = [], []
    while True:
        b, _ = ring.take(1500)
        if b is not None:
            got.append(b["timestamp"].copy())
            lens_got.append(b["len"].copy())
        elif ring.done:
            break
    th.join()
    ids = np.concatenate(got) if got else np.zeros(0, np.int64)
    s = check_stream(ring, ids.tolist(), [], len(ts))
    assert result["accepted"] == len(ids) == s.processed
    assert np.array_equal(np.concatenate(lens_got), ids % 1500)


@pytest.mark.parametrize("lossless", [True, False])
def test_processes_through_shared_memory(lossless):
    from bench.ring import _producer

    rows, batch = 200_000, 4096
    ring = PacketRing.create(16384, link="shm", shared=True)
    try:
        ctx = mp.get_context("spawn")
        ready, go = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_producer, args=(ring.name, rows, batch, lossless, ready, go))
        proc.start()
        assert ready.wait(60), "the producer process did not start"
        go.set()
        if not lossless:
            _wait_offered(ring, 50_000)
        ids, events = _consume(ring, 2048, pause=0 if lossless else 0.001)
        proc.join(60)
        assert proc.exitcode == 0
        s = check_stream(ring, ids, events, rows)
        if lossless:
            assert ids == list(range(rows)) and s.dropped == 0
        else:
            assert s.dropped > 0
        assert events and events[-1] == (len(ids), rows)
    finally:
        ring.close()


def test_attach_and_pickle_share_the_same_memory():
    ring = PacketRing.create(64, link="eth1", shared=True)
    try:
        other = pickle.loads(pickle.dumps(ring))
        assert other.link == "eth1" and other.capacity == 64 and other.name == ring.name
        ring.push(ids_batch(0, 10))
        ring.punctuate(10)
        b, p = other.take(100)
        assert b.link == "eth1" and b["timestamp"].tolist() == list(range(10)) and p == 10
        other.release()
        assert ring.stats().processed == 10
        other.close()
    finally:
        ring.close()
    with pytest.raises(RingError, match="no shared packet ring"):
        PacketRing.attach("oopscope-no-such-ring")


def test_batches_outlive_close_and_the_segment_is_unlinked():
    ring = PacketRing.create(16, shared=True)
    name = ring.name
    other = PacketRing.attach(name)
    ring.push(ids_batch(40, 5))
    batch, _ = other.take(16)
    other.close()
    ring.close()
    assert batch["timestamp"].tolist() == [40, 41, 42, 43, 44]     # views still mapped
    with pytest.raises(RingError):
        PacketRing.attach(name)                                    # the owner unlinked it


@pytest.mark.parametrize("capacity", [0, -5, 2.5, "big"])
def test_bad_capacity(capacity):
    with pytest.raises(RingError, match="capacity"):
        PacketRing.create(capacity)


def test_misuse_is_a_ring_error():
    ring = PacketRing.create(16)
    with pytest.raises(RingError, match="max_rows"):
        ring.take(0)
    bad = ids_batch(0, 4).columns
    bad["len"] = bad["len"].astype(np.int64)
    with pytest.raises(RingError, match="'len' must be uint32"):
        ring.push(bad)
    with pytest.raises(RingError, match="outside"):
        ring.push(ids_batch(0, 4), 2, 9)
    with pytest.raises(RingError, match="shared=True"):
        pickle.dumps(ring)
    assert ring.stats().offered == 0
