"""A NETFLOW link's reader: datagrams (from a capture file, or a UDP collector) decoded into
`capture.batch.RecordBatch`es of flow records, released as they are decoded, each batch
carrying the link's punctuation.

Each (exporter, observation domain) is a sub-link: its records arrive in order of flow end,
disordered on flow start by up to the exporter's active timeout (a router purges its cache
in blocks). The link's clock is the field its queries window on (`RecordFormat.clock`):
`first` (flow start) or `last` (flow end). A sub-link's punctuation is the export time of its
latest datagram minus a lag: for `first` the active timeout (the operator's for that exporter,
`exporter_timeouts_ns`, else the exporter's own, learned from its options, else the operator's
for all, `active_timeout_ns`); for `last` the idle timeout when known
(`idle_timeout_ns`, or the exporter's `flowIdleTimeout`: a flow leaves the cache at most that
long after its last packet), else the active timeout too (a flow ends after it starts). Taking
the export time itself would hold for records ordered by flow end; softflowd's end-of-capture
dump is not (368 of its 394 records of skype.pcap end before the export time of the datagram
before theirs), so the lag is what makes the punctuation safe.

A served link's queries may window on either clock at once: its reader then melds both
(`clocks`, a `FlowMeld` each) and each batch carries the punctuation on both
(`RecordBatch.punctuations`; `tools.pipeline.flowlinks` stamps a lane per clock with it).

The link melds its sub-links OOP-style (`FlowMeld`): its punctuation is the smallest of those
of the sub-links heard from within their active timeout, each extrapolated by the time it
has been silent on our clock less the lull slack (`lull_slack_ns`, `--lull-slack`: its next
datagram cannot be exported earlier, give or take the datagrams' delays), so that a
silent exporter holds no window back, and a link whose every exporter is silent still
punctuates by the wall clock (a collector) and closes its last windows. Records are never
held: a batch goes to the low level as decoded, disordered, and its punctuation after it;
the low level's tables (keyed by window) close windows on that punctuation, as for packet
links. A record whose clock is below the punctuation already given is late: counted
(`FlowReaderStats.late`), and the low level counts or corrects it as for packets. Memory is
the low level's open windows, not the active timeout's records.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capture.batch import RecordBatch
from capture.flowdecode import FLOW_COLUMNS, FlowDecoder, FlowStats, sample_datagrams
from capture.flowsource import Datagrams, UdpCollector, read_datagrams
from capture.recordsource import RecordError, field_columns
from capture.schema import RecordFormat

log = logging.getLogger(__name__)

#: the active timeout assumed for exporters that do not send theirs (softflowd, Cisco: 30 min)
DEFAULT_ACTIVE_TIMEOUT_NS = 30 * 60 * 10**9
#: datagrams decoded per kernel call when reading a capture
DATAGRAMS_PER_CALL = 512
#: a capture's datagrams are decoded (and the punctuation advanced) per this much capture time
PUNCTUATE_NS = 10**9


@dataclass
class FlowReaderStats(FlowStats):
    """The decoder's counts plus the records released late (what the run summary reads): on
    the reader's clock (`late`) and on each clock it punctuates (`late_by_clock`)."""

    late: int = 0
    problems: list | None = None
    late_by_clock: dict | None = None
    #: a collector's datagrams dropped by the kernel at its socket (buffer full; None: not
    #: a collector) and by its own queue (`capture.flowsource.UdpCollector`)
    socket_drops: int | None = None
    queue_drops: int = 0

    def __post_init__(self) -> None:
        if self.problems is None:
            self.problems = []

    @property
    def packets(self) -> int:        # the name generic progress code reads
        return self.records

    @property
    def notes(self) -> str:
        """`13 datagrams (v9: 13), 0 sequence gaps, 0 late records` for the run summary."""
        versions = ", ".join(f"v{v}: {n}" for v, n in sorted(self.versions.items()))
        gaps = ", ".join(f"{e}/{d}: {n}" for (e, d), n in self.gaps.items())
        drops = "" if self.socket_drops is None else (
            f", {self.socket_drops} datagrams dropped at the socket (its buffer full), "
            f"{self.queue_drops} by the collector's queue")
        return (f"{self.datagrams} datagrams ({versions or 'none'}), {self.sequence_gaps} "
                f"sequence gaps{f' ({gaps})' if gaps else ''}, {self.late} late records"
                + drops)


