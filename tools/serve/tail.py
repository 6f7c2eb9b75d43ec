"""A stream's rows on their way out of the appliance: the output files, the tails and the page.

`StreamOutput` is the `highlevel.sinks.Sink` of one chosen query of a submission. Per
micro-batch it writes the closed windows' rows to one output file (`part-gNNNN-<batch>.<ext>`
in the stream's output directory, `tools.results.parts`: written under a temporary name and
renamed, so a reader never sees half a window, and a batch replayed after a crash finds its
file and is not written twice; the bytes `run` writes for the same rows), then, once the
batch is complete, hands the rows to the `Hub`, which passes them to every tail and page
that subscribed, and remembers the latest rows for a page that opens later. When a stream's
output is built (a submission, or a restart resuming it) the hub's latest rows are read from
the part files already in its output directory (`StreamOutput.recall`), so that the page's
history after a crash holds the windows written before it.

A subscriber's buffer is bounded: a slow tail never slows the query. When it falls behind by
more than `TAIL_ROWS` rows or `TAIL_BYTES` bytes (of the events as JSON), its oldest rows
are dropped and it is told how many it missed. Every subscriber is handed its own copy of
an event (the rows themselves are shared, and read only): a page that reshapes its event
for the browser cannot break another page's or a tail's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from pathlib import Path

from highlevel.sinks import Sink
from tools.serve.carryover import part_files

log = logging.getLogger(__name__)

#: rows a subscriber may have waiting before its oldest are dropped
TAIL_ROWS = 10_000
#: bytes (of its events as JSON) a subscriber may have waiting before its oldest are dropped
TAIL_BYTES = 4 << 20
#: rows remembered per stream for pages that open later
RECENT_ROWS = 2000
#: output latencies remembered per stream (quantiles in `queries`)
LATENCIES = 1000
#: bytes of part files read at most, newest first, for a stream's latest rows at its start
RECALL_BYTES = 64 << 20

class Subscriber:
    """One tail or page: a bounded queue of events, read by an asyncio task."""

    def __init__(self, loop: asyncio.AbstractEventLoop, streams: set[str] | None,
                 limit: int = TAIL_ROWS, max_bytes: int = TAIL_BYTES):
        self.loop, self.streams, self.limit, self.max_bytes = loop, streams, limit, max_bytes
        self.events: deque = deque()
        self.rows = 0
        self.bytes = 0
        self.missed = 0
        self.ended: set[str] = set()
        self.wakeup = asyncio.Event()
        self._lock = threading.Lock()

    def wants(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def put(self, event: dict, rows: int, size: int = 0, missed: int = 0) -> None:
        """Queue `event` (of `rows` rows, `size` bytes as JSON; `missed` rows of it left out
        by the sender); the oldest events make room."""
        with self._lock:
            self.missed += missed
            self.events.append((event, rows, size))
            self.rows += rows
            self.bytes += size
            while (self.rows > self.limit or self.bytes > self.max_bytes) \
                    and len(self.events) > 1:
                _, n, b = self.events.popleft()
                self.rows -= n
                self.bytes -= b
                self.missed += n
        try:
            self.loop.call_soon_threadsafe(self.wakeup.set)
        except RuntimeError:
            pass                  # its loop has closed (the server is stopping)

    def take(self) -> tuple[list[dict], int]:
        """The waiting events and the rows missed since the last take."""
        with self._lock:
            events = [e for e, _, _ in self.events]
            self.events.clear()
            self.rows = self.bytes = 0
            missed, self.missed = self.missed, 0
        self.wakeup.clear()
        return events, missed


class Hub:
    """Fans each stream's rows out to its subscribers; remembers the latest rows."""

    def __init__(self):
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()
        self.recent: dict[str, deque] = {}
        self.columns: dict[str, list[str]] = {}

    def subscribe(self, sub: Subscriber) -> Subscriber:
        with self._lock:
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    def __contains__(self, sub: Subscriber) -> bool:
        with self._lock:
            return sub in self._subs

    def publish(self, kind: str, stream: str | None, data: dict, rows: int = 0,
                cut: int = 0) -> None:
        with self._lock:
            subs = [s for s in self._subs if stream is None or s.wants(stream)]
        if not subs:
            return
        size = len(json.dumps(data, default=str)) if rows else 0
        for s in subs:
            s.put({"event": kind, **data}, rows, size, missed=cut)

    def rows_wanted(self) -> int:
        """The most rows of one batch anyone reads: the page's memory of a stream and the
        subscribers' queues. The rest of a larger batch is in its file only (a 260K-row
        window made into Python lists cost the stage's thread 0.3 s, and its JSON the
        tail 1 s more, for rows no tail queue keeps)."""
        with self._lock:
            return max([RECENT_ROWS, *(s.limit for s in self._subs)])

    def rows(self, stream: str, columns: list[str], rows: list[list], batch: int,
             closed_ns: int | None = None, cut: int = 0) -> None:
        """A batch of closed windows' rows but its first `cut` (`rows_wanted`);
        `closed_ns`: when the punctuation that closed them reached the server (wall ns),
        if known."""
        keep = self.recent.setdefault(stream, deque(maxlen=RECENT_ROWS))
        keep.extend(rows)
        self.columns[stream] = columns
        self.publish("rows", stream, {"query": stream, "batch": batch, "columns": columns,
                                      "rows": rows, "time": time.time(),
                                      "closed_ns": closed_ns}, len(rows), cut)

    def recall(self, stream: str, rows: list[list]) -> None:
        """The latest rows written before this output started (its part files on disk):
        they replace what was remembered of the stream (the files hold all of that)."""
        self.recent[stream] = deque(rows, maxlen=RECENT_ROWS)

    def end(self, stream: str, why: str) -> None:
        self.publish("end", stream, {"query": stream, "why": why})


