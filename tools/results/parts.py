"""Commit model B: a file per micro-batch, written through a temporary name and a rename, never twice.

`PartFiles` is a directory of part files of one format, one per micro-batch that had rows,
named by batch id (`part-<prefix><batch>.<ext>`). Each is written through a temporary name
and `os.replace`, so a part is absent or complete, and a batch the checkpoint replays after
a crash finds its part and writes nothing twice. Its bytes come from the output's format
writer (`tools.results.formats`): a CSV part is the header line and the rows as `run`
writes them into one file, a NetFlow part a pcap of the batch's datagrams.

Two users:
- the appliance (`serve`) writes each stream's rows as parts in its output directory
  (`PartSink`: `CsvSink`, `JsonLinesSink`, `ParquetSink`, `NetflowPcapSink`; `make_sink`);
- a resumable `run` keeps the batches of an output it can only write whole at the end (a
  Parquet file has no footer until it is closed; an aligned table at full speed is printed
  once, at the end) as Parquet parts under the checkpoint
  (`CHECKPOINT/outputs/<query>.parts/`), and `tools.results.appended` writes the output
  from them, in batch order, when the run ends.

The aligned text table is refused as part files (`make_sink("table", ...)`): its column
widths are fitted to the rows it holds, so each part would be a table of its own, and no
program reads it back; it goes to a stream instead (`ConsoleSink`, or `run`'s outputs).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from highlevel.errors import SinkError
from highlevel.sinks import Sink
from tools.results.formats import FormatWriter, format_table, make_writer

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SINK_KINDS = ("console", "csv", "parquet", "jsonl", "netflow")


class PartFiles:
    """One output's part files, one per micro-batch that had rows, named by batch id.

    `writer`: the format (a Parquet writer by default); `prefix`: before the batch id (the
    appliance's next generation of a query, whose batch ids start again, writes beside the
    older files); `digits`: of the batch id in names; `fsync`: each part reaches the disk
    before its rename (the appliance's outputs; a run's parts live in its checkpoint)."""

    def __init__(self, directory: str | os.PathLike, writer: FormatWriter | None = None,
                 prefix: str = "", digits: int = 12, fsync: bool = False):
        self.dir = Path(directory)
        self.writer = writer if writer is not None else make_writer("parquet")
        self.prefix, self.digits, self.fsync = prefix, digits, fsync
        self._name = re.compile(rf"^part-{re.escape(prefix)}(\d+)\.{self.writer.ext}$")

    def path(self, batch_id: int) -> Path:
        return self.dir / f"part-{self.prefix}{batch_id:0{self.digits}d}.{self.writer.ext}"

    def batch_ids(self) -> list[int]:
        """The batches written, in order (a temporary file of a part cut short is none)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := self._name.match(n)))

    def files(self) -> list[Path]:
        return [self.path(b) for b in self.batch_ids()]

    def holds(self, batch_id: int) -> bool:
        """The batch is written already (a batch the checkpoint replays after a crash)."""
        return self.path(batch_id).exists()

    def last(self) -> int:
        """The last batch id written, -1 when none."""
        ids = self.batch_ids()
        return ids[-1] if ids else -1

    def write(self, batch_id: int, table) -> None:
        """The batch's rows as its part: whole or not at all (raises OSError)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        final = self.path(batch_id)
        # the pid: two writers of one directory (a server and the one it replaced) never
        # write into each other's temporary file
        tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                self.writer.start(fh, table)
                self.writer.batch(table)
                self.writer.rows(fh, table)
                self.writer.finish(fh)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise

    def read(self, batch_id: int):
        """The rows of one Parquet part (raises OSError, or pyarrow's error for a damaged
        part)."""
        import pyarrow.parquet as pq

        return pq.read_table(self.path(batch_id))

    def tables(self):
        """Every Parquet part's rows, in batch order, one table at a time (bounded memory)."""
        for batch_id in self.batch_ids():
            yield batch_id, self.read(batch_id)

    def rows(self) -> int:
        """The rows of every Parquet part, from the footers (no data is read)."""
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(self.path(b)).metadata.num_rows for b in self.batch_ids())


