"""The Numba frame decoder: link header, VLAN, MPLS, IPv4/IPv6, TCP/UDP/ICMP of each frame into one row.

The framing kernels of `capture.pcapfile` locate each record in a chunk of the file (time,
lengths, where its frame starts, its link type); `decode_rows` then runs `decode_frame` on
each frame and writes every column of its row exactly once (batch buffers are reused, so
nothing may be left over from an earlier batch). Nothing here raises: a frame that cannot be
decoded fully keeps the layers it got and a reason code (`capture.schema.REASONS`).

Decisions a user may need to know:
- Tunnels (IP in IP, IPv6 in IPv4, GRE, GTP ...) are reported by their OUTER IP header and its
  next protocol (4, 41, 47, UDP to port 2152 ...); the inner packet is not decoded.
- An IPv4 fragment is flagged (`is_fragment`, `frag_offset` in bytes, layer bit L_FRAG); the
  first fragment (offset 0) still has its transport header decoded, later ones have none.
  IPv6 walks hop-by-hop, routing, fragment, destination-options and AH headers to the
  transport header; `protocol` is the last next-header value found.
- `eth_type` is the ethertype after VLAN tags; links without one get the equivalent ethertype
  of what they carry (0x0800 / 0x86DD for IP over PPP, BSD null/loop, Linux cooked), except
  raw-IP link types, which have 0 as `capture.schema` says.
- Linux cooked captures (SLL, SLL2) carry only the sender's link address: it goes to
  `srcMAC` when it is 6 bytes long; `destMAC` stays 0 and L_ETH is not set.
- TCP/UDP `payload_len` comes from the IP length (so it is right under a short snaplen); a TCP
  data offset pointing beyond the IP payload is reported as `bad_tcp_offset`.
- An IP length beyond the wire length is `bad_ip_length`, but the transport header is still
  decoded from what was captured (as tshark does); IPv4 total length 0 is TCP segmentation
  offload (the host captured before the NIC split the segment): `ip_len` becomes the length
  on the wire, reason ok.
- MPLS (0x8847/0x8848): the label stack is skipped and the IP version taken from the payload.
- pcapng timestamps past the int64 ns range (year 2262; seen in files whose writer put
  seconds in the high word) saturate at 2**63 - 1.
"""

from __future__ import annotations

from collections import namedtuple
from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from capture.schema import (
    COLUMNS,
    L_ETH,
    L_FRAG,
    L_ICMP,
    L_IPV4,
    L_IPV6,
    L_TCP,
    L_UDP,
    L_VLAN,
    REASON_CODES,
)
from common.jit import ngjit

# `decode_frame` is inlined into `decode_rows` at Numba-IR level (same options as ngjit
# otherwise): a real call per frame is slower; the small byte readers are left to LLVM,
# which inlines them anyway and compiles faster. `decode_rows` binds the column arrays to
# locals once: reading them from the tuple per packet costs reference-count operations on
# every packet.
inline_jit = numba.njit(inline="always", cache=True, nogil=True)

# --- link types (pcap LINKTYPE_* values as they appear in files) ------------------------------
LINK_NULL = 0
LINK_ETHERNET = 1
LINK_PPP = 9
LINK_RAW_12 = 12
LINK_RAW_14 = 14
LINK_PPP_HDLC = 50
LINK_RAW = 101
LINK_C_HDLC = 104
LINK_LOOP = 108
LINK_SLL = 113
LINK_IPV4 = 228
LINK_IPV6 = 229
LINK_SLL2 = 276

#: link types the decoder understands, with their names for messages
LINK_NAMES: dict[int, str] = {
    LINK_NULL: "BSD null", LINK_ETHERNET: "Ethernet", LINK_PPP: "PPP", LINK_RAW_12: "raw IP",
    LINK_RAW_14: "raw IP", LINK_PPP_HDLC: "PPP in HDLC framing", LINK_RAW: "raw IP",
    LINK_C_HDLC: "Cisco HDLC", LINK_LOOP: "OpenBSD loop", LINK_SLL: "Linux cooked (SLL)",
    LINK_IPV4: "raw IPv4", LINK_IPV6: "raw IPv6", LINK_SLL2: "Linux cooked v2 (SLL2)",
}
SUPPORTED_LINKS = frozenset(LINK_NAMES)

