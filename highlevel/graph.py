"""The stage graph of a run: one Spark stage per query (and per join/MERGE side over links).

`StageGraph(plan, queries, spool, checkpoint, sinks=...)` builds the stages of the asked
queries and of every query they read, transitively, in file order (a query only reads earlier
ones, so file order is a topological order). Edges are spools: an upstream stage's closed rows
and output punctuation go through a `SpoolSink` into the reader's spool directory (link name =
the upstream query, or the FROM alias for join and MERGE inputs), in the same atomic
Parquet + marker-row format the low level writes, so every stage reads one directory as one
stream and melds its inputs' punctuation the same way.

Stages by plan kind:
- aggregate over links: `AggregateStage` (combine partials, Meld/Merge, close windows);
  landmark windows `LandmarkStage`, tuple-count windows `CountWindowStage`;
- aggregate over a query: `AggregateStage` whose micro-batches first run the row plan in Spark
  (`highlevel.rowplans`), then combine/close as for links (1-minute -> 5-minute rollups); a
  reader of a join grouping by both sides' times: `JointStage`;
- select: `SelectStage` (rows pass through, Meld punctuation);
- join: `JoinStage` (OA-Join); a side over links gets a `SelectStage` named `<query>@<alias>`
  that unions its links into the join's spool;
- merge: `MergeStage`; sources over links get a side stage as for joins.
`low_plans()` lists what the low level must run: for join/MERGE sides the plan's `query` is
the side stage's name `<query>@<alias>` (the spool directory to write), and
`query_of(plan)` gives the user query it belongs to.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from highlevel.errors import StageConfigError
from highlevel.session import lower_priority
from highlevel.sinks import Sink, SpoolSink
from highlevel.stage import DEFAULT_TRIGGER, Stage

log = logging.getLogger(__name__)


def _gsql(t: str) -> str:
    t = t.lower()
    return "ip" if t in ("ip", "ipv6") else t


def output_columns_of(qp) -> list[tuple[str, str]]:
    """(name, GSQL type) of a query's result rows, as readers see them."""
    return [(o.name, _gsql(o.type)) for o in qp.high.outputs]


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


