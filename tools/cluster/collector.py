"""`oopscope collect`: the high level alone, over the partial rows every agent spools.

The collector plans the query file over every expected link (named by `--links`, or learnt
from the agents' heartbeats once `--expect-agents N` have beaten), builds the same Spark
stages `run` does (`highlevel.graph.StageGraph`) over the shared spool, and runs them
continuously, on a Spark cluster with `--master`: Meld across all links of all agents
(punctuation = the minimum over links), each window closed once, the outputs written as `run`
writes them.

Between micro-batches it reads the heartbeats: a link whose agent has not beaten for
`--agent-timeout` is declared silent (`tools.pipeline.heartbeat.Liveness`) and left out of the
stages' Meld, so windows close without it; its rows that arrive later are late for the windows
closed meanwhile and follow the query's late policy (dropped and counted, or corrected). It
ends when every expected link has punctuated end of input (each agent's replay ended or was
stopped), or at SIGTERM / Ctrl-C: what has arrived is processed, the windows still open are
left open.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common.units import NS_PER_S as NS
from tools.errors import RunConfigError
from tools.pipeline.config import RunConfig

log = logging.getLogger(__name__)

#: how often the collector looks at the heartbeats and the spool's end markers
POLL_S = 0.25


@dataclass(frozen=True)
class CollectConfig:
    """One collector: `run` holds the query file, outputs, format, params, master and
    checkpoint (its links and interfaces are not used); the links to expect are `links`,
    else those of `expect_agents` agents' heartbeats."""

    run: RunConfig
    spool: str
    links: tuple[str, ...] = ()
    expect_agents: int | None = None
    agent_timeout_s: float | None = None      # None: 3 punctuation periods of the agents
    wait_agents_s: float = 300.0


def expected_links(config: CollectConfig, stop) -> tuple[list[str], dict]:
    """The links to meld, and the heartbeats read (host -> Beat)."""
    from tools.pipeline.heartbeat import links_of, read_heartbeats

    spool = Path(config.spool)
    if config.links:
        return list(config.links), read_heartbeats(spool)
    if not config.expect_agents:
        raise RunConfigError("name the links to expect (--links a,b) or how many agents "
                             "(--expect-agents N)")
    deadline = time.monotonic() + config.wait_agents_s
    said = 0.0
    while True:
        beats = read_heartbeats(spool)
        if len(beats) >= config.expect_agents:
            return sorted(links_of(beats)), beats
        if stop() or time.monotonic() > deadline:
            raise RunConfigError(f"--expect-agents {config.expect_agents}: "
                                 f"{len(beats)} agents have beaten in {spool / 'agents'} "
                                 f"({', '.join(sorted(beats)) or 'none'}); start the others "
                                 f"or name the links with --links")
        if time.monotonic() - said > 5:
            log.warning("waiting for %d agents in %s: %s so far", config.expect_agents,
                        spool, ", ".join(sorted(beats)) or "none")
            said = time.monotonic()
        time.sleep(POLL_S)


def run_collector(config: CollectConfig, stop):
    """Run the stages until every expected link has ended, or `stop()`; a RunSummary."""
    from dataclasses import replace

    from tools.pipeline.config import load_plan

    started = time.perf_counter()
    found, beats = expected_links(config, stop)
    links, fanout = _sublinks(found, beats)
    run_config = replace(config.run, links=tuple((n, "-") for n in links), interfaces=())
    plan = load_plan(run_config)
    temps: list[Path] = []
    try:
        checkpoint = run_config.checkpoint
        if checkpoint is None:
            checkpoint = tempfile.mkdtemp(prefix="oopscope-collect-")
            temps.append(Path(checkpoint))
        elif Path(checkpoint).is_dir() and any(Path(checkpoint).iterdir()):
            raise RunConfigError(f"--checkpoint {checkpoint}: not empty; give an empty or "
                                 f"new directory")
        return _collect(config, run_config, plan, links, fanout, Path(checkpoint), stop,
                        started)
    finally:
        for d in temps:
            shutil.rmtree(d, ignore_errors=True)


def _sublinks(names: list[str], beats: dict) -> tuple[list[str], dict[str, int]]:
    """(links, link -> N) from the names to expect: an agent with `--fanout N` spools a link
    as N sub-links `NAME#K` (`tools.pipeline.fanout`); a link named by `--links` whose agent
    has beaten with sub-links is taken as they are."""
    from highlevel.graph import base_link, split_sublinks
    from tools.pipeline.heartbeat import links_of

    beaten = list(links_of(beats))
    spooled: list[str] = []
    for name in names:
        subs = [b for b in beaten if b != name and base_link(b) == name]
        spooled += subs or [name]
    return split_sublinks(spooled)


