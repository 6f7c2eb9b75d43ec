"""What the CSV and GDAT record readers share: a format's field layout, the source and its
read buffer, the counts of what was read, and the conversion of parsed columns to field types.

`layout_of` turns a protocol's fields into `FieldReader`s (where each is read, as what);
`RecordSource` opens a file, `-` (standard input) or a FIFO, owns its buffer and a stream's
wait for bytes, and assembles batches; `RecordStats` counts records, and malformed ones by
reason. The readers: `capture.records.RecordReader` (CSV), `capture.gdat.GdatReader` (GDAT).
"""

from __future__ import annotations

import logging
import select
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from capture.batch import RecordBatch
from capture.errors import CaptureError
from capture.schema import SCHEMA_ID, SYSTEM_TIME, Field, RecordFormat, record_accessor, record_column
from capture.source import STDIN, STREAM, classify, display_name, open_input
from capture.strings import StringTable

log = logging.getLogger(__name__)

#: malformed record examples kept per reason (line numbers and text, for the summary)
EXAMPLES_PER_REASON = 3
#: the access types of GS-lite's CSV and GDAT access functions
_KINDS = ("uint", "ushort", "ullong", "int", "llong", "float", "bool", "ip", "ipv6", "string")
#: which field types each access type may fill (the value is converted as C would)
_FILLS = {"uint": ("uint", "ullong", "int", "llong", "float", "bool"),
          "ushort": ("uint", "ullong", "int", "llong", "float", "bool"),
          "ullong": ("uint", "ullong", "int", "llong", "float"),
          "int": ("uint", "ullong", "int", "llong", "float"),
          "llong": ("uint", "ullong", "int", "llong", "float"),
          "float": ("float",), "bool": ("bool", "uint", "ullong", "int", "llong"),
          "ip": ("ipv4", "ip", "uint", "ullong"), "ipv6": ("ip",), "string": ("string",)}
_DTYPE = {"uint": np.uint64, "ullong": np.uint64, "ipv4": np.uint64, "mac": np.uint64,
          "int": np.int64, "llong": np.int64, "float": np.float64, "bool": np.uint8,
          "string": np.uint64}
_MAPPED = np.uint64(0x0000_FFFF_0000_0000)
_STREAM_CHUNK = 1 << 20
_WAIT_SLICE_S = 0.1
_WAIT_NOTICE_S = 1.0


class RecordError(CaptureError):
    """A record source cannot be read: an unsupported format or access function, a file
    that cannot be opened."""


# --- the layout of a format ------------------------------------------------------------------

def field_columns(f: Field) -> tuple[str, ...]:
    """The record-batch columns of a record field: its `columns` when the schema set them,
    else `record_column(name)` (two, `_hi` and `_lo`, for a 128-bit `ip`)."""
    if f.columns:
        return tuple(f.columns)
    base = record_column(f.name)
    return (base + "_hi", base + "_lo") if f.type == "ip" else (base,)


@dataclass(frozen=True)
class FieldReader:
    """How one field of a record is read: from position `position` (1-based) parsed as
    `kind`, or `source` = "time" (the read time) or "schema" (the schema id)."""

    field: Field
    columns: tuple[str, ...]
    source: str                 # "csv" | "gdat" | "time" | "schema"
    kind: str = ""              # a GS-lite access type (_KINDS)
    position: int = 0

    @property
    def reason(self) -> str:
        return f"bad {self.kind}"


def layout_of(fmt: RecordFormat) -> tuple[FieldReader, ...]:
    """The field readers of a record format (RecordError for what cannot be read)."""
    where = f"protocol {fmt.protocol}"
    record_kind = fmt.kind.lower()
    if record_kind not in ("csv", "gdat"):
        raise RecordError(f"{where}: unknown record format {fmt.kind!r} (csv or gdat)")
    out = []
    for f in fmt.fields:
        cols = field_columns(f)
        acc = f.accessor or ""
        if acc == SYSTEM_TIME:
            out.append(FieldReader(f, cols, "time"))
            continue
        if acc.lower() == SCHEMA_ID.lower():
            out.append(FieldReader(f, cols, "schema"))
            continue
        m = record_accessor(acc)
        if m is None or m.kind != record_kind:
            up = record_kind.upper()
            raise RecordError(f"{where}: field {f.name} is read by {acc or 'no access function'!r}"
                              f", which is not a {up} access function (get_{record_kind}_<type>"
                              f"_pos<N>, get_system_time, get_schemaId)")
        kind, pos = m.gs_type, m.position
        if kind not in _KINDS:
            raise RecordError(f"{where}: field {f.name}: unknown {record_kind.upper()} access "
                              f"type {kind!r} in {acc} (one of {', '.join(_KINDS)})")
        if f.type not in _FILLS[kind]:
            raise RecordError(f"{where}: field {f.name} is a {f.type} but {acc} reads a {kind}")
        if pos < 1:
            raise RecordError(f"{where}: field {f.name}: {acc}: positions start at 1")
        out.append(FieldReader(f, cols, record_kind, kind, pos))
    return tuple(out)


