"""Capture agents' heartbeats in the shared spool, and what a collector learns from them.

An agent (`oopscope agent`) writes `SPOOL/agents/<host id>.json` at least once per
punctuation period, whole or not at all (a temporary file renamed over it): its host id and
process, the wall-clock time of the beat, its state (`running`, `ended` once every link has
punctuated end of input, `stopped` after SIGTERM), the queries it runs, and per link the
punctuation it last wrote, packets, bytes, malformed packets and drops. A file system every
host and Spark can read (NFS, a cluster file system) is the transport: no network layer of
our own.

A collector (`oopscope collect`) reads them all (`read_heartbeats`) to learn the links to
expect, and `Liveness` tells which links have gone silent: their agent's last beat is older
than the agent timeout and it had not ended. docs/deployment.md says what follows. Fanout
members (`tools.pipeline.fanout`) are agents too: a run adds up their last beats.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from common.cachedir import write_private
from common.errors import os_error_text
from common.processes import pid_alive
from tools.errors import RunConfigError

log = logging.getLogger(__name__)

AGENTS = "agents"
#: a host id is one path component others can read in a listing
_HOST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_host_id(host: str) -> str:
    if not _HOST_ID.match(host):
        raise RunConfigError(f"--host-id {host!r}: use 1-64 letters, digits, '.', '_' or '-', "
                             f"starting with a letter or digit")
    return host


def default_host_id() -> str:
    import socket

    name = socket.gethostname().split(".")[0] or "agent"
    return re.sub(r"[^A-Za-z0-9._-]", "-", name)[:64]


def heartbeat_path(spool: Path, host: str) -> Path:
    return Path(spool) / AGENTS / f"{host}.json"


@dataclass
class Beat:
    """One agent's last heartbeat as read."""

    host: str
    pid: int
    time_ns: int                      # wall clock of the beat
    state: str                        # running | ended | stopped
    period_ns: int
    queries: list[str]
    links: dict[str, dict] = field(default_factory=dict)
    #: a watch-mode agent's reports of the work items it runs (`tools.cluster.watch`)
    work: dict[str, dict] = field(default_factory=dict)
    #: {query: {link: {"slots": n, "resizes": r}}}: its hash tables now
    #: (`tools.pipeline.tablesizes.table_report`)
    tables: dict[str, dict] = field(default_factory=dict)

    def age_s(self, now_ns: int | None = None) -> float:
        return ((now_ns if now_ns is not None else time.time_ns()) - self.time_ns) / 1e9


def read_heartbeats(spool: Path) -> dict[str, Beat]:
    """Every agent's last beat, by host id (an unreadable file is skipped with a warning:
    it may be mid-rename on a file system without atomic rename)."""
    out: dict[str, Beat] = {}
    d = Path(spool) / AGENTS
    if not d.is_dir():
        return out
    for path in sorted(d.glob("*.json")):
        try:
            data = json.loads(path.read_text())
            out[data["host"]] = Beat(data["host"], int(data["pid"]), int(data["time_ns"]),
                                     data["state"], int(data["period_ns"]),
                                     list(data["queries"]), dict(data["links"]),
                                     dict(data.get("work") or {}),
                                     dict(data.get("tables") or {}))
        except FileNotFoundError:
            continue
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("heartbeat %s: unreadable (%s); skipped", path, exc)
    return out


def links_of(beats: dict[str, Beat]) -> dict[str, str]:
    """link -> host id; a link two agents claim is an error naming both."""
    owner: dict[str, str] = {}
    for host, beat in sorted(beats.items()):
        for link in beat.links:
            if link in owner and owner[link] != host:
                raise RunConfigError(f"link {link!r} is captured by two agents, {owner[link]} "
                                     f"and {host}: give each link one agent")
            owner[link] = host
    return owner


