"""Final partial rows written without a combine: the windows of a query over one link.

The low level marks a partial row final when it is the only row of its (window, group) that
its table will ever emit (`lowlevel.finality`). When one link feeds the query, such a row of a
window closing now is already that window's result for its group, and combining it with
nothing would only cost a shuffle. With a table that fits its groups nearly every row is
final (97% on the 260K-group benchmark capture). So a batch whose files say so (their footers
count the final rows) reads its files on the driver, turns the final rows of the closing
windows into outputs directly (`FlowRecords.result`: plain names only), and combines only the
other rows with the open state: on the driver when they are few (`smallbatch.combine`, below
`smallbatch.MAX_ROWS`), else in Spark over the same files with the final rows filtered out.
Both parts go to the sinks in one write, sorted together.

Not taken (another runner closes the batch): more than one link (a row is final only for its
own link's part), sliding windows, HAVING or an output expression, `late 'correct'`, a batch
with late rows or closing nothing, files that do not count final rows (an older spool), or
fewer than half of the batch's rows final.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import FINAL
from highlevel import smallbatch
from highlevel.batchcontext import Batch, StageContext
from highlevel.flowrecords import FlowRecords, read_open
from highlevel.microbatch import close_in_spark, commit_open
from highlevel.stage import Ticker

if TYPE_CHECKING:
    from highlevel.spec import StageSpec
    from highlevel.windows import WindowLogic

log = logging.getLogger(__name__)

#: the share of a batch's rows that must be final for this runner to read it on the driver
MIN_SHARE = 0.5


def outputs_of(spec: StageSpec, window: WindowLogic) -> FlowRecords | None:
    """The driver-side outputs of `spec`'s final rows, or None when its batches cannot skip
    the combine (module docstring)."""
    if len(spec.links) != 1 or spec.extras.unique_rows or not smallbatch.usable(spec, window):
        return None
    return FlowRecords.plain(spec, window)


def run(ctx: StageContext, batch: Batch, outputs: FlowRecords, ready: tuple | None = None) -> bool:
    """Close the batch with its final rows written directly; False (nothing done) when it is
    not one for this runner. `ready`: its (output table, open rows) computed ahead
    (`highlevel.microbatch.BatchAhead`)."""
    spec, state, punctuation = ctx.spec, batch.state, batch.punctuation
    if ready is not None:
        table, still_open = ready
        if table.num_rows:
            state.closed_rows += ctx.emit(None, batch.batch_id, punctuation, table)
    else:
        if not _usable(batch):
            return False
        split = _split(ctx, batch, outputs)
        if split is None:
            return False
        done, still_open = split
        if still_open is _SPARK:
            log.debug("query %s: batch %d: %d final rows written directly, the others "
                      "combined by Spark", spec.query, batch.batch_id, done.num_rows)
            close_in_spark(ctx, batch, _spark_rest(ctx, batch), None, extra=done)
            return True
        if done.num_rows:
            state.closed_rows += ctx.emit(done, batch.batch_id, punctuation)
    state.punctuation = punctuation
    commit_open(ctx, batch, still_open)
    log.debug("query %s: batch %d timings %s (final rows written directly%s)", spec.query,
              batch.batch_id, ctx.tick.laps, ", computed ahead" if ready is not None else "")
    return True


def ahead(ctx: StageContext, batch: Batch, outputs: FlowRecords) -> tuple | None:
    """What `run` would write for this batch, computed before it runs: (output table, open
    rows), or None when it is not one for this runner or Spark must combine the others."""
    # its own timings: the stage's ticker times the batch running meanwhile
    quiet = replace(ctx, tick=Ticker(time.perf_counter))
    split = _split(quiet, batch, outputs, keep=True) if _usable(batch) else None
    if split is None or split[1] is _SPARK:
        return None
    return ctx.output_table(split[0]), split[1]


#: `_split`'s open rows when the other rows are Spark's to combine
_SPARK = pa.table({})


def _usable(batch: Batch) -> bool:
    """Whether the batch closes windows and its files count final rows, enough of them."""
    files = [f for f in batch.files if f.rows]
    if not batch.advanced or not files or any(f.path is None or f.final is None
                                              for f in files):
        return False
    total, final = sum(f.rows for f in files), sum(f.final or 0 for f in files)
    return bool(final) and final >= MIN_SHARE * total


def _split(ctx: StageContext, batch: Batch, outputs: FlowRecords,
           keep: bool = False) -> tuple | None:
    """(closed rows in Spark's layout, open rows) of the batch: the final rows of the
    windows closing now as they are, the others combined with the open state on the driver;
    with `_SPARK` for the open rows when those are too many for the driver (the closed rows
    are then the final ones only); None when the driver cannot combine them. `keep`: rows
    kept in memory stay there (`cached_rows`)."""
    spec, prev, punctuation = ctx.spec, batch.prev, batch.punctuation
    before = prev.punctuation
    assert punctuation is not None
    rows = outputs.read([(f.path, f.rows) for f in batch.files
                         if f.rows and f.path is not None], None, keep,
                        columns=[*outputs.columns, FINAL])
    ctx.tick("read")
    ends = ctx.window.pane_end(np.asarray(rows.column("window")))
    direct = ends <= punctuation
    if before is not None:
        direct &= ends > before
    direct &= np.asarray(rows.column(FINAL).fill_null(False))
    done = outputs.result(rows.filter(pa.array(direct)))
    rest = rows.filter(pa.array(~direct)).drop_columns([FINAL])
    ctx.tick("final rows")
    opened = read_open(ctx.store.path(prev.open_dir), outputs.schema) \
        if prev.open_dir is not None else None
    if rest.num_rows + (opened.num_rows if opened is not None else 0) > smallbatch.MAX_ROWS:
        return done, _SPARK
    parts = [t for t in (rest, opened) if t is not None and t.num_rows]
    if not parts:
        return done, None
    table = pa.concat_tables([t.cast(parts[0].schema) for t in parts])
    try:
        combined = smallbatch.combine(table, ["window"] + spec.key_columns(), spec.states,
                                      spec.distinct_registers)
    except ValueError:            # null values: never in partial rows; Spark decides
        return None
    ctx.tick("combine")
    ends = ctx.window.pane_end(np.asarray(combined.column("window")))
    closing = ends <= punctuation
    if before is not None:
        closing &= ends > before
    done = pa.concat_tables([done, outputs.result(combined.filter(pa.array(closing)))])
    return done, combined.filter(pa.array(ends > punctuation))


def _spark_rest(ctx: StageContext, batch: Batch):
    """The batch's rows other than the final rows of the windows closing now, as Spark reads
    them from the spool files (`AggregateStage.spool_frame` with the final column)."""
    spec, files = ctx.spec, [f for f in batch.files if f.rows]
    before, upto = batch.prev.punctuation, batch.punctuation
    schema = T.StructType([*spec.spool_schema().fields, T.StructField(FINAL, T.BooleanType())])
    frame = ctx.session().read.schema(schema).parquet(*[str(f.path) for f in files])
    end = ctx.window.pane_end_col(F.col("window"))
    closing = end <= F.lit(upto)
    if before is not None:
        closing = closing & (end > F.lit(before))
    direct = F.coalesce(F.col(FINAL), F.lit(False)) & closing
    columns = [f.name for f in spec.partial_schema().fields]
    return frame.where(F.col("window").isNotNull() & ~direct).select(*columns)

