"""The low level of a run and where its packets come from: the operators of every link
(`LowLevel`) and the two ways a run reads its links, in this process (`LocalSources`:
capture files replayed, interfaces captured live, record files and streams) or through
fanout member processes (`FanoutSources`, `tools.pipeline.fanout`).

`run` and `agent` compose them: plan the low level, open the sources, `drive` them until the
input ends or a stop is asked, then `collect` their numbers into the summary.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import SpoolError, os_error_text
from tools.errors import RunConfigError, RunLinkError
from tools.pipeline.config import LinkSummary, RunConfig, RunSummary
from tools.pipeline.feeds import LinkFeeds, OperatorFeed, SpoolQueue

if TYPE_CHECKING:
    from tools.pipeline.fanout import FanoutMembers
    from tools.pipeline.tablesizes import TableLog

log = logging.getLogger(__name__)


def check_sources(config: RunConfig) -> None:
    """The links or interfaces of `config` make one run's sources (before anything opens)."""
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
    from capture.flowreader import collector_address

    for name, path in config.links:
        if name in config.netflow_links and collector_address(path) is not None:
            continue                    # a UDP collector, not a file
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


class LowLevel:
    """The low-level operators of a run's links: one `OperatorFeed` per (query, link) of
    `low_plans`, grouped per link into `LinkFeeds` (`feeds`), and, once started, the spool
    queue that writes their files beside the low level. `starts`: per (query, link), the
    first packet time its operator takes (a resumed run's); `tables`: a resumable run's
    remembered table sizes (`tools.pipeline.tablesizes`), where its tables start and whose
    record a resize updates."""

    def __init__(self, config: RunConfig, low_plans, spool, summaries: dict, query_of, *,
                 codec: str = "snappy", complete_only: bool = False,
                 starts: dict | None = None, tables: TableLog | None = None):
        self.config = config
        self.starts: dict = dict(starts or {})
        self.per_link: dict[str, list[OperatorFeed]] = {n: [] for n in config.link_names}
        # a paced or live run shows each window as it closes: a pane's groups leave the
        # table when punctuation closes it (as in the appliance), not up to
        # max_lfta_disorder windows later (oop_lazy's bound, which held every window of a
        # 3-minute paced replay until its end). A replay at full speed keeps the smoothed
        # flush: no one waits for its windows one by one
        try:
            for lp in low_plans:
                lp = flow_disorder(lp, config)
                self.per_link[lp.link].append(
                    OperatorFeed(lp, spool, summaries[query_of(lp)], codec,
                                 punctuation_flush=config.streaming,
                                 complete_only=complete_only,
                                 start_ns=self.starts.get((lp.query, lp.link)),
                                 start_slots=tables.slots(lp.query, lp.link) if tables
                                 else None,
                                 on_resize=tables.note if tables else None))
        except OSError as exc:           # the spool's directories (a read-only --spool)
            raise SpoolError(f"cannot write the spool {exc.filename or spool}: "
                             f"{os_error_text(exc)}") from None
        self.feeds = {name: LinkFeeds(name, fs, config.lull_slack_ns)
                      for name, fs in self.per_link.items()}
        self.spool_queue: SpoolQueue | None = None

    def check_records(self) -> None:
        """A link whose queries read a record protocol is a record source (`capture.records`):
        a file, standard input or a FIFO, not an interface; records timed by the wall clock
        when read cannot be paced by their times."""
        config = self.config
        for name, f in self.feeds.items():
            fmt = f.record                  # RunLinkError when its queries disagree
            if name in config.netflow_links and (fmt is None or fmt.kind != "netflow"):
                raise RunLinkError(f"--netflow-in {name}: the link carries flow records; its "
                                   f"queries read it as NETFLOW (FROM {name}.NETFLOW)")
            if fmt is None:
                continue
            if name in dict(config.interfaces):
                raise RunLinkError(f"--interface {name}: the link is read as records of "
                                   f"{fmt.protocol}; give its records as --link {name}=FILE "
                                   f"(a file, - for standard input, or a FIFO)")
            if config.speed is not None and fmt.system_clock:
                raise RunConfigError(f"--speed {config.speed:g}: link {name} carries records "
                                     f"of {fmt.protocol}, timed by the wall clock when read "
                                     f"({fmt.clock or 'no increasing field'}); there are no "
                                     f"record times to pace by (use --speed max)")

    def skip_points(self) -> dict[str, int | None]:
        """A resumed file link is read past, unpaced, up to the earliest packet one of its
        operators takes; an operator with no punctuation in the spool takes every packet."""
        skip: dict[str, int | None] = {}
        for name, fs in self.per_link.items():
            known = [s for f in fs
                     if (s := self.starts.get((f.op.plan.query, name))) is not None]
            skip[name] = min(known) if fs and len(known) == len(fs) else None
        return skip

    def start_spool_queue(self) -> None:
        """From now on the spool files are written on a thread of their own."""
        self.spool_queue = SpoolQueue()
        for f in self.feeds.values():
            for feed in f.feeds:
                feed.spool_queue = self.spool_queue

    def close_spool_queue(self) -> None:
        if self.spool_queue is not None:
            self.spool_queue.close()

    @property
    def packets(self) -> int:
        return sum(f.packets for f in self.feeds.values())

    def tables(self) -> dict[str, tuple[int, int]]:
        """Per query (its summary's name): its tables' slots now and its partial rows so far."""
        out: dict[str, tuple[int, int]] = {}
        for f in self.feeds.values():
            for feed in f.feeds:
                slots = int(feed.op.counters.get("slots", 0))
                if slots:
                    name = feed.summary.name
                    had = out.get(name, (0, 0))[0]
                    out[name] = (had + slots, feed.summary.partial_rows)
        return out

    def clock(self) -> int | None:
        """The low-watermark of what the links have seen (None: nothing yet)."""
        seen = [f.timer.max_seen for f in self.feeds.values() if f.timer.max_seen is not None]
        return min(seen) if seen else None

    def collect(self, summary: RunSummary) -> None:
        """The operators' counters into their queries' summaries."""
        for f in self.feeds.values():
            for q, c in f.counters():
                q.evictions += c.get("evictions", 0)
                q.flushed += c.get("flushed", 0)
                q.forced_full_flushes += c.get("forced_full_flushes", 0)
                q.final_rows += c.get("final_rows", 0)
                q.late_packets += c.get("late", 0)
                q.late_corrected += c.get("late_corrected", 0)
                q.zero_divisor_packets += c.get("zero_divisors", 0)
                q.slots += c.get("slots", 0)
                q.resizes += c.get("resizes", 0)


