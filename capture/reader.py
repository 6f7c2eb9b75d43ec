"""Public capture-file API: `open_capture` (batches of decoded packets from a pcap/pcapng file) and `read_all`.

Reading is chunked: the file is read with `readinto` into one large reused byte buffer; the
Numba kernels of `capture.pcapfile` locate the records in it and `capture.fastdecode` decodes them
(`decode_rows_fast`: the general decoder's values with a fast path for plain Ethernet/IPv4;
`decode_rows_flow` when only address/port/protocol columns are asked for with `columns=`);
a record that spans the end of the buffer is moved to its front before the next read.
With `prefetch=k` a thread does all that up to k batches ahead (`capture.prefetch`); `stats`
then counts what the thread has decoded, which may be ahead of what was consumed. Output columns are preallocated once
per reader and reused for every batch, so a `PacketBatch` yielded by the iterator is a VIEW
that the next batch overwrites: a consumer that keeps one must `batch.copy()` it.

Streams: a FIFO or `-` (standard input; `capture.source`) is read as its bytes arrive, never
mapped or sought. When the writer goes quiet the packets read so far are yielded at once (the
link's clock and punctuation advance with them); before the first byte the reader says after
a second that it waits; `stop()` (or `close()`) ends the wait like an end of input.

Bad input: a packet that cannot be decoded is a row with a reason code (counted in
`stats.reasons`). A bad magic or an unsupported pcap link type raises `CaptureFormatError`
(file, byte offset, value found). A broken record or block (an impossible length, or one
running past the end of the file with readable records after its header) is skipped:
the reader finds the next readable record (`capture.resync`) and goes on, and the problem,
with the bytes skipped, goes to `stats.problems` (and the log). A damaged pcapng section
header or interface description loses its section only: reading resumes at the next valid
section header. A record longer than the snap length is read whole, as tshark reads it (a
warning once per file). A file that ends inside its
last record is not an error either: every complete packet is yielded, the problem goes to
`stats.problems`. Whatever the problem, every packet before it is yielded first. With
`strict=True` they raise instead (`CaptureFormatError`, `TruncatedCaptureError`), after every
earlier packet has been yielded.
"""

from __future__ import annotations

import logging
import mmap
import os
import select
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from capture import payload as payloads
from capture.batch import PacketBatch, tally
from capture.decode import LINK_NAMES, DecodeColumns, make_columns
from capture.errors import CaptureError, CaptureFormatError, TruncatedCaptureError
from capture.fastdecode import (
    FLOW_COLUMNS,
    column_mask,
    decode_rows_fast,
    decode_rows_flow,
)
from capture.payload import PAYLOAD
from capture.payload import gather as gather_payload
from capture.pcapfile import (
    MAX_RECORD,
    PCAP_HEADER_LEN,
    PCAP_MAGIC_NS,
    PCAP_MAGIC_US,
    PCAP_MAX_SNAPLEN,
    PCAP_RECORD_HEADER_LEN,
    PCAPNG_SHB,
    ST_BAD_RECORD,
    ST_BATCH_FULL,
    ST_NEED_DATA,
    ST_SPECIAL_BLOCK,
    Interfaces,
    frame_pcap,
    frame_pcapng,
    parse_interface,
    parse_pcap_header,
    parse_section_header,
)
from capture.resync import RS_FOUND, TIME_WINDOW_S, resync_pcap, resync_pcapng, resync_section
from capture.schema import COLUMNS, REASONS
from capture.source import STDIN, STREAM, classify, display_name, open_input

if TYPE_CHECKING:
    from capture.prefetch import ReadAhead

log = logging.getLogger(__name__)