# reason codes as plain ints for the kernel (schema.REASONS is the source of truth)
R_OK = REASON_CODES["ok"]
R_LINK = REASON_CODES["truncated_link_header"]
R_VLAN = REASON_CODES["truncated_vlan_tag"]
R_NON_IP = REASON_CODES["non_ip_ethertype"]
R_IP_TRUNC = REASON_CODES["truncated_ip_header"]
R_IP_VERSION = REASON_CODES["bad_ip_version"]
R_IHL = REASON_CODES["bad_ihl"]
R_IP_LEN = REASON_CODES["bad_ip_length"]
R_EXT = REASON_CODES["truncated_ipv6_ext_header"]
R_TRANSPORT = REASON_CODES["truncated_transport_header"]
R_TCP_OFF = REASON_CODES["bad_tcp_offset"]
R_UNSUPPORTED = REASON_CODES["unsupported_link_type"]
R_RECORD = REASON_CODES["bad_record_length"]

ETH_IPV4 = 0x0800
ETH_IPV6 = 0x86DD
ETH_MPLS = 0x8847
ETH_MPLS_MC = 0x8848
_MAX_MPLS_LABELS = 8
_MAPPED = np.uint64(0x0000_FFFF_0000_0000)
_MAX_VLAN_TAGS = 8
_MAX_IPV6_EXT = 16

#: the output of the kernels: every physical column (named as in schema.COLUMNS), the file
#: offset of each record, and per-row scratch the framing kernels fill for `decode_rows`:
#: where the frame starts in the buffer, its link type, and whether its record lengths are
#: inconsistent. Numba reads the arrays by attribute.
_EXTRA = ("record_offset", "data_offset", "link_type", "bad_record")
if TYPE_CHECKING:
    DecodeColumns = Any   # its fields come from the schema at import time: mypy cannot see them
else:
    DecodeColumns = namedtuple("DecodeColumns", [c.name for c in COLUMNS] + list(_EXTRA))


def make_columns(n: int) -> DecodeColumns:
    """Preallocated output arrays for `n` rows (reused batch after batch)."""
    arrays = [np.zeros(n, c.dtype) for c in COLUMNS]
    return DecodeColumns(*arrays, np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                         np.zeros(n, np.uint8))


@ngjit
def be16(b, p):
    return (np.int64(b[p]) << 8) | np.int64(b[p + 1])


@ngjit
def be32(b, p):
    return (np.int64(b[p]) << 24) | (np.int64(b[p + 1]) << 16) | (np.int64(b[p + 2]) << 8) | np.int64(b[p + 3])


@ngjit
def le32(b, p):
    return (np.int64(b[p + 3]) << 24) | (np.int64(b[p + 2]) << 16) | (np.int64(b[p + 1]) << 8) | np.int64(b[p])


@ngjit
def be48(b, p):
    return np.uint64((be16(b, p) << 32) | be32(b, p + 2))


@ngjit
def be64(b, p):
    return (np.uint64(be32(b, p)) << np.uint64(32)) | np.uint64(be32(b, p + 4))


@ngjit
def _ppp_ethertype(proto):
    """Equivalent ethertype of a PPP protocol number (0: not IP)."""
    if proto == 0x0021:
        return ETH_IPV4
    if proto == 0x0057:
        return ETH_IPV6
    return 0


@ngjit
def _null_ethertype(family):
    """Equivalent ethertype of a BSD address family (AF_INET6 differs between the BSDs)."""
    if family == 2:
        return ETH_IPV4
    if family == 10 or family == 24 or family == 28 or family == 30:
        return ETH_IPV6
    return 0


