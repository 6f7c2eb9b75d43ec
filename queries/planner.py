"""The planner: an analysed query file in, a `FilePlan` out (low-level plans per link, high-level plans).

`plan_file` runs the analysis (`queries.analysis`) and then, per query, the planning steps as
plain functions: share sub-aggregates and pair them with super-aggregates and finalisations
(`split_aggregates`), derive panes and windows (`window_plan`), move one-sided join conditions
to their side (`push_down_join_filters`), build the low-level plans per link and the high-level
plan (`plan_query`), and bind run-time parameters into every expression (`bind_params`).
`plan_text` parses and plans in one call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import cast

from capture.schema import BUILTIN, Schema
from common.datafiles import ANY_FILE, DataFiles
from common.errors import ConfigError, LinkError
from queries import expressions as E
from queries import types as T
from queries.analysed import AnalysedQuery, SourceInfo
from queries.analysis import analyse_file
from queries.definitions import FLOW_KEYS
from queries.grouping_sets import default_literal
from queries.inference import conjoin, conjuncts, type_of, unit_ns
from queries.plan import (
    ROW_WINDOW_INDEX,
    SUPERAGG_OF,
    FilePlan,
    FinalAggregate,
    FlowSettings,
    HighLevelPlan,
    JoinPlan,
    JoinSide,
    KeyColumn,
    LowLevelPlan,
    OutputColumn,
    QueryPlan,
    RowsWindow,
    SamplingPlan,
    SubAggregate,
    SuperAggregate,
    WindowPlan,
    empty_state,
    udaf_words,
)
from queries.printer import to_gsql
from queries.stateful import STATEFUL_FUNCTIONS
from queries.typekinds import SIGNED
from queries.udf import FunctionLibrary

DEFAULT_SLOTS = 1 << 16
#: the largest table an adaptive operator grows to unless DEFINE max_aggregate_slots says
#: otherwise (1M slots: about 100 MB for a few keys and sums, table and output buffer)
DEFAULT_MAX_SLOTS = 1 << 20
DEFAULT_SLOW_FLUSH = {"oop_slow": 160, "iop_slow": 1, "oop_lazy": 160}
DEFAULT_MAX_DISORDER = 2
JOIN_TYPES = {"INNER_JOIN": "inner", "LEFT_OUTER_JOIN": "left", "RIGHT_OUTER_JOIN": "right",
              "OUTER_JOIN": "outer", "FILTER_JOIN": "semi"}
_SUB_OF = {"COUNT": "count", "SUM": "sum", "MIN": "min", "MAX": "max", "AND_AGGR": "and",
           "OR_AGGR": "or", "XOR_AGGR": "xor", "FIRST": "first", "LAST": "last",
           "COUNT_DISTINCT": "distinct"}


def plan_text(text: str, links: list[str], params: dict[str, str] | None = None,
              overrides: dict[str, str] | None = None, path: str | None = None,
              schema: Schema = BUILTIN, functions: FunctionLibrary | None = None,
              files: DataFiles = ANY_FILE) -> FilePlan:
    """Parse and plan query text (errors show the offending source line)."""
    from queries.parser import parse

    return plan_file(parse(text, path=path), links, params, overrides, source=text,
                     schema=schema, functions=functions, files=files)


def plan_file(tree: E.QueryFile, links: list[str], params: dict[str, str] | None = None,
              overrides: dict[str, str] | None = None, source: str | None = None,
              schema: Schema = BUILTIN, functions: FunctionLibrary | None = None,
              files: DataFiles = ANY_FILE) -> FilePlan:
    """Plan every query of a parsed file for a run over `links` (QueryError / ConfigError),
    its protocols resolved against `schema` (`queries.schemafile.schema_for` adds those of
    schema files to the built-in packet protocols), its user-defined functions against
    `functions` (`queries.udf`), the files it names read as `files` allows
    (`common.datafiles`: any file for `run`, the --data-dir directories for the appliance)."""
    links = list(links)
    if not links:
        raise ConfigError("a run needs at least one link (e.g. --link main=trace.pcap)")
    twice = sorted({name for name in links if links.count(name) > 1})
    if twice:
        raise LinkError(f"link {', '.join(twice)} given twice")
    analysed = analyse_file(tree, links, params, overrides, source, schema, functions, files)
    readers: dict[str, list[str]] = {}
    for aq in analysed:
        for s in aq.sources:
            if s.kind == "query":
                assert s.query is not None   # a query source names its query
                readers.setdefault(s.query, []).append(aq.name)
    plans = []
    for aq in analysed:
        values = dict(aq.param_values)
        qp = plan_query(aq, links)
        qp = bind_params(qp, values, aq.params)
        plans.append(replace(qp, read_by=tuple(readers.get(aq.name, ())), params=values,
                             analysed=aq))
    # a query set of several files (`parser.parse_files`) is named by its files
    path = " + ".join(tree.sources) if len(tree.sources or ()) > 1 else tree.path
    return FilePlan(path, tuple(links), tuple(plans))


# --- sub-aggregates ---------------------------------------------------------------------------

@dataclass
class AggregateSplit:
    """The sub-aggregates (low level), super-aggregates and final aggregates of a query."""

    subaggs: list[SubAggregate] = field(default_factory=list)
    finals: list[FinalAggregate] = field(default_factory=list)
    final_of: dict[E.Aggregate, E.Field] = field(default_factory=dict)
    by_key: dict[tuple, SubAggregate] = field(default_factory=dict)


def _state_dtype(kind: str, arg_type: str | None) -> str:
    if kind == "count":
        return "uint64"
    if kind == "distinct":
        return "uint8"
    if arg_type is None:
        return "uint64"
    if kind == "sum":
        return {"float": "float64"}.get(arg_type, "int64" if arg_type in SIGNED else "uint64")
    if arg_type == "string" and kind in ("min", "max"):
        return "string"
    if arg_type == "ip" and kind in ("min", "max"):
        return "ip"         # two uint64 state words (lowlevel.aggregates.ip_words)
    return {"float": "float64", "int": "int64", "llong": "int64"}.get(arg_type, "uint64")


def _state_type(kind: str, arg_type: str | None) -> str:
    if kind == "count":
        return "ullong"
    if kind == "sum":
        return T.aggregate_type("SUM", arg_type) or "ullong"
    return "bool" if arg_type == "bool" else arg_type or "ullong"


def split_aggregates(aggs: list[E.Aggregate], taken: set[str]) -> AggregateSplit:
    """Shared sub-aggregates: one COUNT for count(*), count(x) and every AVG; one SUM(x) for
    SUM(x) and AVG(x); one state per distinct (kind, argument)."""
    split = AggregateSplit()

    def sub(kind: str, arg: E.Expr | None, udaf=None) -> SubAggregate:
        key = (kind, arg) if udaf is None else (kind, udaf.name, udaf.handles, arg)
        if key in split.by_key:
            return split.by_key[key]
        cols = [] if arg is None else [f.name for f in arg.find_all(E.Field)]
        prefix = kind if udaf is None else udaf.name
        base = "cnt" if kind == "count" else f"{prefix}_{'_'.join(dict.fromkeys(cols)) or 'expr'}"
        size = 1 if udaf is None else udaf.size
        name, k = base, 2
        while any(w in taken for w in udaf_words(name, size)):
            name, k = f"{base}_{k}", k + 1
        taken.update(udaf_words(name, size))
        if udaf is not None:
            s = SubAggregate(name, kind, arg, udaf.dtype, udaf)
        else:
            s = SubAggregate(name, kind, arg,
                             _state_dtype(kind, None if arg is None else type_of(arg)))
        split.by_key[key] = s
        split.subaggs.append(s)
        return s

    def state(s: SubAggregate) -> E.Field:
        at = None if s.arg is None else type_of(s.arg)
        return E.Field(name=s.name, type=_state_type(s.kind, at))

    for agg in aggs:
        if agg in split.final_of:
            continue
        name = agg.name
        expr: E.Expr
        if agg.udaf is not None:
            # a user-defined aggregate: its state words, combined by its `combine`, and its
            # `output` over them (docs/gsql.md "User-defined aggregates")
            s = sub("udaf", agg.arg, agg.udaf)
            words = [E.Field(name=w, type={"float64": "float", "int64": "llong"}.get(
                s.dtype, "ullong")) for w in udaf_words(s.name, agg.udaf.size)]
            expr = E.Func(name="udaf_output", args=words, external=agg.udaf)
        elif name == "AVG":
            total, count = sub("sum", agg.arg), sub("count", None)
            expr = E.Binary(op="/", left=E.Func(name="float", args=[state(total)]),
                            right=state(count))
        elif name == "COUNT":
            expr = state(sub("count", None))   # no nulls in packets: count(x) = count(*)
        elif name == "COUNT_DISTINCT":
            expr = E.Func(name="hll_estimate", args=[state(sub("distinct", agg.arg))])
        elif name == "END_REASON":
            expr = state(end_reason_state(split, taken))
        else:
            expr = state(sub(_SUB_OF[name], agg.arg))
        fa = FinalAggregate(f"_agg{len(split.finals)}", expr, type_of(agg), format_agg(agg))
        split.finals.append(fa)
        split.final_of[agg] = E.Field(name=fa.name, type=fa.type)
    return split


def end_reason_state(split: AggregateSplit, taken: set[str]) -> SubAggregate:
    """The state of END_REASON(): a `max` over the constant 0 that the flow kernel sets when
    the flow leaves (the high level's max is the identity on flow rows, one per flow id)."""
    key = ("end_reason", None)
    if key not in split.by_key:
        name, k = "end_reason", 2
        while name in taken:
            name, k = f"end_reason_{k}", k + 1
        taken.add(name)
        s = SubAggregate(name, "max", E.Literal(value=0, kind="int"), "uint64")
        split.by_key[key] = s
        split.subaggs.append(s)
    return split.by_key[key]


def flow_settings(aq: AnalysedQuery, split: AggregateSplit, taken: set[str]) -> FlowSettings | None:
    """`LowLevelPlan.flow` of a flow query (DEFINE idle_timeout / flow_end): the idle timeout,
    whether FIN/RST end a flow, the hidden flow-id key and the END_REASON state."""
    if not any(k in aq.defines for k in FLOW_KEYS):
        return None
    key, k = "_flow", 2
    while key in taken:
        key, k = f"_flow{k}", k + 1
    taken.add(key)
    reason = split.by_key.get(("end_reason", None))
    return FlowSettings(idle_ns=aq.defines.get("idle_timeout"),
                        fin_rst=aq.defines.get("flow_end", "fin_rst") == "fin_rst",
                        key=key, reason=reason.name if reason is not None else None)


def format_agg(agg: E.Aggregate) -> str:
    return to_gsql(agg)


def superaggs_of(subaggs: list[SubAggregate]) -> tuple[SuperAggregate, ...]:
    return tuple(SuperAggregate(s.name, SUPERAGG_OF[s.kind], s.kind, s.dtype, s.udaf)
                 for s in subaggs)


def replace_aggregates(expr: E.Expr | None, final_of: dict) -> E.Expr | None:
    if expr is None:
        return None
    # aggregates become Fields: an expression stays an expression
    return cast(E.Expr, expr.transform(lambda n: final_of.get(n, n) if isinstance(n, E.Aggregate) else n))


# --- windows ----------------------------------------------------------------------------------

def window_plan(aq: AnalysedQuery) -> WindowPlan | None:
    """Pane and window sizes from the temporal group item or the aggregates' window spec."""
    if aq.temporal is not None:
        f = aq.temporal.form
        assert f is not None   # a temporal group item has a time form
        reads_query = any(s.kind == "query" for s in aq.sources)
        pane_expr = None
        if reads_query:
            pane_expr = aq.temporal.expr
            if f.shift:
                pane_expr = E.Binary(op="-", left=pane_expr,
                                     right=_int_literal(f.shift))
            if f.scale != 1:
                pane_expr = E.Binary(op="/", left=pane_expr, right=_int_literal(f.scale))
        return WindowPlan(f.pane_ns, f.pane_ns, f.pane_ns, f.offset_ns, aq.temporal.name,
                          f.scale, f.shift, expr=pane_expr)
    if aq.window is not None and aq.window.kind == "rows":
        return None
    if aq.window is not None and aq.window.kind == "landmark":
        # tumbling panes of one slide (or of one unit of the window attribute for
        # [RANGE ALL]); the high level keeps one running state per group (highlevel.landmark)
        w = aq.window
        g = w.slide_ns or w.unit_ns
        per = g // w.unit_ns
        pane_expr = None
        if any(s.kind == "query" for s in aq.sources):
            pane_expr = w.field if per == 1 else E.Binary(op="/", left=w.field,
                                                          right=_int_literal(per))
        return WindowPlan(g, g, g, 0, aq.window_end, per, per, expr=pane_expr,
                          landmark="slide" if w.slide_ns else "end")
    if aq.window is not None:
        w = aq.window
        g = math.gcd(w.range_ns, w.slide_ns)
        per = w.slide_ns // w.unit_ns
        pane_expr = None
        if any(s.kind == "query" for s in aq.sources):
            # the rows carry the window attribute as a count of units: pane = x / (g / unit)
            g_units = g // w.unit_ns
            pane_expr = w.field if g_units == 1 else E.Binary(op="/", left=w.field,
                                                              right=_int_literal(g_units))
        return WindowPlan(g, w.range_ns, w.slide_ns, 0, aq.window_end, per, per, expr=pane_expr)
    return None


def _int_literal(v: int) -> E.Expr:
    if v < 0:
        return E.Unary(op="-", this=E.Literal(value=-v, kind="int"))
    return E.Literal(value=v, kind="int")


# --- query plans ------------------------------------------------------------------------------

def _flush_settings(defines: dict) -> dict:
    flush = defines.get("flush", "oop_lazy")
    if "aggregate_slots" in defines:
        # a fixed table: the operator's (and the IOP-vs-OOP experiments') override
        slots, max_slots = int(defines["aggregate_slots"]), 0
    else:
        # adaptive (`lowlevel.sizing`): the first size from the declared group count at the
        # load factor 1/2 the table keeps, re-chosen between windows up to the cap
        max_slots = int(defines.get("max_aggregate_slots", DEFAULT_MAX_SLOTS))
        expected = defines.get("expected_groups")
        slots = DEFAULT_SLOTS if expected is None else 2 * int(expected)
        slots = min(slots, max_slots)
        max_slots = 1 << max(0, (max_slots - 1).bit_length())
    return dict(slots=1 << max(0, (slots - 1).bit_length()), max_slots=max_slots, flush=flush,
                slow_flush=int(defines.get("slow_flush", DEFAULT_SLOW_FLUSH[flush])),
                max_disorder=int(defines.get("max_lfta_disorder", DEFAULT_MAX_DISORDER)))


def _links_of(source, links: list[str]) -> tuple[str, ...]:
    return tuple(links) if source.links == ("*",) else source.links


def plan_query(aq: AnalysedQuery, links: list[str]) -> QueryPlan:
    if aq.kind == "aggregate":
        low, high = _plan_aggregate(aq, links)
    elif aq.kind == "select":
        low, high = _plan_select(aq, links)
    elif aq.kind == "join":
        low, high = _plan_join(aq, links)
    else:
        low, high = _plan_merge(aq, links)
    return QueryPlan(aq.name, aq.kind, tuple(low), high, dict(aq.defines),
                     title=aq.defines.get("title"), comment=aq.defines.get("comment"))


def _outputs(aq: AnalysedQuery, final_of: dict | None = None) -> tuple[OutputColumn, ...]:
    return tuple(OutputColumn(i.name, i.type, replace_aggregates(i.expr, final_of or {}), i.form)
                 for i in aq.items)


def _aggregates(aq: AnalysedQuery) -> list[E.Aggregate]:
    """Every aggregate of the SELECT list and HAVING, in query order (repeats included)."""
    aggs = [a for item in aq.items for a in item.expr.find_all(E.Aggregate)]
    for clause in (aq.having, aq.closing):
        if clause is not None:
            aggs += list(clause.find_all(E.Aggregate))
    return aggs


def _plan_aggregate(aq: AnalysedQuery, links: list[str]):
    if aq.window is not None and aq.window.kind == "rows":
        return _plan_rows(aq, links)
    if aq.sampling is not None:
        return _plan_sampling(aq, links)
    source = aq.sources[0]
    keys = tuple(KeyColumn(g.name, g.expr, g.type) for g in aq.group if g is not aq.temporal)
    aggs = _aggregates(aq)
    taken = {g.name for g in aq.group} | {i.name for i in aq.items}
    split = split_aggregates(aggs, taken)
    window = window_plan(aq)
    settings = _flush_settings(aq.defines)
    flow = flow_settings(aq, split, taken)
    if flow is not None:
        # the hidden flow id: written by the kernel, keeps the flows of one bucket apart
        keys += (KeyColumn(flow.key, E.Literal(value=0, kind="int"), "ullong"),)
    keys, patterns = grouping_patterns(aq, keys, taken)
    union = None
    inputs: tuple[str, ...]
    if source.kind == "link":
        assert source.protocol is not None   # packet sources always name their protocol
        inputs = _links_of(source, links)
        union = ("merge" if settings["flush"] == "iop_slow" else "meld") if len(inputs) > 1 else None
        low = [LowLevelPlan(aq.name, link, source.protocol, aq.where, window, keys,
                            tuple(split.subaggs), late=aq.defines.get("late", "drop"),
                            flow=flow, record=source.record, patterns=patterns,
                            pattern_names=aq.patterns or (), **settings)
               for link in inputs]
        row_plans: tuple = ()
    else:
        assert source.query is not None   # a query source names its query
        inputs = (source.query,)
        low = []
        row_plans = (LowLevelPlan(aq.name, source.query, "", aq.where, window, keys,
                                  tuple(split.subaggs), source_kind="query", patterns=patterns,
                                  pattern_names=aq.patterns or (), **settings),)
    key_fields = tuple(KeyColumn(k.name, E.Field(name=k.name, type=k.type), k.type) for k in keys)
    outputs = _outputs(aq, split.final_of)
    late = aq.defines.get("late", "drop")
    correction = None
    if late == "correct":
        # docs/semantics.md "Late data": correction rows are marked by an extra output column,
        # 0 on regular rows (the stage sets it to 1 on correction rows; the reference sees no
        # late data)
        names = {o.name for o in outputs}
        correction = next(n for n in ("correction", "late_correction", "_correction")
                          if n not in names)
        outputs += (OutputColumn(correction, "int", E.Literal(value=0, kind="int")),)
    high = HighLevelPlan(
        aq.name, "aggregate", inputs, "links" if source.kind == "link" else "queries", union,
        outputs, window=window, keys=key_fields,
        superaggs=superaggs_of(split.subaggs), finals=tuple(split.finals),
        having=replace_aggregates(aq.having, split.final_of), row_plans=row_plans,
        late=late, correction=correction, window2=_second_window(aq))
    if aq.closing is not None:
        empty = tuple(c for sa in split.subaggs
                      for c in empty_state(sa, None if sa.arg is None else type_of(sa.arg)))
        high = replace(high, closing=replace_aggregates(aq.closing, split.final_of), empty=empty)
    return low, high


def grouping_patterns(aq: AnalysedQuery, keys: tuple[KeyColumn, ...], taken: set[str]):
    """CUBE / ROLLUP / GROUPING_SETS: `keys` plus the hidden pattern-id key (so groups of
    different patterns stay apart), and per pattern the expression of every key (an absent
    variable is its type's default, queries.grouping_sets)."""
    if aq.patterns is None:
        return keys, ()
    name, k = "_pattern", 2
    while name in taken:
        name, k = f"_pattern{k}", k + 1
    taken.add(name)
    keys += (KeyColumn(name, E.Literal(value=0, kind="int"), "uint"),)
    patterns = []
    for number, present in enumerate(aq.patterns):
        exprs = [k.expr if k.name in present else default_literal(k.type) for k in keys[:-1]]
        patterns.append(tuple(exprs) + (E.Literal(value=number, kind="int"),))
    return keys, tuple(patterns)


def _second_window(aq: AnalysedQuery) -> WindowPlan | None:
    """The second temporal group item of a reader of an inner join (the other side's time):
    a key whose value places its group in time too (the group's end on that time)."""
    if aq.temporal2 is None:
        return None
    f = aq.temporal2.form
    assert f is not None   # a temporal group item has a time form
    return WindowPlan(f.pane_ns, f.pane_ns, f.pane_ns, f.offset_ns, aq.temporal2.name,
                      f.scale, f.shift)


def _plan_rows(aq: AnalysedQuery, links: list[str]):
    """A tuple-count window: the low level selects and projects what the windows need (the
    order of packets across links is only known after their union, so no pre-aggregation);
    the high level numbers the rows and aggregates each window (highlevel.countwindow)."""
    source = aq.sources[0]
    w = aq.window
    assert w is not None and w.rows is not None and aq.window_end is not None   # a ROWS window
    assert source.protocol is not None   # ROWS windows read links
    aggs = _aggregates(aq)
    taken = {g.name for g in aq.group} | {i.name for i in aq.items}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}{k}"
        taken.add(name)
        return name

    partition = tuple(KeyColumn(fresh(f"__part{i}"), f, f.type) for i, f in enumerate(w.partition))
    keys = tuple(KeyColumn(g.name, g.expr, g.type) for g in aq.group)
    args: dict = {}
    for a in aggs:
        if not isinstance(a.arg, E.Star) and a.arg not in args:
            args[a.arg] = KeyColumn(fresh(f"__arg{len(args)}"), a.arg, type_of(a.arg))
    projections = partition + keys + tuple(args.values())
    split = split_aggregates(aggs, taken)
    settings = _flush_settings(aq.defines)
    late = aq.defines.get("late", "drop")
    inputs = _links_of(source, links)
    low = [LowLevelPlan(aq.name, link, source.protocol, aq.where, None, (), (),
                        projections=projections, late=late, record=source.record, **settings)
           for link in inputs]

    def field_of(k: KeyColumn) -> KeyColumn:
        return KeyColumn(k.name, E.Field(name=k.name, type=k.type), k.type)

    # the row plan runs in the high level over the numbered rows: the window index `__rw`
    # is the "pane", the states' arguments are the projected columns
    subaggs = tuple(SubAggregate(sa.name, sa.kind, None if sa.arg is None else
                                 E.Field(name=args[sa.arg].name, type=args[sa.arg].type),
                                 sa.dtype, sa.udaf) for sa in split.subaggs)
    index = WindowPlan(1, 1, 1, 0, aq.window_end, expr=E.Field(name=ROW_WINDOW_INDEX, type="llong"))
    key_fields = tuple(field_of(k) for k in partition + keys)
    row_plan = LowLevelPlan(aq.name, aq.name, "", None, index, key_fields, subaggs,
                            source_kind="query", **settings)
    rows = RowsWindow(w.rows, aq.window_end, tuple(field_of(k) for k in partition),
                      tuple(k.name for k in projections))
    high = HighLevelPlan(
        aq.name, "aggregate", inputs, "links", "meld" if len(inputs) > 1 else None,
        _outputs(aq, split.final_of), window=None, keys=key_fields,
        superaggs=superaggs_of(split.subaggs), finals=tuple(split.finals),
        having=replace_aggregates(aq.having, split.final_of), row_plans=(row_plan,),
        late=late, rows=rows)
    return low, high