def exporter_key(text: str) -> str:
    """An exporter's address as the sub-links are keyed (`192.0.2.1`, `2001:db8::1`): the
    canonical text, an IPv4-mapped IPv6 address as its IPv4 (a dual-stack socket's view);
    ValueError when `text` is no IP address."""
    ip = ipaddress.ip_address(text.strip().strip("[]"))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class FlowMeld:
    """The link's punctuation on its clock, melded over the sub-links (module docstring);
    owns the punctuation given so far and the count of late records."""

    def __init__(self, active_timeout_ns: int = DEFAULT_ACTIVE_TIMEOUT_NS,
                 clock: str = "first", idle_timeout_ns: int | None = None,
                 lull_slack_ns: int = 0,
                 exporter_timeouts_ns: Mapping[str, int] | None = None):
        self.active_timeout_ns = int(active_timeout_ns)
        #: the operator's active timeout of some exporters (their address, `exporter_key`):
        #: above the exporter's own, which may be wrong (a router's option template saying
        #: 30 min while it purges every minute)
        self.exporter_timeouts_ns = {exporter_key(e): int(t)
                                     for e, t in (exporter_timeouts_ns or {}).items()}
        self._keys: dict[str, str | None] = {}
        #: a silence is carried forward less this (datagrams' delays differ by up to it)
        self.lull_slack_ns = int(lull_slack_ns)
        self.idle_timeout_ns = None if idle_timeout_ns is None else int(idle_timeout_ns)
        self.clock = clock
        self.given: int | None = None     # the punctuation given so far (increasing)
        self.late = 0

    def _timeouts(self, decoder: FlowDecoder, exporter: str, domain: int) -> tuple[int, int]:
        """(active timeout, lag of the clock) of a sub-link, ns."""
        def option(name: str, default: int | None) -> int | None:
            s = decoder.templates.option(exporter, domain, name)
            # an exporter's own timeout, when sane (a day at most)
            return s * 10**9 if s and s <= 86400 else default

        active = self._operators(exporter)
        if active is None:
            active = option("active_timeout_s", self.active_timeout_ns)
        assert active is not None
        if self.clock != "last":
            return active, active
        idle = option("idle_timeout_s", self.idle_timeout_ns)
        return active, active if idle is None else min(idle, active)

    def _operators(self, exporter: str) -> int | None:
        """The operator's active timeout of `exporter` (None: none given for it)."""
        if not self.exporter_timeouts_ns:
            return None
        key = self._keys.get(exporter, "")
        if key == "":
            try:
                key = exporter_key(exporter)
            except ValueError:
                key = None
            self._keys[exporter] = key
        return None if key is None else self.exporter_timeouts_ns.get(key)

    def punctuation(self, decoder: FlowDecoder, now: int | None = None) -> int | None:
        """The meld's punctuation at `now` (our clock, ns; default: the latest arrival), or
        None before any datagram."""
        latest = decoder.latest_export
        if not latest:
            return None
        # silence is measured on our clock (arrival), the punctuation on the exporter's own
        # (export time): exporters' clocks differ
        arrived = decoder.latest_arrival
        if now is None:
            now = max(arrived.values())
        heard: list[int] = []
        silent: list[int] = []
        for (exporter, domain), t in latest.items():
            active, lag = self._timeouts(decoder, exporter, domain)
            quiet = max(0, now - arrived[(exporter, domain)])
            # the next datagram of a sub-link silent this long is exported that much later
            # (less the slack: its delay on the way may be longer than the last one's)
            mark = t + max(0, quiet - self.lull_slack_ns) - lag
            (heard if quiet <= active else silent).append(mark)
        # an exporter silent for longer than its timeout holds nothing back; when every one
        # is, the link's punctuation goes on with the wall clock
        return max(min(heard) if heard else max(silent), -(1 << 62))

    def admit(self, clock: np.ndarray) -> None:
        """Count the records (their clock) below the punctuation given already: late."""
        if self.given is not None and len(clock):
            self.late += int(np.count_nonzero(clock < self.given))

    def advance(self, p: int | None) -> int | None:
        """Give punctuation `p` when it advances; the punctuation given so far."""
        if p is not None and (self.given is None or p > self.given):
            self.given = p
        return self.given


def _no_records(names) -> dict[str, np.ndarray]:
    """No record, in the columns `names` (of FLOW_COLUMNS)."""
    return {name: np.zeros(0, dtype) for name, dtype in FLOW_COLUMNS if name in names}


def collector_address(source: str) -> tuple[str, int] | None:
    """(host, port) when `source` names a UDP collector (`HOST:PORT`, `[V6]:PORT`) rather
    than an existing file, else None."""
    from pathlib import Path

    if Path(source).exists():
        return None
    host, sep, port = source.rpartition(":")
    if not sep or not port.isdigit() or not host or int(port) > 65535:
        return None
    return host.strip("[]"), int(port)


