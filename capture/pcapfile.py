"""pcap and pcapng files: Numba kernels that locate the records in a chunk, and the headers parsed in Python.

`frame_pcap` / `frame_pcapng` walk a byte buffer holding part of the file (`buf[pos:fill]`)
and record, per packet, its time, lengths, link type and where its frame starts; they stop
with a status when the batch is full, the next record is not wholly in the buffer (the
caller moves the tail to the front and reads more), the framing is broken, or (pcapng) a
section header or interface description needs Python. The file header, section headers and
interface descriptions are parsed here in Python, once each. Layouts follow the libpcap file
format and the pcapng specification (IETF draft "PCAP Next Generation Dump File Format").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from capture.decode import LINK_NAMES, SUPPORTED_LINKS
from capture.errors import CaptureFormatError
from common.jit import ngjit
from common.units import NS_PER_S as _NS

_INT64_MAX = np.int64(0x7FFF_FFFF_FFFF_FFFF)
PCAP_HEADER_LEN = 24

# --- file magics --------------------------------------------------------------------------
PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A
PCAPNG_BOM = 0x1A2B3C4D
PCAP_RECORD_HEADER_LEN = 16
PCAP_MAX_SNAPLEN = 262144  # libpcap's largest snap length

# pcapng block types the kernel knows
BT_IDB = 0x00000001
BT_OPB = 0x00000002   # obsolete packet block (still written by old tools)
BT_SPB = 0x00000003
BT_EPB = 0x00000006

#: a record or block longer than this is taken as broken framing, not as a packet
MAX_RECORD = 64 << 20

# --- kernel statuses ----------------------------------------------------------------------
ST_NEED_DATA = 0      # the next record is not wholly in the buffer
ST_BATCH_FULL = 1
ST_BAD_RECORD = 2     # framing broken at pos; `found` holds the offending length
ST_SPECIAL_BLOCK = 3  # pcapng: section header or interface description at pos

# pcapng timestamp resolution modes (see ts_resolution below)
TS_MUL = 0
TS_DIV = 1
TS_POW2 = 2


@ngjit
def rd16(b, p, big):
    """16-bit unsigned at b[p] in the file's byte order."""
    if big:
        return (np.int64(b[p]) << 8) | np.int64(b[p + 1])
    return (np.int64(b[p + 1]) << 8) | np.int64(b[p])


@ngjit
def rd32(b, p, big):
    """32-bit unsigned at b[p] in the file's byte order."""
    if big:
        return (np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16) | (np.int64(b[p + 2]) << 8) | np.int64(b[p + 3])
    return (np.int64(b[p + 3]) << 24) | (np.int64(b[p + 2]) << 16) | (np.int64(b[p + 1]) << 8) | np.int64(b[p])


@ngjit
def frame_pcap(buf, pos, fill, big, ts_mult, snaplen, link, file_base, out, row, max_rows):
    """Locate pcap records in buf[pos:fill] as rows row.. of `out` (decode_rows decodes them).

    Returns (pos, row, status, found): the first unconsumed byte, the next free row, why it
    stopped (ST_*), and for ST_BAD_RECORD the offending captured length. As libpcap does, a
    captured length above max(snaplen, 262144) is broken framing (the records after it
    cannot be found). One merely above the header's snap length is read whole, as tshark
    reads it (writers that cut packets themselves, or rewrote the header, leave such files;
    the reader warns once); one above the wire length is a row flagged bad_record_length.
    """
    max_caplen = min(max(snaplen, PCAP_MAX_SNAPLEN), MAX_RECORD)
    c_ts = out.timestamp
    c_offset = out.record_offset
    c_len = out.len
    c_caplen = out.caplen
    c_data = out.data_offset
    c_link = out.link_type
    c_bad = out.bad_record
    found = 0
    while True:
        if row >= max_rows:
            status = ST_BATCH_FULL
            break
        if pos + PCAP_RECORD_HEADER_LEN > fill:
            status = ST_NEED_DATA
            break
        caplen = rd32(buf, pos + 8, big)
        if caplen > max_caplen:
            status = ST_BAD_RECORD
            found = caplen
            break
        if pos + PCAP_RECORD_HEADER_LEN + caplen > fill:
            status = ST_NEED_DATA
            break
        wirelen = rd32(buf, pos + 12, big)
        c_ts[row] = rd32(buf, pos, big) * _NS + rd32(buf, pos + 4, big) * ts_mult
        c_offset[row] = file_base + pos
        c_len[row] = wirelen
        c_caplen[row] = caplen
        c_data[row] = pos + PCAP_RECORD_HEADER_LEN
        c_link[row] = link
        c_bad[row] = caplen > wirelen
        row += 1
        pos += PCAP_RECORD_HEADER_LEN + caplen
    return pos, row, status, found


