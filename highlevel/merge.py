"""MERGE: the order-preserving union of queries or links on a temporal field (Gigascope's Merge).

A `MergeStage` is a `RowStage` (`highlevel.select`) with the semantics of the IOP Merge of
`highlevel.union.MergeLogic` (docs/semantics.md, "Combining links: Meld and Merge"): rows
wait in a buffer (a Parquet directory named in the state) until every input's punctuation,
mapped to that input's merge field, has passed them; released rows are written in
merge-field order (ties in input order). The output punctuation is the Meld of the inputs'.
`buffered_rows`/`peak_buffered_rows` in the state measure the Merge's memory (the IOP-vs-OOP
experiment's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import LINK, PUNCT, SEQ
from highlevel import rowlayout as R
from highlevel.rowlayout import form_value
from highlevel.select import RowStage

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeSpec:
    """A MERGE query: `inputs` the FROM aliases (the `__link` names of its spool files), in
    order; `columns` (name, GSQL type) of every input's rows; `fields` each input's merge
    field (a temporal expression with a TimeForm); `outputs` (name, GSQL type)."""

    query: str
    inputs: tuple[str, ...]
    columns: tuple[tuple[str, str], ...]
    fields: tuple
    outputs: tuple[tuple[str, str], ...]

    @property
    def links(self) -> tuple[str, ...]:
        return self.inputs

    def spool_schema(self) -> T.StructType:
        return R.raw_schema(self.columns)

    def output_columns(self) -> list[tuple[str, str]]:
        return list(self.outputs)


class MergeStage(RowStage):
    """The order-preserving union on `spec.fields` (one temporal expression per input)."""

    def __init__(self, spec: MergeSpec, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.spec: MergeSpec = spec
        self.forms = [f.form for f in spec.fields]
        self.buf_schema = T.StructType(
            [T.StructField("window", T.LongType()), T.StructField("__mk", T.LongType()),
             T.StructField("__in", T.LongType())] + R.raw_fields(spec.columns))

    def _function(self):
        names, fields, cols, schema = list(self.spec.links), list(self.spec.fields), \
            list(self.spec.columns), self.buf_schema

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
            prev = self.spark.read.schema(self.buf_schema).parquet(str(self.store.path(old)))
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
            rest.write.mode("overwrite").parquet(str(self.store.path(new_dir)))
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
