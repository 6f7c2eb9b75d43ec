"""Replaying capture files as links: interleaved by capture time, at full speed or paced.

Every link's file is read through its own `capture.reader` and cut into chunks by capture
time, and the links advance together: the link whose next packet is oldest goes next, for at
most one timer period of capture time beyond the next link's position. So two links play as
they were captured (a skewed or silent link does not have to wait until another file has been
read to the end), and the run's clock is well defined:

- `speed=None` (`--speed max`): as fast as the data allows; the clock is the data clock,
  the capture time up to which every link still reading has been read. Timer ticks every
  `period_ns` of data time.
- `speed=N`: packets are released when the wall clock reaches their capture time (relative
  to the oldest first packet) divided by N; the clock is that paced capture time. Timer ticks
  every `period_ns` of wall time, on the boundaries of N x `period_ns` of the paced clock.

Broken framing halfway through a file (a record with an impossible length) is stepped over by
the reader, which finds the next readable record (`capture.resync`); the problem and the bytes
skipped are reported in the link's summary. A read error ends the link there: the packets
before it were processed, the other links go on.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from capture.errors import CaptureError
from capture.punctuation import next_tick as next_tick_at

if TYPE_CHECKING:
    from capture.batch import PacketBatch

log = logging.getLogger(__name__)

#: batches read ahead per link on a machine with more than one core (`capture.prefetch`):
#: reading and decoding (a quarter of a flow query's low level) move off the operators' core
READ_AHEAD = 2
#: a bound above every time (the rest of a link)
END = (1 << 63) - 1
#: a paced replay's ticks come this long (wall seconds) after the boundaries: the packets
#: just past a window's end are taken by then
TICK_MARGIN_S = 0.02


class FileLink:
    """One capture file as a link: chunks of packets up to a capture-time bound."""

    def __init__(self, name: str, path: str, batch_size: int = 65536,
                 columns: tuple[str, ...] | None = None, prefetch: int | None = None,
                 stop=None, skip_before: int | None = None, record=None,
                 separator: str | None = None, flow_timeout_ns: int | None = None,
                 flow_state=None, flow_idle_ns: int | None = None,
                 lull_slack_ns: int | None = None, flow_exporter_timeouts=()):
        self.name, self.path = name, str(path)
        if prefetch is None:
            prefetch = READ_AHEAD if (os.cpu_count() or 1) > 1 else 0
        #: a record link whose records are timed by the wall clock when read, from a stream:
        #: while the stream is quiet its next record cannot be older than now, so `head` says
        #: now and the replay's timer punctuates the lull (as a live link's does)
        self.wall_clock = False
        #: a NETFLOW link: its records come disordered, each batch with the link's own
        #: punctuation (`capture.flowreader`), which `punctuation` says once the batch is
        #: taken whole; its head is the arrival of its datagrams (a collector's: now when
        #: quiet)
        self.flow = False
        self.punctuation: int | None = None
        self._batch_punctuation: int | None = None
        self.record = record            # the link's RecordFormat, None for packets
        self.reader: Any
        if record is not None:
            from capture.records import open_records

            extra = {}
            if record.kind == "netflow":
                extra["state_path"] = flow_state
                if flow_timeout_ns is not None:
                    extra["active_timeout_ns"] = flow_timeout_ns
                if flow_exporter_timeouts:
                    extra["exporter_timeouts_ns"] = dict(flow_exporter_timeouts)
                if flow_idle_ns is not None:
                    extra["idle_timeout_ns"] = flow_idle_ns
                if lull_slack_ns is not None:
                    extra["lull_slack_ns"] = lull_slack_ns
            self.reader = open_records(path, record, link=name, batch_size=batch_size,
                                       columns=columns, stop=stop, separator=separator,
                                       **extra)
            self.wall_clock = self.reader.stream and record.system_clock
            self.reader.idle_batches = self.wall_clock
            if record.kind == "netflow":
                # a collector hands on its quiet slices (the punctuation goes on meanwhile)
                self.flow = True
                self.reader.idle_batches = self.reader.stream
        else:
            from capture.reader import open_capture

            # `columns`: decode only what the link's operators read (None: every column).
            # `prefetch`: batches a thread reads and decodes ahead while the link's
            # operators work on the current one (a batch is consumed whole before the next
            # is asked for, as the read-ahead requires). `stop`: a stream (a FIFO, standard
            # input) waiting for bytes ends there when it says so (Ctrl-C, SIGTERM), as a
            # file ends at its end
            self.reader = open_capture(path, link=name, batch_size=batch_size,
                                       columns=columns, prefetch=prefetch, stop=stop)
        self._batches = iter(self.reader)
        self._idle = False          # a wall-clock stream was quiet: no record pending now
        self._batch: PacketBatch | None = None
        self._cummax: np.ndarray | None = None   # running max of capture time through the pending batch
        self._pos = 0
        self.max_seen: int | None = None
        self.exhausted = False
        self.problem: str | None = None
        # a resumed run (`tools.pipeline.resume`): the packets before this are in the spool
        # already; they are read past unpaced, and the replay's clock starts after them
        self.skip_before = skip_before
        self.skipped = 0

    def _pending(self) -> bool:
        """Make sure a batch with unread rows is pending; False when the file is over (or,
        for a wall-clock stream, quiet: `_idle`)."""
        while self._batch is None or self._pos >= len(self._batch):
            if self.exhausted or self._idle:
                return False
            try:
                batch = next(self._batches)
            except StopIteration:
                self._end()
                return False
            except CaptureError as exc:
                # what was read before the broken record has been delivered; keep the rest
                self.problem = str(exc)
                log.error("link %s: %s; the link ends here, the other links go on",
                          self.name, exc)
                self._end()
                return False
            if self.flow and len(batch) == 0:
                self._punctuate(batch.punctuation)     # nothing pending: it holds now
                if self.reader.stream:
                    self._idle = True
                    return False
                continue
            if len(batch) == 0:
                if self.wall_clock:         # a quiet slice of the stream (capture.records)
                    self._idle = True
                    return False
                continue
            if self.skip_before is not None:
                p = batch.punctuation if self.flow else None
                batch = self._unskipped(batch)
                if batch is None:
                    self._punctuate(p)
                    continue
                if self.flow:
                    batch.punctuation = p
            ts = batch["timestamp"]
            if self.flow:
                # disordered on their clock: the link is replayed by the datagrams' arrival
                # (capture time, or our clock for a collector), as captured
                self._batch_punctuation = batch.punctuation
                cummax = np.maximum.accumulate(batch["arrival"])
                if self.max_seen is not None:
                    np.maximum(cummax, self.max_seen, out=cummax)
                self._batch, self._cummax, self._pos = batch, cummax, 0
                self.max_seen = int(cummax[-1])
                continue
            if batch.in_order and (self.max_seen is None or ts[0] >= self.max_seen):
                cummax = ts       # already its running max: no pass, no fresh array
            else:
                cummax = np.maximum.accumulate(ts)
                if self.max_seen is not None and self.max_seen > cummax[0]:
                    np.maximum(cummax, self.max_seen, out=cummax)
            self._batch, self._cummax, self._pos = batch, cummax, 0
            self.max_seen = int(cummax[-1])
        return True

    def _unskipped(self, batch):
        """The batch without its packets before `skip_before` (None: none is left)."""
        assert self.skip_before is not None
        ts = batch["timestamp"]
        keep = ts >= self.skip_before
        n = int(np.count_nonzero(keep))
        self.skipped += len(batch) - n
        if n == len(batch):
            return batch
        return batch.take(keep) if n else None

    def _punctuate(self, p: int | None) -> None:
        if p is not None and (self.punctuation is None or p > self.punctuation):
            self.punctuation = p

    def source_punctuation(self) -> int | None:
        """The punctuation of a link that punctuates itself (NETFLOW) over the records taken
        so far (its timer gives it: `capture.punctuation.LinkTimer.source`)."""
        return self.punctuation

    def _end(self) -> None:
        self.exhausted = True
        self._batch = self._cummax = None
        self.reader.close()

    def head(self) -> int | None:
        """Capture time of the next unread packet (running max: monotone), None at the end.
        A quiet wall-clock stream's next record is read no earlier than now: its head is
        the wall clock."""
        if not self._pending():
            if self._idle and not self.exhausted:
                return max(time.time_ns(), self.max_seen or 0)
            return None
        assert self._cummax is not None   # `_pending` made a batch pending
        return int(self._cummax[self._pos])

    def take_until(self, bound: int):
        """The next unread packets whose (running max) capture time is below `bound`, as one
        batch of views (valid until the next call), or None when the next one is not."""
        self._idle = False              # a quiet stream is asked again
        if not self._pending():
            return None
        assert self._batch is not None and self._cummax is not None   # `_pending` made one pending
        stop = int(np.searchsorted(self._cummax, bound, side="left"))
        if stop <= self._pos:
            return None
        batch = self._batch.slice(self._pos, stop)
        self._pos = stop
        if self.flow and stop >= len(self._batch):
            # taken whole: the punctuation it carries holds once it is processed (the
            # caller processes it before its timer's next tick)
            self._punctuate(self._batch_punctuation)
        return batch

    @property
    def stats(self):
        return self.reader.stats

    @property
    def holds_on_stop(self) -> bool:
        """A NETFLOW collector: the datagrams it received are handed on at a stop."""
        return self.record is not None and self.record.kind == "netflow" and \
            bool(getattr(self.reader, "stream", False))

    def close(self) -> None:
        if not self.exhausted:
            self._end()


def replay(links: dict, feeds: dict, *, speed: float | None, period_ns: int,
           duration_ns: int | None = None, stop=lambda: False, info: dict | None = None,
           wall=time.monotonic, sleep=time.sleep) -> str:
    """Replay `links` (name -> FileLink) into `feeds` (name -> tools.pipeline.feeds.LinkFeeds).

    Returns why it ended: "end of input", "duration" or "stopped". Every link is finished
    (END_OF_INPUT punctuation) when it ends, whatever the reason. A paced replay puts its
    clock's origin in `info["origin"]`: (epoch seconds, capture time ns) of its start."""
    if speed is None:
        reason = _replay_max(links, feeds, period_ns, duration_ns, stop)
    else:
        reason = _replay_paced(links, feeds, speed, period_ns, duration_ns, stop, wall, sleep,
                               {} if info is None else info)
    if reason == "end of input" and stop():
        reason = "stopped"      # a stream ended by the stop itself (capture.reader: stop=)
    if reason == "stopped":
        for name, link in links.items():
            if link.holds_on_stop and not feeds[name].finished:
                # a NETFLOW collector hands on the datagrams it received (capture.flowreader)
                while (batch := link.take_until(END)) is not None:
                    feeds[name].process(batch)
    for name in links:
        links[name].close()
        feeds[name].finish()
    return reason