_AGG_KIND = {"COUNT": "count", "SUM": "sum", "MIN": "min", "MAX": "max", "AND_AGGR": "and",
             "OR_AGGR": "or", "XOR_AGGR": "xor"}


def _plan_sampling(aq: AnalysedQuery, links: list[str]):
    """A sampling query (`queries.sampling`): the low level selects and projects what the
    sequential high level reads per row; every clause is rewritten over the projected
    columns, the group's aggregates `__a<k>`, the super-aggregates `__s<k>` and `__cd`
    (`queries.plan.SamplingPlan`)."""
    sp, source, temporal = aq.sampling, aq.sources[0], aq.temporal
    assert sp is not None
    columns: dict = {}

    def project(expr) -> E.Field:
        if expr not in columns:
            columns[expr] = KeyColumn(f"__p{len(columns)}", expr, type_of(expr))
        k = columns[expr]
        return E.Field(name=k.name, type=k.type)

    if source.kind == "query" and temporal is not None:
        # rows of a query carry no packet time to order them by: the temporal item's base
        # column leads the projected values that do (highlevel.sampling.canonical_order)
        base = next(iter(temporal.expr.find_all(E.Field)), None)
        if base is not None:
            project(base)

    keys = tuple(KeyColumn(g.name, project(g.expr), g.type) for g in aq.group
                 if g is not temporal)
    key_field = {k.name: k.expr for k in keys}
    aggregates: list[tuple[str, str | None]] = []
    supers: list[tuple[str, str | None]] = []

    def ref(table: list, prefix: str, kind: str, arg, t: str) -> E.Field:
        col = None if arg is None or isinstance(arg, E.Star) else project(arg).name
        if (kind, col) not in table:
            table.append((kind, col))
        return E.Field(name=f"{prefix}{table.index((kind, col))}", type=t)

    def rebuild(n, fn):
        return n.replace(**{k: fn(v) if isinstance(v, E.Node) else
                            [fn(x) if isinstance(x, E.Node) else x for x in v]
                            if isinstance(v, list) else v for k, v in n.args.items()})

    def row(n):
        """A row-level expression over the projected columns."""
        if isinstance(n, E.Func) and n.name in STATEFUL_FUNCTIONS:
            return n.replace(args=[a if isinstance(a, (E.Literal, E.Param)) else project(a)
                                   for a in n.args["args"]])
        if isinstance(n, E.Field):
            return project(n)
        return rebuild(n, row)

    def group(n):
        """A group-level expression (SELECT, HAVING, CLEANING_WHEN/BY)."""
        if isinstance(n, E.Aggregate):
            if n.name == "AVG":
                total = ref(aggregates, "__a", "sum", n.arg, type_of(E.Aggregate(
                    name="SUM", arg=n.arg)))
                count = ref(aggregates, "__a", "count", None, "ullong")
                return E.Binary(op="/", left=E.Func(name="float", args=[total]), right=count)
            return ref(aggregates, "__a", _AGG_KIND[n.name], n.arg, type_of(n))
        if isinstance(n, E.SuperAggregate):
            if n.name == "COUNT_DISTINCT":
                return E.Field(name="__cd", type="int")
            args = n.arguments
            return ref(supers, "__s", _AGG_KIND[n.name], args[0] if args else None, type_of(n))
        if isinstance(n, E.Field) and n.name in key_field:
            return key_field[n.name]
        if isinstance(n, E.Field):
            return n                 # the temporal item: the window column
        return rebuild(n, group)

    def maybe(expr, fn):
        return None if expr is None else fn(expr)

    # aggregates first: their order is the query's (explain shows them so)
    selection = aq.kind == "select"
    outputs = tuple(OutputColumn(i.name, i.type, row(i.expr) if selection else group(i.expr),
                                 i.form) for i in aq.items)
    plan = SamplingPlan(
        window=None if selection else window_plan(aq), columns=(), keys=keys,
        supergroup=sp.supergroup, aggregates=(), super_aggregates=(),
        where=tuple(row(c) for c in sp.where_stateful),
        cleaning_when=maybe(sp.cleaning_when, group), cleaning_by=maybe(sp.cleaning_by, group),
        having=maybe(aq.having, group), outputs=outputs)
    plan = replace(plan, columns=tuple(columns.values()), aggregates=tuple(aggregates),
                   super_aggregates=tuple(supers))
    if source.kind == "query":
        # over another query's rows: WHERE and the projections run in the high level
        assert source.query is not None
        high = HighLevelPlan(aq.name, aq.kind, (source.query,), "queries", None, outputs,
                             window=plan.window, keys=keys, having=plan.having,
                             predicate=aq.where, sampling=plan)
        return [], high
    assert source.protocol is not None
    settings = _flush_settings(aq.defines)
    inputs = _links_of(source, links)
    low = [LowLevelPlan(aq.name, link, source.protocol, aq.where, None, (), (),
                        projections=plan.columns, late=aq.defines.get("late", "drop"),
                        record=source.record, **settings)
           for link in inputs]
    high = HighLevelPlan(aq.name, aq.kind, inputs, "links",
                         "meld" if len(inputs) > 1 else None, outputs, window=plan.window,
                         keys=keys, having=plan.having, sampling=plan)
    return low, high