@inline_jit
def decode_frame(buf, off, caplen, wirelen, link):
    """Decode the frame at buf[off : off + caplen] (wire length `wirelen`): the row's values.

    Returns (layers, reason, eth_type, vlan, srcMAC, destMAC, ipversion, srcIP_hi, srcIP_lo,
    destIP_hi, destIP_lo, protocol, ttl, tos, ip_len, is_fragment, frag_offset, srcPort,
    destPort, flags, seq, ack, win, payload_len, icmp_type, icmp_code, payload_at): the last,
    not a column, is where the TCP/UDP payload starts in the frame (0 without one), for the
    payload column of `capture.payload`.
    """
    end = off + caplen
    layers = 0
    reason = R_OK
    eth_type = 0
    vlan = 0
    smac = np.uint64(0)
    dmac = np.uint64(0)
    ipver = 0
    shi = np.uint64(0)
    slo = np.uint64(0)
    dhi = np.uint64(0)
    dlo = np.uint64(0)
    proto = 0
    ttl = 0
    tos = 0
    ip_len = 0
    is_frag = 0
    frag_off = 0
    sport = 0
    dport = 0
    flags = 0
    seq = 0
    ack = 0
    win = 0
    payload = 0
    payload_at = 0
    itype = 0
    icode = 0
    bad_len = False  # IP length beyond the wire length: decoded as far as possible, then flagged

    p = off
    # net: what starts at p after the link layer: 4 / 6 = IP of that version (from the link
    # header), -1 = IP of the version its first nibble says (raw links), 0 = not IP
    net = 0
    # one pass through a loop so that each failure can `break` to the common stores
    while True:
        # ---------------- link layer -> ethertype (or raw IP) ----------------
        et = -2  # -2: no ethertype (raw link); otherwise the ethertype to dispatch on
        if link == LINK_ETHERNET:
            if caplen < 14:
                reason = R_LINK
                break
            dmac = be48(buf, p)
            smac = be48(buf, p + 6)
            layers |= L_ETH
            et = be16(buf, p + 12)
            p += 14
        elif link == LINK_RAW or link == LINK_RAW_12 or link == LINK_RAW_14:
            net = -1
        elif link == LINK_IPV4:
            net = 4
        elif link == LINK_IPV6:
            net = 6
        elif link == LINK_SLL:
            if caplen < 16:
                reason = R_LINK
                break
            if be16(buf, p + 4) == 6:
                smac = be48(buf, p + 6)
            et = be16(buf, p + 14)
            p += 16
        elif link == LINK_SLL2:
            if caplen < 20:
                reason = R_LINK
                break
            if buf[p + 11] == 6:
                smac = be48(buf, p + 12)
            et = be16(buf, p)
            p += 20
        elif link == LINK_NULL or link == LINK_LOOP:
            if caplen < 4:
                reason = R_LINK
                break
            if link == LINK_LOOP:
                family = be32(buf, p)
            else:
                # host byte order of the capturing machine: a family never exceeds 0xFFFF
                family = be32(buf, p)
                if family > 0xFFFF:
                    family = le32(buf, p)
            et = _null_ethertype(family)
            p += 4
        elif link == LINK_PPP or link == LINK_PPP_HDLC or link == LINK_C_HDLC:
            if caplen < 2:
                reason = R_LINK
                break
            b0 = buf[p]
            if b0 == 0x0F or b0 == 0x8F:
                # Cisco HDLC: address, control, ethertype
                if caplen < 4:
                    reason = R_LINK
                    break
                et = be16(buf, p + 2)
                p += 4
            else:
                if b0 == 0xFF and buf[p + 1] == 0x03:
                    p += 2  # HDLC-like framing: address 0xFF, control 0x03
                if p + 1 > end:
                    reason = R_LINK
                    break
                if buf[p] & 1:
                    pp = np.int64(buf[p])  # protocol-field compression: one byte
                    p += 1
                else:
                    if p + 2 > end:
                        reason = R_LINK
                        break
                    pp = be16(buf, p)
                    p += 2
                et = _ppp_ethertype(pp)
        else:
            reason = R_UNSUPPORTED
            break

        if et != -2:
            # 802.1Q / 802.1ad / QinQ tags: the outermost id is the packet's VLAN
            ntags = 0
            while (et == 0x8100 or et == 0x88A8 or et == 0x9100 or et == 0x9200) and ntags < _MAX_VLAN_TAGS:
                if p + 4 > end:
                    reason = R_VLAN
                    break
                if ntags == 0:
                    vlan = be16(buf, p) & 0x0FFF
                    layers |= L_VLAN
                et = be16(buf, p + 2)
                p += 4
                ntags += 1
            if reason != R_OK:
                break
            eth_type = et
            if et == ETH_IPV4:
                net = 4
            elif et == ETH_IPV6:
                net = 6
            elif et == ETH_MPLS or et == ETH_MPLS_MC:
                # pop the label stack; what follows the bottom label is IP of the version its
                # first nibble says (MPLS itself does not tell)
                bottom = False
                nlabels = 0
                while not bottom and nlabels < _MAX_MPLS_LABELS:
                    if p + 4 > end:
                        break
                    bottom = (buf[p + 2] & 1) != 0
                    p += 4
                    nlabels += 1
                if not bottom:
                    reason = R_LINK
                    break
                net = -1
            else:
                reason = R_NON_IP
                break

        # ---------------- network layer ----------------
        if p >= end:
            reason = R_IP_TRUNC
            break
        version = np.int64(buf[p]) >> 4
        if net == -1:
            net = version
        if version != net or (net != 4 and net != 6):
            reason = R_IP_VERSION
            break
        wire_left = wirelen - (p - off)  # bytes of this IP packet on the wire
        ip_start = p
        if net == 4:
            if p + 20 > end:
                reason = R_IP_TRUNC
                break
            ihl = (np.int64(buf[p]) & 0x0F) * 4
            if ihl < 20:
                reason = R_IHL
                break
            if p + ihl > end:
                reason = R_IP_TRUNC
                break
            ipver = 4
            layers |= L_IPV4
            tos = buf[p + 1]
            ip_len = be16(buf, p + 2)
            ff = be16(buf, p + 6)
            ttl = buf[p + 8]
            proto = buf[p + 9]
            slo = _MAPPED | np.uint64(be32(buf, p + 12))
            dlo = _MAPPED | np.uint64(be32(buf, p + 16))
            frag_off = (ff & 0x1FFF) * 8
            if (ff & 0x2000) != 0 or frag_off != 0:
                is_frag = 1
                layers |= L_FRAG
            if ip_len == 0:
                # TCP segmentation offload: the capturing host saw the segment before the NIC
                # filled in the length; the frame is the packet (as Wireshark assumes)
                ip_len = wire_left
            if ip_len < ihl:
                reason = R_IP_LEN
                break
            if ip_len > wire_left:
                # the header claims more than the wire carried: keep decoding what is there
                bad_len = True
            if frag_off != 0:
                break  # a later fragment: no transport header here
            p += ihl
        else:
            if p + 40 > end:
                reason = R_IP_TRUNC
                break
            ipver = 6
            layers |= L_IPV6
            tos = (be16(buf, p) >> 4) & 0xFF
            ip_len = be16(buf, p + 4) + 40
            nxt = np.int64(buf[p + 6])
            ttl = buf[p + 7]
            shi = be64(buf, p + 8)
            slo = be64(buf, p + 16)
            dhi = be64(buf, p + 24)
            dlo = be64(buf, p + 32)
            proto = nxt
            if ip_len > wire_left:
                bad_len = True
            p += 40
            nhops = 0
            later_fragment = False
            while nhops < _MAX_IPV6_EXT and (nxt == 0 or nxt == 43 or nxt == 44 or nxt == 60 or nxt == 51):
                if p + 8 > end:
                    reason = R_EXT
                    break
                if nxt == 44:
                    fo = be16(buf, p + 2)
                    frag_off = fo & 0xFFF8
                    is_frag = 1
                    layers |= L_FRAG
                    hlen = 8
                    if frag_off != 0:
                        later_fragment = True
                elif nxt == 51:
                    hlen = (np.int64(buf[p + 1]) + 2) * 4
                else:
                    hlen = (np.int64(buf[p + 1]) + 1) * 8
                nxt = np.int64(buf[p])
                p += hlen
                nhops += 1
                if later_fragment:
                    break
            proto = nxt
            if reason != R_OK or later_fragment:
                break
            if p > ip_start + min(ip_len, wire_left):
                reason = R_IP_LEN
                break
            if p > end:
                reason = R_EXT
                break

        # ---------------- transport layer ----------------
        # bytes of transport header + payload, from the IP length (bounded by the wire length)
        transport_len = ip_start + min(ip_len, wire_left) - p
        if proto == 6:
            if p + 20 > end:
                reason = R_TRANSPORT
                break
            sport = be16(buf, p)
            dport = be16(buf, p + 2)
            seq = be32(buf, p + 4)
            ack = be32(buf, p + 8)
            doff = (np.int64(buf[p + 12]) >> 4) * 4
            flags = buf[p + 13]
            win = be16(buf, p + 14)
            layers |= L_TCP
            if doff < 20 or doff > transport_len:
                reason = R_TCP_OFF
                break
            payload = transport_len - doff
            payload_at = p + doff - off
        elif proto == 17:
            if p + 8 > end:
                reason = R_TRANSPORT
                break
            sport = be16(buf, p)
            dport = be16(buf, p + 2)
            layers |= L_UDP
            if transport_len < 8:
                reason = R_IP_LEN
                break
            payload = transport_len - 8
            payload_at = p + 8 - off
        elif (proto == 1 and net == 4) or (proto == 58 and net == 6):
            if p + 2 > end:
                reason = R_TRANSPORT
                break
            itype = buf[p]
            icode = buf[p + 1]
            layers |= L_ICMP
        break

    if bad_len and reason == R_OK:
        reason = R_IP_LEN

    return (layers, reason, eth_type, vlan, smac, dmac, ipver, shi, slo, dhi, dlo, proto, ttl, tos,
            ip_len, is_frag, frag_off, sport, dport, flags, seq, ack, win, payload, itype, icode,
            payload_at)


