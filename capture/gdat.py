"""GDAT record sources: GS-lite's binary tuple files read into `capture.batch.RecordBatch`es,
with the same columns as the CSV reader (`capture.records`) gives a protocol's fields.

The format, as GS-lite writes and reads it (o-ran-sc/com-gs-lite: its rts_gdat.c reads GDAT
interfaces; gsgdatprint.c, gsexit.c and ascii2gdat.c write GDAT; gdat2ascii.c prints it;
schemaparser.cc, schemaparser_impl.h and type_objects.cc lay a tuple out; schema_prototypes.h
holds the `get_gdat_*` access functions; the Tigon SQL contributor manual, section 6):

- **Header**: three lines, each ended by `\\n`: `GDAT`, `VERSION:<n>`, `SCHEMALENGTH:<len>`
  (written with the format `"GDAT\\nVERSION:%u\\nSCHEMALENGTH:%u\\n"`), then exactly `len`
  bytes of schema text, then the first tuple. GS-lite's writers count the text's
  terminating NUL in `len`; the text ends at its first NUL. Versions 1 to 4 are read (GS-lite's
  schema parser accepts those; it writes 4).
- **Schema text**: a GSQL STREAM parse tree, `FTA{ STREAM <name> { <fields> } DEFINE{...}
  <query text> }`, each field `TYPE name [access_function] [(properties)];` in tuple order.
  Only the STREAM block is read here (the query text is GS-lite's business).
- **Tuples**: each one is a 4-byte length in network byte order (big-endian: `htonl` /
  `ntohl`), then that many bytes: the fixed part, every field of the schema in order, packed
  without padding; one byte of tuple type at the end of the fixed part (0 data, 1 trace or
  "temporal" tuple, 2 end of file); then the string payloads.
- **Field encodings** (host byte order of the writer, no `ntoh` on reading: GS-lite's unpack
  functions have theirs commented out; x86-64, so little-endian is assumed here):
  UINT, USHORT, BOOL (0 false, else true), IP: 4 bytes unsigned; INT: 4 bytes signed;
  ULLONG, LLONG: 8 bytes; FLOAT: an 8-byte double; IP is the address as a number
  (`a<<24 | b<<16 | c<<8 | d`); IPV6: 16 bytes, the address in network order; V_STR (also
  spelled STRING): 12 bytes, uint32 length, uint32 offset, uint32 reserved, the offset counted
  from the start of the tuple (after its length), the bytes within the tuple; TIMEVAL: 16 bytes
  (`struct timeval` of a 64-bit build), FSTRINGn: n bytes (laid out, not read by any access
  function).
- **`get_gdat_<type>_pos<N>`** reads field N (from 1) of the *file's* schema, and only when that
  field has exactly the function's type (uint: UINT, ullong: ULLONG, ip: IP, ipv6: IPV6,
  string: V_STR, bool: BOOL, int: INT, llong: LLONG, float: FLOAT). A protocol field read by a
  function the file's schema cannot satisfy (no field N, another type) is an error naming the
  file and both fields: GS-lite's function would fail on every tuple.
- `get_system_time` is the wall clock when the tuple is read, in seconds; `get_schemaId` is 0:
  GS-lite's GDAT reader keeps the file's schema handle in the record, not in the packet field
  that `get_schemaId` returns.

Reading is what GS-lite's tools make of a file, made robust, and never fatal past the header:

- a tuple too short for a field the protocol reads is malformed ("short tuple"), and so is a
  string whose offset plus length passes the tuple's end ("bad string"); GS-lite's access
  function fails on such a tuple. Counted by reason, with the tuple's number and byte offset.
- a tuple length above `max_tuple_size` (GS-lite's MAXTUPLESZ, 10240, the largest tuple its
  runtime holds) is corrupt framing ("bad tuple length"): the reader scans forward for the next
  offset where `RESYNC_CHAIN` consecutive tuples look right (a length between the fixed part
  plus one and the maximum, a type byte of 0, 1 or 2, every string inside its tuple), as
  `capture.resync` does for pcap, and goes on from there; the bytes skipped are reported.
  GS-lite's own reader stops reading the file at such a length.
- the file ending inside a tuple is one "truncated tuple".
- trace and end-of-file tuples (type byte 1 or 2) and empty tuples (length 0, which
  gdat2ascii skips) are not records: they are skipped and counted apart (`GdatStats.skipped`),
  not as malformed. GS-lite's reader hands every tuple on; its gsgdatprint writes data tuples
  only. A tuple no longer than its fixed part has no type byte and is data.

The header of a regular file is read when the reader is made, so a file that is not GDAT is
one error naming the file and the byte offset; a stream's (`-`, a FIFO) when its bytes arrive.
Sources, batches, streams and `idle_batches` are as in `capture.records`; a batch's `offsets`
are the tuples' numbers in the file (from 1), its `len` the bytes of each tuple with its
length. Numba kernels frame the tuples and read each field over every tuple of a batch; a
string field is gathered once into an Arrow binary array and interned as CSV strings are.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from capture.batch import RecordBatch
from capture.csvkernels import gather_fields
from capture.errors import CaptureFormatError
from capture.gdatkernels import (
    EV_BAD_LENGTH,
    EV_TRUNCATED,
    RS_FOUND,
    RS_NONE,
    _be32,
    _le32,
    find_resync,
    frame_tuples,
    read_fixed,
    string_spans,
    tuple_kinds,
)
from capture.recordsource import (
    EXAMPLES_PER_REASON,
    FieldReader,
    RecordError,
    RecordSource,
    RecordStats,
)
from capture.schema import RecordFormat
from capture.strings import StringTable
from common.units import NS_PER_S

# (`RecordSource`, the source and its buffer, and `_as_type`, the C conversions of parsed
# columns, are the CSV reader's too, `capture.recordsource`: a GDAT column is made as a CSV one)
log = logging.getLogger(__name__)

#: schema-parser versions GS-lite reads (its `schemaparser_accepts_version`)
VERSIONS = (1, 2, 3, 4)
#: GS-lite's MAXTUPLESZ (gsconfig.h): the default bound above which a tuple length is corrupt
MAX_TUPLE_SIZE = 10240
#: consecutive plausible tuples that make a resynchronisation point after a corrupt length
RESYNC_CHAIN = 3
#: the longest header line and schema text taken as plausible
MAX_HEADER_LINE = 64
MAX_SCHEMA = 16 << 20

SHORT_TUPLE = "short tuple"
BAD_STRING = "bad string"
BAD_LENGTH = "bad tuple length"
TRUNCATED = "truncated tuple"
#: tuples that are not records, by the name `GdatStats.skipped` counts them under
NOT_DATA = {1: "trace", 2: "end of file"}
EMPTY = "empty"

_FILE_CHUNK = 8 << 20

# GS-lite type names (type_objects.cc, any case here) -> (our name, bytes in a tuple)
_TYPES = {"bool": ("BOOL", 4), "ushort": ("USHORT", 4), "uint": ("UINT", 4),
          "int": ("INT", 4), "ullong": ("ULLONG", 8), "llong": ("LLONG", 8),
          "float": ("FLOAT", 8), "string": ("V_STR", 12), "v_str": ("V_STR", 12),
          "timeval": ("TIMEVAL", 16), "ip": ("IP", 4), "ipv6": ("IPV6", 16)}
#: the file field type each `get_gdat_<type>` access function requires
_READS = {"uint": "UINT", "ushort": "USHORT", "ullong": "ULLONG", "ip": "IP", "ipv6": "IPV6", "string": "V_STR",
          "bool": "BOOL", "int": "INT", "llong": "LLONG", "float": "FLOAT"}
_MAPPED = np.uint64(0x0000_FFFF_0000_0000)
_STREAM_BLOCK = re.compile(r"\bSTREAM\s+([A-Za-z_][\w/]*)\s*(?:\([^)]*\))?\s*\{([^}]*)\}",
                           re.IGNORECASE)
_COMMENT = re.compile(r"(--|//)[^\n]*")



class GdatFormatError(RecordError, CaptureFormatError):
    """A file is not GDAT, or its header cannot be read: names the file and the byte."""


# --- the header ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileField:
    """One field of a GDAT file's schema: its name, GS-lite type, offset and size in a tuple."""

    name: str
    type: str
    offset: int
    size: int


