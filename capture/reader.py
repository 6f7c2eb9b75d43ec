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

Bad input: a packet that cannot be decoded is a row with a reason code (counted in
`stats.reasons`). A bad magic or an unsupported pcap link type raises `CaptureFormatError`
(file, byte offset, value found). A broken record or block (an impossible length) is skipped:
the reader finds the next readable record (`capture.resync`) and goes on, and the problem,
with the bytes skipped, goes to `stats.problems` (and the log). A file that ends inside its
last record is not an error either: every complete packet is yielded, the problem goes to
`stats.problems`. With `strict=True` both raise instead (`CaptureFormatError`,
`TruncatedCaptureError`), after every earlier packet has been yielded.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from capture.batch import PacketBatch, tally
from capture.decode import LINK_NAMES, DecodeColumns, make_columns
from capture.errors import CaptureError, CaptureFormatError, TruncatedCaptureError
from capture.fastdecode import (
    FLOW_COLUMNS,
    column_mask,
    decode_rows_fast,
    decode_rows_flow,
)
from capture.pcapfile import (
    PCAP_HEADER_LEN,
    PCAP_MAGIC_NS,
    PCAP_MAGIC_US,
    PCAP_MAX_SNAPLEN,
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
from capture.resync import RS_FOUND, TIME_WINDOW_S, resync_pcap, resync_pcapng
from capture.schema import COLUMNS, REASONS

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
    """

    def __init__(self, path: str | os.PathLike, link: str | None = None, batch_size: int = 65536,
                 *, chunk_size: int = DEFAULT_CHUNK, strict: bool = False,
                 columns=None, prefetch: int = 0):
        self.path = str(path)
        self.link = link if link is not None else Path(path).stem
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.batch_size = int(batch_size)
        self.strict = strict
        self.stats = ReaderStats()
        if columns is not None:
            unknown = sorted(set(columns) - {c.name for c in COLUMNS})
            if unknown:
                raise ValueError(f"unknown packet columns {unknown}")
        self._want = column_mask(columns)
        # the framing kernels fill these; a consumer of flow columns only gets the lean decoder
        self._flow_only = columns is not None and set(columns) <= FLOW_COLUMNS | _FRAMED
        if prefetch < 0:
            raise ValueError("prefetch must be >= 0")
        self.prefetch = int(prefetch)
        self._ahead: ReadAhead | None = None
        try:
            self._file = open(self.path, "rb", buffering=0)
            size = os.fstat(self._file.fileno()).st_size
        except FileNotFoundError:
            raise CaptureError(f"{self.path}: capture file not found") from None
        except IsADirectoryError:
            raise CaptureError(f"{self.path}: is a directory, not a capture file") from None
        except OSError as exc:
            raise CaptureError(f"{self.path}: cannot read capture file: {exc.strerror or exc}") from None
        self._map: mmap.mmap | None = None   # the file mapped into memory (large files)
        self._released = 0      # mapped bytes before this were handed back (MADV_DONTNEED)
        self._fill = 0          # valid bytes in _buf
        self._pos = 0           # next unparsed byte in _buf
        self._base = 0          # file offset of _buf[0]
        self._eof = False
        if chunk_size >= DEFAULT_CHUNK and size > chunk_size:
            self._map_file(size)
        if self._map is None:
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
        if self._ahead is not None:
            self._ahead.close()
        self._file.close()

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
            try:
                n = self._file.readinto(view[self._fill:])
            except OSError as exc:
                raise CaptureError(f"{self.path}: read error at byte {self._base + self._fill}: {exc}") from None
            if not n:
                self._eof = True
                break
            self._fill += n
            got += n
        return got

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
            raise CaptureFormatError(self.path, 0, "file too short to be a capture (no pcap or pcapng header)",
                                     f"{len(head)} bytes")
        if head in _PCAP_MAGICS:
            self._ensure(PCAP_HEADER_LEN)
            self._pcap = parse_pcap_header(self.path, bytes(self._buf[:min(self._fill, PCAP_HEADER_LEN)]))
            self._pos = PCAP_HEADER_LEN
            return "pcap"
        if head == _SHB_BYTES:
            self._ensure(12)  # check the byte-order magic now, so a bad file fails at open
            parse_section_header(self.path, bytes(self._buf[:min(self._fill, 16)]), 0)
            self._ifaces = Interfaces()
            self._big = False
            self._last_ts = 0
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
        each next batch."""
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
            else:
                fi = self._ifaces
                pos, row, status, found, self._last_ts = frame_pcapng(
                    self._buf, self._pos, self._fill, self._big, fi.link, fi.mode, fi.scale, fi.offset,
                    fi.snaplen, fi.n, self._last_ts, self._base, out, row, max_rows)
            # decode the located frames now, before the buffer is refilled
            if self._flow_only:
                decode_rows_flow(self._buf, out, first, row)
            else:
                decode_rows_fast(self._buf, out, first, row, want)
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
                    self._finish_truncated()
                    return
                self._read_more()
            elif status == ST_SPECIAL_BLOCK:
                if not self._special_block():
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

    def _resync(self, found: int) -> bool:
        """After broken framing at pos: step to the next readable record (False: none before
        the end of the file). Raises CaptureFormatError instead when strict."""
        bad = self._offset()
        what = "pcapng block" if self.format == "pcapng" else "pcap record"
        if self.strict:
            raise CaptureFormatError(self.path, bad, f"broken {what}: impossible length", found)
        if self.format == "pcap":
            h = self._pcap
            window = (0, 0xFFFF_FFFF) if self._last_sec is None else \
                (max(0, self._last_sec - TIME_WINDOW_S), self._last_sec + TIME_WINDOW_S)
            search = lambda start: resync_pcap(  # noqa: E731
                self._buf, start, self._fill, self._eof, h.big_endian,
                1_000_000_000 if h.nanosecond else 1_000_000, max(h.snaplen, PCAP_MAX_SNAPLEN),
                *window)
            start = self._pos + 1
        else:
            search = lambda start: resync_pcapng(  # noqa: E731
                self._buf, start, self._fill, self._eof, self._big)
            start = self._pos + 4
        while True:
            q, status = search(start)
            if status == RS_FOUND:
                self._pos = int(q)
                break
            if self._eof:
                self._pos = self._fill
                break
            self._pos = int(q)       # keep what may still start a record; read on
            self._read_more()
            start = self._pos
        found_at = self._offset() if status == RS_FOUND else None
        skipped = self._offset() - bad
        self.stats.skipped_bytes += skipped
        head = f"{self.path}: byte {bad}: broken {what}: impossible length (found {found})"
        if found_at is None:
            msg = f"{head}; no readable record after it: the last {skipped} bytes were skipped"
        else:
            self.stats.resyncs += 1
            msg = f"{head}; skipped {skipped} bytes to the next readable record at byte {found_at}"
        self.stats.problems.append(msg)
        log.info("%s", msg)         # the consumer reports stats.problems
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
        return PacketBatch(self.link, cols, out.record_offset[:n], bool(in_order))

    def _finish_truncated(self) -> None:
        left = self._fill - self._pos
        if left == 0:
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
    only these columns; the others are zeros), `prefetch` (batches decoded ahead in a thread).
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
    return PacketBatch(name, cols, np.concatenate([b.offsets for b in parts]))