class PartSink(Sink):
    """A directory of `part-<prefix><batch>.<ext>` files in one format (module docstring)."""

    format = ""

    def __init__(self, path: str | os.PathLike, prefix: str = "", **options):
        #: `prefix`: before the batch id in file names: a writer whose batch ids start again
        #: (the appliance's next generation of a query) writes beside the older files
        self.parts = PartFiles(path, make_writer(self.format, **options), prefix, digits=10,
                               fsync=True)
        self.ext = self.parts.writer.ext
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"{self.ext} sink: cannot create directory {self.dir}: {exc}") from exc

    @property
    def dir(self) -> Path:
        return self.parts.dir

    def path_of(self, batch_id: int) -> Path:
        return self.parts.path(batch_id)

    def write(self, batch_id: int, table: pa.Table) -> bool:
        path = self.path_of(batch_id)
        if path.exists():
            log.info("%s sink: batch %d already written (%s)", self.ext, batch_id, path)
            return False
        if table.num_rows == 0:
            return True
        try:
            self.parts.write(batch_id, table)
        except OSError as exc:
            raise SinkError(f"{self.ext} sink: cannot write {path}: {exc}") from exc
        return True

    def files(self) -> list[Path]:
        return self.parts.files()

    def read(self, schema: pa.Schema | None = None) -> pa.Table | None:
        """Every committed file, in batch order (for tests and tools)."""
        import pyarrow as pa

        tables = [self._read(p, schema) for p in self.files()]
        return pa.concat_tables(tables) if tables else None

    def _read(self, path: Path, schema):
        raise NotImplementedError


class CsvSink(PartSink):
    format = "csv"
    ext = "csv"

    def _read(self, path, schema):
        import pyarrow.csv as pacsv

        opts = pacsv.ConvertOptions(column_types=schema) if schema is not None else None
        return pacsv.read_csv(path, convert_options=opts)


class ParquetSink(PartSink):
    format = "parquet"
    ext = "parquet"

    def _read(self, path, schema):
        import pyarrow.parquet as pq

        return pq.read_table(path, schema=schema)


class JsonLinesSink(PartSink):
    format = "jsonl"
    ext = "jsonl"

    def read(self, schema: pa.Schema | None = None) -> pa.Table | None:
        import json

        import pyarrow as pa

        rows = [json.loads(line) for p in self.files() for line in p.read_text().splitlines()]
        return pa.Table.from_pylist(rows, schema=schema) if rows else None


class NetflowPcapSink(PartSink):
    """Each batch's flow records as NetFlow datagrams in a pcap of its own (`version`, `mtu`
    ... as `tools.netflow.exporter.Exporter`'s); sequence numbers carry on across files."""

    format = "netflow"
    ext = "pcap"

    def _read(self, path, schema):
        raise NotImplementedError("a NetFlow part is read by a collector (tools.netflow)")


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
        out.write(format_table(table, header=self.header_every_batch or not self._header_done))
        self._header_done = True
        out.flush()
        return True


_PART_SINKS: dict[str, Callable[..., PartSink]] = {
    "csv": CsvSink, "parquet": ParquetSink, "jsonl": JsonLinesSink, "netflow": NetflowPcapSink}


def part_sink(kind: str, path: str | os.PathLike, prefix: str = "", **options) -> PartSink:
    """The part-file sink of format `kind` (`csv`, `parquet`, `jsonl`, `netflow`) in the
    directory `path`; a table is refused (module docstring)."""
    if kind == "table":
        raise SinkError("a table is written to a stream (console), never as part files: its "
                        f"widths fit the rows it holds; allowed: {', '.join(_PART_SINKS)}")
    if kind not in _PART_SINKS:
        raise SinkError(f"unknown sink {kind!r}; allowed: {', '.join(SINK_KINDS)}")
    return _PART_SINKS[kind](path, prefix, **options)


def make_sink(kind: str, path: str | os.PathLike | None = None, prefix: str = "",
              **options) -> Sink:
    """A sink by kind name (`console`, `csv`, `parquet`, `jsonl`, `netflow`); a table is
    the console's (module docstring: never part files)."""
    if kind == "console":
        return ConsoleSink()
    if path is None and kind in _PART_SINKS:
        raise SinkError(f"the {kind} sink needs a directory path")
    return part_sink(kind, path or "", prefix, **options)
