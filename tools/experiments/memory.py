"""IOP vs OOP memory (thesis Experiments 2 and 3): a union's state (Q8-2) and a join's state (Q8-3) under arrival skew.

Both experiments replay generated links side by side in arrival order: link i's data is
`skew_i` old, so a row of data time t arrives at t + skew_i. Arrival time advances in steps of
`step_s`; in each step every link delivers the rows that arrive in it, then a heartbeat
punctuation (arrival - skew_i: in-order links, nothing older follows). State is measured after
every step; the figure is its peak.

Experiment 2, Q8-2 (count per srcIP, destIP per minute over link1 UNION link2): each link runs
the real low level (`LowLevelOperator` of Q8-1, table = groups / 4, `oop_lazy` m = 2 for OOP,
`iop_slow` for IOP); its partial rows and punctuation go to `highlevel.union` as the high
level receives them: OOP a `Meld` (passes rows, keeps one bound per link), IOP a `Merge`
(buffers the leading link's rows until the other catches up; rows are ordered on the window
start). Behind the union the high-level window aggregate keeps one entry per open (window,
group); a window closes on the union's punctuation (OOP) or on the first row of a later window
(IOP, in-order input). Reported: the union's buffer (rows, Arrow bytes) and the total with the
aggregate's entries (partial-row bytes each). The low-level tables are the same size in both
and left out.

Experiment 3, Q8-3 (10-second tumbling join of A UNION B with C UNION D on reverse-direction
5-tuples; B lags A and D lags C by the skew): a driver-side model of the state, no Spark (the
OA-Join operator lives in highlevel/; this applies its purge rules to the generated tuples).
IOP: each union is a real `MergeLogic` over the tuples (srcIP, destIP, srcPort, destPort,
time); the in-order join then holds the tuples of windows not yet complete on both sides.
OOP: tuples reach the join at once; a tuple of window w is kept only while the other side's
punctuation (the Meld bound of its two links) is below the end of w, i.e. while a partner can
still arrive, and purged by that punctuation. Reported: tuples held (IOP split into Merge
buffers and join state) and bytes (the same 20-byte tuple for both: Gigascope's hash-table
overhead is not modelled).
"""

from __future__ import annotations

import logging
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.units import NS_PER_S as NS
from tools.experiments.q81 import q81_plan

log = logging.getLogger(__name__)

MINUTE = 60 * NS


@dataclass(frozen=True)
class UnionConfig:
    """Experiment 2 (Q8-2): 65,536 groups, two links, skew 0..40 s."""

    groups: int = 65_536
    skews_s: tuple[int, ...] = (0, 10, 20, 30, 40)
    windows: int = 5                  # minutes of data per link
    per_group: int = 4                # packets per group per window per link
    table_factor: float = 0.25        # low-level table = factor x groups (partials leave on collisions)
    step_s: float = 1.0


@dataclass(frozen=True)
class JoinConfig:
    """Experiment 3 (Q8-3): 10 K tuples/s per link, 10-second tumbling join, skew 0..100 s."""

    rate: int = 10_000                # tuples per second per link
    skews_s: tuple[int, ...] = (0, 20, 40, 60, 80, 100)
    extra_s: int = 60                 # data seconds beyond the largest skew
    window_s: int = 10
    groups: int = 10_000
    flows: int = 20_000
    step_s: float = 1.0


QUICK_UNION = UnionConfig(groups=16_384, skews_s=(0, 20, 40), windows=4, per_group=3)
QUICK_JOIN = JoinConfig(rate=1_000, skews_s=(0, 50, 100), extra_s=30, groups=2_000, flows=4_000)


def _arrival_steps(arrivals: list[np.ndarray], step_ns: int, end_ns: int):
    """(step end, [row range of each link arriving before it]) in arrival order."""
    start = min(int(a[0]) for a in arrivals if len(a))
    pos = [0] * len(arrivals)
    t = start
    while t < end_ns:
        t += step_ns
        ranges = []
        for i, a in enumerate(arrivals):
            j = int(np.searchsorted(a, t, side="left"))
            ranges.append((pos[i], j))
            pos[i] = j
        yield t, ranges


