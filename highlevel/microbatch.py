"""The micro-batch runner of an aggregation: markers, Meld, late rows, then the Spark path or the driver path.

`MicroBatch(stage, frame, batch_id).run()` is one micro-batch of an `AggregateStage`
(`highlevel.aggregate` says what each step means):

- markers: from the spool file footers when no row can be late (`highlevel.batchfiles`),
  else one small Spark job that also counts the late rows and the rows kept;
- Meld: each link's punctuation in file order gives the combined punctuation P;
- late rows: counted, and under late 'correct' turned into correction rows;
- the Spark path: the kept rows and the open state combined (one groupBy), the windows P
  passed closed and written, the rest written as the new open state, the batch committed;
- the driver path (flow records whose markers came from the footers): the same closing,
  read and split with Arrow on the driver (`highlevel.flowrecords`), no Spark job at all;
- small batches of a stage that asks for it (the appliance): combined and split on the
  driver, only the closed rows' outputs computed by Spark (`highlevel.smallbatch`).

`BatchAhead` is the batch computed ahead: a bounded run whose low level ended before Spark's
stream began lets a driver-closed stage compute its next batch's closed and open rows, and the
batch uses them when its files, state and punctuation are the ones computed with.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.spool import LINK, PUNCT, SEQ, cached_rows, list_spool
from common.units import INT64_MAX
from highlevel import smallbatch
from highlevel.batchfiles import SpoolFileMarker, batch_files, files_markers
from highlevel.state import StageState

if TYPE_CHECKING:
    from highlevel.aggregate import AggregateStage

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


class MicroBatch:
    """One micro-batch of an aggregate stage (module docstring)."""

    def __init__(self, stage: AggregateStage, df: DataFrame, batch_id: int):
        self.stage, self.df, self.batch_id = stage, df, batch_id
        self.prev = stage.state              # the state committed by the batch before
        self.tick = stage._tick

    def run(self) -> None:
        stage, batch_id, prev = self.stage, self.batch_id, self.prev
        files, late, keep = self._markers()
        from_footers = late is None
        self.tick("markers")
        state = prev.for_batch(batch_id)
        punctuation = stage._meld(state, files)
        late_rows = sum(f.late for f in files)
        kept = sum(f.kept for f in files)
        if from_footers and stage.flow_records is not None and not late_rows:
            self._on_driver(files, state, punctuation, kept)
            return
        if from_footers and not late_rows and smallbatch.usable(stage) \
                and smallbatch.run(self, files, state, punctuation):
            return
        if late is None:          # rows from the footers' markers: Spark's job after all
            late, keep = stage.late_columns(F.col("window").isNotNull(), prev.punctuation)
        corrections = None
        if late_rows:
            log.warning("query %s: %d partial rows arrived for windows already closed "
                        "(P=%s); %s", stage.spec.query, late_rows, prev.punctuation,
                        "correction rows follow" if stage.correct else "dropped and counted")
            if stage.correct:
                corrections = stage.corrections(self.df.where(late).select(*self._columns()),
                                                prev.punctuation)
        state.late_rows += late_rows
        self._in_spark(state, punctuation, kept, keep, corrections)

    def _markers(self) -> tuple[list[SpoolFileMarker], Any, Any]:
        """The batch's files and their markers; with the (late, keep) row conditions when a
        Spark job counted them (else None, None: from the footers, no row is late)."""
        stage, prev = self.stage, self.prev
        files = stage.footer_markers(self.batch_id, prev.punctuation)
        if files is not None:
            return files, None, None
        is_row = F.col("window").isNotNull()
        late, keep = stage.late_columns(is_row, prev.punctuation)
        more = stage.marker_columns
        files = [SpoolFileMarker.from_row(r) for r in
                 self.df.select(LINK, SEQ, PUNCT, "window", *more, *stage.late_reads)
                 .groupBy(LINK, SEQ)
                 .agg(F.max(PUNCT).alias("p"), F.sum(is_row.cast("long")).alias("rows"),
                      F.sum(late.cast("long")).alias("late"),
                      F.sum(keep.cast("long")).alias("kept"),
                      *[F.max(c).alias(c) for c in more])
                 .collect()]
        return files, late, keep

    def _columns(self) -> list[str]:
        return [f.name for f in self.stage.spec.partial_schema().fields]

    def _in_spark(self, state: StageState, punctuation: int | None, kept: int, keep: Column,
                  corrections: pa.Table | None) -> None:
        """The Spark path: the kept rows and the open state combined, the windows the
        punctuation passed closed and written, the rest written as the new open state."""
        stage, batch_id, prev, tick = self.stage, self.batch_id, self.prev, self.tick
        spec = stage.spec
        advanced = stage.advanced(prev, state, punctuation)
        if not kept and not advanced:
            stage.write_corrections(state, batch_id, corrections)
            stage._commit(state)
            return
        parts = self.df.where(keep).select(*self._columns()) if kept else None
        if prev.open_dir is not None:
            old = stage.spark.read.schema(spec.partial_schema()).parquet(
                str(stage.store.path(prev.open_dir)))
            parts = old if parts is None else parts.unionByName(old)
        if parts is None:
            state.punctuation = punctuation if advanced else prev.punctuation
            state.open_dir = None
            stage.write_corrections(state, batch_id, corrections)
            stage._commit(state)
            return
        # at the end of input (P = the largest int64) every window closes: nothing stays open
        closes_all = advanced and punctuation is not None and punctuation >= INT64_MAX
        if stage.unique_rows:
            combined = parts
        else:
            combined = stage.combine(parts, ["window"] + spec.key_columns())
        # persisted only when two jobs read it (the closed and the open rows); with unique
        # rows each job reads its own rows from the Parquet files again, which costs less
        # than caching them
        cached = not stage.unique_rows and advanced and not closes_all
        if cached:
            combined = combined.persist()
        try:
            if advanced:
                assert punctuation is not None
                state.closed_rows += stage.close(combined, batch_id, prev.punctuation,
                                                 punctuation, corrections)
                if corrections is not None:
                    state.corrected_rows += corrections.num_rows
                state.punctuation = punctuation
                combined_open = combined.where(stage.retained(punctuation))
            else:
                stage.write_corrections(state, batch_id, corrections)
                combined_open = combined
            if closes_all:
                state.open_dir = None
            else:
                open_dir = f"open-{batch_id:010d}"
                if stage.open_on_driver:
                    # one collect and an Arrow write: a Spark write job's commit protocol
                    # costs more than its rows when the open state is small
                    from highlevel.flowrecords import FlowRecords

                    FlowRecords.write_open(combined_open.toArrow(),
                                           stage.store.path(open_dir))
                else:
                    combined_open.write.mode("overwrite").parquet(
                        str(stage.store.path(open_dir)))
                tick("write state")
                state.open_dir = open_dir
            stage._commit(state)
            tick("commit")
            log.debug("query %s: batch %d timings %s", spec.query, batch_id, tick.laps)
        finally:
            if cached:
                combined.unpersist()

    def _on_driver(self, files: list[SpoolFileMarker], state: StageState, punctuation,
                   kept: int) -> None:
        """`run` for flow records whose markers came from the footers: the same closing,
        read and selected with Arrow on the driver (highlevel.flowrecords)."""
        stage, prev, batch_id = self.stage, self.prev, self.batch_id
        flows = stage.flow_records
        assert flows is not None
        stage.driver_batches += 1
        advanced = stage.advanced(prev, state, punctuation)
        if not kept and not advanced:
            stage._commit(state)
            prune(stage, files)
            return
        ready = stage.ahead.take(stage, files, prev, punctuation) if advanced else None
        if ready is not None:
            table, still_open = ready
            state.closed_rows += stage.emit(None, batch_id, punctuation, table)
            state.punctuation = punctuation
        else:
            rows = driver_rows(stage, files, prev)
            self.tick("read")
            still_open = rows
            if advanced and not rows.num_rows:
                state.punctuation = punctuation   # nothing open, nothing new: no sink write
            elif advanced:
                closed, still_open = flows.split(rows, prev.punctuation, punctuation)
                state.closed_rows += stage.emit(flows.result(closed), batch_id, punctuation)
                state.punctuation = punctuation
        state.open_dir = None
        if still_open.num_rows:
            state.open_dir = f"open-{batch_id:010d}"
            flows.write_open(still_open, stage.store.path(state.open_dir))
            self.tick("write state")
        stage._commit(state)
        prune(stage, files)
        self.tick("commit")
        log.debug("query %s: batch %d timings %s (on the driver)", stage.spec.query, batch_id,
                  self.tick.laps)


def driver_rows(stage: AggregateStage, files: list[SpoolFileMarker], prev: StageState,
                keep: bool = False) -> pa.Table:
    """The partial rows of a driver batch: its files' and the open state's."""
    assert stage.flow_records is not None
    open_dir = stage.store.path(prev.open_dir) if prev.open_dir is not None else None
    return stage.flow_records.read([(f.path, f.rows) for f in files
                                    if f.rows and f.path is not None], open_dir, keep)


def prune(stage: AggregateStage, files: list[SpoolFileMarker]) -> None:
    """Remove a committed driver batch's spool files (`Stage.prune_spool`)."""
    if stage.prune_spool:
        for path in [f.path for f in files if f.path is not None]:
            cached_rows(path)            # rows still kept for it (none read) go too
            Path(path).unlink(missing_ok=True)


