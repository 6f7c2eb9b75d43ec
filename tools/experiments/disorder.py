"""The thesis' disorder experiments (6.1.3, Fig 6-11 and 6-12): buffering with slack vs punctuation.

    oopscope bench disorder [--quick] [--json OUT] [--plot DIR]

Two workloads from the traffic generator (`tools.gen.traffic`), both replayed in record (arrival)
order:
- band: a share of packets arrives up to 3.2 s late; `AVG(len) [RANGE 64 s, SLIDE 6.4 s]`;
  metric: mean relative error of the average over the windows (thesis Exp 2);
- block: records shuffled inside 490 s blocks; `COUNT(*) [RANGE 600 s, SLIDE 60 s]`; metrics:
  mean relative error of the count and the share of wrong answers (thesis Exp 3).

Methods: IOP buffering with a time slack, consistent and generous (`tools.experiments.windowgrid`), for the
thesis' slack values; and OOP: the real low level (`lowlevel.operator.LowLevelOperator`, panes
of gcd(range, slide)) fed the same arrivals with the source's grammatical punctuation (every
`punct_every` of data time), its pane rows assembled into windows when its output punctuation
passes their end (Paned-WID's window level, `tools.experiments.windowgrid.assemble_panes`). OOP runs twice:
with m = 0 (every pane below the punctuation leaves the table at once, so the operator's
punctuation is the source's) and with the planner's default lazy flush (m = 2: the operator's
punctuation may lag by two panes, the price of smoothing its output; docs/semantics.md "Flush
policies").

The exact answer is plain numpy over the whole input. Latency is in the source's time: the
time at which the record that triggered the window's output left the source, minus the
window's end. A band-disordered record leaves at its timestamp (a late one later), so the clock
is the running maximum of the timestamps; a block-sorted record leaves at the end of its block
(the cache purge that exports it), so the clock is the running maximum of block ends.
Measured over the windows lying inside the input (every method emits them before the input
ends). Wall-clock seconds of each method are printed too (noisy on a shared machine).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common.units import NS_PER_S as NS

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class Workload:
    name: str
    disorder: str               # band | block
    packets: int
    duration_s: float
    range_s: float
    slide_s: float
    aggregate: str              # avg | count
    slacks_s: tuple[float, ...]
    modes: tuple[str, ...]
    max_delay_s: float = 0.0
    late_share: float = 1.0
    block_s: float = 0.0
    punct_every_s: float = 0.1
    seed: int = 7

    @property
    def query(self) -> str:
        agg = "AVG(len)" if self.aggregate == "avg" else "COUNT(*)"
        return (f"DEFINE {{ query_name {self.name}; }}\n"
                f"SELECT {agg} [RANGE {round(self.range_s * 1000)} ms, "
                f"SLIDE {round(self.slide_s * 1000)} ms, WA timestamp] AS value\n"
                f"FROM main.PACKET;\n")


BAND_SLACKS = (0.0, 0.32, 0.64, 1.28, 2.56, 3.2)
BLOCK_SLACKS = (0.0, 54.4, 109.1, 218.2, 327.3, 434.2, 490.9, 600.0)


def workloads(quick: bool) -> list[Workload]:
    """The two experiments; --quick shortens the inputs (same windows, slacks and disorder)."""
    return [
        Workload("band", "band", 20_000 if quick else 90_000, 400 if quick else 1800, 64, 6.4,
                 "avg", BAND_SLACKS, ("consistent", "generous"), max_delay_s=3.2,
                 late_share=0.2, punct_every_s=0.1),
        Workload("block", "block", 18_000 if quick else 72_000, 3600 if quick else 14_400,
                 600, 60, "count", BLOCK_SLACKS, ("consistent", "generous"), block_s=490,
                 punct_every_s=1.0),
    ]


def arrivals(w: Workload):
    """(timestamps ns, lengths) of the workload's packets in arrival order."""
    from tools.gen.traffic import TrafficConfig, link_packets

    cfg = TrafficConfig(packets=w.packets, duration_ns=int(w.duration_s * NS), groups=100,
                        disorder=w.disorder, max_delay_ns=int(w.max_delay_s * NS),
                        disorder_share=w.late_share, block_ns=int(w.block_s * NS), seed=w.seed)
    cols = link_packets(cfg, 0)
    return cols["timestamp"].astype("int64"), cols["len"].astype("int64")


def source_clock(w: Workload, ts):
    """When each arrival left the source (running maximum: arrivals are in order of it)."""
    import numpy as np

    if w.disorder == "block":
        b = int(w.block_s * NS)
        return np.maximum.accumulate((np.floor_divide(ts, b) + 1) * b)
    return np.maximum.accumulate(ts)


