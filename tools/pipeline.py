"""`oopscope run`: packet sources -> low-level operators -> spool -> Spark stages -> outputs.

`run(RunConfig(...)) -> RunSummary` is the library behind the command:

1. plan the query file for its links (`--link NAME=PCAP` files or `--interface NAME=IFACE`
   live interfaces) and pick the queries to run: those named by `--output`, else every query
   that no other query reads. A picked query the Spark stage cannot run is an error naming it
   before any packet is read.
2. per link, one source feeds every low-level operator of the picked queries that read it
   (`tools.feeds`): capture files are replayed interleaved by capture time, at full speed or
   paced (`tools.replay`); interfaces are captured live by a thread each into a packet ring
   (`tools.livelinks`). Timer-driven punctuation (`tools.punctuation`) advances each link's
   low-watermark every period, and during a lull to `clock - slack`, so silent links do not
   stall windows. Partial rows and punctuation go to the spool.
3. the Spark stages combine the partial rows, close windows on the combined punctuation and
   hand the rows to the outputs (`tools.outputs`). Paced and live runs run them
   continuously, so each window appears as soon as its punctuation arrives. A replay at full
   speed starts the JVM in the background; if the low level is still reading when Spark is
   up, the stages run continuously from then on (the two levels overlap on two cores),
   otherwise they run once over the whole spool when the low level is done.

SIGTERM or Ctrl-C stops the sources; every link then punctuates "end of input", every open
window is closed and written, and the run ends normally. A second Ctrl-C aborts.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.errors import RunConfigError, RunError, RunLinkError, UnsupportedQueryError
from tools.feeds import END_OF_INPUT, SPOOL_FLUSH_ROWS  # noqa: F401  (re-exported)
from tools.outputs import FORMATS, QueryOutput  # noqa: F401
from tools.outputs import output_format as _format_of

log = logging.getLogger(__name__)

NS = 1_000_000_000


@dataclass(frozen=True)
class RunConfig:
    """One run. `links`: (name, capture path) pairs; `interfaces`: (name, interface) pairs
    (one kind or the other); `outputs`: (query, path or "-") pairs, empty for every query that
    no other query reads, to stdout."""

    query_file: str
    links: tuple[tuple[str, str], ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()
    format: str | None = None            # None: from the output path's suffix, else table
    overrides: tuple[tuple[str, str], ...] = ()
    params: tuple[tuple[str, str], ...] = ()
    master: str | None = None
    spool: str | None = None             # None: a temporary directory removed at the end
    checkpoint: str | None = None        # None: a temporary directory removed at the end
    punctuate_every_ns: int = NS         # timer period (data time at full speed, else wall)
    batch_size: int = 65536
    parallel_stages: int = 4             # Spark stages of different queries run side by side
    interfaces: tuple[tuple[str, str], ...] = ()
    speed: float | None = None           # None: as fast as possible; N: N x real time
    duration_ns: int | None = None       # stop after this much of the run's clock
    lull_slack_ns: int = NS              # a silent link punctuates clock - slack
    progress: bool | None = None         # None: when stderr is a terminal
    capture_options: tuple[tuple[str, object], ...] = ()   # capture.live.LiveCapture options
    extra_sinks: tuple = ()              # (query, Sink) pairs beside the outputs (NetFlow ...)
    # every output row also stays in memory, as RunSummary.results (the Python API and the
    # tests read them); the CLI keeps none: rows are written as windows close, and a live run
    # would otherwise grow without bound
    keep_results: bool = True

    @property
    def link_names(self) -> list[str]:
        return [n for n, _ in self.links] + [n for n, _ in self.interfaces]

    @property
    def live(self) -> bool:
        return bool(self.interfaces)

    @property
    def streaming(self) -> bool:
        """Stages run continuously (paced and live runs) rather than after the low level."""
        return self.live or self.speed is not None


@dataclass
class LinkSummary:
    name: str
    path: str                           # the capture file, or "interface IFACE"
    packets: int = 0
    bytes: int = 0
    malformed: int = 0
    reasons: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    punctuations: int = 0
    ring_drops: int = 0
    kernel_drops: int = 0


@dataclass
class QuerySummary:
    name: str
    output: str
    format: str
    rows: int = 0
    partial_rows: int = 0
    spool_files: int = 0
    evictions: int = 0
    flushed: int = 0
    forced_full_flushes: int = 0
    late_packets: int = 0           # dropped (late 'drop')
    late_partial_rows: int = 0
    late_corrected: int = 0         # late 'correct': late packets aggregated apart ...
    correction_rows: int = 0        # ... and the correction rows written for them


@dataclass
class RunSummary:
    links: dict[str, LinkSummary]
    queries: dict[str, QuerySummary]
    results: dict = field(default_factory=dict, repr=False)   # query -> pyarrow.Table
    ended: str = "end of input"         # or "duration", "stopped", "capture failed"
    clock_origin: tuple | None = None   # paced runs: (epoch s, capture ns) of the clock's start
    lowlevel_seconds: float = 0.0
    spark_wait_seconds: float = 0.0     # waiting for the session after the low level ended
    highlevel_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def problems(self) -> list[str]:
        return [f"link {s.name}: {p}" for s in self.links.values() for p in s.problems]

    def format(self) -> str:
        """The human summary printed on stderr at the end of a run."""
        lines = []
        from capture.schema import BENIGN_REASONS, REASONS

        benign = {REASONS[c] for c in BENIGN_REASONS}
        for s in self.links.values():
            bad = ", ".join(f"{k} {v}" for k, v in sorted(s.reasons.items())
                            if k not in benign) or "none"
            lines.append(f"link {s.name}: {s.packets} packets, {s.bytes} bytes, "
                         f"{s.malformed} malformed ({bad}), {s.ring_drops} ring drops, "
                         f"{s.kernel_drops} kernel drops, {s.punctuations} punctuations "
                         f"[{s.path}]")
            lines += [f"link {s.name}: problem: {p}" for p in s.problems]
        for q in self.queries.values():
            lines.append(f"query {q.name}: {q.rows} rows -> {q.output} ({q.format}); "
                         f"{q.partial_rows} partial rows in {q.spool_files} spool files, "
                         f"{q.evictions} evictions, {q.flushed} flushed, "
                         f"{q.forced_full_flushes} forced full flushes, "
                         f"{q.late_packets} late packets, {q.late_partial_rows} late partials"
                         + (f", {q.late_corrected} late packets corrected in "
                            f"{q.correction_rows} correction rows"
                            if q.late_corrected or q.correction_rows else ""))
        lines.append(f"run ended: {self.ended}; time: low level {self.lowlevel_seconds:.2f} s, "
                     f"waiting for Spark {self.spark_wait_seconds:.2f} s, Spark stage "
                     f"{self.highlevel_seconds:.2f} s, total {self.total_seconds:.2f} s")
        return "\n".join(lines)


# --- planning and query choice -------------------------------------------------------------------

def load_plan(config: RunConfig):
    """Parse and plan the query file over the configured links (one clear error otherwise)."""
    from queries.errors import QueryError
    from queries.explain import find_query_file, mentioned_links
    from queries.parser import parse
    from queries.planner import plan_file

    path = find_query_file(config.query_file)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise QueryError("no such query file (nor a shipped query of that name)",
                         path=str(config.query_file)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise QueryError(f"cannot read the query file: {exc}", path=str(path)) from None
    tree = parse(text, path=str(path))
    names = config.link_names
    option = {n: "--interface" if i >= len(config.links) else "--link"
              for i, n in enumerate(names)}
    wanted = mentioned_links(tree)
    unknown = [n for n in names if wanted and n not in wanted]
    missing = [n for n in wanted if n not in names]
    if wanted and (unknown or missing):
        what = (f"{option[unknown[0]]} {', '.join(unknown)} is not a link of the query file"
                if unknown else f"no source given for link {', '.join(missing)}")
        raise RunLinkError(f"{path.name}: {what}; its links are {', '.join(wanted)} "
                           f"(write --link {wanted[0]}=PCAP or --interface "
                           f"{wanted[0]}=IFACE)")
    return plan_file(tree, names, dict(config.params), dict(config.overrides), source=text)


def choose_queries(plan, config: RunConfig) -> list[tuple[object, str]]:
    """(query plan, output) pairs to run: `--output` ones, else every query nobody reads."""
    if config.outputs:
        chosen = []
        for name, out in config.outputs:
            try:
                chosen.append((plan.query(name), out))
            except KeyError:
                raise RunConfigError(f"--output {name}=...: no query {name!r} in the file; "
                                     f"its queries are {', '.join(plan.names)}") from None
    else:
        chosen = [(qp, "-") for qp in plan.queries if not qp.read_by]
    return chosen


def output_format(config: RunConfig, out: str) -> str:
    return _format_of(config.format, out)


# --- the high level -----------------------------------------------------------------------------

def _niceness(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        return max(0, min(19, int(text))) if text else default
    except ValueError:
        log.warning("%s=%r is not a niceness (0-19); %d is used", name, text, default)
        return default


#: Full-speed replays: the low level (the main thread and the read-ahead) is the run's
#: critical path while it reads, and Spark's work then only has to keep up. With both cores
#: busy, Linux shares them evenly among runnable threads: the main thread of a 50M-packet run
#: waited 8 s for a core. So the Python thread that processes the stages' batches beside the
#: low level runs at a lower priority (niceness BACKGROUND_NICE). The driver JVM keeps
#: niceness 0 (JVM_NICE): at 5 the 50M-packet run's stages fell behind and were left with
#: more to do at the end (11.1-12.0 s against 9.9-10.4 s); at 2, 10.1-10.6 s. Once the low
#: level is done, nothing else competes and priorities do not matter. Paced and live runs
#: keep normal priorities. OOPSCOPE_JVM_NICE and OOPSCOPE_BACKGROUND_NICE set other values.
JVM_NICE = _niceness("OOPSCOPE_JVM_NICE", 0)
BACKGROUND_NICE = _niceness("OOPSCOPE_BACKGROUND_NICE", 10)


class _SessionStarter(threading.Thread):
    """Starts the Spark session while the low level runs (JVM start-up takes seconds)."""

    def __init__(self, master: str | None, quick_jvm: bool = True, nice: int = 0):
        super().__init__(name="oopscope-spark-start", daemon=True)
        self.master, self.session, self.error = master, None, None
        self.quick_jvm, self.nice = quick_jvm, nice

    def start(self) -> None:
        """Launch the JVM here (milliseconds), then connect and make the session on the
        thread: started from the thread, the launch waited ~0.15 s for the GIL behind the
        main thread's imports."""
        try:
            from highlevel.session import launch_jvm

            launch_jvm(self.master, quick_jvm=self.quick_jvm, nice=self.nice)
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc
        super().start()

    def run(self) -> None:
        if self.error is not None:
            return
        try:
            from highlevel.session import get_session

            self.session = get_session(self.master, quick_jvm=self.quick_jvm, nice=self.nice)
        except BaseException as exc:  # handed to the main thread by result()
            self.error = exc

    def ready(self) -> bool:
        """Whether the session is up or failed to start (`_run` starts the thread first)."""
        return not self.is_alive()

    def result(self):
        self.join()
        if self.error is not None:
            raise self.error
        return self.session


