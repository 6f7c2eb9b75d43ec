"""The spool files of a micro-batch and their markers, read on the driver (no Spark job).

A stage needs, per micro-batch, each spool file's link, sequence number, punctuation and row
count, and whether any of its rows is late. A Spark job over the batch finds them (a scan and
an aggregation: slow on a fresh JVM, and in proportion to the rows after). The same facts
are on disk already: Structured Streaming's file source logs which files each batch reads
before the batch runs (`<checkpoint>/offsets/<batch>`: the source's log offset;
`<checkpoint>/sources/0/<offset>` or a `.compact` file: one JSON line per file, `"v1"`
first), and `SpoolWriter` puts each file's markers in its Parquet footer
(`oopscope.punct`, `oopscope.rows`, `oopscope.min_window`, and `oopscope.final_rows`
when the low level marks final rows). `batch_markers` reads both; any
doubt (a log it cannot read, a file without the keys) gives None and the caller runs the
Spark job as before. Either way a batch's files are `SpoolFileMarker` records.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from common.spool import FINAL_ROWS_KEY, JOINT_MARKERS, LINK, SEQ, parse_spool_name

log = logging.getLogger(__name__)

#: footer keys SpoolWriter writes (values: decimal text; "" for None)
PUNCT_KEY, ROWS_KEY, MIN_WINDOW_KEY = b"oopscope.punct", b"oopscope.rows", b"oopscope.min_window"


@dataclass(frozen=True)
class SpoolFileMarker:
    """What a micro-batch needs to know of one of its spool files: the link and sequence
    number (Meld applies the punctuation in sequence order), the punctuation the file
    carries, its data rows, and how many of them are late or kept against the punctuation
    the stage closed through. From the file's footer (`path` set, no row late) or from the
    Spark job over the batch (a stage kind's job may count more: `joint`, `max_pane`)."""

    link: str
    seq: int
    punctuation: int | None
    rows: int = 0
    late: int = 0
    kept: int = 0
    path: Path | None = None               # the file (markers read from its footer)
    min_window: int | None = None          # the file's earliest pane (from its footer)
    joint: tuple = ()                      # the `JOINT_MARKERS` values (highlevel.joint)
    max_pane: int | None = None            # the latest pane of a kept row (landmark windows)
    final: int | None = None               # rows the low level marked final (footer; None:
                                           # the file does not say)

    @classmethod
    def from_row(cls, row) -> SpoolFileMarker:
        """The markers of one file as the Spark job over a batch gives them: a row grouped by
        (LINK, SEQ) with the punctuation as `p` and whichever counts the job took."""
        d = row.asDict()

        def count(name: str) -> int:
            return int(d.get(name) or 0)

        return cls(d[LINK], int(d[SEQ]), d["p"], count("rows"), count("late"), count("kept"),
                   joint=tuple(d[c] for c in JOINT_MARKERS if c in d),
                   max_pane=d.get("max_pane"))


def _log_offset(path: Path) -> int | None:
    """The file source's log offset in an offsets log file (its last line)."""
    try:
        lines = path.read_text().splitlines()
        return int(json.loads(lines[-1])["logOffset"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def _entries(sources: Path, n: int) -> list[str] | None:
    """The paths the source log lists for its batch `n`."""
    for name in (str(n), f"{n}.compact"):
        try:
            lines = (sources / name).read_text().splitlines()
        except OSError:
            continue
        if not lines or lines[0] != "v1":
            return None
        try:
            entries = [json.loads(line) for line in lines[1:] if line.strip()]
            return [e["path"] for e in entries if int(e["batchId"]) == n]
        except (ValueError, KeyError, TypeError):
            return None
    return None


def batch_files(stream: Path, batch_id: int) -> list[Path] | None:
    """The files micro-batch `batch_id` of the stream checkpointed in `stream` reads."""
    cur = _log_offset(stream / "offsets" / str(batch_id))
    prev = -1 if batch_id == 0 else _log_offset(stream / "offsets" / str(batch_id - 1))
    if cur is None or prev is None:
        return None
    paths: list[Path] = []
    for n in range(prev + 1, cur + 1):
        listed = _entries(stream / "sources" / "0", n)
        if listed is None:
            return None
        for url in listed:
            parsed = urlparse(url)
            if parsed.scheme not in ("", "file"):
                return None
            paths.append(Path(unquote(parsed.path)))
    return paths


def file_markers(path: Path) -> SpoolFileMarker | None:
    """The markers of a spool file from its footer (no row late, none kept yet), or None."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as exc:
        log.debug("spool footer of %s unreadable: %s", path, exc)
        return None
    if PUNCT_KEY not in meta or ROWS_KEY not in meta or MIN_WINDOW_KEY not in meta:
        return None
    named = parse_spool_name(path.name)
    if named is None:
        return None

    def num(key):
        text = meta[key].decode()
        return int(text) if text else None

    try:
        rows = num(ROWS_KEY)
        if rows is None:
            return None
        return SpoolFileMarker(named[0], named[1], num(PUNCT_KEY), rows, path=path,
                               min_window=num(MIN_WINDOW_KEY),
                               final=num(FINAL_ROWS_KEY) if FINAL_ROWS_KEY in meta else None)
    except ValueError:
        return None


def batch_markers(stream: Path, batch_id: int, earliest_end,
                  before: int | None) -> list[SpoolFileMarker] | None:
    """The markers of every file of the batch, as the stage's markers job gives them, when
    no row can be late (`earliest_end(min_window)`, the end of the first window a file's
    earliest pane counts in, after `before`); else None."""
    paths = batch_files(stream, batch_id)
    return None if paths is None else files_markers(paths, earliest_end, before)


def files_markers(paths: list[Path], earliest_end,
                  before: int | None) -> list[SpoolFileMarker] | None:
    """`batch_markers` of these spool files."""
    out = []
    for path in paths:
        m = file_markers(path)
        if m is None:
            return None
        if m.rows and before is not None and (m.min_window is None
                                              or earliest_end(m.min_window) <= before):
            return None          # late rows possible: the Spark job counts them
        out.append(replace(m, kept=m.rows))
    return out


def drop_unfinished_logs(stream: Path) -> int:
    """Remove the temporary files a killed query left in its checkpoint's logs (`offsets`,
    `commits`, `sources/*`), and return how many. Spark writes each log file as a hidden
    `.<batch>.<uuid>.tmp` renamed into place; one a kill -9 interrupted stays, and Spark 4
    then refuses to start the query from a checkpoint with no batch logged but a file in
    `offsets` (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Call with no query of the
    checkpoint running (the run holds its state directory's lock)."""
    dropped = 0
    logs = [stream / "offsets", stream / "commits",
            *((stream / "sources").glob("*") if (stream / "sources").is_dir() else ())]
    for directory in logs:
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            if path.name.startswith(".") and ".tmp" in path.name and path.is_file():
                path.unlink(missing_ok=True)
                dropped += 1
    if dropped:
        log.info("checkpoint %s: %d unfinished log files of a stopped run removed", stream,
                 dropped)
    return dropped
