"""The format writers: how a query's result rows become the bytes of CSV, JSON lines, Parquet, table or NetFlow.

One writer per output turns the display rows (`display_table`: `ipv4` columns as dotted
quads) into bytes, whatever the commit model that decides where they go
(`tools.results.appended`: one file appended batch by batch; `tools.results.parts`: a file
per batch). So `run`, `serve` and `collect` write the same bytes for the same rows:

- CSV: the header line unquoted (SELECT names are identifiers), then the rows as pyarrow
  writes them with quoting style "none", a string quoted only when it holds `,`, `"`, CR or
  LF (RFC 4180: inside quotes `"` doubled), so a row's bytes never depend on the batch it
  falls in (which differs between `run` and `serve`), floats shortest-exact
  (`3761.423`, `0.30000000000000004`), nothing for a null; integer and string columns by
  the Numba writer (`tools.results.csvwrite`);
- JSON lines: one compact object per row (`json.dumps`: floats shortest-exact, `1.0`);
- Parquet: one row group per batch, written by `pyarrow.parquet.ParquetWriter`;
- table: the aligned text table (`format_table`), the header before the first rows;
- NetFlow: the rows of the `netflow` query as NetFlow v5 / v9 / IPFIX datagrams in a pcap
  (`tools.netflow.exporter.Exporter`'s encoders and pcap frames; sequence numbers and
  templates carry on from batch to batch).

Each format goes under both commit models but two combinations: a table is never part files
(its widths fit the rows it holds, and no program reads it back: `tools.results.parts`), and
an appended Parquet file is never cut back to a logged batch (it has no footer until closed:
a resumable run keeps its batches as part files and writes it from them at the end).

A writer's methods take the file: `start(fh, table)` before the first rows (a header),
`batch(table)` once per batch (CSV chooses its quoting), `rows(fh, part)` for the batch, or
for each part of it when `splits` (rows of whole windows, each committed on its own),
`finish(fh)` at the end of the file (a Parquet footer).
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.errors import RunConfigError

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

    from highlevel.finalize import ip_text_arrow

    types = {o.name: o.type.lower() for o in outputs}
    arrays = []
    for name in table.column_names:
        col = table.column(name)
        if types.get(name) == "ipv4" and pa.types.is_integer(col.type):
            col = col.combine_chunks()
            v = np.asarray(col.fill_null(0).cast(pa.uint64())).astype(np.uint64)
            # as IPv4-mapped addresses through the text kernel of the Spark stage's outputs:
            # octets cast and joined by Arrow, then made into Python strings to set the nulls,
            # took ~3 s of a 4.3M-row batch's sink write (docs/performance.md)
            mapped = (v & np.uint64(0xFFFF_FFFF)) | np.uint64(0xFFFF << 32)
            lo = pa.array(mapped.view(np.int64),
                          mask=np.asarray(col.is_null()) if col.null_count else None)
            col = ip_text_arrow(pa.array(np.zeros(len(v), np.int64)), lo)
        arrays.append(col)
    return pa.Table.from_arrays(arrays, names=table.column_names)   # chunks as they come


def display_schema(schema, outputs):
    """The schema of `display_table`'s rows: `ipv4` columns as strings."""
    import pyarrow as pa

    ipv4 = {o.name for o in outputs if o.type.lower() == "ipv4"}
    return pa.schema([pa.field(f.name, pa.string()) if f.name in ipv4 else f for f in schema])


def format_table(table, header: bool = True) -> str:
    names = table.column_names
    rows = [["" if v is None else str(v) for v in r.values()] for r in table.to_pylist()]
    widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
    lines = ["  ".join(n.rjust(w) for n, w in zip(names, widths))] if header else []
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines) + "\n" if lines else ""


def write_csv_rows(table, fh, quoting: str) -> None:
    """The rows as pyarrow writes them with quoting style "none" (no header): by
    `tools.results.csvwrite` when every column is an integer or a string (three times
    pyarrow's speed: docs/performance.md), else by `pyarrow.csv.write_csv`. With `quoting` "needed" (`csv_quoting`:
    some string needs quotes) only the strings that need them are quoted, the other columns
    cast to text as pyarrow's writer casts them, and the Numba writer writes the result."""
    import pyarrow.csv as pacsv

    from tools.results import csvwrite

    if quoting == "needed":
        csvwrite.write_csv_rows(_quoted_as_text(table), fh)
    elif csvwrite.writes(table.schema):
        csvwrite.write_csv_rows(table, fh)
    else:
        pacsv.write_csv(table, fh, pacsv.WriteOptions(include_header=False,
                                                      quoting_style="none"))


