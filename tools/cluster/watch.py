"""`oopscope agent` without a query file: an agent that watches the shared directory for the
work an appliance gives it (`oopscope serve --spool SHARED`).

The agent keeps its links open for its whole life, as the appliance does
(`tools.pipeline.links`: a capture file is replayed paced, stamped with the wall clock and, with
`--loop`, looped; an interface is captured live), with one router thread running whatever
low-level operators are attached to each link. It beats as any agent
(`tools.pipeline.heartbeat`), its beat adding the work items it runs, and every `poll_s` it
reads the work items (`tools.cluster.work`):

- a `running` item naming one of its links: the item's query text is planned as the server
  planned it (same links, parameters and overrides), and the low-level operators of its
  links are attached between two batches, writing partial rows and punctuation into the
  item's spool (packets before the item's first window held back, a pane's rows written when
  its punctuation closes it);
- an item of its that is `cancelled` or gone: its operators are detached, flushed and
  punctuate end of input, so every open window closes at the server.

A member of a fanout group (`--fanout-member K/N/GROUP`, started by `oopscope serve --fanout
N`: `tools.pipeline.fanout`) captures its one interface through its own socket of the group
and offers its share as the sub-link `NAME#K`. A work item names such sub-links among its
links (`Submission.spool_links`): the item's text is planned over the links themselves, its
stages' fanout (`highlevel.graph.StageGraph(fanout=...)`) counted from the sub-links, and the
member runs the low level of its own sub-link.

Stopped (SIGTERM, Ctrl-C), the agent detaches everything *without* end-of-input punctuation:
its links fall silent at the server, which closes windows without them, and an agent started
again under the same host id attaches again (its links' windows from there on are whole).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import os_error_text
from common.units import NS_PER_S as NS
from tools.cluster.work import RUNNING, WorkItem, read_work
from tools.errors import RunConfigError
from tools.pipeline.fanout import Member
from tools.pipeline.heartbeat import Heartbeat, check_host_id
from tools.pipeline.tablesizes import TableLog, agent_tables

if TYPE_CHECKING:
    from tools.pipeline.links import LinkRouter

log = logging.getLogger(__name__)

#: how often the agent reads the work items
POLL_S = 0.5


@dataclass(frozen=True)
class WatchConfig:
    spool: str
    host_id: str
    links: tuple[tuple[str, str], ...] = ()          # (name, capture file) replayed
    interfaces: tuple[tuple[str, str], ...] = ()     # (name, interface) live
    speed: float = 1.0
    loop: bool = False
    punctuate_every_ns: int = NS
    lull_slack_ns: int = NS
    capture_options: tuple[tuple[str, object], ...] = ()
    duration_ns: int | None = None
    poll_s: float = POLL_S
    #: one member of a fanout group: its one interface offered as the sub-link NAME#K
    member: Member | None = None


class WatchBeat(Heartbeat):
    """An agent's heartbeat with the work items it runs (`work`: name -> report)."""

    work: dict = {}

    def payload(self) -> dict:
        return {**super().payload(), "queries": sorted(self.work), "work": self.work,
                "watch": True}