class _Continuous(threading.Thread):
    """Paced and live runs: starts the stages as soon as Spark is up, stops them at the end
    after they have processed everything in the spool."""

    def __init__(self, starter: _SessionStarter, graph):
        super().__init__(name="oopscope-highlevel", daemon=True)
        self.starter, self.graph = starter, graph
        self.error: BaseException | None = None
        self.ready = threading.Event()

    def run(self) -> None:
        try:
            self.graph.bind(self.starter.result())
            self.graph.start()
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def finish(self) -> None:
        self.ready.wait()
        if self.error is not None:
            raise self.error
        self.graph.stop()


class _Overlap(threading.Thread):
    """Full-speed replays: when Spark is up while the low level is still reading (a large
    capture), the stages start running continuously on the spool, so Spark combines and
    writes the windows closed so far on the other core, and at the end only the last spool
    files are left. When the low level ends first (a small capture: the JVM takes seconds to
    start), nothing starts here and the stages run once over the whole spool, as before."""

    #: past this share of the input read, the low level is nearly done: the stages run
    #: once at the end (a continuous start would cut the rest into more micro-batches, each
    #: writing and re-reading the open state, for little overlap). Below it, even a late
    #: start pays: Structured Streaming's own start (~1 s: checkpoint, listing, planning)
    #: overlaps the rest of the read (the 5M-packet anchor capture, Spark up at ~75% read:
    #: 6.1-6.2 s against 6.4-7.0 s with 50%)
    LATE_SHARE = 0.95
    #: smaller inputs are read in about a second: nothing to overlap (and a run over them
    #: keeps one micro-batch per stage, whatever the JVM's speed)
    MIN_BYTES = 64 << 20

    def __init__(self, starter: _SessionStarter, graph, read_share=lambda: None):
        super().__init__(name="oopscope-overlap", daemon=True)
        self.starter, self.graph, self.read_share = starter, graph, read_share
        self.error: BaseException | None = None
        self.started = False             # the stages run continuously
        self.ready = threading.Event()
        self._lock = threading.Lock()
        self._low_done = False
        self.late = False

    def run(self) -> None:
        try:
            spark = self.starter.result()
            share = self.read_share()
            with self._lock:
                if self._low_done or (share is not None and share > self.LATE_SHARE):
                    log.debug("Spark up with %s of the input read: the stages run at the end",
                              "all" if self._low_done else f"{share:.0%}")
                    return
                self.started = True
            self.graph.bind(spark)
            for _, stage in self.graph.stages:
                stage.nice = BACKGROUND_NICE
            self.graph.start()
            log.debug("Spark stages started while the low level reads")
        except BaseException as exc:
            self.error = exc
        finally:
            self.ready.set()

    def low_level_done(self) -> bool:
        """The low level has ended: True when the stages run continuously (finish them).
        `late` then says whether their streaming queries were still starting: their first
        batches read every spool file."""
        with self._lock:
            self._low_done = True
            started = self.started
        if started:
            self.late = not self.ready.is_set()
            self.ready.wait()
        return started

    def finish(self) -> None:
        """Let each stage, upstream first, process every spool file, then stop it. No new
        streaming query starts (an availableNow run would cost a stream start per stage)."""
        if self.error is not None:
            raise self.error
        try:
            self.graph.drain()
        finally:
            for _, stage in self.graph.stages:
                stage.stop()


