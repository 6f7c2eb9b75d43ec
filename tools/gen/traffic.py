"""Synthetic network traffic for oopscope's experiments: realistic packet columns and pcap files, built column-wise.

Library API (the `oopscope gen` command is a thin layer over it):

    cfg = TrafficConfig(packets=5_000_000, duration_ns=600 * NS, groups=260_000, snaplen=64)
    paths = generate(cfg, "out.pcap")        # {"l0": Path("out.pcap")}; also writes the manifest
    cols = link_packets(cfg, 0)               # dict of numpy columns of link 0, in record order
    for part in iter_link_packets(cfg, 0): ...   # the same in chunks of 256K rows (bounded memory)
    frames = build_frames(cols)               # (n x 74) uint8: the header bytes of every frame
    write_pcap(path, cols["timestamp"], frames, cols["len"], snaplen=64)   # from tools.gen.pcapwrite

The model, per link (every link draws from ONE shared flow population, so links can be
unioned and reverse-direction joins across links find partners):
- `groups` distinct (srcIP, destIP) pairs (clients 10.0.0.0/8, servers 172.16.0.0/12; IPv6
  groups in 2001:db8::/32, `ipv6` = share of groups), `flows` distinct 5-tuples (flow f belongs
  to group f % groups; flows >= groups). Every flow appears at least once in every normal link,
  so the counts in a file are exactly the counts asked for.
- Protocol shares are shares of flows (TCP, UDP, ICMP echo; ICMP has no ports, so at most one
  ICMP flow per group). Packets pick flows uniformly or by a Zipf popularity (`zipf` > 0).
- Arrival times: a Poisson process over `duration_ns` (or, with `flow_duration_ns`, each flow
  active over its own exponential lifetime). TCP flows behave like connections: the first
  packet is a SYN, with `reverse` (share of bidirectional flows) the second is the SYN-ACK from
  the server, then data (ACK, PSH|ACK when carrying payload; seq/ack advance with the payload
  of each direction) and FIN|ACK last. Bidirectional UDP/ICMP flows answer in both directions
  (ICMP echo request / reply).
- Sizes (wire length): `imix` (60/590/1514 bytes, 7:4:1), `bimodal` (60 and 1514, 55:45),
  `trimodal` (60/576/1514, 5:3:2), `fixed:N`, `uniform:A-B`. TCP control packets carry no
  payload; frames shorter than 60 bytes are padded as Ethernet pads them.
- Links: `links` files; link i's timestamps lag link 0's by `i * skew_ns` (replayed side by
  side from the same start, link i delivers data `i * skew` old: the thesis's arrival skew).
  `quiet_links` get `quiet_rate` packets per second instead of `packets`; `lulls` silent gaps of
  `lull_ns` each are cut into the quiet links (every link when there are no quiet links).
- Disorder (record order = arrival order, the timestamp is the packet's data time):
  `band`: a share of packets (`disorder_share`) arrives up to `max_delay_ns` late, so every
  timestamp is >= (largest earlier timestamp) - max_delay; `block`: time is cut into blocks of
  `block_ns` (from the epoch, like windows) and records are shuffled within each block, blocks
  in order (the NetFlow cache-purge pattern of thesis 6.1.3).
- Manifest `OUT.manifest.json` (out.pcap -> out.pcap.manifest.json): `links` (per link: link,
  file, packets, bytes, flows_present, directed_pairs, quiet, skew_ns, first_ns, last_ns,
  lulls_ns as [start, end) pairs, reverse_packets), `files`, `packets`, `groups`, `flows`,
  `seed`, `disorder` {model, max_delay_ns, share, block_ns} and the whole `config`.
- Deterministic: the same config (seed included) gives byte-identical files.
- Fast and bounded: numpy over columns, two small Numba passes (per-flow connection state,
  record packing), generated in chunks of 256K packets (memory ~12 bytes per packet plus
  one chunk).
- Headers: Ethernet II, IPv4 (IHL 5, DF, header checksum) or IPv6, TCP (data offset 5), UDP,
  ICMP/ICMPv6 echo, all lengths and checksums right (payload bytes are zeros, so the transport
  checksums are exact even when the snap length cuts the payload).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.errors import ConfigError, OopscopeError
from common.units import NS_PER_S as NS
from tools.gen.flows import MAX_FLOWS_PER_GROUP, FlowTable, flow_table
from tools.gen.frames import FRAME_PREFIX, build_frames
from tools.gen.linkpackets import (
    CHUNK,
    SIZE_MIXES,
    iter_link_packets,
    link_packets,
    size_mix,
)
from tools.gen.pcapwrite import PcapAppender, write_pcap

__all__ = [
    "NS", "DEFAULT_START_NS", "DISORDERS", "SIZE_MIXES", "CHUNK", "FRAME_PREFIX", "TrafficConfig", "FlowTable",
    "flow_table", "size_mix", "iter_link_packets", "link_packets", "build_frames", "write_pcap", "PcapAppender",
    "generate", "link_paths", "manifest_path",
]

log = logging.getLogger(__name__)

#: 2026-01-01T00:00:00Z: the default first timestamp (fixed, so files are reproducible)
DEFAULT_START_NS = 1_767_225_600 * NS
DISORDERS = ("none", "band", "block")


@dataclass(frozen=True)
class TrafficConfig:
    """Everything that determines a synthetic capture (times in ns; shares in [0, 1])."""

    packets: int = 100_000            # per normal link
    duration_ns: int = 60 * NS
    groups: int = 1_000               # distinct (srcIP, destIP) pairs, forward direction
    flows: int | None = None          # distinct 5-tuples (None: = groups)
    tcp: float = 0.8
    udp: float = 0.18
    icmp: float = 0.02
    sizes: str = "imix"
    ipv6: float = 0.0                 # share of groups that are IPv6
    snaplen: int = 65535
    nanosecond: bool = False
    links: int = 1
    skew_ns: int = 0                  # link i lags link 0 by i * skew_ns
    disorder: str = "none"            # none | band | block
    max_delay_ns: int = 0             # band: the largest lateness
    disorder_share: float = 1.0       # band: share of packets that are late
    block_ns: int = 0                 # block: block length
    reverse: float = 0.0              # share of flows with packets in both directions
    zipf: float = 0.0                 # 0: uniform flow popularity; s > 0: weight 1/rank^s
    flow_duration_ns: int = 0         # 0: every flow spans the capture; else mean flow lifetime
    quiet_links: tuple[int, ...] = ()
    quiet_rate: float = 1.0           # packets per second on a quiet link
    lulls: int = 0                    # silent gaps per affected link
    lull_ns: int = 0                  # length of each gap
    start_ns: int = DEFAULT_START_NS
    seed: int = 0

    @property
    def n_flows(self) -> int:
        return self.groups if self.flows is None else self.flows

    def link_name(self, i: int) -> str:
        return f"l{i}"

    def link_packets_count(self, i: int) -> int:
        if i in self.quiet_links:
            return max(1, int(round(self.quiet_rate * self.duration_ns / NS)))
        return self.packets

    def lull_links(self) -> tuple[int, ...]:
        if self.lulls <= 0:
            return ()
        return self.quiet_links if self.quiet_links else tuple(range(self.links))

    def validate(self) -> TrafficConfig:
        """Raise ConfigError naming the first inconsistent option; return self otherwise."""
        def bad(msg: str) -> None:
            raise ConfigError(msg)

        F = self.n_flows
        if self.packets < 1:
            bad(f"packets must be at least 1 (got {self.packets})")
        if self.duration_ns <= 0:
            bad(f"duration must be positive (got {self.duration_ns} ns)")
        if self.groups < 1:
            bad(f"groups must be at least 1 (got {self.groups})")
        if self.groups > F:
            bad(f"more groups ({self.groups}) than flows ({F}): every (srcIP, destIP) group needs a flow; "
                f"ask for flows >= groups")
        if F > self.packets:
            bad(f"more flows ({F}) than packets per link ({self.packets}): every flow needs a packet")
        if F > self.groups * MAX_FLOWS_PER_GROUP:
            bad(f"at most {MAX_FLOWS_PER_GROUP} flows per group (asked {F} flows over {self.groups} groups)")
        if self.groups > 1 << 36:
            bad(f"groups must be at most 2^36 (got {self.groups})")
        for name in ("tcp", "udp", "icmp", "ipv6", "reverse", "disorder_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0 or math.isnan(v):
                bad(f"{name} share must be within 0 .. 1 (got {v})")
        if self.tcp + self.udp + self.icmp <= 0:
            bad("the protocol shares tcp + udp + icmp must not all be 0")
        n_icmp = self.icmp_flows
        if n_icmp > self.groups:
            bad(f"ICMP share {self.icmp} gives {n_icmp} ICMP flows, but a group has at most one "
                f"(no ports): at most {self.groups} here")
        size_mix(self.sizes)  # raises ConfigError when unknown
        if not 1 <= self.snaplen <= 262144:
            bad(f"snaplen must be within 1 .. 262144 (got {self.snaplen})")
        if self.links < 1:
            bad(f"links must be at least 1 (got {self.links})")
        if self.skew_ns < 0:
            bad("skew cannot be negative")
        if self.disorder not in DISORDERS:
            bad(f"unknown disorder model {self.disorder!r} (allowed: {', '.join(DISORDERS)})")
        if self.disorder == "band" and self.max_delay_ns <= 0:
            bad("band disorder needs a positive maximum delay (--max-delay)")
        if self.disorder == "block" and self.block_ns <= 0:
            bad("block-sorted disorder needs a positive block length (--block)")
        if self.disorder != "band" and self.max_delay_ns:
            bad("a maximum delay only applies to band disorder (--disorder band)")
        if self.disorder != "block" and self.block_ns:
            bad("a block length only applies to block-sorted disorder (--disorder block)")
        if self.zipf < 0:
            bad(f"zipf exponent cannot be negative (got {self.zipf})")
        if self.flow_duration_ns < 0:
            bad("flow duration cannot be negative")
        for q in self.quiet_links:
            if not 0 <= q < self.links:
                bad(f"quiet link {q} does not exist (links are 0 .. {self.links - 1})")
        if self.quiet_rate <= 0:
            bad(f"quiet rate must be positive (got {self.quiet_rate})")
        if self.lulls < 0 or self.lull_ns < 0:
            bad("lulls and lull length cannot be negative")
        if (self.lulls > 0) != (self.lull_ns > 0):
            bad("lulls need both a count (--lulls) and a length (--lull)")
        if self.lulls and self.lulls * self.lull_ns >= self.duration_ns:
            bad(f"{self.lulls} lulls of {self.lull_ns / NS:g} s do not fit in a duration of "
                f"{self.duration_ns / NS:g} s")
        if self.start_ns - self.links * self.skew_ns - self.max_delay_ns < 0:
            bad("the skew reaches before 1970: start later or skew less")
        if self.start_ns + self.duration_ns > 0xFFFFFFFF * NS:
            bad("the capture ends after 2106, beyond classic pcap timestamps")
        return self

    @property
    def icmp_flows(self) -> int:
        total = self.tcp + self.udp + self.icmp
        return int(round(self.n_flows * self.icmp / total)) if total > 0 else 0


# --- files and manifest ------------------------------------------------------------------------

def link_paths(out: str | Path, links: int) -> dict[str, Path]:
    """File of each link: OUT itself for one link; else OUT's stem + `-l<i>` + suffix (out-l0.pcap)."""
    out = Path(out)
    if links == 1:
        return {"l0": out}
    suffix = out.suffix or ".pcap"
    return {f"l{i}": out.with_name(f"{out.stem}-l{i}{suffix}") for i in range(links)}


