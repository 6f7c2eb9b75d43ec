"""The links the appliance's capture agents and fanout members lend it, and their watch."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tools.errors import RunConfigError
from tools.serve.fanout import ServedFanout

if TYPE_CHECKING:
    from tools.serve.agents import Agents
    from tools.serve.config import ServeConfig
    from tools.serve.submission import Record, Submission

log = logging.getLogger(__name__)


class RemoteLinks:
    """The links other processes capture for the server, on the directory it shares with
    them (`--spool`, else `STATE/shared` for a fanout): the capture agents in watch mode
    (`tools.serve.agents`), whose links a submission may read (it is published there as a
    work item; its agents run that link's low level into its spool and the server's stages
    meld it with the server's own links), and the members of the server's own fanout
    (`tools.serve.fanout`: with `fanout` N > 1 each interface is captured by N member
    agents, their shares melded as sub-links). Every `POLL_S` it reads the agents'
    heartbeats: their silent links are left out of the Meld of the stages that read them,
    and a query an agent cannot run fails."""

    def __init__(self, config: ServeConfig, state_dir: Path, stopping: threading.Event):
        self.config = config
        self._stopping = stopping
        self._agents: Agents | None = None       # with a shared directory
        #: the interfaces captured by fanout members (`serve --fanout N`), and the members
        self._fanout = ServedFanout(config, state_dir, stopping)
        #: link -> N of the interfaces captured by N fanout members
        self.fanned: dict[str, int] = self._fanout.fanned
        self._shared_dir = config.spool or (str(state_dir / "shared") if self.fanned
                                            else None)

    @property
    def shared(self) -> Path | None:
        """The directory shared with the agents (None: the server has no agents)."""
        return None if self._agents is None else self._agents.shared

    def start(self) -> None:
        """Make the shared directory, read the agents' heartbeats and start the fanout
        members; from the thread that starts the server (`ServedFanout.start`)."""
        if self._shared_dir:
            from tools.serve.agents import Agents

            shared = Path(self._shared_dir)
            try:
                (shared / "work").mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunConfigError(f"--spool {shared}: cannot create it: {exc}") from None
            self._agents = Agents(shared, self.config.agent_timeout_s)
            self._agents.refresh()
        if self.fanned:
            assert self._agents is not None
            self._fanout.start(self._agents)

    # --- links ---------------------------------------------------------------------------------
    def available(self, own: list[str]) -> tuple[list[str], dict[str, str]]:
        """Every link a submission may read (the server's `own`, then its live agents'), and
        link -> agent host of the agents' ones. A link of the server's own is the server's
        even if an agent captures one of that name."""
        if self._agents is None:
            return own, {}
        lent, _ = self._agents.links()
        members = self._fanout.member_links()
        remote = {n: h for n, h in sorted(lent.items()) if n not in own and n not in members}
        return own + list(remote), {**remote, **members}

    def no_link_hint(self, message: str) -> str:
        """The planner's message, plus what the agents say of a link it did not find."""
        if self._agents is None or "no link" not in message:
            return message
        _, twice = self._agents.links()
        notes = [f"link {n} is captured by two agents ({', '.join(h)}): give each link one "
                 f"agent" for n, h in sorted(twice.items())]
        dead = [f"{b['host']} ({', '.join(b['links'])}: {b['state']}, last beat "
                f"{b['age_s']:.0f} s ago)" for b in self._agents.status() if not b["live"]]
        if dead:
            notes.append("agents not running: " + "; ".join(dead))
        return message + ("; " + "; ".join(notes) if notes else "")

    def refan(self, record: Record, links: list[str], cleanly: bool) -> None:
        """A resumed record's fanned-out links as this server captures them
        (`ServedFanout.refan`)."""
        self._fanout.refan(record, links, cleanly,
                           None if self._agents is None else str(self._agents.shared))

    # --- a submission's agents -----------------------------------------------------------------
    def publish(self, sub: Submission) -> None:
        """`sub` (reading agents' links) published as a work item for its agents."""
        assert self._agents is not None
        self._agents.publish(sub)

    def counters(self, sub: Submission) -> dict[str, int]:
        """The counters `sub`'s agents report of their links (none: not read by agents)."""
        if not sub.remote or self._agents is None:
            return {}
        return self._agents.counters(sub.name, sub.record.generation)

    def cancel(self, sub: Submission) -> None:
        """Tell `sub`'s agents to end their part (they punctuate end of input)."""
        if sub.remote and self._agents is not None:
            self._agents.cancel(sub)

    def finish(self, sub: Submission) -> None:
        """Wait until `sub`'s agents' end of input is in its spool (`Agents.finish`)."""
        if sub.remote and self._agents is not None:
            self._agents.finish(sub)

    def withdraw(self, sub: Submission) -> None:
        """Withdraw the work item of `sub` (which failed): its agents end their part."""
        if sub.remote and self._agents is not None:
            try:
                self._agents.withdraw(sub)
            except OSError as exc:
                log.error("query %s: cannot withdraw it from the agents: %s", sub.name, exc)

    # --- watch ---------------------------------------------------------------------------------
    def watch(self, running: Callable[[], list[Submission]],
              fail: Callable[[Submission, str], None]) -> None:
        """Watch the agents until the server stops (`running()`: the running submissions;
        `fail(sub, why)` fails one); nothing without agents."""
        if self._agents is not None:
            threading.Thread(target=self._watch, args=(running, fail), name="oopscope-agents",
                             daemon=True).start()

    def _watch(self, running: Callable[[], list[Submission]],
               fail: Callable[[Submission, str], None]) -> None:
        """Every POLL_S: the agents' heartbeats; their silent links left out of the Meld of
        the stages that read them; a query an agent cannot run fails."""
        from tools.serve.agents import POLL_S

        assert self._agents is not None
        warned: set[tuple[str, str]] = set()
        while not self._stopping.wait(POLL_S):
            try:
                self._agents.refresh()
            except Exception as exc:  # noqa: BLE001 - tried again at the next poll
                log.warning("agents in %s: %s", self._agents.shared, exc)
                continue
            gone = self._fanout.check()
            for sub in running():
                if not sub.remote:
                    continue
                silent = self._agents.silent_links(sub.remote) | (gone & set(sub.remote))
                if sub.graph is not None and sub.stages_started:
                    for _, stage in sub.graph.stages:
                        stage.silent_links = silent
                for host in self._agents.late(sub.name, sub.record.generation):
                    if (sub.name, host) not in warned:
                        warned.add((sub.name, host))
                        log.warning("query %s: agent %s attached after its first window "
                                    "began: that window lacks some of its packets", sub.name,
                                    host)
                failed = self._agents.failures(sub.name, sub.record.generation)
                if failed:
                    host, why = failed[0]
                    fail(sub, f"agent {host}: {why}")

    # --- life ----------------------------------------------------------------------------------
    def fanout_status(self) -> tuple[list[dict], dict]:
        """The fanned-out links as status links, and their members (`ServedFanout.status`)."""
        return self._fanout.status()

    def agent_status(self) -> list[dict]:
        """Every agent's heartbeat, links and work (none without agents)."""
        return [] if self._agents is None else self._agents.status()

    def stop(self) -> None:
        """Stop the fanout members (after every query's part of theirs ended), and read
        their last beats for the summary."""
        self._fanout.stop()
        if self._fanout.members is not None and self._agents is not None:
            try:
                self._agents.refresh()
            except Exception as exc:  # noqa: BLE001 - the summary only
                log.debug("agents: %s", exc)