# --- the run ------------------------------------------------------------------------------------

class _StopRequest:
    """SIGTERM / Ctrl-C: the first asks the sources to stop (windows still close and are
    written), a second Ctrl-C aborts."""

    def __init__(self):
        self.asked = False
        self._old = {}

    def __call__(self) -> bool:
        return self.asked

    def _handle(self, signum, frame) -> None:
        if self.asked and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.asked = True
        log.warning("stopping (%s): closing every window and writing the results; "
                    "Ctrl-C again aborts", signal.Signals(signum).name)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def _check_sources(config: RunConfig) -> None:
    if config.links and config.interfaces:
        raise RunConfigError("give capture files (--link) or interfaces (--interface), not "
                             "both: a run has one clock, the data's or the wall's")
    if not config.links and not config.interfaces:
        raise RunConfigError("give at least one source: --link NAME=PCAP or "
                             "--interface NAME=IFACE")
    for name, path in config.links:
        if not Path(path).is_file():
            raise RunLinkError(f"--link {name}={path}: no such capture file")
    names = config.link_names
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RunConfigError(f"link {', '.join(dup)} is given twice")
    if config.speed is not None and config.speed <= 0:
        raise RunConfigError(f"--speed {config.speed}: must be positive (or max)")
    if config.punctuate_every_ns <= 0:
        raise RunConfigError("--punctuate-every must be positive")


