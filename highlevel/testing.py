"""Test helpers for the high level, public for users too: fake clock, list sink, partial rows.

Also a small command line used by the restart and cluster tests (and `bench/latency.py`) to
run a stage in its own process:
`python -m highlevel.testing run-stage --spool S --checkpoint C --out D [--master URL]`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.spool import END_OF_INPUT
from highlevel.sinks import Sink
from highlevel.spec import KeySpec, OutputColumn, StageSpec
from highlevel.warmup import EVERY_KIND
from queries import expressions as E
from queries.plan import WindowPlan

log = logging.getLogger(__name__)


@dataclass
class FakeClock:
    """A clock tests drive by hand (seconds, like `time.time`)."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass
class ListSink(Sink):
    """Keeps every batch's rows in memory (`tables`, `rows()`); idempotent per batch id."""

    tables: dict = field(default_factory=dict)

    def write(self, batch_id: int, table: pa.Table) -> bool:
        if batch_id in self.tables:
            return False
        self.tables[batch_id] = table
        return True

    def table(self) -> pa.Table | None:
        tables = [t for _, t in sorted(self.tables.items()) if t.num_rows]
        return pa.concat_tables(tables) if tables else None


class ParquetDirSink(Sink):
    """Each batch's rows as `DIR/part-<batch>.parquet` (the `run-stage` command's output, in
    the layout of `tools.results.parts.ParquetSink`, which the application writes)."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def write(self, batch_id: int, table: pa.Table) -> bool:
        import os

        import pyarrow.parquet as pq

        path = self.dir / f"part-{batch_id:010d}.parquet"
        if path.exists():
            return False
        if table.num_rows:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        return True


def col(name: str) -> E.Column:
    return E.Column(name=name)


def demo_spec(query: str = "demo", links=("a", "b"), pane_s: int = 1, range_s: int | None = None,
              registers: int = 16, having=None) -> StageSpec:
    """A query using every sub-aggregate kind and an IP key:

    SELECT tb, srcIP, port, count(*), sum(len), avg(len), min(len), max(seq), or_aggr(flags),
    first(ttl), last(ttl), count_distinct(destIP) GROUP BY time/pane AS tb, srcIP, port
    """
    range_s = range_s or pane_s
    pane = np.gcd(pane_s, range_s) * 10**9
    window = WindowPlan(pane_ns=int(pane), range_ns=range_s * 10**9, slide_ns=pane_s * 10**9,
                        column="tb")
    states = EVERY_KIND
    outputs = (OutputColumn("tb", col("tb"), "int64"),
               OutputColumn("srcIP", col("srcIP"), "ip"),
               OutputColumn("port", col("port"), "int64"),
               OutputColumn("cnt", col("cnt"), "int64"),
               OutputColumn("bytes", col("bytes"), "int64"),
               OutputColumn("avg_len", E.Binary(op="/", left=col("bytes"), right=col("cnt")),
                            "float64"),
               OutputColumn("lo", col("lo"), "int64"),
               OutputColumn("hi", col("hi"), "uint64"),
               OutputColumn("flags", col("flags"), "int64"),
               OutputColumn("ttl_first", col("ttl_first"), "int64"),
               OutputColumn("ttl_last", col("ttl_last"), "int64"),
               OutputColumn("dests", E.Func(name="hll_estimate", args=[col("dests")]), "int64"))
    return StageSpec(query=query, links=tuple(links), window=window,
                     keys=(KeySpec("srcIP", "ip"), KeySpec("port", "int64")), states=states,
                     outputs=outputs, having=having, distinct_registers=registers)


def random_partials(rng: np.random.Generator, windows, rows: int, groups: int = 8,
                    registers: int = 16, query: str = "demo") -> pa.RecordBatch:
    """Partial rows of `demo_spec` over the given pane ids: several rows per (window, group),
    IPv4-mapped and IPv6 source addresses, uint64 maxima above 2**63."""
    windows = np.asarray(windows, dtype=np.int64)
    g = rng.integers(0, groups, rows)
    v6 = g % 3 == 0
    hi = np.where(v6, np.uint64(0x20010DB800000000) + g.astype(np.uint64), np.uint64(0))
    lo = np.where(v6, g.astype(np.uint64),
                  np.uint64(0xFFFF_0000_0000) | (np.uint64(0x0A000000) + g.astype(np.uint64)))
    t = rng.integers(0, 1000, rows)
    regs = rng.integers(0, 6, (rows, registers), dtype=np.uint8)
    regs[rng.random((rows, registers)) < 0.5] = 0
    columns = {
        "window": pa.array(rng.choice(windows, rows), pa.int64()),
        "srcIP__hi": pa.array(hi, pa.uint64()),
        "srcIP__lo": pa.array(lo, pa.uint64()),
        "port": pa.array((g * 7919) % 65536, pa.int64()),
        "cnt": pa.array(rng.integers(1, 50, rows), pa.int64()),
        "bytes": pa.array(rng.integers(40, 1500, rows), pa.int64()),
        "lo": pa.array(rng.integers(-1000, 1000, rows), pa.int64()),
        "hi": pa.array(rng.integers(0, 2**63, rows, dtype=np.uint64) * np.uint64(2)
                       + np.uint64(1), pa.uint64()),
        "flags": pa.array(1 << rng.integers(0, 8, rows), pa.int64()),
        "ttl_first": pa.array(rng.integers(1, 255, rows), pa.int64()),
        "ttl_first__t": pa.array(t, pa.int64()),
        "ttl_last": pa.array(rng.integers(1, 255, rows), pa.int64()),
        "ttl_last__t": pa.array(t + rng.integers(0, 5, rows), pa.int64()),
        "dests": pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(registers), rows, [None, pa.py_buffer(regs.tobytes())]),
    }
    return pa.RecordBatch.from_pydict(columns, metadata={b"query": query.encode()})


def batch_frame(spark, spec: StageSpec, paths) -> object:
    """A (non-streaming) DataFrame of some spool files, shaped like one micro-batch, so tests
    can drive `Stage.process_batch(frame, batch_id)` with batches of their choosing."""
    return spark.read.schema(spec.spool_schema()).parquet(*[str(p) for p in paths])


def feed_spool(low_plans, batches: dict, spool, *, pieces: int = 4, disorder_ns: int = 0,
               seed: int = 0) -> dict:
    """Run low-level plans over packet batches and write their spools as the pipeline does
    (`LowLevelOperator` -> `SpoolWriter`): each link's packets arrive in `pieces` chunks in the
    order of `timestamp + U(0, disorder_ns)` (bounded disorder); after each chunk every
    operator of the link gets the punctuation `arrival key - disorder_ns` (valid: no later
    packet is older), its partial rows and output punctuation go to one spool file; at the end
    `finish()` and END_OF_INPUT. Returns {plan.query: operator counters summed}."""
    from common.spool import SpoolWriter
    from lowlevel.operator import LowLevelOperator

    rng = np.random.default_rng(seed)
    counters: dict = {}
    by_link: dict = {}
    for lp in low_plans:
        by_link.setdefault(lp.link, []).append(lp)
    for link, plans in by_link.items():
        batch = batches[link]
        ts = batch["timestamp"].astype(np.int64)
        key = ts + (rng.integers(0, disorder_ns + 1, len(ts)) if disorder_ns else 0)
        order = np.argsort(key, kind="stable")
        ops = [(LowLevelOperator(lp), SpoolWriter(spool, lp.query, lp.link, fsync=False))
               for lp in plans]
        cuts = np.array_split(order, pieces)
        for idx in cuts:
            if not len(idx):
                continue
            part = batch.take(idx)
            p = int(key[idx].max()) - disorder_ns
            for op, writer in ops:
                rows = list(op.process(part))
                more, out = op.punctuate(p)
                writer.write(rows + list(more), out)
        for op, writer in ops:
            rows, _ = op.finish()
            writer.write(list(rows), END_OF_INPUT)
            c = counters.setdefault(op.plan.query, {})
            for k, v in op.counters.items():
                c[k] = c.get(k, 0) + v
    return counters


def _run_stage(args) -> int:
    from highlevel.aggregate import AggregateStage
    from highlevel.session import get_session

    spec = demo_spec(query=args.query, links=tuple(args.links.split(",")), pane_s=args.pane_s,
                     range_s=args.range_s)
    started = time.time()
    spark = get_session(args.master, conf={"spark.executor.memory": args.executor_memory})
    sc = spark.sparkContext
    deadline = time.time() + 90
    while True:   # executors register with the driver asynchronously on a cluster
        executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # noqa: SLF001 (driver)
        if sc.master.startswith("local") or executors > 0 or time.time() > deadline:
            break
        time.sleep(0.2)
    print(f"master={sc.master} executors={executors} startup={time.time() - started:.1f}s",
          flush=True)
    stage = AggregateStage(spec, args.spool, args.checkpoint, [ParquetDirSink(args.out)],
                           spark=spark, trigger=args.trigger,
                           max_files_per_trigger=args.max_files)
    if args.available_now:
        stage.run_available()
    else:
        query = stage.start()
        print("started", flush=True)
        query.awaitTermination(args.timeout)
        stage.stop()
    print("done", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m highlevel.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run-stage", help="run demo_spec's stage over a spool")
    run.add_argument("--spool", required=True)
    run.add_argument("--checkpoint", required=True)
    run.add_argument("--out", required=True)
    run.add_argument("--query", default="demo")
    run.add_argument("--links", default="a,b")
    run.add_argument("--pane-s", type=int, default=1)
    run.add_argument("--range-s", type=int, default=None)
    run.add_argument("--master", default=None)
    run.add_argument("--trigger", default="200 milliseconds")
    run.add_argument("--available-now", action="store_true")
    run.add_argument("--max-files", type=int, default=None, help="files per micro-batch")
    run.add_argument("--executor-memory", default="512m")
    run.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return _run_stage(args)


if __name__ == "__main__":
    sys.exit(main())


def canonical_rows(frame, columns) -> list[tuple]:
    """Rows of a result (a sink's table as pandas, or the reference evaluator's frame) as
    sorted tuples of plain values: ip text and 128-bit ints both as ints (IPv4 mapped),
    floats rounded to 6 places, nulls and NaN as None; `columns` are (name, GSQL type)."""
    import ipaddress
    import math

    def norm(v, t):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return None
        if t == "ip":
            if isinstance(v, str):
                a = ipaddress.ip_address(v)
                return int(a) | (0xFFFF << 32) if a.version == 4 else int(a)
            return int(v)
        if isinstance(v, (float, np.floating)):
            f = float(v)
            return round(f, 6) if t in ("float", "double") else (int(f) if f.is_integer() else f)
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        if isinstance(v, (int, np.integer)):
            return int(v)
        return v

    names = [n for n, _ in columns]
    data = frame[names].astype(object).to_numpy() if len(frame) else []
    out = [tuple(norm(v, t) for v, (_, t) in zip(row, columns)) for row in data]
    return sorted(out, key=repr)
