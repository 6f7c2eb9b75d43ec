"""The packets of one synthetic link, produced in chunks: arrival times, TCP connection state, sizes, disorder.

`iter_link_packets(cfg, link)` yields dicts of columns (names as in capture.schema plus
`ip_id`, `icmp_id`, `icmp_seq`, `flow`, `reverse`) in record order, about CHUNK rows at a
time, so a capture of any length is generated in bounded memory (12 bytes per packet for the
time and flow columns, plus one chunk). CHUNK is fixed: it takes part in the random streams,
so the same config always gives the same bytes.

Per-flow state that runs across the whole link (rank of a packet within its flow, payload
sent so far in each direction) lives in small per-flow arrays updated by one Numba pass per
chunk; everything else is numpy over columns. Disorder keeps a carry of the rows that may
still be overtaken by later chunks: band disorder emits, sorted by arrival, the rows that
arrive before the next chunk's first timestamp; block-sorted disorder emits complete blocks.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from common.errors import ConfigError
from common.jit import ngjit
from tools.gen.flows import FlowTable, flow_table
from tools.gen.frames import (
    ETH_LEN,
    ICMP_LEN,
    IPV4_LEN,
    IPV6_LEN,
    PROTO_TCP,
    PROTO_UDP,
    TCP_LEN,
    UDP_LEN,
)

CHUNK = 1 << 18
MIN_FRAME = 60               # Ethernet minimum without FCS: shorter frames are padded
SIZE_MIXES: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "imix": ((60, 590, 1514), (7 / 12, 4 / 12, 1 / 12)),
    "bimodal": ((60, 1514), (0.55, 0.45)),
    "trimodal": ((60, 576, 1514), (0.5, 0.3, 0.2)),
}
F_FIN, F_SYN, F_PSH, F_ACK = 0x01, 0x02, 0x08, 0x10
_U64 = np.uint64


def size_mix(spec: str) -> tuple[np.ndarray, np.ndarray, tuple[int, int] | None]:
    """(sizes, probabilities, uniform range or None) of a size spec; ConfigError if unknown."""
    s = spec.strip().lower()
    if s in SIZE_MIXES:
        sizes, probs = SIZE_MIXES[s]
        return np.array(sizes, np.int64), np.array(probs), None
    try:
        if s.startswith("fixed:"):
            n = int(s[6:])
            if not 1 <= n <= 65535:
                raise ValueError
            return np.array([n], np.int64), np.array([1.0]), None
        if s.startswith("uniform:"):
            a, b = (int(x) for x in s[8:].split("-"))
            if not 1 <= a <= b <= 65535:
                raise ValueError
            return np.array([a], np.int64), np.array([1.0]), (a, b)
    except ValueError:
        pass
    raise ConfigError(f"unknown packet-size spec {spec!r} (allowed: {', '.join(SIZE_MIXES)}, "
                      f"fixed:N, uniform:A-B with sizes 1 .. 65535 bytes)")


def _sizes(rng, spec: str, n: int) -> np.ndarray:
    sizes, probs, uniform = size_mix(spec)
    if uniform is not None:
        return rng.integers(uniform[0], uniform[1] + 1, n)
    if len(sizes) == 1:
        return np.full(n, sizes[0], np.int64)
    return sizes[np.searchsorted(np.cumsum(probs), rng.random(n), side="right").clip(0, len(sizes) - 1)]


# --- times and flows of a whole link (12 bytes per packet) ------------------------------------

def _sorted_offsets(rng, n: int, span: int) -> np.ndarray:
    """n sorted times in [0, span): uniform order statistics (a Poisson process given n), no sort."""
    t = rng.exponential(1.0, n + 1)
    np.cumsum(t, out=t)                      # in place: this array is the largest of a link
    t *= span / t[-1]
    return t[:-1].astype(np.int64)


def link_times(cfg, link: int, ft: FlowTable) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """(timestamps sorted, flow of each packet, silent gaps) of a link, before disorder."""
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, link, 0x11A]))
    n = cfg.link_packets_count(link)
    F = cfg.n_flows
    if ft.popularity is not None:
        flow = np.searchsorted(ft.popularity, rng.random(n), side="right").clip(0, F - 1).astype(np.int32)
    else:
        flow = rng.integers(0, F, n, dtype=np.int32)
    if link not in cfg.quiet_links and n >= F:
        # every flow at least once, at random places: the file holds exactly the flows asked for
        flow[rng.choice(n, F, replace=False)] = np.arange(F, dtype=np.int32)
    lulls = link in cfg.lull_links()
    span = cfg.duration_ns - cfg.lulls * cfg.lull_ns if lulls else cfg.duration_ns
    if cfg.flow_duration_ns > 0:
        fstart = rng.integers(0, span, F)
        flife = np.minimum(rng.exponential(cfg.flow_duration_ns, F).astype(np.int64), span - 1 - fstart)
        t = fstart[flow] + (rng.random(n) * flife[flow]).astype(np.int64)
        order = np.argsort(t, kind="stable")
        t, flow = t[order], flow[order]
        del order
    else:
        t = _sorted_offsets(rng, n, span)
    gaps: list[tuple[int, int]] = []
    res = 1 if cfg.nanosecond else 1000
    base = cfg.start_ns - link * cfg.skew_ns
    if lulls:
        active = cfg.duration_ns - cfg.lulls * cfg.lull_ns
        at = np.sort(rng.integers(0, active, cfg.lulls))     # gap k opens at active time at[k]
        t += np.searchsorted(at, t, side="right").astype(np.int64) * cfg.lull_ns
        for k, a in enumerate(at.tolist()):
            lo, hi = base + a + k * cfg.lull_ns, base + a + (k + 1) * cfg.lull_ns
            gaps.append((lo, hi - hi % res))      # silent as the file shows it (floored timestamps)
    t += base
    t -= t % res                                  # the file's resolution: columns equal the file
    return t, flow, gaps


# --- per-flow connection state, one pass per chunk ----------------------------------------------

@ngjit
def _connection_pass(flow, size, coin_rev, coin_push, counts, proto, bidir, hdr, isn_f, isn_r,
                     seen, sent_f, sent_r, rank, rev, flags, ip_len, seq, ack):
    """Rank, direction, flags, IP length, seq and ack of each packet, in time order.

    seen / sent_f / sent_r are per-flow state carried from chunk to chunk.
    """
    for i in range(flow.shape[0]):
        f = flow[i]
        r = seen[f]
        seen[f] = r + 1
        rank[i] = r
        tcp = proto[f] == 6
        bi = bidir[f]
        synack = tcp and bi and r == 1
        back = bi and r >= 1 and (coin_rev[i] < 0.5 or synack)
        syn = tcp and r == 0
        fin = tcp and r >= 1 and r == counts[f] - 1 and not synack
        h = hdr[f]
        if syn or synack or fin:
            length = h
        else:
            length = size[i] - 14
            if length < h:
                length = h
            if length > 65535:
                length = 65535
        pay = length - h
        ip_len[i] = length
        rev[i] = back
        if tcp:
            fl = 0x10
            if syn:
                fl = 0x02
            elif synack:
                fl = 0x12
            elif fin:
                fl = 0x11
            elif pay > 0 and coin_push[i] < 0.5:
                fl = 0x18
            flags[i] = fl
            if back:
                seq[i] = (isn_r[f] if synack else isn_r[f] + 1 + sent_r[f]) & 0xFFFFFFFF
                ack[i] = (isn_f[f] + 1 + sent_f[f]) & 0xFFFFFFFF
            else:
                seq[i] = (isn_f[f] if syn else isn_f[f] + 1 + sent_f[f]) & 0xFFFFFFFF
                ack[i] = 0 if syn else (isn_r[f] + 1 + (sent_r[f] if bi else 0)) & 0xFFFFFFFF
        else:
            flags[i] = 0
            seq[i] = 0
            ack[i] = 0
        if back:
            sent_r[f] += pay
        else:
            sent_f[f] += pay


def _chunk_columns(cfg, link: int, ft: FlowTable, state: dict, ts: np.ndarray, flow: np.ndarray,
                   rng) -> dict[str, np.ndarray]:
    """Every column of a time-ordered run of packets (state: the per-flow arrays)."""
    n = len(ts)
    rank = np.empty(n, np.int64)
    rev = np.empty(n, np.bool_)
    flags = np.empty(n, np.uint8)
    ip_len = np.empty(n, np.int64)
    seq = np.empty(n, np.int64)
    ack = np.empty(n, np.int64)
    _connection_pass(flow, _sizes(rng, cfg.sizes, n), rng.random(n), rng.random(n), state["counts"],
                     ft.protocol, ft.bidir, state["hdr"], ft.isn_fwd, ft.isn_rev, state["seen"],
                     state["sent_f"], state["sent_r"], rank, rev, flags, ip_len, seq, ack)
    proto = ft.protocol[flow]
    v6 = ft.ipversion[flow] == 6
    icmp = (proto != PROTO_TCP) & (proto != PROTO_UDP)
    wire = np.maximum(ip_len + ETH_LEN, MIN_FRAME)
    sp, dp = ft.sport[flow], ft.dport[flow]
    mac_a = _U64(0x0200_0000_0001 | (link << 8))
    mac_b = _U64(0x0200_0000_0002 | (link << 8))
    src_hi, src_lo, dst_hi, dst_lo = ft.src_hi[flow], ft.src_lo[flow], ft.dst_hi[flow], ft.dst_lo[flow]
    return {
        "timestamp": ts,
        "len": wire.astype(np.uint32),
        "caplen": np.minimum(wire, cfg.snaplen).astype(np.uint32),
        "eth_type": np.where(v6, 0x86DD, 0x0800).astype(np.uint16),
        "srcMAC": np.where(rev, mac_b, mac_a),
        "destMAC": np.where(rev, mac_a, mac_b),
        "ipversion": ft.ipversion[flow],
        "srcIP_hi": np.where(rev, dst_hi, src_hi),
        "srcIP_lo": np.where(rev, dst_lo, src_lo),
        "destIP_hi": np.where(rev, src_hi, dst_hi),
        "destIP_lo": np.where(rev, src_lo, dst_lo),
        "protocol": proto,
        "ttl": np.where(rev, ft.ttl_rev[flow], ft.ttl_fwd[flow]),
        "tos": ft.tos[flow],
        "ip_len": ip_len.astype(np.uint32),
        "ip_id": ((ft.ip_id[flow] + rank) & 0xFFFF).astype(np.uint16),
        "srcPort": np.where(rev, dp, sp),
        "destPort": np.where(rev, sp, dp),
        "flags": flags,
        "seq": seq.astype(np.uint32),
        "ack": ack.astype(np.uint32),
        "win": np.where(proto == PROTO_TCP, ft.win[flow], 0).astype(np.uint16),
        # as capture.schema: a TCP/UDP field (0 for ICMP, whose echo data is not a transport payload)
        "payload_len": np.where(icmp, 0, ip_len - state["hdr"][flow]).astype(np.uint32),
        "icmp_type": np.where(icmp, np.where(v6, np.where(rev, 129, 128), np.where(rev, 0, 8)), 0).astype(np.uint8),
        "icmp_code": np.zeros(n, np.uint8),
        "icmp_id": np.where(icmp, ft.icmp_id[flow], 0).astype(np.uint16),
        "icmp_seq": np.where(icmp, rank & 0xFFFF, 0).astype(np.uint16),
        "flow": flow,
        "reverse": rev.view(np.uint8),
    }


# --- disorder with a carry across chunks --------------------------------------------------------

def _concat(a: dict | None, b: dict) -> dict:
    return b if a is None else {k: np.concatenate([a[k], b[k]]) for k in b}


def _take(cols: dict, idx) -> dict:
    return {k: v[idx] for k, v in cols.items()}


def iter_link_packets(cfg, link: int, flows: FlowTable | None = None, meta: dict | None = None,
                      chunk: int = CHUNK) -> Iterator[dict[str, np.ndarray]]:
    """Column chunks of link `link` in record (arrival) order; `meta` (if given) gets `lulls_ns`.

    `chunk` bounds the rows generated at a time; it takes part in the random streams (the same
    chunk gives the same packets), so keep the default unless testing the carry across chunks.
    """
    cfg.validate()
    ft = flow_table(cfg) if flows is None else flows
    ts, flow, gaps = link_times(cfg, link, ft)
    if meta is not None:
        meta["lulls_ns"] = gaps
    F = cfg.n_flows
    v6 = ft.ipversion == 6
    proto = ft.protocol
    th = np.where(proto == PROTO_TCP, TCP_LEN, np.where(proto == PROTO_UDP, UDP_LEN, ICMP_LEN))
    state = {"counts": np.bincount(flow, minlength=F).astype(np.int64),
             "hdr": (np.where(v6, IPV6_LEN, IPV4_LEN) + th).astype(np.int64),
             "seen": np.zeros(F, np.int64), "sent_f": np.zeros(F, np.int64), "sent_r": np.zeros(F, np.int64)}
    n = len(ts)
    first_block = int(ts[0] // cfg.block_ns) if cfg.block_ns else 0
    carry, carry_key = None, None
    for c, lo in enumerate(range(0, n, chunk)):
        hi = min(lo + chunk, n)
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, link, 0xC4, c]))
        cols = _chunk_columns(cfg, link, ft, state, ts[lo:hi], flow[lo:hi], rng)
        if cfg.disorder == "none":
            yield cols
            continue
        if cfg.disorder == "band":
            late = rng.random(hi - lo) < cfg.disorder_share
            key = cols["timestamp"] + np.where(late, (rng.random(hi - lo) * cfg.max_delay_ns).astype(np.int64), 0)
            bound = ts[hi] if hi < n else None         # no later row arrives before its own timestamp
        else:
            # block numbers relative to the first one, so the float key keeps its fraction
            key = (cols["timestamp"] // cfg.block_ns - first_block).astype(np.float64)
            key += rng.random(hi - lo) * 0.999          # random order inside a block
            bound = float(ts[hi] // cfg.block_ns - first_block) if hi < n else None   # earlier blocks are complete
        cols = _concat(carry, cols)
        key = key if carry_key is None else np.concatenate([carry_key, key])
        order = np.argsort(key, kind="stable")
        ready = len(order) if bound is None else int(np.searchsorted(key[order], bound, side="left"))
        if ready:
            yield _take(cols, order[:ready])
        rest = order[ready:]
        carry, carry_key = (_take(cols, rest), key[rest]) if len(rest) else (None, None)
    if carry is not None:           # only reached when the last chunk's carry is non-empty
        yield carry


def link_packets(cfg, link: int, flows: FlowTable | None = None, chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """All packets of link `link` as one dict of columns, in record order (for tests and small runs)."""
    parts = list(iter_link_packets(cfg, link, flows, chunk=chunk))
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