DEFAULT_CHUNK = 16 << 20
#: a mapped file's decoded pages are handed back in steps of this many bytes
_RELEASE_BYTES = 64 << 20
_MIN_CHUNK = 64  # bytes; tests use tiny chunks to put records across chunk ends
_PCAP_MAGICS = {m.to_bytes(4, order) for m in (PCAP_MAGIC_US, PCAP_MAGIC_NS) for order in ("little", "big")}
_FRAMED = frozenset(("timestamp", "len", "caplen"))
_SHB_BYTES = PCAPNG_SHB.to_bytes(4, "little")  # a palindrome: the same in both byte orders
#: a stream's read buffer (a pipe holds 64 KiB to 1 MiB): large enough to frame many
#: packets per kernel call, small enough to hand them on while the writer is still writing
_STREAM_CHUNK = 1 << 20
#: a stream's wait for bytes is cut in slices of this (s), to notice a stop or close()
_WAIT_SLICE_S = 0.2
#: a stream with no byte after this long (s) says that it waits
_WAIT_NOTICE_S = 1.0


@dataclass
class ReaderStats:
    """What a reader has seen so far."""

    packets: int = 0
    bytes: int = 0             # sum of wire lengths
    captured_bytes: int = 0    # sum of captured lengths
    reason_counts: np.ndarray = field(default_factory=lambda: np.zeros(256, np.int64))
    problems: list[str] = field(default_factory=list)
    skipped_bytes: int = 0     # unreadable bytes stepped over after broken framing
    resyncs: int = 0           # times the reader found its way back after broken framing

    @property
    def reasons(self) -> dict[str, int]:
        """Packets per reason name (only reasons seen)."""
        return {REASONS.get(i, f"reason_{i}"): int(c) for i, c in enumerate(self.reason_counts) if c}

    @property
    def malformed(self) -> int:
        """Packets whose reason is neither ok nor a benign non-IP frame."""
        return int(self.reason_counts.sum() - self.reason_counts[0] - self.reason_counts[3])


