"""Links that outlive their queries: capture threads that run for the whole life of an
appliance (`oopscope serve`) or a watching agent (`tools.cluster.watch`), and the thread that
hands their packets to whichever queries are attached at the moment.

Each link has a producer thread pushing packets and timer punctuation into its fixed-size
packet ring (`capture.ring.PacketRing`, which never blocks and counts what it drops):

- a live interface: `tools.pipeline.livelinks.LiveLink`, as in `oopscope run`;
- a capture file (`ReplayLink`): replayed paced at `speed` x real time and, optionally, looped.
  Its packets are stamped with the wall-clock time at which they are replayed (capture time
  offset and scaled), so a replayed link is a live link made from a file: its clock is the
  wall clock like an interface's, a looped file keeps time increasing, and a restart after a
  crash continues in time instead of replaying old timestamps.

The router thread (`LinkRouter`) takes from every ring and runs the low-level operators of
the queries attached to each link. Queries are attached and detached by commands the router
runs between two batches, so a submission or a cancellation never pauses capture: the
producers keep filling the rings meanwhile.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from capture import punctuation
from capture.batch import PAYLOAD
from capture.punctuation import LinkTimer
from capture.schema import COLUMNS
from common.units import NS_PER_S as NS
from tools.pipeline.livelinks import RING_PAYLOAD_BYTES

log = logging.getLogger(__name__)

RING_ROWS = 1 << 20
#: (punctuation, wall ns) pairs kept per link for the output latency
PUNCT_LOG = 4096
#: a link's rates (status, the page) are over this last stretch of time, in seconds: short,
#: so that they follow the traffic within seconds when it starts or stops
RATE_WINDOW_S = 2.0
#: seconds between two samples of a link's counters (taken by the router)
RATE_STEP_S = 0.25
#: a replay sleeps at least this long (seconds) between two pushes: the packets due meanwhile
#: go as one batch, each stamped with its own time (a wake-up per packet cost a served
#: 2,000-packet/s loop ~0.15 of a core)
REPLAY_PACE_S = 0.01
#: a replay's ticks come this long after the period's boundaries (`capture.punctuation.
#: next_tick`): two pushes, the first past a window's end closing it at the tick
TICK_MARGIN_NS = int(2 * REPLAY_PACE_S * NS)


class ReplayLink(threading.Thread):
    """The producer of a capture-file link (module docstring): paced, re-timed, looped."""

    def __init__(self, name: str, path: str, timer: LinkTimer, *, period_ns: int,
                 speed: float = 1.0, loop: bool = False, ring_rows: int = RING_ROWS,
                 batch_size: int = 8192):
        super().__init__(name=f"oopscope-replay-{name}", daemon=True)
        from capture.reader import open_capture
        from capture.ring import PacketRing

        self.link, self.path = name, str(path)
        self.timer, self.period_ns = timer, period_ns
        self.speed, self.loop = float(speed), loop
        self.batch_size = batch_size
        # opened here, in the caller's thread: an unreadable file fails the server's start
        open_capture(self.path, link=name, batch_size=batch_size).close()
        # a query submitted later may read payloads: a replayed file always carries them
        # (paced to real time, copying them costs little)
        self.ring = PacketRing.create(ring_rows, link=name, shared=False,
                                      payload_bytes=RING_PAYLOAD_BYTES)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.loops = 0
        self.stats = _Totals()

    def run(self) -> None:
        next_tick = punctuation.next_tick(time.time_ns(), self.period_ns, TICK_MARGIN_NS)
        try:
            while not self.stopping.is_set():
                next_tick = self._play_once(next_tick)
                self.loops += 1
                if not self.loop:
                    break
            while not self.stopping.is_set():        # silent: the timer still punctuates
                next_tick = self._tick(next_tick)
                self.stopping.wait(0.05)
        except BaseException as exc:   # reported by status and the router
            self.error = exc
            log.error("link %s: replay of %s failed: %s", self.link, self.path, exc)
        finally:
            self.ring.finish()

    def _tick(self, next_tick: int, behind: bool = False) -> int:
        """Punctuate when a tick is due; the next tick's time. `behind`: packets due are
        still to be pushed, so only what was pushed punctuates (the clock less its slack
        could pass them)."""
        now = time.time_ns()
        if not punctuation.tick_due(now, next_tick, self.period_ns):
            return next_tick
        p = self.timer.fire(None if behind else now)
        if p is not None:
            self.ring.punctuate(p)
        return punctuation.next_tick(now, self.period_ns, TICK_MARGIN_NS)

    def _play_once(self, next_tick: int) -> int:
        from capture.batch import PacketBatch
        from tools.pipeline.replay import FileLink

        link = FileLink(self.link, self.path, self.batch_size, prefetch=0,
                        columns=(*(c.name for c in COLUMNS), PAYLOAD))
        try:
            t0 = link.head()
            if t0 is None:
                return next_tick
            w0 = time.time_ns()
            if self.timer.max_seen is not None:
                w0 = max(w0, self.timer.max_seen + 1)    # a new loop never goes back in time
            # where this pass of the file lies in wall-clock time (a test's truth reads it)
            log.info("link %s: pass %d of %s: capture time %d ns is wall time %d ns at "
                     "speed %g", self.link, self.loops, self.path, t0, w0, self.speed)
            while not self.stopping.is_set():
                now = time.time_ns()
                due = t0 + int((now - w0) * self.speed)       # capture time due by now
                batch = link.take_until(due + 1)
                if batch is not None and len(batch):
                    ts = batch["timestamp"]
                    cols = dict(batch.columns)
                    cols["timestamp"] = w0 + ((ts - t0) / self.speed).astype(np.int64)
                    retimed = PacketBatch(self.link, cols, payload=batch.payload)
                    self.ring.push(retimed)
                    self.timer.observe(int(cols["timestamp"].max()))
                head = link.head()
                behind = head is not None and head <= due
                # ticks come at every turn, a busy link's too: one that ticked only when a
                # turn found nothing due closed its windows seconds late at 400K packets/s
                next_tick = self._tick(next_tick, behind)
                if head is None:
                    return next_tick
                if behind:
                    continue
                # caught up: the packets due meanwhile go as one push (a push per turn of
                # a few packets each took most of a core at 400K packets/s)
                wake = w0 + (head - t0) / self.speed
                now = time.time_ns()
                self.stopping.wait(max(0.0, min(max((wake - now) / NS, REPLAY_PACE_S),
                                                (next_tick - now) / NS, 0.05)))
            return next_tick
        finally:
            self.stats.add(link.stats)
            link.close()

    def stop(self) -> None:
        self.stopping.set()

    def close(self) -> None:
        pass


class _Totals:
    """A replayed file's reader counters summed over its loops."""

    def __init__(self):
        self.reasons: dict[str, int] = {}
        self.malformed = 0
        self.problems: list[str] = []
        self.kernel_drops = 0

    def add(self, stats) -> None:
        self.malformed += int(stats.malformed)
        for k, v in stats.reasons.items():
            self.reasons[k] = self.reasons.get(k, 0) + int(v)
        self.problems += [p for p in stats.problems if p not in self.problems]


