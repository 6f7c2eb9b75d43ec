"""Commit model A: one output file (or stdout) appended batch by batch, cut back to its last logged batch on resume.

`QueryOutput` is a `highlevel.sinks.Sink`: the Spark stage hands it the rows of each
micro-batch as windows close, and its format writer (`tools.results.formats`) makes the bytes.
CSV and JSON lines are appended (and flushed) batch by batch, so a paced or live run shows
each window as soon as it closes (in parts of whole windows, so a disk that fills up leaves
no torn row: `_BatchFile`, `QueryOutput`); Parquet goes out as one row group per batch; the
aligned text table is printed per batch in paced and live runs and once, with widths fitted
to every row, at the end of a replay at full speed (as is everything several queries write
to stdout then, one query after the other). All rows are also kept (results are small: one
row per group per window) for the run summary and the library API.

In a run that can resume after a crash (`tools.pipeline.resume`), a CSV, JSON lines, paced table
or NetFlow pcap file logs each batch (`resume_log`) and is cut back to its last logged batch
when resumed; a Parquet output (no footer until closed: it cannot be cut back), or one
written whole at the end, keeps each batch as a part file under the checkpoint instead
(commit model B, `tools.results.parts.PartFiles`) and is written from the parts when the
run ends.

Output conventions: times are integers, `ipv4` columns dotted quads, `ip` columns text (dotted
quad for IPv4-mapped addresses, RFC 5952 otherwise, as `highlevel.finalize.ip_text_arrow`
writes them).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.errors import os_error_text
from highlevel.sinks import Sink
from tools.errors import RunConfigError, RunError
from tools.results.formats import FormatWriter, display_schema, display_table, make_writer
from tools.results.parts import PartFiles

log = logging.getLogger(__name__)


class _BatchFile:
    """An output's file or stdout, written a batch at a time: `write` collects the batch's
    bytes in memory (up to `SPILL_BYTES`, then they go out in pieces of that size, so a huge
    batch of flow records does not sit in memory twice), `commit` writes the rest and
    flushes; only then do its rows count. When a write fails (a full disk), `rollback`
    truncates the file to its size after the last committed batch: a reader of the file
    never finds a row cut in half, nor a part of a batch that was not written whole.

    It is file-like enough for `pyarrow.csv.write_csv`, `pyarrow.parquet.ParquetWriter` and
    `tools.results.csvwrite` (which reuses the buffers it writes: the bytes are copied)."""

    SPILL_BYTES = 32 << 20
    closed = False

    def __init__(self, fd: int | None):
        self.fd = fd                  # None: standard output (no truncation: a pipe)
        self.committed = 0            # the file's size after the last complete batch
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._position = 0            # bytes handed to `write` so far (`tell`)

    def write(self, data) -> int:
        data = bytes(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._position += len(data)
        if self._pending_bytes >= self.SPILL_BYTES:
            self._drain()
        return len(data)

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        """pyarrow flushes its writers' sinks; a batch goes out only at `commit`."""

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def commit(self) -> None:
        """Write the batch's bytes not yet written and flush: the batch is complete."""
        self._drain()
        if self.fd is None:
            sys.stdout.buffer.flush()
        self.committed = self._position

    def rollback(self) -> None:
        """After a failed write: drop the batch, the file back to its last complete batch."""
        self._pending, self._pending_bytes = [], 0
        self._position = self.committed
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, self.committed)
                os.lseek(self.fd, self.committed, os.SEEK_SET)
            except OSError as exc:    # the fault's own message says what matters
                log.debug("cannot truncate an output after a failed write: %s", exc)

    def _drain(self) -> None:
        data = b"".join(self._pending)
        self._pending, self._pending_bytes = [], 0
        if self.fd is None:
            sys.stdout.buffer.write(data)
            return
        view = memoryview(data)
        while view:                   # os.write may write part of it (then the rest fails)
            view = view[os.write(self.fd, view):]