def _workdir(given, prefix, option, temps) -> Path:
    if given is not None:
        root = Path(given)
        # a re-run over an old spool or checkpoint would count the old partial rows again or
        # skip new files of the same names: a run starts empty
        if root.is_dir() and any(root.iterdir()):
            raise RunConfigError(f"{option} {root}: not empty (it holds an earlier run's "
                                 f"data); give an empty or new directory")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunConfigError(f"{option} {root}: cannot create it: {exc}") from None
        return root
    d = Path(tempfile.mkdtemp(prefix=prefix))
    temps.append(d)
    return d


def run(config: RunConfig) -> RunSummary:
    """Run the queries of `config.query_file` over its links; results to the outputs."""
    started = time.perf_counter()
    _check_sources(config)
    plan = load_plan(config)
    chosen = choose_queries(plan, config)
    for _, out in chosen:
        output_format(config, out)
        if out != "-" and not Path(out).resolve().parent.is_dir():
            raise RunConfigError(f"--output ...={out}: the directory {Path(out).parent} "
                                 f"does not exist")
    stdout = [qp.name for qp, out in chosen if out == "-"]
    if len(stdout) > 1 and config.format == "parquet":
        raise RunConfigError(f"parquet on stdout takes one query, not {', '.join(stdout)}: "
                             f"name files with --output QUERY=PATH")
    names = {qp.name for qp, _ in chosen}
    for query, _ in config.extra_sinks:
        if query not in names:
            raise RunConfigError(f"query {query!r} does not run (the queries that run are "
                                 f"{', '.join(sorted(names))})")
    temps: list[Path] = []
    try:
        spool = _workdir(config.spool, "oopscope-spool-", "--spool", temps)
        checkpoint = _workdir(config.checkpoint, "oopscope-ck-", "--checkpoint", temps)
        with _StopRequest() as stop:
            return _run(config, plan, chosen, spool, checkpoint, started, stop)
    finally:
        for d in temps:
            shutil.rmtree(d, ignore_errors=True)