def packet_batch(ts, lens):
    """A PacketBatch carrying just what the query reads (timestamp, len)."""
    from capture.batch import PacketBatch

    b = PacketBatch.empty("main", len(ts))
    b.columns["timestamp"][:] = ts
    b.columns["len"][:] = lens
    return b


def run_oop(plan, ts, lens, punctuation, batch_rows: int = 8192):
    """The low level over the arrivals; returns pane rows (pane, event, states), the output
    punctuation [(event, P)] and the operator's counters. Event j = after arrival j."""
    import numpy as np
    import pyarrow as pa

    from lowlevel.operator import LowLevelOperator

    op = LowLevelOperator(plan)
    batch = packet_batch(ts, lens)
    n = len(ts)
    at = {j + 1: p for j, p in punctuation}
    cuts = sorted(set(at) | set(range(batch_rows, n, batch_rows)) | {n})
    tables, events, out = [], [], []

    def keep(rows, event):
        for r in rows:
            if r.num_rows:
                tables.append(r)
                events.append(np.full(r.num_rows, event, np.int64))

    a0 = 0
    for a1 in cuts:
        keep(op.process(batch.slice(a0, a1)), a1 - 1)
        a0 = a1
        if a1 in at:
            rows, p = op.punctuate(at[a1])
            keep(rows, a1 - 1)
            if p is not None:
                out.append((a1 - 1, p))
    rows, _ = op.finish()
    keep(rows, n)
    table = pa.Table.from_batches(tables, schema=op.schema.schema)
    states = {s.name: table.column(s.name).to_numpy().astype(np.float64) for s in plan.subaggs}
    return (table.column("window").to_numpy(), np.concatenate(events), states, out,
            op.counters)


def _metrics(exact, got_count, got_total, emitted, seen, ends, aggregate: str) -> dict:
    import numpy as np

    if aggregate == "avg":
        truth = exact.total / exact.count
        with np.errstate(invalid="ignore", divide="ignore"):
            value = got_total / got_count
        value = np.where(got_count > 0, value, 0.0)      # an empty window: no answer at all
    else:
        truth = exact.count.astype(np.float64)
        value = got_count.astype(np.float64)
    rel = np.abs(value - truth) / np.abs(truth)
    latency = (seen[np.minimum(emitted, len(seen) - 1)] - ends) / NS
    return {"mean_error_pct": float(100 * rel.mean()),
            "wrong_pct": float(100 * np.mean(~np.isclose(value, truth, rtol=1e-12, atol=0))),
            "latency_s": float(latency.mean()), "latency_p95_s": float(np.percentile(latency, 95)),
            "windows": int(len(truth))}


def run_workload(w: Workload) -> dict:
    """Every method on one workload: a dict of parameters and rows (method, slack, metrics)."""
    import numpy as np

    from queries.planner import plan_text
    from tools.experiments.windowgrid import (
        WindowGrid,
        assemble_panes,
        exact_windows,
        slack_windows,
        source_punctuation,
    )

    t0 = time.perf_counter()
    ts, lens = arrivals(w)
    gen_s = time.perf_counter() - t0
    seen = source_clock(w, ts)
    grid = WindowGrid(int(round(w.range_s * NS)), int(round(w.slide_s * NS)))
    exact = exact_windows(ts, lens, grid)
    # the windows inside the input: every method has emitted them before the input ends
    horizon = int(ts.max()) - int((max(w.slacks_s) + w.max_delay_s + w.block_s) * NS) \
        - grid.slide_ns
    inside = (grid.start(exact.wid) >= ts.min()) & (grid.end(exact.wid) <= horizon)
    windows = exact.wid[inside]
    ref = type(exact)(windows, exact.count[inside], exact.total[inside],
                      exact.emitted_after[inside])
    ends = grid.end(windows)
    rows = []
    for mode in w.modes:
        for slack in w.slacks_s:
            t1 = time.perf_counter()
            got = slack_windows(ts, lens, grid, int(round(slack * NS)), mode, windows)
            m = _metrics(ref, got.count, got.total, got.emitted_after, seen, ends, w.aggregate)
            m.update(method=f"slack-{mode}", slack_s=slack, dropped=got.dropped,
                     seconds=time.perf_counter() - t1)
            rows.append(m)
    # a fixed table, as the experiments have always measured (not `lowlevel.sizing`'s)
    lazy = replace(plan_text(w.query, ["main"]).queries[0].low[0], max_slots=0)
    punctuation = source_punctuation(ts, int(w.punct_every_s * NS))
    for method, plan in (("oop-punctuation", replace(lazy, max_disorder=0)),
                         (f"oop-lazy-m{lazy.max_disorder}", lazy)):
        t1 = time.perf_counter()
        assert plan.window is not None   # an aggregate query
        pane, event, states, out, counters = run_oop(plan, ts, lens, punctuation)
        cnt = next(s.name for s in plan.subaggs if s.kind == "count")
        total = next((s.name for s in plan.subaggs if s.kind == "sum"), cnt)
        sums, closing = assemble_panes(pane, event, states, out, plan.window.pane_ns, grid,
                                       windows, len(ts))
        m = _metrics(ref, sums[cnt], sums[total], closing, seen, ends, w.aggregate)
        m.update(method=method, slack_s=None, dropped=int(counters["late"]),
                 seconds=time.perf_counter() - t1, punctuations=len(punctuation))
        rows.append(m)
    params = asdict(w)
    params.update(query=w.query, generate_seconds=gen_s, packets_late_vs_max_seen=int(
        np.count_nonzero(ts < seen)))
    return {"workload": params, "rows": rows}


