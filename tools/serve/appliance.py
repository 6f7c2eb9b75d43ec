"""The appliance: links, one Spark session and the submitted queries, for the server's life.

`Appliance(config).start()` opens the links (live interfaces, or capture files replayed
paced and re-timed to the wall clock: `tools.serve.links`), starts the router that runs the
attached queries' low-level operators, starts the Spark session in the background, and
resumes every query its state directory says was running. Queries are then submitted,
listed and cancelled while capture goes on (`tools.serve.api` is the HTTP face of these
methods). `shutdown()` closes every window of every query and writes it, as SIGTERM does.

A heartbeat in the state directory (`server.json`, rewritten every second) tells a restart
when the previous server was last alive: the time between is reported as a gap.

With a shared directory (`spool`), capture agents in watch mode lend it their links
(`tools.serve.agents`): a submission reading one is published there as a work item, its
agents run that link's low level into the submission's spool on the shared directory, and
the server's stages meld it with the server's own links.

With `fanout` N > 1 its interfaces are captured by N member agents each, their shares
melded as sub-links (`tools.serve.fanout`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import OopscopeError
from common.units import INT64_MAX, NS_PER_S
from tools.errors import RunConfigError, RunError
from tools.pipeline.windows import first_open_window, first_window_start, when
from tools.serve.fanout import ServedFanout
from tools.serve.submission import FORMATS, NAME_RE, Record, Submission, remove_generation
from tools.serve.tail import Hub

if TYPE_CHECKING:
    from tools.pipeline.links import LinkRouter, ServedLink
    from tools.pipeline.threads import SessionStarter
    from tools.serve.agents import Agents
    from tools.serve.metrics import Metrics

log = logging.getLogger(__name__)

INT64_MIN = -INT64_MAX - 1


class ServeError(RunError):
    """A request the appliance refuses (the reply says why); `status` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServeConfig:
    state: str
    links: tuple[tuple[str, str], ...] = ()          # (name, capture file) replayed
    interfaces: tuple[tuple[str, str], ...] = ()     # (name, interface) live
    speed: float = 1.0
    loop: bool = False
    master: str | None = None
    output_root: str | None = None                   # None: the state directory
    punctuate_every_ns: int = NS_PER_S
    lull_slack_ns: int = NS_PER_S
    capture_options: tuple[tuple[str, object], ...] = ()
    spool: str | None = None                          # the directory shared with agents
    agent_timeout_s: float | None = None              # None: 3 of the agent's periods
    #: each interface captured by this many member processes (`serve --fanout N`)
    fanout: int = 1
    #: GS-lite schema files (`--schema`) declaring the record protocols of `records`, and
    #: read by every submission
    schema_files: tuple[str, ...] = ()
    #: (name, protocol, path) of the record links (`--records NAME=PROTOCOL:PATH`)
    records: tuple[tuple[str, str, str], ...] = ()
    csv_separator: str | None = None

    @property
    def link_names(self) -> list[str]:
        return [n for n, _ in self.links] + [n for n, _ in self.interfaces] + \
            [n for n, _, _ in self.records]


