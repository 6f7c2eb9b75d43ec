"""Numba kernels of the GDAT reader (`capture.gdat`): tuple framing, resynchronisation after
a corrupt length, fixed-width fields and string spans, each over a batch's raw bytes.

Plain arrays in, counts and status codes out; nothing raises in a loop."""

from __future__ import annotations

import numpy as np

from common.jit import ngjit, ngjit_inline

# framing events (`frame_tuples`) and resynchronisation outcomes (`find_resync`)
EV_NONE, EV_BAD_LENGTH, EV_TRUNCATED = 0, 1, 2
RS_FOUND, RS_NEED_DATA, RS_NONE = 0, 1, 2

@ngjit_inline
def _be32(buf, p):
    return (np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16) | \
        (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3])


@ngjit_inline
def _le32(buf, p):
    return (np.int64(buf[p + 3]) << 24) | (np.int64(buf[p + 2]) << 16) | \
        (np.int64(buf[p + 1]) << 8) | np.int64(buf[p])


@ngjit
def frame_tuples(buf, pos, end, final, max_len, starts, lens, maxrows):
    """Cut whole tuples of buf[pos:end]: per row its data's start and its length. Stops at
    `maxrows`, at a tuple not whole yet, at a length above `max_len` (EV_BAD_LENGTH, pos at
    it) or, when `final`, at a tuple the end cuts (EV_TRUNCATED). Returns (rows, pos, event)."""
    row = 0
    while row < maxrows:
        if pos + 4 > end:
            return row, pos, EV_TRUNCATED if final and pos < end else EV_NONE
        n = _be32(buf, pos)
        if n > max_len:
            return row, pos, EV_BAD_LENGTH
        if pos + 4 + n > end:
            return row, pos, EV_TRUNCATED if final else EV_NONE
        starts[row] = pos + 4
        lens[row] = n
        row += 1
        pos += 4 + n
    return row, pos, EV_NONE


@ngjit_inline
def _plausible(buf, p, end, fixed, max_len, vstr):
    """The end of a plausible whole tuple at p, -1 when none starts there, -2 when more bytes
    are needed to tell."""
    if p + 4 > end:
        return -2
    n = _be32(buf, p)
    if n < fixed + 1 or n > max_len:
        return -1
    q = p + 4
    if q + fixed < end and buf[q + fixed] > 2:
        return -1
    if q + n > end:
        return -2
    if buf[q + fixed] == 0:
        for k in range(len(vstr)):
            slen = _le32(buf, q + vstr[k])
            soff = _le32(buf, q + vstr[k] + 4)
            if soff + slen > n or (slen > 0 and soff <= fixed):
                return -1
    return q + n


@ngjit
def find_resync(buf, start, end, final, fixed, max_len, vstr, chain):
    """The first offset from `start` where `chain` plausible tuples follow each other (at the
    end: fewer that end exactly there, or two before a partial one): (RS_FOUND, offset),
    (RS_NEED_DATA, offset) when more bytes are needed to tell from there, or (RS_NONE, end)."""
    for p in range(start, end):
        q = p
        k = 0
        need = False
        while k < chain:
            if q == end:                # the chain reaches the bytes read so far
                need = not final
                break
            e = _plausible(buf, q, end, fixed, max_len, vstr)
            if e == -1:
                break
            if e == -2:
                need = True
                break
            k += 1
            q = e
        if k >= chain:
            return RS_FOUND, p
        if final and ((k >= 1 and q == end and not need) or (k >= 2 and need)):
            return RS_FOUND, p
        if need and not final:
            return RS_NEED_DATA, p
    return RS_NONE, end


@ngjit
def read_fixed(buf, starts, lens, n, off, width, big_endian, out, status, code):
    """Field bytes [off, off + width) of every good row as an unsigned integer (little-endian
    unless `big_endian`) into `out` (uint64); a row too short for them gets `code`."""
    for r in range(n):
        if status[r] != 0:
            continue
        if off + width > lens[r]:
            status[r] = code
            continue
        p = starts[r] + off
        v = np.uint64(0)
        for i in range(width):
            b = buf[p + i] if big_endian else buf[p + width - 1 - i]
            v = (v << np.uint64(8)) | np.uint64(b)
        out[r] = v


@ngjit
def string_spans(buf, starts, lens, n, off, sstart, send, status, short_code, bad_code):
    """The bytes of a V_STR field of every good row: [sstart, send) in `buf`; a row too short
    for its 12 bytes gets `short_code`, one whose string passes its end `bad_code`."""
    for r in range(n):
        sstart[r, 0] = 0
        send[r, 0] = 0
        if status[r] != 0:
            continue
        if off + 12 > lens[r]:
            status[r] = short_code
            continue
        p = starts[r] + off
        slen = _le32(buf, p)
        soff = _le32(buf, p + 4)
        if soff + slen > lens[r]:
            status[r] = bad_code
            continue
        sstart[r, 0] = starts[r] + soff
        send[r, 0] = starts[r] + soff + slen


@ngjit
def tuple_kinds(buf, starts, lens, n, fixed, status):
    """Mark the rows that are not records: -1 trace, -2 end of file (type byte 1, 2 after
    the fixed part), -3 empty (length 0)."""
    for r in range(n):
        if lens[r] == 0:
            status[r] = -3
        elif lens[r] > fixed:
            t = buf[starts[r] + fixed]
            if t == 1 or t == 2:
                status[r] = -np.int32(t)
