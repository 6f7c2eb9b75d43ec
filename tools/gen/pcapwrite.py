"""A fast classic-pcap writer: whole columns of timestamps, lengths and frame prefixes in, one file out.

    write_pcap(path, timestamps_ns, frames, wire_len, caplen=None, *, snaplen=65535,
               nanosecond=False, linktype=1) -> int   # bytes written

`frames` is a 2-D uint8 array (n x W): the first W bytes of every frame. A record holds
`caplen[i]` bytes (default `min(wire_len[i], snaplen)`); bytes past W are written as zeros, so a
generator only has to build the headers and the payload comes out zero-filled. Records are
packed by one Numba kernel per chunk (a memcpy-speed loop, far cheaper than numpy's scatter
of variable-length records), so a writer of millions of records never runs Python
per packet. Timestamps are written in microseconds (magic 0xa1b2c3d4, truncated towards minus
infinity) or nanoseconds (magic 0xa1b23c4d); the file is little-endian.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import numpy as np

from common.jit import ngjit

log = logging.getLogger(__name__)

MAGIC_US = 0xA1B2C3D4
MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
RECORD_HEADER = 16
#: packets packed per kernel call (bounds the output buffer at chunk x (16 + caplen) bytes)
CHUNK = 1 << 18


def pcap_file_header(snaplen: int = 65535, nanosecond: bool = False, linktype: int = LINKTYPE_ETHERNET) -> bytes:
    """The 24-byte global header of a little-endian classic pcap file."""
    magic = MAGIC_NS if nanosecond else MAGIC_US
    return struct.pack("<IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype)


@ngjit
def _pack_records(out, starts, sec, frac, caplen, wire, frames):
    """Write record i at out[starts[i]:]: 16-byte header, then caplen[i] bytes of frame (zeros past W)."""
    width = frames.shape[1]
    for i in range(starts.shape[0]):
        p = starts[i]
        s = sec[i]
        f = frac[i]
        c = caplen[i]
        w = wire[i]
        for b in range(4):
            out[p + b] = (s >> (8 * b)) & 0xFF
            out[p + 4 + b] = (f >> (8 * b)) & 0xFF
            out[p + 8 + b] = (c >> (8 * b)) & 0xFF
            out[p + 12 + b] = (w >> (8 * b)) & 0xFF
        p += 16
        k = c if c < width else width
        for j in range(k):
            out[p + j] = frames[i, j]
        for j in range(k, c):
            out[p + j] = 0


def split_timestamps(timestamps_ns: np.ndarray, nanosecond: bool) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, fraction) columns of a pcap record header; microseconds are floored."""
    ts = np.asarray(timestamps_ns, dtype=np.int64)
    sec = ts // 1_000_000_000
    frac = ts - sec * 1_000_000_000
    if not nanosecond:
        frac = frac // 1_000
    return sec.astype(np.int64), frac.astype(np.int64)


def pack_records(timestamps_ns, frames, wire_len, caplen, nanosecond: bool = False) -> np.ndarray:
    """The bytes of the records (no file header) as one uint8 array."""
    wire = np.asarray(wire_len, dtype=np.int64)
    cap = np.asarray(caplen, dtype=np.int64)
    n = wire.shape[0]
    frames = np.ascontiguousarray(frames, dtype=np.uint8)
    if frames.ndim != 2 or frames.shape[0] != n or cap.shape[0] != n or len(timestamps_ns) != n:
        raise ValueError("write_pcap: timestamps, frames (n x W), wire_len and caplen need the same n rows")
    sec, frac = split_timestamps(timestamps_ns, nanosecond)
    if n and (sec.min() < 0 or sec.max() > 0xFFFFFFFF):
        raise ValueError("write_pcap: a timestamp is outside the classic pcap range (1970 .. 2106)")
    rec = RECORD_HEADER + cap
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(rec[:-1], out=starts[1:])
    total = int(rec.sum()) if n else 0
    out = np.empty(total, dtype=np.uint8)
    _pack_records(out, starts, sec, frac, cap, wire, frames)
    return out


def write_pcap(path, timestamps_ns, frames, wire_len, caplen=None, *, snaplen: int = 65535,
               nanosecond: bool = False, linktype: int = LINKTYPE_ETHERNET) -> int:
    """Write a classic pcap file from columns; returns the number of bytes written.

    Raises ValueError on inconsistent columns (caplen > wire length or > snaplen, shapes) and
    OSError when the file cannot be written.
    """
    wire = np.asarray(wire_len, dtype=np.int64)
    cap = np.minimum(wire, snaplen) if caplen is None else np.asarray(caplen, dtype=np.int64)
    if cap.shape != wire.shape:
        raise ValueError("write_pcap: caplen and wire_len differ in length")
    if cap.size and (np.any(cap > wire) or np.any(cap > snaplen) or np.any(cap < 0)):
        raise ValueError("write_pcap: every caplen must be within 0 .. min(wire length, snaplen)")
    ts = np.asarray(timestamps_ns, dtype=np.int64)
    frames = np.asarray(frames, dtype=np.uint8)
    written = 0
    with open(path, "wb") as fh:
        written += fh.write(pcap_file_header(snaplen, nanosecond, linktype))
        for lo in range(0, len(wire), CHUNK):
            hi = min(lo + CHUNK, len(wire))
            written += fh.write(pack_records(ts[lo:hi], frames[lo:hi], wire[lo:hi], cap[lo:hi], nanosecond).data)
    log.debug("wrote %d records (%d bytes) to %s", len(wire), written, path)
    return written


class PcapAppender:
    """Write a pcap file in pieces (header once, then record chunks), for generators that build
    their frames chunk by chunk."""

    def __init__(self, path: str | os.PathLike, *, snaplen: int = 65535, nanosecond: bool = False,
                 linktype: int = LINKTYPE_ETHERNET):
        self.path = Path(path)
        self.snaplen = snaplen
        self.nanosecond = nanosecond
        self._fh = open(self.path, "wb")
        self.bytes = self._fh.write(pcap_file_header(snaplen, nanosecond, linktype))
        self.records = 0

    def append(self, timestamps_ns, frames, wire_len, caplen) -> None:
        self.bytes += self._fh.write(pack_records(timestamps_ns, frames, wire_len, caplen, self.nanosecond).data)
        self.records += len(wire_len)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> PcapAppender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
