"""The appliance's submitted queries: submit, resume, fail, cancel and stop them, list them."""

from __future__ import annotations

import ctypes
import gc
import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import OopscopeError
from common.units import INT64_MAX, NS_PER_S
from tools.errors import RunConfigError
from tools.pipeline.windows import first_open_window, first_window_start, when
from tools.serve.budget import MemoryBudget
from tools.serve.carryover import last_rows
from tools.serve.config import ServeError
from tools.serve.submission import FORMATS, NAME_RE, Record, Submission, remove_generation

if TYPE_CHECKING:
    from tools.pipeline.threads import SessionStarter
    from tools.serve.config import ServeConfig
    from tools.serve.linkset import LinkSet
    from tools.serve.metrics import Metrics
    from tools.serve.remote import RemoteLinks
    from tools.serve.statedir import StateDir
    from tools.serve.tail import Hub

log = logging.getLogger(__name__)

INT64_MIN = -INT64_MAX - 1


class Submissions:
    """The queries submitted to the server: the running ones (`Submission`), the records of
    every one the state directory knows (`Record`: running, cancelled or failed), and the
    Spark session their stages run on. A submission is planned over the server's links and
    its agents' (`RemoteLinks`), attached to the links (`LinkSet`) and started when Spark is
    up; at a start, every record that was running is resumed (a new generation after a
    clean stop; after a crash its spool goes on, the time the server was down a gap). One
    lock orders submit, cancel, failure, the listing and the stop."""

    def __init__(self, config: ServeConfig, state: StateDir, hub: Hub, links: LinkSet,
                 remote: RemoteLinks):
        self.config = config
        self._state = state
        self.state_dir = state.path
        self.output_root = state.output_root
        self._hub = hub
        self._links = links
        self._remote = remote
        #: (path, text) of the server's schema files (`resume_all` takes them)
        self.schema_files: list[tuple[str, str]] = []
        self._running: dict[str, Submission] = {}
        self._records: dict[str, Record] = {}
        self._starter: SessionStarter | None = None
        self._spark_asked = 0.0
        self._metrics: Metrics | None = None
        self._lock = threading.RLock()
        #: the files a submission may name (`--data-dir`) and the memory its tables may take
        self.files = config.data_files
        self.budget = MemoryBudget(config.memory_budget)

    def __len__(self) -> int:
        return len(self._running)

    def running(self) -> list[Submission]:
        return list(self._running.values())

    def watch_with(self, metrics: Metrics) -> None:
        """Every submission's output latency observed by `metrics`, from now on."""
        self._metrics = metrics
        for sub in self._running.values():
            metrics.watch(sub)

    # --- Spark ---------------------------------------------------------------------------------
    def start_spark(self) -> None:
        """Start the Spark session in the background (stages start when it is up)."""
        from tools.pipeline.threads import SessionStarter, driver_nice

        self._spark_asked = time.monotonic()
        log.info("starting Spark (%s): queries are captured meanwhile, their windows are "
                 "written once it is up", self.config.master or "local[*]")
        self._starter = SessionStarter(self.config.master, quick_jvm=False,
                                       nice=driver_nice(self.config.live, True))
        self._starter.start()

    def spark_state(self) -> dict:
        st = self._starter
        if st is None or not st.ready():
            state, error = "starting", None
        elif st.error is not None:
            state, error = "failed", str(st.error).splitlines()[0][:300]
        else:
            state, error = "up", None
        return {"state": state, "master": self.config.master or "local[*]", "error": error}

    def start_stages_when_up(self) -> None:
        """Start the stages of every submission once Spark is up (on a thread of its own)."""
        threading.Thread(target=self._start_stages_when_up, name="oopscope-stages",
                         daemon=True).start()

    def _start_stages_when_up(self) -> None:
        assert self._starter is not None
        try:
            self._starter.result()
        except BaseException as exc:  # noqa: BLE001 - reported by status
            log.error("Spark did not start: %s; queries keep their spools until it does", exc)
            return
        log.info("Spark is up (it took %.1f s)", time.monotonic() - self._spark_asked)
        from highlevel.warmup import warm_session

        # a fresh JVM compiles a micro-batch's paths on first use, which the first windows
        # of every query paid (seconds of lag)
        warm_session(self._starter.result())
        for sub in list(self._running.values()):
            if not sub.stages_started:
                self._start_stages(sub)

    def _start_stages(self, sub: Submission) -> None:
        with self._lock:
            if sub.stages_started or sub.name not in self._running:
                return
            try:
                assert self._starter is not None
                sub.start_stages(self._starter.result())
            except Exception as exc:  # noqa: BLE001 - that query fails, the others go on
                self.fail(sub, f"its Spark stage did not start: {exc}")

    # --- submit --------------------------------------------------------------------------------
    def submit(self, *, text: str, file: str, name: str | None = None, params=None, sets=None,
               outputs=None, fmt: str | None = None, schemas=None, link_map=None) -> dict:
        fmt = fmt or "csv"
        if fmt not in FORMATS:
            raise ServeError(f"--format {fmt}: allowed {', '.join(FORMATS)}")
        stem = Path(file).stem
        with self._lock:
            schemas = [[str(p), str(t)] for p, t in (schemas or [])]
            probe = Record(name=name or "probe", file=file, text=text, params=dict(params or {}),
                           sets=dict(sets or {}), format=fmt, schemas=schemas,
                           link_map=dict(link_map or {}))
            names, remote = self._remote.available(self.config.link_names)
            try:
                sub = Submission(probe, self.state_dir, names, remote, self._remote.fanned,
                                 self.schema_files, files=self.files)
                sub.check_fanout()
                self._links.check_kinds(sub)
                data_clock = self._links.data_clock(sub)
            except OopscopeError as exc:     # the planner's message, with line and column
                raise ServeError(self._remote.no_link_hint(str(exc))) from None
            self.budget.check(sub, self._running.values())     # before anything is allocated
            if name is None:
                name = sub.chosen[0].name if len(sub.chosen) == 1 else stem
            if not NAME_RE.match(name):
                raise ServeError(f"query name {name!r}: use letters, digits and _ . : - "
                                 f"(at most 64, not starting with . or -)")
            if name in self._running:
                raise ServeError(f"a query named {name!r} is running; cancel it first or "
                                 f"submit with --name", status=409)
            old = self._records.get(name)
            chosen = {qp.name for qp in sub.chosen}
            out_dirs = {}
            for q, path in (outputs or {}).items():
                if q not in chosen and q not in sub.plan.names:
                    raise ServeError(f"--output {q}=...: no query {q!r} in {file}; its "
                                     f"queries are {', '.join(sub.plan.names)}")
                out_dirs[q] = str(self._output_path(path))
            record = Record(name=name, file=file, text=text, params=dict(params or {}),
                            sets=dict(sets or {}), format=fmt, schemas=schemas,
                            link_map=dict(link_map or {}),
                            generation=(old.generation + 1) if old else 1)
            record.first_generation = record.generation
            if sub.remote:
                assert self._remote.shared is not None
                record.agents = dict(sub.remote)
                record.spool_root = str(self._remote.shared)
            record.fanout = dict(sub.fanout)
            if out_dirs:
                record.outputs = out_dirs
                sub = Submission(record, self.state_dir, names, remote,
                                 server_schemas=self.schema_files, files=self.files)
            else:
                sub.record = record
            for qp in sub.chosen:
                default = self.output_root / sub.stream_name(qp.name)
                record.outputs.setdefault(qp.name, str(self._output_path(str(default))))
            record.submitted_ns = time.time_ns()
            self._links.prepare(sub)
            if data_clock:
                message = self._start_on_records(sub)
            else:
                from tools.serve.agents import ATTACH_MARGIN_NS

                margin = ATTACH_MARGIN_NS if sub.remote else NS_PER_S // 5
                start = first_window_start(sub.chosen, self._links.now() + margin)
                record.first_window_ns = start
                record.suppress = [[INT64_MIN, start]]
                message = (f"its first window starts at {when(start)} (in "
                           f"{max(0.0, (start - time.time_ns()) / 1e9):.1f} s): packets "
                           f"before it are not counted")
            sub.record = record
            chosen_on_attach: list[str] = []

            def start_on_records() -> None:
                # chosen again on the router's thread as the feeds attach: a record read
                # between the first choice and the attachment would otherwise be lost
                chosen_on_attach.append(self._start_on_records(sub))
                for feed in sub.feeds.values():
                    feed.start_ns = record.first_window_ns

            self._launch(sub, before_attach=start_on_records if data_clock else None)
            message = chosen_on_attach[0] if chosen_on_attach else message
            self._records[name] = record
            log.info("query %s submitted: %s", name, message)
            return {"name": name, "streams": list(sub.streams), "links": sub.links,
                    "agents": dict(sub.remote),
                    "first_window_ns": record.first_window_ns,
                    "outputs": {q: p for q, p in record.outputs.items()},
                    "message": f"query {name} runs on {', '.join(sub.links)}; {message}; "
                               f"{_writes(record.outputs)}"}

    def _start_on_records(self, sub: Submission) -> str:
        """A submission on links timed by their records' own field starts with the first
        window after the latest record time read on them (from their first record when none
        has been read yet)."""
        seen = self._links.latest_seen(sub.links, sub)
        if not seen:
            sub.record.first_window_ns = 0
            sub.record.suppress = []
            return "it counts the records from the first one read"
        start = first_window_start(sub.chosen, max(seen))
        sub.record.first_window_ns = start
        sub.record.suppress = [[INT64_MIN, start]]
        return (f"its first window starts at record time {start / NS_PER_S:.9g} s (records "
                f"before it were read before the submission and are not counted)")

    def _output_path(self, path: str) -> Path:
        return self._state.output_dir(path)

    def _launch(self, sub: Submission, built: bool = False, before_attach=None) -> None:
        """Build, persist, attach to the links (`before_attach` runs on the router's thread
        just before, and the record is saved again after it), and start the stages when
        Spark is up."""
        if not built:
            from lowlevel.footprint import footprint

            # an adaptive table grows only while the memory budget holds it
            sub.allow_slots = lambda lp: self.budget.grant(
                sub.name, footprint(lp), lambda: list(self._running.values()))
            try:
                sub.build(self._hub, self._links.punctuated_for(sub))
            except BaseException:
                sub.release()             # the spool thread it may have started
                raise
        sub.record.save(self.state_dir)
        if self._metrics is not None:
            self._metrics.watch(sub)
        self._links.attach(sub, before_attach)
        if before_attach is not None:
            sub.record.save(self.state_dir)
        self._running[sub.name] = sub
        if sub.remote:
            try:
                self._remote.publish(sub)
            except OSError as exc:
                self.fail(sub, f"cannot publish it for its agents: {exc}")
                raise ServeError(f"query {sub.name}: cannot publish it for its agents in "
                                 f"{self._remote.shared}: {exc}") from None
        if self._starter is not None and self._starter.ready():
            threading.Thread(target=self._start_stages, args=(sub,),
                             name=f"oopscope-start-{sub.name}", daemon=True).start()

    # --- resume --------------------------------------------------------------------------------
    def resume_all(self, schema_files: list[tuple[str, str]], down_since: int | None) -> None:
        """Take the server's schema files, and resume every query the state directory says
        was running (`down_since`: when the server last went down); one that cannot resume
        is failed, the others go on."""
        self.schema_files = schema_files
        shared = self._remote.shared
        # a record names directories the server writes to and removes: one that is not
        # sound, or that points elsewhere than the server's own, is skipped
        spool_roots = ("",) if shared is None else ("", str(shared))
        for record in Record.load_all(self.state_dir, self._state.output_problem,
                                      spool_roots):
            self._records[record.name] = record
            if record.state == "running":
                try:
                    self._resume(record, down_since)
                except Exception as exc:  # noqa: BLE001 - the other queries go on
                    record.state, record.error = "failed", str(exc)
                    log.error("query %s: cannot resume: %s", record.name, exc)
                    try:
                        record.save(self.state_dir)
                    except OSError as err:
                        log.error("query %s: cannot save its record: %s", record.name,
                                  err.strerror)

    def skip_before(self, link: str) -> int | None:
        """Where record link `link` reads from: past the windows every resumed query on it
        has written (None: from its start)."""
        starts = [sub.record.suppress[-1][1] for sub in self._running.values()
                  if link in sub.links and sub.record.suppress]
        return min(starts) if starts and all(
            link not in sub.links or sub.record.suppress
            for sub in self._running.values()) else None

    def _resume(self, record: Record, down_since: int | None) -> None:
        cleanly = record.stopped_cleanly
        if record.stopped_cleanly:
            remove_generation(self.state_dir, record.name, record.generation,
                              record.spool_root)
            record.generation += 1
            record.stopped_cleanly = False
        if self._remote.fanned or record.fanout:
            links = Submission(record, self.state_dir, self._plan_names(record), {}, {},
                               self.schema_files, files=self.files).links
            self._remote.refan(record, links, cleanly)
        remote = dict(record.agents)
        shared = self._remote.shared
        if remote and shared is None:
            raise RunConfigError(f"it reads the agents' links {', '.join(remote)}: start the "
                                 f"server with --spool (the directory shared with them)")
        if remote and shared is not None and record.spool_root != str(shared):
            log.warning("query %s: its spool stays in %s (the server's --spool is now %s)",
                        record.name, record.spool_root, shared)
        sub = Submission(record, self.state_dir, self._plan_names(record), remote,
                         server_schemas=self.schema_files, files=self.files)
        self._links.check_kinds(sub)
        try:
            self._resume_built(sub, down_since)
        except BaseException:
            sub.release()                 # the spool thread `build` may have started
            raise

    def _resume_built(self, sub: Submission, down_since: int | None) -> None:
        record = sub.record
        sub.build(self._hub, self._links.punctuated_for(sub))     # to find its spools
        gap_from = sub.last_punctuation()
        if self._links.data_clock(sub):
            # its links are read again from their start: it goes on where its spool stops,
            # with no gap unless its windows differ in size (`first_open_window`)
            start = (record.suppress[-1][1] if record.suppress else 0) if gap_from is None \
                else first_open_window(sub.chosen, gap_from)
            gap_from = start if gap_from is None else min(gap_from, start)
        else:
            start = first_window_start(sub.chosen, self._links.now() + NS_PER_S // 5)
        record.suppress.append([INT64_MIN if gap_from is None else gap_from, start])
        record.first_window_ns = start
        if gap_from is not None and gap_from == start:
            log.info("query %s resumed (generation %d): its records are read again from "
                     "record time %.9g s on", record.name, record.generation,
                     start / NS_PER_S)
        else:
            record.gaps.append({"from_ns": gap_from if gap_from is not None else down_since,
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

    # --- end -----------------------------------------------------------------------------------
    def feed_failed(self, name: str, exc: BaseException) -> None:
        """The router's report that submission `name`'s low level failed: it fails."""
        sub = self._running.get(name)
        if sub is not None:
            threading.Thread(target=self.fail, args=(sub, f"low level failed: {exc}"),
                             daemon=True).start()

    def fail(self, sub: Submission, why: str) -> None:
        """`sub` fails (`why`): detached, its agents' part withdrawn, its stages abandoned."""
        with self._lock:
            if self._running.get(sub.name) is not sub:    # cancelled or failed already
                return
            log.error("query %s failed: %s", sub.name, why)
            self._links.detach(sub)
            self._remote.withdraw(sub)            # its agents end their part
            sub.abandon_stages()
            sub.error = why
            sub.record.state, sub.record.error = "failed", why
            sub.record.final = {**sub.info(), "state": "failed", "error": why}
            sub.keep_counters()
            # as a cancel does: its spool thread, tables and spool go, its tails end
            sub.release()
            sub.close_outputs()
            sub.record.save(self.state_dir)
            self._running.pop(sub.name, None)
            self.budget.release(sub.name)
            # its spool on a shared directory stays: its agents, withdrawn, may still write
            remove_generation(self.state_dir, sub.name, sub.record.generation)
            self._hub.publish("queries", None, {})
        give_back_memory()

    def cancel(self, name: str) -> dict:
        with self._lock:
            sub = self._running.get(name)
            if sub is None:
                known = ", ".join(sorted(self._running)) or "none"
                raise ServeError(f"no running query {name!r} (running: {known})", status=404)
            # what its agents report, read before they end it (their reports go with it)
            lent = self._remote.counters(sub)
            self._stop(sub)
            sub.record.state = "cancelled"
            info = with_lent(sub.info(), lent)
            sub.record.final = {**info, "state": "cancelled"}
            sub.keep_counters()
            sub.record.save(self.state_dir)
            self._running.pop(name)
            self.budget.release(name)
            sub.release()
            remove_generation(self.state_dir, name, sub.record.generation,
                              sub.record.spool_root)
        self._hub.publish("queries", None, {})
        give_back_memory()
        return {"name": name, "rows_out": info["rows_out"], "outputs": info["outputs"],
                "counted_since_ns": info["counted_since_ns"],
                "message": f"query {name} cancelled: its open windows were closed and "
                           f"written ({info['rows_out']} rows in all since its submission "
                           f"at {when(info['counted_since_ns'])}); outputs kept: "
                           f"{', '.join(d + '/' for d in info['outputs'].values())}"}

    def _stop(self, sub: Submission) -> None:
        """Detach, close every window, write it, stop the stages (cancel and shutdown)."""
        self._links.detach(sub)
        self._remote.cancel(sub)          # the agents end their part meanwhile
        sub.finish_low()
        self._remote.finish(sub)          # their end of input is in the spool
        spark = None
        st = self._starter
        if st is not None and st.ready() and st.error is None:
            spark = st.result()
        sub.stop_stages(spark)
        sub.close_outputs()
        sub.record.stopped_cleanly = spark is not None

    def stop_all(self) -> None:
        """At shutdown: every query stopped (its windows closed and written) and saved; its
        agents told first, so that they all end their parts at once."""
        with self._lock:
            for sub in self._running.values():
                try:
                    self._remote.cancel(sub)
                except OSError as exc:
                    log.error("query %s: %s", sub.name, exc)
            for sub in list(self._running.values()):
                try:
                    self._stop(sub)
                    self._note_records_read(sub)
                    sub.keep_counters()
                    sub.record.save(self.state_dir)
                except Exception as exc:  # noqa: BLE001 - the other queries still stop
                    log.error("query %s: %s", sub.name, exc)

    def _note_records_read(self, sub: Submission) -> None:
        """A query on links timed by their records' own field, stopped cleanly: each window
        holding a record read was closed and written, and its spool goes with its
        generation, so its next generation starts at the first window after the latest
        record time read (a collector's records of windows written are not counted twice,
        a file's are read past)."""
        if not sub.record.stopped_cleanly or not self._links.data_clock(sub):
            return
        seen = self._links.latest_seen(sub.links, sub)
        if seen:
            sub.record.suppress.append([INT64_MIN, first_window_start(sub.chosen, max(seen))])

    # --- reading -------------------------------------------------------------------------------
    def queries(self) -> list[dict]:
        """Every query: the running ones' counters, the others' last."""
        with self._lock:
            running = [self._info(s) for s in self._running.values()]
            names = set(self._running)
            blank = {"links": [], "streams": [], "columns": [], "numeric": [], "rows_out": 0,
                     "partial_rows": 0, "evictions": 0, "flushes": 0, "late_packets": 0,
                     "zero_divisor_packets": 0, "zero_divisor_rows": 0,
                     "latency_p50_s": None, "generation": 0}
            others = [{**blank, **r.final, "name": r.name, "file": r.file, "state": r.state,
                       "error": r.error, "first_window_ns": r.first_window_ns,
                       "counted_since_ns": r.submitted_ns, "gaps": r.gaps,
                       "outputs": r.outputs}
                      for r in self._records.values() if r.name not in names]
        return running + others

    def _info(self, sub: Submission) -> dict:
        """A submission's counters, with those its agents report of their links."""
        return with_lent(sub.info(), self._remote.counters(sub))

    def stream_of(self, name: str) -> str:
        """The stream `name` names: a stream, or a submission with one stream."""
        for sub in self._running.values():
            if name in sub.streams:
                return name
            if sub.name == name:
                if len(sub.streams) == 1:
                    return next(iter(sub.streams))
                raise ServeError(f"query {name} has several outputs; tail one of "
                                 f"{', '.join(sub.streams)}")
        raise ServeError(f"no running query {name!r} (running: "
                         f"{', '.join(sorted(self._running)) or 'none'})", status=404)

    def ended_rows(self, name: str, limit: int) -> dict | None:
        """The last `limit` rows of stream `name` of a query that no longer runs (cancelled,
        failed, or not resumed): those this process passed on if it passed on as many, else
        those of its output files; None when no query that ended has that stream."""
        with self._lock:
            if name in self._running or any(name in s.streams for s in self._running.values()):
                return None
            for record in self._records.values():
                streams = {record.name if len(record.outputs) == 1 else f"{record.name}.{q}": q
                           for q in record.outputs}
                if record.name == name and len(streams) > 1:
                    raise ServeError(f"query {name} has several outputs; tail one of "
                                     f"{', '.join(streams)}")
                if name in streams:
                    break
            else:
                return None
        recent = list(self._hub.recent.get(name, ()))[-limit:]
        if len(recent) == limit:
            columns = self._hub.columns.get(name, [])
        else:       # this process passed on fewer: the files hold every row
            columns, recent = last_rows(record.outputs[streams[name]], record.format,
                                        record.first_generation, limit)
        return {"name": name, "state": record.state, "columns": columns, "rows": recent}

    def rows(self, name: str, limit: int) -> dict:
        stream = self.stream_of(name)
        recent = list(self._hub.recent.get(stream, ()))[-max(0, limit):]
        return {"name": stream, "columns": self._hub.columns.get(stream, []), "rows": recent}


def _writes(outputs: dict[str, str]) -> str:
    """Where a submission writes: each output is a directory of part files, whatever its
    name says (`out.csv` too)."""
    if len(outputs) == 1:
        return (f"it writes into {next(iter(outputs.values()))}/, a directory of part "
                f"files (one per micro-batch)")
    return ("it writes " + ", ".join(f"{q} into {d}/" for q, d in outputs.items())
            + ": directories of part files (one per micro-batch)")


def give_back_memory() -> None:
    """After a query ended: its operators' tables freed now and their pages given back to
    the system. A failed low level's traceback holds its operator in a reference cycle
    (frames and the exception), freed only by a full collection; and tables freed inside
    the C heap stay in the process's resident set until trimmed."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):     # not glibc: its allocator decides
        pass


def with_lent(info: dict, lent: dict[str, int]) -> dict:
    """A submission's `info` with the counters its agents report of their links added (their
    partial rows, their tables' slots) and its partial rows per result row counted again
    over all of them."""
    for key, value in lent.items():
        info[key] = info.get(key, 0) + value
    rows = info.get("rows_out") or 0
    info["partials_per_row"] = round(info["partial_rows"] / rows, 3) if rows else None
    return info