#: the former name of `run` (offline runs are runs at --speed max)
run_offline = run


def _run(config, plan, chosen, spool, checkpoint, started, stop) -> RunSummary:
    # the JVM takes seconds to start: it starts first, while the stages are planned and the
    # sources opened (the query and the capture paths were checked already; a source that
    # then fails to open ends the run, and the JVM with it). A bounded replay is over in
    # seconds to minutes: a JVM that starts quickly pays; a paced or live run lasts, and its
    # steady state wants the optimising compiler
    starter = _SessionStarter(config.master, quick_jvm=not config.streaming,
                              nice=0 if config.streaming else JVM_NICE)
    starter.start()
    log.debug("Spark session start asked %.2f s into the run", time.perf_counter() - started)
    from highlevel.errors import StageConfigError
    from highlevel.graph import StageGraph
    from tools.feeds import LinkFeeds, OperatorFeed, SpoolQueue
    from tools.outputs import arrow_schema

    several = sum(1 for _, out in chosen if out == "-") > 1
    formats = {qp.name: output_format(config, out) for qp, out in chosen}
    outputs = {qp.name: QueryOutput(qp.name, qp.high.outputs, formats[qp.name], out,
                                    arrow_schema(qp.name, qp.high.outputs),
                                    buffered=not config.streaming and (
                                        formats[qp.name] == "table"
                                        or (several and out == "-")),
                                    title=qp.name if several and out == "-" else None,
                                    keep=config.keep_results)
               for qp, out in chosen}
    sinks = {name: [o] for name, o in outputs.items()}
    for name, sink in config.extra_sinks:
        sinks[name].append(sink)
    try:
        # every stage is planned now, before any packet is read; made once Spark is up
        graph = StageGraph(plan, [qp.name for qp, _ in chosen], spool, checkpoint,
                           sinks=sinks, master=config.master)
    except StageConfigError as exc:
        raise UnsupportedQueryError(str(exc)) from None
    readers = {q: [r.name for r in plan.queries if q in graph.inputs_of(r)]
               for q in graph.queries}
    queries = {q: QuerySummary(q, outputs[q].out if q in outputs else
                               f"(read by {', '.join(readers[q]) or 'no query'})",
                               formats.get(q, "spool"))
               for q in graph.queries}
    per_link: dict[str, list] = {name: [] for name in config.link_names}
    # a bounded run's own temporary spool is read once and removed: no compression, and its
    # files go as soon as their batch is committed
    temporary = config.spool is None and not config.streaming
    codec = "none" if temporary else "snappy"
    graph.prune_spool = temporary
    for lp in graph.low_plans():
        per_link[lp.link].append(OperatorFeed(lp, spool, queries[graph.query_of(lp)], codec))
    feeds = {name: LinkFeeds(name, fs, config.lull_slack_ns) for name, fs in per_link.items()}
    summary = RunSummary(links={}, queries=queries)
    sources = _open_sources(config, feeds, summary)
    continuous = overlap = None
    if config.streaming:
        continuous = _Continuous(starter, graph)
        continuous.start()
    else:
        overlap = _Overlap(starter, graph, lambda: _read_share(sources))
        if _input_bytes(sources) >= overlap.MIN_BYTES:
            overlap.start()
    progress = _progress(config, feeds, sources, outputs)
    spool_queue = SpoolQueue()           # spool files are written beside the low level
    for f in feeds.values():
        for feed in f.feeds:
            feed.spool_queue = spool_queue
    completed = False
    try:
        info: dict = {}
        summary.ended = _drive(config, sources, feeds, stop, info)
        summary.clock_origin = info.get("origin")
        low_done = time.perf_counter()
        summary.lowlevel_seconds = low_done - started
        if continuous is not None:
            continuous.finish()
            summary.highlevel_seconds = time.perf_counter() - low_done
        elif overlap.low_level_done():
            if overlap.late:
                graph.speculate(nice=BACKGROUND_NICE)
            overlap.finish()
            summary.highlevel_seconds = time.perf_counter() - low_done
        else:
            if not starter.ready():
                # the stages' batch computed while Spark starts: its streaming query's start
                # is the rest of the run's critical path
                graph.speculate(nice=BACKGROUND_NICE)
            graph.bind(starter.result())
            summary.spark_wait_seconds = time.perf_counter() - low_done
            high_started = time.perf_counter()
            graph.run_available()
            summary.highlevel_seconds = time.perf_counter() - high_started
        completed = True
    finally:
        spool_queue.close()
        if overlap is not None and overlap.started:
            for _, stage in graph.stages:     # after an error: no stream left running
                stage.stop()
        if progress is not None:
            progress.stop()
        for o in outputs.values():
            o.close(complete=completed)
        for name, sink in config.extra_sinks:
            sink.close()
    _collect(summary, config, sources, feeds, graph, outputs)
    summary.total_seconds = time.perf_counter() - started
    return summary