@ngjit
def _pcapng_ns(ts, mode, scale, offset_ns):
    """ns since the epoch of a pcapng timestamp; saturates at the int64 limit (year 2262)."""
    if ts < 0:
        return _INT64_MAX  # the 64-bit unit count itself overflowed int64
    if mode == TS_MUL:
        if ts > (_INT64_MAX - offset_ns) // scale:
            return _INT64_MAX
        return ts * scale + offset_ns
    if mode == TS_DIV:
        return ts // scale + offset_ns
    # binary resolution 2^-scale: whole seconds, then the fraction without overflowing 64 bits
    k = scale
    frac = ts & ((np.int64(1) << k) - 1)
    sec = ts >> k
    if k > 33:
        frac >>= k - 33
        k = 33
    if sec > (_INT64_MAX - offset_ns) // _NS - 1:
        return _INT64_MAX
    return sec * _NS + ((frac * _NS) >> k) + offset_ns


@ngjit
def frame_pcapng(buf, pos, fill, big, if_link, if_mode, if_scale, if_offset, if_snaplen, n_if,
                 last_ts, file_base, out, row, max_rows):
    """Locate pcapng packet blocks in buf[pos:fill] as rows row.. of `out` (decode_rows decodes them).

    Skips blocks it does not know; stops at a section header or interface description
    (ST_SPECIAL_BLOCK) so that Python updates the interface tables. Returns
    (pos, row, status, found, last_ts, over_at); `last_ts` dates simple packet blocks, which
    carry none; `over_at` is the file offset of the first packet longer than its interface's
    snap length (read whole, as tshark does; -1: none). A packet of an interface never
    described gets link type -1 (unsupported_link_type).
    """
    c_ts = out.timestamp
    c_offset = out.record_offset
    c_len = out.len
    c_caplen = out.caplen
    c_data = out.data_offset
    c_link = out.link_type
    c_bad = out.bad_record
    found = 0
    over_at = -1
    while True:
        if row >= max_rows:
            status = ST_BATCH_FULL
            break
        if pos + 12 > fill:
            status = ST_NEED_DATA
            break
        btype = rd32(buf, pos, big)
        if btype == PCAPNG_SHB:
            status = ST_SPECIAL_BLOCK
            break
        blen = rd32(buf, pos + 4, big)
        if blen < 12 or blen % 4 != 0 or blen > MAX_RECORD:
            status = ST_BAD_RECORD
            found = blen
            break
        if pos + blen > fill:
            status = ST_NEED_DATA
            break
        if btype == BT_IDB:
            status = ST_SPECIAL_BLOCK
            break
        if btype == BT_EPB or btype == BT_OPB:
            if blen < 32:
                status = ST_BAD_RECORD
                found = blen
                break
            if btype == BT_EPB:
                ifid = rd32(buf, pos + 8, big)
            else:
                ifid = rd16(buf, pos + 8, big)
            ts = (rd32(buf, pos + 12, big) << 32) | rd32(buf, pos + 16, big)
            caplen = rd32(buf, pos + 20, big)
            wirelen = rd32(buf, pos + 24, big)
            if caplen > blen - 32:
                status = ST_BAD_RECORD
                found = caplen
                break
            data = pos + 28
            if ifid < n_if:
                ts_ns = _pcapng_ns(ts, if_mode[ifid], if_scale[ifid], if_offset[ifid])
                last_ts = ts_ns
            else:
                ts_ns = 0
        elif btype == BT_SPB:
            if blen < 16:
                status = ST_BAD_RECORD
                found = blen
                break
            ifid = 0
            wirelen = rd32(buf, pos + 8, big)
            caplen = min(wirelen, blen - 16)
            if n_if > 0 and if_snaplen[0] > 0:
                caplen = min(caplen, if_snaplen[0])
            data = pos + 12
            ts_ns = last_ts
        else:
            pos += blen
            continue
        c_ts[row] = ts_ns
        c_offset[row] = file_base + pos
        c_len[row] = wirelen
        c_caplen[row] = caplen
        c_data[row] = data
        if ifid < n_if:
            c_link[row] = if_link[ifid]
            c_bad[row] = caplen > wirelen
            if over_at < 0 and 0 < if_snaplen[ifid] < caplen:
                over_at = file_base + pos
        else:
            c_link[row] = -1
            c_bad[row] = False
        row += 1
        pos += blen
    return pos, row, status, found, last_ts, over_at


# --- headers parsed in Python (once per file / section / interface) -------------------------


@dataclass(frozen=True)
class PcapHeader:
    """The 24-byte pcap global header."""

    big_endian: bool
    nanosecond: bool
    version: tuple[int, int]
    snaplen: int
    link: int