class CaptureReader:
    """Iterate over a pcap or pcapng file as `PacketBatch`es of up to `batch_size` packets.

    Use as a context manager; iterate once. Batches are views into reused buffers.

    `columns` (names of `capture.schema.COLUMNS`, default all): the columns the consumer
    reads; the others are not decoded and hold zeros (`layers`, `reason`, `timestamp`, `len`
    and `caplen` are always filled). `prefetch` (default 0): decode up to that many batches
    ahead in a thread (`capture.prefetch`), overlapping the consumer's work on another core.
    `path` may be a FIFO or `-` (standard input): `stream` is then True, and `stop` (a
    callable) ends a wait for bytes as the end of the stream.
    """

    def __init__(self, path: str | os.PathLike, link: str | None = None, batch_size: int = 65536,
                 *, chunk_size: int = DEFAULT_CHUNK, strict: bool = False,
                 columns=None, prefetch: int = 0, stop: Callable[[], bool] | None = None):
        self.path = display_name(path)
        self.link = link if link is not None else "stdin" if str(path) == STDIN else Path(path).stem
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = int(batch_size)
        self.strict = strict
        self.stats = ReaderStats()
        #: TCP/UDP payload bytes asked for (`capture.payload`): gathered per batch, else never
        self._payload = columns is not None and PAYLOAD in columns
        self._payload_parts: list = []
        if columns is not None:
            unknown = sorted(set(columns) - {c.name for c in COLUMNS} - {PAYLOAD})
            if unknown:
                raise ValueError(f"unknown packet columns {unknown}")
            # the payload is located from the IP and payload lengths
            columns = (set(columns) - {PAYLOAD}) | ({"ip_len", "payload_len"}
                                                    if self._payload else set())
        self._want = column_mask(columns)
        # the framing kernels fill these; a consumer of flow columns only gets the lean decoder
        self._flow_only = columns is not None and set(columns) <= FLOW_COLUMNS | _FRAMED
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        self.prefetch = int(prefetch)
        self._ahead: ReadAhead | None = None
        kind, why = classify(path)
        if kind is None:
            raise CaptureError(f"{self.path}: {why}")
        #: a FIFO or standard input: read as the bytes arrive (never mapped, never sought)
        self.stream = kind == STREAM
        self._stop = stop            # a stream's wait for bytes ends (as its end) once this says so
        self._closing = False        # close() asked: a stream's wait ends
        self._stopped = False        # the stream ended by a stop or close, not by its writer
        self._snap_warned = False    # records longer than the snap length were reported
        self._file = self._open(path)
        size = 0 if self.stream else os.fstat(self._file.fileno()).st_size
        self._map: mmap.mmap | None = None   # the file mapped into memory (large files)
        self._released = 0      # mapped bytes before this were handed back (MADV_DONTNEED)
        self._fill = 0          # valid bytes in _buf
        self._pos = 0           # next unparsed byte in _buf
        self._base = 0          # file offset of _buf[0]
        self._eof = False
        if chunk_size >= DEFAULT_CHUNK and size > chunk_size:
            self._map_file(size)
        if self.stream:
            # a stream's bytes arrive a pipe's worth at a time: a modest buffer, which grows
            # if a record does not fit
            self._buf = np.empty(max(_MIN_CHUNK, min(int(chunk_size), _STREAM_CHUNK)), np.uint8)
            self._poller = select.poll()
            self._poller.register(self._file.fileno(), select.POLLIN | select.POLLPRI)
        elif self._map is None:
            # a small file needs no large buffer; the buffer grows if a record does not fit
            self._buf = np.empty(max(_MIN_CHUNK, min(int(chunk_size), size + 16)), np.uint8)
        self._out: DecodeColumns = make_columns(self.batch_size)
        self._started = False
        self._last_sec: int | None = None   # seconds of the last packet (resync's time window)
        try:
            self.format = self._sniff()
        except BaseException:
            self._file.close()
            raise

    # --- context manager -----------------------------------------------------------------
    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closing = True         # a read-ahead thread waiting on a quiet stream gives up
        if self._ahead is not None:
            self._ahead.close()
        self._file.close()

    def _open(self, path: str | os.PathLike):
        return open_input(path, self.stream, "capture file", CaptureError)

    # --- buffer management ---------------------------------------------------------------
    def _map_file(self, size: int) -> None:
        """Map a large file instead of reading it into the buffer: the kernels frame and
        decode the page cache's own pages; reading copies every byte once more, on the
        read-ahead thread. A private mapping, never written:
        the buffer has the type of a read one (the kernels need no second compilation). Where
        mapping fails (a pipe, a special file system), the file is read into the buffer."""
        try:
            mapped = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as exc:
            log.debug("%s: not mapped (%s); read instead", self.path, exc)
            return
        if hasattr(mapped, "madvise"):
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        self._map = mapped
        self._buf = np.frombuffer(mapped, np.uint8, count=size)
        self._fill = size
        self._eof = True

    def _release(self) -> None:
        """Hand back the mapped pages already decoded (the page cache keeps the file; the
        process's resident memory stays bounded by what is ahead)."""
        if self._map is None or self._pos - self._released < _RELEASE_BYTES \
                or not hasattr(self._map, "madvise"):
            return
        end = self._pos - self._pos % mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
        self._released = end

    def _read_more(self) -> int:
        """Move the unparsed tail to the front, fill the rest of the buffer; bytes read."""
        tail = self._fill - self._pos
        if self._pos > 0:
            if tail:
                self._buf[:tail] = self._buf[self._pos:self._fill]
            self._base += self._pos
            self._pos, self._fill = 0, tail
        elif self._fill == len(self._buf):
            # one record larger than the buffer: grow it (records are bounded by MAX_RECORD)
            self._buf = np.concatenate([self._buf, np.empty(len(self._buf), np.uint8)])
        got = 0
        view = self._buf.data   # a memoryview of the buffer
        while self._fill < len(self._buf):
            # a stream: wait for its first bytes, then take only what has arrived, so that
            # the packets in it are framed (and their time advances the link's clock) while
            # the writer is quiet, instead of when a whole buffer has come
            if self.stream and not self._wait_readable(block=got == 0):
                if got == 0:         # stopped or closed while waiting: the stream ends here
                    self._stopped = self._eof = True
                break
            try:
                n = self._file.readinto(view[self._fill:])
            except OSError as exc:
                raise CaptureError(f"{self.path}: read error at byte {self._base + self._fill}: {exc}") from None
            if n is None:           # a non-blocking standard input had nothing after all
                continue
            if not n:
                self._eof = True
                break
            self._fill += n
            got += n
        return got

    def _wait_readable(self, block: bool) -> bool:
        """A stream: True when a read will not wait (bytes, or its end, have arrived).
        Without `block`, only looks; with it, waits in slices, until the bytes come or a stop
        or close() is asked (False). Before the first byte, says after a second that it waits
        (a FIFO no writer has opened yet looks exactly like a hang otherwise)."""
        if not block:
            return bool(self._poller.poll(0))
        started = time.monotonic()
        noticed = False
        while True:
            if self._closing or (self._stop is not None and self._stop()):
                return False
            if self._poller.poll(int(_WAIT_SLICE_S * 1000)):
                return True
            if not noticed and self._base + self._fill == 0 \
                    and time.monotonic() - started >= _WAIT_NOTICE_S:
                noticed = True
                what = "standard input" if self.path == display_name(STDIN) else "the FIFO"
                log.warning("%s: waiting for a capture: nothing written to %s yet "
                            "(Ctrl-C gives up)", self.path, what)

    def _ensure(self, nbytes: int) -> bool:
        """Make buf[pos:pos+nbytes] valid if the file has that much; False at end of file."""
        while self._fill - self._pos < nbytes and not self._eof:
            if self._pos == 0 and self._fill == len(self._buf):
                self._buf = np.concatenate([self._buf, np.empty(max(nbytes, len(self._buf)), np.uint8)])
            self._read_more()
        return self._fill - self._pos >= nbytes

    def _offset(self) -> int:
        return self._base + self._pos

    def _sniff(self) -> str:
        self._ensure(4)
        head = bytes(self._buf[:min(4, self._fill)])
        if len(head) < 4:
            if self._stopped:
                raise CaptureError(f"{self.path}: stopped before a capture arrived")
            raise CaptureFormatError(self.path, 0, "file too short to be a capture (no pcap or pcapng header)",
                                     f"{len(head)} bytes")
        if head in _PCAP_MAGICS:
            self._ensure(PCAP_HEADER_LEN)
            self._pcap = parse_pcap_header(self.path, bytes(self._buf[:min(self._fill, PCAP_HEADER_LEN)]))
            self._pos = PCAP_HEADER_LEN
            return "pcap"
        if head == _SHB_BYTES:
            self._ifaces = Interfaces()
            self._big = False
            self._last_ts = 0
            self._ensure(16)  # check the byte-order magic now, so a bad file fails at open
            try:
                parse_section_header(self.path, bytes(self._buf[:min(self._fill, 16)]), 0)
            except CaptureFormatError as exc:
                # a damaged first section header: the file is still read from its next
                # section, if it has one (none: the file is not readable at all)
                if self.strict or not self._next_section(exc, quiet=True):
                    raise
            return "pcapng"
        raise CaptureFormatError(self.path, 0, "not a pcap or pcapng file: bad magic number", "0x" + head.hex())

    # --- iteration -----------------------------------------------------------------------
    def __iter__(self) -> Iterator[PacketBatch]:
        if self._started:
            raise CaptureError(f"{self.path}: a capture reader can be iterated only once")
        self._started = True
        if self.prefetch == 0:
            return (batch for batch, _ in self._batches(lambda: self._out))
        from capture.prefetch import ReadAhead

        pool = [self._out] + [make_columns(self.batch_size) for _ in range(self.prefetch)]
        self._ahead = ReadAhead(self._batches, pool, name=f"read-ahead {self.link}")
        return iter(self._ahead)

    def _batches(self, take_buffer) -> Iterator[tuple[PacketBatch, DecodeColumns]]:
        """(batch, the column buffer it views) pairs; `take_buffer()` gives the buffer of
        each next batch. Whatever stops the framing (damage, the end, a stream gone quiet),
        the rows located before it are yielded first."""
        out = self._out = take_buffer()
        want = self._want
        max_rows = self.batch_size
        row = 0
        while True:
            first = row
            if self.format == "pcap":
                h = self._pcap
                pos, row, status, found = frame_pcap(
                    self._buf, self._pos, self._fill, h.big_endian, 1 if h.nanosecond else 1000,
                    h.snaplen, h.link, self._base, out, row, max_rows)
                if not self._snap_warned and 0 < h.snaplen and row > first \
                        and out.caplen[first:row].max() > h.snaplen:
                    i = first + int(np.argmax(out.caplen[first:row] > h.snaplen))
                    self._warn_snaplen(int(out.record_offset[i]), int(out.caplen[i]), h.snaplen)
            else:
                fi = self._ifaces
                pos, row, status, found, self._last_ts, over_at = frame_pcapng(
                    self._buf, self._pos, self._fill, self._big, fi.link, fi.mode, fi.scale, fi.offset,
                    fi.snaplen, fi.n, self._last_ts, self._base, out, row, max_rows)
                if over_at >= 0 and not self._snap_warned:
                    i = first + int(np.flatnonzero(out.record_offset[first:row] == over_at)[0])
                    self._warn_snaplen(int(over_at), int(out.caplen[i]), None)
            # decode the located frames now, before the buffer is refilled
            if self._flow_only:
                decode_rows_flow(self._buf, out, first, row)
            else:
                decode_rows_fast(self._buf, out, first, row, want)
            if self._payload and row > first:
                self._payload_parts.append(gather_payload(self._buf, out, first, row))
            self._pos = pos
            self._release()
            if status == ST_BATCH_FULL:
                yield self._emit(row), out
                out = self._out = take_buffer()
                row = 0
            elif status == ST_NEED_DATA:
                if self._eof:
                    if row:
                        yield self._emit(row), out
                    if self._stopped or not self._runs_past_end():
                        self._finish_truncated()
                        return
                    if row:
                        out = self._out = take_buffer()
                        row = 0
                    continue
                if self.stream and row and not self._wait_readable(block=False):
                    # the writer is quiet: hand on what has come, so its time reaches the
                    # link's clock (and its punctuation) now rather than a buffer later
                    yield self._emit(row), out
                    out = self._out = take_buffer()
                    row = 0
                self._read_more()
            elif status == ST_SPECIAL_BLOCK:
                try:
                    complete = self._special_block()
                except CaptureFormatError as exc:
                    # a damaged section header or interface description: the packets before
                    # it first, then the problem, then the next section
                    if row:
                        yield self._emit(row), out
                        out = self._out = take_buffer()
                        row = 0
                    if self.strict:
                        raise
                    if not self._next_section(exc):
                        return
                    continue
                if not complete:
                    if row:
                        yield self._emit(row), out
                    self._finish_truncated()
                    return
            else:
                assert status == ST_BAD_RECORD
                if row:
                    yield self._emit(row), out
                    out = self._out = take_buffer()
                    row = 0
                if not self._resync(found):
                    return

    def _warn_snaplen(self, offset: int, caplen: int, snaplen: int | None) -> None:
        """Once per file: records longer than the snap length are read whole, as tshark reads
        them (a writer that cut packets itself, or a header rewritten by a tool), not
        flagged: their bytes are real."""
        self._snap_warned = True
        limit = f"the file header's snap length {snaplen}" if snaplen is not None \
            else "its interface's snap length"
        log.warning("%s: byte %d: a record of %d bytes, longer than %s; such records are read "
                    "whole, as tshark reads them (said once per file)", self.path, offset, caplen, limit)

    def _record_search(self):
        """(search, start): the resynchronisation kernel of this format, as a function of
        where to start, and where to start after broken framing at pos."""
        if self.format == "pcap":
            h = self._pcap
            window = (0, 0xFFFF_FFFF) if self._last_sec is None else \
                (max(0, self._last_sec - TIME_WINDOW_S), self._last_sec + TIME_WINDOW_S)
            max_caplen = min(max(h.snaplen, PCAP_MAX_SNAPLEN), MAX_RECORD)
            return (lambda start: resync_pcap(
                self._buf, start, self._fill, self._eof, h.big_endian,
                1_000_000_000 if h.nanosecond else 1_000_000, max_caplen, *window)), self._pos + 1
        return (lambda start: resync_pcapng(
            self._buf, start, self._fill, self._eof, self._big)), self._pos + 4

    def _scan(self, search, start: int) -> int | None:
        """Run a resynchronisation kernel `search(start)` over the rest of the file, reading
        on as it needs: the file offset it found (pos moved there), or None (pos at the end)."""
        while True:
            q, status = search(start)
            if status == RS_FOUND:
                self._pos = int(q)
                return self._offset()
            if self._eof:
                self._pos = self._fill
                return None
            self._pos = int(q)       # keep what may still start a record; read on
            self._read_more()
            start = self._pos

    def _resync(self, found: int, problem: str = "impossible length") -> bool:
        """After broken framing at pos: step to the next readable record (False: none before
        the end of the file). Raises CaptureFormatError instead when strict."""
        bad = self._offset()
        what = "pcapng block" if self.format == "pcapng" else "pcap record"
        if self.strict:
            raise CaptureFormatError(self.path, bad, f"broken {what}: {problem}", found)
        found_at = self._scan(*self._record_search())
        skipped = self._offset() - bad
        self.stats.skipped_bytes += skipped
        head = f"{self.path}: byte {bad}: broken {what}: {problem} (found {found})"
        if found_at is None:
            msg = f"{head}; no readable record after it: the last {skipped} bytes were skipped"
        else:
            self.stats.resyncs += 1
            msg = f"{head}; skipped {skipped} bytes to the next readable record at byte {found_at}"
        self.stats.problems.append(msg)
        log.info("%s", msg)         # the consumer reports stats.problems
        return found_at is not None

    def _runs_past_end(self) -> bool:
        """At the end of the file, the record at pos does not fit. When readable records
        follow its header, its length is damage, not a capture cut short: step over it as
        over any impossible length (True). False: the file ends inside its last record."""
        head = PCAP_RECORD_HEADER_LEN if self.format == "pcap" else 12
        if self._fill - self._pos < head:
            return False
        search, start = self._record_search()
        _, status = search(start)    # the whole rest of the file is in the buffer
        if status != RS_FOUND:
            return False
        at = self._pos + (8 if self.format == "pcap" else 4)
        big = self._pcap.big_endian if self.format == "pcap" else self._big
        length = int.from_bytes(bytes(self._buf[at:at + 4]), "big" if big else "little")
        return self._resync(length, "length runs past the end of the file")

    def _next_section(self, exc: CaptureFormatError, quiet: bool = False) -> bool:
        """After a damaged section header or interface description at pos: step to the next
        valid section header (False: none before the end of the file). The blocks between
        cannot be read: their byte order or their interfaces were in the damaged block.
        `quiet`: report nothing when there is none (the caller raises `exc` itself)."""
        bad = self._offset()
        found_at = self._scan(lambda start: resync_section(self._buf, start, self._fill, self._eof),
                              self._pos + 4)
        skipped = self._offset() - bad
        self._ifaces = Interfaces()
        if found_at is None and quiet:
            return False
        self.stats.skipped_bytes += skipped
        if found_at is None:
            msg = f"{exc}; no valid section header after it: the last {skipped} bytes were skipped"
        else:
            self.stats.resyncs += 1
            msg = (f"{exc}; skipped {skipped} bytes, the rest of its section, to the next section "
                   f"header at byte {found_at}")
        self.stats.problems.append(msg)
        log.info("%s", msg)
        return found_at is not None

    def _emit(self, n: int) -> PacketBatch:
        out = self._out
        cols = {c.name: getattr(out, c.name)[:n] for c in COLUMNS}
        if n:
            self._last_sec = int(cols["timestamp"][n - 1]) // 1_000_000_000
        st = self.stats
        st.packets += n
        wire, captured, in_order = tally(cols["len"], cols["caplen"], cols["reason"],
                                         st.reason_counts, cols["timestamp"])
        st.bytes += int(wire)
        st.captured_bytes += int(captured)
        payload = None
        if self._payload:
            parts, self._payload_parts = self._payload_parts, []
            payload = payloads.concat(parts) if parts else payloads.empty(n)
        return PacketBatch(self.link, cols, out.record_offset[:n], bool(in_order), payload)

    def _finish_truncated(self) -> None:
        left = self._fill - self._pos
        if left == 0:
            return
        if self._stopped:
            # a stream cut by a stop (Ctrl-C, --duration), not by damage: nothing to report
            log.debug("%s: stopped with %d bytes of a record read", self.path, left)
            return
        msg = (f"{self.path}: byte {self._offset()}: file ends inside the last "
               f"{'block' if self.format == 'pcapng' else 'record'} ({left} bytes left over); "
               f"all {self.stats.packets} complete packets were read")
        self.stats.problems.append(msg)
        log.info("%s", msg)
        if self.strict:
            raise TruncatedCaptureError(self.path, self._offset(), "file ends inside the last record",
                                        f"{left} bytes")

    def _special_block(self) -> bool:
        """Parse a pcapng section header or interface description at pos and step over it.

        False when the file ends inside the block.
        """
        start = self._offset()
        if not self._ensure(12):
            return False
        raw = bytes(self._buf[self._pos:self._pos + 12])
        if raw[:4] == _SHB_BYTES:
            shb = parse_section_header(self.path, raw, start)
            if not self._ensure(shb.length):
                return False
            shb = parse_section_header(self.path, bytes(self._buf[self._pos:self._pos + 16]), start)  # version
            self._big = shb.big_endian
            self._ifaces = Interfaces()  # interface ids restart in every section
            self._pos += shb.length
            return True
        blen = int.from_bytes(raw[4:8], "big" if self._big else "little")
        if not self._ensure(blen):
            return False
        data = bytes(self._buf[self._pos:self._pos + blen])
        link, mode, scale, offset_ns, snaplen = parse_interface(self.path, data, self._big, start)
        i = self._ifaces.add(link, mode, scale, offset_ns, snaplen)
        if link not in LINK_NAMES:
            msg = (f"{self.path}: byte {start}: interface {i} has unsupported link type {link}; "
                   f"its packets are kept with reason unsupported_link_type")
            self.stats.problems.append(msg)
            log.info("%s", msg)
        self._pos += blen
        return True


