"""`oopscope agent`: the low level alone, next to its links, writing to a shared spool.

An agent plans the query file as `run` does, keeps the low-level plans of its own links
(capture, ring, operators, flush policy, timer punctuation: `tools.pipeline.feeds`), and writes
their partial rows and punctuation to `SPOOL/<query>/partials/<link>-<seq>.parquet`, where a
collector (`tools.cluster.collector`) on a Spark cluster melds every agent's links. Beside
them it beats (`tools.pipeline.heartbeat`) and keeps its tables' sizes (`SPOOL/agents/HOST.tables`,
`tools.pipeline.tablesizes`): started again, its tables start at them. Its spool files hold only rows of panes its own
punctuation closed (`OperatorFeed.complete_only`), so an agent killed and started again
continues: a capture file from the pane holding its last punctuation (nothing written twice),
an interface from the next window on (the windows in between are the gap it reports).

Replays end with end-of-input punctuation; live agents run until stopped (SIGTERM or Ctrl-C:
every link flushes and punctuates end of input, exit 0).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from common.errors import os_error_text
from tools.errors import RunConfigError, RunLinkError
from tools.pipeline.config import RunConfig
from tools.pipeline.fanout import Member
from tools.pipeline.windows import when

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentConfig:
    """One agent: `run` holds the query file, links or interfaces, speed, period, params
    (its outputs and checkpoint are not used); `spool` is the shared directory."""

    run: RunConfig
    spool: str
    host_id: str
    #: one member of a fanout group (`tools.pipeline.fanout`): its interface's sub-link
    member: Member | None = None


@dataclass
class AgentSummary:
    host: str
    links: dict = field(default_factory=dict)      # name -> tools.pipeline.config.LinkSummary
    queries: dict = field(default_factory=dict)    # name -> tools.pipeline.config.QuerySummary
    ended: str = "end of input"
    resumed: dict = field(default_factory=dict)    # link -> packets read past (in the spool)
    gap: tuple | None = None
    seconds: float = 0.0

    def format(self) -> str:
        from tools.pipeline.config import RunSummary

        lines = [line for line in RunSummary(self.links, {}).format().splitlines()
                 if line.startswith("link ")]
        for q in self.queries.values():
            lines.append(f"query {q.name}: {q.partial_rows} partial rows in {q.spool_files} "
                         f"spool files, {q.evictions} evictions, {q.late_packets} late packets"
                         + (f"; table {q.slots:,} slots ({q.resizes} resizes)"
                            if q.slots else ""))
        if self.resumed:
            lines.append("agent resumed from the spool; packets already in it, read past: "
                         + ", ".join(f"link {n} {v:,}" for n, v in self.resumed.items()))
        if self.gap is not None:
            lines.append(f"gap: the windows from {when(self.gap[0])} to {when(self.gap[1])} "
                         f"have no rows of this agent's links (it was down)")
        lines.append(f"agent {self.host} ended: {self.ended}; {self.seconds:.2f} s")
        return "\n".join(lines)


def plan_for_agent(config):
    """The query set's plan over the links it names (every agent plans the same stages), or
    over this agent's links when it names none; this agent's links must be among them."""
    from queries.explain import mentioned_links
    from tools.pipeline.config import functions_of, plan_tree, read_query_set, schema_of

    tree, text, paths = read_query_set(config.query_files)
    label = " + ".join(str(p) for p in paths)
    schema = schema_of(paths, config.schema_files)
    own = config.link_names
    wanted = mentioned_links(tree)
    if wanted:
        stray = [n for n in own if n not in wanted]
        if stray:
            raise RunLinkError(f"{' + '.join(Path(p).name for p in paths)}: "
                               f"{', '.join(stray)} is not a link of the query file; its "
                               f"links are {', '.join(wanted)}")
    return plan_tree(tree, text, label, list(wanted or own), dict(config.params),
                     dict(config.overrides), schema=schema,
                     functions=functions_of(config.function_files, config.udf_module))


def run_agent(agent: AgentConfig, stop) -> AgentSummary:
    """Run the low level of the query file for the agent's links until end of input or a
    stop request (`stop()` true)."""
    from highlevel.graph import StageGraph
    from tools.pipeline.config import QuerySummary, RunSummary, choose_queries
    from tools.pipeline.heartbeat import Heartbeat, check_host_id
    from tools.pipeline.sources import LocalSources, LowLevel, check_sources
    from tools.pipeline.tablesizes import TableLog, agent_tables, table_report

    started = time.perf_counter()
    config = agent.run
    host = check_host_id(agent.host_id)
    check_sources(config)
    if config.fanout > 1 and agent.member is None:
        return _fanout_parent(agent, stop, started)
    plan = plan_for_agent(config)
    chosen = choose_queries(plan, replace(config, outputs=()))
    sub: dict[str, str] = {}            # link -> the sub-link this fanout member spools as
    if agent.member is not None:
        interfaces, options = agent.member.capture(config.interfaces, config.capture_options)
        sub = {config.interfaces[0][0]: interfaces[0][0]}
        config = replace(config, interfaces=interfaces, capture_options=options)
    spool = Path(agent.spool)
    try:
        spool.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunConfigError(f"--spool {spool}: cannot create it: {os_error_text(exc)}") \
            from None
    own = set(config.link_names)
    with tempfile.TemporaryDirectory(prefix="oopscope-agent-") as unused:
        graph = StageGraph(plan, [qp.name for qp, _ in chosen], spool, unused, sinks={})
        low_plans = [replace(lp, link=sub[lp.link]) if lp.link in sub else lp
                     for lp in graph.low_plans()]
        low_plans = [lp for lp in low_plans if lp.link in own]
    if not low_plans:
        files = " + ".join(Path(f).name for f in config.query_files)
        raise RunLinkError(f"no query of {files} reads the links {', '.join(sorted(own))}")
    resume = _continue_from(spool, low_plans, config, chosen)
    queries = {q: QuerySummary(q, "(spool)", "spool") for q in {graph.query_of(lp)
                                                                for lp in low_plans}}
    if config.netflow_links:
        from tools.pipeline.heartbeat import heartbeat_path

        # a collector's templates beside its heartbeat: an agent started again decodes at once
        config = replace(config, flow_state_dir=str(
            heartbeat_path(spool, host).with_suffix(".netflow")))
    # the tables start at the sizes they had when this agent last ran (a first window that
    # does not evict), and every resize is noted for the next start
    tables = TableLog(agent_tables(spool, host), resumed=True)
    low = LowLevel(config, low_plans, spool, queries, graph.query_of, complete_only=True,
                   starts=resume.starts(low_plans), tables=tables)
    low.check_records()
    sources = LocalSources(config, low)
    sources.open(stop)
    beat = Heartbeat(spool, host, sorted(queries), config.punctuate_every_ns, sources.status)
    feeds = [feed for fs in low.per_link.values() for feed in fs]
    beat.tables_of = lambda: table_report(feeds)
    beat.start()
    low.start_spool_queue()
    summary = AgentSummary(host, queries=queries, gap=resume.gap)
    state = "stopped"
    try:
        summary.ended = sources.drive(stop, {})
        state = "ended" if summary.ended == "end of input" else "stopped"
    finally:
        low.close_spool_queue()
        beat.finish(state)
    run_summary = RunSummary(links={}, queries=queries)
    sources.collect(run_summary)
    summary.links = run_summary.links
    if resume.resumed:
        summary.resumed = {n: v for n, v in sources.skipped().items() if v}
    summary.seconds = time.perf_counter() - started
    return summary


def _continue_from(spool: Path, low_plans, config, chosen):
    """An agent started again over its own spool continues it (module docstring): the
    `Resume`, whose `starts` are, per (query, link), the first packet time its operator
    takes."""
    from tools.pipeline.resume import Resume

    resume = Resume.of_spool(spool, low_plans)
    if resume.resumed and config.live:
        resume.live_gap(chosen)
    if resume.resumed:
        for (query, link), start in sorted(resume.starts(low_plans).items()):
            log.warning("query %s, link %s: continuing the spool from %s", query, link,
                        "the start" if start is None else when(start))
    return resume


def _fanout_parent(agent: AgentConfig, stop, started: float) -> AgentSummary:
    """`--fanout N`: N member agents, one per socket of the group, supervised here (their
    summaries are theirs, on the same stderr); a stop request is passed on to them."""
    from highlevel.errors import StageConfigError
    from highlevel.graph import StageGraph
    from tools.errors import UnsupportedQueryError
    from tools.pipeline.fanout import FanoutMembers

    config = agent.run
    if config.links:
        raise RunConfigError("--fanout splits live interfaces over capture processes; a "
                             "capture file (--link) is read by one")
    plan = plan_for_agent(config)
    from tools.pipeline.config import choose_queries

    chosen = choose_queries(plan, replace(config, outputs=()))
    try:        # what cannot meld sub-links is refused before any process starts
        with tempfile.TemporaryDirectory(prefix="oopscope-agent-") as unused:
            StageGraph(plan, [qp.name for qp, _ in chosen], agent.spool, unused, sinks={},
                       fanout={name: config.fanout for name in config.link_names})
    except StageConfigError as exc:
        raise UnsupportedQueryError(str(exc)) from None
    members = FanoutMembers(config, agent.spool, agent.host_id, config.fanout)
    members.start()
    summary = AgentSummary(agent.host_id)
    try:
        summary.ended = members.drive(stop, config.duration_ns)
    finally:
        members.stop()
    summary.seconds = time.perf_counter() - started
    return summary