def _finish_ended(links: dict, feeds: dict) -> list[str]:
    """Finish the feeds of links whose file is over; the names still reading."""
    active = []
    for name, link in links.items():
        if link.head() is None:
            feeds[name].finish()
        else:
            active.append(name)
    return active


def _replay_max(links, feeds, period_ns, duration_ns, stop) -> str:
    start = None
    next_tick = None
    while True:
        if stop():
            return "stopped"
        active = _finish_ended(links, feeds)
        if not active:
            return "end of input"
        heads = sorted((links[n].head(), n) for n in active)
        clock = heads[0][0]
        if start is None:
            start, next_tick = clock, clock + period_ns
        if duration_ns is not None and clock - start >= duration_ns:
            return "duration"
        if clock >= next_tick:
            for n in links:
                if not feeds[n].finished:
                    feeds[n].tick(clock)
            next_tick = clock + period_ns
        first = heads[0][1]
        # run the oldest link up to a period past the next one (or the next tick)
        bound = (heads[1][0] if len(heads) > 1 else clock) + period_ns
        if duration_ns is not None:
            bound = min(bound, start + duration_ns)
        batch = links[first].take_until(max(bound, clock + 1))
        if batch is not None:
            feeds[first].process(batch)


def _replay_paced(links, feeds, speed, period_ns, duration_ns, stop, wall, sleep, info) -> str:
    heads = [h for h in (link.head() for link in links.values()) if h is not None]
    if not heads:
        _finish_ended(links, feeds)
        return "end of input"
    t0 = min(heads)
    w0 = wall()
    info["origin"] = (time.time(), t0)
    # ticks on the paced clock's boundaries of a period of wall time, a little after each
    # (`capture.punctuation.next_tick`): a window ending on one closes at the first tick
    # after its end (an agent replaying records stamped with the wall clock, at speed 1)
    step = max(1, int(period_ns * speed))
    margin = int(TICK_MARGIN_S * speed * 1e9)
    next_tick = next_tick_at(t0, step, margin)
    while True:
        if stop():
            return "stopped"
        now = wall()
        clock = t0 + int((now - w0) * speed * 1e9)
        if duration_ns is not None and (now - w0) * 1e9 >= duration_ns:
            return "duration"
        for n, link in links.items():
            while not feeds[n].finished:
                batch = link.take_until(clock + 1)
                if batch is None:
                    break
                feeds[n].process(batch)
        active = _finish_ended(links, feeds)
        if clock >= next_tick:
            for n in links:
                if not feeds[n].finished:
                    feeds[n].tick(clock)
            next_tick = next_tick_at(clock, step, margin)
        if not active:
            return "end of input"
        # sleep until the next packet is due or the next tick, but stay responsive
        due = min(min(links[n].head() for n in active), next_tick)
        wake = w0 + (due - t0) / (speed * 1e9)
        sleep(max(0.0, min(wake - wall(), 0.05)))
