"""Benchmark of the Spark high level's combine: `oopscope run` of a per-10-s (srcIP, destIP) query beside Spark's own groupBy.

    python -m bench.highlevel_combine [--packets 5M] [--groups 260K] [--dir DIR]
                                      [--repeat 3] [--json bench_highlevel_combine.json]

The capture is the NetFlow benchmark's anchor (`oopscope gen -n 5M --duration 10min --groups
260k --snaplen 64 --icmp 0 --udp 0.3 --tcp 0.7`), kept in --dir and reused while its
parameters match. The query (issue 35):

    SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
    FROM IPV4 GROUP BY time/10 AS tb, srcIP, destIP

Each turn runs, in a fresh process each:
- oopscope: `oopscope -v run QUERY --link main=CAP --output pairs10=OUT.csv --spool SPOOL`;
  its summary gives the Spark stage's seconds and the partial rows it combined (the low level
  ends before Spark is up on this capture, so the stage is the whole combine);
- softflowd: `softflowd -r CAP` metering the same file into nfcapd (`bench.netflow`'s
  turn), the anchor of issue 35's target for the whole run (at least 2x as fast);
- Spark's own: a session with the same settings as the run's (`highlevel.session.get_session`:
  the quick JVM, shuffle partitions per core), reading the partial rows the run spooled
  (Parquet) and `groupBy(window, srcIP, destIP).agg(sum(cnt), sum(sum_len))` written as CSV
  by Spark; timed on its fresh JVM (cold, as the run's stage is) and then twice more (warm).

The table gives medians over turns; each ratio is the median of the per-turn ratios of the
Spark stage's seconds to Spark's own (below 1: the stage is faster). The page cache is warm
(the capture is read once before the turns), and the Numba kernels are compiled by a first
run that is not timed. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.netflow import run_softflowd
from bench.workloads import REPO, cli, kept_capture, warm_file, work_dir

log = logging.getLogger(__name__)

QUERY = """DEFINE { query_name pairs10; }
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM IPV4
GROUP BY time/10 AS tb, srcIP, destIP
"""
#: the partial rows' columns: the window, the keys, the two states
PARTIAL_SCHEMA = ("__link string, __seq long, __punct long, window long, srcIP long, "
                  "destIP long, cnt long, sum_len long")


def count(text: str) -> int:
    from tools.commands.params import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def make_capture(path: Path, packets: int, groups: int) -> Path:
    cmd = cli("gen", str(path), "-n", str(packets), "--duration", "10min", "--groups",
              str(groups), "--snaplen", "64", "--icmp", "0", "--udp", "0.3", "--tcp", "0.7")
    return kept_capture(path, f"{packets} {groups} anchor", lambda _: subprocess.run(
        cmd, check=True, cwd=REPO))


def run_oopscope(query: Path, capture: Path, work: Path, timeout: float) -> dict:
    """One `oopscope run` (a fresh process); its Spark stage's seconds and partial rows."""
    spool, out = work / "spool", work / "pairs10.csv"
    shutil.rmtree(spool, ignore_errors=True)
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cli("-v", "run", str(query), "--link", f"main={capture}", "--output",
                              f"pairs10={out}", "--spool", str(spool)),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return {"status": f"exit {proc.returncode}: {tail[0][:160]}", "seconds": seconds}
    stage = re.search(r"Spark stage ([\d.]+) s", proc.stderr)
    partial = re.search(r"([\d]+) partial rows", proc.stderr)
    rows = re.search(r"pairs10: (\d+) rows ->", proc.stderr)
    return {"status": "ok", "seconds": seconds,
            "stage_seconds": float(stage.group(1)) if stage else None,
            "partial_rows": int(partial.group(1)) if partial else None,
            "result_rows": int(rows.group(1)) if rows else None,
            "spool": str(spool / "pairs10" / "partials")}


