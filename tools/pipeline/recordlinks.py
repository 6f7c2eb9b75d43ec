"""Record links of the appliance: a link carrying the records of a schema-file protocol
(`serve --schema FILE --records NAME=PROTOCOL:PATH`) instead of packets.

The appliance's links are decided when it starts, before any query, so a record link names
its protocol there: the producer parses every record with it (`capture.records`) and every
query that reads the link must read it as that protocol. Its rows go to the router through a
`capture.recordqueue.RecordQueue` (the packet ring's contract over record batches).

Two kinds of source:

- a FIFO or standard input (`RecordStreamLink`): read as the lines arrive, whatever the
  protocol's clock. Records timed by the wall clock (`get_system_time`) punctuate lulls as a
  live interface does; records timed by a field of their own punctuate up to the largest time
  seen. When the FIFO's writer closes it, the link waits for the next writer (standard input
  ends the link).
- a regular file of records timed by a field of their own (`RecordFileLink`): replayed once,
  paced at `--speed` times their own time, never re-timed (the time is a field the queries
  read). Its end ends the link: its queries' windows all close. A restart replays the file
  from its start, reading past what a resumed query has written already, so each window is
  written once. A file of wall-clock records is refused: every record would carry the time
  the server read it, and a restart would read them all again.
"""

from __future__ import annotations

import logging
import threading
import time

from capture.punctuation import LinkTimer
from capture.recordqueue import RecordQueue
from capture.source import FILE, classify, display_name
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError

log = logging.getLogger(__name__)

RING_ROWS = 1 << 20


class _RecordTotals:
    """A record link's reader counters, summed over the readers it opened."""

    def __init__(self):
        self.done: list = []
        self.current = None
        self.kernel_drops = 0

    def _all(self) -> list:
        return self.done + ([self.current] if self.current is not None else [])

    @property
    def malformed(self) -> int:
        return sum(int(s.malformed) for s in self._all())

    @property
    def reasons(self) -> dict:
        out: dict[str, int] = {}
        for s in self._all():
            for k, v in s.reasons.items():
                out[k] = out.get(k, 0) + int(v)
        return out

    @property
    def problems(self) -> list:
        return [p for s in self._all() for p in s.problems]

    def describe(self) -> str:
        return "; ".join(d for s in self._all() if (d := s.describe()))