class Work:
    """One work item running on this agent: its operators per link and their spool queue."""

    def __init__(self, item: WorkItem, links: list[str], tables: TableLog | None = None):
        from common.spool import last_punctuations
        from highlevel.graph import StageGraph, split_sublinks
        from tools.pipeline.config import QuerySummary, plan_text
        from tools.pipeline.feeds import AttachedFeed, OperatorFeed, SpoolQueue
        from tools.pipeline.windows import first_window_start

        self.item = item
        self.links = list(links)
        self.error: str | None = None
        names, fanout = split_sublinks(item.links)
        schema = None
        if any(item.schemas):
            from queries.schemafile import layered_schema

            schema = layered_schema([[tuple(f) for f in layer] for layer in item.schemas])
        plan = plan_text(item.text, item.file, names, dict(item.params),
                         dict(item.sets), subset=True, schema=schema)
        spool = Path(item.spool)
        spool.mkdir(parents=True, exist_ok=True)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="oopscope-agent-") as unused:
            graph = StageGraph(plan, list(item.queries), spool, unused, sinks={},
                               fanout=fanout)
            low = [lp for lp in graph.low_plans() if lp.link in self.links]
        if not low:
            raise RunConfigError(f"query {item.name}: no low-level operator reads "
                                 f"{', '.join(self.links)}")
        self.summaries = {q: QuerySummary(q, "(spool)", "spool")
                          for q in {graph.query_of(lp) for lp in low}}
        # an agent started again over an item it ran: its spool holds the panes its last
        # punctuation closed; the packets since are gone, so its link starts again at the
        # next window (the windows between have none of its rows)
        self.start_ns = item.start_ns
        done = {q: last_punctuations(spool, q) for q in {lp.query for lp in low}}
        if any(lp.link in done[lp.query] for lp in low):
            chosen = [plan.query(q) for q in item.queries]
            self.start_ns = max(item.start_ns,
                                first_window_start(chosen, time.time_ns() + NS // 5))
            log.warning("query %s: continuing its spool on %s from the window at %d ns; the "
                        "windows before have none of this agent's rows since it stopped",
                        item.name, ", ".join(self.links), self.start_ns)
        self.spool_queue = SpoolQueue()
        per_link: dict[str, list] = {}
        for lp in low:
            # sized per query: its tables start where they were when this agent last ran
            # the query (`tools.pipeline.tablesizes`)
            feed = OperatorFeed(lp, spool, self.summaries[graph.query_of(lp)], "snappy",
                                punctuation_flush=True, complete_only=True,
                                start_slots=tables.slots(lp.query, lp.link) if tables
                                else None,
                                on_resize=tables.note if tables else None)
            feed.spool_queue = self.spool_queue
            per_link.setdefault(lp.link, []).append(feed)
        self.feeds = {link: AttachedFeed(fs, self.start_ns) for link, fs in per_link.items()}
        self.attached_ns: int | None = None

    @property
    def key(self) -> tuple[str, int]:
        return self.item.key

    def report(self) -> dict:
        return {"generation": self.item.generation, "links": self.links,
                "state": "failed" if self.error else "running", "error": self.error,
                "start_ns": self.start_ns, "attached_ns": self.attached_ns,
                "partial_rows": sum(s.partial_rows for s in self.summaries.values()),
                # its tables' slots now (the server adds them to the query's)
                "slots": sum(int(f.op.engine.slots) for af in self.feeds.values()
                             for f in af.feeds if f.op.engine is not None),
                "before_start_packets": sum(f.before_start for f in self.feeds.values())}

    def finish(self) -> None:
        """Every operator flushes and punctuates end of input (after it was detached)."""
        for feed in self.feeds.values():
            feed.finish()
        self.close()

    def close(self) -> None:
        try:
            self.spool_queue.flush()
        finally:
            self.spool_queue.close()


class Watcher:
    """The watching agent (module docstring): links, router, heartbeat, work."""

    def __init__(self, config: WatchConfig):
        self.config = config
        self.host = check_host_id(config.host_id)
        self.shared = Path(config.spool)
        self.links: dict = {}
        self.router: LinkRouter | None = None
        self.beat: WatchBeat | None = None
        self.running: dict[str, Work] = {}            # by query name
        self.failed: dict[tuple[str, int], str] = {}  # items that could not start here
        #: its tables' sizes per query, kept across restarts (`tools.pipeline.tablesizes`)
        self.tables = TableLog(agent_tables(self.shared, self.host), resumed=True)
        self._lock = threading.Lock()

    def start(self) -> None:
        from tools.pipeline.links import LinkRouter, open_links

        cfg = self.config
        names = [n for n, _ in cfg.links] + [n for n, _ in cfg.interfaces]
        if not names:
            raise RunConfigError("give --link NAME=PCAP or --interface NAME=IFACE")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise RunConfigError(f"link {', '.join(dup)} is given twice")
        interfaces, options = cfg.interfaces, cfg.capture_options
        if cfg.member is not None:
            if cfg.links:
                raise RunConfigError("--fanout-member captures one interface: give one "
                                     "--interface NAME=IFACE and no --link")
            interfaces, options = cfg.member.capture(interfaces, options)
        for name, path in cfg.links:
            if not Path(path).is_file():
                raise RunConfigError(f"--link {name}={path}: no such capture file")
        try:
            self.shared.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunConfigError(f"--spool {self.shared}: cannot create it: "
                                 f"{os_error_text(exc)}") from None
        # the heartbeat first: a host id whose agent still beats is refused before capture
        self.beat = WatchBeat(self.shared, self.host, [], cfg.punctuate_every_ns,
                              self._link_status)
        self.beat.tables_of = self._tables
        self.links = open_links(cfg.links, interfaces, period_ns=cfg.punctuate_every_ns,
                                slack_ns=cfg.lull_slack_ns, speed=cfg.speed, loop=cfg.loop,
                                capture_options=options)
        # what planning a work item needs, imported now: the agent must attach before the
        # item's first window begins (the server leaves it ATTACH_MARGIN_NS)
        import highlevel.graph  # noqa: F401
        import lowlevel.operator  # noqa: F401
        import tools.pipeline.config  # noqa: F401
        import tools.pipeline.feeds  # noqa: F401

        router = self.router = LinkRouter(self.links)
        router.on_feed_error = self._feed_failed
        router.start()
        self.beat.start()
        log.warning("agent %s watching %s for work (links %s)", self.host, self.shared,
                    ", ".join(f"{n}={link.source}" for n, link in self.links.items()))

    def _link_status(self) -> dict:
        out = {}
        for name, link in self.links.items():
            st = link.stats()
            out[name] = {"punctuation": st["punctuation_ns"], "packets": st["packets"],
                         "bytes": st["bytes"], "pps": st["pps"], "malformed": st["malformed"],
                         "ring_drops": st["ring_drops"], "kernel_drops": st["kernel_drops"],
                         "source": st["source"], "error": st["error"], "ended": False}
        return out

    def _tables(self) -> dict:
        """Its work items' hash tables now (`Beat.tables`)."""
        from tools.pipeline.tablesizes import table_report

        with self._lock:
            works = list(self.running.values())
        return table_report(f for w in works for af in w.feeds.values() for f in af.feeds)

    def _report(self) -> None:
        with self._lock:
            work = {name: w.report() for name, w in self.running.items()}
            for (name, generation), why in self.failed.items():
                work.setdefault(name, {"generation": generation, "links": [],
                                       "state": "failed", "error": why})
        if self.beat is not None:
            self.beat.work = work

    # --- work ----------------------------------------------------------------------------------
    def sync(self) -> None:
        """Attach the running items of this agent's links; end those cancelled or gone."""
        items = read_work(self.shared)
        for name, work in list(self.running.items()):
            item = items.get(name)
            if item is None or item.key != work.key or item.state != RUNNING:
                self._end(work, "cancelled" if item is not None and item.key == work.key
                          else "withdrawn")
        current = {item.key for item in items.values()}
        self.failed = {k: v for k, v in self.failed.items() if k in current}
        for name, item in items.items():
            if item.state != RUNNING or name in self.running or item.key in self.failed:
                continue
            mine = [link for link in item.links_of(self.host) if link in self.links]
            if mine:
                self._attach(item, mine)
        self._report()

    def _attach(self, item: WorkItem, links: list[str]) -> None:
        try:
            work = Work(item, links, self.tables)
        except Exception as exc:  # noqa: BLE001 - reported to the server by the heartbeat
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.error("query %s: cannot run its low level here: %s", item.name, why)
            self.failed[item.key] = why
            return

        def attach():
            for link, feed in work.feeds.items():
                self.links[link].feeds[item.name] = feed
                self.links[link].refresh_capture()
            work.attached_ns = time.time_ns()

        assert self.router is not None
        self.router.call(attach)
        with self._lock:
            self.running[item.name] = work
        late = "" if work.attached_ns is None or work.attached_ns < work.start_ns else \
            " (LATE: attached after its first window began; that window lacks packets)"
        log.warning("query %s (generation %d): low level attached on %s; first window at %d "
                    "ns%s", item.name, item.generation, ", ".join(work.links), work.start_ns,
                    late)

    def _detach(self, work: Work) -> None:
        def detach():
            for link in work.feeds:
                if self.links[link].feeds.get(work.item.name) is work.feeds[link]:
                    del self.links[link].feeds[work.item.name]
                    self.links[link].refresh_capture()

        assert self.router is not None
        self.router.call(detach)

    def _end(self, work: Work, why: str) -> None:
        """Detach, flush and punctuate end of input: the server's windows all close."""
        self._detach(work)
        try:
            work.finish()
        except Exception as exc:  # noqa: BLE001 - the spool may be gone with the query
            log.warning("query %s: its last spool files: %s", work.item.name, exc)
        with self._lock:
            self.running.pop(work.item.name, None)
        log.warning("query %s (generation %d) %s: its low level on %s ended", work.item.name,
                    work.item.generation, why, ", ".join(work.links))

    def _feed_failed(self, name: str, exc: BaseException) -> None:
        """A feed's fault, on the router's thread: that item fails here (the server is told
        by the heartbeat), the others go on."""
        work = self.running.get(name)
        if work is not None and work.error is None:
            work.error = f"low level failed: {exc}"
            log.error("query %s: %s", name, work.error)

    # --- life ----------------------------------------------------------------------------------
    def run(self, stop) -> str:
        """Watch until `stop()` (or the duration); why it ended."""
        deadline = None if self.config.duration_ns is None else \
            time.monotonic() + self.config.duration_ns / NS
        next_sync = 0.0
        while not stop():
            if deadline is not None and time.monotonic() >= deadline:
                return "duration reached"
            if time.monotonic() >= next_sync:
                try:
                    self.sync()
                except OSError as exc:
                    log.warning("work items in %s: %s", self.shared, os_error_text(exc))
                next_sync = time.monotonic() + self.config.poll_s
            for name, link in self.links.items():
                if link.producer.error is not None:
                    raise RunConfigError(f"link {name}: {link.producer.error}")
            time.sleep(0.05)
        return "stopped"

    def close(self) -> None:
        """Detach everything without end of input (module docstring), stop the links."""
        for work in list(self.running.values()):
            try:
                self._detach(work)
                work.close()
            except Exception as exc:  # noqa: BLE001 - stopping anyway
                log.warning("query %s: %s", work.item.name, exc)
        self.running.clear()
        for link in self.links.values():
            link.producer.stop()
        if self.router is not None:
            self.router.stop()
            self.router.join(timeout=10)
        for link in self.links.values():
            link.producer.join(timeout=5)
            link.producer.close()
        self._report()
        if self.beat is not None:
            self.beat.finish("stopped")

    def summary(self, ended: str) -> str:
        lines = []
        for name, link in self.links.items():
            st = link.stats()
            lines.append(f"link {name}: {st['packets']} packets, {st['bytes']} bytes, "
                         f"{st['malformed']} malformed, {st['ring_drops']} ring drops, "
                         f"{st['kernel_drops']} kernel drops [{st['source']}]")
        lines.append(f"agent {self.host} ended: {ended}")
        return "\n".join(lines)


def run_watch(config: WatchConfig, stop) -> str:
    """Run a watching agent until `stop()`; its summary text."""
    watcher = Watcher(config)
    ended = "stopped"
    try:
        watcher.start()
        ended = watcher.run(stop)
    finally:
        watcher.close()
    return watcher.summary(ended)
