"""NETFLOW links of the appliance (`serve --netflow-in NAME=HOST:PORT|FILE.pcap`): flow records
exported by routers, read by `capture.flowreader.FlowReader` and handed to the router through
a `capture.recordqueue.RecordQueue`, as the record links of `tools.pipeline.recordlinks` are.

The link is timed by its records' own clock, `first` (flow start): its submissions start at
the first window after the latest `first` read. The reader hands its records on as decoded,
disordered, each batch with the link's punctuation after it (the exporters' export times
less their active timeout, melded); the link's timer gives the punctuation of the last batch
queued, never one a queued batch has not reached yet (`_FlowProducer._hand_on`). A record
below a punctuation given is late, counted by the reader and by the queries.

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
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np

from capture.punctuation import LinkTimer
from capture.schema import BUILTIN
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError
from tools.pipeline.recordlinks import RING_ROWS, RecordProducer

log = logging.getLogger(__name__)

#: records per batch handed to the router
BATCH_ROWS = 8192


class _FlowTotals:
    """A NETFLOW link's reader counters (zero until the reader opens)."""

    def __init__(self):
        self.reader = None
        self.problems: list = []

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
        """Datagrams, records, versions, sequence gaps, late records, records waiting for a
        template, malformed datagrams by reason and exporter, a collector's datagrams dropped
        at its socket and by its queue (None: not a collector) (status and /metrics)."""
        if self.reader is None:
            return {"datagrams": 0, "records": 0, "versions": {}, "sequence_gaps": 0,
                    "gaps": {}, "late": 0, "malformed": {}, "by_exporter": {},
                    "socket_drops": None, "queue_drops": None}
        s = self.reader.stats
        collector = s.socket_drops is not None
        return {"datagrams": int(s.datagrams), "records": int(s.records),
                "socket_drops": s.socket_drops,
                "queue_drops": int(s.queue_drops) if collector else None,
                "versions": {str(v): int(n) for v, n in s.versions.items()},
                "sequence_gaps": int(s.sequence_gaps),
                "gaps": {f"{e}/{d}": int(n) for (e, d), n in s.gaps.items()},
                "late": int(s.late), "malformed": dict(s.reasons),
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
        self._given: int | None = None

    def _reader(self, stop=None):
        from capture.flowreader import FlowReader

        reader = FlowReader(self.path, self.format, self.link, self.batch_size,
                            active_timeout_ns=self.timeout_ns,
                            exporter_timeouts_ns=self.exporter_timeouts,
                            state_path=self.state_path,
                            stop=stop)
        self.totals.reader = reader
        self.timer.source = self._punctuation
        return reader

    def _hand_on(self, batch) -> None:
        """Queue `batch` (its largest `first` is the latest record time read, where a
        submission starts after) and take the punctuation it carries: the reader's own may
        already be ahead of batches it has yet to yield, the batch's is not."""
        self._push(batch)
        p = batch.punctuation
        if p is not None and (self._given is None or p > self._given):
            self._given = int(p)
        self._tick(None)

    def _punctuation(self) -> int | None:
        """The link's timer's source: the punctuation of the last batch queued."""
        return self._given

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
        """The batch without its records before `skip_before` (None: none is left)."""
        assert self.skip_before is not None
        keep = batch["timestamp"] >= self.skip_before
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
