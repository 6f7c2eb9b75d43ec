"""Benchmark of the low level: thesis Q8-1 (count per srcIP, destIP per minute), pcap in -> partial rows out, beside tcpdump, softflowd and nfpcapd on the same files.

    python -m bench.lowlevel [--quick] [--packets 5000000] [--repeat 3]
                                   [--dir DIR] [--json bench_lowlevel.json] [--probes N]

Captures come from the traffic generator (`tools.gen.traffic`): Ethernet/IPv4 TCP+UDP, 64-byte snap
length, 10 minutes of data time, 66K/130K/260K/520K (srcIP, destIP) groups, in time order.
For each capture and each hash table of 1/2, 1 and 2 x groups and each flush policy (iop_slow
with i = 1, oop_lazy, oop_slow with i = 160; m = 2) we time, on a warm JIT and warm page cache:

The tables are adaptive (`lowlevel.sizing`; started at the factor's size) and probe
`--probes` slots before evicting (default `lowlevel.sizing.ADAPTIVE_PROBES`).

- `read+agg`: `capture.reader.open_capture(columns=op.read_columns)` (only the plan's
  columns decoded; `--prefetch 2` adds the read-ahead thread, `--plain-reader` decodes every
  column) -> `LowLevelOperator.process` (WHERE, keys, the hash-table kernel, Arrow partial
  rows) with punctuation after every batch, then `finish()`: one process, one core;
- `agg only`: the engine alone over the decoded key columns in memory (the kernel's own rate);
- `op only`: `LowLevelOperator` (protocol, keys, kernel, Arrow rows) over batches decoded
  beforehand and held in memory: the consumer side of the read-ahead pipeline;
- `read only` (once per capture): the reader alone with the plan's columns, no thread: the
  producer side. With read-ahead on two free cores `read+agg` approaches the smaller of the
  two; on a loaded machine it falls towards their harmonic sum;

and, once per capture, `tcpdump -r F -w /dev/null`, `softflowd -r F -n 127.0.0.1:9 -v 5
-m 1000000` and `nfpcapd -r F -w DIR`. Rates are packets per wall-clock second, medians of
--repeat runs (the external tools run once with --quick). Not a test; figures on a shared
machine are noisy, compare within one run.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import click

from bench.workloads import generated_capture, warm_file, work_dir

log = logging.getLogger(__name__)

Q8_1 = ("SELECT tb, srcIP, destIP, count(*) FROM main.IPV4 "
        "GROUP BY time/60 AS tb, srcIP, destIP")
GROUPS = (66_000, 130_000, 260_000, 520_000)
FACTORS = (0.5, 1.0, 2.0)
POLICIES = ("iop_slow", "oop_lazy", "oop_slow")
SLOW_FLUSH = {"iop_slow": 1, "oop_lazy": 160, "oop_slow": 160}


def make_capture(directory: Path, groups: int, packets: int) -> Path:
    """The Q8-1 capture with `groups` groups (generated once, reused while it matches)."""
    from tools.gen.traffic import NS, TrafficConfig

    cfg = TrafficConfig(packets=packets, duration_ns=600 * NS, groups=groups, tcp=0.8,
                        udp=0.2, icmp=0.0, snaplen=64, sizes="imix", seed=groups)
    return generated_capture(directory / f"q81_{groups}_{packets}.pcap", cfg)


def q81_plan(slots: int, flush: str):
    from queries.parser import parse
    from queries.planner import plan_file

    low = plan_file(parse(Q8_1), ["main"]).queries[0].low[0]
    return replace(low, slots=slots, flush=flush, slow_flush=SLOW_FLUSH[flush], max_disorder=2)


#: reader options of `time_operator`: decode only the columns the plan reads (the target is
#: one core, so no read-ahead thread unless --prefetch; `--plain-reader`: every column)
READER = {"columns": True, "prefetch": 0, "batch_size": 65536}
#: the slots a packet probes before evicting (`--probes`; None: the operator's choice,
#: `lowlevel.sizing.ADAPTIVE_PROBES` for these adaptive tables)
PROBES: dict[str, int | None] = {"probes": None}


def _probes() -> int:
    from lowlevel.sizing import ADAPTIVE_PROBES

    return PROBES["probes"] or ADAPTIVE_PROBES


def time_operator(path: Path, plan) -> tuple[float, int, int, dict]:
    """Read + decode + sub-aggregate one capture: (seconds, packets, partial rows, counters)."""
    from capture.reader import open_capture
    from lowlevel.operator import LowLevelOperator

    op = LowLevelOperator(plan, probes=_probes())
    rows = packets = 0
    t0 = time.perf_counter()
    columns = op.read_columns if READER["columns"] else None
    with open_capture(path, link="main", batch_size=READER["batch_size"], columns=columns,
                      prefetch=READER["prefetch"]) as reader:
        for batch in reader:
            packets += len(batch)
            rows += sum(b.num_rows for b in op.process(batch))
            # the capture is in time order: its last time is a valid low-watermark
            got, _ = op.punctuate(int(batch["timestamp"][-1]))
            rows += sum(b.num_rows for b in got)
    got, _ = op.finish()
    rows += sum(b.num_rows for b in got)
    return time.perf_counter() - t0, packets, rows, op.counters


def decoded_keys(path: Path):
    """(timestamps, stacked keys) of a capture, decoded once, for the aggregate-only timing."""
    import numpy as np

    from capture.reader import open_capture

    ts, src, dst = [], [], []
    with open_capture(path, link="main", batch_size=1 << 18) as reader:
        for b in reader:
            ts.append(b["timestamp"].copy())
            src.append(b["srcIP_lo"] & np.uint64(0xFFFF_FFFF))
            dst.append(b["destIP_lo"] & np.uint64(0xFFFF_FFFF))
    return np.concatenate(ts), np.stack([np.concatenate(src), np.concatenate(dst)], axis=1)


def decoded_batches(path: Path, columns) -> list:
    """The capture's batches decoded once, only `columns` copied (the others share one zero
    array, so 5M packets fit in memory), for the operator-only timing."""
    import numpy as np

    from capture.batch import PacketBatch
    from capture.reader import open_capture
    from capture.schema import COLUMNS

    bs = READER["batch_size"]
    zeros = {c.name: np.zeros(bs, c.dtype) for c in COLUMNS}
    out = []
    with open_capture(path, link="main", batch_size=bs, columns=columns) as reader:
        for b in reader:
            n = len(b)
            out.append(PacketBatch("main", {c.name: (b[c.name].copy() if c.name in columns
                                                     else zeros[c.name][:n]) for c in COLUMNS}))
    return out


def time_op_only(batches, plan) -> float:
    from lowlevel.operator import LowLevelOperator

    op = LowLevelOperator(plan, probes=_probes())
    t0 = time.perf_counter()
    for batch in batches:
        op.process(batch)
        op.punctuate(int(batch["timestamp"][-1]))
    op.finish()
    return time.perf_counter() - t0


def time_read_only(path: Path, columns) -> float:
    from capture.reader import open_capture

    t0 = time.perf_counter()
    with open_capture(path, link="main", batch_size=READER["batch_size"],
                      columns=columns) as reader:
        for _ in reader:
            pass
    return time.perf_counter() - t0


def time_engine(ts, keys, plan, batch: int = 65536) -> float:
    from lowlevel.aggregates import AggSpec, StateLayout
    from lowlevel.engine import HashAggregator

    layout = StateLayout([AggSpec(s.name, s.kind, s.dtype) for s in plan.subaggs])
    agg = HashAggregator(layout, 2, plan.slots, pane_ns=plan.window.pane_ns, flush=plan.flush,
                         slow_flush=plan.slow_flush, max_disorder=plan.max_disorder,
                         probes=_probes())
    args = layout.empty_args(batch)
    t0 = time.perf_counter()
    for a in range(0, len(ts), batch):
        t = ts[a:a + batch]
        agg.append(t, keys[a:a + batch], tuple(x[:len(t)] for x in args))
        agg.punctuate(int(t[-1]))
    agg.finish()
    return time.perf_counter() - t0


def time_until_read(cmd: list[str], workdir: Path, path: Path) -> float | None:
    """softflowd: after the file's EOF it may keep waiting on its control socket (seen when
    started from this process, whose output it buffers), so time until its file offset
    reaches the end of the capture (polling /proc), then stop it."""
    size = path.stat().st_size
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = None
    try:
        while proc.poll() is None and time.perf_counter() - t0 < 900:
            if _read_offset(proc.pid, path) >= size:
                dt = time.perf_counter() - t0
                break
            time.sleep(0.002)
        if dt is None and proc.returncode == 0:
            dt = time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return dt


def _read_offset(pid: int, path: Path) -> int:
    fd_dir = Path(f"/proc/{pid}/fd")
    try:
        for fd in fd_dir.iterdir():
            if Path(fd.readlink()) == path:
                for line in Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().splitlines():
                    if line.startswith("pos:"):
                        return int(line.split()[1])
    except OSError:
        pass
    return -1


def time_tool(cmd: list[str], workdir: Path) -> float | None:
    """Wall-clock seconds of an external tool, or None when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        log.warning("%s is not installed: skipped", cmd[0])
        return None
    if cmd[0] == "softflowd":
        return time_until_read(cmd, workdir, Path(cmd[2]).resolve())
    t0 = time.perf_counter()
    try:
        # stdin closed: softflowd reading a file otherwise waits on it after the EOF
        res = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=900)
    except subprocess.TimeoutExpired:
        log.warning("%s timed out", " ".join(cmd))
        return None
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        log.warning("%s failed (exit %d): %s", " ".join(cmd), res.returncode,
                    res.stderr.strip()[-300:])
        return None
    return dt


