"""Tuple-count windows `[ROWS n]`, `[PARTITION BY a, b ROWS n]`: n consecutive packets per window.

Semantics (docs/semantics.md, "Windows"): the query's packets, after WHERE, in order of (timestamp, link
position, then the values of the PARTITION BY columns, GROUP BY items and aggregate arguments)
are numbered per partition from 0; packet k belongs to window k // n (`row_window`). This is
CQL's `[ROWS n]` in its tumbling form: CQL re-evaluates "the last n rows" at every arrival,
which for packets is one result per packet; cutting the stream into runs of n is what a
packet monitor reports ("every 10 000 packets, ..."). Ties on timestamp are broken by values,
not by arrival, so the result depends neither on disorder nor on which of two equal-time
packets a capture wrote first.

Why everything runs in the high level: a window is a run of n packets in the *union's* time
order; a link's low level sees neither the other links nor the packets still to come before a
given one, so it cannot pre-aggregate a count window. It only selects (WHERE) and projects
the columns the windows need (a selection plan), like a selection query.

When a window closes: rows with timestamp < P (the combined punctuation) are a complete prefix
of the order; within it, per partition, every full run of n rows is output and the rest waits
in the state with the rows at or after P. At the end of input each partition's last, partial
window is output too. State: the waiting rows (fewer than n per partition, plus the disorder
after P) and, per partition, how many rows it has output so far.
"""

from __future__ import annotations

import logging

import numpy as np
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import LINK, PUNCT, SEQ
from common.units import INT64_MAX
from highlevel import rowlayout as R
from highlevel.aggregate import AggregateStage
from highlevel.batchfiles import SpoolFileMarker
from highlevel.rowplans import state_arrays
from highlevel.state import StageState
from queries.plan import ROW_WINDOW_INDEX

log = logging.getLogger(__name__)

DONE = "__done"      # rows of the partition already in output windows
ALL = "__pall"       # a constant partition column: a query without PARTITION BY is one partition


def _gsql_key(t: str) -> str:
    return "ip" if t == "ip" else ("float" if t == "float64" else "bool" if t == "bool" else
                                   "string" if t == "string" else "llong")


def partial_rows(row_plan, input_columns, spec):
    """mapInArrow function: numbered rows (`window` = timestamp ns, `__rw` = window index,
    the projected columns) -> partial rows of the stage (one per packet)."""
    schema = spec.partial_schema()
    registers = spec.distinct_registers
    key_types = {k.name: k.type for k in spec.keys}

    def fn(batches):
        for b in batches:
            n = b.num_rows
            values = R.to_values(b, input_columns)
            cols = {"window": b.column(ROW_WINDOW_INDEX)}
            for k in row_plan.keys:
                v = R.evaluate(k.expr, values, n)
                t = key_types[k.name]
                if t == "uint64":
                    v = np.asarray(v).astype(np.uint64)
                for name, arr in R.from_value(v, _gsql_key(t), n, k.name):
                    cols[name] = arr
            for s in row_plan.subaggs:
                v = None if s.arg is None else R.evaluate(s.arg, values, n)
                cols.update(state_arrays(s, v, n, registers))
                if s.kind in ("first", "last"):
                    cols[f"{s.name}__t"] = b.column("window")   # packet time orders FIRST/LAST
            yield R.batch_table(b, schema, cols)

    return fn