def _collect(config, run_config, plan, links, fanout, checkpoint: Path, stop, started):
    from common.errors import OopscopeError
    from highlevel.errors import StageConfigError
    from highlevel.graph import StageGraph
    from highlevel.session import get_session
    from highlevel.warmup import warm_session
    from tools.errors import UnsupportedQueryError
    from tools.pipeline.config import LinkSummary, QuerySummary, RunSummary, choose_queries
    from tools.pipeline.heartbeat import Liveness, add_link_totals, read_heartbeats
    from tools.pipeline.outputset import RunOutputs

    spool = Path(config.spool)
    chosen = choose_queries(plan, run_config)
    outputs = RunOutputs(run_config, chosen, checkpoint, plan=plan)
    outputs.open()
    try:
        try:
            graph = StageGraph(plan, [qp.name for qp, _ in chosen], spool, checkpoint,
                               sinks={n: [o] for n, o in outputs.items()},
                               master=run_config.master, fanout=fanout)
        except StageConfigError as exc:
            raise UnsupportedQueryError(str(exc)) from None
        low = graph.low_plans()
        spark = get_session(run_config.master, quick_jvm=False)
        # as the appliance's: warm before the first window, then latency-minded stages
        warm_session(spark)
        graph.bind(spark)
        graph.run_continuously()
        graph.start()
        beats = read_heartbeats(spool)
        period = max((b.period_ns for b in beats.values()), default=run_config.punctuate_every_ns)
        timeout = config.agent_timeout_s if config.agent_timeout_s is not None \
            else 3 * period / NS
        liveness = Liveness(timeout)
        ended = "stopped"
        while not stop():
            beats = read_heartbeats(spool)
            silent = liveness.update(beats)
            for _, stage in graph.stages:
                stage.silent_links = silent
            if _all_ended(spool, low):
                ended = "end of input"
                break
            time.sleep(POLL_S)
        graph.stop()
    except OopscopeError as exc:
        outputs.close_quietly()
        raise outputs.fault(exc) from None
    except BaseException:
        outputs.close_quietly()
        raise
    outputs.close(complete=True)
    queries = {qp.name: QuerySummary(qp.name, out, outputs[qp.name].format)
               for qp, out in chosen}
    for name, q in queries.items():
        q.rows = outputs[name].rows
        q.late_partial_rows = graph.late_rows(name)
        q.zero_divisor_rows = graph.zero_divisor_rows(name)
    beats = read_heartbeats(spool)
    _add_tables(queries, low, graph.query_of, spool, beats)
    for name, q in queries.items():
        reader = graph.stage_of.get(name)
        if reader is not None:           # the files its stage applied and removed
            q.partial_rows += reader.pruned_rows
            q.spool_files += reader.pruned_files
    summary = RunSummary(links={}, queries=queries, ended=ended)
    add_link_totals(summary.links, beats, wanted=set(links))
    for name in sorted(set(liveness.silent)):
        summary.links.setdefault(name, LinkSummary(name, "agent ?")).problems.append(
            "declared silent: its agent stopped beating; windows closed without it")
    summary.total_seconds = summary.highlevel_seconds = time.perf_counter() - started
    return summary


def _add_tables(queries: dict, low_plans, query_of, spool: Path, beats: dict) -> None:
    """Per query the agents' tables (slots and resizes, from their last beats) and the
    partial rows of its spool: the summary then shows how much the low level reduced."""
    import pyarrow.parquet as pq

    from common.spool import list_spool
    from highlevel.batchfiles import ROWS_KEY
    from highlevel.graph import base_link

    for query, plans in _by_query(low_plans, query_of).items():
        q = queries.get(query)
        if q is None:
            continue
        wanted = {(lp.query, lp.link) for lp in plans}
        for beat in beats.values():
            for name, tables in beat.tables.items():
                for link, t in tables.items():
                    if (name, base_link(link)) in wanted and isinstance(t, dict):
                        q.slots += int(t.get("slots") or 0)
                        q.resizes += int(t.get("resizes") or 0)
        for name in sorted({lp.query for lp in plans}):
            for _, _, path in list_spool(spool, name):
                try:      # its data rows (a file holds a punctuation row besides)
                    meta = pq.read_schema(path).metadata or {}
                    q.partial_rows += int(meta.get(ROWS_KEY, b"0"))
                except (OSError, ValueError) as exc:
                    log.warning("%s: cannot count its rows (%s)", path, exc)
        q.spool_files += sum(len(list_spool(spool, n)) for n in {lp.query for lp in plans})


def _by_query(low_plans, query_of) -> dict[str, list]:
    out: dict[str, list] = {}
    for lp in low_plans:
        out.setdefault(query_of(lp), []).append(lp)
    return out


def _all_ended(spool: Path, low_plans) -> bool:
    """Every (query, link) of the low level has written end-of-input punctuation."""
    from common.spool import END_OF_INPUT, last_punctuations

    seen: dict[str, dict] = {}
    for lp in low_plans:
        if lp.query not in seen:
            seen[lp.query] = last_punctuations(spool, lp.query)
        _, p = seen[lp.query].get(lp.link, (None, None))
        if p != END_OF_INPUT:
            return False
    return True
