"""Each query plan's Spark stage, by plan kind: the stage makers of a `highlevel.graph.StageGraph`.

`StageBuilder.maker(plan)` returns a function that makes the query's stage (called once the
Spark session is up) and records, as it goes, what the graph needs besides: the spool feeds
(an upstream query's `SpoolSink` into its reader's spool), the side stages of joins and MERGE
over links, and the low-level plans with the user query each belongs to.

Stages by plan kind:
- aggregate over links: `AggregateStage` (combine partials, Meld/Merge, close windows);
  landmark windows `LandmarkStage`, tuple-count windows `CountWindowStage`, CLOSING_WHEN
  `RunningStage`, sampling `SamplingStage`;
- aggregate over a query: `AggregateStage` whose micro-batches first run the row plan in Spark
  (`highlevel.rowplans`), then combine/close as for links (1-minute -> 5-minute rollups); a
  reader of a join grouping by both sides' times: `JointStage`;
- select: `SelectStage` (rows pass through, Meld punctuation);
- join: `JoinStage` (OA-Join); a side over links gets a `SelectStage` named `<query>@<alias>`
  that unions its links into the join's spool;
- merge: `MergeStage`; sources over links get a side stage as for joins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from highlevel.errors import StageConfigError
from highlevel.sinks import Sink, SpoolSink
from highlevel.stage import Stage


def _gsql(t: str) -> str:
    t = t.lower()
    return "ip" if t in ("ip", "ipv6") else t


def output_columns_of(qp) -> list[tuple[str, str]]:
    """(name, GSQL type) of a query's result rows, as readers see them."""
    return [(o.name, _gsql(o.type)) for o in qp.high.outputs]


#: plan kinds whose stages meld their links (a fanout's sub-links are links to them: a join's
#: sides are selections); the others (MERGE, tuple-count windows) need one ordered stream
_FANOUT_KINDS = ("aggregate", "select", "join")


class StageBuilder:
    """The makers of a graph's stages, and the feeds, side stages and low-level plans they
    need (module docstring)."""

    def __init__(self, plan, spool: Path, checkpoint: Path, sinks: dict[str, list[Sink]],
                 sublinks: dict[str, tuple[str, ...]], options: Callable[[], dict]):
        self.plan = plan
        self.spool, self.checkpoint = spool, checkpoint
        #: each query's sinks: the feeds of its readers are added here
        self.sinks = sinks
        self.sublinks = sublinks
        #: the stream options every stage is made with (read when it is made)
        self.options = options
        #: the low-level plans, and the user query of each (a side stage's is its join's)
        self.low: list = []
        self.query_of: dict[str, str] = {}
        #: plain aggregations over links (they need no Spark session to be made)
        self.over_links: set[str] = set()
        #: the side stages of joins and MERGE over links, as `maker` finds them
        self.side_makers: list[tuple[str, Callable[[], Stage]]] = []

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
            self.low.append(replace(lp, query=name, projections=keep))
            self.query_of[name] = qp.name
        outputs = [(n, E.Field(name=n, type=t), t) for n, t in proj]
        links = tuple(lp.link for lp in plans)
        selection = Selection(name, links, tuple(low_cols), tuple(outputs),
                              link_column=link_column)
        self.side_makers.append((name, lambda: SelectStage(
            selection, self.spool, self._ck(name),
            [SpoolSink(self.spool, qp.name, alias, prefix)], **self.options())))
        return proj

    def maker(self, qp) -> Callable[[], Stage]:
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
                    self.over_links.add(name)
                return lambda: kind(spec, self.spool, self._ck(name), self.sinks[name],
                                    **self.options())
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
                                 prepare=prepare_function(rp, cols, spec), **self.options())
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
                                       **self.options())
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
                                     **self.options())
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
                                      **self.options())
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
                                        self.sinks[name], **self.options())

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
                                     **self.options())

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
                self.low.append(lp if sub == lp.link else replace(lp, link=sub))
            self.query_of[lp.query] = qp.name