@dataclass(frozen=True)
class GdatSchema:
    """The STREAM a GDAT file's header declares, laid out as GS-lite lays out its tuples."""

    stream: str
    version: int
    fields: tuple[FileField, ...]
    header_bytes: int           # the header's length: the first tuple starts there

    @property
    def fixed_size(self) -> int:
        """The fixed part's length: the tuple type byte sits there (GS-lite's min_tuple_size)."""
        return sum(f.size for f in self.fields)


def _field_type(spelling: str) -> tuple[str, int] | None:
    t = _TYPES.get(spelling.lower())
    if t is not None:
        return t
    m = re.fullmatch(r"fstring(\d+)", spelling, re.IGNORECASE)
    return (f"FSTRING{int(m.group(1))}", int(m.group(1))) if m and int(m.group(1)) else None


def parse_schema_text(text: str, path: str, offset: int, version: int,
                      header_bytes: int) -> GdatSchema:
    """The STREAM of a header's schema text (`offset`: where the text starts, for errors)."""
    m = _STREAM_BLOCK.search(_COMMENT.sub("", text))
    if m is None:
        raise GdatFormatError(path, offset, "the header's schema holds no STREAM <name> "
                              "{ fields } block", text[:60])
    fields: list[FileField] = []
    at = 0
    for i, decl in enumerate(d for d in m.group(2).split(";") if d.strip()):
        words = re.sub(r"\([^)]*\)|\[[^\]]*\]", " ", decl).split()
        t = _field_type(words[0]) if 2 <= len(words) <= 3 else None
        if t is None:
            raise GdatFormatError(path, offset, f"field {i + 1} of the header's STREAM "
                                  f"{m.group(1)} is not `TYPE name [access_function];` with a "
                                  f"type GS-lite knows", decl.strip())
        fields.append(FileField(words[1], t[0], at, t[1]))
        at += t[1]
    if not fields:
        raise GdatFormatError(path, offset, f"the header's STREAM {m.group(1)} has no fields")
    return GdatSchema(m.group(1), version, tuple(fields), header_bytes)


