"""An aggregation's closed rows as the sinks get them: sorted, in the output schema or the raw layout.

The rows of the windows a batch closes come to the driver as one Arrow table (Spark's
`select(outputs, hidden order columns).toArrow()`, or the same layout built on the driver
for flow records, `highlevel.flowrecords`). They are sorted here rather than by a Spark
`orderBy` (results are small, and an `orderBy` costs a sampling job): by (window, keys)
ascending (`order_plan`), with the radix sort of `highlevel.sorting`. Then:

- `to_output_table`: the output schema of the display sinks (ip as text, uint64 outputs as
  uint64: Spark hands them over as int64 bits); `sorted_output_table` takes and formats a
  large batch in parts, side by side (`highlevel.parallel`);
- `raw_output_table`: the raw layout of `highlevel.rowlayout` for a reader's spool (`window` =
  the window's end in ns, ip as two int64 halves).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from highlevel.finalize import ip_text_arrow, unwrap_ip_str
from highlevel.parallel import map_ordered
from highlevel.sorting import sort_indices
from highlevel.spec import StageSpec
from queries import expressions as E

#: rows of a closed batch taken and formatted per part (`sorted_output_table`)
OUTPUT_PART_ROWS = 1 << 18

#: Spark's type of an output or key type (ip: the two halves, compared as such)
_SPARK_TYPE = {"int64": "long", "uint64": "long", "float64": "double", "string": "string",
               "bool": "boolean", "ip": "ip"}


def order_plan(spec: StageSpec) -> tuple[list[str], list[tuple[str, str]]]:
    """(result columns to sort by, hidden columns to fetch besides the outputs as (alias,
    partial column)).

    Rows are sorted by (window, keys). A key that an output already holds unchanged (the
    output is the bare key, of the same Spark type) is sorted by through that output rather
    than fetched twice: with flow records every key but the flow id is an output, and the
    Arrow transfer to the driver costs per column. The window id is always fetched, as
    `__window` (the raw layout's window end is computed from it)."""
    shown: dict[str, tuple[str, str]] = {}     # key name -> (output holding it, its type)
    for o in spec.outputs:
        expr = unwrap_ip_str(o.expr)
        if isinstance(expr, (E.Column, E.Field)) and \
                expr.name != spec.window.column:
            shown.setdefault(expr.name, (o.name, o.type))
    order, hidden = ["__window"], [("__window", "window")]
    for k in spec.keys:
        held = shown.get(k.name)
        same = held is not None and _SPARK_TYPE[held[1]] == _SPARK_TYPE[k.type]
        for c in k.columns():
            suffix = c[len(k.name):]          # "" or "__hi"/"__lo"
            if held is not None and same:
                order.append(held[0] + suffix)
            else:
                name = f"__order{len(hidden)}"
                hidden.append((name, c))
                order.append(name)
    return order, hidden


def order_columns(spec: StageSpec) -> tuple[list[str], list[Column]]:
    """`order_plan` with the hidden columns as Spark columns."""
    order, hidden = order_plan(spec)
    return order, [F.col(c).alias(name) for name, c in hidden]


def output_table(result: pa.Table, spec: StageSpec, order: list[str]) -> pa.Table:
    """Spark's Arrow result sorted by `order`, in the output schema."""
    if result.num_rows <= 1:
        return to_output_table(result, spec)
    # one chunk per column first: sorting and taking across many Arrow batches of 10K rows
    # costs twice as much
    result = result.combine_chunks()
    return sorted_output_table(result, sort_indices(result, order), spec)


def raw_output_table(table: pa.Table, spec: StageSpec) -> pa.Table:
    """Spark's Arrow result in the raw layout of `highlevel.rowlayout` (for readers' spools):
    `window` = the window's end (ns), ip outputs as `name__hi`/`name__lo`, the rest as Spark
    computed them (unsigned as int64 bits)."""
    names = set(table.column_names)
    cols = {"window": table.column("__time")}
    for o in spec.outputs:
        if o.name not in names and f"{o.name}__hi" in names:
            cols[f"{o.name}__hi"] = table.column(f"{o.name}__hi")
            cols[f"{o.name}__lo"] = table.column(f"{o.name}__lo")
        else:
            cols[o.name] = table.column(o.name)
    return pa.table(cols)


def sorted_output_table(table: pa.Table, order: np.ndarray, spec: StageSpec,
                        part_rows: int = OUTPUT_PART_ROWS) -> pa.Table:
    """`to_output_table(table.take(order))`, one chunk per part of `part_rows` rows, the
    parts taken and formatted side by side (`highlevel.parallel`)."""
    parts = [order[i:i + part_rows] for i in range(0, len(order), part_rows)]
    tables = list(map_ordered(lambda idx: to_output_table(table.take(idx), spec), parts))
    return pa.concat_tables(tables) if tables else to_output_table(table.slice(0, 0), spec)


def to_output_table(table: pa.Table, spec: StageSpec) -> pa.Table:
    """Spark's Arrow result in the output schema (uint64 outputs travel as int64 bits)."""
    schema = spec.output_arrow_schema()
    arrays = []
    names = set(table.column_names)
    for f in schema:
        if f.name not in names and f"{f.name}__hi" in names:
            arrays.append(ip_text_arrow(_one_chunk(table.column(f"{f.name}__hi")),
                                        _one_chunk(table.column(f"{f.name}__lo"))))
            continue
        col = _one_chunk(table.column(f.name))
        if pa.types.is_uint64(f.type) and pa.types.is_int64(col.type):
            col = col.view(pa.uint64())         # the same bits and nulls, no copy
        arrays.append(col if col.type == f.type else col.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    """The column as one array (`combine_chunks` copies even a single chunk)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