class CountWindowStage(AggregateStage):
    """The Spark stage of a `[PARTITION BY ... ROWS n]` aggregation (module docstring).

    spec: the aggregation's StageSpec (keys = partition keys then group keys, `window` the
    window index); rows: `queries.plan.RowsWindow`; input_columns: (name, GSQL type) of the
    selected rows in the spool (the low plans' projections); row_plan: the plan turning
    them into partial rows (`HighLevelPlan.row_plans[0]`)."""

    may_close_on_driver = False

    def __init__(self, spec, rows, input_columns, row_plan, spool, checkpoint, sinks,
                 **options):
        super().__init__(spec, spool, checkpoint, sinks,
                         input_schema=R.raw_schema(list(input_columns)), **options)
        self.rows = rows
        self.input_columns = list(input_columns)
        self.row_plan = row_plan
        types = dict(self.input_columns)
        self.part_cols = [ALL] + [c for k in rows.partition for c in R.raw_names(
            k.name, types[k.name])]
        self.data_cols = [c for name, t in self.input_columns for c in R.raw_names(name, t)]
        order = [F.col("window"), F.array_position(F.array(*[F.lit(x) for x in spec.links]),
                                                   F.col(LINK))]
        for name in rows.order:
            t = types[name]
            for c in R.raw_names(name, t):
                # unsigned values travel as int64 bits: flip the sign bit to order as unsigned
                unsigned = t == "ip" or t in R.UNSIGNED or t not in R.SIGNED + (
                    "float", "bool", "string", "double")
                order.append(F.col(c).bitwiseXOR(F.lit(-(1 << 63))) if unsigned else F.col(c))
        self._by_part = Window.partitionBy(*self.part_cols)
        self._rank = F.row_number().over(self._by_part.orderBy(*order)) - 1
        self.buffer_schema = T.StructType(
            [T.StructField(LINK, T.StringType()), T.StructField("window", T.LongType())]
            + R.raw_fields(self.input_columns))
        fields = {f.name: f for f in self.buffer_schema.fields}
        self.counts_schema = T.StructType(
            [T.StructField(ALL, T.IntegerType())] + [fields[c] for c in self.part_cols[1:]]
            + [T.StructField(DONE, T.LongType())])

    def _process(self, df: DataFrame, batch_id: int) -> None:
        spec, prev = self.spec, self.state
        is_row = F.col("window").isNotNull()
        late = is_row & (F.col("window") < F.lit(prev.punctuation)) \
            if prev.punctuation is not None else F.lit(False)
        keep = is_row & ~late
        df = df.persist()
        try:
            files = [SpoolFileMarker.from_row(r) for r in
                     df.groupBy(LINK, SEQ)
                     .agg(F.max(PUNCT).alias("p"), F.sum(keep.cast("long")).alias("kept"),
                          F.sum(late.cast("long")).alias("late")).collect()]
            state = prev.for_batch(batch_id)
            punctuation = self._meld(state, files)
            late_rows = sum(f.late for f in files)
            if late_rows:
                log.warning("query %s: %d packets arrived behind the punctuation (P=%s): "
                            "dropped and counted", spec.query, late_rows, prev.punctuation)
            state.late_rows += late_rows
            kept = sum(f.kept for f in files)
            advanced = punctuation is not None and (prev.punctuation is None
                                                    or punctuation > prev.punctuation)
            if advanced:
                state.punctuation = punctuation
            if not kept and not advanced:
                self._commit(state)
                return
            rows = df.where(keep).select(LINK, "window", *self.data_cols) if kept else None
            counts = None
            if rows is None and prev.open_dir is None:
                self._commit(state)
                return
            if prev.open_dir is not None:
                base = self.store.path(prev.open_dir)
                old = self.spark.read.schema(self.buffer_schema).parquet(str(base / "buffer"))
                rows = old if rows is None else rows.unionByName(old)
                counts = self.spark.read.schema(self.counts_schema).parquet(str(base / "counts"))
            assert rows is not None
            self._step(state, rows, counts, batch_id)
        finally:
            df.unpersist()

    def _step(self, state: StageState, rows: DataFrame, counts, batch_id: int) -> None:
        n = self.rows.rows
        p = state.punctuation
        at_end = p is not None and p >= INT64_MAX
        if counts is None:
            counts = self.spark.createDataFrame([], self.counts_schema)
        rows = rows.withColumn(ALL, F.lit(0))
        released = []
        if p is not None:
            prefix = rows.where(F.col("window") < F.lit(p))
            waiting = rows.where(F.col("window") >= F.lit(p))
            numbered = (prefix.join(counts, on=self.part_cols, how="left")
                        .withColumn(DONE, F.coalesce(F.col(DONE), F.lit(0).cast("long")))
                        .withColumn("__pos", F.col(DONE) + self._rank)
                        .withColumn("__total", F.col(DONE) + F.count(F.lit(1)).over(
                            self._by_part)))
            limit = F.col("__total") if at_end else \
                F.floor(F.col("__total") / F.lit(n)).cast("long") * F.lit(n)
            numbered = numbered.withColumn("__limit", limit).persist()
            released.append(numbered)
            out = numbered.where(F.col("__pos") < F.col("__limit")).withColumn(
                ROW_WINDOW_INDEX, F.floor(F.col("__pos") / F.lit(n)).cast("long"))
            self._emit_windows(out, state, batch_id)
            waiting = waiting.unionByName(
                numbered.where(F.col("__pos") >= F.col("__limit"))
                .select(*waiting.columns))
            seen = numbered.groupBy(*self.part_cols).agg(F.max("__limit").alias(DONE))
            counts = counts.join(seen.select(*self.part_cols), on=self.part_cols,
                                 how="left_anti").unionByName(seen)
        else:
            waiting = rows
        try:
            if at_end:
                state.open_dir = None
            else:
                open_dir = f"open-{batch_id:010d}"
                base = self.store.path(open_dir)
                waiting.select(*[f.name for f in self.buffer_schema.fields]) \
                    .write.mode("overwrite").parquet(str(base / "buffer"))
                counts.select(*[f.name for f in self.counts_schema.fields]) \
                    .write.mode("overwrite").parquet(str(base / "counts"))
                state.open_dir = open_dir
            self._commit(state)
        finally:
            for frame in released:
                frame.unpersist()

    def _emit_windows(self, out: DataFrame, state: StageState, batch_id: int) -> None:
        spec = self.spec
        cols = ["window", ROW_WINDOW_INDEX] + self.data_cols
        partials = out.select(*cols).mapInArrow(
            partial_rows(self.row_plan, self.input_columns, spec), spec.partial_schema())
        closed = self.combine(partials, ["window"] + spec.key_columns())
        if self.having is not None:
            closed = closed.where(self.having)
        result = closed.select(*self.outputs, *self.hidden).toArrow()
        self._tick("count windows")
        if result.num_rows:
            state.closed_rows += self.emit(result, batch_id, state.punctuation)