class RecordProducer(threading.Thread):
    """What both kinds share: the queue, the timer ticks, the stop, the counters."""

    def __init__(self, name: str, path: str, fmt, timer: LinkTimer, *, period_ns: int,
                 separator: str | None, batch_size: int, ring_rows: int):
        super().__init__(name=f"oopscope-records-{name}", daemon=True)
        self.link, self.path, self.format = name, str(path), fmt
        self.timer, self.period_ns = timer, period_ns
        self.separator, self.batch_size = separator, batch_size
        self.ring = RecordQueue(ring_rows, name)
        self.stopping = threading.Event()
        #: set by the appliance once the queries it resumes are attached (a file link then
        #: reads past what they wrote: `skip_before`)
        self.go = threading.Event()
        self.skip_before: int | None = None
        self.error: BaseException | None = None
        #: the source is over for good: the router finishes the queries reading the link
        self.ended_input = False
        self.stats = _RecordTotals()
        self._next_tick = 0

    def _push(self, batch) -> None:
        if len(batch):
            self.ring.push(batch)
            self.timer.observe(int(batch["timestamp"].max()))

    def _tick(self, clock_ns: int | None) -> None:
        if time.monotonic_ns() < self._next_tick:
            return
        self._next_tick = time.monotonic_ns() + self.period_ns
        p = self.timer.fire(clock_ns)
        if p is not None:
            self.ring.punctuate(p)

    def run(self) -> None:
        try:
            while not self.go.wait(0.05):
                if self.stopping.is_set():
                    return
            self._read()
        except BaseException as exc:   # reported by status and the router
            self.error = exc
            log.error("link %s: reading records from %s failed: %s", self.link,
                      display_name(self.path), exc)
        finally:
            self.ring.finish()

    def _read(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        self.stopping.set()
        self.go.set()

    def close(self) -> None:
        pass


class RecordStreamLink(RecordProducer):
    """Records from a FIFO or standard input, read as they arrive (module docstring)."""

    def _read(self) -> None:
        from capture.records import open_records
        from capture.strings import StringTable

        strings = StringTable()          # one for the link's life: codes outlive a writer
        wall = self.format.system_clock
        while not self.stopping.is_set():
            reader = open_records(self.path, self.format, link=self.link,
                                  batch_size=self.batch_size, separator=self.separator,
                                  strings=strings, idle_batches=wall, stop=self._waiting)
            self.stats.current = reader.stats
            try:
                for batch in reader:
                    self._push(batch)
                    self._tick(time.time_ns() if wall else None)
            finally:
                reader.close()
                self.stats.done.append(reader.stats)
                self.stats.current = None
            if self.path == "-":
                self.ended_input = not self.stopping.is_set()
                return
            if not self.stopping.is_set():
                log.info("link %s: the writer of %s closed it; waiting for the next one",
                         self.link, self.path)


    def _waiting(self) -> bool:
        """The reader's wait for bytes asks this every slice: the lull's ticks are made here
        (before the first bytes too, when the reader hands on no empty batch)."""
        self._tick(time.time_ns() if self.format.system_clock else None)
        return self.stopping.is_set()


class RecordFileLink(RecordProducer):
    """A file of records timed by their own field, replayed once, paced (module docstring)."""

    def __init__(self, *args, speed: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.speed = float(speed)

    def _read(self) -> None:
        from tools.pipeline.replay import FileLink

        link = FileLink(self.link, self.path, self.batch_size, prefetch=0, record=self.format,
                        separator=self.separator, skip_before=self.skip_before,
                        stop=self.stopping.is_set)
        self.stats.current = link.stats
        try:
            t0 = link.head()
            if t0 is None:
                self.ended_input = True
                return
            w0 = time.time_ns()
            if link.skipped:
                log.info("link %s: %d records before %d ns read past (written before the "
                         "restart)", self.link, link.skipped, self.skip_before)
            while not self.stopping.is_set():
                due = t0 + int((time.time_ns() - w0) * self.speed)   # record time due now
                batch = link.take_until(due + 1)
                if batch is not None and len(batch):
                    # a busy link punctuates on time too, from what it has pushed (more may
                    # be due: the clock's slack could pass records still to come)
                    self._push(batch)
                    self._tick(None)
                    continue
                self._tick(due)
                head = link.head()
                if head is None:
                    self.ended_input = not self.stopping.is_set()
                    log.info("link %s: the end of %s (%d records)", self.link, self.path,
                             link.stats.records)
                    return
                wake = w0 + (head - t0) / self.speed
                self.stopping.wait(max(0.0, min((wake - time.time_ns()) / NS, 0.05)))
        finally:
            link.close()


def open_record_links(records, schema, *, period_ns: int, slack_ns: int, speed: float,
                      separator: str | None) -> dict:
    """The producers of `records` ((name, protocol, path)), not started (the appliance
    starts them, then lets them read once its resumed queries are attached: `go`)."""
    out: dict[str, RecordProducer] = {}
    for name, protocol, path in records:
        fmt = record_format(schema, name, protocol, path)
        kind, _ = classify(path)
        timer = LinkTimer(0, slack_ns)
        if kind == FILE:
            out[name] = RecordFileLink(name, path, fmt, timer, speed=speed,
                                       period_ns=period_ns, separator=separator,
                                       batch_size=8192, ring_rows=RING_ROWS)
        else:
            out[name] = RecordStreamLink(name, path, fmt, timer, period_ns=period_ns,
                                         separator=separator, batch_size=8192,
                                         ring_rows=RING_ROWS)
    return out


def record_format(schema, name: str, protocol: str, path: str):
    """The record format of link `name` (RunConfigError naming the option when the protocol
    is not a record protocol of the server's schema, or the path cannot carry its records)."""
    opt = f"--records {name}={protocol}:{path}"
    try:
        proto = schema.protocol(protocol)
    except KeyError:
        declared = [n for n in schema.names() if schema.is_record(n)]
        raise RunConfigError(f"{opt}: no protocol {protocol} in the server's schema "
                             f"(--schema); its record protocols are "
                             f"{', '.join(declared) or 'none: give --schema FILE'}") from None
    fmt = schema.record_format(proto.name)
    if fmt is None:
        raise RunConfigError(f"{opt}: {proto.name} is a packet protocol; a record link "
                             f"carries the records of a schema file's protocol")
    kind, why = classify(path)
    if kind is None:
        raise RunConfigError(f"{opt}: {display_name(path)}: "
                             f"{why.replace('capture file', 'record file')}")
    if kind == FILE and fmt.system_clock:
        raise RunConfigError(f"{opt}: {proto.name} records are timed by the wall clock when "
                             f"read (get_system_time), so a file of them would be stamped "
                             f"with the server's start and read again at a restart; give a "
                             f"FIFO (or -) its writer feeds")
    return fmt