def _quoted_as_text(table):
    """Every column as text: a string that holds `,`, `"`, CR or LF in quotes with `"`
    doubled (pyarrow's "needed" style would quote every string of the batch), any other
    column cast to text as pyarrow's CSV writer casts it (nulls stay null: nothing written)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = []
    for col in table.columns:
        if pa.types.is_string(col.type):
            quoted = pc.binary_join_element_wise("", pc.replace_substring(col, '"', '""'), "",
                                                 '"')
            col = pc.if_else(pc.match_substring_regex(col, r'[,"\r\n]'), quoted, col)
        else:
            col = pc.cast(col, pa.string())
        columns.append(col)
    return pa.table(columns, names=table.column_names)


def csv_quoting(table) -> str:
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


class FormatWriter:
    """One output's rows in one format, into the file each call names (module docstring).

    `splits`: a batch may be written in parts of whole windows, each committed on its own;
    `footer`: the file is readable only once `finish` wrote its end (no cutting it back to a
    batch); `title_prefix`: before the `query NAME:` line of several queries sharing stdout."""

    name = ""
    ext = ""
    splits = False
    footer = False
    title_prefix = "# "

    def start(self, fh, table) -> None:
        """What the file holds before its first rows."""

    def resumed(self) -> None:
        """The file holds the rows of a run before (resumed): `start` is not called."""

    def batch(self, table) -> None:
        """A batch begins (its parts follow)."""

    def rows(self, fh, part) -> None:
        raise NotImplementedError

    def finish(self, fh) -> None:
        """The file ends."""

    @property
    def unfinished(self) -> bool:
        """`finish` has yet to write something (a footer)."""
        return False


class CsvWriter(FormatWriter):
    name, ext, splits = "csv", "csv", True

    def __init__(self):
        self.quoting = "none"

    def start(self, fh, table) -> None:
        # pyarrow quotes every header name; SELECT names are identifiers
        fh.write((",".join(table.column_names) + "\n").encode())

    def batch(self, table) -> None:
        self.quoting = csv_quoting(table) if table.num_rows else "none"

    def rows(self, fh, part) -> None:
        if part.num_rows:
            write_csv_rows(part, fh, self.quoting)


class JsonLinesWriter(FormatWriter):
    name, ext, splits = "jsonl", "jsonl", True

    def rows(self, fh, part) -> None:
        for row in part.to_pylist():
            fh.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")


class ParquetFormatWriter(FormatWriter):
    name, ext, footer = "parquet", "parquet", True

    def __init__(self):
        self._writer = None          # a pyarrow.parquet.ParquetWriter once rows come

    def rows(self, fh, part) -> None:
        import pyarrow.parquet as pq

        if self._writer is None:
            self._writer = pq.ParquetWriter(fh, part.schema)
        self._writer.write_table(part.cast(self._writer.schema))

    def finish(self, fh) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    @property
    def unfinished(self) -> bool:
        return self._writer is not None


class TableWriter(FormatWriter):
    """The aligned text table, for people: `window_starts` (a function from window column
    values to their start as UTC text, `tools.pipeline.windows.window_starts`) adds the
    column `window start (UTC)` after the window column `window`, so a minute number
    29453760 reads as 2026-01-01 00:00:00. The other formats keep the query's columns."""

    name, ext, title_prefix = "table", "txt", ""

    def __init__(self, window: str | None = None, window_starts=None):
        self.header = True           # until the first rows: widths fitted to each batch
        self.window, self.window_starts = window, window_starts

    def resumed(self) -> None:
        self.header = False

    def rows(self, fh, part) -> None:
        fh.write(format_table(self._with_starts(part), header=self.header).encode())
        self.header = False

    def _with_starts(self, part):
        import pyarrow as pa

        if self.window_starts is None or self.window not in part.column_names:
            return part
        values = part.column(self.window).to_pylist()
        at = part.column_names.index(self.window) + 1
        return part.add_column(at, "window start (UTC)",
                               pa.array(self.window_starts(values), pa.string()))


class NetflowWriter(FormatWriter):
    """The `netflow` query's rows as NetFlow datagrams in a pcap (one encoder for the output,
    so sequence numbers and templates carry on from batch to batch and file to file)."""

    name, ext = "netflow", "pcap"

    def __init__(self, version: int = 9, *, mtu: int = 1500, **options):
        import io

        from tools.netflow.exporter import Exporter
        from tools.netflow.sender import PcapWriter

        self.exporter = Exporter(None, version, mtu=mtu, **options)
        # frames the datagrams into whichever file `rows` names; its own buffer keeps the
        # pcap header `start` writes at the top of each file
        header = io.BytesIO()
        self._frames = PcapWriter(header)
        self._header = header.getvalue()

    def start(self, fh, table) -> None:
        fh.write(self._header)

    def rows(self, fh, part) -> None:
        from tools.netflow.records import from_table

        self._frames.fh = fh
        if part.num_rows:
            self._frames.send(self.exporter.encoder.encode(from_table(part)))


#: the writer of each format by name; `make_writer` builds one
WRITERS: dict[str, type[FormatWriter]] = {
    w.name: w for w in (CsvWriter, JsonLinesWriter, ParquetFormatWriter, TableWriter,
                        NetflowWriter)}


def make_writer(fmt: str, **options) -> FormatWriter:
    """A fresh writer of `fmt` (`options`: a NetFlow writer's version, mtu ...)."""
    try:
        cls = WRITERS[fmt]
    except KeyError:
        raise RunConfigError(f"format {fmt}: allowed {', '.join(WRITERS)}") from None
    return cls(**options)
