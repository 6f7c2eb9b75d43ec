"""Stages over rows rather than partial aggregates: selections (pass-through) and MERGE.

Both reuse `highlevel.stage.Stage`'s plumbing (file-source stream over the spool,
`foreachBatch`, per-link punctuation in file order, state versions committed by rename,
idempotent sinks) and replace its per-batch step:

- `SelectStage`: rows pass through at once (Meld: nothing buffered); WHERE over an input
  query and the SELECT list are evaluated in Spark (`mapInArrow`, `highlevel.rows`); the
  output punctuation is the Meld of the inputs'. Also the "side" stage of a join or MERGE
  over links: it unions the side's links and hands the rows to the join's spool.
- `MergeStage`: the order-preserving union (IOP Merge, `union.MergeLogic` semantics): rows
  wait in a buffer (a Parquet state version) until every input's punctuation, mapped to the
  merge field, has passed them; released rows are written in merge-field order (ties in input
  order). `buffered_rows`/`peak_buffered_rows` in the state measure the Merge's memory.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import LINK, PUNCT, SEQ, partials_dir
from common.units import INT64_MAX
from highlevel import rows as R
from highlevel.session import get_session
from highlevel.stage import DEFAULT_TRIGGER, Stage

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class RowSpec:
    """What the shared stage plumbing needs: the query (spool directory), its inputs (the
    `__link` names of its spool files) and the spool schema."""

    query: str
    links: tuple[str, ...]
    schema: T.StructType

    def spool_schema(self) -> T.StructType:
        return self.schema


def form_value(form, p: int | None) -> int | None:
    """The temporal value (of a column with `queries.types.TimeForm` `form`) at time p ns:
    every row with time >= p has a value >= this."""
    if p is None:
        return None
    v = ((p + form.offset_ns) // form.pane_ns) * form.scale + form.shift
    return max(min(v, INT64_MAX), -INT64_MAX)


class RowStage(Stage):
    """Stage plumbing with a different per-batch step (subclasses define `_step`)."""

    def __init__(self, spec: RowSpec, spool, checkpoint, sinks, *, spark=None, master=None,
                 trigger: str = DEFAULT_TRIGGER, keep_versions: int = 3):
        import time as _time

        self.spec = spec
        self.spool = Path(spool)
        self.checkpoint = Path(checkpoint)
        self.sinks = list(sinks)
        self.spark = spark or get_session(master)
        self.trigger = trigger
        self.keep_versions = keep_versions
        self.max_files_per_trigger = None
        self.clock = _time.time
        self.input_schema = None
        self.prepare = None
        self.state_root = self.checkpoint / "state"
        self.state_root.mkdir(parents=True, exist_ok=True)
        self.state = self._load_latest()
        self.batch_seconds: list[float] = []
        self.query = None
        partials_dir(self.spool, spec.query).mkdir(parents=True, exist_ok=True)

    def _process(self, df, batch_id: int) -> None:
        prev = self.state
        files = (df.groupBy(LINK, SEQ)
                 .agg(F.max(PUNCT).alias("p"),
                      F.sum(F.col("window").isNotNull().cast("long")).alias("rows"))
                 .collect())
        state = prev.for_batch(batch_id)
        meld_out = self._meld(state, files)
        bounds = dict(state.meld["bounds"])
        rows = sum(int(f["rows"] or 0) for f in files)
        data = df.where(F.col("window").isNotNull()) if rows else None
        raw = self._step(state, data, rows, bounds, batch_id)
        if raw is not None and raw.num_rows:
            self._emit(batch_id, raw)
            state.closed_rows += raw.num_rows
        out = self._output_punctuation(state, meld_out, bounds)
        if out is not None and (prev.punctuation is None or out > prev.punctuation):
            state.punctuation = out
        self._commit(state)

    def _output_punctuation(self, state, meld_out, bounds) -> int | None:
        """The stage's output punctuation (ns) after this batch: the Meld of the inputs."""
        return meld_out

    def _emit(self, batch_id: int, raw: pa.Table) -> None:
        table = None
        for sink in self.sinks:
            if getattr(sink, "raw", False):
                sink.write(batch_id, raw)
            else:
                table = table if table is not None else R.display_table(
                    raw, self.outputs, self.spec.query)
                sink.write(batch_id, table)

    def _collect_garbage(self) -> None:
        super()._collect_garbage()
        keep = {v for k, v in self.state.extra.items() if k.endswith("_dir") and v}
        for d in self.state_root.glob("buf-*"):
            if d.name not in keep and int(d.name.split("-")[-1]) < self.state.batch - \
                    self.keep_versions:
                import shutil

                shutil.rmtree(d, ignore_errors=True)


