"""The fast decode path: `decode_frame`'s values for the common frame at a fraction of its cost, and decoding only the columns asked for.

`decode_rows` (capture.decode) runs the general `decode_frame` on every frame:
its generality (every link type, tags, tunnels, IPv6 extension headers, every malformation)
costs far more than its loads. Here the common frame (Ethernet; IPv4 with a 20-byte header,
not a fragment, or IPv6 without extension headers; consistent lengths; a complete and valid
TCP/UDP/ICMP header or another protocol) is decoded by straight-line code (`fast_frame`); every other frame still goes
through `decode_frame`, in a second loop (inlined into the first loop it slowed that loop down
for every frame), so each row gets exactly the values `decode_rows` gives it. The readers of
`capture.reader` use these kernels:

- `decode_rows_fast(buf, out, start, stop, want)`: with a column mask (`column_mask`):
  only the columns asked for are stored (the others keep what they hold: zeros in a fresh
  buffer);
- `decode_rows_flow(buf, out, start, stop)`: for a consumer of `FLOW_COLUMNS` only
  (addresses, ports, protocol: flow keys and most low-level queries), without the mask tests.

Both return how many rows needed `decode_frame` (0 for a capture of plain Ethernet/IP).
"""

from __future__ import annotations

import numpy as np

from capture.decode import (
    _MAPPED,
    ETH_IPV4,
    ETH_IPV6,
    LINK_ETHERNET,
    R_OK,
    R_RECORD,
    R_UNSUPPORTED,
    be16,
    be32,
    be48,
    be64,
    decode_frame,
    inline_jit,
)
from capture.schema import L_ETH, L_ICMP, L_IPV4, L_IPV6, L_TCP, L_UDP
from common.jit import ngjit

#: a reason code no frame gets: marks rows left for `decode_frame` in `decode_rows_fast`
_PENDING = 255

#: the columns `decode_rows` writes from `decode_frame`'s result, in the result's order
DECODED_COLUMNS = ("layers", "reason", "eth_type", "vlan", "srcMAC", "destMAC", "ipversion",
                   "srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo", "protocol", "ttl", "tos",
                   "ip_len", "is_fragment", "frag_offset", "srcPort", "destPort", "flags", "seq",
                   "ack", "win", "payload_len", "icmp_type", "icmp_code")


def column_mask(columns) -> np.ndarray:
    """The `want` mask of `decode_rows_masked` for a set of column names (None: all).

    `layers` and `reason` are always decoded: protocol selection and the malformed counts
    need them."""
    if columns is None:
        return np.ones(len(DECODED_COLUMNS), np.bool_)
    names = set(columns) | {"layers", "reason"}
    return np.array([c in names for c in DECODED_COLUMNS], np.bool_)



