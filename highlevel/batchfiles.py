"""The spool files of a micro-batch and their markers, read on the driver (no Spark job).

A stage needs, per micro-batch, each spool file's link, sequence number, punctuation and row
count, and whether any of its rows is late. A Spark job over the batch finds them (a scan and
an aggregation: seconds on a fresh JVM, a second per million rows after). The same facts
are on disk already: Structured Streaming's file source logs which files each batch reads
before the batch runs (`<checkpoint>/offsets/<batch>`: the source's log offset;
`<checkpoint>/sources/0/<offset>` or a `.compact` file: one JSON line per file, `"v1"`
first), and `SpoolWriter` puts each file's markers in its Parquet footer
(`oopscope.punct`, `oopscope.rows`, `oopscope.min_window`). `batch_markers` reads both; any
doubt (a log it cannot read, a file without the keys) gives None and the caller runs the
Spark job as before.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from common.spool import LINK, SEQ, parse_spool_name

log = logging.getLogger(__name__)

#: footer keys SpoolWriter writes (values: decimal text; "" for None)
PUNCT_KEY, ROWS_KEY, MIN_WINDOW_KEY = b"oopscope.punct", b"oopscope.rows", b"oopscope.min_window"


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


def file_markers(path: Path) -> dict | None:
    """{LINK, SEQ, "p", "rows", "min_window"} of a spool file from its footer, or None."""
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
        return {LINK: named[0], SEQ: named[1], "p": num(PUNCT_KEY), "rows": num(ROWS_KEY),
                "min_window": num(MIN_WINDOW_KEY)}
    except ValueError:
        return None


def batch_markers(stream: Path, batch_id: int, earliest_end, before: int | None):
    """Per file of the batch: {LINK, SEQ, "p", "rows", "late", "kept"}, as the stage's
    markers job gives them, and the file's "path", when no row can be late
    (`earliest_end(min_window)`, the end of the first window a file's earliest pane counts
    in, after `before`); else None."""
    paths = batch_files(stream, batch_id)
    return None if paths is None else files_markers(paths, earliest_end, before)


def files_markers(paths: list[Path], earliest_end, before: int | None):
    """`batch_markers` of these spool files."""
    out = []
    for path in paths:
        m = file_markers(path)
        if m is None or m["rows"] is None:
            return None
        if m["rows"] and before is not None and (m["min_window"] is None
                                                 or earliest_end(m["min_window"]) <= before):
            return None          # late rows possible: the Spark job counts them
        out.append({LINK: m[LINK], SEQ: m[SEQ], "p": m["p"], "rows": m["rows"], "late": 0,
                    "kept": m["rows"], "path": path})
    return out