def _split_display(expr: E.Expr, projections: list[KeyColumn], taken: set[str]) -> E.Expr:
    """`expr` with every largest part free of high-level-only calls (`T.high_level_only`:
    display functions, user functions that are not LFTA_LEGAL) projected by the low level;
    those calls keep their place and run in the high level."""

    def inside(node) -> bool:
        return any(isinstance(n, E.Func) and T.high_level_only(n) for n in node.walk())

    def project(node):
        if isinstance(node, E.Literal):
            return node
        name, k = "_p0", 0
        while name in taken:
            k += 1
            name = f"_p{k}"
        taken.add(name)
        t = type_of(node)
        projections.append(KeyColumn(name, node, t))
        return E.Field(name=name, type=t)

    def split(value):
        if isinstance(value, list):
            return [split(v) for v in value]
        if not isinstance(value, E.Node):
            return value
        if not inside(value):
            return project(value)
        return value.replace(**{k: split(v) for k, v in value.args.items()
                                if isinstance(v, (E.Node, list))})

    return cast(E.Expr, split(expr))


def _plan_select(aq: AnalysedQuery, links: list[str]):
    if aq.sampling is not None:
        return _plan_sampling(aq, links)
    source = aq.sources[0]
    settings = _flush_settings(aq.defines)
    projections: list[KeyColumn] = []
    outputs = []
    taken = {i.name for i in aq.items}
    for item in aq.items:
        if any(isinstance(n, E.Func) and T.high_level_only(n) for n in item.expr.walk()):
            outputs.append(OutputColumn(item.name, item.type,
                                        _split_display(item.expr, projections, taken), item.form))
        else:
            projections.append(KeyColumn(item.name, item.expr, item.type))
            outputs.append(OutputColumn(item.name, item.type,
                                        E.Field(name=item.name, type=item.type, form=item.form),
                                        item.form))
    if source.kind == "link":
        assert source.protocol is not None   # packet sources always name their protocol
        inputs = _links_of(source, links)
        union = ("merge" if settings["flush"] == "iop_slow" else "meld") if len(inputs) > 1 else None
        low = [LowLevelPlan(aq.name, link, source.protocol, aq.where, None, (), (),
                            projections=tuple(projections), late=aq.defines.get("late", "drop"),
                            record=source.record, **settings) for link in inputs]
        high = HighLevelPlan(aq.name, "select", inputs, "links", union, tuple(outputs),
                             late=aq.defines.get("late", "drop"))
        return low, high
    # over an earlier query: everything runs in the high level
    assert source.query is not None   # a query source names its query
    high = HighLevelPlan(aq.name, "select", (source.query,), "queries", None, _outputs(aq),
                         predicate=aq.where, late=aq.defines.get("late", "drop"))
    return [], high


