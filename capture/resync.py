"""Finding the next readable record after broken framing in a pcap or pcapng file.

A classic pcap file has no markers between records: one corrupt length field and every later
record is lost to a reader that stops there. As pcapfix and Wireshark's repair tools do, the
reader instead scans forward for the next offset where `RESYNC_CHAIN` consecutive records
look right, and goes on from there (counting the bytes skipped):

- pcap: a record header is plausible when its captured length is at most max(snaplen,
  262144) and at most its wire length, the wire length is at most `MAX_WIRE_LEN`, the
  sub-second part is below one second, and its seconds lie within a day of the last good
  packet (any time when there is none). One random 16-byte window passes with a probability
  of well under 1e-6; four in a chain, each found where the previous one ends, do not.
- pcapng: a block is plausible when its type is a standard one, its length is a multiple of
  4 between 12 and `MAX_RECORD`, and the length repeated at its end is the same; a section
  header (magic and byte-order mark) is a resynchronisation point by itself.

At the end of the file a chain may be shorter: it is accepted when its records end exactly
at the end, or when two complete records precede a final partial one (the reader then
reports that one as truncated).
"""

from __future__ import annotations

from capture.pcapfile import (
    BT_EPB,
    BT_IDB,
    BT_OPB,
    BT_SPB,
    MAX_RECORD,
    PCAP_RECORD_HEADER_LEN,
    PCAPNG_BOM,
    PCAPNG_SHB,
    rd16,
    rd32,
)
from common.jit import ngjit

#: consecutive plausible records that make a resynchronisation point
RESYNC_CHAIN = 4
#: the largest wire length taken as plausible (jumbo frames and TSO/GRO super-packets
#: are below it)
MAX_WIRE_LEN = 262144
#: how far (seconds) a record's time may lie from the last good packet's
TIME_WINDOW_S = 86400

RS_FOUND = 0        # a chain starts at the returned offset
RS_NEED_DATA = 1    # a chain may start at the returned offset: more bytes are needed
RS_NONE = 2         # no chain starts before the returned offset (keep the bytes from it)

_BT_NRB, _BT_ISB, _BT_DSB, _BT_CB, _BT_CB_NOCOPY = 4, 5, 0x0A, 0x0BAD, 0x40000BAD


@ngjit
def _enough_at_end(p, fill, complete):
    """At the end of the file, a shorter chain of `complete` whole records: enough when they
    end exactly at the end, or two of them precede a partial record or trailing bytes."""
    return (p == fill and complete >= 1) or complete >= 2


@ngjit
def _pcap_record(buf, q, big, frac_limit, max_caplen, sec_lo, sec_hi):
    """The captured length of a plausible pcap record header at q, else -1."""
    caplen = rd32(buf, q + 8, big)
    wirelen = rd32(buf, q + 12, big)
    if caplen > max_caplen or caplen > wirelen or wirelen > MAX_WIRE_LEN:
        return -1
    sec = rd32(buf, q, big)
    if rd32(buf, q + 4, big) >= frac_limit or sec < sec_lo or sec > sec_hi:
        return -1
    return caplen


@ngjit
def resync_pcap(buf, start, fill, eof, big, frac_limit, max_caplen, sec_lo, sec_hi):
    """(offset, status): the first q >= start where a chain of plausible records begins."""
    for q in range(start, fill):
        p = q
        n = 0
        status = RS_FOUND
        while n < RESYNC_CHAIN:
            if p + PCAP_RECORD_HEADER_LEN > fill:
                if not eof:
                    status = RS_NEED_DATA
                else:
                    status = RS_FOUND if _enough_at_end(p, fill, n - (p > fill)) else RS_NONE
                break
            caplen = _pcap_record(buf, p, big, frac_limit, max_caplen, sec_lo, sec_hi)
            if caplen < 0:
                status = RS_NONE
                break
            p += PCAP_RECORD_HEADER_LEN + caplen
            n += 1
        if status != RS_NONE:
            return q, status
    return max(start, fill - PCAP_RECORD_HEADER_LEN + 1), RS_NONE


@ngjit
def _pcapng_block(buf, q, fill, big):
    """The length of a plausible pcapng block at q; 0 when its end is beyond `fill`; -1 when
    it is not one; -2 for a section header (checked by its byte-order mark)."""
    btype = rd32(buf, q, big)
    if btype == PCAPNG_SHB:
        if q + 12 > fill:
            return 0
        bom = rd32(buf, q + 8, False)
        return -2 if bom == PCAPNG_BOM or rd32(buf, q + 8, True) == PCAPNG_BOM else -1
    if not (btype == BT_EPB or btype == BT_SPB or btype == BT_IDB or btype == BT_OPB
            or btype == _BT_NRB or btype == _BT_ISB or btype == _BT_DSB or btype == _BT_CB
            or btype == _BT_CB_NOCOPY):
        return -1
    blen = rd32(buf, q + 4, big)
    if blen < 12 or blen % 4 != 0 or blen > MAX_RECORD:
        return -1
    if q + blen > fill:
        return 0
    return blen if rd32(buf, q + blen - 4, big) == blen else -1


@ngjit
def resync_section(buf, start, fill, eof):
    """(offset, status): the first q >= start (4-byte steps) where a valid pcapng section
    header begins: its type, a byte-order mark, a plausible length repeated at its end, major
    version 1. After a damaged section header or interface description the blocks up to the
    next section cannot be read (their byte order or interfaces are lost): reading resumes
    there."""
    q = start
    while q < fill:
        if q + 16 > fill:
            if not eof:
                return q, RS_NEED_DATA
            break
        if rd32(buf, q, False) == PCAPNG_SHB:
            big = rd32(buf, q + 8, True) == PCAPNG_BOM
            if big or rd32(buf, q + 8, False) == PCAPNG_BOM:
                blen = rd32(buf, q + 4, big)
                major = rd16(buf, q + 12, big)
                if blen >= 28 and blen % 4 == 0 and blen <= MAX_RECORD and major == 1:
                    if q + blen > fill:
                        # its end is not here yet; at the end of the file, a section cut
                        # short: the reader reports that one as truncated
                        return q, RS_NEED_DATA if not eof else RS_FOUND
                    if rd32(buf, q + blen - 4, big) == blen:
                        return q, RS_FOUND
        q += 4
    return q, RS_NONE


@ngjit
def resync_pcapng(buf, start, fill, eof, big):
    """(offset, status): the first q >= start (4-byte steps from start: blocks are 32-bit
    aligned) where a chain of plausible blocks begins, or a section header."""
    for q in range(start, fill, 4):
        p = q
        n = 0
        status = RS_FOUND
        while n < RESYNC_CHAIN:
            blen = 0 if p + 8 > fill else _pcapng_block(buf, p, fill, big)
            if blen == -2:
                break               # a section header: found (it resets the byte order)
            if blen == 0:           # the block is not wholly in the buffer
                if not eof:
                    status = RS_NEED_DATA
                else:
                    status = RS_FOUND if _enough_at_end(p, fill, n) else RS_NONE
                break
            if blen < 0:
                status = RS_NONE
                break
            p += blen
            n += 1
        if status != RS_NONE:
            return q, status
    return start + max(0, (fill - 8 - start) // 4 * 4), RS_NONE
