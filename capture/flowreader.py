"""A NETFLOW link's reader: datagrams (from a capture file, or a UDP collector) decoded into
`capture.batch.RecordBatch`es of flow records, released in order of flow start.

Each (exporter, observation domain) is a sub-link: its records arrive in order of flow end,
disordered on flow start by up to the exporter's active timeout (a router purges its cache
in blocks). Its punctuation for `first` is the export time of its latest datagram minus the
active timeout (`active_timeout_ns`, or the exporter's own, learned from its options). The
link melds its sub-links OOP-style: a record is released once the smallest punctuation of
the sub-links heard from within the last active timeout (by arrival time: the exporters' clocks differ) has
passed its `first` (an exporter silent for longer no longer holds the others back), in order of `first`, so the run's
windows on `first` close on punctuation rather than a fixed slack. A record that comes with
a `first` below what was released already is late: it is released at once and counted
(`FlowReaderStats.late`), and the low level counts or corrects it as for packets. The end of
the input releases every record held.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capture.batch import RecordBatch
from capture.flowdecode import FlowDecoder, FlowStats
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
    """The decoder's counts plus the records released late (what the run summary reads)."""

    late: int = 0
    problems: list | None = None

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
        return (f"{self.datagrams} datagrams ({versions or 'none'}), {self.sequence_gaps} "
                f"sequence gaps{f' ({gaps})' if gaps else ''}, {self.late} late records")


class FlowReorder:
    """The records held until the meld's punctuation passes their `first` (module
    docstring); owns the held columns."""

    def __init__(self, active_timeout_ns: int = DEFAULT_ACTIVE_TIMEOUT_NS):
        self.active_timeout_ns = int(active_timeout_ns)
        self._held: dict[str, np.ndarray] | None = None
        self.released_to: int | None = None       # every record with first < this is out
        self.late = 0

    def punctuation(self, decoder: FlowDecoder) -> int | None:
        """The meld's punctuation for `first` now (None before any datagram)."""
        latest = decoder.latest_export
        if not latest:
            return None
        # silence is measured on our clock (arrival), the punctuation on the exporter's own
        # (export time): exporters' clocks differ
        arrived = decoder.latest_arrival
        newest = max(arrived.values())
        marks = []
        for (exporter, domain), t in latest.items():
            timeout_s = decoder.templates.option(exporter, domain, "active_timeout_s")
            # an exporter's own timeout, when sane (a day at most)
            timeout = timeout_s * 10**9 if timeout_s and timeout_s <= 86400 \
                else self.active_timeout_ns
            if newest - arrived[(exporter, domain)] <= timeout:   # silent longer: no hold
                marks.append(t - timeout)
        return max(min(marks), -(1 << 62))

    def flush(self) -> dict[str, np.ndarray] | None:
        """Every record held, in order of `first` (the input ended)."""
        if self._held is None:
            return None
        return self.push({k: v[:0] for k, v in self._held.items()}, None, final=True)

    def push(self, cols: dict[str, np.ndarray], punctuation: int | None,
             final: bool = False) -> dict[str, np.ndarray] | None:
        """Hold `cols`; the records now released, in order of `first` (None: none)."""
        if self._held is None:
            self._held = cols
        elif len(cols["first"]):
            self._held = {k: np.concatenate([v, cols[k]]) for k, v in self._held.items()}
        held = self._held
        first = held["first"]
        if not len(first):
            return None
        if final:
            out = np.ones(len(first), bool)
        else:
            bound = -(1 << 63) if punctuation is None else punctuation
            if self.released_to is not None:
                bound = max(bound, self.released_to)
            out = first < bound
            # late: below what was released already (released now, out of order)
            if self.released_to is not None:
                self.late += int(np.count_nonzero(first < self.released_to))
        if not out.any():
            return None
        idx = np.flatnonzero(out)
        idx = idx[np.argsort(first[idx], kind="stable")]
        released = {k: v[idx] for k, v in held.items()}
        self._held = {k: v[~out] for k, v in held.items()}
        if not final and punctuation is not None:
            self.released_to = max(self.released_to or punctuation, punctuation)
        return released


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
    `stop`), as `RecordBatch`es released by punctuation (module docstring); a file's
    datagrams are taken in capture order, DATAGRAMS_PER_CALL at a time."""

    WHAT = "flow records"

    def __init__(self, path, fmt: RecordFormat, link: str | None = None,
                 batch_size: int = 65536, *, port: int | None = None,
                 active_timeout_ns: int = DEFAULT_ACTIVE_TIMEOUT_NS,
                 decoder: FlowDecoder | None = None, stop=None, state_path=None,
                 **_options):
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
        self.decoder = decoder
        self._saved = self.decoder.templates.revision
        self.decoder.stats = FlowReaderStats()
        self.reorder = FlowReorder(active_timeout_ns)
        self._stop = stop
        self._closed = False
        address = collector_address(self.path)
        self.stream = address is not None
        self._collector: UdpCollector | None = None
        self._datagrams = Datagrams()
        if address is not None:
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
        s.late = self.reorder.late
        return s

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
            out = self.reorder.push(cols, self.reorder.punctuation(self.decoder))
            if out is not None:
                yield from self._batches(out)
        yield from self._release_held()

    def _collect(self):
        """A collector's records until `stop` says so (then every record held)."""
        assert self._collector is not None
        while not self._stopped():
            dg = self._collector.receive(0.1)
            if not len(dg):
                continue
            cols = self.decoder.decode(dg.payloads, dg.exporters, dg.arrivals)
            self._save_state()
            out = self.reorder.push(cols, self.reorder.punctuation(self.decoder))
            if out is not None:
                yield from self._batches(out)
        yield from self._release_held()

    def _release_held(self):
        """At the end of the input: the sets still waiting for a template are counted, and
        every record held is released."""
        self.decoder.drop_pending()
        out = self.reorder.flush()
        if out is not None:
            yield from self._batches(out)

    def _batches(self, cols: dict[str, np.ndarray]):
        n = len(cols["first"])
        for a in range(0, n, self.batch_size):
            yield self._batch({k: v[a:a + self.batch_size] for k, v in cols.items()})

    def _batch(self, cols: dict[str, np.ndarray]) -> RecordBatch:
        m = len(cols["first"])
        out = {"timestamp": cols["first"], "len": np.zeros(m, np.uint32),
               "layers": np.zeros(m, np.uint16), "reason": np.zeros(m, np.uint8),
               "time_s": (cols["first"] // 10**9).astype(np.uint64)}
        for f in self.format.fields:
            for c in field_columns(f):
                if c not in out:
                    v = cols[c]
                    out[c] = v.astype(np.int64 if f.type in ("llong", "int") else np.uint64)
        return RecordBatch(self.link, out, np.arange(m, dtype=np.int64), True)