# --- statistics ---------------------------------------------------------------------------------

@dataclass
class RecordStats:
    """What a record reader has seen so far (the run summary reads it as it reads a
    capture reader's `ReaderStats`)."""

    records: int = 0           # good records handed on
    bytes: int = 0             # bytes of the lines read, good and bad
    lines: int = 0
    reasons: dict[str, int] = field(default_factory=dict)      # malformed records per reason
    examples: dict[str, list[tuple[int, str | None]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def malformed(self) -> int:
        return sum(self.reasons.values())

    @property
    def packets(self) -> int:          # the name generic progress code reads
        return self.records

    def note(self, reason: str, line: int, text: str | None) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        kept = self.examples.setdefault(reason, [])
        if len(kept) < EXAMPLES_PER_REASON:
            kept.append((line, text))

    def describe(self) -> str:
        """`1 wrong field count (line 7), 1 bad uint (line 12: 'x7')`."""
        parts = []
        for reason, count in self.reasons.items():
            shown = []
            for line, text in self.examples.get(reason, []):
                shown.append(f"line {line}" if text is None else f"line {line}: {text!r}")
            more = ", ..." if count > len(shown) else ""
            parts.append(f"{count} {reason} ({', '.join(shown)}{more})")
        return ", ".join(parts)



# --- the reader ---------------------------------------------------------------------------------

class RecordSource:
    """What the CSV and GDAT readers share: the source (a file, `-` or a FIFO) and its read
    buffer, a stream's wait for bytes, the batch skeleton (string tables, the clock).

    A subclass calls `_open_source` in its constructor and gives `_read_error` (where a read
    error happened, for the message) and `WHAT` (what the records are, for the wait notice).
    `_base` is the source's byte offset of `_buf[0]`."""

    WHAT = "records"
    stats: RecordStats

    def _open_source(self, path, fmt: RecordFormat, link: str | None, batch_size: int,
                     columns, strings: StringTable | None, stop, idle_batches: bool,
                     clock, chunk_size: int) -> None:
        self.path = display_name(path)
        self.link = link if link is not None else "stdin" if str(path) == STDIN else Path(path).stem
        self.format = fmt
        self.layout = layout_of(fmt)
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = int(batch_size)
        self.columns = None if columns is None else frozenset(columns)
        self.strings = strings if strings is not None else StringTable()
        self._stop = stop
        self.idle_batches = idle_batches
        self._clock = clock
        kind, why = classify(path)
        if kind is None:
            raise RecordError(f"{self.path}: {why.replace('capture file', 'record file')}")
        self.stream = kind == STREAM
        self._closing = False
        self._file = open_input(path, self.stream, "record file", RecordError)
        self._buf = np.empty(_STREAM_CHUNK if self.stream else max(64, int(chunk_size)),
                             np.uint8)
        self._fill = self._pos = self._base = 0
        self._eof = self._started = False
        if self.stream:
            self._poller = select.poll()
            self._poller.register(self._file.fileno(), select.POLLIN | select.POLLPRI)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True
        self._file.close()

    def _read_error(self) -> str:
        """Where the source is, for a read error's message."""
        return f"at byte {self._base + self._fill}"

    def _wait_readable(self) -> bool | None:
        """A stream: True when bytes (or the end) arrived, False when stopped, None after one
        quiet slice when `idle_batches` (the caller hands an empty batch on)."""
        started = time.monotonic()
        noticed = False
        while True:
            if self._closing or (self._stop is not None and self._stop()):
                return False
            if self._poller.poll(int(_WAIT_SLICE_S * 1000)):
                return True
            if not noticed and not self._started \
                    and time.monotonic() - started >= _WAIT_NOTICE_S:
                noticed = True
                what = "standard input" if self.path == display_name(STDIN) else "the FIFO"
                log.warning("%s: waiting for %s: nothing written to %s yet (Ctrl-C gives "
                            "up)", self.path, self.WHAT, what)
            if self.idle_batches and self._started:
                return None

    def _read_more(self) -> int | None:
        """Move the unread tail to the front and read; bytes read (None: a quiet stream). The
        buffer doubles when the tail fills it (a line, a header or a resync window longer)."""
        tail = self._fill - self._pos
        if self._pos:
            self._buf[:tail] = self._buf[self._pos:self._fill]
            self._base += self._pos
            self._pos, self._fill = 0, tail
        if self._fill == len(self._buf):
            self._buf = np.concatenate([self._buf, np.empty(len(self._buf), np.uint8)])
        if self.stream:
            ready = self._wait_readable()
            if ready is None:
                return None
            if not ready:
                self._eof = True
                return 0
        try:
            got = self._file.readinto(self._buf.data[self._fill:])
        except OSError as exc:
            raise RecordError(f"{self.path}: read error {self._read_error()}: {exc}") from None
        if not got:
            self._eof = True
            return 0
        self._fill += got
        self._started = True
        return got

    def _string_map(self) -> dict:
        return {r.columns[0]: self.strings for r in self.layout if r.field.type == "string"}

    def _empty(self) -> RecordBatch:
        cols = {c: np.zeros(0, _column_dtype(r, c)) for r in self.layout for c in r.columns}
        cols.update(timestamp=np.zeros(0, np.int64), len=np.zeros(0, np.uint32),
                    layers=np.zeros(0, np.uint16), reason=np.zeros(0, np.uint8))
        return RecordBatch(self.link, cols, np.zeros(0, np.int64), True,
                           strings=self._string_map())

    def _assembled(self, values: dict, number: np.ndarray, llen: np.ndarray,
                   read_ns: int) -> RecordBatch:
        """The batch of the good records' parsed `values` (their line or tuple `number`)."""
        m = len(number)
        ts = self._timestamps(values, m, read_ns)
        cols = {"timestamp": ts, "len": llen.astype(np.uint32),
                "layers": np.zeros(m, np.uint16), "reason": np.zeros(m, np.uint8)}
        for r in self.layout:
            for c in r.columns:
                cols[c] = _as_type(values[c], r, c)
        self.stats.records += m
        in_order = bool(m < 2 or (ts[1:] >= ts[:-1]).all())
        return RecordBatch(self.link, cols, number, in_order, strings=self._string_map())

    def _timestamps(self, values: dict, m: int, read_ns: int) -> np.ndarray:
        fmt = self.format
        if fmt.system_clock:
            return np.full(m, read_ns, np.int64)
        clock = next(r for r in self.layout if r.field.name == fmt.clock)
        with np.errstate(over="ignore"):
            return values[clock.columns[0]].astype(np.int64) * np.int64(fmt.clock_unit_ns)



def _column_dtype(r: FieldReader, column: str) -> np.dtype:
    if r.field.type == "ip" or r.field.type == "ipv4":
        return np.dtype(np.uint64)
    return np.dtype(_DTYPE.get(r.field.type, np.uint64))


def _as_type(values: np.ndarray, r: FieldReader, column: str) -> np.ndarray:
    """A parsed column in its field type's dtype (C conversions: a uint read into an int
    field wraps, a float into an integer truncates)."""
    t = r.field.type
    if t == "ip":
        return values.astype(np.uint64, copy=False)
    if t == "ipv4":
        if r.kind == "ip":
            return values
        return _MAPPED | (values.astype(np.uint64) & np.uint64(0xFFFF_FFFF))
    if t == "bool":
        return (values != 0).astype(np.uint8)
    dtype = _DTYPE.get(t, np.uint64)
    with np.errstate(all="ignore"):
        if r.kind == "ip":                   # an IPv4 address read into an integer field
            values = values & np.uint64(0xFFFF_FFFF)
        if values.dtype == np.float64 and dtype != np.float64:
            values = np.nan_to_num(np.trunc(values)).astype(np.int64)
        return values.astype(dtype, copy=False)

