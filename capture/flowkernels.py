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
    # the common widths spelled out: a loop of unknown count per field costs more than the
    # record's other work
    if n == 4:
        return ((np.uint64(buf[p]) << np.uint64(24)) | (np.uint64(buf[p + 1]) << np.uint64(16))
                | (np.uint64(buf[p + 2]) << np.uint64(8)) | np.uint64(buf[p + 3]))
    if n == 2:
        return (np.uint64(buf[p]) << np.uint64(8)) | np.uint64(buf[p + 1])
    if n == 1:
        return np.uint64(buf[p])
    v = np.uint64(0)
    for i in range(n):
        v = (v << np.uint64(8)) | np.uint64(buf[p + i])
    return v


@ngjit_inline
def _uptime_ns(up, unix_ms, uptime_ms):
    """A flow time of `up` ms of uptime, epoch ns, by the header's clock (`unix_ms` at
    uptime `uptime_ms`)."""
    # the uptime counter wraps every 49.7 days: a flow time "after" the header's uptime by
    # more than half the range is from before the wrap
    d = uptime_ms - up
    if d < -(1 << 31):
        d += 1 << 32
    elif d > (1 << 31):
        d -= 1 << 32
    return np.uint64((unix_ms - d) * 1_000_000)


@ngjit_inline
def _put(buf, q, ln, kind, r, r2, n, out, unix_ms, uptime_ms):
    """Field bytes buf[q:q+ln] of `kind` into out[r, n] (an address's low half into row
    `r2`); a length the kind does not take writes nothing."""
    if kind == K_UINT and ln <= 8:
        out[r, n] = _be(buf, q, ln)
    elif kind == K_NONZERO and ln <= 8:
        v = _be(buf, q, ln)
        if v != 0:
            out[r, n] = v
    elif kind == K_ADDR4 and ln == 4:
        out[r, n] = 0
        out[r2, n] = _MAPPED | _be(buf, q, 4)
    elif kind == K_ADDR6 and ln == 16:
        out[r, n] = _be(buf, q, 8)
        out[r2, n] = _be(buf, q + 8, 8)
    elif kind == K_UPTIME_MS and ln == 4:
        out[r, n] = _uptime_ns(np.int64(_be(buf, q, 4)), unix_ms, uptime_ms)
    elif kind == K_EPOCH_S and ln == 4:
        out[r, n] = _be(buf, q, 4) * np.uint64(1_000_000_000)
    elif kind == K_EPOCH_MS and ln == 8:
        out[r, n] = _be(buf, q, 8) * np.uint64(1_000_000)
    elif kind == K_NTP and ln == 8:
        sec = np.int64(_be(buf, q, 4)) - _NTP_EPOCH_OFFSET_S
        frac = np.int64(_be(buf, q + 4, 4))
        out[r, n] = np.uint64(sec * 1_000_000_000 + ((frac * 1_000_000_000) >> 32))


