"""The packet ring's payload area: payloads round trip through private and shared rings, a
batch is cut where the byte area wraps, bytes running out drop rows with the balance kept,
copies outlive the views, a ring without an area is unchanged; and a property test against a
plain-Python model of the byte rules (the module docstring of capture/ring.py)."""

from __future__ import annotations

import multiprocessing as mp
import time

import numba
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from capture.batch import PacketBatch
from capture.errors import RingError
from capture.ring import PacketRing, copy_rows, ring_commit, ring_reserve
from capture.ringpayload import copy_payloads


def payload_of(i: int) -> bytes:
    """The payload of row id i, written out byte by byte (the oracle of `payload_arrays`)."""
    return bytes((i * 7 + j) % 256 for j in range((i * 37) % 301))


def payload_arrays(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int32, bytes) of `payload_of` for every id, built with numpy."""
    sizes = (ids * 37) % 301
    offsets = np.zeros(len(ids) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], sizes)
    data = ((np.repeat(ids, sizes) * 7 + within) % 256).astype(np.uint8)
    return offsets, data


def batch_of(ids, payloads: list[bytes] | None) -> PacketBatch:
    ids = np.asarray(ids, np.int64)
    b = PacketBatch.empty("t", len(ids))
    b.columns["timestamp"][:] = ids
    b.columns["len"][:] = (ids % 1500).astype(np.uint32)
    if payloads is not None:
        b.payload = pa.array(payloads, pa.binary())
    return b


def id_batch(first: int, n: int) -> PacketBatch:
    """Rows first .. first+n-1 with their `payload_of` payloads (an Arrow binary array)."""
    ids = np.arange(first, first + n, dtype=np.int64)
    b = batch_of(ids, None)
    offsets, data = payload_arrays(ids)
    b.payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return b


def drain(ring: PacketRing, max_rows: int = 1 << 20) -> tuple[list[int], list[bytes], list[int]]:
    """Every row left: ids, payloads, and the sizes of the batches taken."""
    ids: list[int] = []
    got: list[bytes] = []
    sizes: list[int] = []
    while True:
        b, _ = ring.take(max_rows)
        if b is None:
            break
        assert b.payload is not None and len(b.payload) == b.n
        ids += b["timestamp"].tolist()
        got += b.payload.to_pylist()
        sizes.append(b.n)
    ring.release()
    return ids, got, sizes


def area_view(batch: PacketBatch) -> np.ndarray:
    return np.frombuffer(batch.payload.buffers()[2], np.uint8)


def test_round_trip_through_a_private_ring():
    ring = PacketRing.create(1000, payload_bytes=1 << 16)
    assert ring.push(id_batch(0, 300)) == 300
    b, _ = ring.take(120)
    assert b["timestamp"].tolist() == list(range(120))
    assert b.payload.to_pylist() == [payload_of(i) for i in range(120)]
    assert np.shares_memory(area_view(b), ring.payload_area)      # a view, not a copy
    ids, got, _ = drain(ring)
    assert ids == list(range(120, 300)) and got == [payload_of(i) for i in ids]
    s = ring.stats()
    assert (s.offered, s.processed, s.dropped, s.occupancy) == (300, 300, 0, 0)
    assert s.payload_bytes == 1 << 16 and s.payload_occupancy == 0 and ring.free_bytes() == 1 << 16


def test_rows_of_a_sliced_payload_array_and_a_row_range():
    """push(batch, start, stop) and an Arrow array with an offset place the right bytes."""
    src = id_batch(0, 50)
    ring = PacketRing.create(64, payload_bytes=1 << 14)
    assert ring.push(src, 10, 20) == 10
    assert ring.push(src.slice(30, 45)) == 15               # payload.offset == 30
    ids, got, _ = drain(ring)
    assert ids == list(range(10, 20)) + list(range(30, 45))
    assert got == [payload_of(i) for i in ids]


def test_a_batch_without_payloads_gets_empty_ones():
    ring = PacketRing.create(16, payload_bytes=64)
    assert ring.push(batch_of([1, 2, 3], None)) == 3
    assert ring.push(batch_of([4], [b"abc"])) == 1
    assert ring.push(batch_of([5, 6], None).columns) == 2       # a dict of columns
    ids, got, _ = drain(ring)
    assert ids == [1, 2, 3, 4, 5, 6] and got == [b"", b"", b"", b"abc", b"", b""]


def test_wrap_cuts_the_batch_and_payloads_stay_exact():
    ring = PacketRing.create(64, payload_bytes=100)
    first = [bytes([65 + i]) * 30 for i in range(3)]              # 90 bytes: 0..90
    assert ring.push(batch_of([0, 1, 2], first)) == 3
    b, _ = ring.take(64)
    assert b.payload.to_pylist() == first
    ring.release()                                                 # the 90 bytes are free
    second = [b"x" * 8, b"y" * 20, b"", b"z" * 15]                 # 8 fit before the end; 20 do not
    assert ring.push(batch_of([3, 4, 5, 6], second)) == 4
    # x at 90..98, 98..100 skipped, y at 100..120, z at 120..135; the tail at 90
    assert ring.stats().payload_occupancy == 135 - 90
    b, _ = ring.take(64)
    assert b["timestamp"].tolist() == [3]                          # cut: row 4 starts the next lap
    assert b.payload.to_pylist() == [b"x" * 8]
    b, _ = ring.take(64)
    assert b["timestamp"].tolist() == [4, 5, 6]
    assert b.payload.to_pylist() == second[1:]
    assert int(ring.payload_start[4]) == 100 and int(ring.payload_size[4]) == 20
    assert np.shares_memory(area_view(b), ring.payload_area)
    ring.release()
    s = ring.stats()
    assert s.payload_occupancy == 0 and s.offered == s.processed == 7


def test_drops_when_the_bytes_are_full_keep_the_balance():
    ring = PacketRing.create(1000, payload_bytes=1000)
    rows = [b"p" * 300] * 3 + [b"q" * 150, b"", b"r" * 10]       # 900 fit; the 4th does not
    assert ring.push(batch_of(range(6), rows)) == 3                # nor do the rows after it
    s = ring.stats()
    assert (s.offered, s.dropped, s.occupancy, s.payload_occupancy) == (6, 3, 3, 900)
    assert s.balanced
    assert ring.push(batch_of([6, 7], [b"", b"s" * 100])) == 2     # an empty one, then exactly full
    assert ring.free_bytes() == 0 and ring.push(batch_of([8], [b""])) == 1   # room for 0 bytes
    assert ring.push(batch_of([9], [b"t"])) == 0
    ids, got, _ = drain(ring)
    assert ids == [0, 1, 2, 6, 7, 8] and got == rows[:3] + [b"", b"s" * 100, b""]
    s = ring.stats()
    assert s.offered == s.processed + s.dropped == 10 and s.dropped == 4


def test_a_payload_larger_than_the_area_is_dropped_and_the_ring_goes_on():
    ring = PacketRing.create(8, payload_bytes=32)
    assert ring.push(batch_of([0, 1, 2], [b"a", b"b" * 33, b"c"])) == 1
    assert ring.push(batch_of([3], [b"d" * 32])) == 0               # 1 byte still in use
    ids, got, _ = drain(ring)
    # empty, the head at byte 1: 32 bytes would skip 31 to the next lap, which is not free
    assert ring.push(batch_of([4], [b"e" * 32])) == 0
    assert ring.push(batch_of([5], [b"f" * 31])) == 1               # bytes 1..32
    ids2, got2, _ = drain(ring)
    assert ring.push(batch_of([6], [b"g" * 32])) == 1               # a whole lap, from byte 32
    ids3, got3, _ = drain(ring)
    assert (ids, got, ids2, got2, ids3, got3) == ([0], [b"a"], [5], [b"f" * 31], [6], [b"g" * 32])
    s = ring.stats()
    assert s.offered == s.processed + s.dropped == 7


def test_copy_outlives_the_producer_and_views_do_not():
    ring = PacketRing.create(8, payload_bytes=16)
    assert ring.push(batch_of([0, 1], [b"a" * 8, b"b" * 8])) == 2
    view, _ = ring.take(1)
    kept = view.copy()                                 # a PacketBatch copy owns its payload
    copied, _ = ring.take(1, copy=True)                # releases row 0, copies row 1, releases it
    assert not np.shares_memory(area_view(copied), ring.payload_area)
    assert ring.push(batch_of([2, 3], [b"c" * 8, b"d" * 8])) == 2     # overwrites the area
    assert copied.payload.to_pylist() == [b"b" * 8] and kept.payload.to_pylist() == [b"a" * 8]
    assert view.payload.to_pylist() == [b"c" * 8]      # the view shows the new bytes
    ids, got, _ = drain(ring)
    assert got == [b"c" * 8, b"d" * 8]


def test_a_ring_without_a_payload_area_is_unchanged():
    ring = PacketRing.create(8)
    assert ring.payload_bytes == 0 and ring.payload_area is None
    assert ring.push(id_batch(0, 5)) == 5           # the payload is ignored
    b, _ = ring.take(8)
    assert b.payload is None and b["timestamp"].tolist() == list(range(5))
    s = ring.stats()
    assert s.payload_bytes == 0 and s.payload_occupancy == 0 and ring.free_bytes() == 0


def test_attach_finds_the_payload_area():
    ring = PacketRing.create(256, link="eth9", shared=True, payload_bytes=5000)
    try:
        other = PacketRing.attach(ring.name)
        assert other.payload_bytes == 5000 and other.capacity == 256
        ring.push(id_batch(0, 100))
        ids, got, _ = drain(other)
        assert ids == model_accepted([len(payload_of(i)) for i in range(100)], 100, 256, 5000)
        assert got == [payload_of(i) for i in ids] and 0 < len(ids) < 100
        s = ring.stats()
        assert s.offered == s.processed + s.dropped == 100
        other.close()
    finally:
        ring.close()


def _payload_producer(name: str, rows: int, batch_rows: int, ready, go,
                      room: bool = False) -> None:
    """Attach to ring `name`, offer ids 0 .. rows-1 with their payloads; with `room`, each
    batch waits until the ring has room for it (a loaded machine may starve the consumer,
    and what is checked then is what crosses, not a race), else never waiting."""
    ring = PacketRing.attach(name)
    ring.push(id_batch(0, 1), 0, 0)          # warm the kernels before the clock starts
    ready.set()
    go.wait()
    for first in range(0, rows, batch_rows):
        while room:
            st = ring.stats()
            if st.occupancy + batch_rows <= st.capacity and \
                    st.payload_occupancy <= st.payload_bytes // 2:
                break
            time.sleep(0.001)
        ring.push(id_batch(first, min(batch_rows, rows - first)))
        ring.punctuate(min(rows, first + batch_rows))
    ring.finish()
    ring.close()


def model_accepted(sizes: list[int], batch_rows: int, capacity: int, area: int) -> list[int]:
    """The rows that fit when rows of these payload sizes are pushed `batch_rows` at a time
    into a ring nobody takes from (the docstring's rules: per push, a prefix)."""
    head = 0
    accepted: list[int] = []
    for first in range(0, len(sizes), batch_rows):
        for i in range(first, min(first + batch_rows, len(sizes))):
            n = sizes[i]
            at = head if head % area + n <= area else head + area - head % area
            if len(accepted) == capacity or at + n > area:
                break
            accepted.append(i)
            head = at + n
    return accepted


@pytest.mark.parametrize("tight", [False, True])
def test_a_producer_process_through_shared_memory(tight):
    """Roomy: the consumer drains while the producer runs and gets every row. Tight: the
    consumer starts once the producer has ended, and gets exactly the rows that fit."""
    rows, batch_rows = 20_000, 1000
    capacity, area = (4096, 1 << 20) if not tight else (20_000, 100_000)
    ring = PacketRing.create(capacity, link="shm", shared=True, payload_bytes=area)
    try:
        ctx = mp.get_context("spawn")
        ready, go = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_payload_producer, args=(ring.name, rows, batch_rows, ready, go,
                                                                 not tight))
        proc.start()
        assert ready.wait(60), "the producer process did not start"
        go.set()
        if tight:
            proc.join(60)
        ids: list[int] = []
        got: list[bytes] = []
        while True:
            b, _ = ring.take(700)
            if b is not None:
                ids += b["timestamp"].tolist()
                got += b.payload.to_pylist()
            elif ring.done:
                break
        proc.join(60)
        assert proc.exitcode == 0
        s = ring.stats()
        assert s.offered == rows == s.processed + s.dropped and s.processed == len(ids)
        if tight:
            assert ids == model_accepted([len(payload_of(i)) for i in range(rows)], batch_rows,
                                         capacity, area)
            assert s.dropped > 0
        else:
            assert s.dropped == 0 and ids == list(range(rows))
        assert got == [payload_of(i) for i in ids]
    finally:
        ring.close()