class ServedLink:
    """One link of the appliance: its producer, ring, timer, counters and attached feeds."""

    def __init__(self, name: str, source: str, producer, timer: LinkTimer):
        self.name, self.source = name, source
        self.producer, self.timer = producer, timer
        self.feeds: dict[str, object] = {}        # query name -> feeds.AttachedFeed
        #: the submissions whose feeds saw the end of a record link that ended
        self.finished: set[str] = set()
        #: a live interface whose snap length follows its queries (no --snaplen given)
        self.dynamic_snaplen = False
        self.packets = 0
        self.bytes = 0
        self.punctuation: int | None = None
        #: per clock of its lanes (None: its only one), (punctuation, wall ns)
        self.punct_logs: dict[str | None, deque] = {}
        #: (monotonic s, packets, bytes) every RATE_STEP_S, sampled by the router
        self._rates: deque = deque(maxlen=int(RATE_WINDOW_S / RATE_STEP_S) + 4)

    @property
    def ring(self):
        return self.producer.ring

    def rings(self) -> list[tuple[str | None, Any]]:
        """(clock, ring) of each lane of the link, its own first: a served NETFLOW link
        stamps its records on each clock its queries window on (`flowlinks.FlowLane`); any
        other link has one ring, clock None (its batches go to every feed)."""
        lanes = getattr(self.producer, "lanes", None)
        if lanes is None:
            return [(None, self.ring)]
        return [(clock, lane.ring) for clock, lane in lanes.items()]

    def stats(self) -> dict:
        """Counters of the link (the status and the metrics read them)."""
        p = self.producer
        capture = getattr(p, "capture", None)
        st = capture.stats if capture is not None else p.stats
        # rows a lane had no room for are lost to the queries on its clock: every lane's count
        drops = sum(int(r.stats().dropped) for _, r in self.rings())
        pps, bps = self.rates()
        return {"name": self.name, "source": self.source, "packets": self.packets,
                "bytes": self.bytes, "pps": pps, "bps": bps,
                "malformed": int(st.malformed), "reasons": dict(st.reasons),
                "ring_drops": drops,
                "kernel_drops": int(getattr(st, "kernel_drops", 0) or 0),
                "punctuation_ns": self.punctuation,
                "error": None if p.error is None else str(p.error),
                # a NETFLOW link's datagrams, records, sequence gaps, late records
                "netflow": p.netflow_stats() if hasattr(p, "netflow_stats") else None}

    def sample(self, now: float) -> None:
        """Note the counters at monotonic time `now` (the router, every RATE_STEP_S)."""
        self._rates.append((now, self.packets, self.bytes))

    def rates(self) -> tuple[float, float]:
        """Packets and bits per second over the last RATE_WINDOW_S: the counters now less
        the sample that window ago (the oldest one in the first seconds)."""
        now, packets, nbytes = time.monotonic(), self.packets, self.bytes
        samples = list(self._rates)
        old = next((r for r in samples if now - r[0] <= RATE_WINDOW_S), None)
        if old is None and samples:         # the router fell behind: its latest sample
            old = samples[-1]
        if old is None or now - old[0] <= 0:
            return 0.0, 0.0
        span = now - old[0]
        return (packets - old[1]) / span, 8 * (nbytes - old[2]) / span

    def capture_for(self, columns) -> None:
        """Capture what operators reading `columns` (None: they cannot tell) need of each
        frame: a live interface copies TCP/UDP payloads only while an attached query reads
        `TCP_data` or `UDP_data`, and, unless `--snaplen` fixed it, keeps every byte of a
        frame only while a query needs them (`capture.live.snaplen_for`), the headers
        otherwise."""
        capture = getattr(self.producer, "capture", None)
        if capture is None:
            return
        from capture.live import snaplen_for

        wanted = columns is None or PAYLOAD in columns
        if capture.payload != wanted:
            capture.payload = wanted
            log.info("link %s: payloads %s", self.name,
                     "captured (a query reads them)" if wanted else "no longer captured")
        if self.dynamic_snaplen:
            capture.set_snaplen(snaplen_for(columns))

    def refresh_capture(self, also=()) -> None:
        """After a query is attached or detached (or before one is, `also`: its low-level
        plans): capture what the attached operators read."""
        from lowlevel.operator import plan_read_columns

        plans = [f.op.plan for feed in self.feeds.values() for f in getattr(feed, "feeds", ())]
        reads = [plan_read_columns(plan) for plan in [*plans, *also]]
        self.capture_for(None if any(r is None for r in reads)
                         else {c for r in reads for c in (r or ())})

    def punctuated_at(self, p: int, clock: str | None = None) -> int | None:
        """Wall ns at which this link's punctuation (on `clock`, of a link with lanes; None:
        its own) first reached `p` (None: not yet, or before the remembered history)."""
        if clock is None:
            clock = self.rings()[0][0]
        for value, wall in self.punct_logs.get(clock, ()):
            if value >= p:
                return wall
        return None