def _open_sources(config: RunConfig, feeds: dict, summary: RunSummary) -> dict:
    if config.live:
        from tools.livelinks import LiveLink

        lives = {}
        try:
            for name, iface in config.interfaces:
                lives[name] = LiveLink(name, iface, feeds[name],
                                       period_ns=config.punctuate_every_ns,
                                       options=dict(config.capture_options))
        except BaseException:
            for live in lives.values():
                live.close()
            raise
        return lives
    from tools.replay import FileLink

    return {name: FileLink(name, path, config.batch_size, columns=feeds[name].read_columns)
            for name, path in config.links}


def _input_bytes(sources: dict) -> int:
    total = 0
    for src in sources.values():
        try:
            total += Path(src.path).stat().st_size
        except OSError:
            pass
    return total


def _read_share(sources: dict) -> float | None:
    """The share of the capture files' bytes read so far (record headers estimated), or
    None when unknown."""
    done = total = 0
    for src in sources.values():
        try:
            size = Path(src.path).stat().st_size
        except (AttributeError, OSError):
            return None
        st = src.stats
        total += size
        done += min(size, st.captured_bytes + 16 * st.packets + 24)
    return done / total if total else None


def _drive(config: RunConfig, sources: dict, feeds: dict, stop, info: dict) -> str:
    if config.live:
        from tools.livelinks import run_live

        return run_live(sources, feeds, duration_ns=config.duration_ns, stop=stop)
    from tools.replay import replay

    return replay(sources, feeds, speed=config.speed, period_ns=config.punctuate_every_ns,
                  duration_ns=config.duration_ns, stop=stop, info=info)


