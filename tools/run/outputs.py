"""Where `oopscope run` writes a query's rows: table, CSV, JSON lines or Parquet, file or stdout.

`QueryOutput` is a `highlevel.sinks.Sink`: the Spark stage hands it the rows of each
micro-batch as windows close. CSV and JSON lines are appended (and flushed) batch by batch, so
a paced or live run shows each window as soon as it closes; Parquet goes out as one row group
per batch; the aligned text table is printed per batch in paced and live runs and once, with
widths fitted to every row, at the end of a replay at full speed (as is everything several
queries write to stdout then, one query after the other). All rows are also kept (results are
small: one row per group per window) for the run summary and the library API.

Output conventions: times are integers, `ipv4` columns dotted quads, `ip` columns text (dotted
quad for IPv4-mapped addresses, RFC 5952 otherwise, as `highlevel.finalize.ip_text_arrow`
writes them).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from highlevel.sinks import Sink
from tools.errors import RunConfigError, RunError

FORMATS = ("table", "csv", "jsonl", "parquet")
_SUFFIX_FORMAT = {".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                  ".parquet": "parquet", ".pq": "parquet"}


def output_format(given: str | None, out: str) -> str:
    """The format of one output: the `--format` given, else from the file suffix."""
    if given is not None:
        if given not in FORMATS:
            raise RunConfigError(f"--format {given}: allowed {', '.join(FORMATS)}")
        return given
    return "table" if out == "-" else _SUFFIX_FORMAT.get(Path(out).suffix.lower(), "csv")


def arrow_schema(query: str, outputs):
    """The Arrow schema of a query's result rows (as the Spark stages hand them over)."""
    import pyarrow as pa

    from highlevel.spec import output_type

    types = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
             "string": pa.string(), "bool": pa.bool_(), "ip": pa.string()}
    return pa.schema([pa.field(o.name, types[output_type(o.type)]) for o in outputs],
                     metadata={b"oopscope.query": query.encode()})