def manifest_path(out: str | Path) -> Path:
    """OUT + `.manifest.json` (out.pcap -> out.pcap.manifest.json)."""
    out = Path(out)
    return out.with_name(out.name + ".manifest.json")


def generate(cfg: TrafficConfig, out: str | Path, chunk: int = CHUNK) -> dict[str, Path]:
    """Write every link's pcap file and the manifest; returns {link name: path}.

    Raises ConfigError for inconsistent options and OopscopeError when a file cannot be written.
    Memory: 12 bytes per packet of the largest link plus one chunk of rows (see
    `iter_link_packets` for `chunk`).
    """
    cfg.validate()
    paths = link_paths(out, cfg.links)
    ft = flow_table(cfg)
    links: list[dict] = []
    for i, (name, path) in enumerate(paths.items()):
        meta: dict = {}
        flows_seen = np.zeros(cfg.n_flows, np.int64)
        directed = np.zeros(2 * cfg.groups, np.int64)
        n = rev = 0
        first, last = None, None
        try:
            with PcapAppender(path, snaplen=cfg.snaplen, nanosecond=cfg.nanosecond) as app:
                for part in iter_link_packets(cfg, i, ft, meta, chunk=chunk):
                    app.append(part["timestamp"], build_frames(part), part["len"], part["caplen"])
                    flows_seen += np.bincount(part["flow"], minlength=cfg.n_flows)
                    directed += np.bincount(ft.group[part["flow"]] * 2 + part["reverse"], minlength=2 * cfg.groups)
                    n += len(part["len"])
                    rev += int(part["reverse"].sum())
                    lo, hi = int(part["timestamp"].min()), int(part["timestamp"].max())
                    first = lo if first is None else min(first, lo)
                    last = hi if last is None else max(last, hi)
                nbytes = app.bytes
        except OSError as exc:
            raise OopscopeError(f"cannot write {path}: {exc.strerror or exc}") from None
        links.append({
            "link": name, "file": str(path), "packets": n, "bytes": nbytes,
            "flows_present": int(np.count_nonzero(flows_seen)),
            "directed_pairs": int(np.count_nonzero(directed)),
            "quiet": i in cfg.quiet_links,
            "skew_ns": i * cfg.skew_ns, "skew_s": i * cfg.skew_ns / NS,
            "first_ns": first, "last_ns": last,
            "lulls_ns": [list(g) for g in meta["lulls_ns"]],
            "reverse_packets": rev,
        })
    man = {
        "generator": "oopscope gen",
        "links": links,
        "files": [str(p) for p in paths.values()],
        "packets": sum(link["packets"] for link in links),
        "groups": cfg.groups,
        "flows": cfg.n_flows,
        "seed": cfg.seed,
        "disorder": {"model": cfg.disorder, "max_delay_ns": cfg.max_delay_ns,
                     "share": cfg.disorder_share if cfg.disorder == "band" else None,
                     "block_ns": cfg.block_ns},
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
    }
    mpath = manifest_path(out)
    try:
        mpath.write_text(json.dumps(man, indent=2) + "\n")
    except OSError as exc:
        raise OopscopeError(f"cannot write {mpath}: {exc.strerror or exc}") from None
    log.info("wrote %s (%d packets) and %s", ", ".join(map(str, paths.values())), man["packets"], mpath)
    return paths