def run_anchor(partials: Path, work: Path, timeout: float) -> dict:
    """Spark's own groupBy over the run's partial rows, in a fresh process (`--anchor`)."""
    proc = subprocess.run([sys.executable, "-m", "bench.highlevel_combine", "--anchor",
                           str(partials), "--dir", str(work)], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return {"status": f"exit {proc.returncode}: {tail[0][:160]}"}
    return {"status": "ok", **json.loads(proc.stdout.strip().splitlines()[-1])}


def anchor(partials: Path, work: Path, turns: int = 3) -> dict:
    """In this process: Spark's groupBy + CSV write over the Parquet partial rows, on the
    session the run would have (first turn cold, the others warm)."""
    from pyspark.sql import functions as F

    from highlevel.session import get_session

    t0 = time.perf_counter()
    spark = get_session()
    session = time.perf_counter() - t0
    files = sorted(str(p) for p in partials.glob("*.parquet"))
    seconds = []
    for turn in range(turns):
        out = work / f"anchor-{turn}"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        rows = spark.read.schema(PARTIAL_SCHEMA).parquet(*files) \
            .where(F.col("window").isNotNull())
        rows.groupBy("window", "srcIP", "destIP") \
            .agg(F.sum("cnt").alias("packets"), F.sum("sum_len").alias("bytes")) \
            .write.csv(str(out))
        seconds.append(time.perf_counter() - t)
        shutil.rmtree(out, ignore_errors=True)
    return {"session_seconds": session, "cold_seconds": seconds[0],
            "warm_seconds": statistics.median(seconds[1:]) if turns > 1 else None}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=count, default=count("5M"))
    ap.add_argument("--groups", type=count, default=count("260K"))
    ap.add_argument("--dir", help="where the capture is kept (default: a temporary directory)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", default="bench_highlevel_combine.json")
    ap.add_argument("--anchor", help=argparse.SUPPRESS)     # the anchor's own process
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    work = work_dir(args.dir, "oopscope-bench-combine-")
    if args.anchor:
        print(json.dumps(anchor(Path(args.anchor), work)))
        return 0
    capture = make_capture(work / f"pairs-{args.packets}-{args.groups}.pcap", args.packets,
                           args.groups)
    query = work / "pairs10.gsql"
    query.write_text(QUERY)
    warm_file(capture)
    first = run_oopscope(query, capture, work, args.timeout)     # compiles the kernels
    if first["status"] != "ok":
        log.error("oopscope run failed: %s", first["status"])
        return 1
    turns: list[dict[str, dict]] = []
    for turn in range(args.repeat):
        run = run_oopscope(query, capture, work, args.timeout)
        spark = run_anchor(Path(run["spool"]), work, args.timeout) \
            if run["status"] == "ok" else {"status": "not run"}
        flows = run_softflowd(capture, work, args.timeout)
        turns.append({"oopscope": run, "spark": spark, "softflowd": flows})
        log.info("turn %d: run %s s, its Spark stage %s s (%s partial rows); Spark's groupBy + "
                 "CSV: cold %s s, warm %s s; softflowd %s s", turn, _fmt(run.get("seconds")),
                 run.get("stage_seconds"), run.get("partial_rows"),
                 _fmt(spark.get("cold_seconds")), _fmt(spark.get("warm_seconds")),
                 _fmt(flows.get("seconds")))
    ok = [t for t in turns if t["oopscope"]["status"] == "ok" and t["spark"]["status"] == "ok"]
    stage = _median([t["oopscope"]["stage_seconds"] for t in ok])
    rows = _median([t["oopscope"]["partial_rows"] for t in ok])
    summary = {
        "partial_rows": rows,
        "result_rows": _median([t["oopscope"]["result_rows"] for t in ok]),
        "run_seconds": _median([t["oopscope"]["seconds"] for t in ok]),
        "stage_seconds": stage,
        "stage_rows_per_s": rows / stage if rows and stage else None,
        "spark_cold_seconds": _median([t["spark"]["cold_seconds"] for t in ok]),
        "spark_warm_seconds": _median([t["spark"]["warm_seconds"] for t in ok]),
        "stage_over_spark_cold": _median([t["oopscope"]["stage_seconds"] / t["spark"]["cold_seconds"]
                                          for t in ok]),
        "stage_over_spark_warm": _median([t["oopscope"]["stage_seconds"] / t["spark"]["warm_seconds"]
                                          for t in ok]),
        "softflowd_seconds": _median([t["softflowd"].get("seconds") for t in ok]),
        # above 1: the whole run is faster than softflowd
        "softflowd_over_run": _median([t["softflowd"]["seconds"] / t["oopscope"]["seconds"]
                                       for t in ok if t["softflowd"].get("seconds")]),
    }
    print(f"{'':32} {'seconds':>8} {'M rows/s':>9}")
    for name, key in (("oopscope run (whole)", "run_seconds"), ("its Spark stage", "stage_seconds"),
                      ("Spark groupBy + CSV, cold", "spark_cold_seconds"),
                      ("Spark groupBy + CSV, warm", "spark_warm_seconds"),
                      ("softflowd -r", "softflowd_seconds")):
        value = summary[key]
        rate = f"{rows / value / 1e6:9.2f}" if rows and value else f"{'':9}"
        print(f"{name:32} {_fmt(value):>8} {rate}")
    print(f"partial rows {rows}, result rows {summary['result_rows']}; Spark stage / Spark's own: "
          f"{_fmt(summary['stage_over_spark_cold'])} (cold), "
          f"{_fmt(summary['stage_over_spark_warm'])} (warm); the run is "
          f"{_fmt(summary['softflowd_over_run'])}x as fast as softflowd")
    Path(args.json).write_text(json.dumps({"summary": summary, "turns": turns}, indent=2))
    return 0


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    sys.exit(main())