def _side_projection(aq: AnalysedQuery, alias: str) -> tuple[KeyColumn, ...]:
    exprs = [i.expr for i in aq.items] + [aq.where]
    exprs += [s.wa for s in aq.sources if s.wa is not None]
    seen: dict[str, KeyColumn] = {}
    for e in exprs:
        for f in (e.find_all(E.Field) if e is not None else ()):
            if f.table == alias and f.name not in seen:
                seen[f.name] = KeyColumn(f.name, f.replace(table=None), f.type)
    return tuple(seen.values())


_PRESERVED = {"inner": (), "left": (0,), "right": (1,), "outer": (0, 1), "semi": ()}


def push_down_join_filters(aq: AnalysedQuery) -> tuple[dict[str, E.Expr | None], E.Expr | None]:
    """Split the residual join condition: conjuncts on one side go to that side, unless an
    outer join preserves the side (its rows must appear even when they fail the condition)."""
    assert aq.join is not None   # a join query
    kind = JOIN_TYPES[aq.join.upper()]
    aliases = [s.alias for s in aq.sources]
    pushable = {a for i, a in enumerate(aliases) if i not in _PRESERVED[kind]}
    pushed: dict[str, list] = {a: [] for a in aliases}
    residual = []
    for c in conjuncts(aq.join_residual):
        tables = {f.table for f in c.find_all(E.Field)}
        if len(tables) == 1 and next(iter(tables)) in pushable:
            pushed[next(iter(tables))].append(c)
        else:
            residual.append(c)
    return {a: conjoin(p) for a, p in pushed.items()}, conjoin(residual)


