"""Stages over result rows rather than partial aggregates (`RowStage`), and selections.

The kinds over rows (selections here, MERGE in `highlevel.merge`, joins in `highlevel.join`)
share `RowStage`'s micro-batch on top of `highlevel.stage.Stage`'s plumbing (file-source
stream over the spool, `foreachBatch`, per-link punctuation in file order, state versions
committed by rename, idempotent sinks): one Spark job reads each file's punctuation and row
count, Meld applies the punctuation in file order, the kind's `_step` turns the batch's rows
into the rows it writes (raw layout, `highlevel.rowlayout`), and the output punctuation is
the Meld of the inputs' unless the kind says otherwise.

`SelectStage`: rows pass through at once (Meld: nothing buffered); WHERE over an input query
and the SELECT list are evaluated in Spark (`mapInArrow`). It is also the "side" stage of a
join or MERGE over links: it unions the side's links and hands the rows to the join's (or the
merge's) spool.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import LINK, PUNCT, SEQ
from highlevel import rowlayout as R
from highlevel.batchfiles import SpoolFileMarker
from highlevel.stage import Stage
from highlevel.state import StageState

log = logging.getLogger(__name__)


class RowStage(Stage):
    """The batch of the kinds over result rows (select, merge, join): a markers job, Meld, the
    kind's `_step` over the batch's rows, the rows it gives written, the output punctuation."""

    persist_input = True       # read by the markers job and the kind's step

    def __init__(self, spec, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.outputs = spec.output_columns()     # (name, GSQL type) of the rows written
        _ = self.spark           # the session now: a row stage always runs Spark's jobs

    def _step(self, state: StageState, data: DataFrame | None, rows: int, bounds: dict,
              batch_id: int) -> pa.Table | None:
        """The kind's work on the batch's data rows (None: none); the raw rows to write."""
        raise NotImplementedError

    def _process(self, df, batch_id: int) -> None:
        prev = self.state
        files = [SpoolFileMarker.from_row(r) for r in
                 df.groupBy(LINK, SEQ)
                 .agg(F.max(PUNCT).alias("p"),
                      F.sum(F.col("window").isNotNull().cast("long")).alias("rows"))
                 .collect()]
        state = prev.for_batch(batch_id)
        meld_out = self._meld(state, files)
        assert state.meld is not None
        bounds = dict(state.meld["bounds"])
        rows = sum(f.rows for f in files)
        data = df.where(F.col("window").isNotNull()) if rows else None
        raw = self._step(state, data, rows, bounds, batch_id)
        if raw is not None and raw.num_rows:
            self._write_sinks(batch_id, lambda: R.display_table(raw, self.outputs,
                                                              self.spec.query), raw)
            state.closed_rows += raw.num_rows
        out = self._output_punctuation(state, meld_out, bounds)
        if out is not None and (prev.punctuation is None or out > prev.punctuation):
            state.punctuation = out
        self._commit(state)

    def _output_punctuation(self, state: StageState, meld_out, bounds) -> int | None:
        """The stage's output punctuation (ns) after this batch: the Meld of the inputs."""
        return meld_out


@dataclass(frozen=True)
class Selection:
    """A selection query: WHERE (over an input query) and the SELECT list.

    inputs: the `__link` names of the spool files (links, or the input query);
    input_columns: (name, GSQL type) of the rows as the spool holds them; outputs: (name,
    expression, GSQL type); predicate: WHERE over an input query's rows; link_column: also
    offer the spool file's link name as a string column of this name (MERGE over packets
    selects the `link` field)."""

    query: str
    inputs: tuple[str, ...]
    input_columns: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, object, str], ...]
    predicate: object | None = None
    link_column: str | None = None

    @property
    def links(self) -> tuple[str, ...]:
        return self.inputs

    def spool_schema(self) -> T.StructType:
        return R.raw_schema(self.input_columns)

    def output_columns(self) -> list[tuple[str, str]]:
        return [(n, t) for n, _, t in self.outputs]


class SelectStage(RowStage):
    """The stage of a `Selection`: rows pass through (module docstring)."""

    def __init__(self, spec: Selection, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.spec: Selection = spec
        self.out_schema = T.StructType([T.StructField("window", T.LongType())]
                                       + R.raw_fields(self.outputs))
        self.zeros = R.ZeroDivisorCount(self.spark, [spec.predicate]
                                        + [e for _, e, _ in spec.outputs])

    def _function(self):
        spec = self.spec
        cols, link_column, pred = spec.input_columns, spec.link_column, spec.predicate
        exprs, schema = spec.outputs, self.out_schema
        counting, acc = self.zeros.on, self.zeros.acc

        def fn(batches):
            for b in batches:
                n = b.num_rows
                values = R.to_values(b, cols)
                if link_column:
                    values[link_column] = np.asarray(b.column(LINK).to_pylist(), dtype=object)
                zeros = R.ZeroDivisorCount.rows(counting, n)
                keep = R.keep_mask(pred, values, n, zeros)
                if not keep.all():
                    idx = np.flatnonzero(keep)
                    values, b, n = R.take_values(values, idx), b.take(pa.array(idx)), len(idx)
                    zeros = None if zeros is None else zeros[idx]
                out = {"window": b.column("window")}
                for name, expr, gsql in exprs:
                    for c, a in R.from_value(R.evaluate(expr, values, n, zeros), gsql, n, name):
                        out[c] = a
                R.ZeroDivisorCount.add(acc, zeros)
                yield R.batch_table(b, schema, out)

        return fn

    def _step(self, state, data, rows, bounds, batch_id):
        if data is None:
            return None
        table = data.mapInArrow(self._function(), self.out_schema).toArrow()
        self.zero_divisor_rows += self.zeros.take()
        return table