class SelectStage(RowStage):
    """A selection: WHERE (over an input query) and the SELECT list, rows passed through.

    inputs: the `__link` names of the spool files (links, or the input query);
    input_columns: (name, GSQL type) of the rows as the spool holds them; outputs: (name,
    expression, GSQL type); link_column: also offer the spool file's link name as a string
    column of this name (MERGE over packets selects the `link` field).
    """

    def __init__(self, query: str, inputs, input_columns, outputs, spool, checkpoint, sinks,
                 *, predicate=None, link_column: str | None = None, **kw):
        self.input_columns = list(input_columns)
        self.outputs = [(n, t) for n, _, t in outputs]
        self.out_exprs = list(outputs)
        self.predicate = predicate
        self.link_column = link_column
        schema = R.raw_schema(self.input_columns)
        super().__init__(RowSpec(query, tuple(inputs), schema), spool, checkpoint, sinks, **kw)
        self.out_schema = T.StructType([T.StructField("window", T.LongType())]
                                       + R.raw_fields(self.outputs))

    def _function(self):
        cols, link_column, pred = self.input_columns, self.link_column, self.predicate
        exprs, schema = self.out_exprs, self.out_schema

        def fn(batches):
            for b in batches:
                n = b.num_rows
                values = R.to_values(b, cols)
                if link_column:
                    values[link_column] = np.asarray(b.column(LINK).to_pylist(), dtype=object)
                keep = R.keep_mask(pred, values, n)
                if not keep.all():
                    idx = np.flatnonzero(keep)
                    values, b, n = R.take_values(values, idx), b.take(pa.array(idx)), len(idx)
                out = {"window": b.column("window")}
                for name, expr, gsql in exprs:
                    for c, a in R.from_value(R.evaluate(expr, values, n), gsql, n, name):
                        out[c] = a
                yield R.batch_table(b, schema, out)

        return fn

    def _step(self, state, data, rows, bounds, batch_id):
        if data is None:
            return None
        return data.mapInArrow(self._function(), self.out_schema).toArrow()


class MergeStage(RowStage):
    """The order-preserving union on `fields` (one temporal expression per input)."""

    def __init__(self, query: str, inputs, columns, fields, outputs, spool, checkpoint, sinks,
                 **kw):
        self.columns = list(columns)
        self.outputs = list(outputs)
        self.fields = list(fields)
        self.forms = [f.form for f in fields]
        super().__init__(RowSpec(query, tuple(inputs), R.raw_schema(self.columns)), spool,
                         checkpoint, sinks, **kw)
        self.buf_schema = T.StructType(
            [T.StructField("window", T.LongType()), T.StructField("__mk", T.LongType()),
             T.StructField("__in", T.LongType())] + R.raw_fields(self.columns))

    def _function(self):
        names, fields, cols, schema = list(self.spec.links), self.fields, self.columns, \
            self.buf_schema

        def fn(batches):
            for b in batches:
                n = b.num_rows
                values = R.to_values(b, cols)
                links = np.asarray(b.column(LINK).to_pylist(), dtype=object)
                key = np.zeros(n, np.int64)
                index = np.zeros(n, np.int64)
                for i, (name, f) in enumerate(zip(names, fields)):
                    mine = links == name
                    if mine.any():
                        v = np.broadcast_to(R.evaluate(f.replace(table=None), values, n), (n,))
                        key[mine] = np.asarray(v)[mine].astype(np.int64)
                        index[mine] = i
                out = {c: b.column(c) for c in b.schema.names if c not in (LINK, SEQ, PUNCT)}
                out.update({"__mk": pa.array(key), "__in": pa.array(index)})
                yield R.batch_table(b, schema, out)

        return fn

    def _step(self, state, data, rows, bounds, batch_id):
        parts = None
        if data is not None:
            parts = data.mapInArrow(self._function(), self.buf_schema)
        old = state.extra.get("buffer_dir")
        if old:
            prev = self.spark.read.schema(self.buf_schema).parquet(str(self.state_root / old))
            parts = prev if parts is None else parts.unionByName(prev)
        state.extra["buffered_rows"] = state.extra.get("buffered_rows", 0) + rows
        state.extra["peak_buffered_rows"] = max(state.extra.get("peak_buffered_rows", 0),
                                                state.extra["buffered_rows"])
        values = [form_value(f, bounds.get(name)) for f, name in zip(self.forms, self.spec.links)]
        if parts is None:
            return None
        if any(v is None for v in values):
            bound = None
        else:
            bound = min(values)
        released = None
        if bound is not None:
            released = parts.where(F.col("__mk") <= F.lit(bound)).toArrow()
            rest = parts.where(F.col("__mk") > F.lit(bound))
            state.extra["buffered_rows"] -= released.num_rows
        else:
            rest = parts
        if state.extra["buffered_rows"] > 0 or (old and bound is None):
            new_dir = f"buf-{batch_id:010d}"
            rest.write.mode("overwrite").parquet(str(self.state_root / new_dir))
            state.extra["buffer_dir"] = new_dir
        else:
            state.extra["buffer_dir"] = None
        if released is None or released.num_rows == 0:
            return None
        order = np.lexsort((released.column("__in").to_numpy(),
                            released.column("__mk").to_numpy()))
        released = released.take(pa.array(order))
        return released.select(["window"] + [c for c in released.column_names
                                             if c not in ("window", "__mk", "__in")])
