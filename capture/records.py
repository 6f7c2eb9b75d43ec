"""Record sources: a link that carries records of a schema-file protocol (GS-lite's CSV
interfaces) instead of packets, read into `capture.batch.RecordBatch`es.

A CSV record is one line of delimited text; a field's GS-lite access function names its type
and its position (`get_csv_uint_pos3`: the third field as a uint); `get_system_time` is the
unix time when the record is read, `get_schemaId` the record's schema id (0, as in GS-lite,
whose CSV and GDAT readers leave it unset). Values are parsed as
GS-lite's `sscanf`/`strto*` formats read them, strictly: uint `%u` and int `%d` (32-bit), ullong
`%llu`, llong `%lld` (64-bit), float `%lf`, IPv4 `%u.%u.%u.%u`, IPv6 `%x:%x:...` (eight groups,
or fewer with one `::`), bool: the four letters TRUE in any case is true (GS-lite's
`get_csv_bool` compares with `strncasecmp`; its manual says upper case), anything else false;
string: the bytes between the separators, as they are. Spaces around a number are allowed (as
`strtoul` skips them); a value that is not entirely a number of the field's type, or out of its
range, makes the record malformed. So does a line with fewer fields than the protocol's last
position (more are ignored, as GS-lite does). A malformed record is counted by reason, its line
number kept (the first few per reason) and skipped: it never stops the link. Blank lines are
skipped silently.

Parsing is columnar (`capture.csvkernels`): a Numba kernel splits a buffer of lines into field offsets (one row per
record), per-type kernels parse each field column; float fields go through Arrow's cast and
string fields through Arrow's dictionary encoding into the link's `capture.strings.StringTable`.
No Python object is made per record or per field, only per malformed line (its text, for
the summary) and per distinct string.

Sources: a file, `-` (standard input) or a FIFO; the last two are streams: read as the bytes
arrive, a batch handed on as soon as the bytes read hold whole lines (at most `batch_size`
records), and, when `idle_batches` is set, an empty batch after every quiet wait (so a run can
punctuate a wall-clock link during a lull). The separator is `separator`, or detected from the
first line among `,` `|` tab `;` (a space when only spaces give the fields). When every record
of a source is malformed, its stats get a problem naming the separator that would have read
the first line (`capture.separators`). GDAT (binary) records are read by `capture.gdat.GdatReader`:
`open_records` and `read_all_records` choose the reader by the protocol's record format.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from capture.batch import RecordBatch
from capture.csvkernels import (
    gather_fields,
    parse_bools,
    parse_integers,
    parse_ipv4s,
    parse_ipv6s,
    split_lines,
)
from capture.gdat import GdatReader
from capture.recordsource import (
    EXAMPLES_PER_REASON,
    FieldReader,
    RecordError,
    RecordSource,
    RecordStats,
)
from capture.schema import RecordFormat
from capture.separators import separator_hint
from capture.strings import StringTable
from common.units import NS_PER_S

log = logging.getLogger(__name__)

#: separators tried, in this order of preference, when none is given
SEPARATORS = (",", "|", "\t", ";")
#: names the command line accepts for separators that are awkward to type
SEPARATOR_NAMES = {"comma": ",", "pipe": "|", "tab": "\t", "\\t": "\t", "semicolon": ";",
                   "space": " "}
WRONG_FIELD_COUNT = "wrong field count"
#: bytes of the first record kept for the separator hint
FIRST_LINE = 4096

#: GS-lite access types -> the parse kind, the value range of integers
_INT_RANGE = {"ushort": (0, 2**16 - 1), "uint": (0, 2**32 - 1), "ullong": (0, 2**64 - 1), "int": (-2**31, 2**31 - 1),
              "llong": (-2**63, 2**63 - 1)}
_FILE_CHUNK = 8 << 20
#: what `strtod` (`%lf`) reads, for the rows Arrow's own cast refuses
_FLOAT_TEXT = r"(?i)^\s*[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)\s*$"


def resolve_separator(text: str | None) -> str | None:
    """A separator option's value as one character (names such as `tab` allowed), or None
    (detect); ValueError for anything else."""
    if text is None or text == "":
        return None
    sep = SEPARATOR_NAMES.get(text.lower(), text)
    if len(sep) != 1 or sep in "\r\n" or ord(sep) > 127:
        raise ValueError(f"{text!r} is not one ASCII character (or tab, comma, pipe, "
                         f"semicolon, space)")
    return sep


def detect_separator(line: bytes, fields_needed: int) -> str:
    """The separator of a line: of `,` `|` tab `;`, the most frequent one among those giving
    at least `fields_needed` fields; else a space when spaces give them; else the most
    frequent (`,` when none occurs)."""
    counts = [(line.count(s.encode()), -i, s) for i, s in enumerate(SEPARATORS)]
    enough = [c for c in counts if c[0] + 1 >= fields_needed and c[0] > 0]
    if not enough and fields_needed > 1 and line.count(b" ") + 1 >= fields_needed:
        return " "          # space-separated text: none of the others gives the fields
    pool = enough or [c for c in counts if c[0] > 0]
    return max(pool)[2] if pool else ","



class RecordReader(RecordSource):
    """Iterate over a CSV record source as `RecordBatch`es of up to `batch_size` records.

    `columns`: the record-batch columns the consumer reads (None: all); string fields outside
    it are checked but not interned (their column holds zeros). `strings`: the link's intern
    table (a new one by default). `stop`: a stream's wait for bytes ends, as its end, once it
    returns True. Batches own their arrays (nothing is reused)."""

    def __init__(self, path: str | os.PathLike, fmt: RecordFormat, link: str | None = None,
                 batch_size: int = 65536, *, separator: str | None = None,
                 columns=None, strings: StringTable | None = None,
                 stop: Callable[[], bool] | None = None, idle_batches: bool = False,
                 chunk_size: int = _FILE_CHUNK, clock: Callable[[], int] = time.time_ns):
        if fmt.kind.lower() == "gdat":
            raise RecordError(f"protocol {fmt.protocol}: GDAT records are read by "
                              f"capture.gdat.GdatReader, not the CSV reader (open_records and "
                              f"read_all_records choose the reader)")
        self.separator = resolve_separator(separator)
        self._open_source(path, fmt, link, batch_size, columns, strings, stop, idle_batches,
                          clock, chunk_size)
        self.stats = RecordStats()
        self._positions = sorted({r.position for r in self.layout if r.source == "csv"})
        self._need = max(self._positions, default=0)
        self._line = 0
        #: the first record's line (at most FIRST_LINE bytes), for the separator hint
        self._first_line: bytes | None = None
        # per-batch field offsets, reused (the batches' own columns are fresh arrays)
        cap = self.batch_size
        width = max(1, self._need)
        self._fstart = np.zeros((cap, width), np.int64)
        self._fend = np.zeros((cap, width), np.int64)
        self._nfields = np.zeros(cap, np.int64)
        self._llen = np.zeros(cap, np.int64)
        self._lineno = np.zeros(cap, np.int64)

    def _read_error(self) -> str:
        return f"after line {self._line}"

    # --- batches -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[RecordBatch]:
        while True:
            if self.separator is None and not self._detect():
                return
            assert self.separator is not None       # given, or detected just now
            rows, pos, line = split_lines(
                self._buf, self._pos, self._fill, self._eof, ord(self.separator),
                self._need, self._fstart, self._fend, self._nfields, self._llen,
                self._lineno, self._line, self.batch_size)
            self._line = line
            consumed = pos - self._pos
            self._pos = pos
            if rows:
                yield self._batch(rows, consumed)
                continue
            if consumed:                    # blank lines only
                continue
            if self._eof:
                self._check_all_malformed()
                return
            if self._read_more() is None:
                yield self._empty()

    def _detect(self) -> bool:
        """Detect the separator from the first non-blank line (reading until it is whole);
        False when the input ends before any line."""
        while True:
            data = bytes(self._buf[self._pos:self._fill])
            for raw in data.split(b"\n")[:-1] if not self._eof else data.split(b"\n"):
                if raw.strip(b"\r"):
                    self.separator = detect_separator(raw.rstrip(b"\r"), self._need)
                    log.debug("%s: separator %r detected", self.path, self.separator)
                    return True
            if self._eof:
                return False
            self._read_more()

    def _check_all_malformed(self) -> None:
        """At the end of the input: when every record was malformed, a problem naming the
        count and the separator that would have read the first line (the run then fails
        rather than print empty results)."""
        stats = self.stats
        if stats.records or not stats.malformed or self._first_line is None:
            return
        hint = separator_hint(self._first_line, self.layout, self.separator)
        stats.problems.append(f"all {stats.malformed} records were malformed (read with "
                              f"the separator {self.separator!r}): {hint}")

    def _batch(self, n: int, nbytes: int) -> RecordBatch:
        read_ns = int(self._clock())
        if self._first_line is None and n and self._need:
            start = int(self._fstart[0, 0])
            self._first_line = bytes(self._buf[start:start + min(int(self._llen[0]),
                                                                  FIRST_LINE)])
        status = np.zeros(n, np.int32)
        status[self._nfields[:n] < self._need] = -1
        values: dict[str, np.ndarray] = {}
        for code, r in enumerate(self.layout, start=1):
            values.update(self._parse(r, n, status, code, read_ns))
        good = status == 0
        self.stats.bytes += nbytes
        self.stats.lines = self._line
        lineno = self._lineno[:n].copy()
        if not good.all():
            self._note_bad(status, lineno, n)
            keep = np.flatnonzero(good)
            values = {k: v[keep] for k, v in values.items()}
            lineno = lineno[keep]
            llen = self._llen[:n][keep]
        else:
            llen = self._llen[:n]
        return self._assembled(values, lineno, llen, read_ns)

    def _parse(self, r: FieldReader, n: int, status: np.ndarray, code: int,
               read_ns: int) -> dict[str, np.ndarray]:
        """The raw columns of one field over the n rows (bad values mark `status`)."""
        buf, fs, fe = self._buf, self._fstart, self._fend
        col = r.position - 1
        if r.source == "time":
            return {r.columns[0]: np.full(n, read_ns // NS_PER_S, np.int64)}
        if r.source == "schema":
            return {r.columns[0]: np.zeros(n, np.int64)}
        if r.kind in _INT_RANGE:
            lo, hi = _INT_RANGE[r.kind]
            out = np.zeros(n, np.int64)
            parse_integers(buf, fs, fe, n, col, np.uint64(-lo), np.uint64(hi), lo < 0, out,
                           status, code)
            return {r.columns[0]: out if lo < 0 else out.view(np.uint64)}
        if r.kind == "bool":
            out8 = np.zeros(n, np.uint8)
            parse_bools(buf, fs, fe, n, col, out8)
            return {r.columns[0]: out8}
        if r.kind == "ip":
            v4 = np.zeros(n, np.uint64)
            parse_ipv4s(buf, fs, fe, n, col, v4, status, code)
            if r.field.type == "ip":
                return {r.columns[0]: np.zeros(n, np.uint64), r.columns[1]: v4}
            return {r.columns[0]: v4}
        if r.kind == "ipv6":
            hi6, lo6 = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
            parse_ipv6s(buf, fs, fe, n, col, hi6, lo6, status, code)
            return {r.columns[0]: hi6, r.columns[1]: lo6}
        if r.kind == "string" and self.columns is not None and r.columns[0] not in self.columns:
            return {r.columns[0]: np.zeros(n, np.uint64)}    # not read: never bad either
        text = self._gather(r, n, status)
        if r.kind == "string":
            return {r.columns[0]: self.strings.intern_array(text)}
        return {r.columns[0]: self._floats(text, status, code)}

    def _gather(self, r: FieldReader, n: int, status: np.ndarray) -> pa.Array:
        col = r.position - 1
        widths = self._fend[:n, col] - self._fstart[:n, col]
        offsets = np.zeros(n + 1, np.int32)
        data = np.empty(max(1, int(widths[status == 0].sum())), np.uint8)
        gather_fields(self._buf, self._fstart, self._fend, n, col, status, offsets, data)
        return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                      pa.py_buffer(data)])

    @staticmethod
    def _floats(text: pa.Array, status: np.ndarray, code: int) -> np.ndarray:
        """%lf of every row, by Arrow's cast; when some row is refused, the rows that are not
        a number at all are marked bad and the others (spaces, `inf` spelled otherwise) are
        cast after trimming."""
        strings = text.cast(pa.string())
        try:
            return pc.cast(strings, pa.float64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        trimmed = pc.utf8_lower(pc.utf8_trim_whitespace(strings))
        ok = pc.match_substring_regex(trimmed, _FLOAT_TEXT).to_numpy(zero_copy_only=False)
        pending = status == 0
        status[pending & ~ok] = code
        safe = pc.if_else(pa.array(ok), trimmed, pa.scalar("0"))
        return pc.cast(safe, pa.float64()).to_numpy(zero_copy_only=False)

    def _note_bad(self, status: np.ndarray, lineno: np.ndarray, n: int) -> None:
        """Count the malformed rows by reason; keep the first few lines' numbers and values
        (Python per malformed row only)."""
        for i in np.flatnonzero(status != 0).tolist():
            s = int(status[i])
            line = int(lineno[i])
            if s < 0:
                self.stats.note(WRONG_FIELD_COUNT, line, None)
                continue
            r = self.layout[s - 1]
            kept = self.stats.examples.get(r.reason, [])
            text = None
            if len(kept) < EXAMPLES_PER_REASON:
                col = r.position - 1
                raw = bytes(self._buf[self._fstart[i, col]:self._fend[i, col]])
                text = raw.decode("utf-8", "replace")
            self.stats.note(r.reason, line, text)
        log.debug("%s: %d malformed records skipped so far", self.path, self.stats.malformed)



def open_records(path: str | os.PathLike, fmt: RecordFormat, link: str | None = None,
                 batch_size: int = 65536, **options):
    """A reader over a file, `-` (standard input) or a FIFO: a `RecordReader` for CSV
    records, a `capture.gdat.GdatReader` for GDAT records (see the classes)."""
    if fmt.kind.lower() == "netflow":
        from capture.flowreader import FlowReader

        return FlowReader(path, fmt, link, batch_size, **options)
    options.pop("active_timeout_ns", None)
    options.pop("idle_timeout_ns", None)
    options.pop("lull_slack_ns", None)
    options.pop("exporter_timeouts_ns", None)
    if fmt.kind.lower() == "gdat":
        return GdatReader(path, fmt, link, batch_size, **options)
    return RecordReader(path, fmt, link, batch_size, **options)


def read_all_records(path: str | os.PathLike, fmt: RecordFormat, link: str | None = None,
                     **options) -> RecordBatch:
    """Every good record of a source as one batch (tests, the reference evaluator)."""
    with open_records(path, fmt, link, **options) as reader:
        batches = [b for b in reader if len(b)]
        if not batches:
            return reader._empty()
        return RecordBatch.concat(batches)