@inline_jit
def fast_frame(buf, off, caplen, wirelen, link, bad):
    """The fast path of `decode_rows_fast`: for the common frame (Ethernet; IPv4 with a
    20-byte header, not a fragment, or IPv6 without extension headers; lengths consistent;
    a complete and valid TCP/UDP/ICMP header or another protocol) (True, version, layers,
    protocol, ip_len, srcPort, destPort, flags, seq, ack, win, payload_len, icmp_type,
    icmp_code), values exactly as `decode_frame` gives them; for any other frame
    (False, ...) and the caller uses `decode_frame`. The caller reads the addresses, TTL and
    TOS from the frame by the version."""
    fast = False
    ver = 0
    layers = 0
    proto = 0
    ip_len = 0
    sport = 0
    dport = 0
    flags = 0
    seq = 0
    ack = 0
    win = 0
    payload = 0
    itype = 0
    icode = 0
    t = 0
    tl = 0
    if link == LINK_ETHERNET and not bad:
        e0 = buf[off + 12]
        e1 = buf[off + 13]
        if caplen >= 34 and e0 == 0x08 and e1 == 0x00 and buf[off + 14] == 0x45:
            ip_len = be16(buf, off + 16)
            ff = be16(buf, off + 20)
            # not a fragment, no TSO zero length, the length within the wire length
            if (ff & 0x3FFF) == 0 and ip_len >= 20 and ip_len <= wirelen - 14:
                ver = 4
                proto = np.int64(buf[off + 23])
                tl = ip_len - 20   # transport header + payload
                t = off + 34
                layers = L_ETH | L_IPV4
        elif caplen >= 54 and e0 == 0x86 and e1 == 0xDD and (buf[off + 14] >> 4) == 6:
            ip_len = be16(buf, off + 18) + 40
            nxt = np.int64(buf[off + 20])
            # no extension header (hop-by-hop, routing, fragment, destination options, AH),
            # the length within the wire length
            if (ip_len <= wirelen - 14 and nxt != 0 and nxt != 43 and nxt != 44
                    and nxt != 60 and nxt != 51):
                ver = 6
                proto = nxt
                tl = ip_len - 40
                t = off + 54
                layers = L_ETH | L_IPV6
    if ver != 0:
        end = off + caplen
        if proto == 6:
            if t + 20 <= end:
                doff = (np.int64(buf[t + 12]) >> 4) * 4
                if doff >= 20 and doff <= tl:
                    fast = True
                    layers |= L_TCP
                    sport = be16(buf, t)
                    dport = be16(buf, t + 2)
                    seq = be32(buf, t + 4)
                    ack = be32(buf, t + 8)
                    flags = np.int64(buf[t + 13])
                    win = be16(buf, t + 14)
                    payload = tl - doff
        elif proto == 17:
            if t + 8 <= end and tl >= 8:
                fast = True
                layers |= L_UDP
                sport = be16(buf, t)
                dport = be16(buf, t + 2)
                payload = tl - 8
        elif (proto == 1 and ver == 4) or (proto == 58 and ver == 6):
            if t + 2 <= end:
                fast = True
                layers |= L_ICMP
                itype = np.int64(buf[t])
                icode = np.int64(buf[t + 1])
        else:
            fast = True
    return (fast, ver, layers, proto, ip_len, sport, dport, flags, seq, ack, win, payload,
            itype, icode)


#: the columns `decode_rows_flow` writes (with timestamp, len, caplen from the framing)
FLOW_COLUMNS = frozenset(("layers", "reason", "ipversion", "srcIP_hi", "srcIP_lo", "destIP_hi",
                          "destIP_lo", "protocol", "srcPort", "destPort"))


@ngjit
def decode_rows_flow(buf, out, start, stop):
    """`decode_rows` for a reader asked only for `FLOW_COLUMNS` (addresses, ports, protocol:
    what flow keys and most low-level queries read): the same values in those columns,
    straight-line stores without the column mask's tests (the fast path then costs about
    what its loads cost). Other columns are not written."""
    c_len = out.len
    c_caplen = out.caplen
    c_layers = out.layers
    c_reason = out.reason
    c_ipversion = out.ipversion
    c_src_hi = out.srcIP_hi
    c_src_lo = out.srcIP_lo
    c_dest_hi = out.destIP_hi
    c_dest_lo = out.destIP_lo
    c_protocol = out.protocol
    c_src_port = out.srcPort
    c_dest_port = out.destPort
    c_data = out.data_offset
    c_link = out.link_type
    c_bad = out.bad_record
    pending = 0
    for i in range(start, stop):
        off = c_data[i]
        r = fast_frame(buf, off, np.int64(c_caplen[i]), np.int64(c_len[i]), c_link[i], c_bad[i])
        if r[0]:
            c_layers[i] = r[2]
            c_reason[i] = R_OK
            if r[1] == 4:
                c_ipversion[i] = 4
                c_src_hi[i] = 0
                c_src_lo[i] = _MAPPED | np.uint64(be32(buf, off + 26))
                c_dest_hi[i] = 0
                c_dest_lo[i] = _MAPPED | np.uint64(be32(buf, off + 30))
            else:
                c_ipversion[i] = 6
                c_src_hi[i] = be64(buf, off + 22)
                c_src_lo[i] = be64(buf, off + 30)
                c_dest_hi[i] = be64(buf, off + 38)
                c_dest_lo[i] = be64(buf, off + 46)
            c_protocol[i] = r[3]
            c_src_port[i] = r[5]
            c_dest_port[i] = r[6]
        else:
            c_reason[i] = _PENDING
            pending += 1
    if pending == 0:
        return 0
    for i in range(start, stop):
        if c_reason[i] != _PENDING:
            continue
        r = decode_frame(buf, c_data[i], np.int64(c_caplen[i]), np.int64(c_len[i]), c_link[i])
        c_layers[i] = r[0]
        c_reason[i] = R_RECORD if c_bad[i] and r[1] != R_UNSUPPORTED else r[1]
        c_ipversion[i] = r[6]
        c_src_hi[i] = r[7]
        c_src_lo[i] = r[8]
        c_dest_hi[i] = r[9]
        c_dest_lo[i] = r[10]
        c_protocol[i] = r[11]
        c_src_port[i] = r[17]
        c_dest_port[i] = r[18]
    return pending