def open_links(links, interfaces, *, period_ns: int, slack_ns: int, speed: float = 1.0,
               loop: bool = False, capture_options=(), records=(), schema=None,
               separator: str | None = None, netflow=(), flow_timeout_ns: int = 0,
               flow_exporter_timeouts=(), flow_state: Path | None = None
               ) -> dict[str, ServedLink]:
    """Open and start the producers of `links` ((name, capture file): replayed),
    `interfaces` ((name, interface): live), `records` ((name, protocol, path): record
    links of `schema`'s protocols, `tools.pipeline.recordlinks`) and `netflow` ((name,
    HOST:PORT or capture file): NETFLOW links, `tools.pipeline.flowlinks`, their exporters'
    active timeout `flow_timeout_ns`, or the operator's for some exporters,
    `flow_exporter_timeouts` ((address, ns)), a collector's templates kept in `flow_state`): the
    appliance's links, and a watching agent's."""
    from capture.tpacket import MAX_SNAPLEN
    from tools.pipeline.flowlinks import describe, open_flow_links
    from tools.pipeline.livelinks import LiveLink
    from tools.pipeline.recordlinks import open_record_links

    out: dict[str, ServedLink] = {}
    try:
        for name, iface in interfaces:
            timer = LinkTimer(0, slack_ns)
            holder = type("Timer", (), {"timer": timer})
            # the ring has room for payloads from the start; the capture copies them (and,
            # unless --snaplen is given, keeps more than the headers) only while a query
            # reads them (`ServedLink.capture_for`)
            options = dict(capture_options)
            dynamic = options.get("snaplen") is None
            if dynamic:
                options["snaplen"] = MAX_SNAPLEN
            live = LiveLink(name, iface, holder, period_ns=period_ns, options=options,
                            payload=True, payload_bytes=RING_PAYLOAD_BYTES)
            out[name] = ServedLink(name, f"interface {iface}", live, timer)
            out[name].dynamic_snaplen = dynamic
            live.capture.payload = False            # until a query reads them
            out[name].capture_for(set())
        for name, path in links:
            timer = LinkTimer(0, slack_ns)
            replay = ReplayLink(name, path, timer, period_ns=period_ns, speed=speed, loop=loop)
            out[name] = ServedLink(name, str(Path(path).resolve()), replay, timer)
        producers = open_record_links(records, schema, period_ns=period_ns, slack_ns=slack_ns,
                                      speed=speed, separator=separator)
        for (name, protocol, path), producer in zip(records, producers.values()):
            source = path if path == "-" else str(Path(path).resolve())
            out[name] = ServedLink(name, f"{protocol} records from {source}", producer,
                                   producer.timer)
        flows = open_flow_links(netflow, period_ns=period_ns, slack_ns=slack_ns, speed=speed,
                                timeout_ns=flow_timeout_ns,
                                exporter_timeouts=flow_exporter_timeouts, state_dir=flow_state)
        for name, source in netflow:
            out[name] = ServedLink(name, describe(name, source), flows[name],
                                   flows[name].timer)
    except BaseException:
        for link in out.values():
            link.producer.close()
        raise
    for link in out.values():
        link.producer.start()
    return out


