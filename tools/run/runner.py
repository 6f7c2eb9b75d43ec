"""`oopscope run`: packet sources -> low-level operators -> spool -> Spark stages -> outputs.

`run(RunConfig(...)) -> RunSummary` is the library behind the command:

1. plan the query file for its links (`--link NAME=PCAP` files or `--interface NAME=IFACE`
   live interfaces) and pick the queries to run: those named by `--output`, else every query
   that no other query reads. A picked query the Spark stage cannot run is an error naming it
   before any packet is read.
2. per link, one source feeds every low-level operator of the picked queries that read it
   (`tools.run.feeds`): capture files are replayed interleaved by capture time, at full speed or
   paced (`tools.run.replay`); interfaces are captured live by a thread each into a packet ring
   (`tools.run.livelinks`). Timer-driven punctuation (`capture.punctuation`) advances each link's
   low-watermark every period, and during a lull to `clock - slack`, so silent links do not
   stall windows. Partial rows and punctuation go to the spool.
3. the Spark stages combine the partial rows, close windows on the combined punctuation and
   hand the rows to the outputs (`tools.results`). Paced and live runs run them
   continuously, so each window appears as soon as its punctuation arrives. A replay at full
   speed starts the JVM in the background; if the low level is still reading when Spark is
   up, the stages run continuously from then on (the two levels overlap on two cores),
   otherwise they run once over the whole spool when the low level is done.

SIGTERM or Ctrl-C stops the sources; every link then punctuates "end of input", every open
window is closed and written, and the run ends normally. A second Ctrl-C aborts.
"""

from __future__ import annotations

import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import settings
from common.errors import OopscopeError, SpoolError, os_error_text
from common.units import NS_PER_S as NS
from tools.errors import RunConfigError, RunError, RunLinkError, UnsupportedQueryError
from tools.results.appended import QueryOutput
from tools.run.config import (
    LinkSummary,
    QuerySummary,
    RunConfig,
    RunSummary,
    choose_queries,
    load_plan,
    output_format,
)
from tools.run.threads import (
    ContinuousStages,
    OverlappedStages,
    SessionStarter,
    StopRequest,
)

log = logging.getLogger(__name__)

_INT64_MIN = -(1 << 63)


def check_sources(config: RunConfig) -> None:
    if config.links and config.interfaces:
        raise RunConfigError("give capture files (--link) or interfaces (--interface), not "
                             "both: a run has one clock, the data's or the wall's")
    if not config.links and not config.interfaces:
        raise RunConfigError("give at least one source: --link NAME=PCAP or "
                             "--interface NAME=IFACE")
    if config.fanout > 1 and config.links:
        raise RunConfigError(f"--fanout {config.fanout} splits a live interface over capture "
                             f"processes; a capture file (--link) is read by one")
    from capture.source import STDIN, classify

    stdin = [name for name, path in config.links if path == STDIN]
    if len(stdin) > 1:
        raise RunLinkError(f"--link {', '.join(stdin)}: standard input (-) can feed one link only")
    for name, path in config.links:
        kind, why = classify(path)
        if kind is None:
            raise RunLinkError(f"--link {name}={path}: {why}")
    names = config.link_names
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise RunConfigError(f"link {', '.join(dup)} is given twice")
    if config.speed is not None and config.speed <= 0:
        raise RunConfigError(f"--speed {config.speed}: must be positive (or max)")
    if config.punctuate_every_ns <= 0:
        raise RunConfigError("--punctuate-every must be positive")


def check_record_links(config: RunConfig, feeds: dict) -> None:
    """A link whose queries read a record protocol is a record source (`capture.records`):
    a file, standard input or a FIFO, not an interface; records timed by the wall clock
    when read cannot be paced by their times."""
    for name, f in feeds.items():
        fmt = f.record                  # RunLinkError when its queries disagree
        if fmt is None:
            continue
        if name in dict(config.interfaces):
            raise RunLinkError(f"--interface {name}: the link is read as records of "
                               f"{fmt.protocol}; give its records as --link {name}=FILE "
                               f"(a file, - for standard input, or a FIFO)")
        if config.speed is not None and fmt.system_clock:
            raise RunConfigError(f"--speed {config.speed:g}: link {name} carries records of "
                                 f"{fmt.protocol}, timed by the wall clock when read "
                                 f"({fmt.clock or 'no increasing field'}); there are no "
                                 f"record times to pace by (use --speed max)")


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


