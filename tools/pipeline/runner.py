"""`oopscope run`: packet sources -> low-level operators -> spool -> Spark stages -> outputs.

`run(RunConfig(...)) -> RunSummary` is the library behind the command; a `Run` composes:

1. the plan of the query file for its links (`--link NAME=PCAP` files or `--interface
   NAME=IFACE` live interfaces) and the queries to run: those named by `--output`, else
   every query that no other query reads. A picked query the Spark stage cannot run is an
   error naming it before any packet is read.
2. the low level (`tools.pipeline.sources.LowLevel`): per link, one source feeds every
   low-level operator of the picked queries that read it (`tools.pipeline.feeds`). Its
   sources are the run's own (`LocalSources`: capture files replayed interleaved by capture
   time, at full speed or paced, `tools.pipeline.replay`; interfaces captured live by a
   thread each into a packet ring, `tools.pipeline.livelinks`) or fanout members
   (`FanoutSources`, `--fanout N`). Timer-driven punctuation (`capture.punctuation`)
   advances each link's low-watermark every period, and during a lull to `clock - slack`,
   so silent links do not stall windows. Partial rows and punctuation go to the spool.
3. the Spark stages, which combine the partial rows, close windows on the combined
   punctuation and hand the rows to the outputs (`tools.pipeline.outputset`), on a schedule
   (`tools.pipeline.schedule`): paced and live runs run them continuously, so each window
   appears as soon as its punctuation arrives (`StreamingStages`). A replay at full speed
   starts the JVM in the background; if the low level is still reading when Spark is up,
   the stages run continuously from then on (the two levels overlap on two cores),
   otherwise they run once over the whole spool when the low level is done
   (`BoundedStages`).
4. resume (`tools.pipeline.resume`): a run given both `--spool` and `--checkpoint`
   continues after a crash.

SIGTERM or Ctrl-C stops the sources; every link then punctuates "end of input", every open
window is closed and written, and the run ends normally. A second Ctrl-C aborts.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common.errors import OopscopeError
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError, UnsupportedQueryError
from tools.pipeline.config import (
    QuerySummary,
    RunConfig,
    RunSummary,
    choose_queries,
    load_plan,
    output_format,
)
from tools.pipeline.outputset import RunOutputs
from tools.pipeline.resume import Resume
from tools.pipeline.schedule import BoundedStages, StreamingStages
from tools.pipeline.sources import FanoutSources, LocalSources, LowLevel, check_sources
from tools.pipeline.threads import SessionStarter, StopRequest, driver_nice

log = logging.getLogger(__name__)


def run(config: RunConfig) -> RunSummary:
    """Run the queries of `config.query_file` over its links; results to the outputs."""
    return Run(config).execute()


class Run:
    """One run of the pipeline (module docstring): its plan and chosen queries, checked when
    made; `execute` then runs it once, its sources local or fanout and its stages bounded or
    streaming as `config` says."""

    def __init__(self, config: RunConfig):
        self.started = time.perf_counter()
        self.config = config
        #: set by `execute`: a resumable run's state, the spool and the checkpoint
        self.resume: Resume | None = None
        self.spool = self.checkpoint = Path()
        check_sources(config)
        self.plan = load_plan(config)
        self.chosen = choose_queries(self.plan, config)
        for _, out in self.chosen:
            output_format(config, out)
            if out != "-" and not Path(out).resolve().parent.is_dir():
                raise RunConfigError(f"--output ...={out}: the directory {Path(out).parent} "
                                     f"does not exist")
        stdout = [qp.name for qp, out in self.chosen if out == "-"]
        if len(stdout) > 1 and config.format == "parquet":
            raise RunConfigError(f"parquet on stdout takes one query, not {', '.join(stdout)}: "
                                 f"name files with --output QUERY=PATH")
        names = {qp.name for qp, _ in self.chosen}
        for query, _ in config.extra_sinks:
            if query not in names:
                raise RunConfigError(f"query {query!r} does not run (the queries that run are "
                                     f"{', '.join(sorted(names))})")

    @property
    def resumed(self) -> bool:
        return self.resume is not None and self.resume.resumed

    def execute(self) -> RunSummary:
        """Run it: its spool and checkpoint (temporary ones removed at the end), Spark, the
        outputs, the low level, the stages; its summary."""
        config = self.config
        temps: list[Path] = []
        try:
            if config.spool is not None and config.checkpoint is not None:
                # both kept: the run can be resumed after a crash (`tools.pipeline.resume`)
                from tools.pipeline.resume import prepare

                self.spool, self.checkpoint = Path(config.spool), Path(config.checkpoint)
                self.resume = prepare(config, self.chosen,
                                      {qp.name: output_format(config, out)
                                       for qp, out in self.chosen},
                                      self.spool, self.checkpoint)
            else:
                self.spool = _workdir(config.spool, "oopscope-spool-", "--spool", temps)
                self.checkpoint = _workdir(config.checkpoint, "oopscope-ck-", "--checkpoint",
                                           temps)
            with StopRequest() as stop:
                return self._with_outputs(stop)
        finally:
            for d in temps:
                shutil.rmtree(d, ignore_errors=True)

    def _with_outputs(self, stop) -> RunSummary:
        config = self.config
        # the JVM takes seconds to start: it starts first, while the stages are planned and
        # the sources opened (the query and the capture paths were checked already; a source
        # that then fails to open ends the run, and the JVM with it). A bounded replay is
        # over in seconds to minutes: a JVM that starts quickly pays; a paced or live run
        # lasts, and its steady state wants the optimising compiler
        self.starter = SessionStarter(config.master, quick_jvm=not config.streaming,
                                      nice=driver_nice(config.live or config.collects,
                                                       config.streaming))
        self.starter.start()
        log.debug("Spark session start asked %.2f s into the run",
                  time.perf_counter() - self.started)
        self.outputs = RunOutputs(config, self.chosen, self.checkpoint, self.resume, self.plan)
        # every output is opened before any packet is read
        self.outputs.open()
        try:
            return self._opened(stop)
        except OopscopeError as exc:
            self.outputs.close_quietly()     # a buffered output's rows may fault here too
            raise self.outputs.fault(exc) from None
        except BaseException:
            self.outputs.close_quietly()
            raise

    def _graph(self):
        """Every stage, planned now, before any packet is read; made once Spark is up."""
        from highlevel.errors import StageConfigError
        from highlevel.graph import StageGraph

        config = self.config
        sinks: dict[str, list] = {name: [o] for name, o in self.outputs.items()}
        for name, sink in config.extra_sinks:
            sinks[name].append(sink)
        try:
            graph = StageGraph(self.plan, [qp.name for qp, _ in self.chosen], self.spool,
                               self.checkpoint, sinks=sinks, master=config.master,
                               fanout={n: config.fanout for n, _ in config.interfaces})
        except StageConfigError as exc:
            raise UnsupportedQueryError(str(exc)) from None
        # a bounded run's own temporary spool is read once and removed: its files go as
        # soon as their batch is committed
        graph.prune_spool = self._temporary
        return graph

    @property
    def _temporary(self) -> bool:
        return self.config.spool is None and not self.config.streaming

    def _query_summaries(self, graph) -> dict[str, QuerySummary]:
        readers = {q: [r.name for r in self.plan.queries if q in graph.inputs_of(r)]
                   for q in graph.queries}
        return {q: QuerySummary(q, self.outputs[q].out if q in self.outputs else
                                f"(read by {', '.join(readers[q]) or 'no query'})",
                                self.outputs[q].format if q in self.outputs else "spool")
                for q in graph.queries}

    def _sources(self, graph, queries: dict[str, QuerySummary]):
        """The low level and its sources: fanout members writing to this run's spool
        (`tools.pipeline.fanout`; this process runs the stages), else the run's own."""
        config = self.config
        fanout = config.fanout > 1
        starts: dict = {}
        if self.resumed:
            from tools.pipeline.resume import find_punctuation

            assert self.resume is not None
            find_punctuation(self.resume, self.spool, graph.low_plans())
            if config.live:
                self.resume.live_gap(self.chosen)
            starts = self.resume.starts(graph.low_plans())
        if fanout:
            low = LowLevel(config, [], self.spool, queries, graph.query_of)
            return FanoutSources(config, low, self.spool, f"run-{os.getpid()}")
        tables = None
        if self.resume is not None:
            # a resumable run's tables start at the sizes they had (`tablesizes`)
            from tools.pipeline.tablesizes import TABLES, TableLog

            tables = TableLog(self.checkpoint / TABLES, self.resumed)
        # a temporary spool: no compression
        low = LowLevel(config, graph.low_plans(), self.spool, queries, graph.query_of,
                       codec="none" if self._temporary else "snappy",
                       complete_only=self.resume is not None, starts=starts, tables=tables)
        return LocalSources(config, low)

    def _opened(self, stop) -> RunSummary:
        config = self.config
        # a failed write stops the sources as a stop request does; the windows still open
        # close (in the other outputs), then the fault is reported (`RunOutputs.fault`)
        self.outputs.on_fault(lambda: setattr(stop, "asked", True))
        graph = self._graph()
        queries = self._query_summaries(graph)
        sources = self._sources(graph, queries)
        low = sources.low
        low.check_records()
        summary = RunSummary(links={}, queries=queries)
        if self.resumed:
            assert self.resume is not None
            summary.resumed = True
            summary.gap = self.resume.gap
        sources.open(stop)
        stages: StreamingStages | BoundedStages = \
            StreamingStages(self.starter, graph, self.resume) if config.streaming \
            else BoundedStages(self.starter, graph, self.resumed)
        stages.start(sources)
        progress = self._progress(low, sources)
        low.start_spool_queue()          # spool files are written beside the low level
        completed = False
        try:
            info: dict = {}
            summary.ended = sources.drive(stop, info)
            summary.clock_origin = info.get("origin")
            low_done = time.perf_counter()
            summary.lowlevel_seconds = low_done - self.started
            stages.finish(summary, low_done)
            completed = True
        finally:
            sources.stop()
            low.close_spool_queue()
            stages.stop()
            if progress is not None:
                progress.stop()
            try:
                self.outputs.close(complete=completed)
            finally:
                for _name, sink in config.extra_sinks:
                    sink.close()
        sources.collect(summary)
        for name, q in summary.queries.items():
            q.late_partial_rows = graph.late_rows(name)
            q.correction_rows = graph.corrected_rows(name)
            q.zero_divisor_rows = graph.zero_divisor_rows(name)
            if name in self.outputs:
                q.rows = self.outputs[name].rows
                if config.keep_results:
                    summary.results[name] = self.outputs[name].table()
            else:
                q.rows = graph.closed_rows(name)
        summary.total_seconds = time.perf_counter() - self.started
        return summary

    def _progress(self, low: LowLevel, sources):
        show = sys.stderr.isatty() if self.config.progress is None else self.config.progress
        if not show:
            return None
        from tools.pipeline.progress import Progress

        outputs, starter, asked = self.outputs, self.starter, self.started

        def sample():
            rows = sum(o.rows for o in outputs.values())
            seen = low.clock()
            clock = time.strftime("%H:%M:%S", time.gmtime(seen / NS)) if seen is not None \
                else ""
            # rows come once Spark is up: say so while it starts (seconds; more on a busy
            # machine), so "0 result rows" reads as waiting, not as nothing
            note = "" if starter.ready() else \
                f"Spark starting, {time.perf_counter() - asked:.0f} s"
            # per query its tables' slots and the low level's reduction (`queries` shows
            # the same): partial rows per result row of the query's output
            tables = []
            for name, (slots, partials) in low.tables().items():
                out = outputs[name].rows if name in outputs else 0
                tables.append((name, slots, round(partials / out, 2) if out else None))
            return low.packets, rows, sources.lost(), clock, note, tables

        progress = Progress(sample)
        progress.start()
        return progress


def _workdir(given, prefix, option, temps) -> Path:
    if given is not None:
        root = Path(given)
        # a re-run over an old spool or checkpoint would count the old partial rows again or
        # skip new files of the same names: a run starts empty
        if root.is_dir() and any(root.iterdir()):
            raise RunConfigError(f"{option} {root}: not empty (it holds an earlier run's "
                                 f"data); give an empty or new directory (a run given both "
                                 f"--spool and --checkpoint can be resumed)")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunConfigError(f"{option} {root}: cannot create it: {exc}") from None
        return root
    d = Path(tempfile.mkdtemp(prefix=prefix))
    temps.append(d)
    return d
