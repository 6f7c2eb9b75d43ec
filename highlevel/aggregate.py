"""Window aggregation: partial rows combined per (window, keys), windows closed by punctuation.

The logic of an aggregation's micro-batch (the stage reads its markers, melds and counts its
late rows; a runner of `highlevel.microbatch` or `highlevel.smallbatch` closes it):

1. the markers of the batch's files (link, seq, punctuation, late rows) from their footers or
   one small Spark job;
2. each link's punctuation through Meld in sequence order (a file whose predecessor has not
   been read yet waits), giving the combined punctuation P;
3. the batch's partial rows and the open state of the previous batch combined (one groupBy;
   none when rows are unique per (window, keys), as flow records are);
4. windows with end(w) <= P that were open finalised (HAVING, SELECT list), written to the
   sinks once, sorted (`highlevel.output`), and dropped from the state;
5. the remaining open state written as a Parquet directory and the batch committed
   (`highlevel.state`).

The union of links is a Meld of their punctuation (`spec.union = "merge"` closes windows at the
same points: Merge only orders rows, which combining into windows does not need; its buffer is
modelled by `highlevel.union.Merge` for the IOP memory experiment). Late rows (a partial row of
a window already closed) are dropped and counted, or under late 'correct' give correction rows
(docs/semantics.md, "Late data: drop or correct").

`AggregateStage` is also the base of the other aggregate kinds, which share its Spark
expressions and its output: landmark windows (`highlevel.landmark`), the reader of a join's
joint punctuation (`highlevel.joint`) and tuple-count windows (`highlevel.countwindow`).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.spool import LINK, PUNCT, SEQ, list_spool, not_kept
from highlevel import finalrows, smallbatch
from highlevel.batchcontext import Batch, StageContext
from highlevel.batchfiles import SpoolFileMarker, batch_files, batch_markers, files_markers
from highlevel.combine import Combiner
from highlevel.errors import HighLevelError
from highlevel.finalize import ZERO_DIVISORS, having_column, output_columns
from highlevel.flowrecords import FlowRecords
from highlevel.microbatch import BatchAhead, close_in_spark, close_on_driver, start_interpreted
from highlevel.output import order_columns, order_plan, output_table, raw_output_table, to_output_table
from highlevel.sorting import sort_indices
from highlevel.spec import OutputColumn, StageSpec
from highlevel.stage import Stage
from highlevel.state import StageState
from highlevel.windows import window_config
from queries import expressions as E

log = logging.getLogger(__name__)


class AggregateStage(Stage):
    """The Spark stage of a windowed aggregation over links or over another query's rows
    (module docstring)."""

    #: marker columns besides the punctuation that the markers job reads, and further
    #: columns its late condition reads (highlevel.joint)
    marker_columns: tuple[str, ...] = ()
    late_reads: tuple[str, ...] = ()
    #: the kind's batches are the micro-batches of `highlevel.microbatch`, which close flow
    #: records on the driver (the kinds with a batch of their own do not)
    may_close_on_driver = True

    def __init__(self, spec: StageSpec, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.spec: StageSpec = spec
        self.window = window_config(spec.window).build()
        self.correct = spec.late == "correct"
        self.order = order_plan(spec)[0]
        # rows unique per (window, keys), e.g. flow records keyed by their flow id: combining
        # is the identity, so no groupBy (and no shuffle) at all
        self.unique_rows = spec.extras.unique_rows
        # flow records whose batches can close on the driver (highlevel.flowrecords)
        self.flow_records = FlowRecords.of(spec, self.window) \
            if self.may_close_on_driver and self.prepare is None else None
        if self.flow_records is None:
            not_kept(spec.query)          # no driver here to take the rows from memory
            # Spark's expressions now: building them checks the outputs and HAVING (a
            # driver path's layout resolved every output already, and it has no HAVING)
            _ = (self.spark, self.outputs, self.having, self.correction_outputs,
                 self.combine, self.hidden)
        self.ahead = BatchAhead(spec.query)
        self.ahead_batches = 0          # driver batches that found the batch computed ahead
        # a single link's final rows written without a combine (highlevel.finalrows)
        self.final_outputs = finalrows.outputs_of(spec, self.window) \
            if self.may_close_on_driver and self.flow_records is None and self.prepare is None \
            and not self.marker_columns and not self.late_reads else None
        self.final_batches = 0          # batches that wrote final rows directly

    # --- Spark expressions ---------------------------------------------------------------------
    # built once, on first use: each py4j call building an expression costs driver time, and a
    # stage that closes its batches on the driver never needs them
    @cached_property
    def outputs(self) -> list[Column]:
        return output_columns(self.spec)

    @cached_property
    def having(self) -> Column | None:
        return having_column(self.spec)

    @cached_property
    def correction_outputs(self) -> list[Column]:
        return correction_columns(self.spec) if self.correct else []

    @cached_property
    def combine(self) -> Combiner:
        return Combiner(self.spec.states, self.spec.distinct_registers)

    @cached_property
    def hidden(self) -> list[Column]:
        return order_columns(self.spec)[1]

    # --- the micro-batch -----------------------------------------------------------------------
    @property
    def closes_on_driver(self) -> bool:
        return self.flow_records is not None

    @property
    def writes_final_rows(self) -> bool:
        """Whether the low level's final rows skip the combine (`highlevel.finalrows`): one
        link, not captured by several fanout sockets (each its own table)."""
        return self.final_outputs is not None and len(self.meld_inputs) == 1

    @property
    def computes_ahead(self) -> bool:
        return (self.flow_records is not None and not self.driver_batches) \
            or (self.writes_final_rows and not self.final_batches)

    def _start(self, writer):
        if self.flow_records is None:
            return writer.start()
        return start_interpreted(self.spark, writer)

    def _process(self, df: DataFrame, batch_id: int) -> None:
        prev = self.state              # the state committed by the batch before
        files, late, keep = self._markers(df, batch_id, prev)
        from_footers = late is None
        self._tick("markers")
        state = prev.for_batch(batch_id)
        punctuation = self._meld(state, files)
        late_rows = sum(f.late for f in files)
        batch = Batch(batch_id, files, prev, state, punctuation,
                      self.advanced(prev, state, punctuation), sum(f.kept for f in files))
        if from_footers and self.flow_records is not None and not late_rows:
            self.driver_batches += 1
            ready = self.ahead.take(batch) if batch.advanced else None
            if ready is not None:
                self.ahead_batches += 1
            close_on_driver(self.context(), batch, ready)
            return
        if from_footers and not late_rows and self.writes_final_rows:
            assert self.final_outputs is not None
            ready = self.ahead.take(batch) if batch.advanced else None
            if finalrows.run(self.context(), batch, self.final_outputs, ready):
                self.final_batches += 1
                self.ahead_batches += ready is not None
                return
        if from_footers and not late_rows and self.small_batches \
                and smallbatch.run(self.context(), batch):
            self.driver_batches += 1
            return
        if late is None:          # rows from the footers' markers: Spark's job after all
            late, keep = self.late_columns(F.col("window").isNotNull(), prev.punctuation)
        columns = [f.name for f in self.spec.partial_schema().fields]
        corrections = None
        if late_rows:
            log.warning("query %s: %d partial rows arrived for windows already closed "
                        "(P=%s); %s", self.spec.query, late_rows, prev.punctuation,
                        "correction rows follow" if self.correct else "dropped and counted")
            if self.correct:
                corrections = self.corrections(df.where(late).select(*columns),
                                               prev.punctuation)
        state.late_rows += late_rows
        parts = None
        if batch.kept:
            source = self.spool_frame(files) if from_footers else None
            parts = (df if source is None else source).where(keep).select(*columns)
        close_in_spark(self.context(), batch, parts, corrections)

    def spool_frame(self, files: list[SpoolFileMarker]) -> DataFrame | None:
        """The batch's spool files read as Parquet files by Spark (markers from the footers:
        each file's path known), or None (the stream's own frame, `df`).

        foreachBatch hands the batch over as an RDD of rows (`Scan ExistingRDD`): each row
        leaves the vectorized Parquet reader, is copied into the RDD and read back by the
        combine's partial aggregation, outside its generated code. Read as files, the scan
        feeds that aggregation in one generated stage, and still in tasks on the executors
        (the spool is where the stream lists it)."""
        paths = [str(f.path) for f in files if f.rows]
        if any(f.rows and f.path is None for f in files) or not paths:
            return None
        schema = self.spec.spool_schema()
        return self.spark.read.schema(schema).parquet(*paths)

    def _markers(self, df: DataFrame, batch_id: int,
                 prev: StageState) -> tuple[list[SpoolFileMarker], Any, Any]:
        """The batch's files and their markers; with the (late, keep) row conditions when a
        Spark job counted them (else None, None: from the footers, no row is late)."""
        files = self.footer_markers(batch_id, prev.punctuation)
        if files is not None:
            return files, None, None
        is_row = F.col("window").isNotNull()
        late, keep = self.late_columns(is_row, prev.punctuation)
        more = self.marker_columns
        files = [SpoolFileMarker.from_row(r) for r in
                 df.select(LINK, SEQ, PUNCT, "window", *more, *self.late_reads)
                 .groupBy(LINK, SEQ)
                 .agg(F.max(PUNCT).alias("p"), F.sum(is_row.cast("long")).alias("rows"),
                      F.sum(late.cast("long")).alias("late"),
                      F.sum(keep.cast("long")).alias("kept"),
                      *[F.max(c).alias(c) for c in more])
                 .collect()]
        return files, late, keep

    def context(self) -> StageContext:
        """What the batch runners use of this stage, with its settings as they are now."""
        return StageContext(
            spec=self.spec, window=self.window, store=self.store, tick=self._tick,
            session=lambda: self.spark, emit=self.emit, commit=self._commit,
            combine=self.combined, unique_rows=self.unique_rows, close=self.close,
            close_keeping=self.close_keeping, retained=self.retained,
            open_on_driver=self.open_on_driver,
            flow_records=self.flow_records, finalize=self.finalize_rows,
            output_table=self.output_table, prune_spool=self.prune_spool)

    @property
    def small_batches(self) -> bool:
        """Whether small batches close on the driver (`highlevel.smallbatch`): asked for,
        tumbling windows without `late 'correct'`, partial rows of the low level that need
        combining, and states the driver can combine."""
        return (self.small_on_driver and not self.correct and self.prepare is None
                and not self.unique_rows and self.flow_records is None
                and smallbatch.usable(self.spec, self.window))

    def speculate(self) -> bool:
        """Compute what the next micro-batch will write (`highlevel.microbatch.BatchAhead`):
        only for a stage that `computes_ahead` and has no raw sinks. Its files
        are those the stream's log names when the stream planned it already, else every
        spool file there is now. Returns whether there was something to compute."""
        prev = self.state
        if not self.computes_ahead or any(sink.raw for sink in self.sinks) \
                or self.prepare is not None or self.marker_columns or self.late_reads:
            return False
        # a batch the stream planned already reads the files its log names; else every file
        paths = batch_files(self.checkpoint / "stream", prev.batch + 1)
        if paths is None:
            paths = [path for _, _, path in list_spool(self.spool, self.spec.query)]
        files = files_markers(paths, self.earliest_end, prev.punctuation) if paths else None
        if not files:
            return False
        state = prev.for_batch(prev.batch + 1)
        punctuation = self._meld(state, files)
        if punctuation is None or not self.advanced(prev, state, punctuation):
            return False
        outputs = self.final_outputs
        self.ahead.compute(self.context(), Batch(prev.batch + 1, files, prev, state, punctuation,
                                                 True, sum(f.kept for f in files)),
                           None if outputs is None else
                           lambda ctx, batch: finalrows.ahead(ctx, batch, outputs))
        return True

    def footer_markers(self, batch_id: int, before: int | None) -> list[SpoolFileMarker] | None:
        """The markers job's answer read from the batch's spool file footers when no row can
        be late (highlevel.batchfiles); None: run the job. Only for partial rows spooled by
        the low level (not a prepared frame) and the stage's own late rule."""
        if self.prepare is not None or self.marker_columns or self.late_reads:
            return None
        return batch_markers(self.checkpoint / "stream", batch_id, self.earliest_end, before)

    # --- which rows close, stay open, or are late ----------------------------------------------
    def earliest_end(self, pane: int) -> int:
        """The end of the first window a pane counts in."""
        win = self.window
        return win.window_end(win.windows_of_pane(pane)[0]) if self.correct \
            else win.pane_end(pane)

    def advanced(self, prev: StageState, state: StageState, punctuation) -> bool:
        """Whether this batch's punctuation closes more than the last one did."""
        return punctuation is not None and (prev.punctuation is None
                                            or punctuation > prev.punctuation)

    def retained(self, punctuation: int) -> Column:
        """The rows (panes) that stay open after closing through `punctuation`."""
        return self.window.retained_col(F.col("window"), punctuation)

    def closing(self, before: int | None, upto: int) -> Column:
        """The tumbling windows that close now: end in (before, upto]."""
        end = self.window.pane_end_col(F.col("window"))
        closed = end <= F.lit(upto)
        return closed if before is None else closed & (end > F.lit(before))

    def late_columns(self, is_row: Column, before: int | None) -> tuple[Column, Column]:
        """(late, keep) row conditions against the punctuation the windows were closed
        through. `drop`: a row whose pane ended by then is late and not kept. `correct`: a row
        with a closed window is late (it goes to the correction rows), and a row that an open
        window still needs is kept too (a sliding window's pane can be in both)."""
        win = self.window
        if before is None:
            return F.lit(False), is_row
        pane = F.col("window")
        if not self.correct:
            late = is_row & (win.pane_end_col(pane) <= F.lit(before))
            return late, is_row & ~late
        late = is_row & (win.window_end_col(win.first_window_col(pane)) <= F.lit(before))
        return late, is_row & win.retained_col(pane, before)

    # --- closed rows ---------------------------------------------------------------------------
    def corrections(self, late: DataFrame, before: int | None) -> pa.Table:
        """The correction rows of late partial rows: per closed window and group, the final
        values over the late rows only (the delta), with the correction column 1. HAVING is
        not applied (it is a condition on totals, not on deltas). Spark's Arrow result, in the
        layout `close` collects."""
        spec, win = self.spec, self.window
        combined = self.combine(late, ["window"] + spec.key_columns())
        if win.tumbling:
            closed = combined
        else:
            exploded = combined.withColumn("window", F.explode(win.windows_col(F.col("window"))))
            exploded = exploded.where(win.window_end_col(F.col("window")) <= F.lit(before))
            closed = self.combine(exploded, ["window"] + spec.key_columns())
        return closed.select(*self.correction_outputs, *self.hidden).toArrow()

    def close(self, combined: DataFrame, batch_id: int, before: int | None, upto: int,
              corrections: pa.Table | None = None, extra: pa.Table | None = None) -> int:
        """Finalise and write every window with before < end(w) <= upto (and the batch's
        correction rows and `extra` closed rows, in the same sink write); rows written."""
        spec, win = self.spec, self.window
        if win.tumbling:
            closed = combined.where(self.closing(before, upto))
        else:
            exploded = combined.withColumn("window", F.explode(win.windows_col(F.col("window"))))
            end = win.window_end_col(F.col("window"))
            exploded = exploded.where(end <= F.lit(upto))
            if before is not None:
                exploded = exploded.where(end > F.lit(before))
            # unique pane rows stay unique per window: a row's keys include its pane's identity
            closed = exploded if self.unique_rows else \
                self.combine(exploded, ["window"] + spec.key_columns())
        result = _with(self.finalize_rows(closed), extra)
        self._tick("combine+collect")
        corrected = 0
        if corrections is not None and corrections.num_rows:
            corrected = corrections.num_rows
            result = pa.concat_tables([corrections, result.cast(corrections.schema)])
        return self.emit(result, batch_id, upto) - corrected

    def close_keeping(self, combined: DataFrame, batch_id: int, before: int | None,
                      upto: int, extra: pa.Table | None = None) -> tuple[int, pa.Table]:
        """`close` for tumbling windows, and the rows that stay open, in one Spark job: each
        combined row is collected once, either as its outputs (a window closing now, HAVING
        holding) or as its partial state (a window still open), and split on the driver.
        Two jobs over a cached frame (the closed rows, then the open ones) cost the appliance
        ~0.5 s more per window at 260K groups. `extra`: closed rows written with them.
        Returns (rows written, open rows)."""
        names = [f.name for f in self.spec.partial_schema().fields]
        closing = self.closing(before, upto)
        if self.having is not None:
            closing = closing & self.having
        both = combined.select(
            F.when(closing, F.struct(*self.outputs, *self.hidden)).alias("closed"),
            F.when(self.retained(upto), F.struct(*[F.col(n) for n in names])).alias("open"))
        rows = both.toArrow()
        self._tick("combine+collect")
        return (self.emit(_with(_struct_rows(rows, "closed"), extra), batch_id, upto),
                _struct_rows(rows, "open"))

    def combined(self, parts: DataFrame) -> DataFrame:
        """Partial rows combined per (window, keys): the rows as they are when unique."""
        if self.unique_rows:
            return parts
        return self.combine(parts, ["window"] + self.spec.key_columns())

    def finalize_rows(self, closed: DataFrame) -> pa.Table:
        """Closed rows' outputs and hidden order columns where HAVING holds, as Arrow."""
        if self.having is not None:
            closed = closed.where(self.having)
        # sort on the driver: results are small, and a Spark orderBy costs a sampling job
        return closed.select(*self.outputs, *self.hidden).toArrow()

    def output_table(self, result: pa.Table) -> pa.Table:
        """Spark's Arrow result sorted, in the output schema."""
        return output_table(result, self.spec, self.order)

    def emit(self, result: pa.Table | None, batch_id: int, upto: int | None,
             table: pa.Table | None = None) -> int:
        """Sort Spark's Arrow result, write it to the sinks once; rows written. `table`:
        the result's `output_table` already (no raw sinks; `result` then None)."""
        spec = self.spec
        if result is not None and self.suppress:
            result = self._without_suppressed(result)
        if result is not None and ZERO_DIVISORS in result.column_names:
            self.zero_divisor_rows += pc.sum(result.column(ZERO_DIVISORS).cast(pa.int64())).as_py() or 0
        if table is None:
            assert result is not None
            if any(sink.raw for sink in self.sinks):
                if result.num_rows > 1:
                    result = result.combine_chunks()
                    result = result.take(sort_indices(result, self.order))
                table = to_output_table(result, spec)
            else:
                table = self.output_table(result)
        self._tick("sort+format")
        self._write_sinks(batch_id, table, lambda: self._raw_table(result))
        self._tick("sinks")
        log.info("query %s: batch %d closed windows up to P=%s: %d rows", spec.query, batch_id,
                 upto, table.num_rows)
        return table.num_rows

    def _without_suppressed(self, result: pa.Table) -> pa.Table:
        """`result` without the rows of windows that overlap a `suppress` interval."""
        win = self.window
        if not result.num_rows:
            return result
        window = np.asarray(result.column("__window").combine_chunks().fill_null(0))
        ends = win.pane_end(window) if win.tumbling else win.window_end(window)
        starts = ends - self.spec.window.range_ns
        keep = np.ones(len(ends), bool)
        for lo, hi in self.suppress:
            keep &= ~((starts < hi) & (ends > lo))
        dropped = int(len(keep) - keep.sum())
        if not dropped:
            return result
        self.suppressed_rows += dropped
        log.info("query %s: %d rows of windows overlapping %s not written", self.spec.query,
                 dropped, self.suppress)
        return result.filter(pa.array(keep))

    def _raw_table(self, result: pa.Table | None) -> pa.Table:
        """The sorted result in the raw layout, each row's time its window's end."""
        assert result is not None
        win = self.window
        window = np.asarray(result.column("__window").combine_chunks().fill_null(0))
        ends = win.pane_end(window) if win.tumbling else win.window_end(window)
        return raw_output_table(result.append_column("__time", pa.array(ends)), self.spec)


def _with(result: pa.Table, extra: pa.Table | None) -> pa.Table:
    """Spark's closed rows and `extra` rows of the same layout, as one table."""
    if extra is None or not extra.num_rows:
        return result
    return pa.concat_tables([extra.cast(result.schema), result])


def _struct_rows(rows: pa.Table, column: str) -> pa.Table:
    """The rows where `column` (a struct) is set, as a table of its fields."""
    structs = rows.column(column).combine_chunks()
    return pa.Table.from_struct_array(structs.filter(structs.is_valid()))


def correction_columns(spec: StageSpec) -> list:
    """The SELECT list of correction rows: the outputs with the correction column = 1."""
    if spec.correction is None:
        raise HighLevelError(f"query {spec.query!r}: late 'correct' needs a correction "
                             f"output column (the planner adds one)")
    outputs = tuple(OutputColumn(o.name, E.Literal(value=1, kind="int"), o.type)
                    if o.name == spec.correction else o for o in spec.outputs)
    return output_columns(replace(spec, outputs=outputs))