def run(config: RunConfig) -> RunSummary:
    """Run the queries of `config.query_file` over its links; results to the outputs."""
    started = time.perf_counter()
    check_sources(config)
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
        resume = None
        if config.spool is not None and config.checkpoint is not None:
            # both kept: the run can be resumed after a crash (`tools.run.resume`)
            from tools.run.resume import prepare

            spool, checkpoint = Path(config.spool), Path(config.checkpoint)
            resume = prepare(config, chosen, {qp.name: output_format(config, out)
                                              for qp, out in chosen}, spool, checkpoint)
        else:
            spool = _workdir(config.spool, "oopscope-spool-", "--spool", temps)
            checkpoint = _workdir(config.checkpoint, "oopscope-ck-", "--checkpoint", temps)
        with StopRequest() as stop:
            return _run(config, plan, chosen, spool, checkpoint, started, stop, resume)
    finally:
        for d in temps:
            shutil.rmtree(d, ignore_errors=True)


def _run(config, plan, chosen, spool, checkpoint, started, stop, resume=None) -> RunSummary:
    # the JVM takes seconds to start: it starts first, while the stages are planned and the
    # sources opened (the query and the capture paths were checked already; a source that
    # then fails to open ends the run, and the JVM with it). A bounded replay is over in
    # seconds to minutes: a JVM that starts quickly pays; a paced or live run lasts, and its
    # steady state wants the optimising compiler
    starter = SessionStarter(config.master, quick_jvm=not config.streaming,
                              nice=0 if config.streaming else settings.jvm_nice())
    starter.start()
    log.debug("Spark session start asked %.2f s into the run", time.perf_counter() - started)
    several = sum(1 for _, out in chosen if out == "-") > 1
    outputs = {qp.name: output_for(config, qp, out, several, checkpoint, resume)
               for qp, out in chosen}
    # every output is opened (a read-only or full file system fails here, in one line)
    # before any packet is read
    open_outputs(outputs.values())
    try:
        return _run_opened(config, plan, chosen, spool, checkpoint, started, stop, starter,
                           outputs, resume)
    except OopscopeError as exc:
        close_quietly(outputs.values())      # a buffered output's rows may fault here too
        raise fault(exc, outputs) from None
    except BaseException:
        close_quietly(outputs.values())
        raise