def _progress(config: RunConfig, feeds: dict, sources: dict, outputs: dict):
    show = sys.stderr.isatty() if config.progress is None else config.progress
    if not show:
        return None
    from tools.progress import Progress

    def sample():
        packets = sum(f.packets for f in feeds.values())
        rows = sum(o.rows for o in outputs.values())
        drops = sum(_drops(s)[0] + _drops(s)[1] for s in sources.values())
        seen = [f.timer.max_seen for f in feeds.values() if f.timer.max_seen is not None]
        clock = time.strftime("%H:%M:%S", time.gmtime(min(seen) / NS)) if seen else ""
        return packets, rows, drops, clock

    progress = Progress(sample)
    progress.start()
    return progress


def _drops(source) -> tuple[int, int]:
    """(our ring's drops, the kernel's drops) of a source."""
    ring = getattr(source, "ring", None)
    capture = getattr(source, "capture", None)
    ring_drops = ring.stats().dropped if ring is not None else 0
    kernel = getattr(getattr(capture, "stats", None), "kernel_drops", 0) if capture else 0
    return int(ring_drops), int(kernel or 0)


def _collect(summary: RunSummary, config: RunConfig, sources, feeds, graph, outputs) -> None:
    for name, source in sources.items():
        stats = source.capture.stats if config.live else source.stats
        path = f"interface {dict(config.interfaces)[name]}" if config.live else source.path
        s = LinkSummary(name, str(path))
        # what reached the low level (a stopped replay may have read a little further)
        s.packets, s.bytes = feeds[name].packets, feeds[name].bytes
        s.malformed, s.reasons = int(stats.malformed), dict(stats.reasons)
        s.problems = list(stats.problems)
        if not config.live and source.problem and source.problem not in s.problems:
            s.problems.append(source.problem)
        s.punctuations = feeds[name].timer.count
        s.ring_drops, s.kernel_drops = _drops(source)
        summary.links[name] = s
    for f in feeds.values():
        for q, c in f.counters():
            q.evictions += c.get("evictions", 0)
            q.flushed += c.get("flushed", 0)
            q.forced_full_flushes += c.get("forced_full_flushes", 0)
            q.late_packets += c.get("late", 0)
            q.late_corrected += c.get("late_corrected", 0)
    for name, q in summary.queries.items():
        q.late_partial_rows = graph.late_rows(name)
        q.correction_rows = graph.corrected_rows(name)
        if name in outputs:
            q.rows = outputs[name].rows
            if config.keep_results:
                summary.results[name] = outputs[name].table()
        else:
            q.rows = graph.closed_rows(name)
