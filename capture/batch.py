"""Columnar packet batches: the contract between capture/ and lowlevel/ (one row per packet)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from capture.schema import COLUMN_BY_NAME, COLUMNS
from common.jit import ngjit
from common.units import NS_PER_S as _NS

#: the payload column's name (`capture.payload.PAYLOAD`; not imported: payload imports decode)
PAYLOAD = "payload"

_NAMES = frozenset(c.name for c in COLUMNS)


@dataclass
class PacketBatch:
    """Packets of one link as numpy columns named as in `capture.schema.COLUMNS`.

    `columns` holds every physical column, all of length `n` (views into reused buffers are
    allowed: a consumer that keeps a batch beyond the next read must `copy()` it); a dict, or
    a read-only mapping such as a ring's `RingColumns`. Derived fields (`time`,
    `timestamp_ms`) are computed on first access.
    """

    link: str
    columns: Mapping[str, np.ndarray]
    #: byte offset in the source file of each packet record (for error messages), optional
    offsets: np.ndarray | None = None
    #: the timestamps are known not to decrease (set by the readers, from `tally`)
    in_order: bool = False
    #: TCP/UDP payload bytes, one item per packet (an Arrow binary array), only when the
    #: reader was asked for them (`capture.payload`); None otherwise
    payload: Any = None
    _derived: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.columns.keys() >= _NAMES:      # one set comparison: batches come by the thousand
            return
        missing = [c.name for c in COLUMNS if c.name not in self.columns]
        if missing:
            raise ValueError(f"packet batch of link {self.link!r} lacks columns {missing}")

    @property
    def n(self) -> int:
        return len(self.columns["timestamp"])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, name: str) -> np.ndarray:
        col = self.columns.get(name)
        if col is not None:
            return col
        if name in self._derived:
            return self._derived[name]
        if name == PAYLOAD:
            if self.payload is None:
                raise KeyError(f"{name}: the payload was not captured (no query asked for it)")
            return self.payload
        if name == "time":
            val = (self.columns["timestamp"] // _NS).astype(np.uint64)
        elif name == "timestamp_ms":
            val = self.columns["timestamp"] // 1_000_000
        else:
            raise KeyError(name)
        self._derived[name] = val
        return val

    def slice(self, start: int, stop: int) -> PacketBatch:
        """Rows [start, stop) as views."""
        offs = None if self.offsets is None else self.offsets[start:stop]
        payload = None if self.payload is None else self.payload[start:stop]
        return PacketBatch(self.link, {k: v[start:stop] for k, v in self.columns.items()}, offs,
                           self.in_order, payload)

    def take(self, mask_or_index: np.ndarray) -> PacketBatch:
        """Rows selected by a boolean mask or an index array (copies)."""
        offs = None if self.offsets is None else self.offsets[mask_or_index]
        payload = None
        if self.payload is not None:
            sel = np.asarray(mask_or_index)
            payload = self.payload.filter(pa.array(sel)) if sel.dtype == np.bool_ else \
                self.payload.take(pa.array(sel))
        return PacketBatch(self.link, {k: v[mask_or_index] for k, v in self.columns.items()}, offs,
                           payload=payload)

    def copy(self) -> PacketBatch:
        offs = None if self.offsets is None else self.offsets.copy()
        # copied too: a packet ring's payload is a view of its byte area (capture.ring), which
        # the producer overwrites once the rows are released (concatenation allocates anew)
        payload = None if self.payload is None else pa.concat_arrays([self.payload])
        return PacketBatch(self.link, {k: v.copy() for k, v in self.columns.items()}, offs,
                           payload=payload)

    @staticmethod
    def empty(link: str, n: int = 0) -> PacketBatch:
        """A zero-filled batch of `n` rows (n = 0: an empty batch)."""
        return PacketBatch(link, {c.name: np.zeros(n, c.dtype) for c in COLUMNS})

    @staticmethod
    def concat(batches: list[PacketBatch]) -> PacketBatch:
        if not batches:
            raise ValueError("concat of no batches")
        link = batches[0].link
        cols = {c.name: np.concatenate([b.columns[c.name] for b in batches]) for c in COLUMNS}
        payload = None
        if all(b.payload is not None for b in batches):
            payload = pa.concat_arrays([b.payload for b in batches])
        return PacketBatch(link, cols, payload=payload)


def column_dtype(name: str) -> np.dtype:
    return COLUMN_BY_NAME[name].dtype


@ngjit
def tally(length, caplen, reason, reason_counts, timestamp):
    """(wire bytes, captured bytes, in order) of a batch's packets, and their reasons counted
    into `reason_counts` [256]: the per-batch statistics of readers and rings, in one pass.
    `in order`: the timestamps never decrease (a replay then needs no running maximum)."""
    wire = 0
    captured = 0
    in_order = True
    for i in range(len(length)):
        wire += length[i]
        captured += caplen[i]
        reason_counts[reason[i]] += 1
        if i and timestamp[i] < timestamp[i - 1]:
            in_order = False
    return wire, captured, in_order


#: the columns every record batch has beside its fields' (`capture.records`): generic code
#: (timers, byte counters, the protocol mask) reads them as it reads a packet batch's
RECORD_BASE_COLUMNS = ("timestamp", "len", "layers", "reason")


@dataclass
class RecordBatch(PacketBatch):
    """Records of a schema-file protocol (`capture.records`), one row per record, with the
    interface of a packet batch where the low level uses it.

    Columns: `timestamp` (int64 ns: the clock field times its unit, or the wall clock when
    read), `len` (uint32: bytes of the line, its end included), `layers` and `reason` (zero:
    a record plan's protocol mask is 0, every row belongs), and per field its columns
    (`capture.recordsource.field_columns`): uint/ullong uint64, int/llong int64, float float64,
    bool uint8, IPv4 uint64 IPv4-mapped, IPv6 two uint64 halves, string uint64 codes into
    `strings[column]`, the link's `capture.strings.StringTable` (one table for every string
    column of the link). `offsets` are the records' line numbers (1-based) in the source.
    `punctuation`: a source that punctuates its own records (a NETFLOW link,
    `capture.flowreader`) gives here its punctuation once this batch is processed (None: no
    advance); slices and takes do not carry it. `punctuations`: the same on each clock the
    source punctuates (a NETFLOW link of the appliance: `first` and `last`), by clock."""

    strings: Mapping = field(default_factory=dict)
    punctuation: int | None = None
    punctuations: Mapping | None = None

    def __post_init__(self) -> None:
        missing = [c for c in RECORD_BASE_COLUMNS if c not in self.columns]
        if missing:
            raise ValueError(f"record batch of link {self.link!r} lacks columns {missing}")

    def slice(self, start: int, stop: int) -> RecordBatch:
        offs = None if self.offsets is None else self.offsets[start:stop]
        return RecordBatch(self.link, {k: v[start:stop] for k, v in self.columns.items()}, offs,
                           self.in_order, strings=self.strings)

    def take(self, mask_or_index: np.ndarray) -> RecordBatch:
        offs = None if self.offsets is None else self.offsets[mask_or_index]
        return RecordBatch(self.link, {k: v[mask_or_index] for k, v in self.columns.items()},
                           offs, strings=self.strings)

    def copy(self) -> RecordBatch:
        offs = None if self.offsets is None else self.offsets.copy()
        return RecordBatch(self.link, {k: v.copy() for k, v in self.columns.items()}, offs,
                           self.in_order, strings=self.strings)

    @staticmethod
    def concat(batches: list) -> RecordBatch:
        if not batches:
            raise ValueError("concat of no batches")
        first = batches[0]
        cols = {k: np.concatenate([b.columns[k] for b in batches]) for k in first.columns}
        offs = None if any(b.offsets is None for b in batches) else \
            np.concatenate([b.offsets for b in batches])
        return RecordBatch(first.link, cols, offs, strings=first.strings)
