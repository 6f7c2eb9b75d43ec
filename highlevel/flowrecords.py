"""Flow records closed on the driver with Arrow: the rows of a unique-row stage, with no Spark job.

A flow query's partial rows are whole flow records: unique per (window, keys), so combining is
the identity (`StageSpec.extras.unique_rows`). Closing windows then only selects rows: those
whose pane ended in (P_before, P] leave, the others stay open. Spark's job for that reads each
spool file, turns its columns into rows, filters them and turns them back into Arrow columns
for the driver, slowly for a selection that Arrow does on the driver in a fraction of the time
(docs/performance.md has the figures).

So when a micro-batch's markers came from the spool footers (`highlevel.batchfiles`: no row
can be late) and the query's outputs are plain names (keys, states, finals naming a state, the
window column), `FlowRecords` reads the batch's files and the open state with pyarrow, splits
closed from open rows, and builds the closed rows in the very layout `AggregateStage.close`
collects from Spark (`outputs` then `hidden`); `highlevel.microbatch` runs that batch.
Structured Streaming still drives the batches: which files each batch holds, its commit, its
replay after a crash; Meld, the punctuation and the state versions are the stage's as before.
Anything else (late rows, a combine, HAVING, an expression, sliding windows, a prepared frame)
goes through Spark. `OOPSCOPE_DRIVER_ROWS=0` sends every batch through Spark (for comparison).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common import settings
from common.spool import cached_rows
from highlevel.finalize import unwrap_ip_str
from highlevel.output import order_plan
from highlevel.spec import StageSpec
from highlevel.windows import WindowLogic
from queries import expressions as E

#: Spark's type of an output column, as `finalize.output_columns` casts it, in Arrow
_ARROW_OF = {"int64": pa.int64(), "uint64": pa.int64(), "float64": pa.float64(),
             "string": pa.string(), "bool": pa.bool_()}


#: Arrow's type of a partial column, by its type in Spark's partial_schema
_SPARK_ARROW = {"bigint": pa.int64(), "double": pa.float64(), "string": pa.string(),
                "boolean": pa.bool_(), "int": pa.int32()}


def enabled() -> bool:
    return settings.driver_rows()


class FlowRecords:
    """The driver-side close of one unique-row stage (built by `of`)."""

    def __init__(self, schema: pa.Schema, layout: list[tuple[str, str, object]], window,
                 scale: int = 1, shift: int = 0):
        self.schema = schema            # the partial columns, as Spark's partial_schema
        self.columns = schema.names
        self.layout = layout            # (result name, partial column or WINDOW_VALUE, type)
        self.window = window            # highlevel.windows.WindowLogic (tumbling)
        self.scale, self.shift = scale, shift     # window column value = id * scale + shift

    @classmethod
    def of(cls, spec: StageSpec, window: WindowLogic) -> FlowRecords | None:
        """The driver path of the aggregation `spec` with windows `window`, or None when its
        batches need Spark's job."""
        return cls.plain(spec, window) if spec.extras.unique_rows else None

    @classmethod
    def plain(cls, spec: StageSpec, window: WindowLogic) -> FlowRecords | None:
        """The driver-side outputs of `spec`'s rows that need no combine (`result`), or None
        when they need Spark's expressions (module docstring) or the driver path is off."""
        if not (enabled() and window.tumbling and spec.having is None
                and spec.late != "correct" and spec.window2 is None):
            return None
        schema = pa.schema([(f.name, _SPARK_ARROW[f.dataType.simpleString()])
                            for f in spec.partial_schema().fields])
        layout = _output_layout(spec, schema)
        if layout is None:
            return None
        _, hidden = order_plan(spec)
        layout += [(name, c, schema.field(c).type) for name, c in hidden]
        return cls(schema, layout, window, spec.window.scale, spec.window.shift)

    # --- rows --------------------------------------------------------------------------------
    def read(self, files: list[tuple[Path, int]], open_dir: Path | None,
             keep: bool = False, columns: list[str] | None = None) -> pa.Table:
        """The partial rows of the batch's spool files ((path, data rows) each: the rows
        come first, the marker row last) and of the open state, one chunk per column. Every
        copy of a column costs here: fresh memory is page-faulted in as it is first written.
        `keep`: rows kept in memory stay there (`cached_rows`). `columns`: the spool columns
        to read (the partial columns by default; the open state has only those)."""
        columns = columns or self.columns
        tables = []
        for path, rows in files:
            kept = cached_rows(path, keep)      # written by this process a moment ago
            tables.append(kept.select(columns) if kept is not None and kept.num_rows == rows
                          else pq.read_table(path, columns=columns).slice(0, rows))
        if open_dir is not None:
            tables.append(read_open(open_dir, self.schema))
        tables = [t for t in tables if t.num_rows]
        if not tables:
            return self.schema.empty_table()
        table = pa.concat_tables([t.cast(tables[0].schema) for t in tables])
        window = table.column("window")
        if window.null_count:
            table = table.filter(pc.is_valid(window))
        return table.combine_chunks()

    def split(self, table: pa.Table, before: int | None, upto: int) -> tuple[pa.Table, pa.Table]:
        """(rows whose window ends in (before, upto], rows still open after upto); no copy
        when all rows fall on one side."""
        if table.num_rows == 0:
            return table, table
        end = self.window.pane_end(np.asarray(table.column("window")))
        closing = end <= upto
        if before is not None:
            closing &= end > before
        still_open = end > upto
        if closing.all():
            return table, table.slice(0, 0)
        if still_open.all():
            return table.slice(0, 0), table
        return table.filter(pa.array(closing)), table.filter(pa.array(still_open))

    def result(self, closed: pa.Table) -> pa.Table:
        """The closed rows in the layout of Spark's `select(*outputs, *hidden).toArrow()`."""
        arrays, names = [], []
        for name, source, arrow_type in self.layout:
            if source == WINDOW_VALUE:
                ids = np.asarray(closed.column("window"))
                col = pa.array(ids * np.int64(self.scale) + np.int64(self.shift))
            else:
                col = closed.column(source)
            arrays.append(col.cast(arrow_type) if col.type != arrow_type else col)
            names.append(name)
        return pa.Table.from_arrays(arrays, names=names)

    @staticmethod
    def write_open(table: pa.Table, directory: Path) -> None:
        """The open rows as a Parquet directory that Spark and `read` both read (one file),
        put in place by a rename."""
        tmp = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        pq.write_table(table, tmp / "part-00000.parquet")
        shutil.rmtree(directory, ignore_errors=True)
        os.rename(tmp, directory)