def _header_line(data: bytes, pos: int, label: bytes, path: str) -> tuple[bytes, int] | None:
    """The value after `label` on the header line at `pos` and the next line's start; None
    when the line is not whole yet; GdatFormatError when it cannot be that line."""
    nl = data.find(b"\n", pos, pos + MAX_HEADER_LINE)
    line = data[pos:nl] if nl >= 0 else data[pos:pos + MAX_HEADER_LINE]
    if not line.startswith(label[:len(line)]) or \
            (nl >= 0 and not line.startswith(label)):
        what = "the line 'GDAT'" if label == b"GDAT" else f"a line {label.decode()}<number>"
        problem = ("not a GDAT file: it does not start with the line 'GDAT'" if pos == 0
                   else f"not a GDAT header: expected {what}")
        raise GdatFormatError(path, pos, problem, data[pos:pos + 16])
    if nl < 0:
        if len(line) >= MAX_HEADER_LINE:
            raise GdatFormatError(path, pos, "not a GDAT header: line too long", line[:16])
        return None
    return line[len(label):].rstrip(b"\r"), nl + 1


def parse_header(data: bytes, path: str) -> GdatSchema | None:
    """The schema of a GDAT file whose first bytes are `data`; None when the header is not
    whole in them yet; GdatFormatError when they are not a GDAT header."""
    got = _header_line(data, 0, b"GDAT", path)
    if got is None:
        return None
    if got[0]:
        raise GdatFormatError(path, 0, "not a GDAT file: it does not start with the line "
                              "'GDAT'", data[:16])
    numbers = []
    pos = got[1]
    for label in (b"VERSION:", b"SCHEMALENGTH:"):
        got = _header_line(data, pos, label, path)
        if got is None:
            return None
        if not got[0].isdigit():
            raise GdatFormatError(path, pos, f"not a GDAT header: {label.decode()} is not "
                                  f"followed by a number", got[0][:16])
        numbers.append((int(got[0]), pos))
        pos = got[1]
    (version, vat), (length, lat) = numbers
    if version not in VERSIONS:
        raise GdatFormatError(path, vat, f"GDAT version {version} is not one GS-lite reads "
                              f"({VERSIONS[0]} to {VERSIONS[-1]})")
    if not 0 < length <= MAX_SCHEMA:
        raise GdatFormatError(path, lat, f"implausible GDAT schema length {length}")
    if len(data) < pos + length:
        return None
    text = data[pos:pos + length].split(b"\0", 1)[0].decode("utf-8", "replace")
    return parse_schema_text(text, path, pos, version, pos + length)