def open_capture(path: str | os.PathLike, link: str | None = None, batch_size: int = 65536,
                 **options) -> CaptureReader:
    """Open a pcap or pcapng file for batch iteration (`link` defaults to the file stem).

    Options: `chunk_size` (bytes read at a time, default 16 MiB), `strict` (raise
    TruncatedCaptureError at the end when the file ends inside a record), `columns` (decode
    only these columns; the others are zeros), `prefetch` (batches decoded ahead in a thread),
    `stop` (a stream's wait for bytes ends, as its end, once this returns True). `path` may be
    a FIFO or `-` (standard input): a stream.
    """
    return CaptureReader(path, link, batch_size, **options)


def read_all(path: str | os.PathLike, link: str | None = None, **options) -> PacketBatch:
    """Every packet of a (small) capture file as one PacketBatch (a copy, safe to keep)."""
    with open_capture(path, link, **options) as reader:
        parts = [b.copy() for b in reader]
        name = reader.link
    if not parts:
        return PacketBatch.empty(name)
    cols = {c.name: np.concatenate([b.columns[c.name] for b in parts]) for c in COLUMNS}
    payload = None
    if all(b.payload is not None for b in parts):
        payload = pa.concat_arrays([b.payload for b in parts])
    return PacketBatch(name, cols, np.concatenate([b.offsets for b in parts]), payload=payload)