def flow_disorder(lp, config: RunConfig):
    """A NETFLOW link's plan with oop's bound m (max_lfta_disorder, left at its default)
    raised to the windows the link's disorder spans: its records come disordered on the
    clock by up to the exporters' lag (`capture.flowreader`), so a window's groups stay in
    the table until the punctuation passes it rather than leave m windows after the newest
    record and come back as more partial rows (1M records over 2 h, minute windows: 15.7
    partial rows per result row at m = 2, 1.0 at the lag's 31)."""
    from dataclasses import replace

    from queries.planner import DEFAULT_MAX_DISORDER

    w, record = lp.window, lp.record
    if lp.link not in config.netflow_links or w is None or record is None \
            or lp.max_disorder != DEFAULT_MAX_DISORDER or lp.flush == "iop_slow":
        return lp
    # the longest lag of the link's exporters (the operator's for some may exceed the rest's)
    lag = max([config.flow_timeout_ns, *(t for _, t in config.flow_exporter_timeouts)])
    if record.clock == "last" and config.flow_idle_ns is not None:
        lag = min(lag, config.flow_idle_ns)
    return replace(lp, max_disorder=max(lp.max_disorder, -(-lag // w.pane_ns) + 1))


class LocalSources:
    """The links of a run read in this process, one source per link feeding its `LinkFeeds`:
    capture files and record sources replayed at full speed or paced (`tools.pipeline.replay`),
    interfaces captured live by a thread each (`tools.pipeline.livelinks`)."""

    def __init__(self, config: RunConfig, low: LowLevel):
        self.config = config
        self.low = low
        self.sources: dict = {}

    def open(self, stop=None) -> None:
        """Open every link's source (a resumed file link skips what its spool holds).
        `stop`: a stream (FIFO, standard input) waiting for its writer ends at a stop
        request."""
        self.sources = open_sources(self.config, self.low.feeds, stop, self.low.skip_points())

    def drive(self, stop, info: dict) -> str:
        """Read every source into its feeds until the input ends, the duration, or `stop()`;
        why it ended. A paced replay puts its clock's origin in `info["origin"]`."""
        return drive(self.config, self.sources, self.low.feeds, stop, info)

    def stop(self) -> None:
        """Nothing left running once `drive` returned (it closes every source)."""

    def input_bytes(self) -> int:
        total = 0
        for src in self.sources.values():
            try:
                total += Path(src.path).stat().st_size
            except OSError:
                pass
        return total

    def streams(self) -> bool:
        """Whether a source is a stream (FIFO, standard input): no known size, may last."""
        return any(getattr(src.reader, "stream", False) for src in self.sources.values())

    def read_share(self) -> float | None:
        """The share of the capture files' bytes read so far (record headers estimated), or
        None when unknown."""
        done = total = 0
        for src in self.sources.values():
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

    def lost(self) -> int:
        """Packets dropped so far, by our rings and by the kernel."""
        return sum(sum(drops(s)) for s in self.sources.values())

    def status(self) -> dict:
        """Per link, what a heartbeat says: punctuation, packets, bytes, malformed, drops."""
        out = {}
        for name, f in self.low.feeds.items():
            src = self.sources.get(name)
            stats = getattr(getattr(src, "capture", None), "stats", None) \
                or getattr(src, "stats", None)
            puncts = [p for x in f.feeds if (p := x.op.punctuation) is not None]
            ring, kernel = drops(src) if src is not None else (0, 0)
            out[name] = {"punctuation": min(puncts) if puncts and len(puncts) == len(f.feeds)
                         else None,
                         "packets": f.packets, "bytes": f.bytes,
                         "malformed": int(getattr(stats, "malformed", 0) or 0),
                         "ring_drops": ring, "kernel_drops": kernel, "ended": f.finished}
            if name in self.config.netflow_links and stats is not None:
                # a NETFLOW link's datagrams and records decoded (its records reach the low
                # level, `packets`, once its punctuation releases them)
                out[name]["datagrams"] = int(stats.datagrams)
                out[name]["records"] = int(stats.records)
        return out

    def skipped(self) -> dict[str, int]:
        """Per link, the packets a resumed source read past (they are in the spool)."""
        return {n: int(getattr(s, "skipped", 0)) for n, s in self.sources.items()}

    def collect(self, summary: RunSummary, spool=None) -> None:
        """The links' numbers into `summary.links`, and the low level's into its queries."""
        config, feeds = self.config, self.low.feeds
        for name, source in self.sources.items():
            stats = source.capture.stats if config.live else source.stats
            path = f"interface {dict(config.interfaces)[name]}" if config.live else source.path
            s = LinkSummary(name, str(path))
            # what reached the low level (a stopped replay may have read a little further)
            s.packets, s.bytes = feeds[name].packets, feeds[name].bytes
            s.malformed, s.reasons = int(stats.malformed), dict(stats.reasons)
            s.problems = list(stats.problems)
            if getattr(source, "record", None) is not None:
                s.kind, s.malformed_detail = "records", stats.describe()
                s.notes = getattr(stats, "notes", "")
            if not config.live and source.problem and source.problem not in s.problems:
                s.problems.append(source.problem)
            s.punctuations = feeds[name].timer.count
            s.ring_drops, s.kernel_drops = drops(source)
            if getattr(source, "holds_on_stop", False):       # a NETFLOW collector
                s.last_record_ns = feeds[name].last_ns
            summary.links[name] = s
            if summary.resumed:
                summary.skipped[name] = int(getattr(source, "skipped", 0))
        self.low.collect(summary)


class FanoutSources:
    """The interfaces of a run captured by `--fanout N` member processes, each with its own
    low level writing to the run's spool (`tools.pipeline.fanout.FanoutMembers`); this
    process runs only the stages."""

    def __init__(self, config: RunConfig, low: LowLevel, spool, host: str):
        from tools.pipeline.fanout import FanoutMembers

        self.config = config
        self.low = low
        self.spool = spool
        self.members: FanoutMembers = FanoutMembers(config, str(spool), host, config.fanout)

    def open(self, stop=None) -> None:
        """The members start in `drive`."""

    def drive(self, stop, info: dict) -> str:
        self.members.start()
        return self.members.drive(stop, self.config.duration_ns)

    def stop(self) -> None:
        self.members.stop()

    def input_bytes(self) -> int:
        return 0

    def streams(self) -> bool:
        return False

    def read_share(self) -> float | None:
        return None

    def lost(self) -> int:
        return 0

    def collect(self, summary: RunSummary, spool=None) -> None:
        """Each fanned-out link's numbers: its members' last heartbeats, added up."""
        self.low.collect(summary)
        self.members.summarise(summary, self.spool)


def open_sources(config: RunConfig, feeds: dict, stop=None, skip: dict | None = None) -> dict:
    """Per link, its open source: a `LiveLink` per interface, else a `FileLink` per file."""
    if config.live:
        from capture.live import snaplen_for
        from tools.pipeline.livelinks import LiveLink

        lives = {}
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
    from tools.pipeline.replay import FileLink

    links: dict = {}
    try:
        for name, path in config.links:
            links[name] = FileLink(name, path, config.batch_size,
                                   columns=feeds[name].read_columns, stop=stop,
                                   skip_before=(skip or {}).get(name),
                                   record=feeds[name].record, separator=config.csv_separator,
                                   flow_timeout_ns=config.flow_timeout_ns,
                                   flow_exporter_timeouts=config.flow_exporter_timeouts,
                                   flow_idle_ns=config.flow_idle_ns,
                                   lull_slack_ns=config.lull_slack_ns,
                                   flow_state=_flow_state(config, name))
            if links[name].flow:
                feeds[name].timer.source = links[name].source_punctuation
                if links[name].reader.stream:
                    # a collector's datagrams queue while its first batch loads the kernels
                    feeds[name].warm(links[name].reader.sample_batch())
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


def _flow_state(config: RunConfig, name: str) -> Path | None:
    """Where a NETFLOW link keeps its templates: a resumable run's checkpoint (an agent's
    `flow_state_dir`)."""
    if config.flow_state_dir is not None:
        from urllib.parse import quote

        return Path(config.flow_state_dir) / f"{quote(name, safe='')}.json"
    if config.spool is None or config.checkpoint is None:
        return None
    return Path(config.checkpoint) / "netflow" / f"{name}.json"


def drive(config: RunConfig, sources: dict, feeds: dict, stop, info: dict) -> str:
    """Read `sources` into `feeds` until the input ends, the duration, or `stop()`."""
    if config.live:
        from tools.pipeline.livelinks import run_live

        return run_live(sources, feeds, duration_ns=config.duration_ns, stop=stop)
    from tools.pipeline.replay import replay

    return replay(sources, feeds, speed=config.speed, period_ns=config.punctuate_every_ns,
                  duration_ns=config.duration_ns, stop=stop, info=info)


def drops(source) -> tuple[int, int]:
    """(our ring's drops, the kernel's drops) of a source (a NETFLOW collector's: its
    queue's and its socket's)."""
    flow = getattr(getattr(source, "reader", None), "stats", None)
    kernel = getattr(flow, "socket_drops", None)
    if kernel is not None:
        return int(getattr(flow, "queue_drops", 0)), int(kernel)
    ring = getattr(source, "ring", None)
    capture = getattr(source, "capture", None)
    ring_drops = ring.stats().dropped if ring is not None else 0
    kernel = getattr(getattr(capture, "stats", None), "kernel_drops", 0) if capture else 0
    return int(ring_drops), int(kernel or 0)
