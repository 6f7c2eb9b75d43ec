"""Sustained load on the appliance: does the high level keep up, minute after minute?

    python -m bench.sustained [--pps 400000] [--groups 260000] [--minutes 10]
                              [--mode replay|cluster|live] [--dir DIR] [--json F] [--plot F.png]
                              [--declare] [--debug]

`--pps` and `--groups` take comma-separated lists: every pair is one run (the grid of
docs/performance.md is `--pps 100000,200000,400000 --groups 10000,100000,260000`).

Each run carries `--pps` packets per second per link with `--groups` distinct (srcIP,
destIP) pairs in every 10-second window:

- `replay` (the default): `oopscope serve` replays a generated capture itself (`--link
  main=CAP --loop --speed S`, stamped with the wall clock), S chosen for the rate;
- `live` (root; `veth` is its old name): the same capture sent by tcpreplay from a network
  namespace into a veth pair the run makes (`tools.gen.veth`), `oopscope serve` capturing
  its outer end (`--interface`), as on a real link;
- `cluster`: two `oopscope agent`s, each fed the capture at `--pps` through a FIFO stamped
  with the wall clock, and one `oopscope collect` melding them (2 x `--pps` in all;
  `bench.sustained_cluster`).

Once Spark is up, a per-10-second `count(*)`, `sum(len)` per (srcIP, destIP) is submitted and
tailed for `--minutes`. Per window it records:

- the lag from the window's end to its first row at the tail, and to the part file that
  holds its rows (the output a consumer reads);
- its result rows, and the partial rows the low level sent for it (the query's
  `partial_rows` counter between two windows: how much the table evicted);
- the resident memory of the server and its Spark JVM (cluster: of each agent and of the
  collector with its JVM).

It reports per run the lag's median and p99, the trend (the last minute's mean lag against
the second minute's), partial rows per result row, RSS at the first minute and at the end,
drops; `--plot` draws lag and RSS over time. Not a test: a run takes `--minutes`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.workloads import generated_capture

log = logging.getLogger(__name__)

NS = 1_000_000_000
WINDOW_S = 10
QUERY = f"""
DEFINE {{ query_name pairs; }}
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/{WINDOW_S} AS tb, srcIP, destIP;
"""


def declared(query: str, groups: int | None) -> str:
    """`query` with its groups per window declared (`expected_groups`: the table starts at
    its size, as a query that ran before starts at its remembered one), or as it is."""
    if groups is None:
        return query
    return query.replace("query_name pairs;", f"query_name pairs; expected_groups {groups};")
#: seconds of trace in the generated capture (looped); long enough that every window sees
#: every group at the rates of the grid
TRACE_S = 20


@dataclass
class Window:
    tb: int
    tail_s: float | None = None         # end -> first row at the tail
    file_s: float | None = None         # end -> the part file holding its rows
    rows: int = 0
    partial_rows: int | None = None
    rss_mb: float | None = None
    rss: dict | None = None             # cluster: MB per process


@dataclass
class Sampled:
    """What the tail thread and the sampling loop saw, per window."""
    windows: dict[int, Window] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window(self, tb: int) -> Window:
        with self.lock:
            return self.windows.setdefault(tb, Window(tb))


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its descendants (the server and its Spark JVM)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return total / 1024


def seconds_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _tail(client, sampled: Sampled, stop: threading.Event) -> None:
    for event in client.tail("pairs"):
        if stop.is_set():
            return
        if event.get("event") != "rows":
            continue
        now = time.time()
        cols = event["columns"]
        at = cols.index("tb")
        for tb in {row[at] for row in event["rows"]}:
            w = sampled.window(int(tb))
            if w.tail_s is None:
                w.tail_s = now - (int(tb) + 1) * WINDOW_S


def _scan_files(out: Path, seen: set, sampled: Sampled) -> None:
    """Part files new since the last scan: the windows they hold, their rows."""
    import pyarrow.csv as pacsv

    now = time.time()
    for path in sorted(out.glob("part-*.csv")):
        if path in seen:
            continue
        seen.add(path)
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            include_columns=["tb"]))
        tbs = table.column("tb").to_numpy()
        for tb in set(tbs.tolist()):
            w = sampled.window(int(tb))
            if w.file_s is None:
                w.file_s = now - (int(tb) + 1) * WINDOW_S
            w.rows += int((tbs == tb).sum())


def capture_for(pps: int, groups: int, workdir: Path) -> Path:
    """The generated capture a run at `pps` x `groups` loops (TRACE_S s of trace)."""
    from tools.gen.traffic import TrafficConfig

    packets = max(groups * 4, pps * TRACE_S // 8)
    return generated_capture(workdir / f"sustained-{groups}-{packets}.pcap",
                             TrafficConfig(packets=packets, duration_ns=TRACE_S * NS,
                                           groups=groups, tcp=0.8, udp=0.2, icmp=0.0,
                                           sizes="fixed:64", seed=5))


def one_run(pps: int, groups: int, minutes: float, mode: str, workdir: Path,
            declare: bool = False, debug: bool = False) -> dict:
    from tools.serve.testing import Server

    expected = groups if declare else None
    if mode == "cluster":
        from bench.sustained_cluster import cluster_run

        return cluster_run(pps, groups, minutes, workdir, expected, debug)
    pcap = capture_for(pps, groups, workdir)
    packets = max(groups * 4, pps * TRACE_S // 8)
    native = packets / TRACE_S
    state = Path(tempfile.mkdtemp(prefix=f"state-{pps}-{groups}-", dir=workdir))
    sampled, stop = Sampled(), threading.Event()
    with contextlib.ExitStack() as undo:
        pair = None
        if mode == "live":
            from tools.gen.veth import VethPair

            pair = undo.enter_context(VethPair("oopbsu"))
            args = ["--interface", f"main={pair.outer}"]
        else:
            args = ["--link", f"main={pcap}", "--loop", "--speed", f"{pps / native:.4f}"]
        server = Server(args, state, workdir / f"serve-{pps}-{groups}.log",
                        verbose=2 if debug else 1)
        undo.callback(server.stop)
        undo.callback(stop.set)             # the tail thread, first
        server.start()
        server.wait_spark()
        if pair is not None:
            sender = subprocess.Popen(pair.inside(["tcpreplay", "-i", pair.inner,
                                                   f"--pps={pps}", "--preload-pcap",
                                                   "--loop=0", str(pcap)]),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            undo.callback(sender.wait)
            undo.callback(sender.terminate)
        time.sleep(3)                               # the rate settles
        reply = server.client.submit(text=declared(QUERY, expected), file="pairs.gsql")
        out = Path(reply["outputs"]["pairs"])
        threading.Thread(target=_tail, args=(server.client, sampled, stop), daemon=True).start()
        seen: set = set()
        assert server.proc is not None
        pid = server.proc.pid
        ended = time.time() + minutes * 60
        last_partials, last_tb = 0, None
        while time.time() < ended:
            time.sleep(0.25)
            _scan_files(out, seen, sampled)
            now_tb = int(time.time() // WINDOW_S) - 1      # the last window that ended
            if now_tb != last_tb:
                info = next(q for q in server.client.queries() if q["name"] == "pairs")
                w = sampled.window(now_tb)
                w.partial_rows = int(info["partial_rows"]) - last_partials
                w.rss_mb = rss_mb(pid)
                last_partials, last_tb = int(info["partial_rows"]), now_tb
                done = sampled.window(now_tb - 1)      # the window before: written by now
                log.info("t+%.0f s: window %d: %s rows, lag to file %s s, to tail %s s, "
                         "RSS %.0f MB", minutes * 60 - (ended - time.time()), done.tb,
                         f"{done.rows:,}", seconds_text(done.file_s),
                         seconds_text(done.tail_s), w.rss_mb)
        status = server.client.status()["links"][0]
    return report(pps, groups, mode, sampled, status, reply["first_window_ns"] // NS)


def _p99(values: list[float]) -> float | None:
    """The 99th percentile (of a few windows: the largest)."""
    return round(sorted(values)[min(len(values) - 1, int(0.99 * len(values)))], 2) \
        if values else None


def report(pps, groups, mode, sampled: Sampled, status: dict, first_s: int) -> dict:
    # whole windows only: from the first full one after the submission
    ws = sorted((w for w in sampled.windows.values() if w.tb * WINDOW_S >= first_s
                 and w.rows > 0), key=lambda w: w.tb)
    lags = [w.file_s for w in ws if w.file_s is not None]
    tail = [w.tail_s for w in ws if w.tail_s is not None]
    per_min = max(1, 60 // WINDOW_S)

    def mean(xs):
        return round(statistics.fmean(xs), 2) if xs else None

    rss = [w.rss_mb for w in ws if w.rss_mb is not None]
    partial = sum(w.partial_rows or 0 for w in ws)
    rows = sum(w.rows for w in ws)
    return {"mode": mode, "pps_offered": pps, "groups": groups,
            "pps_seen": round(status["pps"]), "ring_drops": status.get("ring_drops"),
            "kernel_drops": status.get("kernel_drops"), "windows": len(ws),
            "file_lag_median_s": round(statistics.median(lags), 2) if lags else None,
            "file_lag_p99_s": _p99(lags),
            "tail_lag_median_s": round(statistics.median(tail), 2) if tail else None,
            "tail_lag_p99_s": _p99(tail),
            "lag_second_minute_s": mean(lags[per_min:2 * per_min]),
            "lag_last_minute_s": mean(lags[-per_min:]),
            "result_rows_per_window": round(rows / len(ws)) if ws else None,
            "partial_rows_per_result_row": round(partial / rows, 2) if rows else None,
            "rss_first_minute_mb": round(rss[min(per_min, len(rss) - 1)]) if rss else None,
            "rss_end_mb": round(rss[-1]) if rss else None,
            "series": [{"tb": w.tb, "file_s": w.file_s, "tail_s": w.tail_s, "rows": w.rows,
                        "partial_rows": w.partial_rows, "rss_mb": w.rss_mb} for w in ws]}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lag_ax, rss_ax) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for r in results:
        s = r["series"]
        if not s:
            continue
        t0 = s[0]["tb"]
        x = [(w["tb"] - t0) * WINDOW_S / 60 for w in s]
        label = f"{r['pps_offered'] // 1000}K pps, {r['groups'] // 1000}K groups"
        lag_ax.plot(x, [w["file_s"] for w in s], label=label)
        rss_ax.plot(x, [w["rss_mb"] for w in s], label=label)
    lag_ax.set_ylabel("window end -> rows written (s)")
    rss_ax.set_ylabel("RSS, server + JVM (MB)")
    rss_ax.set_xlabel("minutes")
    lag_ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pps", default="400000")
    ap.add_argument("--groups", default="260000")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--mode", choices=("replay", "cluster", "live", "veth"), default="replay",
                    help="replay: serve loops a capture; cluster: 2 agents + collect; live "
                         "(root; veth, its old name): serve --interface on a veth pair")
    ap.add_argument("--dir", type=Path, default=None,
                    help="keep the captures and logs here (default: a new temporary folder)")
    ap.add_argument("--declare", action="store_true",
                    help="declare the groups per window in the query (expected_groups): its "
                         "table starts at their size instead of growing over the first windows")
    ap.add_argument("--debug", action="store_true",
                    help="the server or collector logs with -vv: each micro-batch's timings")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.mode == "veth":
        args.mode = "live"
    if args.mode == "live":
        for tool in ("tcpreplay", "ip"):
            if shutil.which(tool) is None:
                sys.exit(f"bench.sustained --mode live needs {tool}")
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="oopscope-bench-sustained-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = [one_run(int(p), int(g), args.minutes, args.mode, workdir, args.declare,
                       args.debug)
               for p in args.pps.split(",") for g in args.groups.split(",")]
    keys = [k for k in results[0] if k != "series"]
    width = max(map(len, keys))
    for r in results:
        print()
        for k in keys:
            print(f"{k.ljust(width)}  {r[k]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