class Heartbeat(threading.Thread):
    """The agent's beat: `status()` gives the links' numbers; written every `period_ns`."""

    #: () -> its hash tables (`Beat.tables`), when the agent has any
    tables_of: Callable[[], dict] | None = None

    def __init__(self, spool: Path, host: str, queries: list[str], period_ns: int, status):
        super().__init__(name="oopscope-heartbeat", daemon=True)
        self.path = heartbeat_path(spool, host)
        self.host, self.queries, self.period_ns = host, list(queries), int(period_ns)
        self.status = status
        self.state = "running"
        self.started_ns = time.time_ns()
        self._done = threading.Event()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunConfigError(f"--spool {spool}: cannot create {self.path.parent}: "
                                 f"{os_error_text(exc)}") from None
        beats = read_heartbeats(spool)
        other = beats.get(host)
        if other is not None and other.state == "running" and other.pid != os.getpid() \
                and other.age_s() * 1e9 < 3 * other.period_ns and pid_alive(other.pid):
            # (a host id names one host: a live pid of this host is that agent)
            raise RunConfigError(f"agent {host!r} is running already (pid {other.pid}, last "
                                 f"beat {other.age_s():.1f} s ago): give another --host-id")
        mine = set(self.status())
        for name, beat in sorted(beats.items()):
            shared = sorted(mine & set(beat.links))
            if name != host and shared and beat.state == "running" \
                    and beat.age_s() * 1e9 < 3 * beat.period_ns:
                # two writers of one link's spool files would clash on their numbers
                raise RunConfigError(f"link {', '.join(shared)} is captured by agent {name} "
                                     f"already (last beat {beat.age_s():.1f} s ago): give "
                                     f"each link one agent")
        self.beat()

    def payload(self) -> dict:
        """What a beat says (a watch-mode agent's adds its work items)."""
        return {"host": self.host, "pid": os.getpid(), "time_ns": time.time_ns(),
                "started_ns": self.started_ns, "state": self.state,
                "period_ns": self.period_ns, "queries": self.queries,
                "links": self.status(),
                **({"tables": self.tables_of()} if self.tables_of is not None else {})}

    def beat(self) -> None:
        try:
            write_private(self.path, json.dumps(self.payload(), indent=1) + "\n")
        except OSError as exc:
            # a beat lost is a beat late: the collector may declare the links silent, and
            # they rejoin with the next beat that gets through
            log.warning("heartbeat %s: cannot write it: %s", self.path, os_error_text(exc))

    def run(self) -> None:
        while not self._done.wait(self.period_ns / 1e9 / 2):
            self.beat()

    def finish(self, state: str) -> None:
        """The last beat: `ended` (every link punctuated end of input) or `stopped`."""
        self._done.set()
        if self.is_alive():
            self.join()
        self.state = state
        self.beat()


class Liveness:
    """Which links are silent: by default, their agent's last beat is older than
    `timeout_s` and it had not ended (`update` takes another rule). A link turns silent once
    (one warning naming it and the time of its last beat) and live again when its agent is
    (another warning)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.silent: dict[str, int] = {}        # link -> time of its agent's last beat

    def update(self, beats: dict[str, Beat], now_ns: int | None = None,
               dead: Callable[[Beat], bool] | None = None) -> frozenset:
        now = now_ns if now_ns is not None else time.time_ns()
        if dead is None:
            def dead(beat: Beat) -> bool:
                return beat.state == "running" and beat.age_s(now) > self.timeout_s
        for host, beat in beats.items():
            gone = dead(beat)
            for link in beat.links:
                if gone and link not in self.silent:
                    self.silent[link] = beat.time_ns
                    why = f"stopped ({beat.state})" if beat.state != "running" else \
                        f"silent since {_utc(beat.time_ns)} (no heartbeat for " \
                        f"{beat.age_s(now):.1f} s)"
                    log.warning("link %s: agent %s %s: windows close without it; its rows "
                                "that come later are late", link, host, why)
                elif not gone and link in self.silent:
                    del self.silent[link]
                    log.warning("link %s: agent %s is back (heartbeat at %s)", link, host,
                                _utc(beat.time_ns))
        return frozenset(self.silent)


def add_link_totals(links: dict, beats: dict[str, Beat], wanted=None, source=None) -> None:
    """Each link's numbers from its agents' last beats into `links` (name -> LinkSummary),
    a fanned-out link's sub-links `NAME#K` added up under NAME; only the `wanted` links
    (all when None); `source(host)` names where each link came from."""
    from highlevel.graph import base_link
    from tools.pipeline.config import LinkSummary

    for host, beat in sorted(beats.items()):
        for name, st in beat.links.items():
            link = base_link(name)
            if wanted is not None and link not in wanted:
                continue
            s = links.setdefault(link, LinkSummary(link, source(host) if source else
                                                   f"agent {host}"))
            for key in ("packets", "bytes", "malformed", "ring_drops", "kernel_drops"):
                setattr(s, key, getattr(s, key) + int(st.get(key, 0) or 0))


def _utc(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ns / 1e9))