class StreamOutput(Sink):
    """One stream's sink (module docstring)."""

    def __init__(self, stream: str, outputs, schema, directory: Path, fmt: str, prefix: str,
                 hub: Hub, clock, links: list[str]):
        from tools.results.formats import display_schema, display_table
        from tools.results.parts import part_sink

        self.stream, self.outputs, self.schema = stream, outputs, schema
        self.file = part_sink(fmt, directory, prefix)
        self.hub, self.clock, self.links = hub, clock, links
        self._display = display_table
        self.rows = 0
        self.batches = 0
        self.last_write: float | None = None
        self.latencies: deque = deque(maxlen=LATENCIES)
        self.on_latency = lambda seconds: None      # the metrics' histogram
        self._written: dict = {}             # batch id -> its rows, until end_batch
        names = [f.name for f in schema]
        self.columns = names
        self.numeric = [f.name for f in schema if _numeric(f.type)
                        and f.name not in _ipv4_names(outputs)]
        #: how the window column's values map to time (`window_info`), for the page's axis
        self.window: dict | None = None
        self.format, self.display_schema = fmt, display_schema(schema, outputs)
        hub.columns[stream] = names

    def set_window(self, window) -> None:
        """The query's window (`queries.plan.WindowPlan`, None: none), told to the page."""
        self.window = window_info(window, self.columns)

    def recall(self, first_generation: int = 1) -> None:
        """The hub's latest rows of the stream from the part files its output directory
        holds already (of generations `first_generation` on), before any row is written."""
        self.hub.recall(self.stream, written_rows(self.file.dir, self.format,
                                                  self.display_schema, RECENT_ROWS,
                                                  first_generation))

    def write(self, batch_id: int, table) -> bool:
        table = self._display(table, self.outputs)
        written = self.file.write(batch_id, table)
        if not written:
            return False            # a batch replayed after a crash: written before
        if table.num_rows:
            self.rows += table.num_rows
            self.batches += 1
            self.last_write = time.time()
            self._written[batch_id] = table
        return True

    def end_batch(self, batch_id: int, punctuation) -> None:
        """The batch's rows are in their file: now the tails and the page get them, with the
        time the punctuation that closed their windows reached the server."""
        table = self._written.pop(batch_id, None)
        if table is None:
            return
        # the windows closed when every link's punctuation had passed their end; the
        # batch's output punctuation is the first that did, for a stage that keeps up
        at = self.clock(self.links, punctuation) if isinstance(punctuation, int) else None
        if at is not None:
            seconds = max(0.0, (time.time_ns() - at) / 1e9)
            self.latencies.append(seconds)
            self.on_latency(seconds)
        cut = max(0, table.num_rows - self.hub.rows_wanted())
        rows = [list(r.values()) for r in table.slice(cut).to_pylist()]
        self.hub.rows(self.stream, table.column_names, rows, batch_id, closed_ns=at, cut=cut)

    def quantile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        values = sorted(self.latencies)
        return values[min(len(values) - 1, int(q * len(values)))]

    def info(self) -> dict:
        return {"stream": self.stream, "rows": self.rows, "batches": self.batches,
                "columns": self.columns, "numeric": self.numeric,
                "output": str(self.file.dir), "last_write": self.last_write,
                "latency_p50_s": self.quantile(0.5), "latency_p99_s": self.quantile(0.99),
                "window": self.window}

    def close(self) -> None:
        self.hub.end(self.stream, "stopped")


def window_info(window, columns: list[str]) -> dict | None:
    """What the page needs to place a row on a time axis: the window column's value v is
    window `(v - shift) / scale`, which starts at `(id + 1) * slide_ns - offset_ns - range_ns`
    (`queries.plan.WindowPlan`: `tb` of `time/10 AS tb` is 10-s window number tb, starting
    at tb * 10 s). None when the rows have no window column (no window, or not output)."""
    if window is None or window.column not in columns or not window.slide_ns \
            or not window.scale:
        return None
    return {"column": window.column, "scale": window.scale, "shift": window.shift,
            "range_ns": window.range_ns, "slide_ns": window.slide_ns,
            "offset_ns": window.offset_ns, "landmark": window.landmark}




def written_rows(directory: Path, fmt: str, schema, limit: int,
                 first_generation: int = 1) -> list[list]:
    """The last `limit` rows of the part files of format `fmt` in an output directory (of
    generations `first_generation` on, in the order they were written), as the hub hands
    rows out: a part
    whose columns are not `schema`'s (an earlier query of the name) ends the search, and
    so does one that cannot be read, or `RECALL_BYTES` read."""
    found: list[list[list]] = []
    count = size = 0
    for path in reversed(part_files(directory, fmt, first_generation)):
        try:
            size += path.stat().st_size
            if size > RECALL_BYTES:
                break
            table = _read_part(path, fmt, schema)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors have no common base
            log.info("%s: not read for the latest rows (%s)", path, type(exc).__name__)
            break
        if table.column_names != schema.names:
            break
        rows = [list(r.values()) for r in table.to_pylist()]
        found.append(rows[-(limit - count):])
        count += len(found[-1])
        if count >= limit:
            break
    return [r for rows in reversed(found) for r in rows]


def _read_part(path: Path, fmt: str, schema):
    import pyarrow as pa

    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path)
    if fmt == "jsonl":
        with open(path, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        if records and list(records[0]) != schema.names:
            return pa.table({k: [] for k in records[0]})    # another query's columns
        return pa.Table.from_pylist(records, schema=schema)
    import pyarrow.csv as pacsv

    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=schema))


def _numeric(t) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _ipv4_names(outputs) -> set[str]:
    return {o.name for o in outputs if o.type.lower() == "ipv4"}