def _unqualified(expr: E.Expr | None) -> E.Expr | None:
    if expr is None:
        return None
    return cast(E.Expr, expr.transform(lambda n: n.replace(table=None) if isinstance(n, E.Field) else n))


def _plan_join(aq: AnalysedQuery, links: list[str]):
    settings = _flush_settings(aq.defines)
    low = []
    sides = []
    filters, residual = push_down_join_filters(aq)
    for s in aq.sources:
        rng = None
        if s.window_ns is not None:
            assert s.wa is not None   # a band join source has its windowing attribute
            unit = unit_ns(s.wa.form)
            assert unit is not None   # checked by the analysis
            rng = s.window_ns // unit
        if s.kind == "link":
            assert s.protocol is not None   # packet sources always name their protocol
            side_links = _links_of(s, links)
            low += [LowLevelPlan(aq.name, link, s.protocol, _unqualified(filters[s.alias]), None,
                                 (), (), projections=_side_projection(aq, s.alias), side=s.alias,
                                 late=aq.defines.get("late", "drop"), record=s.record,
                                 **settings)
                    for link in side_links]
            sides.append(JoinSide(s.alias, "links", aq.name, side_links, rng, s.wa))
        else:
            sides.append(JoinSide(s.alias, "query", _query_of(s), (), rng, s.wa, filters[s.alias]))
    assert aq.join is not None   # a join query
    join = JoinPlan(JOIN_TYPES[aq.join.upper()], sides[0], sides[1], tuple(aq.join_keys),
                    aq.join_temporal, residual)
    inputs = tuple(_query_of(s) if s.kind == "query" else s.alias for s in aq.sources)
    high = HighLevelPlan(aq.name, "join", inputs,
                         "queries" if all(s.kind == "query" for s in aq.sources) else "links",
                         None, _outputs(aq), join=join, late=aq.defines.get("late", "drop"))
    return low, high