#: the layout's source for the window column (window id * scale + shift)
WINDOW_VALUE = "window*"


def read_open(directory: Path, schema: pa.Schema) -> pa.Table:
    """An open-state directory (written by Spark or by `FlowRecords.write_open`)."""
    files = sorted(p for p in Path(directory).glob("*.parquet")
                   if not p.name.startswith((".", "_")))
    tables = [pq.read_table(p, columns=schema.names) for p in files]
    if not tables:
        return schema.empty_table()
    return pa.concat_tables([t.cast(tables[0].schema) for t in tables])


def _resolve(spec, node, depth: int = 0) -> tuple[str, ...] | None:
    """The partial column(s) a plain-name output reads: (WINDOW_VALUE,) for the window
    column, a key's columns, a state column; None for anything that needs an expression."""
    node = unwrap_ip_str(node)
    if not isinstance(node, (E.Column, E.Field)) or depth > 8:
        return None
    name, w = node.name, spec.window
    if w.column is not None and name == w.column:
        return (WINDOW_VALUE,)
    for k in spec.keys:
        if k.name == name:
            return k.columns()
    if name in dict(spec.state_columns()):
        return (name,)
    finals = dict(spec.finals)
    if name in finals:
        return _resolve(spec, finals[name], depth + 1)
    return None


def _output_layout(spec, schema: pa.Schema) -> list | None:
    """[(result column, source, arrow type)] of the outputs, named and typed as
    `finalize.output_columns` selects them; None when an output is not a plain name."""
    layout = []
    for out in spec.outputs:
        src = _resolve(spec, out.expr)
        if src is None:
            return None
        if len(src) == 2:                     # an IP key: its two halves
            if out.type != "ip":
                return None
            layout += [(f"{out.name}__hi", src[0], pa.int64()),
                       (f"{out.name}__lo", src[1], pa.int64())]
            continue
        if out.type not in _ARROW_OF or (src[0] == WINDOW_VALUE
                                         and out.type not in ("int64", "uint64")):
            return None
        if src[0] != WINDOW_VALUE and schema.field(src[0]).type != _ARROW_OF[out.type]:
            return None                       # a cast Spark would do (e.g. a float as long)
        layout.append((out.name, src[0], _ARROW_OF[out.type]))
    return layout
