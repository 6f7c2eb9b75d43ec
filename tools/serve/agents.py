"""The appliance's capture agents (`oopscope serve --spool SHARED`): agents in watch mode
(`tools.cluster.watch`) beat in `SHARED/agents/`, and their links become the server's too.

`Agents` is the server's view of them, refreshed every `POLL_S` by the appliance:

- which links they offer (those of agents beating `running`, within the agent timeout);
- which links are silent: their agent stopped beating for the timeout, or was stopped; the
  stages leave them out of their Meld (`Stage.silent_links`), so a dead agent never holds
  the windows of the other links back (its rows that come later are late);
- the work items (`tools.cluster.work`): a submission reading an agent's link is published
  for its agents, withdrawn at cancel, shutdown or failure; `finish` waits until the
  agents have punctuated end of input in its spool, and writes that punctuation itself for
  an agent that does not answer, so every window closes;
- what each agent says of its work (a low level that cannot start there fails the query).

The members of `oopscope serve --fanout N` are such agents too (`tools.pipeline.fanout`):
each offers its share of an interface as the sub-link `NAME#K`, and an item names them by
their sub-links (`Submission.spool_links`).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from common.units import NS_PER_S as NS
from tools.cluster.work import CANCELLED, WorkItem, publish, read_item, withdraw, work_path
from tools.pipeline.heartbeat import Liveness

log = logging.getLogger(__name__)

#: how often the appliance reads the agents' heartbeats
POLL_S = 0.5
#: an agent is silent after this many of its punctuation periods without a beat (unless set)
TIMEOUT_PERIODS = 3
#: at least this long, whatever the period (a busy shared file system delays beats)
MIN_TIMEOUT_S = 2.0
#: the first window of a query read by agents starts at least this long after submission:
#: the agents must read the work item and attach before it begins
ATTACH_MARGIN_NS = 2 * NS


class Agents:
    def __init__(self, shared: str | Path, timeout_s: float | None = None):
        self.shared = Path(shared).resolve()
        self.timeout_s = timeout_s
        self.beats: dict = {}                   # host -> tools.pipeline.heartbeat.Beat
        self.work: dict[str, dict] = {}         # host -> its heartbeat's work reports
        self.liveness = Liveness(timeout_s or MIN_TIMEOUT_S)   # the rule is `_live`
        #: hosts known to have died whatever their last beat says (the server's own fanout
        #: members that exited: `ServedFanout.check`)
        self.gone: set[str] = set()
        self._lock = threading.Lock()

    def refresh(self) -> None:
        from tools.pipeline.heartbeat import read_heartbeats

        beats = read_heartbeats(self.shared)
        now = time.time_ns()
        with self._lock:
            self.beats = beats
            self.work = {host: beat.work for host, beat in beats.items()}
            self.liveness.update(beats, now, dead=lambda beat: not self._live(beat, now))

    @property
    def silent(self) -> dict[str, int]:
        """link -> time of its agent's last beat, of the silent links."""
        return self.liveness.silent

    def _timeout_s(self, beat) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return max(MIN_TIMEOUT_S, TIMEOUT_PERIODS * beat.period_ns / NS)

    def _live(self, beat, now_ns: int) -> bool:
        return beat.state == "running" and beat.age_s(now_ns) <= self._timeout_s(beat) \
            and beat.host not in self.gone

    def links(self) -> tuple[dict[str, str], dict[str, list[str]]]:
        """(link -> host of each live agent's links, link -> hosts of a link two live agents
        claim: those are offered by neither)."""
        now = time.time_ns()
        owners: dict[str, list[str]] = {}
        with self._lock:
            for host, beat in sorted(self.beats.items()):
                if self._live(beat, now):
                    for link in beat.links:
                        owners.setdefault(link, []).append(host)
        one = {link: hosts[0] for link, hosts in owners.items() if len(hosts) == 1}
        return one, {link: hosts for link, hosts in owners.items() if len(hosts) > 1}

    def silent_links(self, links) -> frozenset:
        with self._lock:
            return frozenset(link for link in links if link in self.silent)

    def failures(self, name: str, generation: int) -> list[tuple[str, str]]:
        """(host, why) of every agent that says the item failed there."""
        out = []
        with self._lock:
            for host, reports in self.work.items():
                r = reports.get(name)
                if r and r.get("generation") == generation and r.get("state") == "failed":
                    out.append((host, str(r.get("error"))))
        return out

    def late(self, name: str, generation: int) -> list[str]:
        """Hosts that attached the item after its first window began (that window lacks
        the packets they saw before)."""
        out = []
        with self._lock:
            for host, reports in self.work.items():
                r = reports.get(name)
                if r and r.get("generation") == generation and r.get("attached_ns") and \
                        r["attached_ns"] > (r.get("start_ns") or 0):
                    out.append(host)
        return out

    def counters(self, name: str, generation: int) -> dict[str, int]:
        """The low-level counters the agents report of an item (summed over agents)."""
        out = {"partial_rows": 0, "before_start_packets": 0, "slots": 0}
        with self._lock:
            for reports in self.work.values():
                r = reports.get(name)
                if r and r.get("generation") == generation:
                    for key in out:
                        out[key] += int(r.get(key) or 0)
        return out

    def running_on(self, host: str, name: str, generation: int) -> bool:
        with self._lock:
            r = self.work.get(host, {}).get(name)
        return r is not None and r.get("generation") == generation

    # --- work items ----------------------------------------------------------------------------
    def publish(self, sub) -> None:
        from queries.explain import mapped_text

        rec = sub.record
        item = WorkItem(name=rec.name, generation=rec.generation, file=Path(rec.file).name,
                        text=mapped_text(rec.text, rec.link_map, rec.file),
                        params=dict(rec.params), sets=dict(rec.sets),
                        queries=[qp.name for qp in sub.chosen], links=list(sub.spool_links),
                        agents=dict(sub.remote), spool=str(sub.spool_dir),
                        start_ns=int(rec.first_window_ns),
                        schemas=[[list(f) for f in layer] for layer in sub.schema_layers])
        publish(self.shared, item)
        log.info("query %s: published for the agents of %s", rec.name,
                 ", ".join(f"{link} ({host})" for link, host in sub.remote.items()))

    def cancel(self, sub) -> None:
        """Tell the agents to end the item (they punctuate end of input)."""
        path = work_path(self.shared, sub.name)
        item = read_item(path)
        if item is not None and item.generation == sub.record.generation:
            item.state = CANCELLED
            try:
                publish(self.shared, item)
            except OSError as exc:   # `finish` writes their end of input after the timeout
                log.error("query %s: cannot tell its agents: %s", sub.name, exc)

    def finish(self, sub, timeout_s: float | None = None) -> None:
        """Wait until every agent link of `sub` has punctuated end of input in its spool (its
        agent ended the item), then withdraw the item. An agent that is silent, has not
        attached, or does not answer within the timeout has end of input written for it, so
        every window closes; what it writes later is late."""
        from common.spool import END_OF_INPUT, SpoolWriter, last_punctuations

        if not sub.remote:
            return
        plans = [lp for lp in sub.graph.low_plans() if lp.link in sub.remote] \
            if sub.graph is not None else []
        if timeout_s is None:
            timeout_s = max([MIN_TIMEOUT_S] + [self._timeout_s(b) for b in self.beats.values()])
        deadline = time.monotonic() + timeout_s
        spool = sub.spool_dir
        while True:
            self.refresh()
            missing = []
            for lp in plans:
                _, p = last_punctuations(spool, lp.query).get(lp.link, (None, None))
                if p != END_OF_INPUT:
                    missing.append(lp)
            waiting = [lp for lp in missing if self._answers(sub, lp.link)]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for lp in missing:
            host = sub.remote.get(lp.link)
            log.warning("query %s: agent %s did not end link %s; its end of input is written "
                        "by the server", sub.name, host, lp.link)
            try:
                SpoolWriter(spool, lp.query, lp.link, fsync=False).write(None, END_OF_INPUT)
            except OSError as exc:
                log.error("query %s: spool %s: %s", sub.name, spool, exc)
        try:
            withdraw(self.shared, sub.name, sub.record.generation)
        except OSError as exc:
            log.error("query %s: cannot withdraw it from its agents: %s", sub.name, exc)

    def _answers(self, sub, link: str) -> bool:
        """Whether the agent of `link` is live and runs the item (so it will end it)."""
        host = sub.remote.get(link)
        with self._lock:
            beat = self.beats.get(host)
        return beat is not None and self._live(beat, time.time_ns()) and \
            self.running_on(host, sub.name, sub.record.generation)

    def withdraw(self, sub) -> None:
        withdraw(self.shared, sub.name, sub.record.generation)

    # --- reporting -----------------------------------------------------------------------------
    def status(self) -> list[dict]:
        now = time.time_ns()
        out = []
        with self._lock:
            for host, beat in sorted(self.beats.items()):
                out.append({"host": host, "pid": beat.pid, "state": beat.state,
                            "live": self._live(beat, now), "age_s": beat.age_s(now),
                            "heartbeat_ns": beat.time_ns, "links": beat.links,
                            "silent": sorted(link for link in beat.links
                                             if link in self.silent),
                            "work": self.work.get(host, {})})
        return out