@numba.njit(nogil=True)
def _numba_payload_producer(ctrl, ts_ring, starts, sizes, area, ts, offsets, data, batch):
    sent = 0
    while sent < ts.shape[0]:
        m = min(batch, ts.shape[0] - sent)
        pos, k = ring_reserve(ctrl, m)
        k = copy_payloads(ctrl, starts, sizes, area, offsets, data, sent, pos, k)
        copy_rows(ts_ring, ts, sent, pos, k)
        ring_commit(ctrl, k, m)
        sent += m


def test_a_numba_producer_places_payloads_too():
    ring = PacketRing.create(100, payload_bytes=4000)
    ids = np.arange(500, dtype=np.int64)
    offsets, data = payload_arrays(ids)
    _numba_payload_producer(ring.ctrl, ring.columns["timestamp"], ring.payload_start,
                            ring.payload_size, ring.payload_area, ids, offsets, data, 7)
    got_ids, got, _ = drain(ring)
    want = model_accepted([len(payload_of(i)) for i in range(500)], 7, 100, 4000)
    assert got_ids == want and got == [payload_of(i) for i in got_ids]
    assert ring.stats().dropped == 500 - len(want) > 0


@pytest.mark.parametrize("size", [-1, 1 << 31, 2.5, True])
def test_bad_payload_area(size):
    with pytest.raises(RingError, match="payload area"):
        PacketRing.create(8, payload_bytes=size)


