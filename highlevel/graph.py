"""The stage graph of a run: one Spark stage per query (and per join/MERGE side over links).

`StageGraph(plan, queries, spool, checkpoint, sinks=...)` builds the stages of the asked
queries and of every query they read, transitively, in file order (a query only reads earlier
ones, so file order is a topological order). Edges are spools: an upstream stage's closed rows
and output punctuation go through a `SpoolSink` into the reader's spool directory (link name =
the upstream query, or the FROM alias for join and MERGE inputs), in the same atomic
Parquet + marker-row format the low level writes, so every stage reads one directory as one
stream and melds its inputs' punctuation the same way.

Each plan kind's stage is made by `highlevel.stagebuilder.StageBuilder`. `low_plans()` lists
what the low level must run: for join/MERGE sides the plan's `query` is the side stage's name
`<query>@<alias>` (the spool directory to write), and `query_of(plan)` gives the user query it
belongs to.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from highlevel.errors import StageConfigError
from highlevel.session import lower_priority
from highlevel.sinks import Sink
from highlevel.stage import DEFAULT_TRIGGER, Stage
from highlevel.stagebuilder import StageBuilder

log = logging.getLogger(__name__)


def sublink_names(link: str, n: int) -> tuple[str, ...]:
    """The spool links of a link captured by n fanout sockets: `NAME#0` .. `NAME#n-1`."""
    return tuple(f"{link}#{k}" for k in range(n))


def base_link(name: str) -> str:
    """The link a spool link belongs to: NAME for a sub-link `NAME#K`, else the name."""
    base, sep, k = name.rpartition("#")
    return base if sep and k.isdigit() else name


def split_sublinks(names) -> tuple[list[str], dict[str, int]]:
    """Spool links as the plan names them (each sub-link `NAME#K` as NAME, in order), and
    link -> N of those that come as N sub-links (`StageGraph(fanout=...)`)."""
    links: list[str] = []
    fanout: dict[str, int] = {}
    for name in names:
        link = base_link(name)
        if link not in links:
            links.append(link)
        if link != name:
            fanout[link] = fanout.get(link, 0) + 1
    return links, {link: n for link, n in fanout.items() if n > 1}


#: how often the stages of a graph that runs for good look for new spool files: a window's
#: rows wait for the next look
CONTINUOUS_TRIGGER = "100 milliseconds"


class StageGraph:
    """Every Spark stage a set of queries needs, wired by spools (see the module docstring)."""

    def __init__(self, plan, queries: list[str], spool, checkpoint, *,
                 sinks: dict[str, list[Sink]], spark=None, master=None,
                 trigger: str = DEFAULT_TRIGGER, fanout: dict[str, int] | None = None):
        self.plan = plan
        # link -> N: the link is captured by N fanout sockets, each its own low-level
        # operator and spool sub-link (`sublink_names`), melded by every stage reading it
        self.sublinks = {link: sublink_names(link, n) for link, n in (fanout or {}).items()
                         if n > 1}
        self.spool, self.checkpoint = Path(spool), Path(checkpoint)
        self._spark, self._master = spark, master
        self.trigger = trigger
        self.user_sinks = {q: list(v) for q, v in (sinks or {}).items()}
        for q in queries:
            try:
                plan.query(q)
            except KeyError:
                raise StageConfigError(f"query {q!r} is not in the file; its queries are "
                                       f"{', '.join(plan.names)}") from None
        self.queries = self._closure(list(queries))
        # sinks each query's stage writes to: user sinks plus spool sinks of its readers
        self.sinks: dict[str, list[Sink]] = {q: list(self.user_sinks.get(q, ()))
                                             for q in self.queries}
        # the stages are made when first needed (they need the Spark session): the low-level
        # plans are known at once, so packets can flow while the JVM starts
        self._builder = StageBuilder(plan, self.spool, self.checkpoint, self.sinks,
                                     self.sublinks, self._kw)
        own = [(qp.name, self._builder.maker(qp)) for qp in plan.queries
               if qp.name in self.queries]
        # side stages first, as the builder found them
        self._makers: list[tuple[str, Callable[[], Stage]]] = self._builder.side_makers + own
        self._stages: list[tuple[str, Stage]] | None = None
        self.stage_of: dict[str, Stage] = {}
        #: the stages remove their spool files once committed (`Stage.prune_spool`)
        self.prune_spool = False

    def run_continuously(self) -> None:
        """The settings of a graph that runs for good (the appliance, a collector), where a
        window's latency counts: its stages look for spool files every `CONTINUOUS_TRIGGER`,
        close small batches on the driver (`highlevel.smallbatch`) and keep their open
        state there (`Stage.open_on_driver`), and remove the spool files they have applied
        (`Stage.prune_applied`: a spool read by one stage). Makes the stages (Spark must be
        bound)."""
        from collections import Counter

        readers = Counter(stage.spec.query for _, stage in self.stages)
        for _, stage in self.stages:
            stage.open_on_driver = stage.small_on_driver = True
            stage.trigger = CONTINUOUS_TRIGGER
            stage.prune_applied = readers[stage.spec.query] == 1

    def bind(self, spark) -> None:
        """Use this Spark session (started elsewhere, e.g. while the low level ran)."""
        if self._stages is None:
            self._spark = spark
        else:                       # made before Spark was up (`speculate`)
            for _, stage in self._stages:
                stage.spark = spark

    def speculate(self, nice: int = 0) -> threading.Thread | None:
        """Compute on a thread of its own what each stage's next batch would write over its
        spool as it is now (`Stage.speculate`), for the stages that have not begun a batch
        yet: a bounded run calls this when its low level ends, while Spark starts or while
        the streaming queries start. Stages not made yet are made now, before Spark is up,
        when every one is an aggregation over links (those need no session to be made);
        `nice`: the thread's niceness (Spark's start is the run's critical path)."""
        if self._stages is None and set(self.queries) != self._builder.over_links:
            return None
        stages = [stage for _, stage in self.stages if stage.computes_ahead]
        if not stages:
            return None

        def run() -> None:
            if nice:
                lower_priority(nice)
            for stage in stages:
                try:
                    stage.speculate()
                except Exception as exc:  # noqa: BLE001 - the batch computes its own then
                    log.debug("query %s: nothing computed ahead: %s", stage.spec.query, exc)

        thread = threading.Thread(target=run, name="oopscope-ahead", daemon=True)
        thread.start()
        return thread

    @property
    def spark(self):
        if self._spark is None:
            from highlevel.session import get_session

            self._spark = get_session(self._master)
        return self._spark

    @property
    def stages(self) -> list[tuple[str, Stage]]:
        """(stage name, stage), upstream first; made on first use."""
        if self._stages is None:
            stages = []
            for name, make in self._makers:
                stage = make()
                stage.prune_spool = self.prune_spool
                stage.row_order = self._row_order(name)
                if self.sublinks:
                    stage.sublinks = self.sublinks
                stages.append((name, stage))
                self.stage_of[name] = stage
            order = {q: i for i, q in enumerate(self.plan.names)}
            stages.sort(key=lambda s: (order[s[0].split("@")[0]], "@" not in s[0]))
            self._stages = stages
        return self._stages

    def _row_order(self, name: str) -> tuple[tuple[str, bool], ...]:
        """The order of a query's rows in each batch: its window, then DEFINE order_by
        (none for a side stage `query@alias`, or without order_by: the stage's own)."""
        from queries.definitions import row_order

        if "@" in name:
            return ()
        qp = self.plan.query(name)
        analysed = getattr(qp, "analysed", None)
        text = getattr(analysed, "defines", {}).get("order_by")
        if not text:
            return ()
        window: str | None = getattr(qp.high.window, "column", None)
        first = () if window is None else ((window, False),)
        return first + tuple(row_order(text))

    # --- building ----------------------------------------------------------------------------
    def inputs_of(self, qp) -> list[str]:
        """The queries whose results query plan `qp` reads."""
        h = qp.high
        if h.kind == "join":
            return [s.input for s in (h.join.left, h.join.right) if s.kind == "query"]
        if h.kind == "merge":
            return [s.query for s in qp.analysed.sources if s.kind == "query"]
        return list(h.inputs) if h.input_kind == "queries" else []

    def _closure(self, queries: list[str]) -> list[str]:
        seen: set[str] = set()
        todo = list(queries)
        while todo:
            q = todo.pop()
            if q in seen:
                continue
            seen.add(q)
            todo += self.inputs_of(self.plan.query(q))
        return [q for q in self.plan.names if q in seen]

    def _kw(self) -> dict:
        # read when a stage is made: `bind` may have given the session since
        return dict(spark=self._spark, master=self._master, trigger=self.trigger)

    # --- the API the pipeline calls ----------------------------------------------------------
    def low_plans(self) -> list:
        """Every low-level plan the graph needs; write each one's partials with
        `SpoolWriter(spool, plan.query, plan.link)` (for a join/MERGE side `plan.query` is
        the side stage `<query>@<alias>`)."""
        return list(self._builder.low)

    def query_of(self, low_plan) -> str:
        """The user query a low-level plan of `low_plans()` belongs to."""
        return self._builder.query_of.get(low_plan.query, low_plan.query)

    def run_available(self) -> None:
        """Process all spool input, upstream before downstream. One pass in file order is a
        fixpoint: a stage only writes to the spools of later stages."""
        for _, stage in self.stages:
            stage.run_available()

    def start(self) -> None:
        for _, stage in self.stages:
            stage.start()

    def drain(self) -> None:
        """Let each running continuous query, upstream first, process every spool file there
        is now (a query a stage upstream feeds sees that stage's last rows)."""
        from pyspark.errors import StreamingQueryException

        from highlevel.errors import HighLevelError

        for name, stage in self.stages:
            if stage.query is not None:
                try:
                    stage.query.processAllAvailable()
                except StreamingQueryException as exc:
                    first = str(exc).strip().splitlines()[0][:300]
                    raise HighLevelError(f"query {name!r}: Spark stage failed: {first}") \
                        from exc

    def stop(self) -> None:
        """Drain the continuous queries, stop them, then process what is left in the spools.
        Stopping a query interrupts the micro-batch it is in (its Spark jobs fail), and a
        batch cut after its rows were written would be written again by the replay: so the
        queries are stopped only when idle."""
        try:
            self.drain()
        finally:
            for _, stage in self.stages:
                stage.stop()
        self.run_available()

    def stage(self, query: str) -> Stage:
        _ = self.stages            # made on first use
        return self.stage_of[query]

    def late_rows(self, query: str) -> int:
        return self.stage(query).state.late_rows

    def corrected_rows(self, query: str) -> int:
        """Correction rows written (late 'correct'; 0 for stages without corrections)."""
        return self.stage(query).state.corrected_rows

    def zero_divisor_rows(self, query: str) -> int:
        """Rows written whose outputs or HAVING met a zero divisor (the quotient is 0)."""
        return self.stage(query).state.zero_divisor_rows

    def closed_rows(self, query: str) -> int:
        return self.stage(query).state.closed_rows

    def punctuation(self, query: str) -> int | None:
        """The query's output punctuation (ns) so far."""
        return self.stage(query).state.punctuation
