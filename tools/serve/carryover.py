"""What a query carries across the server's restarts: the rows in its output files, its low
level's counters, and its last rows once it no longer runs.

A query's counters count from its submission, whatever happened since (a crash, a clean
stop and restart). Two sources, each the truth of its kind:

- the rows it wrote are the rows in its output files: a start counts those of its
  generations, and the rows written from then on are added. After a crash the batch the
  checkpoint replays finds its file and is not written again, so no row is counted twice
  and none is missed. Part files are never changed once written, so the record keeps a
  *mark* per stream (the rows up to a batch) and a start reads only the files after it:
  months of output are not read again at each restart;
- the low level's and the stages' counters live in memory: `Tally` keeps their totals in
  the query's record before each micro-batch's rows reach their file, and at the end of
  the others at most every `SAVE_EVERY_S` (`KeepCounters`); a restart adds the new
  process's counts to them. So the partial rows behind every row in the files are counted
  (a partial row is counted at the low level before the stage reads it); after a crash the
  counts of the last moments before it are lost with the packets of the gap.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import time
from pathlib import Path

from highlevel.sinks import Sink

log = logging.getLogger(__name__)

#: the counters of a running query that its record carries across restarts
CARRIED = ("partial_rows", "evictions", "flushes", "late_packets", "before_start_packets",
           "suppressed_rows", "zero_divisor_packets", "zero_divisor_rows")
#: those of them kept in the stages' checkpoint: a crash keeps the generation and restores
#: them with it (they must not be added twice); a new generation starts them at zero
CHECKPOINTED = ("zero_divisor_rows",)
#: seconds between two saves of the counters (a save per micro-batch at most)
SAVE_EVERY_S = 0.5

_PART = re.compile(r"^part-g(\d+)-(\d+)\.(csv|jsonl|parquet)$")


class Tally:
    """The carried counters of one running query: the totals its record held at the start,
    to which this process's counts are added; and per stream a *mark*, (generation, batch,
    rows): the rows of its part files up to that batch, so that a start reads only the files
    written after it."""

    def __init__(self, record):
        saved = record.counted or {}
        totals = saved.get("totals", {})
        same_generation = saved.get("generation") == record.generation
        kept = saved.get("checkpointed", {}) if same_generation else {}
        self.base = {k: int(totals.get(k, 0)) - int(kept.get(k, 0)) for k in CARRIED}
        self._generation = record.generation
        self._marks = {s: (int(m[0]), int(m[1]), int(m[2]))
                       for s, m in saved.get("rows", {}).items()}
        #: stream -> (generation, batch) of the newest part file found at the start
        self._found: dict[str, tuple[int, int]] = {}

    def totals(self, live: dict) -> dict:
        """The counters since the submission, from this process's `live` ones."""
        return {k: self.base[k] + int(live.get(k) or 0) for k in CARRIED}

    def rows_at_start(self, stream: str, directory: str | Path, fmt: str,
                      first_generation: int) -> int:
        """The rows stream `stream` wrote before this process: its mark's, and those of
        its part files after the mark."""
        mark = self._marks.get(stream)
        files = _part_keys(directory, fmt, first_generation)
        if files:
            self._found[stream] = files[-1][:2]
        after = (mark[0], mark[1]) if mark is not None else (-1, -1)
        return (mark[2] if mark is not None else 0) + sum(
            _rows_in(p, fmt) for g, b, p in files if (g, b) > after)

    def batch_ended(self, stream: str, batch_id: int, rows: int) -> None:
        """Batch `batch_id` of the stream is written, `rows` in all: its mark, once the
        batches the checkpoint replays have passed the files found at the start (those
        after the batch are counted in `rows` too)."""
        key = (self._generation, batch_id)
        found = self._found.get(stream)
        if found is None or key >= found:
            self._marks[stream] = (*key, rows)

    def keep(self, record, live: dict) -> None:
        """Into `record.counted` (saved with it): the totals, what of them the generation's
        checkpoint holds, and the streams' marks."""
        record.counted = {"generation": record.generation, "totals": self.totals(live),
                          "checkpointed": {k: int(live.get(k) or 0) for k in CHECKPOINTED},
                          "rows": {s: list(m) for s, m in dict(self._marks).items()}}


