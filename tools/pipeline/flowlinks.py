"""NETFLOW links of the appliance (`serve --netflow-in NAME=HOST:PORT|FILE.pcap`): flow records
exported by routers, read by `capture.flowreader.FlowReader` and handed to the router through
a `capture.recordqueue.RecordQueue`, as the record links of `tools.pipeline.recordlinks` are.

The link is timed by its records' own clocks, `first` (flow start) and `last` (flow end),
whichever its queries window on, at once. It keeps a *lane* per clock in use (`FlowLane`):
a queue of its records stamped with that clock (`timestamp` is that clock's column, the
arrays shared, not copied) and punctuated on it, with its timer. The `first` lane is always
there (the link's counters and status are its); the `last` lane is made when the first
query windowed on `last` is submitted (`want`), and from then on every batch goes into both.
The reader hands its records on as decoded, disordered, each batch with the punctuation
after it on both clocks (the exporters' export times less their active timeout on `first`,
less their idle timeout on `last`, melded: `capture.flowreader`); a lane's timer gives the
punctuation of the last batch it queued, never one a queued batch has not reached yet
(`_FlowProducer._hand_on`). The router hands a lane's records and punctuation to the
operators windowed on its clock only (`tools.pipeline.links.LinkRouter`). Memory: each lane
is bounded (`RING_ROWS` rows, what does not fit dropped and counted, as a record link's), and
two lanes hold the same arrays. A submission starts at the first window after the latest
record time read on the clocks it windows on. A record below a punctuation given is late,
counted by the reader per clock and by the queries.

Two kinds of source:

- a UDP collector (`NetflowCollectorLink`): datagrams as they come, until the server stops,
  when the datagrams received are decoded and queued (`releases_on_stop`: the appliance
  waits for them before its queries close their windows). Its templates and options are kept in the
  server's state directory (`state_path`), so that a restarted server decodes at once the
  data sets of templates it received before.
- a capture file of exported datagrams (`NetflowFileLink`): replayed once by capture time,
  paced at `--speed`: a batch of records goes to the router when the wall clock reaches the
  capture time of the latest datagram decoded for it. Its end ends the link (its queries'
  windows all close); a restart replays it from its start, reading past (unpaced) the records
  before the windows its resumed queries wrote.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np

from capture.batch import RecordBatch
from capture.punctuation import LinkTimer
from capture.recordqueue import RecordQueue
from capture.schema import BUILTIN
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError
from tools.pipeline.recordlinks import RING_ROWS, RecordProducer

log = logging.getLogger(__name__)

#: records per batch handed to the router
BATCH_ROWS = 8192
#: the clocks a NETFLOW link punctuates (`capture.schema.NETFLOW_CLOCKS`); the first is the
#: link's own, always in use
CLOCKS = ("first", "last")


class FlowLane:
    """A NETFLOW link's records stamped and punctuated on one clock (module docstring): the
    queue the router takes them from, and the timer that punctuates it with the punctuation
    of the last batch queued."""

    def __init__(self, clock: str, ring: RecordQueue, timer: LinkTimer):
        self.clock, self.ring, self.timer = clock, ring, timer
        self.given: int | None = None
        timer.source = self._given      # type: ignore[assignment]  # a callable source

    def _given(self) -> int | None:
        return self.given

    def hand_on(self, batch: RecordBatch, clock: str, punctuation: int | None) -> None:
        """Queue `batch` (stamped with `clock`) restamped on this lane's clock, and take
        `punctuation`, this clock's after it."""
        if len(batch):
            if clock != self.clock:
                col = batch.columns[self.clock]
                batch = RecordBatch(batch.link, {**batch.columns, "timestamp": col},
                                    batch.offsets, False, strings=batch.strings)
            self.ring.push(batch)
            self.timer.observe(int(batch["timestamp"].max()))
        if punctuation is not None and (self.given is None or punctuation > self.given):
            self.given = int(punctuation)

    def tick(self) -> None:
        p = self.timer.fire(None)
        if p is not None:
            self.ring.punctuate(p)