#: plan kinds whose stages meld their links (a fanout's sub-links are links to them: a join's
#: sides are selections); the others (MERGE, tuple-count windows) need one ordered stream
_FANOUT_KINDS = ("aggregate", "select", "join")


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
        self._low: list = []
        self._query_of: dict[str, str] = {}
        self._over_links: set[str] = set()      # plain aggregations over links (`speculate`)
        # the stages are made when first needed (they need the Spark session): the low-level
        # plans are known at once, so packets can flow while the JVM starts
        # side stages first, as _build finds them
        self._makers: list[tuple[str, Callable[[], Stage]]] = []
        own: list[tuple[str, Callable[[], Stage]]] = []
        for qp in plan.queries:
            if qp.name in self.queries:
                own.append((qp.name, self._build(qp)))
        self._makers += own
        self._stages: list[tuple[str, Stage]] | None = None
        self.stage_of: dict[str, Stage] = {}
        #: the stages remove their spool files once committed (`Stage.prune_spool`)
        self.prune_spool = False

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
        if self._stages is None and set(self.queries) != self._over_links:
            return None
        stages = [stage for _, stage in self.stages
                  if stage.closes_on_driver and not stage.driver_batches]
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
                if self.sublinks:
                    stage.sublinks = self.sublinks
                stages.append((name, stage))
                self.stage_of[name] = stage
            order = {q: i for i, q in enumerate(self.plan.names)}
            stages.sort(key=lambda s: (order[s[0].split("@")[0]], "@" not in s[0]))
            self._stages = stages
        return self._stages

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

    def _ck(self, name: str) -> Path:
        return self.checkpoint / name

    def _feed(self, upstream: str, reader: str, link: str, prefix: str = "",
              side: int | None = None, joint: bool = False) -> None:
        self.sinks[upstream].append(SpoolSink(self.spool, reader, link, prefix, side, joint))

    def _join_side(self, upstream: str, window) -> int | None:
        """When `upstream` is a join and the reader's window (its pane expression over the
        join's output columns) depends on one side's columns only: that side (0 left, 1
        right), whose individual punctuation the reader may close its windows on."""
        from queries.analysis import join_side

        up = self.plan.query(upstream).high
        if up.kind != "join" or window is None or window.expr is None:
            return None
        alias = join_side({o.name: o.expr for o in up.outputs}, window.expr)
        aliases = (up.join.left.alias, up.join.right.alias)
        return aliases.index(alias) if alias in aliases else None

    def _kw(self):
        return dict(spark=self._spark, master=self._master, trigger=self.trigger)

    def _side_stage(self, qp, alias: str, link_column: str | None, prefix: str):
        """The selection stage unioning one join/MERGE side's links into the query's spool."""
        from highlevel.select import Selection, SelectStage
        from queries import expressions as E

        name = f"{qp.name}@{alias}"
        plans = [lp for lp in qp.low if lp.side == alias]
        if not plans:
            raise StageConfigError(f"query {qp.name!r}: no low-level plans for side {alias!r}")
        proj = [(k.name, _gsql(k.type)) for k in plans[0].projections]
        low_cols = [c for c in proj if c[0] != link_column]
        for lp in plans:
            keep = tuple(k for k in lp.projections if k.name != link_column)
            self._low.append(replace(lp, query=name, projections=keep))
            self._query_of[name] = qp.name
        outputs = [(n, E.Field(name=n, type=t), t) for n, t in proj]
        links = tuple(lp.link for lp in plans)
        selection = Selection(name, links, tuple(low_cols), tuple(outputs),
                              link_column=link_column)
        self._makers.append((name, lambda: SelectStage(
            selection, self.spool, self._ck(name),
            [SpoolSink(self.spool, qp.name, alias, prefix)], **self._kw())))
        return proj

    def _build(self, qp):
        from highlevel.aggregate import AggregateStage
        from highlevel.join import JoinSpec, JoinStage
        from highlevel.merge import MergeSpec, MergeStage
        from highlevel.rowlayout import raw_schema
        from highlevel.rowplans import prepare_function
        from highlevel.select import Selection, SelectStage
        from highlevel.spec import from_high_level

        h, name = qp.high, qp.name
        outputs = [(o.name, o.expr, _gsql(o.type)) for o in h.outputs]
        if h.kind == "aggregate" and h.rows is not None:
            return self._rows_stage(qp)
        if h.kind in ("aggregate", "select") and h.sampling is not None:
            return self._sampling_stage(qp)
        if h.kind == "aggregate":
            if h.window is None:
                raise StageConfigError(f"query {name!r}: an aggregation without a window "
                                       f"is not supported by the Spark stage")
            # landmark windows keep one running state per group (highlevel.landmark)
            kind: type[AggregateStage] = AggregateStage
            if h.window.landmark is not None:
                from highlevel.landmark import LandmarkStage

                kind = LandmarkStage
            elif h.closing is not None:
                # CLOSING_WHEN: groups carried from window to window (highlevel.running)
                from highlevel.running import RunningStage

                kind = RunningStage
            if h.input_kind == "links":
                self._add_low(qp)
                spec = from_high_level(h, qp.low)
                if kind is AggregateStage:
                    self._over_links.add(name)
                return lambda: kind(spec, self.spool, self._ck(name), self.sinks[name],
                                    **self._kw())
            (up,) = h.inputs
            (rp,) = h.row_plans
            cols = output_columns_of(self.plan.query(up))
            side = self._join_side(up, h.window)
            markers: tuple[str, ...] = ()
            if h.window2 is not None:
                # both sides' times: the join's individual and joint punctuation
                from common.spool import JOINT_MARKERS
                from highlevel.joint import JointStage

                markers, kind = JOINT_MARKERS, JointStage
                if side is None:
                    raise StageConfigError(f"query {name!r}: its first temporal group item "
                                           f"must read one side's time of join {up!r}")
            self._feed(up, name, up, side=side, joint=h.window2 is not None)
            spec = from_high_level(replace(h, input_kind="links"))
            return lambda: kind(spec, self.spool, self._ck(name), self.sinks[name],
                                 input_schema=raw_schema(cols, markers=markers),
                                 prepare=prepare_function(rp, cols, spec), **self._kw())
        if h.kind == "select":
            if h.input_kind == "links":
                self._add_low(qp)
                cols = [(k.name, _gsql(k.type)) for k in qp.low[0].projections]
                selection = Selection(name, tuple(h.inputs), tuple(cols), tuple(outputs))
            else:
                (up,) = h.inputs
                cols = output_columns_of(self.plan.query(up))
                self._feed(up, name, up)
                selection = Selection(name, tuple(h.inputs), tuple(cols), tuple(outputs),
                                      predicate=h.predicate)
            return lambda: SelectStage(selection, self.spool, self._ck(name), self.sinks[name],
                                       **self._kw())
        if h.kind == "join":
            columns = {}
            for side in (h.join.left, h.join.right):
                prefix = f"{side.alias}__"
                if side.kind == "query":
                    columns[side.alias] = output_columns_of(self.plan.query(side.input))
                    self._feed(side.input, name, side.alias, prefix)
                else:
                    columns[side.alias] = self._side_stage(qp, side.alias, None, prefix)
            join = JoinSpec(name, h.join, columns, tuple(outputs))
            return lambda: JoinStage(join, self.spool, self._ck(name), self.sinks[name],
                                     **self._kw())
        if h.kind == "merge":
            aliases = [f.table for f in h.merge_fields]
            cols = [(o.name, _gsql(o.type)) for o in h.outputs]
            for alias, source in zip(aliases, qp.analysed.sources):
                if source.kind == "query":
                    self._feed(source.query, name, alias)
                else:
                    link_col = "link" if any(c == "link" for c, _ in cols) else None
                    self._side_stage(qp, alias, link_col, "")
            merge = MergeSpec(name, tuple(aliases), tuple(cols), tuple(h.merge_fields),
                              tuple(cols))
            return lambda: MergeStage(merge, self.spool, self._ck(name), self.sinks[name],
                                      **self._kw())
        raise StageConfigError(f"query {name!r}: plan kind {h.kind!r} is not supported")

    def _rows_stage(self, qp):
        """A tuple-count window: the low level selects, `CountWindowStage` numbers and
        aggregates."""
        from highlevel.countwindow import CountWindowStage
        from highlevel.spec import from_high_level

        h, name = qp.high, qp.name
        (rp,) = h.row_plans
        self._add_low(qp)
        cols = [(k.name, _gsql(k.type)) for k in qp.low[0].projections]
        spec = from_high_level(replace(h, window=rp.window))
        return lambda: CountWindowStage(spec, h.rows, cols, rp, self.spool, self._ck(name),
                                        self.sinks[name], **self._kw())

    def _sampling_stage(self, qp):
        """A sampling query: the low level selects, `SamplingStage` samples each window."""
        from highlevel.sampling import SamplingSpec, SamplingStage

        h, name = qp.high, qp.name
        cols = tuple((k.name, _gsql(k.type)) for k in h.sampling.columns)
        outputs = tuple((o.name, o.expr, _gsql(o.type)) for o in h.outputs)
        if h.input_kind == "queries":
            # over another query's rows: its rows come through this query's spool
            (up,) = h.inputs
            self._feed(up, name, up)
            spec = SamplingSpec(name, (up,), cols, outputs, h.sampling,
                                tuple(output_columns_of(self.plan.query(up))), h.predicate)
        else:
            self._add_low(qp)
            spec = SamplingSpec(name, tuple(h.inputs), cols, outputs, h.sampling)
        return lambda: SamplingStage(spec, self.spool, self._ck(name), self.sinks[name],
                                     **self._kw())

    def _add_low(self, qp) -> None:
        for lp in qp.low:
            subs = self.sublinks.get(lp.link)
            if subs and (qp.high.kind not in _FANOUT_KINDS
                         or getattr(qp.high, "rows", None) is not None
                         or getattr(qp.high, "sampling", None) is not None):
                raise StageConfigError(f"query {qp.name!r}: link {lp.link!r} is captured by "
                                       f"{len(subs)} fanout sockets, and a {qp.high.kind} "
                                       f"query needs its packets in one stream; run it "
                                       f"with --fanout 1")
            for sub in subs or (lp.link,):
                self._low.append(lp if sub == lp.link else replace(lp, link=sub))
            self._query_of[lp.query] = qp.name

    # --- the API the pipeline calls ----------------------------------------------------------
    def low_plans(self) -> list:
        """Every low-level plan the graph needs; write each one's partials with
        `SpoolWriter(spool, plan.query, plan.link)` (for a join/MERGE side `plan.query` is
        the side stage `<query>@<alias>`)."""
        return list(self._low)

    def query_of(self, low_plan) -> str:
        """The user query a low-level plan of `low_plans()` belongs to."""
        return self._query_of.get(low_plan.query, low_plan.query)

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