def _inputs(files: list[SpoolFileMarker], prev: StageState, punctuation) -> tuple:
    """What a driver batch's result depends on: its files (path and rows), the open state it
    starts from, and the punctuations it closes between."""
    return (frozenset((str(f.path), f.rows) for f in files), prev.open_dir,
            prev.punctuation, punctuation)


class BatchAhead:
    """The next micro-batch of a driver-closed stage, computed before it runs (`compute`),
    and handed to the batch when it is that batch (`take`)."""

    def __init__(self):
        # (inputs, done event, result holder) of the last `compute`
        self._computed: tuple | None = None

    def compute(self, stage: AggregateStage) -> bool:
        """Compute what the next micro-batch will write: its closed rows, sorted and in the
        sinks' layout, and the rows left open. Its files are those the stream's log names
        when the stream planned it already, else every spool file there is now.

        A bounded run whose low level ended before the first batch began calls this: the
        streaming query's start or its first planning take long on a fresh JVM, on one
        core, and the batch then finds its rows ready (`MicroBatch._on_driver`). The batch
        uses them when its files, state and punctuation are the ones computed with, and
        computes its own otherwise; rows kept in memory for it stay there. Only for a stage
        that closes its batches on the driver and has no raw sinks. Returns whether there
        was something to compute."""
        flows, prev = stage.flow_records, stage.state
        if flows is None or any(sink.raw for sink in stage.sinks) \
                or stage.prepare is not None or stage.marker_columns or stage.late_reads:
            return False
        # a batch the stream planned already reads the files its log names; else every file
        paths = batch_files(stage.checkpoint / "stream", prev.batch + 1)
        if paths is None:
            paths = [path for _, _, path in list_spool(stage.spool, stage.spec.query)]
        files = files_markers(paths, stage.earliest_end, prev.punctuation) if paths else None
        if not files:
            return False
        state = prev.for_batch(prev.batch + 1)
        punctuation = stage._meld(state, files)
        if punctuation is None or not stage.advanced(prev, state, punctuation):
            return False
        done, holder = threading.Event(), list[tuple[pa.Table, pa.Table]]()
        self._computed = (_inputs(files, prev, punctuation), done, holder)
        try:
            rows = driver_rows(stage, files, prev, keep=True)
            closed, still_open = flows.split(rows, prev.punctuation, punctuation)
            holder.append((stage.output_table(flows.result(closed)), still_open))
        finally:
            done.set()
        log.debug("query %s: next batch computed ahead over %d spool files: %d rows close",
                  stage.spec.query, len(files), holder[0][0].num_rows if holder else 0)
        return True

    def take(self, stage: AggregateStage, files: list[SpoolFileMarker], prev: StageState,
             punctuation) -> tuple | None:
        """`compute`'s (output table, open rows) when it computed them for these inputs
        (waiting for it when it is still at work), else None."""
        if self._computed is None:
            return None
        inputs, done, holder = self._computed
        done.wait()
        self._computed = None
        if not holder or inputs != _inputs(files, prev, punctuation):
            log.debug("query %s: the batch computed ahead is not this one", stage.spec.query)
            return None
        stage.ahead_batches += 1
        return holder[0]
