"""The packet ring: a fixed-size, columnar, single-producer/single-consumer buffer that drops (and counts) when full.

One allocation holds everything: a control block of int64 counters, the link name, a small
queue of punctuations, one array per physical column of `capture.schema.COLUMNS`, each
`capacity` rows long, and optionally a payload area (below). The memory is either private
(threads of one process) or a `multiprocessing.shared_memory` segment (a paced producer on its
own core in another process):

    ring = PacketRing.create(1 << 20, link="l0", shared=True)     # owner: unlinks on close()
    other = PacketRing.attach(ring.name)                           # in the other process
    accepted = ring.push(batch)        # producer: never blocks; rows that do not fit are dropped
    ring.punctuate(p)                  # producer: "no row of this link with timestamp < p follows"
    batch, punct = ring.take(65536)    # consumer: views valid until the next take()/release()
    ring.finish()                      # producer: end of stream (consumer sees `done`)

Rules (the Gigascope ring buffer of thesis 8.4; docs/architecture.md "Contracts between the
levels": packet ring and punctuation):
- The producer never waits: `push` copies the rows that fit and drops the rest, counting them.
  `offered == processed + dropped + occupancy` holds at every moment the ring is quiescent, so
  once the consumer has drained it, `offered == processed + dropped` exactly.
- `take(max_rows)` returns a PacketBatch of VIEWS into the ring (no copy; a batch never wraps,
  so it may be shorter than what is available; a column is sliced when first read, see
  `RingColumns`). Its rows stay reserved until the consumer's
  next `take` or `release`; then the producer may overwrite them. `take(copy=True)` copies
  and releases at once. Rows count as processed when released.
- Punctuation travels in order with the rows: `punctuate(p)` records (rows pushed so far, p);
  `take` returns the largest punctuation whose rows have all been handed out (in this batch or
  before), else None. Values are monotone (a value <= the last one is ignored). If the
  punctuation queue is full the producer keeps the newest value locally and publishes it at
  its next call (never blocking, never early).
- Memory order: the producer writes rows, then publishes the head counter; the consumer reads
  the head, then the rows. Aligned 8-byte stores are atomic and stay in order on x86-64 (the
  machines this runs on); the counters are only ever written by one side each.

The payload area (`create(..., payload_bytes=N)`, N > 0 and below 2 GiB, so Arrow's int32
offsets reach every byte): N bytes for the rows' TCP/UDP payloads (`PacketBatch.payload`,
`capture.payload`), and per row slot the absolute byte position where its payload starts
(int64) and its size (int32). Absolute positions count bytes ever placed (skips included); a
position's place in the area is `position % N`, its lap `position // N`.
- The producer keeps the byte head (C_BHEAD), the consumer the byte tail (C_BTAIL), each
  written by its side only, as the row counters. Bytes in use: head - tail <= N.
- `push` requires `batch.payload` to be an Arrow binary array of the batch's rows (a batch
  without one, `payload=None` or a dict of columns, is pushed with empty payloads). Rows are
  taken in order while both a row slot and byte space remain: a payload starts at the byte
  head, or, when it would cross the end of the area, at the start of the next lap (the
  skipped bytes stay in use until the consumer passes them). The first row that does not fit
  and every row after it are dropped and counted, as rows that find no slot are: the balance
  above still holds. The bytes and the row's position and size are written before the row
  head is published.
- `take` also cuts a batch where the byte area wraps (all its rows' payloads in one lap), so
  `batch.payload` is a zero-copy Arrow binary array over the area (offsets relative to the
  first row's start), valid as long as its rows: until the next take/release (`copy=True`
  copies it). Releasing moves the byte tail to the end of the last released row's payload.
- A ring without a payload area ignores `batch.payload` and hands out `payload=None`.

- `free()` tells a producer that prefers waiting (a benchmark feeding a lossless run) how
  many rows fit now (`free_bytes()`: payload bytes); `stats()` gives offered, processed,
  dropped, occupancy and high water (and the payload area's size and bytes in use).
- `close()` detaches; the creating process also unlinks the segment. Batches already taken
  stay readable (the mapping goes with the last numpy view of it).

Numba producers (nogil kernels) use the same protocol through `ring.ctrl`, `ring.columns` and
the jitted `ring_reserve` / `copy_rows` / `ring_commit` below (reserve, copy each column,
commit: no per-row Python anywhere); they punctuate from Python between kernel calls. On a
ring with a payload area, `capture.ringpayload.copy_payloads` comes right after the reserve:
it places the payloads of the reserved rows that also find bytes and says how many; those
rows are copied and committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import pyarrow as pa

from capture.batch import PacketBatch
from capture.errors import RingError
from capture.payload import binary_array
from capture.ringpayload import (
    C_BHEAD,
    C_BTAIL,
    MAX_PAYLOAD_BYTES,
    payload_buffers,
    place_payloads,
)
from capture.schema import COLUMNS
from common.jit import ngjit

log = logging.getLogger(__name__)

MAGIC = 0x4F4F_5052_494E_4702          # "OOPRING" + layout version 2 (the payload area)
CTRL_WORDS = 32
LINK_BYTES = 64
DEFAULT_PUNCT_SLOTS = 1024
_ALIGN = 64

# control block: metadata, then the producer's words and the consumer's words on separate
# cache lines (each side writes only its own line)
C_MAGIC, C_CAPACITY, C_PSLOTS, C_NCOLS, C_PBYTES = 0, 1, 2, 3, 4
C_HEAD, C_OFFERED, C_DROPPED, C_HIGH, C_PHEAD, C_DONE, C_FINALP = 8, 9, 10, 11, 12, 13, 14
C_TAIL, C_PROCESSED, C_PTAIL = 16, 17, 18
# the payload area's byte head (producer's line, word 15) and tail (consumer's, word 19)
NO_PUNCT = np.iinfo(np.int64).min


# --- the Numba-friendly core ------------------------------------------------------------------

@ngjit
def ring_reserve(ctrl, n):
    """(ring position, rows that fit) for n offered rows; the producer then copies and commits."""
    cap = ctrl[C_CAPACITY]
    head = ctrl[C_HEAD]
    free = cap - (head - ctrl[C_TAIL])
    k = n if n < free else free
    if k < 0:
        k = 0
    return head % cap, k


@ngjit
def copy_rows(dst, src, src_start, pos, k):
    """Copy src[src_start:src_start+k] into the ring column dst starting at pos, wrapping once."""
    cap = dst.shape[0]
    first = cap - pos
    if first > k:
        first = k
    for j in range(first):
        dst[pos + j] = src[src_start + j]
    for j in range(k - first):
        dst[j] = src[src_start + first + j]


@ngjit
def ring_commit(ctrl, k, n):
    """Publish k copied rows of n offered: head moves last, after the rows are in place."""
    head = ctrl[C_HEAD] + k
    ctrl[C_HEAD] = head
    ctrl[C_DROPPED] += n - k
    ctrl[C_OFFERED] += n
    occ = head - ctrl[C_TAIL]
    if occ > ctrl[C_HIGH]:
        ctrl[C_HIGH] = occ


class RingColumns(Mapping):
    """The columns of one `take`: views of rows [start, stop) of the ring's arrays, each sliced
    when first read. A consumer reads a few of the ~30 columns, and slicing all of them cost
    more than the rest of a take together."""

    __slots__ = ("_arrays", "_rows", "_views")

    def __init__(self, arrays: dict[str, np.ndarray], start: int, stop: int):
        self._arrays = arrays
        self._rows = slice(start, stop)
        self._views: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = self._arrays[name][self._rows]
        return view

    def get(self, name: str, default=None):
        view = self._views.get(name)
        if view is None:
            arr = self._arrays.get(name)
            if arr is None:
                return default
            view = self._views[name] = arr[self._rows]
        return view

    def __contains__(self, name) -> bool:
        return name in self._arrays

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def keys(self):
        return self._arrays.keys()


@dataclass(frozen=True)
class RingStats:
    """Counters of one ring (read without locking: exact when the ring is quiescent)."""

    capacity: int
    offered: int
    processed: int
    dropped: int
    occupancy: int
    high_water: int
    punctuations: int
    payload_bytes: int = 0          # the payload area's size (0: none)
    payload_occupancy: int = 0      # its bytes in use (skipped ones included)

    @property
    def balanced(self) -> bool:
        return self.offered == self.processed + self.dropped + self.occupancy


# the payload area's arrays in the layout (not packet columns: "/" is in no column name)
_P_START, _P_SIZE, _P_AREA = "/payload_start", "/payload_size", "/payload_area"


def _layout(capacity: int, pslots: int, payload_bytes: int = 0) -> tuple[dict[str, int], int, int]:
    """Byte offset of every column, of the punctuation queue, and the total size. With a payload
    area, `offsets` also has those of the per-row payload starts and sizes and of the area."""
    off = CTRL_WORDS * 8 + LINK_BYTES
    punct_off = off
    off += 16 * pslots
    offsets = {}
    arrays = [(c.name, capacity * c.dtype.itemsize) for c in COLUMNS]
    if payload_bytes:
        arrays += [(_P_START, capacity * 8), (_P_SIZE, capacity * 4), (_P_AREA, payload_bytes)]
    for name, size in arrays:
        off = -(-off // _ALIGN) * _ALIGN
        offsets[name] = off
        off += size
    return offsets, punct_off, off


class PacketRing:
    """Fixed-capacity SPSC packet ring over private or shared memory (see the module docstring)."""

    def __init__(self, buf, capacity: int, pslots: int, *, payload_bytes: int = 0, shm=None,
                 owner: bool = False):
        self._shm = shm
        self._owner = owner
        self._buf = buf
        self.ctrl = np.ndarray(CTRL_WORDS, np.int64, buffer=buf, offset=0)
        offsets, punct_off, _ = _layout(capacity, pslots, payload_bytes)
        self._punct = np.ndarray((pslots, 2), np.int64, buffer=buf, offset=punct_off)
        self.columns = {c.name: np.ndarray(capacity, c.dtype, buffer=buf, offset=offsets[c.name]) for c in COLUMNS}
        #: the payload area (module doc): its size in bytes (0: none), the absolute byte start
        #: and size of each row slot's payload, and the bytes; None without an area
        self.payload_bytes = payload_bytes
        self.payload_start: np.ndarray | None = None
        self.payload_size: np.ndarray | None = None
        self.payload_area: np.ndarray | None = None
        if payload_bytes:
            self.payload_start = np.ndarray(capacity, np.int64, buffer=buf, offset=offsets[_P_START])
            self.payload_size = np.ndarray(capacity, np.int32, buffer=buf, offset=offsets[_P_SIZE])
            self.payload_area = np.ndarray(payload_bytes, np.uint8, buffer=buf, offset=offsets[_P_AREA])
        name_raw = bytes(np.ndarray(LINK_BYTES, np.uint8, buffer=buf, offset=CTRL_WORDS * 8))
        self.link = name_raw.rstrip(b"\0").decode("utf-8")
        self.capacity = capacity
        self._pslots = pslots
        # producer-local: a punctuation that did not fit the queue; consumer-local: rows lent
        # out, and where the last of them's payload ends (the byte tail once they are released)
        self._pending = NO_PUNCT
        self._lent = 0
        self._lent_end = 0
        self._last_punct = NO_PUNCT
        self._producer_lock = threading.Lock()

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def create(cls, capacity: int, link: str = "l0", *, shared: bool = False,
               punct_slots: int = DEFAULT_PUNCT_SLOTS, payload_bytes: int = 0) -> PacketRing:
        """A new ring of `capacity` rows, with a payload area of `payload_bytes` bytes when > 0
        (RingError if capacity < 1, the area is 2 GiB or more, or the memory cannot be had)."""
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise RingError(f"ring capacity must be a positive number of rows (got {capacity!r})")
        if punct_slots < 1:
            raise RingError(f"punctuation slots must be at least 1 (got {punct_slots})")
        if isinstance(payload_bytes, bool) or not isinstance(payload_bytes, (int, np.integer)) \
                or not 0 <= payload_bytes <= MAX_PAYLOAD_BYTES:
            raise RingError(f"ring payload area must be 0 (none) to {MAX_PAYLOAD_BYTES} bytes: Arrow "
                            f"offsets are int32 (got {payload_bytes!r})")
        link_b = link.encode("utf-8")
        if len(link_b) > LINK_BYTES:
            raise RingError(f"link name {link!r} is longer than {LINK_BYTES} bytes")
        payload_bytes = int(payload_bytes)
        _, _, size = _layout(int(capacity), punct_slots, payload_bytes)
        buf: memoryview | np.ndarray | None
        try:
            if shared:
                shm = shared_memory.SharedMemory(create=True, size=size)
                buf = shm.buf
            else:
                shm = None
                buf = np.zeros(size, np.uint8)
        except (OSError, MemoryError, ValueError) as exc:
            raise RingError(f"cannot allocate a ring of {capacity} rows and {payload_bytes} payload "
                            f"bytes ({size} bytes): {exc}") from None
        ctrl = np.ndarray(CTRL_WORDS, np.int64, buffer=buf, offset=0)
        ctrl[:] = 0
        ctrl[C_MAGIC], ctrl[C_CAPACITY], ctrl[C_PSLOTS], ctrl[C_NCOLS] = MAGIC, capacity, punct_slots, len(COLUMNS)
        ctrl[C_PBYTES] = payload_bytes
        ctrl[C_FINALP] = NO_PUNCT
        np.ndarray(LINK_BYTES, np.uint8, buffer=buf, offset=CTRL_WORDS * 8)[:len(link_b)] = np.frombuffer(link_b, np.uint8)
        return cls(buf, int(capacity), punct_slots, payload_bytes=payload_bytes, shm=shm, owner=shared)

    @classmethod
    def attach(cls, name: str) -> PacketRing:
        """The shared ring `name` created by another process (RingError if absent or not a ring)."""
        # Python 3.11 registers attached segments with the resource tracker, which would unlink
        # the owner's segment when this process exits; only the creator may unlink it.
        orig = resource_tracker.register
        resource_tracker.register = lambda *a, **k: None
        try:
            shm = shared_memory.SharedMemory(name=name)
        except (FileNotFoundError, OSError) as exc:
            raise RingError(f"no shared packet ring named {name!r}: {exc}") from None
        finally:
            resource_tracker.register = orig
        ctrl = np.ndarray(CTRL_WORDS, np.int64, buffer=shm.buf, offset=0)
        if ctrl[C_MAGIC] != MAGIC or ctrl[C_NCOLS] != len(COLUMNS):
            shm.close()
            raise RingError(f"shared memory {name!r} is not a packet ring of this schema and layout")
        capacity, pslots, payload_bytes = int(ctrl[C_CAPACITY]), int(ctrl[C_PSLOTS]), int(ctrl[C_PBYTES])
        if _layout(capacity, pslots, payload_bytes)[2] > shm.size:
            shm.close()
            raise RingError(f"shared packet ring {name!r} is smaller than its control block says")
        return cls(shm.buf, capacity, pslots, payload_bytes=payload_bytes, shm=shm, owner=False)

    @property
    def name(self) -> str | None:
        """The shared-memory name to attach to (None for a private ring)."""
        return None if self._shm is None else self._shm.name

    def __reduce__(self):
        if self._shm is None:
            raise RingError("a private ring cannot cross processes; create it with shared=True")
        return (PacketRing.attach, (self._shm.name,))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The ring's column arrays in `capture.schema.COLUMNS` order (for Numba producers)."""
        return tuple(self.columns[c.name] for c in COLUMNS)

    # --- producer -------------------------------------------------------------------------
    def push(self, batch: PacketBatch | dict[str, np.ndarray], start: int = 0, stop: int | None = None) -> int:
        """Offer rows [start, stop) of a batch; copy what fits, drop the rest. Returns rows accepted.

        With a payload area, the batch's payloads go with its rows (a row fits when its payload
        does too); a batch without payloads is pushed with empty ones."""
        cols = batch.columns if isinstance(batch, PacketBatch) else batch
        try:
            ts = cols["timestamp"]
        except KeyError:
            raise RingError("pushed batch lacks the `timestamp` column") from None
        stop = len(ts) if stop is None else stop
        n = stop - start
        if n < 0 or start < 0 or stop > len(ts):
            raise RingError(f"push rows [{start}, {stop}) outside a batch of {len(ts)} rows")
        for c in COLUMNS:
            a = cols.get(c.name)
            if a is None or a.dtype != c.dtype or len(a) != len(ts):
                found = "missing" if a is None else f"{a.dtype}[{len(a)}]"
                raise RingError(f"pushed column {c.name!r} must be {c.dtype}[{len(ts)}] (found {found})")
        if self.payload_bytes:
            offsets, data = payload_buffers(batch, len(ts))
        with self._producer_lock:
            self._publish_pending()
            pos, k = ring_reserve(self.ctrl, n)
            if k and self.payload_bytes:
                k = self._copy_payloads(offsets, data, start, pos, k)
            if k:
                first = min(k, self.capacity - pos)
                for c in COLUMNS:
                    dst, src = self.columns[c.name], cols[c.name]
                    dst[pos:pos + first] = src[start:start + first]
                    if k > first:
                        dst[:k - first] = src[start + first:start + k]
            ring_commit(self.ctrl, k, n)
        return int(k)

    def _copy_payloads(self, offsets: np.ndarray, data: np.ndarray, start: int, pos: int, k: int) -> int:
        """`capture.ringpayload.copy_payloads`, the bytes copied by numpy: a memcpy, where
        Numba's slice assignment is an element loop. Returns the rows placed."""
        assert self.payload_area is not None      # a ring with a payload area
        placed, split, first_at = place_payloads(self.ctrl, self.payload_start, self.payload_size,
                                                 self.payload_bytes, offsets, start, pos, k)
        a0, a_split, a1 = int(offsets[start]), int(offsets[start + split]), int(offsets[start + placed])
        if a_split > a0:
            off = first_at % self.payload_bytes
            self.payload_area[off:off + a_split - a0] = data[a0:a_split]
        if a1 > a_split:
            self.payload_area[:a1 - a_split] = data[a_split:a1]
        return int(placed)

    def punctuate(self, p: int) -> bool:
        """Record the low-watermark p after the rows pushed so far; False if it adds nothing."""
        p = int(p)
        with self._producer_lock:
            newest = max(self._pending, self._queued_max())
            if p <= newest:
                return False
            self._pending = p
            self._publish_pending()
            return True

    def finish(self) -> None:
        """End of stream: publish the last punctuation and mark the ring done."""
        with self._producer_lock:
            self._publish_pending()
            if self._pending != NO_PUNCT:
                self.ctrl[C_FINALP] = self._pending   # delivered once every row is taken
                self._pending = NO_PUNCT
            self.ctrl[C_DONE] = 1

    def _queued_max(self) -> int:
        ph = int(self.ctrl[C_PHEAD])
        return int(self._punct[(ph - 1) % self._pslots, 1]) if ph else NO_PUNCT

    def _publish_pending(self) -> None:
        if self._pending == NO_PUNCT:
            return
        ph = int(self.ctrl[C_PHEAD])
        if ph - int(self.ctrl[C_PTAIL]) >= self._pslots:
            return          # queue full: keep it, try again at the next call
        slot = self._punct[ph % self._pslots]
        slot[0] = self.ctrl[C_HEAD]
        slot[1] = self._pending
        self.ctrl[C_PHEAD] = ph + 1
        self._pending = NO_PUNCT

    # --- consumer -------------------------------------------------------------------------
    def take(self, max_rows: int = 65536, *, copy: bool = False) -> tuple[PacketBatch | None, int | None]:
        """(batch or None, punctuation or None): up to max_rows rows, never wrapping (nor, with
        a payload area, wrapping that area: `batch.payload` is then a view of it).

        The punctuation, when given, holds after this batch's rows: every row offered before it
        has now been handed out (or dropped).
        """
        if max_rows < 1:
            raise RingError(f"take needs max_rows >= 1 (got {max_rows})")
        self.release()
        done = self.ctrl[C_DONE]               # read before the head: rows published before done
        head = int(self.ctrl[C_HEAD])
        tail = int(self.ctrl[C_TAIL])
        pos = tail % self.capacity
        k = min(head - tail, max_rows, self.capacity - pos)
        batch = None
        if k > 0:
            payload = None
            if self.payload_bytes:
                k, payload = self._payload_view(pos, k, copy)
            cols: Mapping[str, np.ndarray]
            if copy:
                cols = {name: a[pos:pos + k].copy() for name, a in self.columns.items()}
            else:
                cols = RingColumns(self.columns, pos, pos + k)
            batch = PacketBatch(self.link, cols, payload=payload)
            self._lent = k
            if copy:
                self.release()
        punct = self._collect_punct(tail + k, finished=bool(done) and tail + k == head)
        return batch, punct

    def _payload_view(self, pos: int, k: int, copy: bool) -> tuple[int, pa.Array]:
        """(rows, their payloads) of the k rows at ring position pos, cut where the payload area
        wraps; the payloads a view of the area (a copy with `copy`)."""
        assert self.payload_start is not None and self.payload_size is not None \
            and self.payload_area is not None      # a ring with a payload area
        size_area = self.payload_bytes
        starts = self.payload_start[pos:pos + k]
        first = int(starts[0])
        lap_end = (first // size_area + 1) * size_area
        if int(starts[-1]) >= lap_end:             # starts never decrease: cut at the new lap
            k = int(np.searchsorted(starts, lap_end))
            starts = starts[:k]
        end = int(starts[-1]) + int(self.payload_size[pos + k - 1])
        offsets = np.empty(k + 1, np.int32)
        np.subtract(starts, first, out=offsets[:k], casting="unsafe")
        offsets[k] = end - first
        at = first % size_area
        data = self.payload_area[at:at + end - first]
        self._lent_end = end
        return k, binary_array(offsets, data.copy() if copy else data)

    def release(self) -> None:
        """Hand back the rows of the last take (they count as processed)."""
        if self._lent:
            k = self._lent
            self._lent = 0
            if self.payload_bytes:
                self.ctrl[C_BTAIL] = self._lent_end
            self.ctrl[C_PROCESSED] += k
            self.ctrl[C_TAIL] += k

    def _collect_punct(self, handed_out: int, finished: bool) -> int | None:
        best = NO_PUNCT
        pt, ph = int(self.ctrl[C_PTAIL]), int(self.ctrl[C_PHEAD])
        while pt < ph:
            pos, val = self._punct[pt % self._pslots]
            if pos > handed_out:
                break
            best = max(best, int(val))
            pt += 1
        self.ctrl[C_PTAIL] = pt
        if finished and pt == ph:
            best = max(best, int(self.ctrl[C_FINALP]))
        if best > self._last_punct:
            self._last_punct = best
            return best
        return None

    @property
    def done(self) -> bool:
        """The producer has finished and every row has been taken."""
        return bool(self.ctrl[C_DONE]) and int(self.ctrl[C_TAIL]) + self._lent >= int(self.ctrl[C_HEAD]) \
            and int(self.ctrl[C_PTAIL]) == int(self.ctrl[C_PHEAD])

    # --- counters and lifetime ------------------------------------------------------------
    def stats(self) -> RingStats:
        c = self.ctrl
        return RingStats(self.capacity, int(c[C_OFFERED]), int(c[C_PROCESSED]), int(c[C_DROPPED]),
                         int(c[C_HEAD] - c[C_TAIL]), int(c[C_HIGH]), int(c[C_PHEAD]),
                         self.payload_bytes, int(c[C_BHEAD] - c[C_BTAIL]))

    def free(self) -> int:
        """Rows a push would accept now (a producer that prefers waiting to dropping polls this)."""
        return self.capacity - int(self.ctrl[C_HEAD] - self.ctrl[C_TAIL])

    def free_bytes(self) -> int:
        """Payload bytes free now (0 without a payload area); a payload that would cross the
        end of the area also needs the bytes up to the end."""
        return self.payload_bytes - int(self.ctrl[C_BHEAD] - self.ctrl[C_BTAIL])

    def __len__(self) -> int:
        return int(self.ctrl[C_HEAD] - self.ctrl[C_TAIL])

    def close(self) -> None:
        """Detach (and, in the creating process, unlink the shared segment).

        Batches handed out by `take` stay readable: the mapping is unmapped only when the last
        numpy view of it is gone (SharedMemory.close() would unmap it under them).
        """
        if self._shm is None:
            return
        shm, self._shm = self._shm, None
        # closed: the views must go so the mapping can be unmapped (no use follows a close)
        self.ctrl = self._punct = None  # type: ignore[assignment]
        self.columns = {}
        self.payload_start = self.payload_size = self.payload_area = None
        self._buf = None
        # numpy views hold the mmap object itself (not an export of shm.buf), so forgetting
        # the mmap here leaves its lifetime to them; SharedMemory then only closes its fd
        try:
            shm._buf.release()
        except BufferError:
            pass              # a view holds the memoryview, which holds the mmap: as safe
        shm._buf = None
        shm._mmap = None
        shm.close()
        if self._owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> PacketRing:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
