"""The warm-up of a fresh JVM: an aggregation run end to end while the low level reads.

A fresh JVM loads and compiles the paths of a stage on first use (seconds): the streaming
start, the Parquet scan, the markers job, the combine of every sub-aggregate kind, the close,
the Arrow transfer to the driver. `warm_up` runs a stage of its own query, set as the
appliance sets its stages, through all of them, so the real stages find them ready:

- a first batch past the driver's limit (`highlevel.smallbatch.MAX_ROWS`) closes one window
  and keeps the next open in one Spark job (`AggregateStage.close_keeping`). Its rows are
  enough for the JVM to compile its hot loops (scan, hash aggregation, Arrow writer): with a
  few dozen rows they ran interpreted, and the first windows of 260K groups took 2-3 s
  instead of 1;
- a second, small batch closes the rest on the driver.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.spool import END_OF_INPUT, SpoolWriter
from highlevel import smallbatch
from highlevel.aggregate import AggregateStage
from highlevel.sinks import Sink
from highlevel.spec import KeySpec, OutputColumn, StageSpec
from queries import expressions as E
from queries.plan import SubAggregate, WindowPlan

log = logging.getLogger(__name__)

QUERY, LINK, REGISTERS = "warmup", "a", 4
#: the first batch's rows (past the driver's limit) and groups per window; the second's rows
LARGE, GROUPS, SMALL = smallbatch.MAX_ROWS + 1, 50_000, 64
SECOND = 10**9


#: one state of every sub-aggregate kind (the `highlevel.testing` demo query has them too)
EVERY_KIND = (SubAggregate("cnt", "count", None, "int64"),
              SubAggregate("bytes", "sum", None, "int64"),
              SubAggregate("lo", "min", None, "int64"),
              SubAggregate("hi", "max", None, "uint64"),
              SubAggregate("flags", "or", None, "int64"),
              SubAggregate("ttl_first", "first", None, "int64"),
              SubAggregate("ttl_last", "last", None, "int64"),
              SubAggregate("dests", "distinct", None, "binary"))


class _Discard(Sink):
    def write(self, batch_id: int, table: pa.Table) -> bool:
        return True


def warm_up(spark, work: str | os.PathLike) -> float:
    """Run a tiny stage end to end in `work` (an empty directory): streaming start, Parquet
    scan, markers, combine, close, Arrow to the driver. A fresh JVM loads and compiles these
    paths on first use (seconds); done while the low level runs, the real stage finds them
    ready. Returns the seconds it took."""
    started = time.perf_counter()
    work = Path(work)
    spool = SpoolWriter(work / "spool", QUERY, LINK, fsync=False)
    spool.write([_partials(LARGE, (1, 2), 0)], 2 * SECOND)       # closes pane 1
    spool.write([_partials(SMALL, (2, 3), 1)], END_OF_INPUT)
    stage = AggregateStage(_spec(), work / "spool", work / "ck", [_Discard()], spark=spark,
                           max_files_per_trigger=1)
    stage.open_on_driver = stage.small_on_driver = True      # as `serve` sets its stages
    stage.run_available()
    return time.perf_counter() - started


def warm_session(spark) -> None:
    """`warm_up` in a temporary directory before a long-running process (the appliance, a
    collector) starts its stages, logged, unless OOPSCOPE_SPARK_WARMUP=0; a failure is a
    warning (only the first windows are slower)."""
    import tempfile

    from common import settings

    if not settings.spark_warmup():
        log.info("Spark not warmed up (OOPSCOPE_SPARK_WARMUP=0): the first windows pay it")
        return
    try:
        with tempfile.TemporaryDirectory(prefix="oopscope-warmup-") as work:
            log.info("Spark warmed up: a micro-batch's code paths compiled in %.1f s",
                     warm_up(spark, work))
    except Exception as exc:  # noqa: BLE001 - only the first windows are slower
        log.warning("Spark's warm-up failed (%s): the first windows may be slower",
                    str(exc).splitlines()[0][:200])


def _spec() -> StageSpec:
    """One-second windows keyed by an IP and a port, with a state of every sub-aggregate
    kind and outputs that read each (an expression and a COUNT_DISTINCT estimate too)."""
    col = lambda name: E.Column(name=name)
    states = EVERY_KIND
    outputs = (OutputColumn("tb", col("tb"), "int64"), OutputColumn("srcIP", col("srcIP"), "ip"),
               OutputColumn("port", col("port"), "int64"),
               *(OutputColumn(s.name, col(s.name), "uint64" if s.dtype == "uint64" else "int64")
                 for s in states[:-1]),
               OutputColumn("avg_len", E.Binary(op="/", left=col("bytes"), right=col("cnt")),
                            "float64"),
               OutputColumn("dests", E.Func(name="hll_estimate", args=[col("dests")]), "int64"))
    window = WindowPlan(pane_ns=SECOND, range_ns=SECOND, slide_ns=SECOND, column="tb")
    return StageSpec(query=QUERY, links=(LINK,), window=window,
                     keys=(KeySpec("srcIP", "ip"), KeySpec("port", "int64")), states=states,
                     outputs=outputs, distinct_registers=REGISTERS)


def _partials(rows: int, panes: tuple[int, ...], seed: int) -> pa.RecordBatch:
    """`rows` partial rows of `_spec` in `panes`: up to GROUPS groups, IPv4-mapped
    addresses."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, GROUPS, rows)
    t = rng.integers(0, 1000, rows)
    regs = rng.integers(0, 6, (rows, REGISTERS), dtype=np.uint8)
    ints = lambda low, high: pa.array(rng.integers(low, high, rows), pa.int64())
    columns = {
        "window": pa.array(rng.choice(panes, rows), pa.int64()),
        "srcIP__hi": pa.array(np.zeros(rows, np.uint64)),
        "srcIP__lo": pa.array(np.uint64(0xFFFF_0A00_0000) + g.astype(np.uint64)),
        "port": pa.array(g * 7919, pa.int64()),
        "cnt": ints(1, 50), "bytes": ints(40, 1500), "lo": ints(-1000, 1000),
        "hi": pa.array(rng.integers(0, 2**63, rows, dtype=np.uint64), pa.uint64()),
        "flags": pa.array(1 << rng.integers(0, 8, rows), pa.int64()),
        "ttl_first": ints(1, 255), "ttl_first__t": pa.array(t, pa.int64()),
        "ttl_last": ints(1, 255), "ttl_last__t": pa.array(t + 1, pa.int64()),
        "dests": pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(REGISTERS), rows, [None, pa.py_buffer(regs.tobytes())]),
    }
    return pa.RecordBatch.from_pydict(columns, metadata={b"query": QUERY.encode()})