def parse_pcap_header(path: str, head: bytes) -> PcapHeader:
    """Parse the pcap global header (raises CaptureFormatError naming the problem)."""
    if len(head) < PCAP_HEADER_LEN:
        raise CaptureFormatError(path, len(head), "file ends inside the 24-byte pcap header")
    (magic_le,) = struct.unpack_from("<I", head, 0)
    for big, magic in ((False, magic_le), (True, struct.unpack_from(">I", head, 0)[0])):  # noqa: B007 -- read after the loop
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            break
    else:
        raise CaptureFormatError(path, 0, "not a pcap file: bad magic number", f"0x{magic_le:08x}")
    e = ">" if big else "<"
    major, minor, _zone, _sigfigs, snaplen, linkfield = struct.unpack_from(e + "HHiIII", head, 4)
    link = linkfield & 0xFFFF  # the upper bits may carry FCS information
    if link not in SUPPORTED_LINKS:
        raise CaptureFormatError(path, 20, f"unsupported link type (supported: {_supported()})", link)
    return PcapHeader(big, magic == PCAP_MAGIC_NS, (major, minor), snaplen, link)


def _supported() -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(LINK_NAMES.items()))


@dataclass
class Interfaces:
    """Interface tables of the current pcapng section, as arrays the kernel reads."""

    link: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))
    mode: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))
    scale: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))
    offset: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))
    snaplen: np.ndarray = field(default_factory=lambda: np.zeros(4, np.int64))
    n: int = 0

    def add(self, link: int, mode: int, scale: int, offset_ns: int, snaplen: int) -> int:
        if self.n == len(self.link):
            for name in ("link", "mode", "scale", "offset", "snaplen"):
                arr = getattr(self, name)
                setattr(self, name, np.concatenate([arr, np.zeros(len(arr), np.int64)]))
        i = self.n
        self.link[i], self.mode[i], self.scale[i] = link, mode, scale
        self.offset[i], self.snaplen[i] = offset_ns, snaplen
        self.n += 1
        return i


@dataclass(frozen=True)
class SectionHeader:
    big_endian: bool
    length: int  # whole block length


def parse_section_header(path: str, data: bytes | memoryview, file_offset: int) -> SectionHeader:
    """Byte order and block length of the section header block starting at data[0]."""
    if len(data) < 12:
        raise CaptureFormatError(path, file_offset, "file ends inside a pcapng section header")
    bom = bytes(data[8:12])
    if bom == b"\x1a\x2b\x3c\x4d":
        big = True
    elif bom == b"\x4d\x3c\x2b\x1a":
        big = False
    else:
        raise CaptureFormatError(path, file_offset + 8, "bad pcapng byte-order magic", "0x" + bom.hex())
    (length,) = struct.unpack_from(">I" if big else "<I", data, 4)
    if length < 28 or length % 4 != 0 or length > MAX_RECORD:
        raise CaptureFormatError(path, file_offset + 4, "bad pcapng section header length", length)
    (major,) = struct.unpack_from(">H" if big else "<H", data, 12) if len(data) >= 14 else (1,)
    if major != 1:
        raise CaptureFormatError(path, file_offset + 12, "unsupported pcapng major version", major)
    return SectionHeader(big, length)


def ts_resolution(tsresol: int | None) -> tuple[int, int]:
    """(mode, scale) converting pcapng timestamp units to ns for an if_tsresol byte."""
    if tsresol is None:
        return TS_MUL, 1000  # default: microseconds
    exp = tsresol & 0x7F
    if tsresol & 0x80:
        return TS_POW2, exp
    if exp <= 9:
        return TS_MUL, 10 ** (9 - exp)
    return TS_DIV, 10 ** min(exp - 9, 18)


def parse_interface(path: str, data: bytes | memoryview, big: bool, file_offset: int
                    ) -> tuple[int, int, int, int, int]:
    """(link, mode, scale, offset_ns, snaplen) of the interface description block in `data`."""
    e = ">" if big else "<"
    blen = len(data)
    if blen < 20:
        raise CaptureFormatError(path, file_offset, "pcapng interface block too short", blen)
    link, _reserved, snaplen = struct.unpack_from(e + "HHI", data, 8)
    tsresol = None
    offset_s = 0
    p, stop = 16, blen - 4
    while p + 4 <= stop:
        code, olen = struct.unpack_from(e + "HH", data, p)
        if code == 0:
            break
        if p + 4 + olen > stop:
            raise CaptureFormatError(path, file_offset + p, "pcapng interface option runs past its block", olen)
        if code == 9 and olen >= 1:
            tsresol = data[p + 4]
        elif code == 14 and olen >= 8:
            (offset_s,) = struct.unpack_from(e + "q", data, p + 4)
        p += 4 + ((olen + 3) & ~3)
    mode, scale = ts_resolution(tsresol)
    return link, mode, scale, offset_s * _NS, snaplen
