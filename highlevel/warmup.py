"""The warm-up of a fresh JVM: a tiny aggregation run end to end while the low level reads.

A fresh JVM loads and compiles the paths of a stage on first use (seconds): the streaming
start, the Parquet scan, the markers job, the combine of every sub-aggregate kind, the close,
the Arrow transfer to the driver. `warm_up` runs a stage over a few partial rows of its own
query through all of them, so the real stages find them ready.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from common.spool import END_OF_INPUT, SpoolWriter
from highlevel.aggregate import AggregateStage
from highlevel.sinks import Sink
from highlevel.spec import KeySpec, OutputColumn, StageSpec
from queries import expressions as E
from queries.plan import SubAggregate, WindowPlan

QUERY, LINK, REGISTERS, ROWS = "warmup", "a", 4, 64
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
    SpoolWriter(work / "spool", QUERY, LINK, fsync=False).write([_partials()], END_OF_INPUT)
    AggregateStage(_spec(), work / "spool", work / "ck", [_Discard()],
                   spark=spark).run_available()
    return time.perf_counter() - started


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


def _partials() -> pa.RecordBatch:
    """Partial rows of `_spec` in panes 1 and 2: eight groups, IPv4-mapped addresses."""
    rng = np.random.default_rng(0)
    g = rng.integers(0, 8, ROWS)
    t = rng.integers(0, 1000, ROWS)
    regs = rng.integers(0, 6, (ROWS, REGISTERS), dtype=np.uint8)
    ints = lambda low, high: pa.array(rng.integers(low, high, ROWS), pa.int64())
    columns = {
        "window": pa.array(rng.choice([1, 2], ROWS), pa.int64()),
        "srcIP__hi": pa.array(np.zeros(ROWS, np.uint64)),
        "srcIP__lo": pa.array(np.uint64(0xFFFF_0A00_0000) + g.astype(np.uint64)),
        "port": pa.array(g * 7919, pa.int64()),
        "cnt": ints(1, 50), "bytes": ints(40, 1500), "lo": ints(-1000, 1000),
        "hi": pa.array(rng.integers(0, 2**63, ROWS, dtype=np.uint64), pa.uint64()),
        "flags": pa.array(1 << rng.integers(0, 8, ROWS), pa.int64()),
        "ttl_first": ints(1, 255), "ttl_first__t": pa.array(t, pa.int64()),
        "ttl_last": ints(1, 255), "ttl_last__t": pa.array(t + 1, pa.int64()),
        "dests": pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(REGISTERS), ROWS, [None, pa.py_buffer(regs.tobytes())]),
    }
    return pa.RecordBatch.from_pydict(columns, metadata={b"query": QUERY.encode()})
