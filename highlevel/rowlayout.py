"""The raw layout of result rows between stages, and row expressions evaluated on them in Spark.

A query's result rows travel to the queries reading it (query-on-query, join sides, MERGE
inputs) as spool files in the *raw* layout: `window` holds the row's time in ns (the end of an
aggregate's window, a packet's timestamp for selections), an `ip` column is two int64 columns
`name__hi`, `name__lo` (the uint64 halves' bits), unsigned integers are int64 with the same
bits, floats double, bools boolean, strings string. Nulls (the missing side of an outer join)
read as 0, as the reference evaluator's `without_nulls` does.

Row expressions (WHERE over an input query, the group keys and sub-aggregate arguments of a
row plan, join keys, residuals and outputs) run inside Spark with `DataFrame.mapInArrow`: each
Arrow batch is turned into the evaluated columns of `lowlevel.evaluate` and evaluated by the
same vectorised evaluator the low level and the reference use, so integer division, unsigned
wrap-around and IP promotion have exactly the GSQL semantics (no second implementation of the
expression language in Spark SQL to drift from the oracle).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from common.spool import LINK, PUNCT, SEQ
from common.units import INT64_MAX
from lowlevel import evaluate as V
from lowlevel.values import promote_ip, truthy

UNSIGNED = ("uint", "ullong", "ipv4", "mac", "uint64")
SIGNED = ("int", "llong", "int64")


def raw_names(name: str, gsql: str) -> list[str]:
    return [f"{name}__hi", f"{name}__lo"] if gsql == "ip" else [name]


def spark_type(gsql: str):
    if gsql in ("float", "float64", "double"):
        return T.DoubleType()
    if gsql == "bool":
        return T.BooleanType()
    if gsql in ("string", "str"):
        return T.StringType()
    return T.LongType()


def raw_fields(columns: Iterable[tuple[str, str]], prefix: str = "") -> list[T.StructField]:
    """Spark fields of raw columns (name, GSQL type), names prefixed by `prefix`."""
    out = []
    for name, gsql in columns:
        for c in raw_names(name, gsql):
            out.append(T.StructField(prefix + c, spark_type(gsql)))
    return out


def meta_fields() -> list[T.StructField]:
    return [T.StructField(LINK, T.StringType()), T.StructField(SEQ, T.LongType()),
            T.StructField(PUNCT, T.LongType()), T.StructField("window", T.LongType())]


def raw_schema(columns, prefix: str = "", markers=()) -> T.StructType:
    """The spool schema of raw rows: marker columns, `window` (time ns), the columns, and
    the further marker columns `markers` (int64, e.g. `JOINT_MARKERS`)."""
    return T.StructType(meta_fields() + raw_fields(columns, prefix)
                        + [T.StructField(c, T.LongType()) for c in markers])


def form_value(form, p: int | None) -> int | None:
    """The temporal value (of a column with `queries.types.TimeForm` `form`) at time p ns:
    every row with time >= p has a value >= this."""
    if p is None:
        return None
    v = ((p + form.offset_ns) // form.pane_ns) * form.scale + form.shift
    return max(min(v, INT64_MAX), -INT64_MAX)


# --- Arrow <-> evaluated values ---------------------------------------------------------------

def _np(col: pa.Array | pa.ChunkedArray, fill=0) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        col = col.fill_null(fill)
    return col.to_numpy(zero_copy_only=False)


def to_value(table, name: str, gsql: str, prefix: str = ""):
    """One raw column of `table` as a `lowlevel.evaluate` value (nulls read as 0)."""
    if gsql == "ip":
        hi = _np(table.column(f"{prefix}{name}__hi")).astype(np.int64).view(np.uint64)
        lo = _np(table.column(f"{prefix}{name}__lo")).astype(np.int64).view(np.uint64)
        return (hi, lo)
    col = table.column(prefix + name)
    if gsql in ("string", "str"):
        return np.asarray(_np(col, ""), dtype=object)
    if gsql == "bool":
        return _np(col, False).astype(bool)
    if gsql in ("float", "float64", "double"):
        return _np(col, 0.0).astype(np.float64)
    v = _np(col).astype(np.int64)
    return v.view(np.uint64) if gsql in UNSIGNED or gsql not in SIGNED else v


def to_values(table, columns, prefix: str = "", alias: str | None = None) -> dict:
    """Evaluated columns of raw rows, keyed `name` or `alias.name` (join sides)."""
    return {(f"{alias}.{n}" if alias else n): to_value(table, n, t, prefix) for n, t in columns}


def from_value(v, gsql: str, n: int, name: str) -> list[tuple[str, pa.Array]]:
    """An evaluated value as raw Arrow column(s)."""
    if gsql == "ip" or isinstance(v, tuple):
        hi, lo = promote_ip(v) if not isinstance(v, tuple) else v
        hi = np.broadcast_to(np.asarray(hi, np.uint64), (n,))
        lo = np.broadcast_to(np.asarray(lo, np.uint64), (n,))
        return [(f"{name}__hi", pa.array(np.ascontiguousarray(hi).view(np.int64))),
                (f"{name}__lo", pa.array(np.ascontiguousarray(lo).view(np.int64)))]
    a = np.broadcast_to(np.asarray(v), (n,))
    if gsql in ("string", "str"):
        return [(name, pa.array([None if x is None else str(x) for x in a], pa.string()))]
    if gsql == "bool":
        return [(name, pa.array(a.astype(bool)))]
    if gsql in ("float", "float64", "double"):
        return [(name, pa.array(a.astype(np.float64)))]
    if a.dtype == np.uint64:
        return [(name, pa.array(np.ascontiguousarray(a).view(np.int64)))]
    if a.dtype.kind == "f":
        return [(name, pa.array(a.astype(np.int64)))]
    return [(name, pa.array(a.astype(np.int64)))]


def null_columns(columns, n: int, prefix: str = "") -> list[tuple[str, pa.Array]]:
    out = []
    for name, gsql in columns:
        arrow = {"float": pa.float64(), "bool": pa.bool_(), "string": pa.string()}.get(
            gsql, pa.int64())
        for c in raw_names(name, gsql):
            out.append((prefix + c, pa.nulls(n, arrow)))
    return out


def evaluate(expr, values: dict, n: int, zeros: np.ndarray | None = None):
    """`expr` over the rows; `zeros`: set where a division met a zero divisor."""
    return V.evaluate_columns(expr, values, n, zeros=zeros)


def keep_mask(predicate, values: dict, n: int, zeros: np.ndarray | None = None) -> np.ndarray:
    if predicate is None or n == 0:
        return np.ones(n, bool)
    return np.broadcast_to(truthy(evaluate(predicate, values, n, zeros)), (n,)).copy()


class ZeroDivisorCount:
    """Rows written whose values met a zero divisor, counted in Spark's Python workers (the
    kinds over rows evaluate there, `mapInArrow`) through an accumulator the driver reads
    after each batch's jobs."""

    def __init__(self, spark, exprs):
        self.on = any(V.divides(e) for e in exprs)
        self.acc = spark.sparkContext.accumulator(0) if self.on else None
        self._seen = 0

    # in a worker: `rows` and `add` are static, the closure holds `on` and `acc` only
    @staticmethod
    def rows(on: bool, n: int) -> np.ndarray | None:
        """The zeros array of a worker's batch of n rows (None when nothing divides)."""
        return np.zeros(n, bool) if on else None

    @staticmethod
    def add(acc, zeros: np.ndarray | None) -> None:
        if zeros is not None:
            acc.add(int(np.count_nonzero(zeros)))

    def take(self) -> int:
        """Rows counted since the last call (driver side)."""
        if self.acc is None:
            return 0
        value = self.acc.value
        new, self._seen = value - self._seen, value
        return new


