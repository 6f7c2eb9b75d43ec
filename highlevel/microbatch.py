"""The runners of an aggregation's micro-batch: the Spark path, the driver path, the batch computed ahead.

`AggregateStage` reads a micro-batch's markers, melds its punctuation and counts its late
rows (`highlevel.aggregate` says what each step means), then one runner closes it, given the
stage's `StageContext` and the `Batch` (`highlevel.batchcontext`):

- the Spark path (`close_in_spark`): the kept rows and the open state combined (one
  groupBy), the windows P passed closed and written, the rest written as the new open state,
  the batch committed; with tumbling windows and the open state written on the driver, the
  closed and the open rows come from one job;
- the driver path (`close_on_driver`; flow records whose markers came from the footers):
  the same closing, read and split with Arrow on the driver (`highlevel.flowrecords`), no
  Spark job at all;
- small batches of a stage that asks for it (the appliance) close in `highlevel.smallbatch`.

`BatchAhead` is the batch computed ahead: a bounded run whose low level ended before Spark's
stream began lets a driver-closed stage compute its next batch's closed and open rows, and the
batch uses them when its files, state and punctuation are the ones computed with.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame

from common.spool import cached_rows
from common.units import INT64_MAX
from highlevel.batchcontext import Batch, StageContext
from highlevel.batchfiles import SpoolFileMarker
from highlevel.flowrecords import FlowRecords
from highlevel.state import StageState

log = logging.getLogger(__name__)

#: the session setting a driver-closed stage's stream runs with (`start_interpreted`)
_WHOLE_STAGE = "spark.sql.codegen.wholeStage"
_START_LOCK = threading.Lock()


def start_interpreted(spark, writer):
    """`writer.start()` without whole-stage code generation, in the stream's own session
    (Spark clones the session when the query starts; the shared one is set back at once),
    for a stage that closes its batches on the driver: Spark's foreachBatch sink turns each
    micro-batch's scan into an RDD, which compiles generated code at the first batch (slow:
    Janino's classes come from a signed jar, outside the class-data archive) for rows the
    driver path never reads through Spark. Its rare Spark jobs (rows that may be late) then
    run interpreted."""
    with _START_LOCK:
        conf = spark.conf
        before = conf.get(_WHOLE_STAGE, None)
        conf.set(_WHOLE_STAGE, "false")
        try:
            return writer.start()
        finally:
            if before is None:
                conf.unset(_WHOLE_STAGE)
            else:
                conf.set(_WHOLE_STAGE, before)


def close_in_spark(ctx: StageContext, batch: Batch, parts: DataFrame | None,
                   corrections: pa.Table | None, extra: pa.Table | None = None) -> None:
    """The Spark path: the kept rows (`parts`) and the open state combined, the windows the
    punctuation passed closed and written (with the batch's correction rows, and `extra`:
    closed rows in the outputs' layout, `highlevel.finalrows`), the rest written as the new
    open state, the batch committed."""
    spec, tick, prev, state = ctx.spec, ctx.tick, batch.prev, batch.state
    batch_id, punctuation, advanced = batch.batch_id, batch.punctuation, batch.advanced
    if not batch.kept and not advanced:
        _write_corrections(ctx, batch, corrections)
        ctx.commit(state)
        return
    if prev.open_dir is not None:
        old = ctx.spark.read.schema(spec.partial_schema()).parquet(
            str(ctx.store.path(prev.open_dir)))
        parts = old if parts is None else parts.unionByName(old)
    if parts is None:
        state.punctuation = punctuation if advanced else prev.punctuation
        state.open_dir = None
        _write_corrections(ctx, batch, corrections)
        ctx.commit(state)
        return
    # at the end of input (P = the largest int64) every window closes: nothing stays open
    closes_all = advanced and punctuation is not None and punctuation >= INT64_MAX
    combined = ctx.combine(parts)
    if advanced and not closes_all and ctx.open_on_driver and ctx.window.tumbling \
            and corrections is None:
        assert punctuation is not None
        written, still_open = ctx.close_keeping(combined, batch_id, prev.punctuation,
                                                punctuation, extra)
        state.closed_rows += written
        state.punctuation = punctuation
        FlowRecords.write_open(still_open, ctx.store.path(batch.open_dir))
        tick("write state")
        state.open_dir = batch.open_dir
        ctx.commit(state)
        tick("commit")
        log.debug("query %s: batch %d timings %s (one job)", spec.query, batch_id, tick.laps)
        return
    # persisted only when two jobs read it (the closed and the open rows); with unique
    # rows each job reads its own rows from the Parquet files again, which costs less
    # than caching them
    cached = not ctx.unique_rows and advanced and not closes_all
    if cached:
        combined = combined.persist()
    try:
        if advanced:
            assert punctuation is not None
            state.closed_rows += ctx.close(combined, batch_id, prev.punctuation,
                                           punctuation, corrections, extra)
            if corrections is not None:
                state.corrected_rows += corrections.num_rows
            state.punctuation = punctuation
            combined_open = combined.where(ctx.retained(punctuation))
        else:
            _write_corrections(ctx, batch, corrections)
            combined_open = combined
        if closes_all:
            state.open_dir = None
        else:
            if ctx.open_on_driver:
                # one collect and an Arrow write: a Spark write job's commit protocol
                # costs more than its rows when the open state is small
                FlowRecords.write_open(combined_open.toArrow(), ctx.store.path(batch.open_dir))
            else:
                combined_open.write.mode("overwrite").parquet(
                    str(ctx.store.path(batch.open_dir)))
            tick("write state")
            state.open_dir = batch.open_dir
        ctx.commit(state)
        tick("commit")
        log.debug("query %s: batch %d timings %s", spec.query, batch_id, tick.laps)
    finally:
        if cached:
            combined.unpersist()


def commit_open(ctx: StageContext, batch: Batch, still_open: pa.Table | None) -> None:
    """A driver-side batch's end: the rows left open written as its open state (none: no
    state) and the batch committed."""
    state = batch.state
    state.open_dir = None
    if still_open is not None and still_open.num_rows:
        state.open_dir = batch.open_dir
        FlowRecords.write_open(still_open, ctx.store.path(state.open_dir))
        ctx.tick("write state")
    ctx.commit(state)
    ctx.tick("commit")


def _write_corrections(ctx: StageContext, batch: Batch, corrections: pa.Table | None) -> None:
    """Write correction rows in a batch that closes no window."""
    if corrections is not None and corrections.num_rows:
        state = batch.state
        state.corrected_rows += ctx.emit(corrections, batch.batch_id, state.punctuation)


def close_on_driver(ctx: StageContext, batch: Batch, ready: tuple | None) -> None:
    """The driver path, for flow records whose markers came from the footers: the Spark
    path's closing, read and selected with Arrow on the driver (highlevel.flowrecords).
    `ready`: the batch's (output table, open rows) computed ahead (`BatchAhead.take`)."""
    flows, prev, state = ctx.flow_records, batch.prev, batch.state
    batch_id, punctuation = batch.batch_id, batch.punctuation
    assert flows is not None
    if not batch.kept and not batch.advanced:
        ctx.commit(state)
        prune(ctx, batch.files)
        return
    if ready is not None:
        table, still_open = ready
        state.closed_rows += ctx.emit(None, batch_id, punctuation, table)
        state.punctuation = punctuation
    else:
        rows = driver_rows(ctx, batch.files, prev)
        ctx.tick("read")
        still_open = rows
        if batch.advanced and not rows.num_rows:
            state.punctuation = punctuation   # nothing open, nothing new: no sink write
        elif batch.advanced:
            assert punctuation is not None
            closed, still_open = flows.split(rows, prev.punctuation, punctuation)
            state.closed_rows += ctx.emit(flows.result(closed), batch_id, punctuation)
            state.punctuation = punctuation
    state.open_dir = None
    if still_open.num_rows:
        state.open_dir = batch.open_dir
        flows.write_open(still_open, ctx.store.path(state.open_dir))
        ctx.tick("write state")
    ctx.commit(state)
    prune(ctx, batch.files)
    ctx.tick("commit")
    log.debug("query %s: batch %d timings %s (on the driver)", ctx.spec.query, batch_id,
              ctx.tick.laps)