# --- Experiment 2 -----------------------------------------------------------------------------

class WindowAggregate:
    """The high-level window count's entries: one per open (window, group)."""

    def __init__(self, in_order: bool):
        self.in_order = in_order
        self.open: dict[int, set] = defaultdict(set)
        self.entries = 0

    def add(self, window: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        if not len(window):
            return
        keys = (src.astype(np.uint64) << np.uint64(32)) | dst.astype(np.uint64)
        for w in np.unique(window):
            s = self.open[int(w)]
            before = len(s)
            s.update(keys[window == w].tolist())
            self.entries += len(s) - before
        if self.in_order:        # ordered input: a row of window w closes every earlier window
            self._close_below(int(window.max()))

    def close_by_punct(self, p_ns: int, pane_ns: int) -> None:
        self._close_below(p_ns // pane_ns)      # windows ending at or before p are complete

    def _close_below(self, w: int) -> None:
        for k in [k for k in self.open if k < w]:
            self.entries -= len(self.open.pop(k))


def run_union(cfg: UnionConfig) -> list[dict]:
    """Experiment 2: peak union buffer and total state per skew, Meld vs Merge."""
    from capture.reader import read_all
    from highlevel.union import Meld, Merge
    from tools.gen.traffic import TrafficConfig, generate

    packets = cfg.per_group * cfg.groups * cfg.windows
    tc = TrafficConfig(packets=packets, duration_ns=cfg.windows * MINUTE, groups=cfg.groups,
                       tcp=0.8, udp=0.2, icmp=0.0, snaplen=64, links=2, seed=7)
    with tempfile.TemporaryDirectory(prefix="oopscope-q82-") as tmp:
        paths = generate(tc, Path(tmp) / "q82.pcap")
        links = [read_all(paths[f"l{i}"], f"link{i + 1}") for i in range(2)]
    log.info("Q8-2: %d packets per link, %d groups", packets, cfg.groups)
    results = []
    for skew in cfg.skews_s:
        for mode in ("oop", "iop"):
            results.append(_union_once(cfg, links, skew, mode, q81_plan, Meld, Merge))
            r = results[-1]
            log.info("  skew %3d s %s: union peak %d rows, total peak %d rows (%.1f MB)", skew,
                     r["union"], r["union_peak_rows"], r["total_peak_rows"], r["total_peak_bytes"] / 1e6)
    return results


def _union_once(cfg: UnionConfig, links, skew: int, mode: str, q81_plan, Meld, Merge) -> dict:
    import pyarrow as pa

    from capture.batch import PacketBatch
    from lowlevel.operator import LowLevelOperator

    policy = "oop_lazy" if mode == "oop" else "iop_slow"
    names = ("link1", "link2")
    lags = (0, skew * NS)
    ops = [LowLevelOperator(q81_plan(max(2, int(cfg.groups * cfg.table_factor)), policy))
           for _ in names]
    union = Meld(names).build() if mode == "oop" else Merge(names).build()
    agg = WindowAggregate(in_order=mode == "iop")
    pane = MINUTE
    row_bytes = [0.0]
    peak: dict[str, float] = {"union_rows": 0, "union_bytes": 0, "total_rows": 0, "total_bytes": 0}

    def deliver(i: int, rbs) -> None:
        for rb in rbs:
            if not rb.num_rows:
                continue
            row_bytes[0] = rb.nbytes / rb.num_rows
            if mode == "oop":
                out = [union.on_rows(i, rb)]
            else:
                t = pa.table(rb).append_column("time", pa.array(rb.column("window").to_numpy() * pane))
                out = union.on_rows(i, t)
            for o in out:
                agg.add(o.column("window").to_numpy(), o.column("srcIP").to_numpy(),
                        o.column("destIP").to_numpy())

    def punct(i: int, p) -> None:
        if p is None:
            return
        if mode == "oop":
            q = union.on_punctuation(i, p)
        else:
            rel, q = union.on_punctuation(i, p)
            for o in rel:
                agg.add(o.column("window").to_numpy(), o.column("srcIP").to_numpy(),
                        o.column("destIP").to_numpy())
        if q is not None:
            agg.close_by_punct(q, pane)

    # data times: link i's rows are lags[i] old; arrival = original generated time
    arrivals = [b["timestamp"] for b in links]
    data = []
    for b, lag in zip(links, lags):
        cols = dict(b.columns)
        cols["timestamp"] = b["timestamp"] - lag
        data.append(PacketBatch(b.link, cols))
    end = max(int(a[-1]) for a in arrivals) + NS
    step = int(cfg.step_s * NS)
    for t, ranges in _arrival_steps(arrivals, step, end):
        for i, (a, z) in enumerate(ranges):
            if z > a:
                deliver(i, ops[i].process(data[i].slice(a, z)))
            rows, p = ops[i].punctuate(t - lags[i])
            deliver(i, rows)
            punct(i, p)
        u_rows = 0 if mode == "oop" else union.buffered_rows
        u_bytes = 0 if mode == "oop" else union.buffered_bytes
        tot_rows = u_rows + agg.entries
        tot_bytes = u_bytes + agg.entries * row_bytes[0]
        peak["union_rows"] = max(peak["union_rows"], u_rows)
        peak["union_bytes"] = max(peak["union_bytes"], u_bytes)
        peak["total_rows"] = max(peak["total_rows"], tot_rows)
        peak["total_bytes"] = max(peak["total_bytes"], tot_bytes)
    return {"skew_s": skew, "mode": mode, "union": "Meld" if mode == "oop" else "Merge",
            "low_level": policy, "groups": cfg.groups, "slots": ops[0].plan.slots,
            "union_peak_rows": peak["union_rows"], "union_peak_bytes": int(peak["union_bytes"]),
            "total_peak_rows": peak["total_rows"], "total_peak_bytes": int(peak["total_bytes"]),
            "partial_rows": sum(op.counters["rows_out"] for op in ops)}


# --- Experiment 3 -----------------------------------------------------------------------------

def _join_tuples(cfg: JoinConfig, duration_s: int) -> list[dict]:
    from tools.gen.traffic import TrafficConfig, link_packets

    tc = TrafficConfig(packets=cfg.rate * duration_s, duration_ns=duration_s * NS,
                       groups=cfg.groups, flows=cfg.flows, tcp=0.8, udp=0.2, icmp=0.0,
                       reverse=1.0, links=4, seed=11)
    out = []
    for i in range(4):
        c = link_packets(tc, i)
        out.append({"srcIP": (c["srcIP_lo"] & np.uint64(0xFFFF_FFFF)).astype(np.uint32),
                    "destIP": (c["destIP_lo"] & np.uint64(0xFFFF_FFFF)).astype(np.uint32),
                    "srcPort": c["srcPort"], "destPort": c["destPort"],
                    "time": c["timestamp"]})
    return out


class SideState:
    """Tuples held per window on one side of the join (counts: the rules need no contents)."""

    def __init__(self) -> None:
        self.held: dict[int, int] = defaultdict(int)
        self.total = 0

    def add(self, windows: np.ndarray) -> None:
        w, n = np.unique(windows, return_counts=True)
        for k, c in zip(w.tolist(), n.tolist()):
            self.held[k] += c
        self.total += int(n.sum())

    def purge_below_end(self, p_ns: int, window_ns: int) -> None:
        """Drop windows whose end is <= p (no partner can arrive any more)."""
        for k in [k for k in self.held if (k + 1) * window_ns <= p_ns]:
            self.total -= self.held.pop(k)


def run_join(cfg: JoinConfig) -> list[dict]:
    """Experiment 3: peak tuples and bytes held per skew, IOP (Merge + join) vs OOP (OA-Join)."""
    duration = max(cfg.skews_s) + cfg.extra_s
    tuples = _join_tuples(cfg, duration)
    log.info("Q8-3: %d tuples per link over %d s", len(tuples[0]["time"]), duration)
    results = []
    for skew in cfg.skews_s:
        r = _join_once(cfg, tuples, skew)
        results.extend(r)
        log.info("  skew %3d s: IOP peak %d tuples (%d in Merge), OOP peak %d tuples", skew,
                 r[1]["peak_tuples"], r[1]["peak_merge_tuples"], r[0]["peak_tuples"])
    return results


def _join_once(cfg: JoinConfig, tuples: list[dict], skew: int) -> list[dict]:
    import pyarrow as pa

    from highlevel.union import Merge

    wns = cfg.window_s * NS
    lags = (0, skew * NS, 0, skew * NS)          # B lags A, D lags C
    side_of = (0, 0, 1, 1)                       # streams A, B, C, D: A and B one side, C and D the other
    arrivals = [t["time"] for t in tuples]
    data = []
    for t, lag in zip(tuples, lags):
        d = dict(t)
        d["time"] = t["time"] - lag
        data.append(pa.table(d))
    row_bytes = data[0].nbytes / max(1, data[0].num_rows)
    # OOP: the OA-Join's two sides and the Meld bound of each side
    oop = [SideState(), SideState()]
    oop_punct: list[list[int | None]] = [[None, None], [None, None]]
    # IOP: two Merges, then the in-order join's window state
    merges = [Merge(("A", "B")).build(), Merge(("C", "D")).build()]
    iop = [SideState(), SideState()]
    iop_progress: list[int | None] = [None, None]
    peak = {"oop": 0, "iop": 0, "iop_merge": 0, "iop_join": 0}

    def side_bound(s: int) -> int | None:
        b0, b1 = oop_punct[s]
        return None if b0 is None or b1 is None else min(b0, b1)

    def iop_feed(s: int, released, q) -> None:
        for tab in released:
            if tab.num_rows:
                iop[s].add(tab.column("time").to_numpy() // wns)
        if q is not None:
            iop_progress[s] = q
        p0, p1 = iop_progress
        if p0 is not None and p1 is not None:   # a window is complete once both sides passed it
            low = min(p0, p1)
            iop[0].purge_below_end(low, wns)
            iop[1].purge_below_end(low, wns)

    end = max(int(a[-1]) for a in arrivals) + NS
    for t, ranges in _arrival_steps(arrivals, int(cfg.step_s * NS), end):
        for i, (a, z) in enumerate(ranges):
            s, k = side_of[i], i % 2
            p = t - lags[i]
            if z > a:
                rows = data[i].slice(a, z - a)
                w = rows.column("time").to_numpy() // wns
                other = side_bound(1 - s)
                # OA-Join: keep a tuple only while a partner of its window can still arrive
                keep = w if other is None else w[(w + 1) * wns > other]
                if len(keep):
                    oop[s].add(keep)
                iop_feed(s, merges[s].on_rows(k, rows), None)
            oop_punct[s][k] = p
            b = side_bound(s)
            if b is not None:
                oop[1 - s].purge_below_end(b, wns)
            rel, q = merges[s].on_punctuation(k, p)
            iop_feed(s, rel, q)
        m_rows = merges[0].buffered_rows + merges[1].buffered_rows
        j_rows = iop[0].total + iop[1].total
        peak["oop"] = max(peak["oop"], oop[0].total + oop[1].total)
        peak["iop_merge"] = max(peak["iop_merge"], m_rows)
        peak["iop_join"] = max(peak["iop_join"], j_rows)
        peak["iop"] = max(peak["iop"], m_rows + j_rows)
    return [
        {"skew_s": skew, "mode": "oop", "state": "OA-Join", "peak_tuples": peak["oop"],
         "peak_bytes": int(peak["oop"] * row_bytes), "peak_merge_tuples": 0,
         "peak_join_tuples": peak["oop"]},
        {"skew_s": skew, "mode": "iop", "state": "Merge buffers + in-order join",
         "peak_tuples": peak["iop"], "peak_bytes": int(peak["iop"] * row_bytes),
         "peak_merge_tuples": peak["iop_merge"], "peak_join_tuples": peak["iop_join"]},
    ]


# --- reporting --------------------------------------------------------------------------------

def memory_tables(union: list[dict], join: list[dict]) -> str:
    lines = ["Q8-2 union memory (peak): union buffer rows | total state rows, MB "
             "(union + window aggregate)",
             f"{'skew s':>7} {'Meld buf':>9} {'Merge buf':>10} {'OOP total':>10} {'MB':>6} "
             f"{'IOP total':>10} {'MB':>6}"]
    by = {(r["skew_s"], r["mode"]): r for r in union}
    for s in sorted({r["skew_s"] for r in union}):
        o, i = by[(s, "oop")], by[(s, "iop")]
        lines.append(f"{s:>7} {o['union_peak_rows']:>9} {i['union_peak_rows']:>10} "
                     f"{o['total_peak_rows']:>10} {o['total_peak_bytes'] / 1e6:>6.2f} "
                     f"{i['total_peak_rows']:>10} {i['total_peak_bytes'] / 1e6:>6.2f}")
    lines += ["", "Q8-3 join memory (peak tuples held; IOP = Merge buffers + in-order join)",
              f"{'skew s':>7} {'OOP':>9} {'MB':>6} {'IOP':>9} {'MB':>6} {'in Merge':>9} {'OOP/IOP':>8}"]
    by = {(r["skew_s"], r["mode"]): r for r in join}
    for s in sorted({r["skew_s"] for r in join}):
        o, i = by[(s, "oop")], by[(s, "iop")]
        ratio = o["peak_tuples"] / i["peak_tuples"] if i["peak_tuples"] else float("nan")
        lines.append(f"{s:>7} {o['peak_tuples']:>9} {o['peak_bytes'] / 1e6:>6.2f} "
                     f"{i['peak_tuples']:>9} {i['peak_bytes'] / 1e6:>6.2f} "
                     f"{i['peak_merge_tuples']:>9} {ratio:>8.2f}")
    return "\n".join(lines)


def plot_memory(union: list[dict], join: list[dict], path) -> None:
    """Figures 8-8 and 8-9 side by side as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, label, style in (("oop", "OOP (Meld)", "o-"), ("iop", "IOP (Merge)", "s--")):
        rows = sorted((r for r in union if r["mode"] == mode), key=lambda r: r["skew_s"])
        ax.plot([r["skew_s"] for r in rows], [r["total_peak_bytes"] / 1e6 for r in rows], style,
                label=f"{label}: union + aggregate")
        ax.plot([r["skew_s"] for r in rows], [r["union_peak_bytes"] / 1e6 for r in rows],
                style[0] + ":", label=f"{label}: union buffer only")
    ax.set_xlabel("arrival skew between the links (s)")
    ax.set_ylabel("peak state (MB)")
    ax.set_title("Q8-2: window count over M1 UNION M2")
    for mode, label, style in (("oop", "OOP (OA-Join state)", "o-"),
                               ("iop", "IOP (Merge buffers + join)", "s--")):
        rows = sorted((r for r in join if r["mode"] == mode), key=lambda r: r["skew_s"])
        ax2.plot([r["skew_s"] for r in rows], [r["peak_tuples"] / 1e3 for r in rows], style, label=label)
    rows = sorted((r for r in join if r["mode"] == "iop"), key=lambda r: r["skew_s"])
    ax2.plot([r["skew_s"] for r in rows], [r["peak_merge_tuples"] / 1e3 for r in rows], "s:",
             label="IOP: in Merge buffers")
    ax2.set_xlabel("arrival skew A-B and C-D (s)")
    ax2.set_ylabel("peak tuples held (K)")
    ax2.set_title("Q8-3: 10-s tumbling join of two unions")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