def external_tools(path: Path, repeat: int, softflowd: bool) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    with tempfile.TemporaryDirectory(prefix="oopscope-bench-") as tmp:
        work = Path(tmp)
        cmds = {
            "tcpdump": ["tcpdump", "-r", str(path), "-w", "/dev/null"],
            "softflowd": ["softflowd", "-r", str(path), "-n", "127.0.0.1:9", "-v", "5",
                          "-m", "1000000", "-p", str(work / "sf.pid"),
                          "-c", str(work / "sf.ctl")],
            "nfpcapd": ["nfpcapd", "-r", str(path), "-w", str(work / "flows")],
        }
        (work / "flows").mkdir()
        if not softflowd:
            cmds.pop("softflowd")
            out["softflowd"] = None
        for name, cmd in cmds.items():
            times = [t for t in (time_tool(cmd, work) for _ in range(repeat)) if t is not None]
            out[name] = statistics.median(times) if times else None
    return out


def _rate(packets: int, seconds: float | None) -> float | None:
    return None if not seconds else packets / seconds


def _m(rate: float | None) -> str:
    return "-" if rate is None else f"{rate / 1e6:6.2f}"


@click.command()
@click.option("--quick", is_flag=True, help="1M packets, 66K and 260K groups, one repeat.")
@click.option("--packets", type=int, default=None, help="Packets per capture (default 5M).")
@click.option("--repeat", type=int, default=None, help="Runs per figure (median; default 3).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None,
              help="Where the generated captures are kept and reused (default: a fresh "
                   "temporary directory, removed at the end).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=Path("bench_lowlevel.json"), help="Where to write the figures.")
@click.option("--softflowd", "with_softflowd", is_flag=True,
              help="Also time softflowd (started from Python it may hang after the EOF on "
                   "some systems; see time_until_read).")
@click.option("--groups", "groups_opt", type=str, default=None,
              help="Comma-separated group counts (default 66000,130000,260000,520000).")
@click.option("--plain-reader", is_flag=True,
              help="Decode every column, no read-ahead thread (the reader's defaults).")
@click.option("--prefetch", type=int, default=0, show_default=True,
              help="Batches a reader thread decodes ahead (0: no thread, one core; on two "
                   "free cores 2 overlaps decoding with aggregation).")
@click.option("--batch-size", type=int, default=65536, show_default=True)
@click.option("--factors", type=str, default=None,
              help="Comma-separated table factors (default 0.5,1,2).")
@click.option("--no-tools", is_flag=True, help="Skip tcpdump/nfpcapd/softflowd.")
@click.option("--probes", type=click.IntRange(1, 16), default=None,
              help="Slots a packet probes before evicting (default: the adaptive table's, 3).")
def main(quick: bool, packets: int | None, repeat: int | None, directory: Path | None,
         json_path: Path, with_softflowd: bool, groups_opt: str | None, plain_reader: bool,
         prefetch: int, batch_size: int, factors: str | None, no_tools: bool,
         probes: int | None) -> None:
    """Q8-1 throughput of the low level beside tcpdump, softflowd and nfpcapd."""
    PROBES["probes"] = probes
    READER.update(columns=not plain_reader, prefetch=0 if plain_reader else prefetch,
                  batch_size=batch_size)
    factor_list = tuple(float(f) for f in factors.split(",")) if factors else FACTORS
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="bench_lowlevel: %(message)s")
    packets = packets or (1_000_000 if quick else 5_000_000)
    repeat = repeat or (1 if quick else 3)
    groups_list = (tuple(int(g) for g in groups_opt.split(",")) if groups_opt
                   else (66_000, 260_000) if quick else GROUPS)

    directory = work_dir(directory, "oopscope-bench-lowlevel-")
    # warm the JIT on a tiny capture (compile time excluded from every figure)
    warm = make_capture(directory, 1000, 20_000)
    for policy in POLICIES:
        time_operator(warm, q81_plan(1024, policy))

    results = []
    header = (f"{'groups':>7} {'table':>6} {'policy':>9} {'read+agg':>9} {'agg only':>9} "
              f"{'op only':>8} {'read':>6} "
              f"{'rows/pkt':>8} {'forced':>6} | {'tcpdump':>8} {'softflowd':>9} {'nfpcapd':>8}"
              f" {'x sfd':>6} {'x nfp':>6}")
    lines = [f"Q8-1, {packets:,} packets per capture, M packets/s (median of {repeat}), "
             f"warm JIT and page cache, reader {READER}", header, "-" * len(header)]
    print(lines[0], file=sys.stderr)
    for groups in groups_list:
        path = make_capture(directory, groups, packets)
        warm_file(path)
        tools = ({"tcpdump": None, "softflowd": None, "nfpcapd": None} if no_tools
                 else external_tools(path, repeat, with_softflowd))
        ts, keys = decoded_keys(path)
        from lowlevel.operator import LowLevelOperator

        columns = LowLevelOperator(q81_plan(1024, "oop_lazy")).read_columns
        batches = decoded_batches(path, columns)
        read_secs = statistics.median(time_read_only(path, columns) for _ in range(repeat))
        log.info("%d groups: read only (plan columns, no thread) %.2f M packets/s", groups,
                 len(ts) / read_secs / 1e6)
        for factor in factor_list:
            slots = int(groups * factor)
            for policy in POLICIES:
                plan = q81_plan(slots, policy)
                runs = [time_operator(path, plan) for _ in range(repeat)]
                secs = statistics.median(r[0] for r in runs)
                _, n, rows, counters = runs[0]
                agg_secs = statistics.median(time_engine(ts, keys, plan) for _ in range(repeat))
                op_secs = statistics.median(time_op_only(batches, plan) for _ in range(repeat))
                rate = _rate(n, secs)
                row = {
                    "groups": groups, "table_factor": factor, "slots": plan.slots,
                    "table_slots": 1 << (max(2, slots) - 1).bit_length(), "policy": policy,
                    "packets": n, "seconds": secs, "pkts_per_s": rate,
                    "agg_only_pkts_per_s": _rate(n, agg_secs), "partial_rows": rows,
                    "op_only_pkts_per_s": _rate(n, op_secs),
                    "read_only_pkts_per_s": _rate(n, read_secs),
                    "counters": counters,
                    "tools_pkts_per_s": {k: _rate(n, v) for k, v in tools.items()},
                }
                results.append(row)
                tr = row["tools_pkts_per_s"]
                ratio = {k: ("-" if not tr.get(k) else f"{rate / tr[k]:.0f}")
                         for k in ("softflowd", "nfpcapd")}
                line = (f"{groups:>7} {factor:>6g} {policy:>9} {_m(rate):>9} "
                        f"{_m(row['agg_only_pkts_per_s']):>9} {_m(row['op_only_pkts_per_s']):>8} "
                        f"{_m(row['read_only_pkts_per_s']):>6} {rows / max(n, 1):8.3f} "
                        f"{counters['forced_full_flushes']:>6} | {_m(tr['tcpdump']):>8} "
                        f"{_m(tr['softflowd']):>9} {_m(tr['nfpcapd']):>8} "
                        f"{ratio['softflowd']:>6} {ratio['nfpcapd']:>6}")
                lines.append(line)
                print(line, file=sys.stderr)
        del ts, keys, batches
    print("\n".join(lines))
    json_path.write_text(json.dumps({"query": Q8_1, "packets": packets, "repeat": repeat,
                                     "reader": dict(READER),
                                     "page_cache": "warm", "jit": "warm",
                                     "results": results}, indent=1))
    log.info("figures written to %s", json_path)


if __name__ == "__main__":
    main()