def _run_opened(config, plan, chosen, spool, checkpoint, started, stop, starter,
                outputs, resume=None) -> RunSummary:
    from highlevel.errors import StageConfigError
    from highlevel.graph import StageGraph
    from tools.run.feeds import LinkFeeds, OperatorFeed, SpoolQueue

    for o in outputs.values():
        # a failed write stops the sources as a stop request does; the windows still open
        # close (in the other outputs), then the fault is reported (`fault`)
        o.on_fault = lambda: setattr(stop, "asked", True)
    formats = {name: o.format for name, o in outputs.items()}
    sinks: dict[str, list] = {name: [o] for name, o in outputs.items()}   # highlevel Sinks
    for name, sink in config.extra_sinks:
        sinks[name].append(sink)
    try:
        # every stage is planned now, before any packet is read; made once Spark is up
        graph = StageGraph(plan, [qp.name for qp, _ in chosen], spool, checkpoint,
                           sinks=sinks, master=config.master,
                           fanout={n: config.fanout for n, _ in config.interfaces})
    except StageConfigError as exc:
        raise UnsupportedQueryError(str(exc)) from None
    members = None
    if config.fanout > 1:
        # the interfaces are captured by member processes writing to this run's spool
        # (`tools.cluster.fanout`); this process runs the stages
        import os

        from tools.cluster.fanout import FanoutMembers

        members = FanoutMembers(config, str(spool), f"run-{os.getpid()}", config.fanout)
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
    starts: dict[tuple[str, str], int | None] = {}
    if resume is not None and resume.resumed:
        from tools.run.resume import find_punctuation

        find_punctuation(resume, spool, graph.low_plans())
        if config.live:
            live_gap(resume, chosen)
        starts = {(lp.query, lp.link): resume.start_of(lp) for lp in graph.low_plans()}
    try:
        for lp in [] if members is not None else graph.low_plans():
            per_link[lp.link].append(OperatorFeed(lp, spool, queries[graph.query_of(lp)],
                                                  codec, complete_only=resume is not None,
                                                  start_ns=starts.get((lp.query, lp.link))))
    except OSError as exc:           # the spool's directories (a read-only --spool)
        raise SpoolError(f"cannot write the spool {exc.filename or spool}: "
                         f"{os_error_text(exc)}") from None
    feeds = {name: LinkFeeds(name, fs, config.lull_slack_ns) for name, fs in per_link.items()}
    check_record_links(config, feeds)
    summary = RunSummary(links={}, queries=queries)
    if resume is not None and resume.resumed:
        summary.resumed = True
        summary.gap = resume.gap
    skip = skip_points(per_link, starts)
    sources = {} if members is not None else open_sources(config, feeds, summary, stop, skip)
    continuous = overlap = None
    if config.streaming:
        continuous = ContinuousStages(starter, graph, on_bound=_suppress_gap(resume))
        continuous.start()
    else:
        overlap = OverlappedStages(starter, graph, lambda: _read_share(sources))
        # a stream (FIFO, standard input) has no known size and may last: its windows are
        # written as they close once Spark is up, as for a large file
        if _input_bytes(sources) >= overlap.MIN_BYTES or \
                any(getattr(src.reader, "stream", False) for src in sources.values()):
            overlap.start()
    progress = _progress(config, feeds, sources, outputs)
    spool_queue = SpoolQueue()           # spool files are written beside the low level
    for f in feeds.values():
        for feed in f.feeds:
            feed.spool_queue = spool_queue
    completed = False
    resumed = resume is not None and resume.resumed
    try:
        info: dict = {}
        if members is not None:
            members.start()
            summary.ended = members.drive(stop, config.duration_ns)
        else:
            summary.ended = drive(config, sources, feeds, stop, info)
        summary.clock_origin = info.get("origin")
        low_done = time.perf_counter()
        summary.lowlevel_seconds = low_done - started
        if continuous is not None:
            continuous.finish()
            summary.highlevel_seconds = time.perf_counter() - low_done
        elif overlap is not None and overlap.low_level_done():   # not None: not streaming
            if overlap.late and not resumed:
                graph.speculate(nice=settings.background_nice())
            overlap.finish()
            summary.highlevel_seconds = time.perf_counter() - low_done
        else:
            if not starter.ready() and not resumed:
                # the stages' batch computed while Spark starts: its streaming query's start
                # is the rest of the run's critical path (not over a resumed checkpoint,
                # whose next batch may be a replay)
                graph.speculate(nice=settings.background_nice())
            graph.bind(starter.result())
            summary.spark_wait_seconds = time.perf_counter() - low_done
            high_started = time.perf_counter()
            graph.run_available()
            summary.highlevel_seconds = time.perf_counter() - high_started
        completed = True
    finally:
        if members is not None:
            members.stop()
        spool_queue.close()
        if overlap is not None and overlap.started:
            for _, stage in graph.stages:     # after an error: no stream left running
                stage.stop()
        if progress is not None:
            progress.stop()
        try:
            close_outputs(outputs.values(), complete=completed)
        finally:
            for _name, sink in config.extra_sinks:
                sink.close()
    _collect(summary, config, sources, feeds, graph, outputs)
    if members is not None:
        members.summarise(summary, spool)
    summary.total_seconds = time.perf_counter() - started
    return summary


def skip_points(per_link: dict, starts: dict) -> dict[str, int | None]:
    """A resumed file link is read past, unpaced, up to the earliest packet one of its
    operators takes; an operator with no punctuation in the spool takes every packet."""
    skip: dict[str, int | None] = {}
    for name, fs in per_link.items():
        known = [s for f in fs if (s := starts.get((f.op.plan.query, name))) is not None]
        skip[name] = min(known) if fs and len(known) == len(fs) else None
    return skip


def output_for(config, qp, out: str, several: bool, checkpoint, resume) -> QueryOutput:
    """A query's output. In a resumable run, one that can be cut back to its last whole batch
    logs its batches; a Parquet output (no footer until closed) or one written whole at the
    end keeps its batches as part files under the checkpoint (`tools.results.parts`)."""
    from tools.results.formats import arrow_schema
    from tools.results.parts import PartFiles
    from tools.run.resume import output_log, output_parts

    fmt = output_format(config, out)
    buffered = not config.streaming and (fmt == "table" or (several and out == "-"))
    resume_log = parts = None
    if resume is not None:
        if fmt == "parquet" or buffered:
            parts = PartFiles(output_parts(checkpoint, qp.name))
        elif out != "-":
            resume_log = output_log(checkpoint, qp.name)
    return QueryOutput(qp.name, qp.high.outputs, fmt, out,
                       arrow_schema(qp.name, qp.high.outputs), buffered=buffered,
                       title=qp.name if several and out == "-" else None,
                       keep=config.keep_results,
                       window=getattr(qp.high.window, "column", None),
                       resume_log=resume_log, parts=parts)