class FlowReader:
    """Iterate over the flow records of a capture file of exported datagrams (UDP payloads
    to any port, or to `port`), or of a UDP collector (`HOST:PORT`: a stream, ended by
    `stop`), as `RecordBatch`es as decoded (module docstring); a file's datagrams are taken
    in capture order, DATAGRAMS_PER_CALL at a time. The last batch of a decode carries the
    link's punctuation (`RecordBatch.punctuation`, on the batch's clock: valid once the
    batch is processed; also `punctuation` here); a batch may be empty, carrying only an
    advance of it. With `idle_batches` a collector hands on an empty batch for every quiet
    slice (0.1 s), so that a caller never blocks for long."""

    WHAT = "flow records"

    def __init__(self, path, fmt: RecordFormat, link: str | None = None,
                 batch_size: int = 65536, *, port: int | None = None,
                 active_timeout_ns: int = DEFAULT_ACTIVE_TIMEOUT_NS,
                 idle_timeout_ns: int | None = None, lull_slack_ns: int = 10**9,
                 exporter_timeouts_ns: Mapping[str, int] | None = None,
                 decoder: FlowDecoder | None = None, stop=None, state_path=None,
                 clocks: tuple[str, ...] = (), columns=None, **_options):
        self.path = str(path)
        self.link = link if link is not None else Path(path).stem
        self.format = fmt
        self.batch_size = batch_size
        self.idle_batches = False
        #: where the templates and options are kept across restarts (a resumable run's
        #: checkpoint), so that a restarted collector decodes at once
        self._state_path = None if state_path is None else Path(state_path)
        if decoder is None:
            decoder = self._load_state() or FlowDecoder()
        decoder.wide = True
        self.decoder = decoder
        self._saved = self.decoder.templates.revision
        self.decoder.stats = FlowReaderStats()
        #: the field records are timed and punctuated by: what the queries window on
        self.clock = fmt.clock if fmt.clock in ("first", "last") else "first"
        #: a meld per clock punctuated: the reader's own, and `clocks` (a served link's
        #: queries may window on either: each batch carries the punctuation of every one,
        #: `RecordBatch.punctuations`); a meld costs a pass over the sub-links per decode
        self.melds = {c: FlowMeld(active_timeout_ns, c, idle_timeout_ns, lull_slack_ns,
                                  exporter_timeouts_ns)
                      for c in dict.fromkeys((self.clock, *clocks))}
        self.meld = self.melds[self.clock]
        #: the record-batch columns read by the link's queries (None: all of them): the
        #: decoder makes those and what the punctuation and the batches' own columns need
        self._columns = None if columns is None else frozenset(columns)
        if self._columns is not None:
            self.decoder.project({"first", "arrival", *self.melds, *self._columns})
        self._stop = stop
        self._closed = False
        address = collector_address(self.path)
        self.stream = address is not None
        self._collector: UdpCollector | None = None
        self._datagrams = Datagrams()
        if address is not None:
            FlowDecoder.warm()               # before the socket fills (FlowDecoder.warm)
            try:
                self._collector = UdpCollector(*address)
            except OSError as exc:
                raise RecordError(f"{self.path}: cannot receive NetFlow there: {exc}") from None
            log.info("link %s: collecting NetFlow/IPFIX on UDP %s", self.link, self.path)
        else:
            self._datagrams = read_datagrams(path, port)

    @property
    def stats(self) -> FlowReaderStats:
        s = self.decoder.stats
        assert isinstance(s, FlowReaderStats)
        s.late = self.meld.late
        s.late_by_clock = {c: m.late for c, m in self.melds.items()}
        if self._collector is not None:
            s.socket_drops = self._collector.kernel_drops
            s.queue_drops = self._collector.dropped
        return s

    @property
    def punctuation(self) -> int | None:
        """The link's punctuation given with the batches handed on so far (None: none)."""
        return self.meld.given

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._closed = True
        if self._collector is not None:
            self._collector.close()

    def _load_state(self) -> FlowDecoder | None:
        import json

        if self._state_path is None or not self._state_path.exists():
            return None
        try:
            dec = FlowDecoder.from_state(json.loads(self._state_path.read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("link %s: the saved templates in %s cannot be read (%s); waiting for "
                        "the exporters to send them again", self.link, self._state_path, exc)
            return None
        log.info("link %s: %d templates known from the run's state", self.link,
                 len(dec.templates))
        return dec

    def _save_state(self) -> None:
        """Write the decoder's state when its templates or options changed (atomically)."""
        import json
        import os

        if self._state_path is None or self.decoder.templates.revision == self._saved:
            return
        self._saved = self.decoder.templates.revision
        tmp = self._state_path.with_suffix(".tmp")
        try:
            self._state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.decoder.state()))
            os.replace(tmp, self._state_path)
        except OSError as exc:
            log.warning("link %s: cannot save the templates to %s: %s", self.link,
                        self._state_path, exc)

    def _stopped(self) -> bool:
        return self._closed or (self._stop is not None and self._stop())

    def __iter__(self):
        if self._collector is not None:
            yield from self._collect()
            return
        dg = self._datagrams
        # a call per second of capture time (at most DATAGRAMS_PER_CALL datagrams): the
        # punctuation advances as the datagrams arrived, as it would have live
        second = np.asarray(dg.arrivals, np.int64) // PUNCTUATE_NS
        cuts = np.flatnonzero(np.diff(second) != 0) + 1
        edges = sorted({0, len(dg), *cuts.tolist(),
                        *range(0, len(dg), DATAGRAMS_PER_CALL)})
        for start, stop in zip(edges, edges[1:]):
            if self._closed:
                return
            cols = self.decoder.decode(dg.payloads[start:stop], dg.exporters[start:stop],
                                       dg.arrivals[start:stop])
            yield from self._release(cols, None)
        self.decoder.drop_pending()

    def _collect(self):
        """A collector's records until `stop` says so, then those of the datagrams it had
        received (queued behind the decoder: a burst, or a busy machine), so that a datagram
        received is decoded or counted, never lost at the stop."""
        assert self._collector is not None
        while not self._stopped():
            blob, lengths, exporters, arrivals = self._collector.receive_joined(0.1)
            if not len(lengths):
                # a quiet slice: the punctuation goes on by the wall clock
                given = self._given()
                p = self._advance(time.time_ns())
                if self.idle_batches or p != given:
                    yield self._batch(_no_records(self.decoder.produces), p)
                continue
            yield from self._joined(blob, lengths, exporters, arrivals)
        while not self._closed:
            blob, lengths, exporters, arrivals = self._collector.receive_joined(0)
            if not len(lengths):
                break
            yield from self._joined(blob, lengths, exporters, arrivals)
        self.decoder.drop_pending()

    def _joined(self, blob, lengths, exporters, arrivals):
        cols = self.decoder.decode_joined(blob, lengths, exporters, arrivals)
        self._save_state()
        # silence is measured up to the latest datagram handled, not the wall clock: a
        # backlog in the collector's queue is no silence of the exporters
        yield from self._release(cols, max(arrivals))

    def _release(self, cols: dict[str, np.ndarray], now: int | None):
        """The batches of records just decoded, the last with the punctuation after them."""
        for clock, meld in self.melds.items():
            meld.admit(cols[clock])
        given = self._given()
        p = self._advance(now)
        n = len(cols["first"])
        if not n:
            if p != given:
                yield self._batch(cols, p)
            return
        for a in range(0, n, self.batch_size):
            last = a + self.batch_size >= n
            yield self._batch({k: v[a:a + self.batch_size] for k, v in cols.items()},
                              p if last else given)

    def _given(self) -> dict[str, int | None]:
        """The punctuation given so far on each clock."""
        return {c: m.given for c, m in self.melds.items()}

    def _advance(self, now: int | None) -> dict[str, int | None]:
        """Each clock's punctuation at `now` (see `FlowMeld.punctuation`), given."""
        return {c: m.advance(m.punctuation(self.decoder, now)) for c, m in self.melds.items()}

    def sample_batch(self) -> RecordBatch:
        """A batch of two made-up records (one would make matrices of a layout of their
        own to the kernels), of the columns and types this reader hands on (its own state
        untouched): what warms the link's operators before its first datagram
        (`lowlevel.operator.LowLevelOperator.warm`)."""
        dec = FlowDecoder(wide=True)
        dec.project(self.decoder.produces)
        return self._batch(dec.decode(list(sample_datagrams()), ["192.0.2.1"] * 2, [0, 1]),
                           self._given())

    def _batch(self, cols: dict[str, np.ndarray],
               punctuations: dict[str, int | None]) -> RecordBatch:
        m = len(cols["first"])
        # `arrival` (ns, capture time or ours): what a replay paces and interleaves links by
        out = {"timestamp": cols[self.clock], "arrival": cols["arrival"],
               "len": np.zeros(m, np.uint32),
               "layers": np.zeros(m, np.uint16), "reason": np.zeros(m, np.uint8)}
        if self._columns is None or "time_s" in self._columns:
            out["time_s"] = (cols["first"] // 10**9).astype(np.uint64)
        for f in self.format.fields:
            for c in field_columns(f):
                if c not in out and c in cols:
                    v = cols[c]
                    # a no-op for the decoder's wide columns (`FlowDecoder.wide`); first and
                    # last are shared with the lanes, which stamp their records with them
                    out[c] = v.astype(np.int64 if f.type in ("llong", "int") else np.uint64,
                                      copy=False)
        return RecordBatch(self.link, out, np.arange(m, dtype=np.int64), False,
                           punctuation=punctuations[self.clock], punctuations=punctuations)