def _query_of(source: SourceInfo) -> str:
    """The query a query source reads (the analysis always names it)."""
    assert source.query is not None
    return source.query


def _plan_merge(aq: AnalysedQuery, links: list[str]):
    settings = _flush_settings(aq.defines)
    low = []
    inputs = []
    for s in aq.sources:
        if s.kind == "link":
            assert s.protocol is not None   # packet sources always name their protocol
            proj = tuple(KeyColumn(c.name, _packet_field(s, c), c.type) for c in s.plain_columns())
            for link in _links_of(s, links):
                low.append(LowLevelPlan(aq.name, link, s.protocol, None, None, (), (),
                                        projections=proj, side=s.alias,
                                        late=aq.defines.get("late", "drop"), record=s.record,
                                        **settings))
            inputs.append(s.alias)
        else:
            inputs.append(_query_of(s))
    kind = "links" if all(s.kind == "link" for s in aq.sources) else "queries"
    high = HighLevelPlan(aq.name, "merge", tuple(inputs), kind, "merge", _outputs(aq),
                         merge_fields=aq.merge_fields, late=aq.defines.get("late", "drop"))
    return low, high


def _packet_field(source: SourceInfo, col) -> E.Field:
    return E.Field(name=col.name, type=col.type, form=col.form,
                   columns=tuple(source.fields[col.name].columns))