def open_outputs(outputs) -> None:
    opened = []
    try:
        for o in outputs:
            o.open()
            opened.append(o)
    except BaseException:
        close_outputs(opened, complete=False)
        raise


def close_outputs(outputs, complete: bool) -> None:
    """Close every output (each even when one fails); then raise the first failure."""
    error: BaseException | None = None
    for o in outputs:
        try:
            o.close(complete=complete)
        except (OopscopeError, OSError) as exc:
            error = error or exc
    if error is not None:
        raise error


def close_quietly(outputs) -> None:
    """After an error: close what is still open (a no-op for the others); a fault of theirs
    is kept in the output and reported by `fault`."""
    for o in outputs:
        try:
            o.close(complete=False)
        except (OopscopeError, OSError) as exc:
            log.debug("closing the output %s after an error: %s", o.out, exc)


def fault(exc: OopscopeError, outputs: dict) -> BaseException:
    """The error a failed run reports, in one line: an output's own fault (its path and OS
    error; the stage's error that followed it says less) and what that output holds, or
    the run's error and what the outputs hold (the windows written before it)."""
    faulty = [o for o in outputs.values() if o.fault is not None]
    if faulty:
        o = faulty[0]
        if o.out == "-" and isinstance(o.fault, BrokenPipeError):
            return o.fault               # `| head`: not an error (tools.cli)
        more = f" ({len(faulty) - 1} more outputs failed)" if len(faulty) > 1 else ""
        return RunError(o.fault_message() + more)
    held = [f"{o.out} holds {o.written()}" for o in outputs.values()
            if o.held and o.out != "-" and o.format != "parquet"]
    if not held:
        return exc
    # the same class, so a caller that tells errors apart still can
    try:
        return type(exc)(f"{exc}; written before it: {'; '.join(held)}")
    except TypeError:                   # an error class with other arguments
        return RunError(f"{exc}; written before it: {'; '.join(held)}")


def live_gap(resume, chosen) -> None:
    """A resumed live run: the windows from the last punctuation in the spool to the first
    window start after now are incomplete (the packets in between were never captured) and
    are not written; the operators take packets from that start on."""
    known = [p for p in resume.punctuation.values() if p is not None]
    gap_from = min(known) if len(known) == len(resume.punctuation) and known else _INT64_MIN
    after = time.time_ns() + NS // 5
    starts = [((after + w.offset_ns) // w.slide_ns + 1) * w.slide_ns - w.offset_ns
              for qp, _ in chosen if (w := qp.high.window) is not None and w.slide_ns]
    start = max(starts) if starts else after + 1
    resume.gap = (gap_from, start)
    resume.punctuation = {k: start for k in resume.punctuation}
    log.warning("resumed: the windows from %s to %s are a gap (the run was down) and are not "
                "written", "the start" if gap_from == _INT64_MIN else when(gap_from),
                when(start))


def when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / NS)) + " UTC"


def _suppress_gap(resume):
    if resume is None or resume.gap is None:
        return None
    gap = (int(resume.gap[0]), int(resume.gap[1]))

    def apply(graph) -> None:
        for _, stage in graph.stages:
            stage.suppress = (gap,)
    return apply