class _FlowTotals:
    """A NETFLOW link's reader counters (zero until the reader opens)."""

    def __init__(self):
        self.reader = None
        self.problems: list = []
        #: the link's lanes by clock (`FlowLane`): the clocks its queries window on
        self.lanes: dict = {}

    @property
    def kernel_drops(self) -> int:
        """A collector's datagrams the kernel dropped at its socket (its buffer full)."""
        return 0 if self.reader is None else int(self.reader.stats.socket_drops or 0)

    @property
    def malformed(self) -> int:
        return 0 if self.reader is None else int(self.reader.stats.malformed)

    @property
    def reasons(self) -> dict:
        return {} if self.reader is None else dict(self.reader.stats.reasons)

    def describe(self) -> str:
        return "" if self.reader is None else self.reader.stats.describe()

    def netflow(self) -> dict:
        """Datagrams, records, versions, sequence gaps, late records (`late`: summed over
        the clocks in use, `late_by_clock`: on each), malformed datagrams by reason and
        exporter, a collector's datagrams dropped at its socket and by its queue (None: not a
        collector) (status and /metrics)."""
        clocks = list(self.lanes) or ["first"]
        if self.reader is None:
            return {"datagrams": 0, "records": 0, "versions": {}, "sequence_gaps": 0,
                    "gaps": {}, "late": 0, "late_by_clock": {c: 0 for c in clocks},
                    "malformed": {}, "by_exporter": {},
                    "socket_drops": None, "queue_drops": None}
        s = self.reader.stats
        late = {c: int((s.late_by_clock or {}).get(c, 0)) for c in clocks}
        collector = s.socket_drops is not None
        return {"datagrams": int(s.datagrams), "records": int(s.records),
                "socket_drops": s.socket_drops,
                "queue_drops": int(s.queue_drops) if collector else None,
                "versions": {str(v): int(n) for v, n in s.versions.items()},
                "sequence_gaps": int(s.sequence_gaps),
                "gaps": {f"{e}/{d}": int(n) for (e, d), n in s.gaps.items()},
                "late": sum(late.values()), "late_by_clock": late,
                "malformed": dict(s.reasons),
                "by_exporter": {f"{r} from {e}": int(n)
                                for (e, r), n in s.by_exporter.items()}}