class Appliance:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.state_dir = Path(config.state).resolve()
        self.output_root = Path(config.output_root or self.state_dir).resolve()
        self.hub = Hub()
        self.links: dict[str, ServedLink] = {}
        self.router: LinkRouter | None = None
        self.starter: SessionStarter | None = None
        self.submissions: dict[str, Submission] = {}
        self.records: dict[str, Record] = {}
        self.gaps: list[dict] = []
        self.started_ns = time.time_ns()
        self.metrics: Metrics | None = None      # set by the server
        self.agents: Agents | None = None        # with a shared directory (`--spool`)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._heartbeat: threading.Thread | None = None
        #: the interfaces captured by fanout members (`serve --fanout N`), and the members
        self.fanout = ServedFanout(config, self.state_dir, self._stopping)
        #: link -> N of the interfaces captured by N fanout members
        self.fanned: dict[str, int] = self.fanout.fanned
        #: (path, text) of the server's schema files, and the schema they make
        self.schema_files: list[tuple[str, str]] = []
        self.schema: Any = None

    # --- start -------------------------------------------------------------------------------
    def start(self) -> None:
        from queries.schemafile import read_schema_file, schema_from_files

        self.schema_files = [(str(Path(f).resolve()), read_schema_file(f))
                             for f in self.config.schema_files]
        self.schema = schema_from_files(self.schema_files)
        self._check_config()
        for d in (self.state_dir, self.output_root):
            try:
                d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunConfigError(f"{d}: cannot create it: {exc}") from None
        self._note_downtime()
        shared_dir = self.config.spool or (str(self.state_dir / "shared") if self.fanned
                                           else None)
        if shared_dir:
            from tools.serve.agents import Agents

            shared = Path(shared_dir)
            try:
                (shared / "work").mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunConfigError(f"--spool {shared}: cannot create it: {exc}") from None
            self.agents = Agents(shared, self.config.agent_timeout_s)
            self.agents.refresh()
        if self.fanned:
            assert self.agents is not None
            self.fanout.start(self.agents)
        self._open_links()
        from tools.pipeline.links import LinkRouter
        from tools.pipeline.threads import SessionStarter

        self.router = LinkRouter(self.links)
        self.router.on_feed_error = self._feed_failed
        self.router.start()
        self.starter = SessionStarter(self.config.master, quick_jvm=False, nice=0)
        self.starter.start()
        self._heartbeat = threading.Thread(target=self._beat, name="oopscope-heartbeat",
                                           daemon=True)
        self._heartbeat.start()
        for record in Record.load_all(self.state_dir):
            self.records[record.name] = record
            if record.state == "running":
                try:
                    self._resume(record)
                except Exception as exc:  # noqa: BLE001 - the other queries go on
                    record.state, record.error = "failed", str(exc)
                    record.save(self.state_dir)
                    log.error("query %s: cannot resume: %s", record.name, exc)
        self._release_record_links()
        threading.Thread(target=self._start_stages_when_up, name="oopscope-stages",
                         daemon=True).start()
        if self.agents is not None:
            threading.Thread(target=self._watch_agents, name="oopscope-agents",
                             daemon=True).start()

    def _check_config(self) -> None:
        if self.config.fanout > 1 and (self.config.links or not self.config.interfaces):
            raise RunConfigError(f"--fanout {self.config.fanout} splits live interfaces over "
                                 f"capture processes: give --interface NAME=IFACE (a capture "
                                 f"file, --link, is read by one)")
        names = self.config.link_names
        if not names and not self.config.spool:
            raise RunConfigError("give at least one link: --interface NAME=IFACE or "
                                 "--link NAME=PCAP (or --spool DIR for agents' links)")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise RunConfigError(f"link {', '.join(dup)} is given twice")
        for name, path in self.config.links:
            if not Path(path).is_file():
                raise RunConfigError(f"--link {name}={path}: no such capture file")
        from tools.pipeline.recordlinks import record_format

        for name, protocol, path in self.config.records:
            record_format(self.schema, name, protocol, path)
        if self.config.speed <= 0:
            raise RunConfigError("--speed must be positive")

    def _open_links(self) -> None:
        from tools.pipeline.links import open_links

        cfg = self.config
        # fanned-out interfaces are captured by the members (`tools.serve.fanout`)
        interfaces = () if self.fanned else cfg.interfaces
        self.links = open_links(cfg.links, interfaces, period_ns=cfg.punctuate_every_ns,
                                slack_ns=cfg.lull_slack_ns, speed=cfg.speed, loop=cfg.loop,
                                capture_options=cfg.capture_options, records=cfg.records,
                                schema=self.schema, separator=cfg.csv_separator)

    def _release_record_links(self) -> None:
        """Let the record links read, now that the queries resumed on them are attached: a
        file link reads past the records of the windows they have written."""
        for link in self.links.values():
            producer = link.producer
            if getattr(producer, "go", None) is None:
                continue
            starts = [sub.record.suppress[-1][1] for sub in self.submissions.values()
                      if link.name in sub.links and sub.record.suppress]
            producer.skip_before = min(starts) if starts and all(
                link.name not in sub.links or sub.record.suppress
                for sub in self.submissions.values()) else None
            producer.go.set()

    def _note_downtime(self) -> None:
        beat = self.state_dir / "server.json"
        gaps = self.state_dir / "gaps.json"
        try:
            self.gaps = json.loads(gaps.read_text()) if gaps.exists() else []
        except (OSError, ValueError):
            self.gaps = []
        try:
            last = json.loads(beat.read_text())
        except (OSError, ValueError):
            return
        reason = "server stopped" if last.get("clean") else "server crashed"
        gap: dict[str, Any] = {"from_ns": int(last["heartbeat_ns"]), "to_ns": self.started_ns,
                               "reason": reason}
        self.gaps.append(gap)
        _write_json(gaps, self.gaps)
        log.warning("%s: no capture from %s to %s", reason, when(gap["from_ns"]),
                    when(gap["to_ns"]))

    def _beat(self) -> None:
        while not self._stopping.wait(1.0):
            self._write_beat(clean=False)

    def _write_beat(self, clean: bool) -> None:
        try:
            _write_json(self.state_dir / "server.json",
                        {"pid": os.getpid(), "started_ns": self.started_ns,
                         "heartbeat_ns": time.time_ns(), "clean": clean})
        except OSError as exc:
            log.error("state %s: cannot write the heartbeat: %s", self.state_dir, exc)

    # --- queries -------------------------------------------------------------------------------
    def _now(self) -> int:
        seen = [link.timer.max_seen for link in self.links.values()
                if link.timer.max_seen is not None and not self._record_clock(link.name)]
        return max([time.time_ns(), *seen])

    def _record_clock(self, name: str) -> bool:
        """Whether link `name` is timed by its records' own field (not the wall clock)."""
        link = self.links.get(name)
        fmt = getattr(link.producer, "format", None) if link is not None else None
        return fmt is not None and not fmt.system_clock

    def _data_clock(self, sub: Submission) -> bool:
        """Whether `sub` reads links timed by their records' field (a file of records
        replayed, say): its start is then a time of that clock, not the wall clock's.
        RunConfigError when it mixes them with wall-clock links."""
        data = [n for n in sub.links if self._record_clock(n)]
        if data and len(data) < len(sub.links):
            wall = [n for n in sub.links if n not in data]
            raise RunConfigError(f"{sub.record.file}: links {', '.join(data)} are timed by "
                                 f"their records' own time and {', '.join(wall)} by the "
                                 f"wall clock; one query set reads links of one clock")
        return bool(data)

    def _check_link_kinds(self, sub: Submission) -> None:
        """Every low-level plan reads its link as what the link carries: packets, or the
        records of the protocol the server was started with."""
        for qp in sub.plan.queries:
            for lp in qp.low:
                link = self.links.get(lp.link)
                carried = getattr(link.producer, "format", None) if link is not None else None
                what = (f"{sub.record.file}: query {qp.name} reads link {lp.link} as "
                        f"{'records' if lp.record is not None else 'packets'} of "
                        f"{lp.protocol}")
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

    def submit(self, *, text: str, file: str, name: str | None = None, params=None, sets=None,
               outputs=None, fmt: str | None = None, schemas=None) -> dict:
        fmt = fmt or "csv"
        if fmt not in FORMATS:
            raise ServeError(f"--format {fmt}: allowed {', '.join(FORMATS)}")
        stem = Path(file).stem
        with self._lock:
            schemas = [[str(p), str(t)] for p, t in (schemas or [])]
            probe = Record(name=name or "probe", file=file, text=text, params=dict(params or {}),
                           sets=dict(sets or {}), format=fmt, schemas=schemas)
            names, remote = self._available_links()
            try:
                sub = Submission(probe, self.state_dir, names, remote, self.fanned,
                                 self.schema_files)
                sub.check_fanout()
                self._check_link_kinds(sub)
                data_clock = self._data_clock(sub)
            except OopscopeError as exc:     # the planner's message, with line and column
                raise ServeError(self._no_link_hint(str(exc))) from None
            if name is None:
                name = sub.chosen[0].name if len(sub.chosen) == 1 else stem
            if not NAME_RE.match(name):
                raise ServeError(f"query name {name!r}: use letters, digits and _ . : - "
                                 f"(at most 64, not starting with . or -)")
            if name in self.submissions:
                raise ServeError(f"a query named {name!r} is running; cancel it first or "
                                 f"submit with --name", status=409)
            old = self.records.get(name)
            chosen = {qp.name for qp in sub.chosen}
            out_dirs = {}
            for q, path in (outputs or {}).items():
                if q not in chosen and q not in sub.plan.names:
                    raise ServeError(f"--output {q}=...: no query {q!r} in {file}; its "
                                     f"queries are {', '.join(sub.plan.names)}")
                out_dirs[q] = str(self._output_path(path))
            record = Record(name=name, file=file, text=text, params=dict(params or {}),
                            sets=dict(sets or {}), format=fmt, schemas=schemas,
                            generation=(old.generation + 1) if old else 1)
            if sub.remote:
                assert self.agents is not None
                record.agents = dict(sub.remote)
                record.spool_root = str(self.agents.shared)
            record.fanout = dict(sub.fanout)
            if out_dirs:
                record.outputs = out_dirs
                sub = Submission(record, self.state_dir, names, remote,
                                 server_schemas=self.schema_files)
            else:
                sub.record = record
            for qp in sub.chosen:
                default = self.output_root / sub.stream_name(qp.name)
                record.outputs.setdefault(qp.name, str(self._output_path(str(default))))
            record.submitted_ns = time.time_ns()
            # a live link captures what this query reads from now on (payloads, whole
            # frames), so that its first window has them
            for link in sub.links:
                if link in self.links:
                    self.links[link].refresh_capture(
                        also=[lp for qp in sub.plan.queries for lp in qp.low if lp.link == link])
            if data_clock:
                message = self._start_on_records(sub)
            else:
                from tools.serve.agents import ATTACH_MARGIN_NS

                margin = ATTACH_MARGIN_NS if sub.remote else NS_PER_S // 5
                start = first_window_start(sub.chosen, self._now() + margin)
                record.first_window_ns = start
                record.suppress = [[INT64_MIN, start]]
                message = (f"its first window starts at {when(start)} (in "
                           f"{max(0.0, (start - time.time_ns()) / 1e9):.1f} s): packets "
                           f"before it are not counted")
            sub.record = record
            self._launch(sub)
            self.records[name] = record
            log.info("query %s submitted: %s", name, message)
            return {"name": name, "streams": list(sub.streams), "links": sub.links,
                    "agents": dict(sub.remote),
                    "first_window_ns": record.first_window_ns,
                    "outputs": {q: p for q, p in record.outputs.items()},
                    "message": f"query {name} runs on {', '.join(sub.links)}; {message}"}

    def _start_on_records(self, sub: Submission) -> str:
        """A submission on links timed by their records' own field starts with the first
        window after the latest record time read on them (from their first record when none
        has been read yet)."""
        seen = [t for n in sub.links if (t := self.links[n].timer.max_seen) is not None]
        if not seen:
            sub.record.first_window_ns = 0
            sub.record.suppress = []
            return "it counts the records from the first one read"
        start = first_window_start(sub.chosen, max(seen))
        sub.record.first_window_ns = start
        sub.record.suppress = [[INT64_MIN, start]]
        return (f"its first window starts at record time {start / NS_PER_S:.9g} s (records "
                f"before it were read before the submission and are not counted)")

    def _available_links(self) -> tuple[list[str], dict[str, str]]:
        """Every link a submission may read (the server's, then its live agents'), and
        link -> agent host of the agents' ones. A link of the server's own is the server's
        even if an agent captures one of that name."""
        own = self.config.link_names
        if self.agents is None:
            return own, {}
        lent, _ = self.agents.links()
        members = self.fanout.member_links()
        remote = {n: h for n, h in sorted(lent.items()) if n not in own and n not in members}
        return own + list(remote), {**remote, **members}

    def _no_link_hint(self, message: str) -> str:
        """The planner's message, plus what the agents say of a link it did not find."""
        if self.agents is None or "no link" not in message:
            return message
        _, twice = self.agents.links()
        notes = [f"link {n} is captured by two agents ({', '.join(h)}): give each link one "
                 f"agent" for n, h in sorted(twice.items())]
        dead = [f"{b['host']} ({', '.join(b['links'])}: {b['state']}, last beat "
                f"{b['age_s']:.0f} s ago)" for b in self.agents.status() if not b["live"]]
        if dead:
            notes.append("agents not running: " + "; ".join(dead))
        return message + ("; " + "; ".join(notes) if notes else "")

    def _output_path(self, path: str) -> Path:
        p = Path(path)
        if not p.is_absolute():
            p = self.output_root / p
        p = Path(os.path.normpath(p))
        real = p.resolve()
        if not (real == self.output_root or self.output_root in real.parents):
            raise ServeError(f"output {path}: outside the output root {self.output_root} "
                             f"(the server writes only below it; start it with "
                             f"--output-root to choose another)", status=403)
        return real

    def _launch(self, sub: Submission, built: bool = False) -> None:
        """Build, persist, attach to the links, and start the stages when Spark is up."""
        if not built:
            sub.build(self.hub, self._punctuated_at)
        sub.record.save(self.state_dir)
        if self.metrics is not None:
            self.metrics.watch(sub)

        def attach():
            for link, feed in sub.feeds.items():
                self.links[link].feeds[sub.name] = feed
                self.links[link].refresh_capture()

        assert self.router is not None
        self.router.call(attach)
        self.submissions[sub.name] = sub
        if sub.remote:
            assert self.agents is not None
            try:
                self.agents.publish(sub)
            except OSError as exc:
                self._fail(sub, f"cannot publish it for its agents: {exc}")
                raise ServeError(f"query {sub.name}: cannot publish it for its agents in "
                                 f"{self.agents.shared}: {exc}") from None
        if self.starter is not None and self.starter.ready():
            threading.Thread(target=self._start_stages, args=(sub,),
                             name=f"oopscope-start-{sub.name}", daemon=True).start()

    def _resume(self, record: Record) -> None:
        cleanly = record.stopped_cleanly
        if record.stopped_cleanly:
            remove_generation(self.state_dir, record.name, record.generation,
                              record.spool_root)
            record.generation += 1
            record.stopped_cleanly = False
        if self.fanned or record.fanout:
            links = Submission(record, self.state_dir, self._plan_names(record), {}, {},
                               self.schema_files).links
            self.fanout.refan(record, links, cleanly,
                              None if self.agents is None else str(self.agents.shared))
        remote = dict(record.agents)
        if remote and self.agents is None:
            raise RunConfigError(f"it reads the agents' links {', '.join(remote)}: start the "
                                 f"server with --spool (the directory shared with them)")
        if remote and self.agents is not None and record.spool_root != str(self.agents.shared):
            log.warning("query %s: its spool stays in %s (the server's --spool is now %s)",
                        record.name, record.spool_root, self.agents.shared)
        sub = Submission(record, self.state_dir, self._plan_names(record), remote,
                         server_schemas=self.schema_files)
        self._check_link_kinds(sub)
        sub.build(self.hub, self._punctuated_at)     # to find its spools
        gap_from = sub.last_punctuation()
        if self._data_clock(sub):
            # its links are read again from their start: it goes on where its spool stops,
            # with no gap unless its windows differ in size (`first_open_window`)
            start = (record.suppress[-1][1] if record.suppress else 0) if gap_from is None \
                else first_open_window(sub.chosen, gap_from)
            gap_from = start if gap_from is None else min(gap_from, start)
        else:
            start = first_window_start(sub.chosen, self._now() + NS_PER_S // 5)
        record.suppress.append([INT64_MIN if gap_from is None else gap_from, start])
        record.first_window_ns = start
        if gap_from is not None and gap_from == start:
            log.warning("query %s resumed (generation %d): its records are read again from "
                        "record time %.9g s on", record.name, record.generation,
                        start / NS_PER_S)
        else:
            down = self.gaps[-1]["from_ns"] if self.gaps else None
            record.gaps.append({"from_ns": gap_from if gap_from is not None else down,
                                "to_ns": start, "reason": "restart"})
            log.warning("query %s resumed (generation %d): windows from %s to %s are a gap "
                        "and are not written", record.name, record.generation,
                        "the start" if gap_from is None else when(gap_from), when(start))
        for feed in sub.feeds.values():      # packets held back until the new start
            feed.start_ns = start
        self._launch(sub, built=True)

    def _plan_names(self, record: Record) -> list[str]:
        """The links a record is planned over: the server's, and its agents' (not their
        fanout sub-links)."""
        own = self.config.link_names
        return own + [n for n in record.agents if "#" not in n and n not in own]

    def _start_stages_when_up(self) -> None:
        assert self.starter is not None
        try:
            self.starter.result()
        except BaseException as exc:  # noqa: BLE001 - reported by status
            log.error("Spark did not start: %s; queries keep their spools until it does", exc)
            return
        for sub in list(self.submissions.values()):
            if not sub.stages_started:
                self._start_stages(sub)

    def _start_stages(self, sub: Submission) -> None:
        with self._lock:
            if sub.stages_started or sub.name not in self.submissions:
                return
            try:
                assert self.starter is not None
                sub.start_stages(self.starter.result())
            except Exception as exc:  # noqa: BLE001 - that query fails, the others go on
                self._fail(sub, f"its Spark stage did not start: {exc}")

    def _feed_failed(self, name: str, exc: BaseException) -> None:
        sub = self.submissions.get(name)
        if sub is not None:
            threading.Thread(target=self._fail, args=(sub, f"low level failed: {exc}"),
                             daemon=True).start()

    def _fail(self, sub: Submission, why: str) -> None:
        with self._lock:
            if self.submissions.get(sub.name) is not sub:    # cancelled or failed already
                return
            log.error("query %s failed: %s", sub.name, why)
            self._detach(sub)
            if sub.remote and self.agents is not None:
                try:
                    self.agents.withdraw(sub)        # its agents end their part
                except OSError as exc:
                    log.error("query %s: cannot withdraw it from the agents: %s", sub.name,
                              exc)
            sub.abandon_stages()
            sub.error = why
            sub.record.state, sub.record.error = "failed", why
            sub.record.final = {**sub.info(), "state": "failed", "error": why}
            sub.record.save(self.state_dir)
            self.submissions.pop(sub.name, None)
            self.hub.publish("queries", None, {})

    def _detach(self, sub: Submission) -> None:
        def detach():
            for link in sub.feeds:
                self.links[link].feeds.pop(sub.name, None)
                self.links[link].refresh_capture()

        assert self.router is not None
        self.router.call(detach)

    def cancel(self, name: str) -> dict:
        with self._lock:
            sub = self.submissions.get(name)
            if sub is None:
                known = ", ".join(sorted(self.submissions)) or "none"
                raise ServeError(f"no running query {name!r} (running: {known})", status=404)
            # what its agents report, read before they end it (their reports go with it)
            lent = {} if self.agents is None or not sub.remote else \
                self.agents.counters(name, sub.record.generation)
            self._stop(sub)
            sub.record.state = "cancelled"
            info = sub.info()
            for key, value in lent.items():
                info[key] += value
            sub.record.final = {**info, "state": "cancelled"}
            sub.record.save(self.state_dir)
            self.submissions.pop(name)
            remove_generation(self.state_dir, name, sub.record.generation,
                              sub.record.spool_root)
        self.hub.publish("queries", None, {})
        return {"name": name, "rows_out": info["rows_out"], "outputs": info["outputs"],
                "message": f"query {name} cancelled: its open windows were closed and "
                           f"written ({info['rows_out']} rows in all); outputs kept"}

    def _stop(self, sub: Submission) -> None:
        """Detach, close every window, write it, stop the stages (cancel and shutdown)."""
        self._detach(sub)
        if sub.remote and self.agents is not None:
            self.agents.cancel(sub)      # the agents end their part meanwhile
        sub.finish_low()
        if sub.remote and self.agents is not None:
            self.agents.finish(sub)      # their end of input is in the spool
        spark = None
        if self.starter is not None and self.starter.ready() and self.starter.error is None:
            spark = self.starter.result()
        sub.stop_stages(spark)
        sub.close_outputs()
        sub.record.stopped_cleanly = spark is not None

    def shutdown(self) -> None:
        """Every window of every query closed and written; the links and Spark stopped."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.warning("stopping: closing every window and writing the results")
        for link in self.links.values():
            link.producer.stop()
        if self.router is not None:
            self.router.stop()
            self.router.join(timeout=10)
            self.router.drain_all()
        with self._lock:
            if self.agents is not None:      # every agent ends its part at once
                for sub in self.submissions.values():
                    if sub.remote:
                        try:
                            self.agents.cancel(sub)
                        except OSError as exc:
                            log.error("query %s: %s", sub.name, exc)
            for sub in list(self.submissions.values()):
                try:
                    self._stop(sub)
                    sub.record.save(self.state_dir)
                except Exception as exc:  # noqa: BLE001 - the other queries still stop
                    log.error("query %s: %s", sub.name, exc)
        for link in self.links.values():
            link.producer.join(timeout=5)
            link.producer.close()
        self.fanout.stop()            # after every query's part of theirs ended
        if self.fanout.members is not None and self.agents is not None:
            try:
                self.agents.refresh()     # their last beats, for the summary
            except Exception as exc:  # noqa: BLE001 - the summary only
                log.debug("agents: %s", exc)
        self._write_beat(clean=True)

    def _watch_agents(self) -> None:
        """Every POLL_S: the agents' heartbeats; their silent links left out of the Meld of
        the stages that read them; a query an agent cannot run fails."""
        from tools.serve.agents import POLL_S

        assert self.agents is not None
        warned: set[tuple[str, str]] = set()
        while not self._stopping.wait(POLL_S):
            try:
                self.agents.refresh()
            except Exception as exc:  # noqa: BLE001 - tried again at the next poll
                log.warning("agents in %s: %s", self.agents.shared, exc)
                continue
            gone = self.fanout.check()
            for sub in list(self.submissions.values()):
                if not sub.remote:
                    continue
                silent = self.agents.silent_links(sub.remote) | (gone & set(sub.remote))
                if sub.graph is not None and sub.stages_started:
                    for _, stage in sub.graph.stages:
                        stage.silent_links = silent
                for host in self.agents.late(sub.name, sub.record.generation):
                    if (sub.name, host) not in warned:
                        warned.add((sub.name, host))
                        log.warning("query %s: agent %s attached after its first window "
                                    "began: that window lacks some of its packets", sub.name,
                                    host)
                failed = self.agents.failures(sub.name, sub.record.generation)
                if failed:
                    host, why = failed[0]
                    self._fail(sub, f"agent {host}: {why}")

    # --- reading -------------------------------------------------------------------------------
    def _punctuated_at(self, links: list[str], p: int) -> int | None:
        times = [self.links[n].punctuated_at(p) for n in links if n in self.links]
        if not times or any(t is None for t in times):
            return None
        return max(t for t in times if t is not None)

    def spark_state(self) -> dict:
        st = self.starter
        if st is None or not st.ready():
            state, error = "starting", None
        elif st.error is not None:
            state, error = "failed", str(st.error).splitlines()[0][:300]
        else:
            state, error = "up", None
        return {"state": state, "master": self.config.master or "local[*]", "error": error}

    def status(self) -> dict:
        fanned, members = self.fanout.status()
        return {"started": self.started_ns / 1e9,
                "uptime_s": (time.time_ns() - self.started_ns) / 1e9,
                "links": [link.stats() for link in self.links.values()] + fanned,
                "fanout": members,
                "spark": self.spark_state(), "gaps": self.gaps,
                "queries": len(self.submissions), "state_dir": str(self.state_dir),
                "output_root": str(self.output_root),
                "spool": None if self.agents is None else str(self.agents.shared),
                "agents": [] if self.agents is None else self.agents.status()}

    def queries(self) -> list[dict]:
        with self._lock:
            running = [self._info(s) for s in self.submissions.values()]
            names = set(self.submissions)
            blank = {"links": [], "streams": [], "columns": [], "numeric": [], "rows_out": 0,
                     "partial_rows": 0, "evictions": 0, "flushes": 0, "late_packets": 0,
                     "zero_divisor_packets": 0, "zero_divisor_rows": 0,
                     "latency_p50_s": None, "generation": 0}
            others = [{**blank, **r.final, "name": r.name, "file": r.file, "state": r.state,
                       "error": r.error, "first_window_ns": r.first_window_ns,
                       "gaps": r.gaps, "outputs": r.outputs}
                      for r in self.records.values() if r.name not in names]
        return running + others

    def _info(self, sub: Submission) -> dict:
        """A submission's counters, with those its agents report of their links."""
        info = sub.info()
        if sub.remote and self.agents is not None:
            for key, value in self.agents.counters(sub.name, sub.record.generation).items():
                info[key] = info.get(key, 0) + value
        return info

    def stream_of(self, name: str) -> str:
        """The stream `name` names: a stream, or a submission with one stream."""
        for sub in self.submissions.values():
            if name in sub.streams:
                return name
            if sub.name == name:
                if len(sub.streams) == 1:
                    return next(iter(sub.streams))
                raise ServeError(f"query {name} has several outputs; tail one of "
                                 f"{', '.join(sub.streams)}")
        raise ServeError(f"no running query {name!r} (running: "
                         f"{', '.join(sorted(self.submissions)) or 'none'})", status=404)

    def rows(self, name: str, limit: int) -> dict:
        stream = self.stream_of(name)
        recent = list(self.hub.recent.get(stream, ()))[-max(0, limit):]
        return {"name": stream, "columns": self.hub.columns.get(stream, []), "rows": recent}


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