def take_values(values: dict, idx) -> dict:
    return {k: ((v[0][idx], v[1][idx]) if isinstance(v, tuple) else v[idx])
            for k, v in values.items()}


def batch_table(batch: pa.RecordBatch, schema: T.StructType, columns: dict) -> pa.RecordBatch:
    """A record batch in `schema` order from named arrays (missing columns: nulls)."""
    n = batch.num_rows if batch is not None else 0
    arrays, names = [], []
    for f in schema.fields:
        arrow = _arrow_type(f.dataType)
        a = columns.get(f.name)
        if a is None:
            a = pa.nulls(n, arrow)
        elif a.type != arrow:
            a = a.cast(arrow)
        arrays.append(a)
        names.append(f.name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _arrow_type(t):
    if isinstance(t, T.LongType):
        return pa.int64()
    if isinstance(t, T.IntegerType):
        return pa.int32()
    if isinstance(t, T.DoubleType):
        return pa.float64()
    if isinstance(t, T.BooleanType):
        return pa.bool_()
    return pa.string()


def split_markers(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """(data rows, marker rows) of a spool batch (markers have a null `window`)."""
    is_row = batch.column("window").is_valid()
    return batch.filter(is_row), batch.filter(pa.compute.invert(is_row))


import pyarrow.compute  # noqa: E402  (pa.compute above)

# --- display ----------------------------------------------------------------------------------

def display_table(raw: pa.Table, outputs, query: str) -> pa.Table:
    """Raw rows in the output schema of the sinks (ip as text, unsigned as uint64), the same
    types as the aggregation stage's `to_output_table`."""
    from highlevel.finalize import ip_text_arrow
    from highlevel.spec import output_type

    types = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
             "string": pa.string(), "bool": pa.bool_(), "ip": pa.string()}
    fields, arrays = [], []
    for name, gsql in outputs:
        t = output_type(gsql)
        fields.append(pa.field(name, types[t]))
        if t == "ip":
            arrays.append(ip_text_arrow(raw.column(f"{name}__hi").combine_chunks(),
                                        raw.column(f"{name}__lo").combine_chunks()))
            continue
        col = raw.column(name).combine_chunks()
        if t == "uint64":
            values = np.asarray(col.fill_null(0)).astype(np.int64).view(np.uint64)
            col = pa.array(values, pa.uint64(), mask=np.asarray(col.is_null()))
        arrays.append(col.cast(types[t]))
    schema = pa.schema(fields, metadata={b"oopscope.query": query.encode()})
    return pa.Table.from_arrays(arrays, schema=schema)