def open_sources(config: RunConfig, feeds: dict, summary: RunSummary, stop=None,
                  skip: dict | None = None) -> dict:
    if config.live:
        from tools.run.livelinks import LiveLink

        lives = {}
        from capture.live import snaplen_for

        try:
            for name, iface in config.interfaces:
                # the payloads are captured only for a link whose queries read them, and,
                # unless --snaplen says, only the bytes its queries need
                columns = feeds[name].read_columns
                options = dict(config.capture_options)
                if options.get("snaplen") is None:
                    options["snaplen"] = snaplen_for(columns)
                lives[name] = LiveLink(name, iface, feeds[name],
                                       period_ns=config.punctuate_every_ns, options=options,
                                       payload="payload" in (columns or ()))
        except BaseException:
            for live in lives.values():
                live.close()
            raise
        return lives
    from tools.run.replay import FileLink

    # `stop`: a stream (FIFO, standard input) waiting for its writer ends at a stop request
    links: dict = {}
    try:
        for name, path in config.links:
            links[name] = FileLink(name, path, config.batch_size,
                                   columns=feeds[name].read_columns, stop=stop,
                                   skip_before=(skip or {}).get(name),
                                   record=feeds[name].record, separator=config.csv_separator)
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


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
        if hasattr(st, "lines"):        # a record source counts the bytes of its lines
            done += min(size, st.bytes)
            continue
        done += min(size, st.captured_bytes + 16 * st.packets + 24)
    return done / total if total else None


def drive(config: RunConfig, sources: dict, feeds: dict, stop, info: dict) -> str:
    if config.live:
        from tools.run.livelinks import run_live

        return run_live(sources, feeds, duration_ns=config.duration_ns, stop=stop)
    from tools.run.replay import replay

    return replay(sources, feeds, speed=config.speed, period_ns=config.punctuate_every_ns,
                  duration_ns=config.duration_ns, stop=stop, info=info)


def _progress(config: RunConfig, feeds: dict, sources: dict, outputs: dict):
    show = sys.stderr.isatty() if config.progress is None else config.progress
    if not show:
        return None
    from tools.run.progress import Progress

    def sample():
        packets = sum(f.packets for f in feeds.values())
        rows = sum(o.rows for o in outputs.values())
        lost = sum(sum(drops(s)) for s in sources.values())
        seen = [f.timer.max_seen for f in feeds.values() if f.timer.max_seen is not None]
        clock = time.strftime("%H:%M:%S", time.gmtime(min(seen) / NS)) if seen else ""
        return packets, rows, lost, clock

    progress = Progress(sample)
    progress.start()
    return progress


def drops(source) -> tuple[int, int]:
    """(our ring's drops, the kernel's drops) of a source."""
    ring = getattr(source, "ring", None)
    capture = getattr(source, "capture", None)
    ring_drops = ring.stats().dropped if ring is not None else 0
    kernel = getattr(getattr(capture, "stats", None), "kernel_drops", 0) if capture else 0
    return int(ring_drops), int(kernel or 0)


def _collect(summary: RunSummary, config: RunConfig, sources, feeds, graph, outputs) -> None:
    collect_links(summary, config, sources, feeds)
    for name, q in summary.queries.items():
        q.late_partial_rows = graph.late_rows(name)
        q.correction_rows = graph.corrected_rows(name)
        q.zero_divisor_rows = graph.zero_divisor_rows(name)
        if name in outputs:
            q.rows = outputs[name].rows
            if config.keep_results:
                summary.results[name] = outputs[name].table()
        else:
            q.rows = graph.closed_rows(name)


def collect_links(summary: RunSummary, config: RunConfig, sources, feeds) -> None:
    """The links' numbers into `summary.links`, and the low level's into its queries."""
    for name, source in sources.items():
        stats = source.capture.stats if config.live else source.stats
        path = f"interface {dict(config.interfaces)[name]}" if config.live else source.path
        s = LinkSummary(name, str(path))
        # what reached the low level (a stopped replay may have read a little further)
        s.packets, s.bytes = feeds[name].packets, feeds[name].bytes
        s.malformed, s.reasons = int(stats.malformed), dict(stats.reasons)
        s.problems = list(stats.problems)
        if getattr(source, "record", None) is not None:
            s.kind, s.malformed_detail = "records", stats.describe()
        if not config.live and source.problem and source.problem not in s.problems:
            s.problems.append(source.problem)
        s.punctuations = feeds[name].timer.count
        s.ring_drops, s.kernel_drops = drops(source)
        summary.links[name] = s
        if summary.resumed:
            summary.skipped[name] = int(getattr(source, "skipped", 0))
    for f in feeds.values():
        for q, c in f.counters():
            q.evictions += c.get("evictions", 0)
            q.flushed += c.get("flushed", 0)
            q.forced_full_flushes += c.get("forced_full_flushes", 0)
            q.late_packets += c.get("late", 0)
            q.late_corrected += c.get("late_corrected", 0)
            q.zero_divisor_packets += c.get("zero_divisors", 0)
