"""The flow population of a synthetic capture: (srcIP, destIP) groups, 5-tuples and their per-flow constants, shared by every link.

Group g gets a client a = g % S and a server b (S ~ sqrt(groups) clients; distinct pairs by
construction), mapped to addresses by bijections so that distinct indexes are distinct
addresses: clients in 10.0.0.0/8, servers in 172.16.0.0/12, IPv6 groups in 2001:db8::/32.
Flow f belongs to group f % groups; flows of one group differ in their ephemeral source port.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tools.gen.frames import PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP

MAX_FLOWS_PER_GROUP = 64_512                   # distinct ephemeral source ports per group
_U64 = np.uint64


def _bij(x: np.ndarray, bits: int, salt: int) -> np.ndarray:
    """A bijection of [0, 2^bits): distinct indexes give distinct addresses that look random."""
    mask = (1 << bits) - 1
    return ((x.astype(np.int64) * 0x9E3779B1 + salt) & mask).astype(np.int64)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 (for IPv6 interface identifiers)."""
    z = x.astype(_U64)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


@dataclass(frozen=True)
class FlowTable:
    """One row per flow (forward direction = client to server)."""

    group: np.ndarray
    ipversion: np.ndarray
    src_hi: np.ndarray
    src_lo: np.ndarray
    dst_hi: np.ndarray
    dst_lo: np.ndarray
    protocol: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    bidir: np.ndarray
    ttl_fwd: np.ndarray
    ttl_rev: np.ndarray
    tos: np.ndarray
    win: np.ndarray
    isn_fwd: np.ndarray
    isn_rev: np.ndarray
    ip_id: np.ndarray
    icmp_id: np.ndarray
    popularity: np.ndarray | None = field(default=None)   # cumulative weights (zipf) or None


def flow_table(cfg) -> FlowTable:
    """The flow population of a tools.gen.traffic.TrafficConfig (deterministic in cfg.seed)."""
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xF10]))
    G, F = cfg.groups, cfg.n_flows
    g = np.arange(G, dtype=np.int64)
    n_src = max(1, math.isqrt(G - 1) + 1) if G > 1 else 1
    n_dst = -(-G // n_src)
    a = g % n_src
    b = (g // n_src + a) % n_dst           # injective in g for fixed a: distinct pairs
    salt = int(rng.integers(0, 1 << 30))
    v6_groups = np.zeros(G, bool)
    n6 = int(round(cfg.ipv6 * G))
    if n6:
        v6_groups[rng.choice(G, n6, replace=False)] = True
    src4 = (0x0A000000 | _bij(a, 24, salt)).astype(_U64) | _U64(0xFFFF_0000_0000)
    dst4 = (0xAC100000 | _bij(b, 20, salt >> 3)).astype(_U64) | _U64(0xFFFF_0000_0000)
    g_src_hi = np.where(v6_groups, _U64(0x20010DB8_00010000), _U64(0))
    g_dst_hi = np.where(v6_groups, _U64(0x20010DB8_00020000), _U64(0))
    g_src_lo = np.where(v6_groups, _splitmix(a.astype(_U64) + _U64(salt)), src4)
    g_dst_lo = np.where(v6_groups, _splitmix(b.astype(_U64) ^ _U64(0x5DEECE66D)), dst4)

    f = np.arange(F, dtype=np.int64)
    grp = f % G
    k = f // G
    # protocols: ICMP only on a group's first flow (ICMP 5-tuples have no ports)
    proto = np.zeros(F, np.uint8)
    n_icmp = cfg.icmp_flows
    rest = F - n_icmp
    if n_icmp:
        proto[rng.choice(G, n_icmp, replace=False)] = PROTO_ICMP   # flows 0..G-1 have k == 0
    others = np.flatnonzero(proto == 0)
    tu = cfg.tcp + cfg.udp
    n_tcp = int(round(rest * cfg.tcp / tu)) if tu > 0 else 0
    perm = rng.permutation(others)
    proto[perm[:n_tcp]] = PROTO_TCP
    proto[perm[n_tcp:]] = PROTO_UDP
    v6 = v6_groups[grp]
    proto = np.where(v6 & (proto == PROTO_ICMP), PROTO_ICMPV6, proto).astype(np.uint8)
    # ports: distinct ephemeral source ports within a group, well-known destinations
    ghash = _bij(grp, 16, salt)
    sport = (1024 + (k * 7919 + ghash) % MAX_FLOWS_PER_GROUP).astype(np.uint16)
    tcp_ports = np.array([443, 80, 22, 25, 8080, 993, 8443, 5432])
    tcp_w = np.array([0.55, 0.25, 0.05, 0.03, 0.04, 0.03, 0.03, 0.02])
    udp_ports = np.array([53, 443, 1900, 500, 5353, 4500, 161, 514])
    udp_w = np.array([0.4, 0.3, 0.08, 0.05, 0.05, 0.05, 0.04, 0.03])
    dport = np.where(proto == PROTO_TCP, rng.choice(tcp_ports, F, p=tcp_w),
                     rng.choice(udp_ports, F, p=udp_w)).astype(np.uint16)
    icmp = (proto == PROTO_ICMP) | (proto == PROTO_ICMPV6)
    sport = np.where(icmp, 0, sport).astype(np.uint16)
    dport = np.where(icmp, 0, dport).astype(np.uint16)
    bidir = np.zeros(F, bool)
    n_bi = int(round(cfg.reverse * F))
    if n_bi:
        bidir[rng.choice(F, n_bi, replace=False)] = True
    ttl0 = rng.choice(np.array([64, 128, 255]), F, p=[0.6, 0.3, 0.1])
    ttl_fwd = (ttl0 - rng.integers(1, 20, F)).astype(np.uint8)
    ttl_rev = (rng.choice(np.array([64, 128, 255]), F, p=[0.6, 0.3, 0.1]) - rng.integers(1, 20, F)).astype(np.uint8)
    tos = rng.choice(np.array([0, 0x10, 0x28, 0xB8], np.uint8), F, p=[0.9, 0.04, 0.03, 0.03])
    win = rng.integers(1024, 65536, F).astype(np.uint16)
    isn_fwd = rng.integers(0, 1 << 32, F, dtype=np.int64)
    isn_rev = rng.integers(0, 1 << 32, F, dtype=np.int64)
    ip_id = rng.integers(0, 1 << 16, F, dtype=np.int64)
    pop = None
    if cfg.zipf > 0:
        w = 1.0 / np.arange(1, F + 1, dtype=np.float64) ** cfg.zipf
        cdf = np.cumsum(w[rng.permutation(F)])   # which flow is popular: random, same on every link
        pop = cdf / cdf[-1]
    return FlowTable(grp, np.where(v6_groups[grp], 6, 4).astype(np.uint8), g_src_hi[grp], g_src_lo[grp],
                     g_dst_hi[grp], g_dst_lo[grp], proto, sport, dport, bidir, ttl_fwd, ttl_rev, tos, win,
                     isn_fwd, isn_rev, ip_id, _bij(f, 16, 77).astype(np.uint16), pop)


# --- one link's packets ------------------------------------------------------------------------