class _FlowProducer(RecordProducer):
    """What both kinds share: the reader's options and counters."""

    def __init__(self, name: str, path: str, timer: LinkTimer, *, period_ns: int,
                 timeout_ns: int, state_path: Path | None, exporter_timeouts=()):
        fmt = BUILTIN.record_format("NETFLOW")
        super().__init__(name, path, fmt, timer, period_ns=period_ns, separator=None,
                         batch_size=BATCH_ROWS, ring_rows=RING_ROWS)
        self.timeout_ns = int(timeout_ns)
        #: the operator's active timeout of some exporters ((address, ns))
        self.exporter_timeouts = dict(exporter_timeouts)
        self.state_path = state_path
        self.totals = _FlowTotals()
        self.stats = self.totals        # type: ignore[assignment]  # the same counters' names
        #: the datagrams received are decoded and queued when it stops
        self.releases_on_stop = False
        #: the lanes by clock (module docstring), the link's own (`self.ring`, `self.timer`)
        #: first; replaced whole when one is added, under `_lanes_lock`, which `_hand_on`
        #: holds too: a batch goes into every lane or was handed on before the new one was
        self.lanes: dict[str, FlowLane] = {CLOCKS[0]: FlowLane(CLOCKS[0], self.ring, timer)}
        self._lanes_lock = threading.Lock()
        #: the latest punctuation handed on per clock (a new lane starts from it)
        self._given: dict[str, int | None] = {}
        #: the latest record time read per clock (a new lane's timer starts from it)
        self._seen: dict[str, int] = {}
        #: the clock the reader stamps its batches with
        self._stamped = CLOCKS[0]
        #: the producer has ended: a lane made later is ended too
        self._over = False
        self.totals.lanes = self.lanes

    def want(self, clock: str) -> FlowLane:
        """The lane of `clock`, made (empty, its timer at the latest record time read and
        the punctuation given on that clock) if no query windowed on it before."""
        with self._lanes_lock:
            lane = self.lanes.get(clock)
            if lane is not None:
                return lane
            lane = FlowLane(clock, RecordQueue(self.ring.capacity, self.link),
                            LinkTimer(0, self.timer.slack))
            lane.given = self._given.get(clock)
            seen = self._seen.get(clock)
            if seen is not None:
                lane.timer.observe(seen)
            if self._over:
                lane.ring.finish()
            self.lanes = {**self.lanes, clock: lane}
            self.totals.lanes = self.lanes
            log.info("link %s: a query windows on %s: its records are punctuated on it too",
                     self.link, clock)
            return lane

    def _reader(self, stop=None):
        from capture.flowreader import FlowReader

        reader = FlowReader(self.path, self.format, self.link, self.batch_size,
                            active_timeout_ns=self.timeout_ns,
                            exporter_timeouts_ns=self.exporter_timeouts,
                            state_path=self.state_path,
                            stop=stop, clocks=CLOCKS)
        self.totals.reader = reader
        self._stamped = reader.clock
        return reader

    def _hand_on(self, batch) -> None:
        """Queue `batch` in every lane (its largest time on a clock is the latest record
        time read there, where a submission starts after) and take the punctuation it
        carries: the reader's own may already be ahead of batches it has yet to yield, the
        batch's is not."""
        ps = batch.punctuations or {}
        with self._lanes_lock:
            if len(batch):
                for clock in CLOCKS:
                    t = int(batch.columns[clock].max())
                    if t > self._seen.get(clock, t - 1):
                        self._seen[clock] = t
            for clock, p in ps.items():
                if p is not None and (self._given.get(clock) is None
                                      or p > self._given[clock]):
                    self._given[clock] = int(p)
            for lane in self.lanes.values():
                lane.hand_on(batch, self._stamped, ps.get(lane.clock))
        self._tick(None)

    def _tick(self, clock_ns: int | None) -> None:
        if time.monotonic_ns() < self._next_tick:
            return
        self._next_tick = time.monotonic_ns() + self.period_ns
        for lane in self.lanes.values():
            lane.tick()

    def run(self) -> None:
        try:
            super().run()
        finally:
            with self._lanes_lock:
                self._over = True
                for lane in self.lanes.values():
                    lane.ring.finish()

    def netflow_stats(self) -> dict:
        return self.totals.netflow()