def display_table(table, outputs):
    """The rows as written: `ipv4` columns (by the query's output types) as dotted quads."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    types = {o.name: o.type.lower() for o in outputs}
    arrays = []
    for name in table.column_names:
        col = table.column(name)
        if types.get(name) == "ipv4" and pa.types.is_integer(col.type):
            col = col.combine_chunks()
            v = np.asarray(col.fill_null(0).cast(pa.uint64())).astype(np.uint64)
            octets = [pa.array(((v >> np.uint64(s)) & np.uint64(255)).astype(np.int64))
                      .cast(pa.string()) for s in (24, 16, 8, 0)]
            text = pc.binary_join_element_wise(*octets, ".")
            col = pa.array(text.to_numpy(zero_copy_only=False), pa.string(),
                           mask=np.asarray(col.is_null()))
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names)   # chunks as they come


def format_table(table, header: bool = True) -> str:
    names = table.column_names
    rows = [["" if v is None else str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))] if header else []
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines) + "\n" if lines else ""


def _write_csv_rows(table, fh) -> None:
    """The rows as pyarrow writes them (no header; strings quoted only when some value needs
    it): by `tools.run.csvwrite` when every column is an integer or a string and none needs
    quoting (3.4M flow records: 1.5 s -> 0.5 s), else by `pyarrow.csv.write_csv`."""
    import pyarrow.csv as pacsv

    from tools.run import csvwrite

    quoting = _csv_quoting(table)
    if quoting == "none" and csvwrite.writes(table.schema):
        csvwrite.write_csv_rows(table, fh)
    else:
        pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False,
                                                      quoting_style=quoting))


def _csv_quoting(table) -> str:
    """Quote strings only when some value needs it (addresses as text never do)."""
    import pyarrow as pa

    for col in table.columns:
        if pa.types.is_string(col.type) and any(_needs_quoting(c) for c in col.chunks):
            return "needed"
    return "none"


def _needs_quoting(chunk) -> bool:
    """True when a value of the string array holds `,`, `"`, CR or LF. Without nulls, the
    values' bytes are searched as one text (a regex per value took 0.35 s per 3.4M addresses);
    these bytes never occur inside a multi-byte UTF-8 character."""
    import numpy as np
    import pyarrow.compute as pc

    if not len(chunk):
        return False
    _, offsets, data = chunk.buffers()
    if chunk.null_count or data is None:   # the bytes under a null are no value's
        return bool(pc.any(pc.match_substring_regex(chunk, r'[,"\r\n]')).as_py())
    offsets = np.frombuffer(offsets, np.int32, chunk.offset + len(chunk) + 1)[chunk.offset:]
    text = data.slice(int(offsets[0]), int(offsets[-1] - offsets[0])).to_pybytes()
    return any(c in text for c in (b",", b'"', b"\r", b"\n"))


class QueryOutput(Sink):
    """One query's output (a `highlevel.sinks.Sink`): rows appended as micro-batches close.

    `buffered`: keep the rows and write them all at `close()` (an aligned table fitted to
    every row; several queries sharing stdout one after the other); otherwise each batch is
    written as it arrives. `title`: a line written before the rows when several queries
    share stdout. `keep`: the rows written stay in memory too (`table()`); a buffered
    output always keeps them."""

    def __init__(self, query: str, outputs, fmt: str, out: str, schema, *,
                 buffered: bool = False, title: str | None = None, keep: bool = True):
        self.query, self.outputs, self.format, self.out = query, outputs, fmt, out
        self.schema = schema
        self.buffered = buffered
        self.keep = keep or buffered
        self.title = title
        self.rows = 0
        self.batches = 0
        self._tables: list = []        # pyarrow Tables (imported when a batch comes)
        self._fh = None
        self._parquet: Any = None      # a pyarrow.parquet.ParquetWriter once opened
        self._started = False
        self._closed = False
        self._lock = threading.Lock()   # stages of several queries share stdout

    # --- the Sink protocol -------------------------------------------------------------------
    def write(self, batch_id: int, table) -> bool:
        table = display_table(table, self.outputs)
        with self._lock:
            if self.keep:
                self._tables.append(table)
            self.rows += table.num_rows
            self.batches += 1
            if not self.buffered and (table.num_rows or self.format != "table"):
                self._emit(table)
        return True

    def close(self, complete: bool = True) -> None:
        """Finish the output. `complete` False (the run failed): an output no row reached
        writes nothing at all (no header, no empty file); rows already there are kept."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.buffered:
                if complete or self.rows:
                    self._emit(self.table())
            elif not self._started and complete:
                self._emit(self.display_schema().empty_table())   # header / empty file
            try:
                if self._parquet is not None:
                    self._parquet.close()
                if self._fh is not None:
                    self._fh.flush()
                    if self.out != "-":
                        self._fh.close()
            except OSError as exc:
                raise RunError(f"cannot write the output {self.out}: {exc}") from None

    # --- rows ----------------------------------------------------------------------------------
    def display_schema(self):
        import pyarrow as pa

        return pa.schema([pa.field(f.name, pa.string()) if f.name in self._ipv4() else f
                          for f in self.schema])

    def _ipv4(self) -> set[str]:
        return {o.name for o in self.outputs if o.type.lower() == "ipv4"}

    def table(self):
        """Every row written so far, in the order written (a kept output)."""
        import pyarrow as pa

        if not self._tables:
            return self.display_schema().empty_table()
        return pa.concat_tables(self._tables, promote_options="permissive")

    def _open(self):
        if self._fh is None:
            try:
                self._fh = sys.stdout.buffer if self.out == "-" else open(self.out, "wb")
            except OSError as exc:
                raise RunError(f"cannot write the output {self.out}: {exc}") from None
        return self._fh

    def _emit(self, table) -> None:
        import pyarrow.parquet as pq

        fh = self._open()
        first = not self._started
        self._started = True
        try:
            if first and self.title:
                prefix = "" if self.format == "table" else "# "
                fh.write(f"{prefix}query {self.query}:\n".encode())
            if self.format == "table":
                fh.write(format_table(table, header=first).encode())
            elif self.format == "csv":
                if first:   # pyarrow quotes every header name; SELECT names are identifiers
                    fh.write((",".join(table.column_names) + "\n").encode())
                if table.num_rows:
                    _write_csv_rows(table, fh)
            elif self.format == "parquet":
                if self._parquet is None:
                    self._parquet = pq.ParquetWriter(fh, table.schema)
                self._parquet.write_table(table.cast(self._parquet.schema))
            else:
                for row in table.to_pylist():
                    fh.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
            fh.flush()
        except OSError as exc:
            raise RunError(f"cannot write the output {self.out}: {exc}") from None
