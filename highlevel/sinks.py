"""Result sinks: console table, CSV, Parquet, JSON lines; one file per micro-batch, written once.

Each file sink writes the closed windows of micro-batch N to `DIR/part-<N>.<ext>` through a
temporary name and `os.replace`, so a file is either absent or complete, and a batch re-run
after a crash finds its file and writes nothing twice. Results are per-window rows (orders of
magnitude fewer than partials), written from the driver with Arrow in the output types.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from highlevel.errors import SinkError

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow is imported where a sink first needs it: the run's outputs are sinks, and the run
# imports them before it starts the JVM

log = logging.getLogger(__name__)

SINK_KINDS = ("console", "csv", "parquet", "jsonl")


class Sink:
    """Receives each micro-batch's closed rows (an Arrow table in the output schema).

    Every sink a stage writes to is one: the file sinks here, the spool sinks between stages,
    the run's outputs (`tools.run.outputs`), the NetFlow exporter (`tools.netflow.sink`). A
    subclass defines `write`, and may change the defaults: a sink with `raw = True` receives
    the rows in the raw layout of `highlevel.rowlayout` (`window` = row time in ns, ip as two
    int64 halves) instead of the display schema; `end_batch(batch_id, punctuation)` is called
    once at the end of every processed micro-batch, before the stage commits it, with the
    stage's output punctuation (ns; None before the first), so a sink feeding another stage
    can forward it. A join gives a sink with `side` set (0 left, 1 right: a reader whose
    windows are on that side's time) that side's individual punctuation, and a `joint` one
    (a reader grouping by both sides' times) its individual and joint punctuation
    (`highlevel.join.JoinStage.sink_punctuation`).
    """

    raw: bool = False
    side: int | None = None
    joint: bool = False

    def write(self, batch_id: int, table: pa.Table) -> bool:
        """Write the rows of `batch_id`; False when that batch was already written."""
        raise NotImplementedError

    def end_batch(self, batch_id: int, punctuation) -> None:
        """The batch's rows are all written (a no-op unless the sink forwards punctuation)."""

    def close(self) -> None:
        """No more batches."""


class SpoolSink(Sink):
    """Feeds a reading stage: each micro-batch's rows and output punctuation become one spool
    file of the reader (`ROOT/<reader>/partials/<link>-<batch>.parquet`, the atomic format of
    `common.spool`), link name = `link` (the upstream query, or the join/MERGE alias).

    The file's sequence number is the micro-batch id, so a batch replayed after a crash finds
    its file and writes nothing twice, and the reader applies the punctuation in batch order.
    `prefix` is put before every data column (join sides share one spool directory). `side`
    (0 left, 1 right; feeding from a join only): the reader's windows are on that side's
    time, so the join gives it that side's individual punctuation. `joint`: the reader also
    groups by the other side's time (highlevel.joint), so the join gives a tuple (that side's
    individual punctuation, the other's, the joint pair on this side's and the other's time)
    and the file carries the last three in the `JOINT_MARKERS` columns.
    """

    raw = True

    def __init__(self, root, reader: str, link: str, prefix: str = "", side: int | None = None,
                 joint: bool = False):
        from common.spool import SpoolWriter

        self.writer = SpoolWriter(root, reader, link, fsync=False)
        self.prefix = prefix
        self.side = side
        self.joint = joint
        self.pending: dict[int, pa.Table] = {}
        self.files = 0

    def write(self, batch_id: int, table: pa.Table) -> bool:
        if self.prefix:
            table = table.rename_columns([c if c == "window" else self.prefix + c
                                          for c in table.column_names])
        self.pending[batch_id] = table.replace_schema_metadata(None)
        return True

    def end_batch(self, batch_id: int, punctuation) -> None:
        from common.spool import JOINT_MARKERS, spool_file_name

        table = self.pending.pop(batch_id, None)
        if (self.writer.dir / spool_file_name(self.writer.link, batch_id)).exists():
            return   # written before a crash: the same rows (batches are deterministic)
        self.writer.seq = batch_id
        markers = None
        if self.joint:
            punctuation, *more = punctuation if punctuation is not None else [None] * 4
            markers = dict(zip(JOINT_MARKERS, more))
        self.writer.write(table, punctuation, markers)
        self.files += 1


class ConsoleSink(Sink):
    """An aligned text table per batch (stdout by default; not idempotent across restarts)."""

    def __init__(self, stream: TextIO | None = None, header_every_batch: bool = False):
        self.stream = stream
        self.header_every_batch = header_every_batch
        self._header_done = False

    def write(self, batch_id: int, table: pa.Table) -> bool:
        if table.num_rows == 0:
            return True
        out = self.stream or sys.stdout
        names = table.column_names
        rows = [["" if v is None else str(v) for v in r.values()] for r in table.to_pylist()]
        widths = [max([len(n)] + [len(r[i]) for r in rows]) for i, n in enumerate(names)]
        if self.header_every_batch or not self._header_done:
            out.write("  ".join(n.rjust(w) for n, w in zip(names, widths)) + "\n")
            self._header_done = True
        for r in rows:
            out.write("  ".join(v.rjust(w) for v, w in zip(r, widths)) + "\n")
        out.flush()
        return True


class FileSink(Sink):
    """A directory of `part-<batch>.<ext>` files."""

    ext = ""

    def __init__(self, path: str | os.PathLike, prefix: str = ""):
        self.dir = Path(path)
        #: before the batch id in file names: a writer whose batch ids start again (the
        #: appliance's next generation of a query) writes beside the older files
        self.prefix = prefix
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"{self.ext} sink: cannot create directory {self.dir}: {exc}") from exc

    def path_of(self, batch_id: int) -> Path:
        return self.dir / f"part-{self.prefix}{batch_id:010d}.{self.ext}"

    def write(self, batch_id: int, table: pa.Table) -> bool:
        path = self.path_of(batch_id)
        if path.exists():
            log.info("%s sink: batch %d already written (%s)", self.ext, batch_id, path)
            return False
        if table.num_rows == 0:
            return True
        tmp = self.dir / f".{path.name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as fh:
                self._write(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise SinkError(f"{self.ext} sink: cannot write {path}: {exc}") from exc
        return True

    def _write(self, table: pa.Table, fh) -> None:
        raise NotImplementedError

    def read(self) -> pa.Table | None:
        """Every committed file, in batch order (for tests and tools)."""
        raise NotImplementedError

    def files(self) -> list[Path]:
        return sorted(self.dir.glob(f"part-*.{self.ext}"))


class CsvSink(FileSink):
    ext = "csv"

    def _write(self, table, fh):
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, fh)

    def read(self, schema: pa.Schema | None = None):
        import pyarrow as pa
        import pyarrow.csv as pacsv

        opts = pacsv.ConvertOptions(column_types=schema) if schema is not None else None
        tables = [pacsv.read_csv(p, convert_options=opts) for p in self.files()]
        return pa.concat_tables(tables) if tables else None


class ParquetSink(FileSink):
    ext = "parquet"

    def _write(self, table, fh):
        import pyarrow.parquet as pq

        pq.write_table(table, fh)

    def read(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = [pq.read_table(p) for p in self.files()]
        return pa.concat_tables(tables) if tables else None


class JsonLinesSink(FileSink):
    ext = "jsonl"

    def _write(self, table, fh):
        for row in table.to_pylist():
            fh.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")

    def read(self, schema: pa.Schema | None = None):
        import pyarrow as pa

        rows = [json.loads(line) for p in self.files() for line in p.read_text().splitlines()]
        return pa.Table.from_pylist(rows, schema=schema) if rows else None


def make_sink(kind: str, path: str | os.PathLike | None = None) -> Sink:
    """A sink by kind name (`console`, `csv`, `parquet`, `jsonl`)."""
    if kind == "console":
        return ConsoleSink()
    classes = {"csv": CsvSink, "parquet": ParquetSink, "jsonl": JsonLinesSink}
    if kind not in classes:
        raise SinkError(f"unknown sink {kind!r}; allowed: {', '.join(SINK_KINDS)}")
    if path is None:
        raise SinkError(f"the {kind} sink needs a directory path")
    return classes[kind](path)
