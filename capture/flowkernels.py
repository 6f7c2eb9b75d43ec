"""Numba kernel of the flow-record decoder (`capture.flowdecode`): the data records of many
NetFlow v5/v9/IPFIX data sets, decoded in one pass over their bytes with each set's template
given as arrays (the slot, the conversion and the length of each field).

Plain arrays in, counts and status codes out; nothing raises in the loop."""

from __future__ import annotations

import numpy as np

from common.jit import ngjit, ngjit_inline

# --- output slots (rows of the `out` matrix) ------------------------------------------------
S_SRC_HI, S_SRC_LO, S_DST_HI, S_DST_LO = 0, 1, 2, 3
S_SRCPORT, S_DSTPORT, S_PROTOCOL, S_TCP_FLAGS, S_TOS = 4, 5, 6, 7, 8
S_PACKETS, S_BYTES, S_FIRST, S_LAST = 9, 10, 11, 12
S_INPUT, S_OUTPUT, S_SRC_AS, S_DST_AS = 13, 14, 15, 16
S_NH_HI, S_NH_LO, S_SAMPLING, S_IPVERSION = 17, 18, 19, 20
N_SLOTS = 21

# --- field conversions (how a field's bytes become its slot's value) -----------------------
K_SKIP = 0          # not read (an unknown or enterprise element): skipped by its length
K_UINT = 1          # a big-endian unsigned integer of 1..8 bytes (reduced size included)
K_ADDR4 = 2         # an IPv4 address: slot (hi) = 0, slot + 1 (lo) = IPv4-mapped
K_ADDR6 = 3         # an IPv6 address: slot = high 64 bits, slot + 1 = low 64 bits
K_UPTIME_MS = 4     # sysUpTime ms of the flow (v5, v9 IE 21/22): epoch via the header clock
K_EPOCH_S = 5       # seconds since the epoch (IPFIX 150/151)
K_EPOCH_MS = 6      # milliseconds since the epoch (IPFIX 152/153)
K_NTP = 7           # NTP 64-bit timestamp (IPFIX 154..157)
K_NONZERO = 8       # a big-endian unsigned integer written only when not zero (ICMP type/code
                    # into destPort, nfdump's convention, without clearing a port)

#: a variable-length field (IPFIX): its length is in the record
VARLEN = 65535

# set outcomes
ST_OK, ST_TRUNCATED_RECORD, ST_FULL = 0, 1, 2

_MAPPED = np.uint64(0x0000_FFFF_0000_0000)
_NTP_EPOCH_OFFSET_S = 2208988800


@ngjit_inline
def _be(buf, p, n):
    v = np.uint64(0)
    for i in range(n):
        v = (v << np.uint64(8)) | np.uint64(buf[p + i])
    return v


@ngjit
def decode_sets(buf, set_start, set_end, set_tmpl, set_unix_ms, set_uptime_ms,
                f_count, f_slot, f_kind, f_len, out, out_set, status):
    """Decode the records of every data set `i` (buf[set_start[i]:set_end[i]], template row
    `set_tmpl[i]` of the f_* arrays) into the columns of `out` (N_SLOTS rows), each record's
    set index into `out_set`. Times are epoch ns; uptime fields use the set's datagram clock
    (`set_unix_ms` at uptime `set_uptime_ms`). A record cut by the set's end stops the set
    (`status` ST_TRUNCATED_RECORD unless the rest is padding: fewer bytes than a record's
    fixed part or all zero). Returns the number of records written."""
    n = 0
    cap = out.shape[1]
    for s in range(len(set_start)):
        t = set_tmpl[s]
        nf = f_count[t]
        p = set_start[s]
        end = set_end[s]
        status[s] = ST_OK
        fixed = 0
        for k in range(nf):
            if f_len[t, k] != VARLEN:
                fixed += f_len[t, k]
        while p < end:
            if end - p < max(fixed, 1):
                break                      # padding
            if n >= cap:
                status[s] = ST_FULL
                break
            q = p
            ok = True
            for k in range(nf):
                ln = np.int64(f_len[t, k])
                if ln == VARLEN:
                    if q + 1 > end:
                        ok = False
                        break
                    ln = np.int64(buf[q])
                    q += 1
                    if ln == 255:
                        if q + 2 > end:
                            ok = False
                            break
                        ln = (np.int64(buf[q]) << 8) | np.int64(buf[q + 1])
                        q += 2
                if q + ln > end:
                    ok = False
                    break
                kind = f_kind[t, k]
                slot = f_slot[t, k]
                if kind == K_UINT and ln <= 8:
                    out[slot, n] = _be(buf, q, ln)
                elif kind == K_NONZERO and ln <= 8:
                    v = _be(buf, q, ln)
                    if v != 0:
                        out[slot, n] = v
                elif kind == K_ADDR4 and ln == 4:
                    out[slot, n] = 0
                    out[slot + 1, n] = _MAPPED | _be(buf, q, 4)
                elif kind == K_ADDR6 and ln == 16:
                    out[slot, n] = _be(buf, q, 8)
                    out[slot + 1, n] = _be(buf, q + 8, 8)
                elif kind == K_UPTIME_MS and ln == 4:
                    up = np.int64(_be(buf, q, 4))
                    # the uptime counter wraps every 49.7 days: a flow time "after" the
                    # header's uptime by more than half the range is from before the wrap
                    d = set_uptime_ms[s] - up
                    if d < -(1 << 31):
                        d += 1 << 32
                    elif d > (1 << 31):
                        d -= 1 << 32
                    out[slot, n] = np.uint64((set_unix_ms[s] - d) * 1_000_000)
                elif kind == K_EPOCH_S and ln == 4:
                    out[slot, n] = _be(buf, q, 4) * np.uint64(1_000_000_000)
                elif kind == K_EPOCH_MS and ln == 8:
                    out[slot, n] = _be(buf, q, 8) * np.uint64(1_000_000)
                elif kind == K_NTP and ln == 8:
                    sec = np.int64(_be(buf, q, 4)) - _NTP_EPOCH_OFFSET_S
                    frac = np.int64(_be(buf, q + 4, 4))
                    out[slot, n] = np.uint64(sec * 1_000_000_000 + ((frac * 1_000_000_000) >> 32))
                q += ln
            if not ok:
                # a cut record: padding when the rest is zeros, else truncated
                zero = True
                for i in range(p, end):
                    if buf[i] != 0:
                        zero = False
                        break
                if not zero:
                    status[s] = ST_TRUNCATED_RECORD
                # the slots written so far belong to no record: clear them
                for r in range(out.shape[0]):
                    out[r, n] = 0
                break
            if q == p:
                break                      # a record of no bytes (refused with its template)
            out_set[n] = s
            n += 1
            p = q
    return n