class NetflowCollectorLink(_FlowProducer):
    """Datagrams received on a UDP port (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.releases_on_stop = True

    def _read(self) -> None:
        reader = self._reader(stop=self._waiting)
        try:
            for batch in reader:
                self._hand_on(batch)
        finally:
            reader.close()

    def _waiting(self) -> bool:
        """The reader asks this between two waits for datagrams (0.1 s): the timer ticks."""
        self._tick(None)
        return self.stopping.is_set()


class NetflowFileLink(_FlowProducer):
    """A capture file's datagrams, replayed by capture time (module docstring)."""

    def __init__(self, *args, speed: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.speed = float(speed)
        self.skipped = 0

    def _read(self) -> None:
        from capture.flowsource import read_datagrams

        # the capture time of each datagram: a batch is due when its latest one is
        arrivals = np.asarray(read_datagrams(self.path).arrivals, np.int64)
        reader = self._reader()
        # the replay's origin: the first datagram, now (a resumed link: the first batch it
        # does not read past, when it comes)
        t0 = w0 = None
        if self.skip_before is None and len(arrivals):
            t0, w0 = int(arrivals[0]), time.time_ns()
        try:
            for batch in reader:
                if self.stopping.is_set():
                    return
                if self.skip_before is not None:
                    batch = self._unskipped(batch)
                    if batch is None:
                        continue
                decoded = min(int(reader.stats.datagrams), len(arrivals))
                due = int(arrivals[decoded - 1]) if decoded else 0
                if t0 is None:
                    t0, w0 = due, time.time_ns()
                    if self.skipped:
                        log.info("link %s: %d records before %d ns read past (written before "
                                 "the restart)", self.link, self.skipped, self.skip_before)
                assert w0 is not None
                if not self._wait(w0 + int((due - t0) / self.speed)):
                    return
                self._hand_on(batch)
            self.ended_input = not self.stopping.is_set()
            log.info("link %s: the end of %s (%d datagrams, %d records)", self.link,
                     self.path, reader.stats.datagrams, reader.stats.records)
        finally:
            reader.close()

    def _unskipped(self, batch):
        """The batch without its records before `skip_before` (None: none is left): by flow
        end when a resumed query windows on it (a record starting before a `last` query's
        first window may end in it; one ending before starts before too, so a `first`
        query's records are kept as well, those it wrote held back by its start)."""
        assert self.skip_before is not None
        clock = "last" if "last" in self.lanes else self._stamped
        keep = batch.columns[clock] >= self.skip_before
        n = int(np.count_nonzero(keep))
        self.skipped += len(batch) - n
        if n == len(batch):
            return batch
        return batch.take(keep) if n else None

    def _wait(self, wall_ns: int) -> bool:
        """Tick until the wall clock reaches `wall_ns`; False when stopped meanwhile."""
        while not self.stopping.is_set():
            left = wall_ns - time.time_ns()
            if left <= 0:
                return True
            self._tick(None)
            self.stopping.wait(min(left / NS, 0.05))
        return False


def open_flow_links(netflow, *, period_ns: int, slack_ns: int, speed: float,
                    timeout_ns: int, state_dir: Path | None, exporter_timeouts=()) -> dict:
    """The producers of `netflow` ((name, HOST:PORT or capture file)), not started (the
    appliance starts them, and lets them read once its resumed queries are attached: `go`),
    their exporters' active timeout `timeout_ns` or, for some, the operator's own
    (`exporter_timeouts`: (address, ns)). A collector's templates are kept in `state_dir`
    (None: not kept)."""
    out: dict[str, _FlowProducer] = {}
    for name, source in netflow:
        timer = LinkTimer(0, slack_ns)
        state = None if state_dir is None else state_dir / f"{quote(name, safe='')}.json"
        if flow_source(name, source) == "collector":
            out[name] = NetflowCollectorLink(name, source, timer, period_ns=period_ns,
                                             timeout_ns=timeout_ns, state_path=state,
                                             exporter_timeouts=exporter_timeouts)
        else:
            out[name] = NetflowFileLink(name, str(Path(source).resolve()), timer,
                                        speed=speed, period_ns=period_ns,
                                        timeout_ns=timeout_ns, state_path=None,
                                        exporter_timeouts=exporter_timeouts)
    return out


def flow_source(name: str, source: str) -> str:
    """"collector" or "file": what `--netflow-in NAME=SOURCE` names (RunConfigError naming
    the option when neither)."""
    from capture.flowreader import collector_address

    if collector_address(source) is not None:
        return "collector"
    if Path(source).is_file():
        return "file"
    raise RunConfigError(f"--netflow-in {name}={source}: neither a capture file of exported "
                         f"datagrams nor HOST:PORT to collect on")


def check_flow_source(name: str, source: str) -> None:
    """Before the server starts: a file must be a capture, and a collector's address free
    to bind (RunConfigError naming the option, in one line)."""
    import socket

    from capture.errors import CaptureError
    from capture.flowreader import collector_address
    from capture.reader import open_capture

    opt = f"--netflow-in {name}={source}"
    if flow_source(name, source) == "file":
        try:
            open_capture(source, link=name).close()
        except (CaptureError, OSError) as exc:
            raise RunConfigError(f"{opt}: {exc}") from None
        return
    address = collector_address(source)
    assert address is not None
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((host, port))
    except OSError as exc:
        raise RunConfigError(f"{opt}: cannot receive NetFlow there: "
                             f"{exc.strerror or exc}") from None


def describe(name: str, source: str) -> str:
    """The link's source as status shows it."""
    if flow_source(name, source) == "collector":
        return f"NETFLOW collected on UDP {source}"
    return f"NETFLOW datagrams of {Path(source).resolve()}"