def test_payload_misuse_is_a_ring_error():
    ring = PacketRing.create(8, payload_bytes=64)
    b = batch_of([1, 2], [b"a"])
    with pytest.raises(RingError, match="1 items for 2 rows"):
        ring.push(b)
    b.payload = pa.array([1, 2])
    with pytest.raises(RingError, match="Arrow binary array"):
        ring.push(b)
    assert ring.stats().offered == 0


# --- the property test -------------------------------------------------------------------------

class PayloadRingModel:
    """The rows and bytes of the ring's rules, as plain Python lists (no punctuation)."""

    def __init__(self, cap: int, area: int):
        self.cap, self.area = cap, area
        self.rows: list[tuple[int, bytes, int]] = []     # (id, payload, absolute start), tail..head
        self.lent = self.tail = 0                         # rows lent out, rows released
        self.bhead = self.btail = 0
        self.offered = self.dropped = 0

    def push(self, items: list[tuple[int, bytes]]) -> int:
        accepted = 0
        for i, p in items:
            if len(self.rows) == self.cap:
                break
            at = self.bhead
            if at % self.area + len(p) > self.area:
                at += self.area - at % self.area
            if at + len(p) - self.btail > self.area:
                break
            self.rows.append((i, p, at))
            self.bhead = at + len(p)
            accepted += 1
        self.offered += len(items)
        self.dropped += len(items) - accepted
        return accepted

    def release(self) -> None:
        if self.lent:
            _, p, at = self.rows[self.lent - 1]
            self.btail = at + len(p)
            self.rows = self.rows[self.lent:]
            self.tail += self.lent
            self.lent = 0

    def take(self, m: int) -> list[tuple[int, bytes]]:
        self.release()
        k = min(len(self.rows), m, self.cap - self.tail % self.cap)
        lap = self.rows[0][2] // self.area if k else 0
        k = next((j for j in range(k) if self.rows[j][2] // self.area != lap), k)
        self.lent = k
        return [(i, p) for i, p, _ in self.rows[:k]]


script_ops = st.lists(st.one_of(
    st.tuples(st.just("push"), st.lists(st.integers(0, 70), max_size=12)),
    st.tuples(st.just("take"), st.integers(1, 12)),
    st.tuples(st.just("copy"), st.integers(1, 12)),
    st.tuples(st.just("release"), st.just(0)),
), max_size=50)


@settings(max_examples=200, deadline=None)
@given(cap=st.integers(1, 16), area=st.integers(1, 160), script=script_ops)
def test_payload_ring_follows_the_model(cap, area, script):
    ring = PacketRing.create(cap, payload_bytes=area)
    model = PayloadRingModel(cap, area)
    next_id = 0
    kept: list[tuple[PacketBatch, list]] = []       # copies: must stay as they were
    for op, arg in script:
        if op == "push":
            items = [(next_id + j, bytes([(next_id + j) % 251]) * n) for j, n in enumerate(arg)]
            next_id += len(arg)
            got = ring.push(batch_of([i for i, _ in items], [p for _, p in items]))
            assert got == model.push(items)
        elif op == "release":
            ring.release()
            model.release()
        else:
            want = model.take(arg)
            batch, _ = ring.take(arg, copy=op == "copy")
            if op == "copy":
                model.release()
            rows = [] if batch is None else list(zip(batch["timestamp"].tolist(),
                                                     batch.payload.to_pylist()))
            assert rows == want
            if batch is not None and op == "copy":
                kept.append((batch, want))
        s = ring.stats()
        assert s.offered == model.offered and s.dropped == model.dropped
        assert s.balanced and s.occupancy <= cap
        assert s.payload_occupancy == model.bhead - model.btail <= area
    for batch, want in kept:
        assert list(zip(batch["timestamp"].tolist(), batch.payload.to_pylist())) == want
