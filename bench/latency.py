"""Latency of the high level: time from a window's closing punctuation to its rows in the sink.

A paced feed writes, every `--interval` seconds and for each of two links, the partial rows of
the current window plus punctuation closing it, while a continuously triggered Spark stage
runs in this process. A recording sink notes when each window's rows arrive. Prints a table of
Spark start-up time, per-micro-batch time and latency (median, p90, max), and writes JSON.

    python -m bench.latency --windows 40 --interval 1.0 --trigger "200 milliseconds"
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger("bench_latency")
SECOND = 10**9


def _quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=40, help="windows to feed and close")
    parser.add_argument("--warmup", type=int, default=12,
                        help="first windows left out (the JVM JIT-compiles Spark for ~10 batches)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between windows")
    parser.add_argument("--rows", type=int, default=200, help="partial rows per link and window")
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--trigger", default="200 milliseconds")
    parser.add_argument("--master", default=None)
    parser.add_argument("--json", default="bench_latency.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    import numpy as np

    from common.spool import SpoolWriter
    from highlevel.aggregate import AggregateStage
    from highlevel.session import get_session
    from highlevel.sinks import Sink
    from highlevel.testing import demo_spec, random_partials

    arrived: dict[int, float] = {}
    lock = threading.Lock()

    class RecordingSink(Sink):
        def write(self, batch_id, table):
            now = time.time()
            with lock:
                for tb in set(table.column("tb").to_pylist()):
                    arrived.setdefault(tb, now)
            return True

    work = Path(tempfile.mkdtemp(prefix="oopscope-latency-"))
    started = time.time()
    spark = get_session(args.master)
    startup = time.time() - started
    spec = demo_spec(query="lat", links=("a", "b"))
    stage = AggregateStage(spec, work / "spool", work / "ck", [RecordingSink()], spark=spark,
                           trigger=args.trigger)
    query = stage.start()
    rng = np.random.default_rng(0)
    writers = {l: SpoolWriter(work / "spool", "lat", l) for l in spec.links}
    closed_at: dict[int, float] = {}
    base = 1000
    try:
        for i in range(args.windows):
            tick = time.time()
            w = base + i
            for writer in writers.values():
                rows = random_partials(rng, [w], args.rows, groups=args.groups, query="lat")
                writer.write([rows], (w + 1) * SECOND)
            closed_at[w] = time.time()          # both links have punctuated past end(w)
            time.sleep(max(0.0, args.interval - (time.time() - tick)))
        deadline = time.time() + 60
        while time.time() < deadline and len(arrived) < args.windows:
            time.sleep(0.05)
        query.processAllAvailable()           # let the last batch commit before stopping
    finally:
        stage.stop()
        shutil.rmtree(work, ignore_errors=True)
    latencies = [arrived[w] - closed_at[w] for w in sorted(closed_at)[args.warmup:]
                 if w in arrived]
    missing = [w for w in closed_at if w not in arrived]
    batches = stage.batch_seconds[args.warmup:] or stage.batch_seconds
    result = {
        "spark_startup_s": round(startup, 2),
        "trigger": args.trigger,
        "windows": args.windows, "warmup": args.warmup, "missing": missing,
        "batch_s_median": round(statistics.median(batches), 3) if batches else None,
        "batch_s_p90": round(_quantile(batches, 0.9), 3) if batches else None,
        "latency_s_median": round(statistics.median(latencies), 3) if latencies else None,
        "latency_s_p90": round(_quantile(latencies, 0.9), 3) if latencies else None,
        "latency_s_max": round(max(latencies), 3) if latencies else None,
        "batches": len(stage.batch_seconds),
    }
    print(f"{'metric':<22}{'value':>12}")
    for key, value in result.items():
        if key not in ("missing",):
            print(f"{key:<22}{value!s:>12}")
    Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if not missing else 1


if __name__ == "__main__":
    raise SystemExit(main())
