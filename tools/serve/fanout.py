"""The appliance's own fanout (`oopscope serve --interface NAME=IFACE --fanout N`): N member
agents in watch mode per interface, each with one socket of a PACKET_FANOUT group on it.

The server opens none of its interfaces itself then. It starts the members
(`tools.pipeline.fanout.FanoutMembers`) on its shared directory (`--spool`, else
`STATE/shared`); member K of NAME beats as `<server id>.K` and offers its share as the
sub-link `NAME#K`. A submission reading NAME is a query on agents' links whose stages meld
NAME's sub-links (`Record.fanout`), each member running the low level of its own share. The
members are the server's children: stopped (SIGTERM) at its shutdown, after they ended their
queries' parts, and dying with it. A member that dies is reported once, and its share is
silent at once (`Agents.gone`): the windows close without it.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from tools.errors import RunConfigError, RunError

if TYPE_CHECKING:
    from tools.pipeline.fanout import FanoutMembers
    from tools.serve.agents import Agents

log = logging.getLogger(__name__)


class ServedFanout:
    """The fanned-out interfaces of an appliance and their member processes."""

    def __init__(self, config, state_dir: Path, stopping: threading.Event):
        self.config = config
        self.state_dir = state_dir
        self.stopping = stopping
        #: link -> N of the interfaces captured by N members (none without --fanout)
        self.fanned: dict[str, int] = {n: config.fanout for n, _ in config.interfaces} \
            if config.fanout > 1 else {}
        self.members: FanoutMembers | None = None
        self.agents: Agents | None = None
        self._exited: set[str] = set()           # members whose end was reported
        self._lock = threading.Lock()

    @property
    def server_id(self) -> str:
        """The members' host ids are `<this>.K`: the same at every start of this server, so
        a restart continues its queries' spools under the same sub-links and agents."""
        from tools.pipeline.heartbeat import default_host_id

        return f"{default_host_id()[:48]}-serve"

    def start(self, agents: Agents) -> None:
        """Start the members on the agents' shared directory; from the thread that starts the
        server (the kernel's parent-death signal follows the thread that forked)."""
        from tools.pipeline.fanout import FanoutMembers

        self.agents = agents
        self.members = FanoutMembers(self.config, str(agents.shared), self.server_id,
                                     self.config.fanout)
        self.members.start()
        log.info("capturing %s with %d fanout members each (%s)",
                 ", ".join(f"{n}={i}" for n, i in self.config.interfaces),
                 self.config.fanout,
                 ", ".join(f"{sub}: {host}" for sub, (_, host)
                           in self.members.members.items()))

    def member_links(self) -> dict[str, str]:
        """Sub-link -> member host id of every fanned-out interface."""
        if self.members is not None:
            return {sub: host for sub, (_, host) in self.members.members.items()}
        from highlevel.graph import sublink_names

        return {sub: f"{self.server_id}.{k}" for link, n in self.fanned.items()
                for k, sub in enumerate(sublink_names(link, n))}

    def refan(self, record, links: list[str], cleanly: bool, shared: str | None) -> None:
        """A resumed record's fanned-out links (it reads `links`) as this server captures
        them: a new generation (`cleanly`: the last one was stopped cleanly) takes the
        server's fanout now; one continued after a crash must have the same, its spool
        holding the sub-links it had; `shared`: the agents' directory (None: no agents)."""
        from highlevel.graph import base_link

        want = {n: k for n, k in self.fanned.items() if n in links}
        if want == {n: int(k) for n, k in record.fanout.items()}:
            return
        if not cleanly:
            raise RunConfigError(f"its spool holds the links {', '.join(links)} captured with "
                                 f"--fanout {max(record.fanout.values(), default=1)}: restart "
                                 f"the server with that --fanout to continue it")
        agents = {n: h for n, h in record.agents.items() if base_link(n) == n}
        agents.update({sub: host for sub, host in self.member_links().items()
                       if base_link(sub) in want})
        record.fanout, record.agents = want, agents
        record.spool_root = shared if agents and shared else ""

    def check(self) -> frozenset:
        """Sub-links whose member has ended (each reported once): their share is silent."""
        if self.members is None:
            return frozenset()
        ended = self.members.exited()
        for sub, (pid, code) in sorted(ended.items()):
            with self._lock:
                if sub in self._exited:
                    continue
                self._exited.add(sub)
            link, host = self.members.members[sub]
            if self.agents is not None:       # silent now, not after its timeout
                self.agents.gone.add(host)
            if not self.stopping.is_set():
                log.error("fanout member %s (pid %d) exited with %s: its share of link %s is "
                          "silent, the windows close without it", sub, pid, code, link)
        return frozenset(ended)

    def stop(self) -> None:
        """SIGTERM to every member, and wait for them (killed after 30 s)."""
        if self.members is None:
            return
        self.members.stop()
        try:
            self.members.wait(timeout=30)
        except RunError as exc:
            log.warning("%s", exc)

    def status(self) -> tuple[list[dict], dict]:
        """Each fanned-out link as one status link (its members' heartbeats added up), and
        link -> its members (sub-link, host, pid, state, packets)."""
        if self.members is None:
            return [], {}
        self.check()                      # an end the status shows is reported
        beats = {} if self.agents is None else {b["host"]: b for b in self.agents.status()}
        ended = self.members.exited()
        pids = self.members.pids()
        rows, members = [], {}
        for link, iface in self.config.interfaces:
            total = {"name": link, "packets": 0, "bytes": 0, "pps": 0.0, "bps": 0.0,
                     "malformed": 0, "reasons": {}, "ring_drops": 0, "kernel_drops": 0}
            puncts, problems, mine = [], [], []
            for sub, (of, host) in self.members.members.items():
                if of != link:
                    continue
                beat = beats.get(host)
                st = (beat or {}).get("links", {}).get(sub, {})
                for key in ("packets", "bytes", "malformed", "ring_drops", "kernel_drops"):
                    total[key] += int(st.get(key) or 0)
                total["pps"] += float(st.get("pps") or 0.0)
                puncts.append(st.get("punctuation"))
                state = "running" if beat is not None and beat["live"] else \
                    ("starting" if beat is None else "silent")
                if sub in ended:
                    state = f"exited ({ended[sub][1]})"
                    problems.append(f"member {sub} exited with {ended[sub][1]}: its share "
                                    f"is silent")
                mine.append({"sublink": sub, "host": host, "pid": pids[sub], "state": state,
                             "packets": int(st.get("packets") or 0)})
            total["punctuation_ns"] = None if not puncts or any(p is None for p in puncts) \
                else min(puncts)
            total["source"] = f"interface {iface}, fanout of {len(mine)}"
            total["error"] = "; ".join(problems) or None
            rows.append(total)
            members[link] = mine
        return rows, members
