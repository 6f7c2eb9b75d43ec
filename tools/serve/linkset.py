"""The appliance's own links for its whole life: opened, routed to the queries, their clocks."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tools.errors import RunConfigError

if TYPE_CHECKING:
    from tools.pipeline.links import LinkRouter, ServedLink
    from tools.serve.config import ServeConfig
    from tools.serve.submission import Submission


#: where a NETFLOW collector keeps its templates, below the state directory's `run/` (a
#: name no query's can be: query names never start with a dot)
FLOW_STATE = ".netflow"


class LinkSet:
    """The links the server captures itself (live interfaces, capture files replayed paced
    and re-timed to the wall clock, record links: `tools.pipeline.links`) and the router that
    runs the attached queries' low-level operators on them. It attaches and detaches a
    submission's feeds (on the router's thread), says what time it is on its links (the
    latest packet seen, or the wall clock), which links are timed by their records' own
    field, and when their punctuation reached a time."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self._links: dict[str, ServedLink] = {}
        self._router: LinkRouter | None = None

    def __iter__(self) -> Iterator[ServedLink]:
        return iter(self._links.values())

    def __contains__(self, name: object) -> bool:
        return name in self._links

    def check(self, schema) -> None:
        """RunConfigError unless the configuration's links can be opened (`schema`: the one
        the server's schema files make, declaring the record links' protocols)."""
        config = self.config
        if config.fanout > 1 and (config.links or not config.interfaces):
            raise RunConfigError(f"--fanout {config.fanout} splits live interfaces over "
                                 f"capture processes: give --interface NAME=IFACE (a capture "
                                 f"file, --link, is read by one)")
        names = config.link_names
        if not names and not config.spool:
            raise RunConfigError("give at least one link: --interface NAME=IFACE or "
                                 "--link NAME=PCAP (or --spool DIR for agents' links)")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise RunConfigError(f"link {', '.join(dup)} is given twice")
        for name, path in config.links:
            if not Path(path).is_file():
                raise RunConfigError(f"--link {name}={path}: no such capture file")
        from tools.pipeline.recordlinks import record_format

        for name, protocol, path in config.records:
            record_format(schema, name, protocol, path)
        from tools.pipeline.flowlinks import check_flow_source

        for name, source in config.netflow:
            check_flow_source(name, source)
        if config.speed <= 0:
            raise RunConfigError("--speed must be positive")

    def open(self, schema, fanned: bool,
             on_feed_error: Callable[[str, BaseException], None]) -> None:
        """Open and start the links (`fanned`: the interfaces are captured by the fanout
        members, not here) and the router; `on_feed_error(submission, exc)` when a
        submission's low level fails."""
        from tools.pipeline.links import LinkRouter, open_links

        cfg = self.config
        interfaces = () if fanned else cfg.interfaces
        self._links = open_links(cfg.links, interfaces, period_ns=cfg.punctuate_every_ns,
                                 slack_ns=cfg.lull_slack_ns, speed=cfg.speed, loop=cfg.loop,
                                 capture_options=cfg.capture_options, records=cfg.records,
                                 schema=schema, separator=cfg.csv_separator,
                                 netflow=cfg.netflow, flow_timeout_ns=cfg.flow_timeout_ns,
                                 flow_exporter_timeouts=cfg.flow_exporter_timeouts,
                                 flow_state=Path(cfg.state).resolve() / "run" / FLOW_STATE)
        self._router = LinkRouter(self._links)
        self._router.on_feed_error = on_feed_error
        self._router.start()

    def release(self, skip_before: Callable[[str], int | None]) -> None:
        """Let the record links read, now that the queries resumed on them are attached: a
        file link reads past the records before `skip_before(link)` (None: from its start),
        those of the windows they have written."""
        for link in self._links.values():
            producer = link.producer
            if getattr(producer, "go", None) is None:
                continue
            producer.skip_before = skip_before(link.name)
            producer.go.set()

    # --- clocks --------------------------------------------------------------------------------
    def now(self) -> int:
        """The wall clock, or the latest packet time seen on a wall-clock link if later."""
        seen = [link.timer.max_seen for link in self._links.values()
                if link.timer.max_seen is not None and not self.record_clock(link.name)]
        return max([time.time_ns(), *seen])

    def latest_seen(self, names: list[str], sub: Submission | None = None) -> list[int]:
        """The latest time read on each of the links `names` that has read one (on each
        clock `sub` windows a NETFLOW link on: `flow_clocks`)."""
        clocks = {} if sub is None else self.flow_clocks(sub)
        out = []
        for n in names:
            lanes = getattr(self._links[n].producer, "lanes", None)
            timers = [self._links[n].timer] if not clocks.get(n) or lanes is None else \
                [lanes[c].timer for c in clocks[n] if c in lanes]
            out += [t for timer in timers if (t := timer.max_seen) is not None]
        return out

    def flow_clocks(self, sub: Submission) -> dict[str, list[str]]:
        """The clocks (`first`, `last`) `sub`'s queries window each NETFLOW link on."""
        netflow = dict(self.config.netflow)
        out: dict[str, list[str]] = {}
        for qp in sub.plan.queries:
            for lp in qp.low:
                if lp.link in netflow and lp.record is not None and lp.record.clock:
                    clocks = out.setdefault(lp.link, [])
                    if lp.record.clock not in clocks:
                        clocks.append(lp.record.clock)
        return out

    def record_clock(self, name: str) -> bool:
        """Whether link `name` is timed by its records' own field (not the wall clock)."""
        link = self._links.get(name)
        fmt = getattr(link.producer, "format", None) if link is not None else None
        return fmt is not None and not fmt.system_clock

    def data_clock(self, sub: Submission) -> bool:
        """Whether `sub` reads links timed by their records' field (a file of records
        replayed, say): its start is then a time of that clock, not the wall clock's.
        RunConfigError when it mixes them with wall-clock links."""
        data = [n for n in sub.links if self.record_clock(n)]
        if data and len(data) < len(sub.links):
            wall = [n for n in sub.links if n not in data]
            raise RunConfigError(f"{sub.record.file}: links {', '.join(data)} are timed by "
                                 f"their records' own time and {', '.join(wall)} by the "
                                 f"wall clock; one query set reads links of one clock")
        return bool(data)

    def punctuated_at(self, links: list[str], p: int,
                      clocks: dict[str, list[str]] | None = None) -> int | None:
        """Wall ns at which every one of `links` (of these) had punctuated `p` (None: not
        yet), a NETFLOW link on each of its `clocks` (of a submission: `flow_clocks`)."""
        clocks = clocks or {}
        own: list[str | None] = [None]
        times = [self._links[n].punctuated_at(p, c) for n in links if n in self._links
                 for c in (clocks.get(n) or own)]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def punctuated_for(self, sub: Submission) -> Callable[[list[str], int], int | None]:
        """`punctuated_at` on the clocks `sub` windows its NETFLOW links on (its outputs'
        latency: the wall time their windows' punctuation reached the server)."""
        return lambda links, p: self.punctuated_at(links, p, self.flow_clocks(sub))

    # --- submissions ---------------------------------------------------------------------------
    def check_kinds(self, sub: Submission) -> None:
        """Every low-level plan reads its link as what the link carries: packets, or the
        records of the protocol the server was started with."""
        netflow = dict(self.config.netflow)
        for qp in sub.plan.queries:
            for lp in qp.low:
                link = self._links.get(lp.link)
                carried = getattr(link.producer, "format", None) if link is not None else None
                what = (f"{sub.record.file}: query {qp.name} reads link {lp.link} as "
                        f"{'records' if lp.record is not None else 'packets'} of "
                        f"{lp.protocol}")
                if lp.link in netflow:
                    if lp.record is None or lp.record.kind != "netflow":
                        raise RunConfigError(f"{what}, but the link carries NetFlow/IPFIX "
                                             f"flow records (serve --netflow-in): read it as "
                                             f"{lp.link}.NETFLOW")
                    # windowed on `first` or `last`: the link stamps and punctuates its
                    # records on each clock in use (`prepare`)
                    continue
                if carried is None and lp.record is not None and lp.record.kind == "netflow":
                    raise RunConfigError(f"{what}, but the link carries packets (a NETFLOW "
                                         f"link is started with serve --netflow-in "
                                         f"NAME=HOST:PORT|FILE.pcap)")
                if carried is None and lp.record is not None:
                    raise RunConfigError(f"{what}, but the link carries packets (a record "
                                         f"link is started with serve --records "
                                         f"NAME=PROTOCOL:PATH)")
                if carried is not None and (lp.record is None
                                            or lp.record.protocol != carried.protocol):
                    raise RunConfigError(f"{what}, but the link carries records of "
                                         f"{carried.protocol} (serve --records)")
                if carried is not None and lp.record != carried:
                    raise RunConfigError(f"{what} as its own schema file declares it; the "
                                         f"server reads {carried.protocol} as its --schema "
                                         f"declares it, with other fields")

    def prepare(self, sub: Submission) -> None:
        """Before `sub` is attached: a live link captures what it reads from now on
        (payloads, whole frames), so that its first window has them; a NETFLOW link stamps
        and punctuates its records on every clock `sub` windows it on (a lane each,
        `tools.pipeline.flowlinks`)."""
        self._want_lanes(sub)
        for link in sub.links:
            if link in self._links:
                self._links[link].refresh_capture(
                    also=[lp for qp in sub.plan.queries for lp in qp.low if lp.link == link])

    def _want_lanes(self, sub: Submission) -> None:
        """A NETFLOW link stamps and punctuates its records on every clock `sub` windows it
        on from now on (made again when it resumes: `attach`)."""
        for link, clocks in self.flow_clocks(sub).items():
            producer = self._links[link].producer if link in self._links else None
            if producer is not None and hasattr(producer, "want"):
                for clock in clocks:
                    producer.want(clock)

    def attach(self, sub: Submission, before=None) -> None:
        """`sub`'s feeds run on its links' packets from the router's next batch on; `before`
        (if given) runs on the router's thread first, with no batch routed in between."""
        def attach():
            self._want_lanes(sub)          # a resumed query's lanes (before its start)
            if before is not None:
                before()
            for link, feed in sub.feeds.items():
                self._links[link].feeds[sub.name] = feed
                self._links[link].refresh_capture()

        assert self._router is not None
        self._router.call(attach)

    def detach(self, sub: Submission) -> None:
        def detach():
            for link in sub.feeds:
                self._links[link].feeds.pop(sub.name, None)
                self._links[link].refresh_capture()

        assert self._router is not None
        self._router.call(detach)

    # --- life ----------------------------------------------------------------------------------
    def stats(self) -> list[dict]:
        """Each link's counters (`ServedLink.stats`)."""
        return [link.stats() for link in self._links.values()]

    def stop(self) -> None:
        """Stop capturing, and run what the rings hold through the feeds."""
        for link in self._links.values():
            link.producer.stop()
        for link in self._links.values():
            if getattr(link.producer, "releases_on_stop", False):
                # a NETFLOW collector queues the datagrams it received: they go through
                # before the queries close their windows
                link.producer.join(timeout=30)
        if self._router is not None:
            self._router.stop()
            self._router.join(timeout=10)
            self._router.drain_all()

    def close(self) -> None:
        """Wait for the producers (after `stop`) and close them."""
        for link in self._links.values():
            link.producer.join(timeout=5)
            link.producer.close()