# --- parameters -------------------------------------------------------------------------------

def param_literal(value, type_: str) -> E.Literal:
    if type_ == "ip":
        return E.Literal(value=value, kind="ipv6")
    if type_ == "ipv4":
        return E.Literal(value=value, kind="ip")
    if isinstance(value, bool):
        return E.Literal(value=value, kind="bool")
    if isinstance(value, int):
        return E.Literal(value=value, kind="int")
    if isinstance(value, float):
        return E.Literal(value=value, kind="float")
    return E.Literal(value=value, kind="string")


def bind_params(qp: QueryPlan, values: dict, types: dict[str, str]) -> QueryPlan:
    """Every `$name` with a run-time value replaced by a literal, in every plan expression."""
    if not values:
        return qp
    from dataclasses import fields, is_dataclass

    def sub(expr):
        return expr.transform(lambda n: param_literal(values[n.name], types.get(n.name, "llong"))
                              if isinstance(n, E.Param) and n.name in values else n)

    def walk(obj):
        if isinstance(obj, E.Node):
            return sub(obj)
        if is_dataclass(obj) and not isinstance(obj, type):
            changes = {f.name: walk(getattr(obj, f.name)) for f in fields(obj)
                       if f.name not in ("flow", "defines", "params")}
            return replace(obj, **changes)
        if isinstance(obj, tuple):
            return tuple(walk(o) for o in obj)
        if isinstance(obj, list):
            return [walk(o) for o in obj]
        return obj

    return walk(qp)