def format_report(report: dict) -> str:
    lines = []
    for wl in report["workloads"]:
        p = wl["workload"]
        lines.append(f"{p['name']}: {p['disorder']} disorder, {p['packets']} packets over "
                     f"{p['duration_s']:g} s, {p['aggregate'].upper()} [RANGE {p['range_s']:g} s, "
                     f"SLIDE {p['slide_s']:g} s], {wl['rows'][0]['windows']} windows measured")
        lines.append(f"  {'method':<18}{'slack s':>9}{'error %':>10}{'wrong %':>9}"
                     f"{'latency s':>11}{'p95 s':>9}{'dropped':>9}{'wall s':>8}")
        for r in wl["rows"]:
            slack = "-" if r["slack_s"] is None else f"{r['slack_s']:g}"
            lines.append(f"  {r['method']:<18}{slack:>9}{r['mean_error_pct']:>10.3f}"
                         f"{r['wrong_pct']:>9.1f}{r['latency_s']:>11.2f}{r['latency_p95_s']:>9.2f}"
                         f"{r['dropped']:>9}{r['seconds']:>8.2f}")
    return "\n".join(lines)


def plot_report(report: dict, directory: Path) -> Path:
    """Error and latency vs slack per workload (OOP as a horizontal line), one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wls = report["workloads"]
    fig, axes = plt.subplots(len(wls), 2, figsize=(11, 4 * len(wls)), squeeze=False)
    for (ax_err, ax_lat), wl in zip(axes, wls):
        p = wl["workload"]
        metric = "mean_error_pct"
        for mode in p["modes"]:
            rs = [r for r in wl["rows"] if r["method"] == f"slack-{mode}"]
            xs = [r["slack_s"] for r in rs]
            ax_err.plot(xs, [r[metric] for r in rs], "o-", label=f"slack, {mode}")
            ax_lat.plot(xs, [r["latency_s"] for r in rs], "o-", label=f"slack, {mode}")
        for r, ls in zip([r for r in wl["rows"] if r["method"].startswith("oop")], ("--", ":")):
            label = ("OOP, lazy flush (m=2)" if "lazy" in r["method"]
                     else "OOP, flush at punctuation (m=0)")
            ax_err.axhline(r[metric], color="k", ls=ls, label=label)
            ax_lat.axhline(r["latency_s"], color="k", ls=ls, label=label)
        what = "AVG" if p["aggregate"] == "avg" else "COUNT"
        ax_err.set(title=f"{p['name']}: mean error of {what} vs slack", xlabel="slack (s)",
                   ylabel="mean relative error (%)")
        ax_lat.set(title=f"{p['name']}: result latency vs slack", xlabel="slack (s)",
                   ylabel="latency after window end, source time (s)")
        for ax in (ax_err, ax_lat):
            ax.grid(alpha=0.3)
            ax.legend()
    fig.tight_layout()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench_disorder.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def warm_up() -> None:
    """Compile the low level's kernels before anything is timed."""
    import numpy as np

    from queries.planner import plan_text

    w = workloads(True)[0]
    plan = plan_text(w.query, ["main"]).queries[0].low[0]
    ts = np.arange(1, 200, dtype=np.int64) * NS
    run_oop(plan, ts, np.full(len(ts), 60, np.int64), [(100, int(ts[101]))])


def run(quick: bool, names: list[str] | None = None) -> dict:
    """The workloads (those of `names`, default all) and the report."""
    chosen = [w for w in workloads(quick) if names is None or w.name in names]
    if chosen:
        warm_up()
    return {"benchmark": "disorder", "quick": quick,
            "workloads": [run_workload(w) for w in chosen]}


def plain_json(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)