@ngjit
def decode_rows_fast(buf, out, start, stop, want):
    """`decode_rows` with a fast path and a column mask: the same rows, fewer stores.

    The common frame (Ethernet; IPv4 of 20-byte header, not a fragment, or IPv6 without
    extension headers; lengths consistent; TCP/UDP/ICMP header complete and valid, or another
    protocol) is decoded by straight-line code here (`decode_frame`'s generality costs far
    more than its loads); every other frame goes through `decode_frame`, so each row gets exactly the
    values `decode_rows` gives it. Only the columns with `want[k]` set (k in
    `DECODED_COLUMNS` order; see `column_mask`) are stored: the others keep what they hold.
    """
    c_len = out.len
    c_caplen = out.caplen
    c_layers = out.layers
    c_reason = out.reason
    c_eth_type = out.eth_type
    c_vlan = out.vlan
    c_src_mac = out.srcMAC
    c_dest_mac = out.destMAC
    c_ipversion = out.ipversion
    c_src_hi = out.srcIP_hi
    c_src_lo = out.srcIP_lo
    c_dest_hi = out.destIP_hi
    c_dest_lo = out.destIP_lo
    c_protocol = out.protocol
    c_ttl = out.ttl
    c_tos = out.tos
    c_ip_len = out.ip_len
    c_is_fragment = out.is_fragment
    c_frag_offset = out.frag_offset
    c_src_port = out.srcPort
    c_dest_port = out.destPort
    c_flags = out.flags
    c_seq = out.seq
    c_ack = out.ack
    c_win = out.win
    c_payload_len = out.payload_len
    c_icmp_type = out.icmp_type
    c_icmp_code = out.icmp_code
    c_data = out.data_offset
    c_link = out.link_type
    c_bad = out.bad_record
    w2, w3, w4, w5, w6 = want[2], want[3], want[4], want[5], want[6]
    w7, w8, w9, w10, w11 = want[7], want[8], want[9], want[10], want[11]
    w12, w13, w14, w15, w16 = want[12], want[13], want[14], want[15], want[16]
    w17, w18, w19, w20, w21 = want[17], want[18], want[19], want[20], want[21]
    w22, w23, w24, w25 = want[22], want[23], want[24], want[25]
    pending = 0
    for i in range(start, stop):
        off = c_data[i]
        (fast, ver, layers, proto, ip_len, sport, dport, flags, seq, ack, win, payload, itype,
         icode) = fast_frame(buf, off, np.int64(c_caplen[i]), np.int64(c_len[i]), c_link[i],
                             c_bad[i])
        if fast:
            c_layers[i] = layers
            c_reason[i] = R_OK
            if w4:
                c_src_mac[i] = be48(buf, off + 6)
            if w5:
                c_dest_mac[i] = be48(buf, off)
            if w11:
                c_protocol[i] = proto
            if ver == 4:
                eth = ETH_IPV4
                shi = np.uint64(0)
                slo = _MAPPED | np.uint64(be32(buf, off + 26))
                dhi = np.uint64(0)
                dlo = _MAPPED | np.uint64(be32(buf, off + 30))
                ttl = np.int64(buf[off + 22])
                tos = np.int64(buf[off + 15])
            else:
                eth = ETH_IPV6
                shi = be64(buf, off + 22)
                slo = be64(buf, off + 30)
                dhi = be64(buf, off + 38)
                dlo = be64(buf, off + 46)
                ttl = np.int64(buf[off + 21])
                tos = (be16(buf, off + 14) >> 4) & 0xFF
            if w2:
                c_eth_type[i] = eth
            if w6:
                c_ipversion[i] = ver
            if w7:
                c_src_hi[i] = shi
            if w8:
                c_src_lo[i] = slo
            if w9:
                c_dest_hi[i] = dhi
            if w10:
                c_dest_lo[i] = dlo
            if w12:
                c_ttl[i] = ttl
            if w13:
                c_tos[i] = tos
            if w3:
                c_vlan[i] = 0
            if w14:
                c_ip_len[i] = ip_len
            if w15:
                c_is_fragment[i] = 0
            if w16:
                c_frag_offset[i] = 0
            if w17:
                c_src_port[i] = sport
            if w18:
                c_dest_port[i] = dport
            if w19:
                c_flags[i] = flags
            if w20:
                c_seq[i] = seq
            if w21:
                c_ack[i] = ack
            if w22:
                c_win[i] = win
            if w23:
                c_payload_len[i] = payload
            if w24:
                c_icmp_type[i] = itype
            if w25:
                c_icmp_code[i] = icode
        if not fast:
            c_reason[i] = _PENDING
            pending += 1
    if pending == 0:
        return 0
    # the rest in a second loop: decode_frame inlined into the loop above slows that loop
    # down for every frame
    for i in range(start, stop):
        if c_reason[i] != _PENDING:
            continue
        r = decode_frame(buf, c_data[i], np.int64(c_caplen[i]), np.int64(c_len[i]), c_link[i])
        c_layers[i] = r[0]
        c_reason[i] = R_RECORD if c_bad[i] and r[1] != R_UNSUPPORTED else r[1]
        if w2:
            c_eth_type[i] = r[2]
        if w3:
            c_vlan[i] = r[3]
        if w4:
            c_src_mac[i] = r[4]
        if w5:
            c_dest_mac[i] = r[5]
        if w6:
            c_ipversion[i] = r[6]
        if w7:
            c_src_hi[i] = r[7]
        if w8:
            c_src_lo[i] = r[8]
        if w9:
            c_dest_hi[i] = r[9]
        if w10:
            c_dest_lo[i] = r[10]
        if w11:
            c_protocol[i] = r[11]
        if w12:
            c_ttl[i] = r[12]
        if w13:
            c_tos[i] = r[13]
        if w14:
            c_ip_len[i] = r[14]
        if w15:
            c_is_fragment[i] = r[15]
        if w16:
            c_frag_offset[i] = r[16]
        if w17:
            c_src_port[i] = r[17]
        if w18:
            c_dest_port[i] = r[18]
        if w19:
            c_flags[i] = r[19]
        if w20:
            c_seq[i] = r[20]
        if w21:
            c_ack[i] = r[21]
        if w22:
            c_win[i] = r[22]
        if w23:
            c_payload_len[i] = r[23]
        if w24:
            c_icmp_type[i] = r[24]
        if w25:
            c_icmp_code[i] = r[25]
    return pending
