"""Synthetic packet batches for examples and tests: random but plausible columns, seeded.

`random_batch(n, seed, link)` gives IPv4 and IPv6 TCP/UDP/ICMP packets over a time span with a
few hosts (so groups repeat), optionally with extreme field values (`edges=True`: zeros and
maxima of every column, to exercise wrap-around and division by zero).
"""

from __future__ import annotations

import numpy as np

from capture.batch import PacketBatch
from capture.schema import COLUMNS, L_ETH, L_ICMP, L_IPV4, L_IPV6, L_TCP, L_UDP

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


def random_batch(n: int, seed: int = 0, link: str = "main", span_s: int = 600,
                 hosts: int = 16, edges: bool = False, start_ns: int = T0,
                 sort: bool = True) -> PacketBatch:
    rng = np.random.default_rng(seed)
    b = PacketBatch.empty(link, n)
    c = b.columns
    ts = rng.integers(start_ns, start_ns + span_s * NS, n)
    c["timestamp"][:] = np.sort(ts) if sort else ts
    v6 = rng.random(n) < 0.2
    kind = rng.choice(np.array([L_TCP, L_UDP, L_ICMP], dtype=np.uint16), n, p=[0.6, 0.3, 0.1])
    c["layers"][:] = L_ETH | np.where(v6, L_IPV6, L_IPV4).astype(np.uint16) | kind
    c["ipversion"][:] = np.where(v6, 6, 4)
    for side in ("srcIP", "destIP"):
        host = rng.integers(0, hosts, n).astype(np.uint64)
        v4 = np.uint64(0xFFFF_0000_0000) | (np.uint64(0x0A00_0000) + host * np.uint64(7))
        c[f"{side}_hi"][:] = np.where(v6, np.uint64(0x2001_0DB8_0000_0000), 0)
        c[f"{side}_lo"][:] = np.where(v6, host + np.uint64(1), v4)
    c["protocol"][:] = np.where(kind == L_TCP, 6, np.where(kind == L_UDP, 17, np.where(v6, 58, 1)))
    c["len"][:] = rng.integers(60, 1515, n)
    c["caplen"][:] = np.minimum(c["len"], 96)
    c["ip_len"][:] = c["len"] - 14
    c["ttl"][:] = rng.choice([1, 32, 64, 128, 255], n)
    c["tos"][:] = rng.choice([0, 0, 0, 0x10, 0xB8], n)
    c["eth_type"][:] = np.where(v6, 0x86DD, 0x0800)
    c["srcMAC"][:] = rng.integers(0, 1 << 48, n, dtype=np.uint64)
    c["destMAC"][:] = rng.integers(0, 1 << 48, n, dtype=np.uint64)
    ports = np.array([53, 80, 443, 1234, 5353, 40000, 65535], dtype=np.uint16)
    transport = kind != L_ICMP
    c["srcPort"][:] = np.where(transport, rng.choice(ports, n), 0)
    c["destPort"][:] = np.where(transport, rng.choice(ports, n), 0)
    c["flags"][:] = np.where(kind == L_TCP, rng.choice([0x02, 0x12, 0x10, 0x18, 0x11, 0x04], n), 0)
    c["seq"][:] = np.where(kind == L_TCP, rng.integers(0, 1 << 32, n), 0)
    c["ack"][:] = np.where(kind == L_TCP, rng.integers(0, 1 << 32, n), 0)
    c["win"][:] = np.where(kind == L_TCP, rng.integers(0, 1 << 16, n), 0)
    c["payload_len"][:] = np.where(transport, c["ip_len"] - 40, 0)
    c["icmp_type"][:] = np.where(kind == L_ICMP, rng.choice([0, 3, 8, 11], n), 0)
    c["icmp_code"][:] = np.where(kind == L_ICMP, rng.integers(0, 4, n), 0)
    frag = rng.random(n) < 0.05
    c["is_fragment"][:] = frag
    c["frag_offset"][:] = np.where(frag, rng.integers(0, 8000, n) * 8, 0)
    if edges and n:
        # some rows take the extreme values of every column
        pick = rng.random(n) < 0.3
        for col in COLUMNS:
            if col.name in ("timestamp", "layers", "reason"):
                continue
            info = np.iinfo(col.dtype)
            extreme = rng.choice(np.array([0, info.max], dtype=col.dtype), n)
            c[col.name][:] = np.where(pick & (rng.random(n) < 0.5), extreme, c[col.name])
    return b