class KeepCounters(Sink):
    """A sink ahead of a stream's output: its query's counters saved in its record by
    `save()` before a micro-batch's rows are written (the output comes after it in the
    stage's sinks), so a crash between the two never leaves rows in the files whose partial
    rows were not counted; at the end of each micro-batch (before the stage commits it)
    `on_batch(batch_id)`, and a save at most every `SAVE_EVERY_S`."""

    def __init__(self, on_batch, save):
        self._on_batch, self._save = on_batch, save
        self._last = 0.0

    def write(self, batch_id: int, table) -> bool:
        if table.num_rows:
            self._save_now()
        return True

    def end_batch(self, batch_id: int, punctuation) -> None:
        self._on_batch(batch_id)
        if time.monotonic() - self._last >= SAVE_EVERY_S:
            self._save_now()

    def _save_now(self) -> None:
        self._last = time.monotonic()
        try:
            self._save()
        except OSError as exc:     # the next batch tries again; the rows are written
            log.warning("cannot save a query's counters: %s", exc.strerror or exc)


def _part_keys(directory: str | Path, fmt: str,
               first_generation: int) -> list[tuple[int, int, Path]]:
    """(generation, batch, path) of a stream's part files of generations `first_generation`
    on, oldest first."""
    d = Path(directory)
    try:
        names = [n.name for n in d.iterdir()]
    except OSError:
        return []
    found = []
    for name in names:
        m = _PART.match(name)
        if m and m.group(3) == fmt and int(m.group(1)) >= first_generation:
            found.append((int(m.group(1)), int(m.group(2)), d / name))
    return sorted(found)


def part_files(directory: str | Path, fmt: str, first_generation: int = 1) -> list[Path]:
    """A stream's part files of generations `first_generation` on, oldest first."""
    return [p for _, _, p in _part_keys(directory, fmt, first_generation)]


def output_rows(directory: str | Path, fmt: str, first_generation: int = 1) -> int:
    """The rows in a stream's part files of generations `first_generation` on."""
    return sum(_rows_in(p, fmt) for p in part_files(directory, fmt, first_generation))


def _rows_in(path: Path, fmt: str) -> int:
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(path).metadata.num_rows
        data = path.read_bytes()
    except OSError as exc:
        log.warning("%s: cannot count its rows: %s", path, exc.strerror or exc)
        return 0
    except Exception as exc:  # noqa: BLE001 - a damaged Parquet part: said, not fatal
        log.warning("%s: cannot count its rows: %s", path, exc)
        return 0
    if fmt == "jsonl":
        return sum(1 for line in data.splitlines() if line.strip())
    if b'"' not in data:        # no quoted field, so no line break inside one
        return max(0, data.count(b"\n") - 1)
    return max(0, sum(1 for _ in csv.reader(io.StringIO(data.decode("utf-8", "replace"),
                                                        newline=""))) - 1)


def last_rows(directory: str | Path, fmt: str, first_generation: int,
              limit: int) -> tuple[list[str], list[list]]:
    """The columns and the last `limit` rows of a stream's part files (oldest first)."""
    columns: list[str] = []
    rows: list[list] = []
    for path in reversed(part_files(directory, fmt, first_generation)):
        try:
            cols, got = _read(path, fmt)
        except Exception as exc:  # noqa: BLE001 - the rows before it are still shown
            log.warning("%s: cannot read it back: %s", path, exc)
            continue
        columns = columns or cols
        rows = got[-(limit - len(rows)):] + rows
        if len(rows) >= limit:
            break
    return columns, rows


def _read(path: Path, fmt: str) -> tuple[list[str], list[list]]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return table.column_names, [list(r.values()) for r in table.to_pylist()]
    text = path.read_bytes().decode("utf-8", "replace")
    if fmt == "jsonl":
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        cols = list(records[0]) if records else []
        return cols, [[r.get(c) for c in cols] for r in records]
    lines = list(csv.reader(io.StringIO(text, newline="")))
    return (lines[0], lines[1:]) if lines else ([], [])