class QueryOutput(Sink):
    """One query's output (a `highlevel.sinks.Sink`): rows appended as micro-batches close.

    `buffered`: keep the rows and write them all at `close()` (an aligned table fitted to
    every row; several queries sharing stdout one after the other); otherwise each batch is
    written as it arrives. `title`: a line written before the rows when several queries
    share stdout. `keep`: the rows written stay in memory too (`table()`); a buffered
    output always keeps them. `window`: the name of the query's window column, by which a
    failed output says which windows it holds. `writer`: the format writer
    (`tools.results.formats`; default: a fresh one of `fmt`).

    Disk faults: `open()` (the runner calls it before any packet is read) creates the file,
    or checks that an existing one can be written, and that its file system has room. A
    write that fails later (a full disk) leaves the file with whole batches only, keeps the
    error in `fault` (`fault_message()` says what the file holds), calls `on_fault` (the
    runner stops the sources) and writes nothing more; it does not raise into the Spark
    stage, whose failure would only print Spark's and py4j's tracebacks. The runner then
    reports the fault as one line."""

    def __init__(self, query: str, outputs, fmt: str, out: str, schema, *,
                 buffered: bool = False, title: str | None = None, keep: bool = True,
                 window: str | None = None, resume_log: Path | None = None,
                 parts: PartFiles | None = None, writer: FormatWriter | None = None):
        self.query, self.outputs, self.format, self.out = query, outputs, fmt, out
        self.schema = schema
        self.buffered = buffered
        self.keep = keep or buffered
        self.title = title
        self.window = window if window in {o.name for o in outputs} else None
        self.rows = 0
        self.batches = 0
        self.held = 0                  # rows in the file (committed), by `written()`
        self.fault: OSError | None = None
        self.on_fault: Callable[[], None] | None = None
        self._windows: tuple[Any, Any] | None = None   # (first, last) window written
        self._tables: list = []        # pyarrow Tables (imported when a batch comes)
        self._file: _BatchFile | None = None
        self._created = False          # `open` made the file (removed if no row reaches it)
        #: the bytes of each batch in the output's format (`tools.results.formats`)
        self.writer = writer if writer is not None else make_writer(fmt)
        self._started = False
        self._closed = False
        self._lock = threading.Lock()   # stages of several queries share stdout
        # a resumable run (`tools.pipeline.resume`): after each batch, its id and the file's size
        # go to this file, so a run resumed after a crash cuts the file back to its last
        # whole batch and skips the batches it holds when Spark's checkpoint replays them
        self.resume_log = resume_log
        self.done_batch = -1           # the last batch id the file holds (resumed run)
        self.resumed_rows = 0          # rows the file held from the run before
        # or (a Parquet output, or one written whole at the end, of a resumable run) each
        # batch's rows go to a part file of its own, and the output is written from the
        # parts at `close`: a file that has no footer yet, or nothing at all, until the end
        # cannot be cut back to its last batch
        self.parts = parts
        if resume_log is not None and self.writer.footer:
            raise RunConfigError(f"the output {out}: a {fmt} file cannot be cut back to a "
                                 f"batch (no footer until closed); resume it from part files")

    # --- the Sink protocol -------------------------------------------------------------------
    def write(self, batch_id: int, table) -> bool:
        table = display_table(table, self.outputs)
        with self._lock:
            if self.fault is not None:
                return True            # the run is stopping; the fault is reported then
            if batch_id <= self.done_batch:
                return False           # written before the crash (a replayed batch)
            if self.parts is not None:
                return self._write_part(batch_id, table)
            if not self.buffered and (table.num_rows or self.format != "table"):
                if self._emit(table):
                    self.batches += 1
                    self._log_batch(batch_id)
                return True
            if self.keep:
                self._tables.append(table)
            self.rows += table.num_rows
            self.batches += 1
        return True

    def open(self) -> None:
        """Create the output file, or check that the existing one can be written (it is
        truncated when the first rows come: a run that fails before leaves it as it was),
        and that its file system has a free block. Raises `RunError` naming the path and
        the OS error."""
        with self._lock:
            if self.parts is not None:
                self._resume_parts()
            if self._file is None and self.out != "-":
                self._open_file()
                self._resume()
                try:
                    space = os.fstatvfs(self._fd())
                except OSError:
                    return            # no statistics (some FUSE file systems): writes tell
                if space.f_bavail == 0 and space.f_blocks:
                    self._discard()
                    self._file = None
                    raise RunError(f"cannot write the output {self.out}: "
                                   f"{os_error_text(OSError(errno.ENOSPC, ''))}")

    def _resume(self) -> None:
        """A resumed run: the file back to its last whole batch before the crash (a batch
        cut short, or written and not yet logged, is written again from the checkpoint's
        replay), then appended to. No log: the file starts afresh."""
        if self.resume_log is None:
            return
        try:
            done = json.loads(self.resume_log.read_text())
            batch, size, rows = int(done["batch"]), int(done["bytes"]), int(done["rows"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RunConfigError(f"cannot resume the output {self.out}: its log "
                                 f"{self.resume_log} is unreadable ({exc})") from None
        fh = self._file
        assert fh is not None and fh.fd is not None
        try:
            have = os.fstat(fh.fd).st_size
            if have < size:
                raise RunConfigError(f"cannot resume the output {self.out}: it holds "
                                     f"{have:,} bytes, fewer than the {size:,} the run "
                                     f"before wrote; was it changed?")
            os.ftruncate(fh.fd, size)
            os.lseek(fh.fd, size, os.SEEK_SET)
        except OSError as exc:
            raise RunError(f"cannot write the output {self.out}: {os_error_text(exc)}") \
                from None
        fh.committed = fh._position = size
        self.done_batch, self.resumed_rows = batch, rows
        self._started = size > 0        # no header again, no truncation at the first rows
        if self._started:
            self.writer.resumed()

    def _resume_parts(self) -> None:
        """A resumed run of an output written from part files: an output written whole at
        the end takes the batches of the run before back (they were never written)."""
        assert self.parts is not None
        if not self.buffered:
            return
        for _, table in self._read_parts():
            self._tables.append(table)
            self.resumed_rows += table.num_rows

    def _write_part(self, batch_id: int, table) -> bool:
        """A batch of an output written from part files (under the lock)."""
        assert self.parts is not None
        if self.parts.holds(batch_id):
            return False               # written before the crash (a replayed batch)
        if table.num_rows:             # an empty batch leaves nothing to write at the end
            try:
                self.parts.write(batch_id, table)
            except OSError as exc:
                self._failed(exc)
                return True
        self.batches += 1
        self.rows += table.num_rows
        if self.keep:
            self._tables.append(table)
        return True

    def _read_parts(self):
        """Every part's rows in batch order; a part that cannot be read is a `RunError`
        saying which (the checkpoint was changed or damaged)."""
        assert self.parts is not None
        batch = None
        try:
            for batch, table in self.parts.tables():
                yield batch, table
        except (OSError, ValueError) as exc:    # pyarrow's ArrowInvalid is a ValueError
            where = self.parts.dir if batch is None else self.parts.path(batch)
            raise RunError(f"cannot write the output {self.out}: its rows before the end, "
                           f"kept in {where}, cannot be read ({exc})") from None

    def _emit_parts(self) -> None:
        """A Parquet output written from its part files, a row group per part."""
        written = False
        for _, table in self._read_parts():
            if not self._emit(table, count=False):
                return                 # the fault is kept
            written = True
        if not written:
            self._emit(self.display_schema().empty_table(), count=False)

    def _log_batch(self, batch_id: int) -> None:
        if self.resume_log is None or self._file is None:
            return
        # written after the batch's bytes: a crash in between leaves the batch unlogged, and
        # the resumed run cuts it off and writes it again
        tmp = self.resume_log.with_name(f".{self.resume_log.name}.tmp")
        try:
            tmp.write_text(json.dumps({"batch": batch_id, "bytes": self._file.committed,
                                       "rows": self.resumed_rows + self.held}))
            os.replace(tmp, self.resume_log)
        except OSError as exc:
            self._failed(exc)

    def close(self, complete: bool = True) -> None:
        """Finish the output. `complete` False (the run failed): an output no row reached
        writes nothing at all (no header, no empty file); rows already there are kept.
        A fault at the last write (a buffered output's rows, a Parquet footer) is kept in
        `fault` and raised as a `RunError`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            read_error = None
            if self.fault is None:
                if self.buffered:
                    if complete or self.rows or self.resumed_rows:
                        self._emit(self.table(), count=False)
                elif self.parts is not None:
                    if complete:       # else the parts wait for the resumed run
                        try:
                            self._emit_parts()
                        except RunError as exc:
                            read_error = exc
                elif not self._started and complete:
                    self._emit(self.display_schema().empty_table())   # header / empty file
            if self.fault is None and self.writer.unfinished:
                try:
                    assert self._file is not None      # the writer writes to it
                    self.writer.finish(self._file)
                    self._file.commit()
                except OSError as exc:
                    self._failed(exc)
            if self.fault is not None or read_error is not None or (
                    not complete and self._file is not None and not self._file.committed):
                self._discard()
            elif self._file is not None and self._file.fd is not None:
                os.close(self._file.fd)
            if self.fault is not None:
                raise RunError(self.fault_message())
            if read_error is not None:
                raise read_error

    def fault_message(self) -> str:
        """One line: the path, the OS error, and what the output holds."""
        assert self.fault is not None
        head = f"cannot write the output {self.out}: {os_error_text(self.fault)}"
        if self.out == "-":
            return f"{head}; {self.held:,} rows were written before it"
        if self.writer.footer:
            return f"{head}; the Parquet file is removed (unreadable without its footer)"
        if not self.held:
            return f"{head}; no row was written"
        return f"{head}; it holds {self.written()}, no later window"

    def written(self) -> str:
        """What the output holds so far: "the windows tb 60 to 600 (1,234 rows)"."""
        rows = f"{self.held:,} row{'s' if self.held != 1 else ''}"
        if self._windows is None:
            return rows
        first, last = self._windows
        if first == last:
            return f"the window {self.window} {first} ({rows})"
        return f"the windows {self.window} {first} to {last} ({rows})"

    # --- rows ----------------------------------------------------------------------------------
    def display_schema(self):
        return display_schema(self.schema, self.outputs)

    def table(self):
        """Every row written so far, in the order written (a kept output)."""
        import pyarrow as pa

        if not self._tables:
            return self.display_schema().empty_table()
        return pa.concat_tables(self._tables, promote_options="permissive")

    def _note_windows(self, table) -> None:
        if self.window is None or not table.num_rows:
            return
        import pyarrow.compute as pc

        bounds = pc.min_max(table.column(self.window)).as_py()
        if bounds["min"] is None:
            return
        if self._windows is None:
            self._windows = (bounds["min"], bounds["max"])
        else:
            self._windows = (min(self._windows[0], bounds["min"]),
                             max(self._windows[1], bounds["max"]))

    def _open_file(self) -> None:
        # no O_TRUNC: an existing file stays as it was until rows come (see `open`)
        try:
            fd = os.open(self.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            self._created = True
        except FileExistsError:
            try:
                fd = os.open(self.out, os.O_WRONLY)
            except OSError as exc:
                raise RunError(f"cannot write the output {self.out}: "
                               f"{os_error_text(exc)}") from None
        except OSError as exc:
            raise RunError(f"cannot write the output {self.out}: {os_error_text(exc)}") \
                from None
        self._file = _BatchFile(fd)

    def _fd(self) -> int:
        assert self._file is not None and self._file.fd is not None
        return self._file.fd

    def _discard(self) -> None:
        """Remove the file when no complete batch of this run is in it (or it is a Parquet
        file without its footer), else close it (it ends with its last complete batch)."""
        f = self._file
        if f is None or f.fd is None:
            return
        os.close(f.fd)
        if (self._started or self._created) and (not f.committed or self.writer.footer):
            try:
                os.unlink(self.out)
            except OSError as exc:
                log.debug("cannot remove the output %s: %s", self.out, exc)

    def _failed(self, exc: OSError) -> None:
        self.fault = exc
        if self._file is not None:
            self._file.rollback()
        if self.on_fault is not None:
            self.on_fault()

    def _parts(self, table):
        """The batch in parts of whole windows, each at least `PART_ROWS` rows (but the
        last): CSV and JSON lines commit each part, so after a fault (a full disk) the file
        ends with a complete window, also when one batch holds every window (a replay at
        full speed). Rows come in window order; when they do not, the batch is one part."""
        import numpy as np

        n = table.num_rows
        if self.window is None or not self.writer.splits or n <= self.PART_ROWS:
            return [table]
        col = table.column(self.window)
        if col.null_count:
            return [table]
        w = np.asarray(col.combine_chunks())
        if not np.all(w[1:] >= w[:-1]):
            return [table]
        starts = np.flatnonzero(w[1:] != w[:-1]) + 1      # the first row of each window
        parts, begin = [], 0
        for start in starts:
            if start - begin >= self.PART_ROWS:
                parts.append(table.slice(begin, start - begin))
                begin = int(start)
        parts.append(table.slice(begin))
        return parts

    #: the fewest rows a committed part of a batch holds (`_parts`): a write call each
    PART_ROWS = 4096

    def _emit(self, table, count: bool = True) -> bool:
        """Write one batch (with the title and header before the first), part after part
        of whole windows (`_parts`); `count`: its rows count as written (not a buffered
        output's, counted when they came). False when a write failed (the fault is kept;
        the file holds whole parts only, and `rows` counts what it holds)."""
        if self._file is None:
            if self.out == "-":
                self._file = _BatchFile(None)
            else:
                self._open_file()
        fh = self._file
        assert fh is not None
        first = not self._started
        try:
            if first and fh.fd is not None:
                os.ftruncate(fh.fd, 0)      # the run's rows replace an earlier file's
            self._started = True
            if first and self.title:
                fh.write(f"{self.writer.title_prefix}query {self.query}:\n".encode())
            if first:
                self.writer.start(fh, table)
            self.writer.batch(table)
            for part in self._parts(table):
                self.writer.rows(fh, part)
                self._commit(part, count)
        except OSError as exc:
            self._failed(exc)
            return False
        return True

    def _commit(self, part, count: bool) -> None:
        """The part's bytes written and flushed: now its rows count."""
        assert self._file is not None
        self._file.commit()
        self.held += part.num_rows
        self._note_windows(part)
        if count:
            self.rows += part.num_rows
            if self.keep:
                self._tables.append(part)