@ngjit
def decode_rows(buf, out, start, stop):
    """Decode rows [start, stop) of `out` whose frames the framing kernels located in `buf`.

    Per row the framing kernels filled `len`, `caplen`, `data_offset` (frame start in `buf`),
    `link_type` (-1: a pcapng interface never described -> unsupported_link_type) and
    `bad_record` (inconsistent record lengths -> bad_record_length, after decoding).

    The column arrays are bound to locals once: reading them from the tuple inside the loop
    would cost reference-count operations per packet.
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
    for i in range(start, stop):
        r = decode_frame(buf, c_data[i], np.int64(c_caplen[i]), np.int64(c_len[i]), c_link[i])
        c_layers[i] = r[0]
        c_reason[i] = R_RECORD if c_bad[i] and r[1] != R_UNSUPPORTED else r[1]
        c_eth_type[i] = r[2]
        c_vlan[i] = r[3]
        c_src_mac[i] = r[4]
        c_dest_mac[i] = r[5]
        c_ipversion[i] = r[6]
        c_src_hi[i] = r[7]
        c_src_lo[i] = r[8]
        c_dest_hi[i] = r[9]
        c_dest_lo[i] = r[10]
        c_protocol[i] = r[11]
        c_ttl[i] = r[12]
        c_tos[i] = r[13]
        c_ip_len[i] = r[14]
        c_is_fragment[i] = r[15]
        c_frag_offset[i] = r[16]
        c_src_port[i] = r[17]
        c_dest_port[i] = r[18]
        c_flags[i] = r[19]
        c_seq[i] = r[20]
        c_ack[i] = r[21]
        c_win[i] = r[22]
        c_payload_len[i] = r[23]
        c_icmp_type[i] = r[24]
        c_icmp_code[i] = r[25]