# --- statistics ----------------------------------------------------------------------------------

@dataclass
class GdatStats(RecordStats):
    """A GDAT reader's `RecordStats`: `lines` counts tuples, examples are tuple numbers with
    their byte offsets, `skipped` the tuples that are not records (trace, end of file, empty)."""

    skipped: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """`1 truncated tuple (record 9 at byte 512: 20 of 60 bytes)`."""
        parts = []
        for reason, count in self.reasons.items():
            shown = [f"record {n} {text}" for n, text in self.examples.get(reason, [])]
            more = ", ..." if count > len(shown) else ""
            parts.append(f"{count} {reason} ({', '.join(shown)}{more})")
        return ", ".join(parts)


# --- the reader ----------------------------------------------------------------------------------

class GdatReader(RecordSource):
    """Iterate over a GDAT record source as `RecordBatch`es of up to `batch_size` records.

    The options are those of `capture.records.RecordReader` (`separator` is ignored: GDAT has
    none); `max_tuple_size` is the length above which a tuple's length is corrupt framing."""

    def __init__(self, path: str | os.PathLike, fmt: RecordFormat, link: str | None = None,
                 batch_size: int = 65536, *, columns=None, strings: StringTable | None = None,
                 stop: Callable[[], bool] | None = None, idle_batches: bool = False,
                 chunk_size: int = _FILE_CHUNK, clock: Callable[[], int] = time.time_ns,
                 separator: str | None = None, max_tuple_size: int = MAX_TUPLE_SIZE):
        self._open_source(path, fmt, link, batch_size, columns, strings, stop, idle_batches,
                          clock, chunk_size)
        if separator:
            log.warning("%s: a separator does not apply to GDAT records (ignored)", self.path)
        self.max_tuple_size = int(max_tuple_size)
        self.stats = GdatStats()
        self._stopped = False
        self._tuples = 0
        self._lost: tuple[int, int, int] | None = None   # (byte, length, tuple) of a bad length
        self.schema: GdatSchema | None = None
        self._fields: list[tuple[FieldReader, FileField]] = []
        self._vstr = np.zeros(0, np.int64)          # offsets of the file's V_STR fields
        if not self.stream:
            try:
                self._read_header_now()
            except BaseException:
                self._file.close()
                raise
        cap = self.batch_size
        self._starts = np.zeros(cap, np.int64)
        self._lens = np.zeros(cap, np.int64)

    WHAT = "GDAT records"
    stats: GdatStats

    def _wait_readable(self) -> bool | None:
        ready = super()._wait_readable()
        if ready is False:
            self._stopped = True
        return ready

    # --- the header -------------------------------------------------------------------------
    def _try_header(self) -> bool:
        """Parse the header when its bytes are in; False when more are needed. At the end of
        the input, a missing or cut header is a GdatFormatError."""
        data = bytes(self._buf[:self._fill])
        schema = parse_header(data, self.path)
        if schema is None:
            if not self._eof:
                return False
            if not data:
                raise GdatFormatError(self.path, 0, "not a GDAT file: it is empty")
            raise GdatFormatError(self.path, len(data), "not a GDAT file: it ends inside "
                                  "its header")
        self._bind(schema)
        self._pos = schema.header_bytes
        self.stats.bytes += schema.header_bytes
        return True

    def _read_header_now(self) -> None:
        while not self._try_header():
            self._read_more()

    def _bind(self, schema: GdatSchema) -> None:
        """Pair each field the protocol reads from the tuples with the file's field it names
        (RecordError when the file cannot give it)."""
        fields = []
        for r in self.layout:
            if r.source != "gdat":
                continue
            where = (f"{self.path}: field {r.field.name} of protocol {self.format.protocol} is "
                     f"read by {r.field.accessor}, but")
            if r.position > len(schema.fields):
                raise RecordError(f"{where} the file's schema (STREAM {schema.stream}) has "
                                  f"{len(schema.fields)} fields")
            ff = schema.fields[r.position - 1]
            if ff.type != _READS[r.kind]:
                raise RecordError(f"{where} field {r.position} of the file's schema (STREAM "
                                  f"{schema.stream}) is {ff.name}, a {ff.type} (that function "
                                  f"reads a {_READS[r.kind]})")
            fields.append((r, ff))
        self.schema, self._fields = schema, fields
        self._vstr = np.array([f.offset for f in schema.fields if f.type == "V_STR"], np.int64)
        log.debug("%s: GDAT version %d, STREAM %s, %d fields, fixed part %d bytes", self.path,
                  schema.version, schema.stream, len(schema.fields), schema.fixed_size)

    # --- batches -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[RecordBatch]:
        while self.schema is None:
            try:
                if self._try_header():
                    break
            except GdatFormatError:
                if self._stopped and self._fill == 0:
                    return                  # stopped before the writer wrote anything
                raise
            if self._read_more() is None:
                yield self._empty()
        assert self.schema is not None
        fixed = self.schema.fixed_size
        while True:
            if self._lost is not None:
                if not self._resync(fixed) and self._read_more() is None:
                    yield self._empty()
                continue
            rows, pos, event = frame_tuples(self._buf, self._pos, self._fill, self._eof,
                                            self.max_tuple_size, self._starts, self._lens,
                                            self.batch_size)
            if rows:
                batch = self._batch(rows, pos - self._pos)
                self._pos = pos
                yield batch
                continue
            if event == EV_BAD_LENGTH:
                self._tuples += 1
                self.stats.lines = self._tuples
                self._lost = (self._base + pos, int(_be32(self._buf, pos)), self._tuples)
                self._pos = pos + 1
                continue
            if event == EV_TRUNCATED:
                self._truncated()
                continue
            if self._eof:
                self._finish()
                return
            if self._read_more() is None:
                yield self._empty()

    def _resync(self, fixed: int) -> bool:
        """Look for the next readable tuple after a corrupt length; True when the framing is
        back (or the input is over), False when more bytes are needed."""
        status, p = find_resync(self._buf, self._pos, self._fill, self._eof, fixed,
                                self.max_tuple_size, self._vstr, RESYNC_CHAIN)
        self._pos = p                       # the bytes before p are skipped either way
        if status == RS_FOUND or (status == RS_NONE and self._eof):
            assert self._lost is not None
            at, length, number = self._lost
            skipped = self._base + p - at
            self.stats.bytes += skipped
            self.stats.note(BAD_LENGTH, number, f"at byte {at}: length {length}, {skipped} "
                                                f"bytes skipped")
            log.debug("%s: corrupt tuple length %d at byte %d, %d bytes skipped", self.path,
                      length, at, skipped)
            self._lost = None
            return True
        return False

    def _truncated(self) -> None:
        at = self._base + self._pos
        left = self._fill - self._pos
        whole = f"{4 + int(_be32(self._buf, self._pos))}" if left >= 4 else "at least 4"
        self._tuples += 1
        self.stats.lines = self._tuples
        self.stats.note(TRUNCATED, self._tuples, f"at byte {at}: {left} of {whole} bytes")
        self.stats.bytes += left
        self._pos = self._fill

    def _finish(self) -> None:
        if self.stats.skipped:
            log.info("%s: %s tuples skipped (not records)", self.path, ", ".join(
                f"{n} {what}" for what, n in self.stats.skipped.items()))

    def _batch(self, n: int, nbytes: int) -> RecordBatch:
        assert self.schema is not None
        read_ns = int(self._clock())
        starts, lens = self._starts[:n], self._lens[:n]
        status = np.zeros(n, np.int32)
        tuple_kinds(self._buf, starts, lens, n, self.schema.fixed_size, status)
        values: dict[str, np.ndarray] = {}
        strings = []
        for i, (r, ff) in enumerate(self._fields):
            short, bad = 2 * i + 1, 2 * i + 2
            if r.kind == "string":
                if self.columns is not None and r.columns[0] not in self.columns:
                    values[r.columns[0]] = np.zeros(n, np.uint64)   # not read: never bad
                    continue
                spans = np.zeros((n, 1), np.int64), np.zeros((n, 1), np.int64)
                string_spans(self._buf, starts, lens, n, ff.offset, *spans, status, short,
                             bad)
                strings.append((r, spans))
            else:
                values.update(self._read(r, ff, starts, lens, n, status, short))
        for r, (s, e) in strings:       # gathered once every row's fate is known
            offsets = np.zeros(n + 1, np.int32)
            data = np.empty(max(1, int((e - s)[status == 0].sum())), np.uint8)
            gather_fields(self._buf, s, e, n, 0, status, offsets, data)
            text = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                          pa.py_buffer(data)])
            values[r.columns[0]] = self.strings.intern_array(text)
        for r in self.layout:
            if r.source == "time":
                values[r.columns[0]] = np.full(n, read_ns // NS_PER_S, np.int64)
            elif r.source == "schema":
                values[r.columns[0]] = np.zeros(n, np.int64)
        number = np.arange(self._tuples + 1, self._tuples + 1 + n, dtype=np.int64)
        self._tuples += n
        self.stats.bytes += nbytes
        self.stats.lines = self._tuples
        good = status == 0
        llen = lens + 4
        if not good.all():
            self._note_bad(status, number, starts, lens)
            keep = np.flatnonzero(good)
            values = {k: v[keep] for k, v in values.items()}
            number, llen = number[keep], llen[keep]
        return self._assembled(values, number, llen, read_ns)

    def _read(self, r: FieldReader, ff: FileField, starts, lens, n: int, status: np.ndarray,
              code: int) -> dict[str, np.ndarray]:
        """The raw columns of one fixed-width field (in the dtypes `_as_type` takes, as the
        CSV reader's parsers give them)."""
        buf = self._buf
        if r.kind == "ipv6":
            hi, lo = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
            read_fixed(buf, starts, lens, n, ff.offset, 8, True, hi, status, code)
            read_fixed(buf, starts, lens, n, ff.offset + 8, 8, True, lo, status, code)
            return {r.columns[0]: hi, r.columns[1]: lo}
        raw = np.zeros(n, np.uint64)
        read_fixed(buf, starts, lens, n, ff.offset, ff.size, False, raw, status, code)
        if r.kind == "ip":
            v4 = _MAPPED | raw
            if r.field.type == "ip":
                return {r.columns[0]: np.zeros(n, np.uint64), r.columns[1]: v4}
            return {r.columns[0]: v4}
        if r.kind == "float":
            return {r.columns[0]: raw.view(np.float64)}
        if r.kind == "int":
            return {r.columns[0]: raw.astype(np.uint32).view(np.int32).astype(np.int64)}
        if r.kind == "llong":
            return {r.columns[0]: raw.view(np.int64)}
        return {r.columns[0]: raw}          # uint, ullong, bool (raw: nonzero is true)

    def _note_bad(self, status: np.ndarray, number: np.ndarray, starts: np.ndarray,
                  lens: np.ndarray) -> None:
        """Count the rows that are not good records: tuples that are not data apart, the
        malformed ones by reason with their number and byte (Python per such row only)."""
        control = status < 0
        if control.any():
            for code, count in zip(*np.unique(status[control], return_counts=True)):
                what = NOT_DATA.get(-int(code), EMPTY)
                self.stats.skipped[what] = self.stats.skipped.get(what, 0) + int(count)
        for i in np.flatnonzero(status > 0).tolist():
            s = int(status[i])
            r, ff = self._fields[(s - 1) // 2]
            reason = SHORT_TUPLE if s % 2 else BAD_STRING
            text = None
            if len(self.stats.examples.get(reason, [])) < EXAMPLES_PER_REASON:
                at = self._base + int(starts[i]) - 4
                length = int(lens[i])
                if reason == SHORT_TUPLE:
                    text = (f"at byte {at}: {length} bytes, {r.field.name} needs "
                            f"{ff.offset + ff.size}")
                else:
                    p = int(starts[i]) + ff.offset
                    text = (f"at byte {at}: {r.field.name} at offset "
                            f"{int(_le32(self._buf, p + 4))} + length "
                            f"{int(_le32(self._buf, p))} > {length} bytes")
            self.stats.note(reason, int(number[i]), text)
        log.debug("%s: %d malformed records skipped so far", self.path, self.stats.malformed)