@ngjit
def decode_sets(buf, set_start, set_end, set_tmpl, set_unix_ms, set_uptime_ms,
                f_count, f_slot, f_kind, f_len, slot_row, out, out_set, status):
    """Decode the records of every data set `i` (buf[set_start[i]:set_end[i]], template row
    `set_tmpl[i]` of the f_* arrays) into the columns of `out`, each record's set index into
    `out_set`. Slot s (S_*) goes to row `slot_row[s]` of `out`, or nowhere when that is -1
    (a column no query reads: its field is skipped by length, as an unknown one is; the two
    halves of an address have rows both or neither). Times are epoch ns; uptime fields use
    the set's datagram clock (`set_unix_ms` at uptime `set_uptime_ms`). A record cut by the
    set's end stops the set (`status` ST_TRUNCATED_RECORD unless the rest is padding: fewer
    bytes than a record's fixed part or all zero). Returns the number of records written.

    A template of fixed-length fields (most) is read by its plan: the offset, length, kind
    and rows of only the fields read, made once per run of sets of that template, so a
    record costs the fields a query reads, not all its template's."""
    n = 0
    cap = out.shape[1]
    width = f_slot.shape[1]
    p_off = np.empty(width, np.int64)
    p_len = np.empty(width, np.int64)
    p_kind = np.empty(width, np.int64)
    p_row = np.empty(width, np.int64)
    p_row2 = np.empty(width, np.int64)
    planned = -1             # the template the plan is of
    n_plan = 0
    fixed = 0
    varlen = False
    for s in range(len(set_start)):
        t = set_tmpl[s]
        nf = f_count[t]
        p = set_start[s]
        end = set_end[s]
        status[s] = ST_OK
        if t != planned:
            planned = t
            fixed = 0
            varlen = False
            n_plan = 0
            for k in range(nf):
                ln = np.int64(f_len[t, k])
                if ln == VARLEN:
                    varlen = True
                    continue
                slot = f_slot[t, k]
                if slot_row[slot] >= 0 and f_kind[t, k] != K_SKIP:
                    p_off[n_plan] = fixed
                    p_len[n_plan] = ln
                    p_kind[n_plan] = f_kind[t, k]
                    p_row[n_plan] = slot_row[slot]
                    p_row2[n_plan] = slot_row[slot + 1] if slot + 1 < len(slot_row) else -1
                    n_plan += 1
                fixed += ln
        if not varlen:
            if fixed <= 0:
                continue                   # a record of no bytes (refused with its template)
            # whole records; a rest shorter than a record is padding (and never a negative
            # count: the unsigned loops below would take it for a huge one)
            count = max(0, (end - p) // fixed)
            if count > cap - n:
                count = cap - n
                status[s] = ST_FULL
            um = set_unix_ms[s]
            upm = set_uptime_ms[s]
            # a field at a time over the set's records: its kind and length are the same in
            # each, so the inner loop is a tight one
            for j in range(n_plan):
                q = p + p_off[j]
                ln = p_len[j]
                kind = p_kind[j]
                r = p_row[j]
                r2 = p_row2[j]
                # unsigned indices in the tight loops (no negative-index check per access)
                uq = np.uint64(q)
                uf = np.uint64(fixed)
                un = np.uint64(n)
                col = out[r]
                if kind == K_UINT and ln == 4:
                    for i in range(np.uint64(count)):
                        col[un + i] = _be(buf, uq + i * uf, 4)
                elif kind == K_UINT and ln == 2:
                    for i in range(np.uint64(count)):
                        col[un + i] = _be(buf, uq + i * uf, 2)
                elif kind == K_UINT and ln == 1:
                    for i in range(np.uint64(count)):
                        col[un + i] = np.uint64(buf[uq + i * uf])
                elif kind == K_ADDR4 and ln == 4:
                    low = out[r2]
                    for i in range(np.uint64(count)):
                        col[un + i] = 0
                        low[un + i] = _MAPPED | _be(buf, uq + i * uf, 4)
                elif kind == K_UPTIME_MS and ln == 4:
                    for i in range(np.uint64(count)):
                        col[un + i] = _uptime_ns(np.int64(_be(buf, uq + i * uf, 4)), um, upm)
                else:
                    for i in range(count):
                        _put(buf, q + i * fixed, ln, kind, r, r2, n + i, out, um, upm)
            out_set[n:n + count] = s
            n += count
            continue
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
                r = slot_row[slot]
                if r >= 0 and kind != K_SKIP:
                    r2 = slot_row[slot + 1] if slot + 1 < len(slot_row) else -1
                    _put(buf, q, ln, kind, r, r2, n, out, set_unix_ms[s], set_uptime_ms[s])
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


# --- the walk over whole datagrams ---------------------------------------------------------

@ngjit_inline
def _be16(buf, p):
    return (np.int64(buf[p]) << 8) | np.int64(buf[p + 1])


@ngjit_inline
def _be32(buf, p):
    return ((np.int64(buf[p]) << 24) | (np.int64(buf[p + 1]) << 16)
            | (np.int64(buf[p + 2]) << 8) | np.int64(buf[p + 3]))


@ngjit_inline
def _find_template(tk_exp, tk_dom, tk_tid, n_tk, exp, dom, tid):
    for k in range(n_tk):
        if tk_tid[k] == tid and tk_dom[k] == dom and tk_exp[k] == exp:
            return k
    return -1


@ngjit_inline
def _find_known(buf, body, blen, exp, dom, sid, kn_exp, kn_dom, kn_sid, kn_off, kn_len,
                kn_blob):
    """The known set (`capture.flowknown`) byte-equal to buf[body:body + blen], or -1."""
    for k in range(len(kn_exp)):
        if kn_sid[k] == sid and kn_len[k] == blen and kn_dom[k] == dom and kn_exp[k] == exp:
            o = kn_off[k]
            for j in range(blen):
                if buf[body + j] != kn_blob[o + j]:
                    return -1
            return k
    return -1


@ngjit
def walk_datagrams(buf, d_start, d_len, d_exp, first,
                   tk_exp, tk_dom, tk_tid, tk_row, tk_fixed, tk_init, tk_sampling,
                   kn_exp, kn_dom, kn_sid, kn_off, kn_len, kn_rec, kn_blob,
                   sq_exp, sq_dom, sq_ver, sq_last, sq_step, sq_gaps, n_sq,
                   ctx_dom, ctx_export_s, ctx_ver,
                   s_start, s_end, s_row, s_unix_ms, s_uptime, s_dgram, s_sampling, n_sets):
    """Walk datagrams `first`, `first + 1`, ... (buf[d_start[i]:d_start[i] + d_len[i]], sent
    by exporter code d_exp[i]) while they are plain v9 / IPFIX datagrams of data sets whose
    template is known (`tk_*`, a row per (exporter, domain, template id): kernel row, fixed
    length, IPFIX boot time ms or -1, sampling interval), stepping over the template, options
    template and options data sets known unchanged (`kn_*`, `capture.flowknown`): each
    datagram's domain, export
    seconds and version go to `ctx_*[i]`, its data sets to the `s_*` arrays (from
    `n_sets[0]`, which is advanced; set bounds index `buf`), its sequence number is checked
    against `sq_*` (a row per (exporter, domain, version): the last sequence and its step,
    gaps counted; rows added from `n_sq[0]`, -1 = no room). Stops at the first datagram that
    needs more (another version, a template, options template or options data set not
    known, an unknown template, anything malformed) and returns its index (len(d_start):
    all walked); the caller reads that one its own way and calls again after it."""
    n_tk = len(tk_exp)
    cap_sq = len(sq_exp)
    for i in range(first, len(d_start)):
        p0 = d_start[i]
        ln = d_len[i]
        if ln < 20:
            return i
        version = _be16(buf, p0)
        if version == 9:
            seq = _be32(buf, p0 + 12)
            dom = _be32(buf, p0 + 16)
            secs = _be32(buf, p0 + 8)
            uptime = _be32(buf, p0 + 4)
            pos = p0 + 20
            end = p0 + ln
        elif version == 10:
            length = _be16(buf, p0 + 2)
            if length < 16 or length > ln:
                return i
            secs = _be32(buf, p0 + 4)
            seq = _be32(buf, p0 + 8)
            dom = _be32(buf, p0 + 12)
            uptime = np.int64(0)
            pos = p0 + 16
            end = p0 + length
        else:
            return i
        exp = d_exp[i]
        mark = n_sets[0]
        records = np.int64(0)
        slow = False
        while pos + 4 <= end:
            set_id = _be16(buf, pos)
            slen = _be16(buf, pos + 2)
            if slen < 4 or pos + slen > end:
                slow = True
                break
            k = -1
            if set_id >= 256:
                k = _find_template(tk_exp, tk_dom, tk_tid, n_tk, exp, dom, set_id)
                if k < 0:
                    slow = True             # held for its template
                    break
            if set_id < 256 or tk_row[k] < 0:
                # a (options) template set, or options data: on only when known unchanged
                j = _find_known(buf, pos + 4, slen - 4, exp, dom, set_id, kn_exp, kn_dom,
                                kn_sid, kn_off, kn_len, kn_blob)
                if j < 0:
                    slow = True
                    break
                records += kn_rec[j]
                pos += slen
                continue
            body = pos + 4
            blen = slen - 4
            m = n_sets[0]
            if m >= len(s_start):
                slow = True
                break
            unix_ms = secs * 1000
            up = uptime
            if version == 10:
                up = ((unix_ms - tk_init[k]) & 0xFFFF_FFFF) if tk_init[k] >= 0 else 0
                if tk_fixed[k] > 0:
                    records += blen // tk_fixed[k]
            s_start[m] = body
            s_end[m] = body + blen
            s_row[m] = tk_row[k]
            s_unix_ms[m] = unix_ms
            s_uptime[m] = up
            s_dgram[m] = i
            s_sampling[m] = tk_sampling[k]
            n_sets[0] = m + 1
            pos += slen
        if slow:
            n_sets[0] = mark
            return i
        # the sequence, as the Python reader checks it (FlowDecoder._sequence)
        step = np.int64(1) if version == 9 else records
        q = -1
        for r in range(n_sq[0]):
            if sq_exp[r] == exp and sq_dom[r] == dom and sq_ver[r] == version:
                q = r
                break
        if q < 0:
            if n_sq[0] >= cap_sq:
                n_sets[0] = mark
                return i                    # no room: the caller grows the table
            q = n_sq[0]
            n_sq[0] = q + 1
            sq_exp[q] = exp
            sq_dom[q] = dom
            sq_ver[q] = version
        elif sq_last[q] >= 0:
            ok = seq == ((sq_last[q] + sq_step[q]) & 0xFFFF_FFFF)
            if version == 10 and not ok:
                ok = seq == ((sq_last[q] + step) & 0xFFFF_FFFF)
            if not ok:
                sq_gaps[q] += 1
        sq_last[q] = seq
        sq_step[q] = step & 0xFFFF_FFFF
        ctx_dom[i] = dom
        ctx_export_s[i] = secs
        ctx_ver[i] = version
    return len(d_start)
