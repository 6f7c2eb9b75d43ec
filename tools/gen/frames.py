"""Frame bytes of synthetic packets: Ethernet, IPv4/IPv6 and TCP/UDP/ICMP headers with exact lengths and checksums, built column-wise.

`build_frames(cols)` takes the packet columns of `tools.gen.traffic.link_packets` (names as in
capture.schema plus `ip_id`, `icmp_id`, `icmp_seq`) and returns the first 74 bytes of every
frame as an (n x 74) uint8 array; bytes past the headers are zero, and so is every payload
byte, which is why the TCP/UDP/ICMPv6 checksums can be computed from the header fields alone.
"""

from __future__ import annotations

import numpy as np

ETH_LEN, IPV4_LEN, IPV6_LEN, TCP_LEN, UDP_LEN, ICMP_LEN = 14, 20, 40, 20, 8, 8
PROTO_TCP, PROTO_UDP, PROTO_ICMP, PROTO_ICMPV6 = 6, 17, 1, 58
FRAME_PREFIX = ETH_LEN + IPV6_LEN + TCP_LEN    # widest header block built (74 bytes)
_U64 = np.uint64


def _fold(s: np.ndarray) -> np.ndarray:
    """Internet checksum of a 32/64-bit sum of 16-bit words."""
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def _words64(x: np.ndarray) -> np.ndarray:
    """Sum of the four 16-bit words of a uint64 column."""
    x = x.astype(_U64)
    m = _U64(0xFFFF)
    return ((x & m) + ((x >> _U64(16)) & m) + ((x >> _U64(32)) & m) + (x >> _U64(48))).astype(np.int64)


def _be(block: np.ndarray, off: int, values, nbytes: int) -> None:
    """Write `values` big-endian into block[:, off:off+nbytes]."""
    dt = {1: "u1", 2: ">u2", 4: ">u4", 8: ">u8"}[nbytes]
    v = np.ascontiguousarray(np.asarray(values).astype(dt))
    block[:, off:off + nbytes] = v.view(np.uint8).reshape(-1, nbytes)


