"""The low level of one link inside a run: its operators, their spool writers and its timer.

`LinkFeeds` is what every packet source of `oopscope run` (a capture file replayed at full
speed or paced, a live interface) hands its batches and punctuation to. Per (query, link) an
`OperatorFeed` runs the `lowlevel.operator.LowLevelOperator` and buffers its partial rows,
writing them to the spool with the operator's punctuation whenever that punctuation advances
(or the buffer grows large), so the number of spool files follows windows, not packets.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from capture.punctuation import LinkTimer
from common.spool import END_OF_INPUT

if TYPE_CHECKING:
    from tools.pipeline.config import QuerySummary

log = logging.getLogger(__name__)

#: partial rows buffered per operator before a spool file is written without punctuation
SPOOL_FLUSH_ROWS = 1 << 20
#: the punctuation of a link whose input has ended: every window may close


class SpoolQueue:
    """Writes a run's spool files on a thread of its own, in the order they are put.

    Encoding a spool file (Parquet, Arrow C++: the GIL is released) is a real share of what
    the main thread of a large replay spends beside the low level; here it runs beside it,
    on a thread of its own. At most `depth` writes wait (then `put` blocks: the low level cannot run ahead of the
    disk without bound). A write that fails is raised by the next `put` or by `flush`, which
    waits until every file put so far is written; no later file is written (a stage applies
    a link's punctuation only once every earlier file of it is read)."""

    def __init__(self, depth: int = 4, before_write=None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        #: called on the queue's thread before a file with partial rows is written (the
        #: appliance saves its query's counters there: a crash then never leaves a spool
        #: file whose rows were not counted, for the restarted stage to read)
        self._before_write = before_write
        self._error: BaseException | None = None
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="oopscope-spool", daemon=True)
        self._thread.start()

    def put(self, writer, partials, punctuation: int | None) -> None:
        self._raise()
        self._queue.put((writer, partials, punctuation))

    def flush(self) -> None:
        self._queue.join()
        self._raise()

    def close(self) -> None:
        """Write what is queued, then end the thread (errors are left to `flush`)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if not self._failed:
                    writer, partials, punctuation = item
                    if self._before_write is not None and any(b.num_rows for b in partials):
                        self._before_write()
                    writer.write(partials, punctuation)
            except BaseException as exc:   # handed to the low level's thread by _raise
                self._failed, self._error = True, exc
            finally:
                self._queue.task_done()


class OperatorFeed:
    """One low-level operator of one link and its spool writer, with buffered partial rows.
    With a `SpoolQueue` set as `spool_queue`, the files are written on its thread."""

    def __init__(self, plan, spool_root, summary, compression: str = "snappy", *,
                 punctuation_flush: bool = False, complete_only: bool = False,
                 start_ns: int | None = None, allow_slots=None,
                 start_slots: int | None = None, on_resize=None):
        from common.spool import SpoolWriter
        from lowlevel.operator import HOLD_ROWS, LowLevelOperator

        self.op = LowLevelOperator(plan, hold_rows=HOLD_ROWS,
                                   punctuation_flush=punctuation_flush, allow_slots=allow_slots,
                                   start_slots=start_slots)
        # on_resize(query, link, slots): its adaptive table was re-sized (a resumable run
        # remembers the size, `tools.pipeline.tablesizes`)
        self.on_resize = on_resize
        self._slots = self.op.adaptive_slots
        if start_slots and self._slots is not None:
            log.info("query %s, link %s: table starts at %d slots (it had %d when the query "
                     "last ran)", plan.query, plan.link, self._slots, start_slots)
        # flow records are closed on the driver of this process (highlevel.flowrecords),
        # which takes their rows from memory
        flows = plan.flow is not None
        self.writer = SpoolWriter(spool_root, plan.query, plan.link, fsync=False,
                                  compression=compression, keep_in_memory=flows)
        self.summary = summary          # the query's summary: partial rows, spool files
        self.spool_queue: SpoolQueue | None = None
        self.buffer: list = []
        self.buffered = 0
        # a resumable spool (`tools.pipeline.resume`): a file holds only rows of panes its own
        # punctuation has closed, so after a crash the spool holds exactly the panes that end
        # by the link's last punctuation, and a resumed run replays the packets from there
        # without counting any twice. Rows of open panes (evictions) wait here meanwhile
        # (a flow never outlives its bucket, the pane: its record waits for the pane too)
        self.complete_only = complete_only
        # packets before this are not this operator's (a resumed run: they are in the spool
        # already; the appliance: before the query's first window), counted in before_start
        self.start_ns = start_ns
        self.before_start = 0
        #: the clock its records are windowed on, when its link stamps them on more than one
        #: (a served NETFLOW link: `first` or `last`, `tools.pipeline.flowlinks`)
        self.clock = plan.record.clock if plan.record is not None else None

    def _add(self, parts) -> None:
        for b in parts:
            if b.num_rows:
                self.buffer.append(b)
                self.buffered += b.num_rows

    def _write(self, punctuation: int | None) -> None:
        if self.complete_only and punctuation is not None and punctuation != END_OF_INPUT:
            self._write_complete(punctuation)
            return
        if not self.buffer and punctuation is None:
            return
        self._send(self.buffer, punctuation)
        self.buffer, self.buffered = [], 0

    def _send(self, rows: list, punctuation: int | None) -> None:
        """One spool file of `rows` and `punctuation`, on the queue's thread if there is one."""
        # counted before the file is handed on: a `SpoolQueue`'s `before_write` counts it
        self.summary.partial_rows += sum(b.num_rows for b in rows)
        self.summary.spool_files += 1
        if self.spool_queue is not None:
            self.spool_queue.put(self.writer, rows, punctuation)
        else:
            self.writer.write(rows, punctuation)

    def _write_complete(self, punctuation: int) -> None:
        """Write the buffered rows of panes ending by `punctuation` with it; keep the rest."""
        import numpy as np
        import pyarrow as pa

        window = self.op.plan.window
        done: list = []
        kept: list = []
        for b in self.buffer:
            ids = np.asarray(b.column("window").to_numpy(zero_copy_only=False), np.int64)
            if window is None:      # a selection: a row's `window` is its packet's time
                ends = ids + 1
            else:
                ends = (ids + 1) * window.pane_ns - window.offset_ns
            closed = ends <= punctuation
            if closed.all():
                done.append(b)
            elif not closed.any():
                kept.append(b)
            else:
                done.append(b.filter(pa.array(closed)))
                kept.append(b.filter(pa.array(~closed)))
        self._send(done, punctuation)
        self.buffer, self.buffered = kept, sum(b.num_rows for b in kept)

    def process(self, batch) -> None:
        if self.start_ns is not None:
            ts = batch["timestamp"]
            if int(ts.min()) < self.start_ns:
                keep = ts >= self.start_ns
                kept = int(keep.sum())
                self.before_start += len(ts) - kept
                if not kept:
                    return
                batch = batch.take(keep)
        self._add(self.op.process(batch))
        # a resumable spool writes rows only with the punctuation that closes their pane
        if self.buffered >= SPOOL_FLUSH_ROWS and not self.complete_only:
            self._write(None)

    def punctuate(self, p: int) -> None:
        rows, out = self.op.punctuate(p)
        self._add(rows)
        if out is not None:
            self._write(out)
        if self.on_resize is not None and self.op.adaptive_slots != self._slots:
            self._slots = self.op.adaptive_slots
            self.on_resize(self.op.plan.query, self.op.plan.link, self._slots)

    def finish(self) -> None:
        # the operator's final punctuation is the end of its last pane; the input is over,
        # though, so the link punctuates "nothing follows": a sliding window that reaches
        # past the last pane closes too (the reference evaluator outputs it)
        rows, _ = self.op.finish()
        self._add(rows)
        self._write(END_OF_INPUT)
        if self.spool_queue is not None:
            self.spool_queue.flush()     # the stages' last batch reads every file


class LinkFeeds:
    """Everything downstream of one link's packets: its operators and its punctuation timer."""

    def __init__(self, name: str, feeds: list[OperatorFeed], slack_ns: int):
        self.name = name
        self.feeds = feeds
        slides = [f.op.plan.window.slide_ns for f in feeds if f.op.plan.window is not None]
        self.timer = LinkTimer(min(slides) if slides else 0, slack_ns)
        self.packets = 0          # handed to the low level (the progress line reads it)
        self.bytes = 0
        self.finished = False
        #: wall ns when the low level was done with the latest records (a NETFLOW
        #: collector's summary says it: `bench.netflow_in` times the run by it)
        self.last_ns: int | None = None
        self._lock = threading.Lock()

    @property
    def record(self):
        """The record format (`capture.schema.RecordFormat`) this link's operators read, or
        None for a packet link; RunLinkError when its queries disagree (a link carries
        either packets or the records of one protocol)."""
        from tools.errors import RunLinkError

        formats = [(f.op.plan.query, f.op.plan.protocol, f.op.plan.record) for f in self.feeds]
        records = [x for x in formats if x[2] is not None]
        if not records:
            return None
        packets = [x for x in formats if x[2] is None]
        if packets:
            (rq, rp, _), (pq, pp, _) = records[0], packets[0]
            raise RunLinkError(f"link {self.name} is read as records of {rp} by query {rq} "
                               f"and as packets of {pp} by query {pq}: a link carries packets "
                               f"or records, not both")
        others = [x for x in records if x[1] != records[0][1]]
        if others:
            (q1, p1, _), (q2, p2, _) = records[0], others[0]
            raise RunLinkError(f"link {self.name} is read as records of {p1} by query {q1} "
                               f"and of {p2} by query {q2}: a link carries the records of one "
                               f"protocol")
        clocks = [x for x in records if x[2].clock != records[0][2].clock]
        if clocks:
            (q1, _, r1), (q2, _, r2) = records[0], clocks[0]
            raise RunLinkError(f"link {self.name} is windowed on {r1.clock} by query {q1} and "
                               f"on {r2.clock} by query {q2}: a link of {r1.protocol} is "
                               f"punctuated on one clock; give its source as a second link "
                               f"for the other")
        return records[0][2]

    @property
    def read_columns(self) -> tuple[str, ...] | None:
        """The packet columns this link's operators read (the reader decodes only those), or
        None (decode all) when one of them cannot tell."""
        names = {"timestamp", "len"}          # the timer and the byte counter above
        for f in self.feeds:
            cols = f.op.read_columns
            if cols is None:
                return None
            names.update(cols)
        return tuple(sorted(names))

    def warm(self, sample) -> None:
        """Load the kernels of this link's operators for batches like `sample` (a stream's
        made-up batch, before its first input: `LowLevelOperator.warm`)."""
        started = time.perf_counter()
        warmed = sum(f.op.warm(sample) for f in self.feeds)
        log.debug("link %s: %d of %d operators warmed in %.3f s", self.name, warmed,
                  len(self.feeds), time.perf_counter() - started)

    def process(self, batch) -> None:
        n = len(batch)
        if n == 0:
            return
        for f in self.feeds:
            f.process(batch)
        self.timer.observe(int(batch["timestamp"].max()))
        self.packets += n
        self.bytes += int(batch["len"].sum(dtype="int64"))
        self.last_ns = time.time_ns()

    def punctuate(self, p: int) -> None:
        """Hand punctuation `p` (already aligned and increasing) to every operator."""
        for f in self.feeds:
            f.punctuate(p)

    def tick(self, clock_ns: int | None) -> int | None:
        """A timer tick at `clock_ns`: punctuate when the link's punctuation advances."""
        p = self.timer.fire(clock_ns)
        if p is not None:
            self.punctuate(p)
        return p

    def finish(self) -> None:
        """The link's input is over (end of file, end of the run, a stop signal)."""
        if self.finished:
            return
        self.finished = True
        for f in self.feeds:
            f.finish()

    def counters(self) -> list[tuple[QuerySummary, dict]]:
        return [(f.summary, f.op.counters) for f in self.feeds]


class AttachedFeed:
    """A query's operators on one link that outlives it (the appliance's links, a watching
    agent's), attached between two batches: packets before its start are held back (each
    `OperatorFeed`'s `start_ns`) until the link's punctuation passes the start; from then on
    an older packet is late, as for any query. A link that stamps its records on several
    clocks (a served NETFLOW link's lanes) hands each lane's batches and punctuation with
    its `clock`: they go to the operators windowed on it only (None: to every one)."""

    def __init__(self, feeds: list, start_ns: int | None):
        self.feeds = feeds
        self.start_ns = start_ns

    @property
    def start_ns(self) -> int | None:
        return self.feeds[0].start_ns

    @start_ns.setter
    def start_ns(self, value: int | None) -> None:
        for f in self.feeds:
            f.start_ns = value

    @property
    def before_start(self) -> int:
        """Packets held back (every operator of the link sees the same packets)."""
        return self.feeds[0].before_start

    def process(self, batch, clock: str | None = None) -> None:
        for f in self.feeds:
            if clock is None or f.clock == clock:
                f.process(batch)

    def punctuate(self, p: int, clock: str | None = None) -> None:
        for f in self.feeds:
            if clock is None or f.clock == clock:
                # each operator's own: two clocks pass the start at different times
                if f.start_ns is not None and p >= f.start_ns:
                    f.start_ns = None
                f.punctuate(p)

    def finish(self) -> None:
        for f in self.feeds:
            f.finish()