def driver_rows(ctx: StageContext, files: list[SpoolFileMarker], prev: StageState,
                keep: bool = False) -> pa.Table:
    """The partial rows of a driver batch: its files' and the open state's."""
    assert ctx.flow_records is not None
    open_dir = ctx.store.path(prev.open_dir) if prev.open_dir is not None else None
    return ctx.flow_records.read([(f.path, f.rows) for f in files
                                  if f.rows and f.path is not None], open_dir, keep)


def prune(ctx: StageContext, files: list[SpoolFileMarker]) -> None:
    """Remove a committed driver batch's spool files (`Stage.prune_spool`)."""
    if ctx.prune_spool:
        for path in [f.path for f in files if f.path is not None]:
            cached_rows(path)            # rows still kept for it (none read) go too
            Path(path).unlink(missing_ok=True)


def _inputs(batch: Batch) -> tuple:
    """What a driver batch's result depends on: its files (path and rows), the open state it
    starts from, and the punctuations it closes between."""
    return (frozenset((str(f.path), f.rows) for f in batch.files), batch.prev.open_dir,
            batch.prev.punctuation, batch.punctuation)


class BatchAhead:
    """The next micro-batch of a driver-closed stage, computed before it runs (`compute`),
    and handed to the batch when it is that batch (`take`)."""

    def __init__(self, query: str):
        self.query = query
        # (inputs, done event, result holder) of the last `compute`
        self._computed: tuple | None = None

    def compute(self, ctx: StageContext, batch: Batch,
                closer: Callable[[StageContext, Batch], tuple | None] | None = None) -> None:
        """Compute what the next micro-batch will write: its closed rows, sorted and in the
        sinks' layout, and the rows left open (`AggregateStage.speculate` finds its inputs);
        by `closer` (its (table, open rows), or None: nothing computed), else as flow records.

        A bounded run whose low level ended before the first batch began calls this: the
        streaming query's start or its first planning take long on a fresh JVM, on one
        core, and the batch then finds its rows ready (`close_on_driver`). The batch uses
        them when its files, state and punctuation are the ones computed with, and computes
        its own otherwise; rows kept in memory for it stay there."""
        flows, prev = ctx.flow_records, batch.prev
        assert batch.punctuation is not None
        done, holder = threading.Event(), list[tuple[pa.Table, pa.Table]]()
        self._computed = (_inputs(batch), done, holder)
        try:
            if closer is not None:
                computed = closer(ctx, batch)
                if computed is not None:
                    holder.append(computed)
            else:
                assert flows is not None
                rows = driver_rows(ctx, batch.files, prev, keep=True)
                closed, still_open = flows.split(rows, prev.punctuation, batch.punctuation)
                holder.append((ctx.output_table(flows.result(closed)), still_open))
        finally:
            done.set()
        log.debug("query %s: next batch computed ahead over %d spool files: %d rows close",
                  self.query, len(batch.files), holder[0][0].num_rows if holder else 0)

    def take(self, batch: Batch) -> tuple | None:
        """`compute`'s (output table, open rows) when it computed them for this batch's
        inputs (waiting for it when it is still at work), else None."""
        if self._computed is None:
            return None
        inputs, done, holder = self._computed
        done.wait()
        self._computed = None
        if not holder or inputs != _inputs(batch):
            log.debug("query %s: the batch computed ahead is not this one", self.query)
            return None
        return holder[0]