def build_frames(cols: dict[str, np.ndarray]) -> np.ndarray:
    """The first 74 bytes of every frame (Ethernet, IP, transport headers; zeros after)."""
    n = len(cols["len"])
    out = np.zeros((n, FRAME_PREFIX), np.uint8)
    v6 = cols["ipversion"] == 6
    proto = cols["protocol"]
    _be(out, 0, cols["destMAC"].astype(_U64) << _U64(16), 8)   # 6 bytes; the next 2 are overwritten
    _be(out, 6, cols["srcMAC"].astype(_U64) << _U64(16), 8)
    _be(out, 12, cols["eth_type"], 2)
    ip_len = cols["ip_len"].astype(np.int64)
    src_hi, src_lo = cols["srcIP_hi"], cols["srcIP_lo"]
    dst_hi, dst_lo = cols["destIP_hi"], cols["destIP_lo"]
    for is6 in (False, True):
        rows = np.flatnonzero(v6 == is6)
        if not len(rows):
            continue
        blk = np.zeros((len(rows), FRAME_PREFIX - ETH_LEN), np.uint8)
        p = proto[rows]
        L = ip_len[rows]
        if not is6:
            s4 = (src_lo[rows] & _U64(0xFFFFFFFF)).astype(np.int64)
            d4 = (dst_lo[rows] & _U64(0xFFFFFFFF)).astype(np.int64)
            tos = cols["tos"][rows].astype(np.int64)
            ttl = cols["ttl"][rows].astype(np.int64)
            ipid = cols["ip_id"][rows].astype(np.int64)
            blk[:, 0] = 0x45
            blk[:, 1] = tos
            _be(blk, 2, L, 2)
            _be(blk, 4, ipid, 2)
            _be(blk, 6, np.full(len(rows), 0x4000), 2)     # DF
            blk[:, 8] = ttl
            blk[:, 9] = p
            s = ((0x45 << 8) | tos) + L + ipid + 0x4000 + ((ttl << 8) | p) \
                + (s4 >> 16) + (s4 & 0xFFFF) + (d4 >> 16) + (d4 & 0xFFFF)
            _be(blk, 10, _fold(s), 2)
            _be(blk, 12, s4, 4)
            _be(blk, 16, d4, 4)
            pseudo = (s4 >> 16) + (s4 & 0xFFFF) + (d4 >> 16) + (d4 & 0xFFFF)
            hl = IPV4_LEN
        else:
            tc = cols["tos"][rows].astype(np.int64)
            _be(blk, 0, (6 << 28) | (tc << 20), 4)
            _be(blk, 4, L - IPV6_LEN, 2)
            blk[:, 6] = p
            blk[:, 7] = cols["ttl"][rows]
            _be(blk, 8, src_hi[rows], 8)
            _be(blk, 16, src_lo[rows], 8)
            _be(blk, 24, dst_hi[rows], 8)
            _be(blk, 32, dst_lo[rows], 8)
            pseudo = _words64(src_hi[rows]) + _words64(src_lo[rows]) + _words64(dst_hi[rows]) + _words64(dst_lo[rows])
            hl = IPV6_LEN
        tl = L - hl                                   # transport length (header + payload)
        t = blk[:, hl:]
        tcp = p == PROTO_TCP
        udp = p == PROTO_UDP
        icmp = ~tcp & ~udp
        sp = cols["srcPort"][rows].astype(np.int64)
        dp = cols["destPort"][rows].astype(np.int64)
        if tcp.any():
            r = np.flatnonzero(tcp)
            seq = cols["seq"][rows][r].astype(np.int64)
            ack = cols["ack"][rows][r].astype(np.int64)
            fl = cols["flags"][rows][r].astype(np.int64)
            win = cols["win"][rows][r].astype(np.int64)
            th = np.zeros((len(r), TCP_LEN), np.uint8)
            _be(th, 0, sp[r], 2)
            _be(th, 2, dp[r], 2)
            _be(th, 4, seq, 4)
            _be(th, 8, ack, 4)
            th[:, 12] = 0x50
            th[:, 13] = fl
            _be(th, 14, win, 2)
            s = pseudo[r] + PROTO_TCP + tl[r] + sp[r] + dp[r] + (seq >> 16) + (seq & 0xFFFF) \
                + (ack >> 16) + (ack & 0xFFFF) + ((5 << 12) | fl) + win
            _be(th, 16, _fold(s), 2)
            t[r, :TCP_LEN] = th
        if udp.any():
            r = np.flatnonzero(udp)
            uh = np.zeros((len(r), UDP_LEN), np.uint8)
            _be(uh, 0, sp[r], 2)
            _be(uh, 2, dp[r], 2)
            _be(uh, 4, tl[r], 2)
            c = _fold(pseudo[r] + PROTO_UDP + 2 * tl[r] + sp[r] + dp[r])
            _be(uh, 6, np.where(c == 0, 0xFFFF, c), 2)
            t[r, :UDP_LEN] = uh
        if icmp.any():
            r = np.flatnonzero(icmp)
            typ = cols["icmp_type"][rows][r].astype(np.int64)
            iid = cols["icmp_id"][rows][r].astype(np.int64)
            iseq = cols["icmp_seq"][rows][r].astype(np.int64)
            ih = np.zeros((len(r), ICMP_LEN), np.uint8)
            ih[:, 0] = typ
            _be(ih, 4, iid, 2)
            _be(ih, 6, iseq, 2)
            s = (typ << 8) + iid + iseq
            if is6:
                s = s + pseudo[r] + PROTO_ICMPV6 + tl[r]
            _be(ih, 2, _fold(s), 2)
            t[r, :ICMP_LEN] = ih
        out[rows, ETH_LEN:] = blk
    return out