class LinkRouter(threading.Thread):
    """Takes from every link's ring and runs the attached feeds; runs commands in between."""

    def __init__(self, links: dict[str, ServedLink], batch_rows: int = 65536):
        super().__init__(name="oopscope-router", daemon=True)
        self.links = links
        self.batch_rows = batch_rows
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.stopping = threading.Event()
        self.on_feed_error: Callable[[str, BaseException], None] = lambda name, exc: None

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the router's thread between two batches; its result (or error)."""
        if not self.is_alive():      # not started, or stopped: nothing else runs the links
            return fn()
        fut: Future = Future()
        self.commands.put((fn, fut))
        while True:
            try:
                return fut.result(timeout=0.5)
            except TimeoutError:
                if not self.is_alive():  # it stopped after our command was queued
                    self._commands()

    def run(self) -> None:
        sampled = 0.0
        while not self.stopping.is_set():
            self._commands()
            if not self._drain():
                time.sleep(0.005)
            now = time.monotonic()
            if now - sampled >= RATE_STEP_S:
                sampled = now
                for link in self.links.values():
                    link.sample(now)
        self._commands()

    def _commands(self) -> None:
        while True:
            try:
                fn, fut = self.commands.get_nowait()
            except queue.Empty:
                return
            try:
                fut.set_result(fn())
            except BaseException as exc:   # handed to the caller
                fut.set_exception(exc)

    def drain_all(self) -> None:
        """Whatever the producers pushed (after they stopped) goes through."""
        while self._drain():
            pass

    def _drain(self) -> bool:
        took = False
        for link in self.links.values():
            rings = link.rings()
            for lane, (clock, ring) in enumerate(rings):
                batch, p = ring.take(self.batch_rows)
                # the link's counters and punctuation are its own lane's (the others carry
                # the same records, stamped on another clock)
                if batch is not None and len(batch):
                    if lane == 0:
                        link.packets += len(batch)
                        link.bytes += int(batch["len"].sum(dtype="int64"))
                    self._each(link, (lambda f, b=batch: f.process(b)) if clock is None
                               else (lambda f, b=batch, c=clock: f.process(b, c)))
                    took = True
                if p is not None:
                    if lane == 0:
                        link.punctuation = p
                    link.punct_logs.setdefault(clock, deque(maxlen=PUNCT_LOG)).append(
                        (p, time.time_ns()))
                    self._each(link, (lambda f, p=p: f.punctuate(p)) if clock is None
                               else (lambda f, p=p, c=clock: f.punctuate(p, c)))
                    took = True
                ring.release()
            if getattr(link.producer, "ended_input", False) \
                    and all(ring.done for _, ring in rings):
                self._finish_ended(link)
        return took

    def _finish_ended(self, link: ServedLink) -> None:
        """A record link whose source is over: its queries' windows all close (end of
        input), as at the end of `oopscope run`; a query attached later is finished too."""
        fresh = [n for n in link.feeds if n not in link.finished]
        if not fresh:
            return
        link.finished.update(fresh)
        for name in fresh:
            log.info("link %s ended: query %s closes its windows", link.name, name)
        self._each(link, lambda f: f.finish() if any(link.feeds.get(n) is f for n in fresh)
                   else None)

    def _each(self, link: ServedLink, step) -> None:
        for name, feed in list(link.feeds.items()):
            try:
                step(feed)
            except Exception as exc:  # noqa: BLE001 - one query's fault stops that query only
                link.feeds.pop(name, None)
                self.on_feed_error(name, exc)

    def stop(self) -> None:
        self.stopping.set()
