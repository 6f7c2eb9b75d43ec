"""The Numba kernels of CSV record sources (`capture.records`): lines cut into field offsets,
and per-type parsers over one field of every row, strict as `capture.records` describes.

Each parser skips rows already bad (`status != 0`) and marks a bad value with its `code`, so
the first bad field of a record is the reason it is skipped; none raises.
"""

from __future__ import annotations

import numpy as np

from common.jit import ngjit


@ngjit
def split_lines(buf, pos, end, final, sep, nneed, fstart, fend, nfields, llen, lineno, line,
                maxrows):
    """Cut whole lines of buf[pos:end] into fields: per row the start and end of its first
    `nneed` fields, its field count, its byte length and line number. A last line without
    its newline is taken only when `final`. Blank lines are skipped (counted as lines).
    Returns (rows, next position, last line number)."""
    row = 0
    while row < maxrows and pos < end:
        nl = pos
        while nl < end and buf[nl] != 10:
            nl += 1
        if nl == end and not final:
            break
        nxt = nl + 1 if nl < end else end
        stop = nl
        line += 1
        if stop > pos and buf[stop - 1] == 13:
            stop -= 1
        if stop == pos:
            pos = nxt
            continue
        k = 0
        s = pos
        i = pos
        while True:
            if i == stop or buf[i] == sep:
                if k < nneed:
                    fstart[row, k] = s
                    fend[row, k] = i
                k += 1
                if i == stop:
                    break
                s = i + 1
            i += 1
        nfields[row] = k
        llen[row] = nxt - pos
        lineno[row] = line
        row += 1
        pos = nxt
    return row, pos, line


@ngjit
def _trim(buf, s, e):
    while s < e and (buf[s] == 32 or buf[s] == 9):
        s += 1
    while e > s and (buf[e - 1] == 32 or buf[e - 1] == 9):
        e -= 1
    return s, e


@ngjit
def parse_integers(buf, fstart, fend, n, col, lo, hi_mag, signed, out, status, code):
    """Decimal integers of field `col` into `out` (int64 bits; the caller views uint64 for
    unsigned kinds): optional spaces and sign (a '-' only when `signed`), digits, a
    magnitude of at most `hi_mag` (positive) or `lo` (the magnitude of the negative bound).
    A row already bad (status != 0) is skipped; a bad value sets status to `code`."""
    for r in range(n):
        if status[r] != 0:
            continue
        s, e = _trim(buf, fstart[r, col], fend[r, col])
        neg = False
        if s < e and (buf[s] == 43 or buf[s] == 45):
            neg = buf[s] == 45
            s += 1
        if s == e or (neg and not signed):
            status[r] = code
            continue
        limit = lo if neg else hi_mag
        v = np.uint64(0)
        ok = True
        for i in range(s, e):
            d = np.int64(buf[i]) - 48
            if d < 0 or d > 9:
                ok = False
                break
            if v > (limit - np.uint64(d)) // np.uint64(10):
                ok = False
                break
            v = v * np.uint64(10) + np.uint64(d)
        if not ok:
            status[r] = code
            continue
        if neg:
            out[r] = np.int64(np.uint64(0) - v)
        else:
            out[r] = np.int64(v)


@ngjit
def parse_bools(buf, fstart, fend, n, col, out):
    """GS-lite's bool: exactly the four letters TRUE, in any case, is 1; anything else 0."""
    for r in range(n):
        s = fstart[r, col]
        e = fend[r, col]
        out[r] = 0
        if e - s == 4 and (buf[s] | 32) == 116 and (buf[s + 1] | 32) == 114 \
                and (buf[s + 2] | 32) == 117 and (buf[s + 3] | 32) == 101:
            out[r] = 1


@ngjit
def parse_ipv4s(buf, fstart, fend, n, col, out, status, code):
    """Dotted quads (%u.%u.%u.%u, each at most 255) as IPv4-mapped uint64."""
    for r in range(n):
        if status[r] != 0:
            continue
        s, e = _trim(buf, fstart[r, col], fend[r, col])
        v = np.uint64(0)
        parts = 0
        ok = True
        i = s
        while ok and parts < 4:
            d = 0
            x = 0
            while i < e and 48 <= buf[i] <= 57 and d < 4:
                x = x * 10 + (buf[i] - 48)
                d += 1
                i += 1
            if d == 0 or d > 3 or x > 255:
                ok = False
                break
            v = (v << np.uint64(8)) | np.uint64(x)
            parts += 1
            if parts < 4:
                if i < e and buf[i] == 46:
                    i += 1
                else:
                    ok = False
        if not ok or i != e:
            status[r] = code
            continue
        out[r] = np.uint64(0x0000_FFFF_0000_0000) | v


@ngjit
def _hex(c):
    if 48 <= c <= 57:
        return c - 48
    c |= 32
    if 97 <= c <= 102:
        return c - 87
    return -1


@ngjit
def parse_ipv6s(buf, fstart, fend, n, col, hi, lo, status, code):
    """IPv6 addresses: eight groups of 1-4 hex digits, or fewer around one `::`."""
    before = np.zeros(8, np.uint64)
    after = np.zeros(8, np.uint64)
    for r in range(n):
        if status[r] != 0:
            continue
        s, e = _trim(buf, fstart[r, col], fend[r, col])
        nb = 0
        na = 0
        dc = False
        ok = True
        i = s
        if e - s >= 2 and buf[s] == 58 and buf[s + 1] == 58:
            dc = True
            i = s + 2
        elif i < e and buf[i] == 58:
            ok = False
        while ok and i < e:
            v = 0
            d = 0
            while i < e and d < 5:
                h = _hex(buf[i])
                if h < 0:
                    break
                v = v * 16 + h
                d += 1
                i += 1
            if d == 0 or d > 4 or nb + na >= 8:
                ok = False
                break
            if dc:
                after[na] = v
                na += 1
            else:
                before[nb] = v
                nb += 1
            if i == e:
                break
            if buf[i] != 58:
                ok = False
                break
            i += 1
            if i < e and buf[i] == 58:
                if dc:
                    ok = False
                    break
                dc = True
                i += 1
            elif i == e:
                ok = False
        if ok and ((dc and nb + na > 7) or (not dc and nb != 8)):
            ok = False
        if not ok:
            status[r] = code
            continue
        h = np.uint64(0)
        low = np.uint64(0)
        for g in range(8):
            if g < nb:
                x = before[g]
            elif g >= 8 - na:
                x = after[g - (8 - na)]
            else:
                x = np.uint64(0)
            if g < 4:
                h = (h << np.uint64(16)) | x
            else:
                low = (low << np.uint64(16)) | x
        hi[r] = h
        lo[r] = low


@ngjit
def gather_fields(buf, fstart, fend, n, col, status, offsets, data):
    """The bytes of field `col` of every good row (status 0; others empty) as an Arrow
    binary array's buffers: `offsets` (n + 1 int32) and `data` (returned: bytes used)."""
    total = 0
    offsets[0] = 0
    for r in range(n):
        if status[r] == 0:
            s = fstart[r, col]
            e = fend[r, col]
            for i in range(s, e):
                data[total] = buf[i]
                total += 1
        offsets[r + 1] = total
    return total
