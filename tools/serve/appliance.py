"""The appliance: its links, its queries and its agents, composed for the server's life."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tools.serve.config import ServeConfig
from tools.serve.downtime import Downtime
from tools.serve.linkset import LinkSet
from tools.serve.remote import RemoteLinks
from tools.serve.statedir import StateDir
from tools.serve.submissions import Submissions
from tools.serve.tail import Hub

if TYPE_CHECKING:
    from tools.serve.metrics import Metrics

log = logging.getLogger(__name__)


class Appliance:
    """`Appliance(config).start()` opens the links (`LinkSet`: live interfaces, capture
    files replayed paced and re-timed to the wall clock, record links), starts the router
    that runs the attached queries' low-level operators, starts the Spark session in the
    background, and resumes every query its state directory says was running
    (`Submissions`). Queries are then submitted, listed and cancelled while capture goes on
    (`tools.serve.api` is the HTTP face of these methods). `shutdown()` closes every window
    of every query and writes it, as SIGTERM does.

    A heartbeat in the state directory tells a restart when the previous server was last
    alive: the time between is reported as a gap (`Downtime`). With a shared directory
    (`spool`) or a fanout (`fanout` N > 1), capture agents and fanout members lend it links
    (`RemoteLinks`)."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.state_dir = Path(config.state).resolve()
        self.output_root = Path(config.output_root or self.state_dir).resolve()
        self.hub = Hub()
        self._stopping = threading.Event()
        self._downtime = Downtime(self.state_dir, self._stopping)
        self._links = LinkSet(config)
        self._remote = RemoteLinks(config, self.state_dir, self._stopping)
        self.state = StateDir(self.state_dir, self.output_root)
        self._submissions = Submissions(config, self.state, self.hub, self._links,
                                       self._remote)

    def claim(self) -> None:
        """Its state directory and output root made, checked and locked (`StateDir`)."""
        self.state.claim()

    def start(self) -> None:
        from queries.schemafile import read_schema_file, schema_from_files

        schema_files = [(str(Path(f).resolve()), read_schema_file(f))
                        for f in self.config.schema_files]
        schema = schema_from_files(schema_files)
        self._links.check(schema)
        self.state.claim()
        self._downtime.note()
        self._remote.start()
        self._links.open(schema, bool(self._remote.fanned), self._submissions.feed_failed)
        self._submissions.start_spark()
        self._downtime.start()
        self._submissions.resume_all(schema_files, self._downtime.down_since)
        self._links.release(self._submissions.skip_before)
        self._submissions.start_stages_when_up()
        self._remote.watch(self._submissions.running, self._submissions.fail)

    def watch_with(self, metrics: Metrics) -> None:
        """Every query's output latency observed by `metrics` (the server's)."""
        self._submissions.watch_with(metrics)

    def link_sources(self) -> list[str]:
        """`NAME=SOURCE` of every link, for the server's first log line."""
        return [f"{link.name}={link.source}" for link in self._links] + \
            [f"{n}=interface {i} (fanout of {self.config.fanout})"
             for n, i in self.config.interfaces if n in self._remote.fanned]

    # --- queries -------------------------------------------------------------------------------
    def submit(self, *, text: str, file: str, name: str | None = None, params=None, sets=None,
               outputs=None, fmt: str | None = None, schemas=None, link_map=None) -> dict:
        return self._submissions.submit(text=text, file=file, name=name, params=params,
                                       sets=sets, outputs=outputs, fmt=fmt, schemas=schemas,
                                       link_map=link_map)

    def cancel(self, name: str) -> dict:
        return self._submissions.cancel(name)

    def queries(self) -> list[dict]:
        return self._submissions.queries()

    def stream_of(self, name: str) -> str:
        return self._submissions.stream_of(name)

    def rows(self, name: str, limit: int) -> dict:
        return self._submissions.rows(name, limit)

    def ended_rows(self, name: str, limit: int) -> dict | None:
        return self._submissions.ended_rows(name, limit)

    def status(self) -> dict:
        fanned, members = self._remote.fanout_status()
        shared = self._remote.shared
        started = self._downtime.started_ns
        # a link's counters count from this process's start (a restart begins them again)
        links = [{**s, "since_ns": started} for s in self._links.stats() + fanned]
        return {"started": started / 1e9, "counters_since_ns": started,
                "uptime_s": (time.time_ns() - started) / 1e9,
                "links": links,
                "fanout": members,
                "spark": self._submissions.spark_state(), "gaps": self._downtime.gaps,
                "queries": len(self._submissions), "state_dir": str(self.state_dir),
                "output_root": str(self.output_root),
                "spool": None if shared is None else str(shared),
                "agents": self._remote.agent_status()}

    # --- stop ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Every window of every query closed and written; the links and Spark stopped."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.info("stopping: closing every window and writing the results")
        self._links.stop()
        self._submissions.stop_all()
        self._links.close()
        self._remote.stop()            # after every query's part of theirs ended
        self._downtime.write(clean=True)
