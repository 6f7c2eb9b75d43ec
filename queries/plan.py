"""Query plans as plain data: what the low level runs per link and what the high level runs.

The planner (`queries.planner`) builds these; `lowlevel/` and `highlevel/` consume them.
Nothing here is code to exec: expressions are `queries.expressions` trees, evaluated over
packet batches by `lowlevel.evaluate.evaluate`.

How the low level runs a `LowLevelPlan` over a packet batch (the reference of every detail is
`tests/queries/test_queries_split.py`, a naive executor checked against the reference evaluator):
rows of `protocol` (`capture.schema.protocol_mask`), then `vectorized.evaluate_predicate(predicate)`;
pane id `vectorized.pane_ids(window, batch)`; group keys `evaluate(key.expr)` (an `ip` key is a
(hi, lo) pair); each sub-aggregate's argument `evaluate(sub.arg)` cast to `sub.dtype`, FIRST/LAST
paired with `timestamp` (ns), COUNT_DISTINCT hashed into `distinct_registers` uint8 registers by
`lowlevel.hll`. Parameters are already bound (literals) in every expression.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from capture.schema import RecordFormat

FLUSH_POLICIES = ("oop_lazy", "oop_slow", "iop_slow")
SUBAGG_KINDS = ("count", "sum", "min", "max", "and", "or", "xor", "first", "last", "distinct",
                "udaf")

Expr = Any  # a queries.expressions node


#: the count-window index a ROWS query's row plan groups by (numbered by the high level)
ROW_WINDOW_INDEX = "__rw"


@dataclass(frozen=True)
class WindowPlan:
    """How packets are bucketed in time.

    The low level groups by pane id `(timestamp_ns + offset_ns) // pane_ns` (tumbling panes);
    a tumbling window is one pane. A sliding window [RANGE r, SLIDE s] has panes of
    g = gcd(r, s); window w (counted in slides) covers panes [(w+1)*s/g - r/g, (w+1)*s/g).
    The temporal output column (e.g. `tb` of `GROUP BY time/60 AS tb`) has value
    `window_id * scale + shift`.
    """

    pane_ns: int
    range_ns: int
    slide_ns: int
    offset_ns: int = 0
    column: str | None = None
    scale: int = 1
    shift: int = 0
    #: query-on-query only: the pane id as an expression over the input query's columns (the
    #: rows carry no packet timestamp); None for packet inputs (pane id from `timestamp`).
    #: pane_ns and offset_ns still place the pane in packet time (ns), so `pane_end_ns` and
    #: `window_end_ns` compare with the input query's punctuation as usual.
    expr: Expr | None = None
    #: landmark windows `[RANGE ALL ...]` (range_ns = slide_ns = pane_ns, so the low level
    #: sees tumbling panes): "slide" = window w holds every pane <= w (from the origin) and
    #: ends at (w+1)*slide; "end" = `[RANGE ALL]`, only the last window (the pane of the last
    #: row, pane = one unit of the window attribute) is output, at end of input. None: not one.
    landmark: str | None = None

    @property
    def sliding(self) -> bool:
        return self.range_ns != self.slide_ns

    @property
    def panes_per_window(self) -> int:
        return self.range_ns // self.pane_ns

    @property
    def panes_per_slide(self) -> int:
        return self.slide_ns // self.pane_ns

    def windows_of_pane(self, pane: int) -> range:
        """Window ids (counted in slides) whose extent holds pane `pane` (docs/semantics.md
        "Windows")."""
        first = pane // self.panes_per_slide
        return range(first, (pane + self.panes_per_window) // self.panes_per_slide)

    def pane_end_ns(self, pane: int) -> int:
        """First timestamp (ns) after pane `pane`: the pane may close when punctuation >= this."""
        return (pane + 1) * self.pane_ns - self.offset_ns

    def window_end_ns(self, window: int) -> int:
        return (window + 1) * self.slide_ns - self.offset_ns


@dataclass(frozen=True)
class KeyColumn:
    """A group key (or projected column): output name, expression, schema type.

    `type` decides the physical layout: `ip` is two uint64 columns (hi, lo); every other
    type is one column.
    """

    name: str
    expr: Expr
    type: str


@dataclass(frozen=True)
class SubAggregate:
    """A low-level partial aggregate; its state columns are named `name` (and `name`_t for
    first/last, the time of the value; for a user-defined aggregate `name` is its first state
    word, `name`__w1, `name`__w2 ... the others, `udaf_words`)."""

    name: str
    kind: str            # one of SUBAGG_KINDS
    arg: Expr | None     # None for count(*)
    #: numpy dtype name of the state: int64 | uint64 | float64; "string" (MIN/MAX over
    #: strings, a rank), "ip" (MIN/MAX over an address: two uint64 words, `ip_words`)
    dtype: str
    #: kind "udaf": the user-defined aggregate (`queries.udf.ExternalAggregate`)
    udaf: Any = None


@dataclass(frozen=True)
class FlowSettings:
    """How a flow query (DEFINE idle_timeout / flow_end) ends its flows in the low level."""

    idle_ns: int | None          # idle timeout (None: flows end only with their window)
    fin_rst: bool                # a TCP packet with FIN or RST ends its flow
    key: str                     # the hidden flow-id key column, the plan's last key
    reason: str | None           # the END_REASON state, if the query selects it


@dataclass(frozen=True)
class LowLevelPlan:
    """What one link's low-level operator runs for one query."""

    query: str
    link: str
    protocol: str                       # rows must belong to this protocol (schema mask)
    predicate: Expr | None              # WHERE, evaluated per packet
    window: WindowPlan | None           # None: a non-aggregating (selection) query
    keys: tuple[KeyColumn, ...]         # group keys other than the window
    subaggs: tuple[SubAggregate, ...]
    projections: tuple[KeyColumn, ...] = ()   # selection queries: columns passed through
    slots: int = 1 << 16                # hash-table size, a power of two (the first one)
    #: > 0: the table is re-sized between windows from the groups it meets, up to this many
    #: slots (`lowlevel.sizing`); 0: `slots` stays (DEFINE aggregate_slots, experiments)
    max_slots: int = 0
    flush: str = "oop_lazy"             # FLUSH_POLICIES
    slow_flush: int = 160               # i: one old group every i packets (oop_slow, iop_slow)
    max_disorder: int = 2               # m: windows an old group may linger (oop_*)
    distinct_registers: int = 64        # HLL registers per group for COUNT_DISTINCT
    #: a flow query's settings (DEFINE idle_timeout / flow_end); None: windowed aggregation
    flow: FlowSettings | None = field(default=None, hash=False, compare=False)
    #: joins and MERGE: the FROM alias whose rows this plan produces (None otherwise)
    side: str | None = None
    #: "link": run by the low level over packets of `link`; "query": run by the high level
    #: itself over the result rows of the query named in `link` (query-on-query: a plain
    #: group-by without hash table or flush; `protocol` is then "")
    source_kind: str = "link"
    #: "drop" late packets (counted) or "correct" them through a late partition
    #: (docs/semantics.md "Late data")
    late: str = "drop"
    #: a record protocol's format (the link carries records of a schema file's protocol,
    #: not packets); None for packet protocols
    record: RecordFormat | None = field(default=None, hash=False, compare=False)
    #: CUBE / ROLLUP / GROUPING_SETS: per grouping pattern, the expression of every key of
    #: `keys` (an absent variable is its type's default literal; the hidden pattern-id key,
    #: the last of `keys`, is the pattern's number). The operator folds each packet batch in
    #: once per pattern. Empty: `keys` as they are.
    patterns: tuple[tuple[Expr, ...], ...] = ()
    #: the names of the grouping variables present in each pattern (for explain)
    pattern_names: tuple[tuple[str, ...], ...] = ()


# --- the high level ---------------------------------------------------------------------------

@dataclass(frozen=True)
class RowsWindow:
    """A tuple-count window `[PARTITION BY a, b ROWS n]` (CQL, tumbling form): the query's
    packets in order of (timestamp, link position in `HighLevelPlan.inputs`, then the values
    of `order` columns) are cut, per partition, into windows of n consecutive packets; window
    j (`column` = j) is complete once the punctuation passes its n-th packet; the last, partial
    window closes at end of input. The low level only selects and projects (`partition`, the
    group keys and the aggregate arguments, named as here); the high level numbers the rows."""

    rows: int
    column: str                               # the output column holding the window index
    partition: tuple[KeyColumn, ...]          # projected PARTITION BY columns (hidden keys)
    order: tuple[str, ...]                    # projected columns breaking timestamp ties

@dataclass(frozen=True)
class SamplingPlan:
    """A sampling query's high level (`queries.sampling`, `highlevel.sampling`).

    The low level selects (WHERE without stateful calls) and projects `columns` (named
    `__p0`, `__p1`...: the group items other than the temporal one, the aggregates' and
    super-aggregates' arguments, the columns WHERE's stateful conjuncts read). Expressions here
    read those names, plus `__a<k>` (aggregate k of the group), `__s<k>` (super-aggregate k of
    the supergroup), `__cd` (its live groups: count_distinct$), the window column and stateful
    calls (`queries.stateful`). Rows of a window are processed in order of (timestamp, link
    position, the projected columns' values). A selection whose WHERE calls stateful
    functions has no window (one state for the whole stream), no keys and no aggregates."""

    window: WindowPlan | None
    columns: tuple[KeyColumn, ...]            # projected per row
    keys: tuple[KeyColumn, ...]               # group items but the temporal: name -> `__pN`
    supergroup: tuple[str, ...]               # key names making the supergroup
    aggregates: tuple[tuple[str, str | None], ...]        # (kind, argument column) per `__a<k>`
    super_aggregates: tuple[tuple[str, str | None], ...]  # (kind, argument column) per `__s<k>`
    where: tuple[Expr, ...]                   # WHERE's stateful conjuncts (over the row)
    cleaning_when: Expr | None                # over the row's keys, super-aggregates
    cleaning_by: Expr | None                  # over a group's keys, aggregates, ...
    having: Expr | None
    outputs: tuple[OutputColumn, ...]


SUPERAGG_OF = {"count": "sum", "sum": "sum", "min": "min", "max": "max", "and": "and",
               "or": "or", "xor": "xor", "first": "first", "last": "last", "distinct": "max",
               "udaf": "udaf"}


#: the largest and smallest value of each GSQL integer type (GS-lite's reinitialised MIN / MAX)
TYPE_RANGE = {"uint": (0, 2**32 - 1), "ushort": (0, 2**16 - 1), "ullong": (0, 2**64 - 1),
              "int": (-2**31, 2**31 - 1), "llong": (-2**63, 2**63 - 1), "bool": (0, 1),
              "ipv4": (0, 2**32 - 1)}
FLOAT_MAX = 1.7976931348623157e308


def empty_state(sub: SubAggregate, arg_type: str | None) -> tuple[tuple[str, Any], ...]:
    """The state columns of `sub` for a group that got no row in a window (a group carried
    over by CLOSING_WHEN), as GS-lite reinitialises them: COUNT and SUM 0, MIN the type's
    largest value, MAX its smallest (for float -DBL_MAX, where GS-lite's DBL_MIN is a small
    positive number), AND/OR/XOR 0, FIRST/LAST 0, COUNT_DISTINCT no value seen, a UDAF its
    `init` state. Unsigned values as their uint64 bit pattern in a uint64 state."""
    if sub.kind == "udaf":
        return tuple(zip(udaf_words(sub.name, sub.udaf.size), sub.udaf.identity))
    if sub.kind == "distinct":
        return ((sub.name, None),)          # every register 0
    if sub.dtype == "ip":                   # MIN/MAX over an address: the largest / 0
        word = (1 << 64) - 1 if sub.kind == "min" else 0
        return tuple((w, word) for w in ip_words(sub.name))
    value: Any = 0
    if sub.kind in ("min", "max"):
        if sub.dtype == "float64":
            value = FLOAT_MAX if sub.kind == "min" else -FLOAT_MAX
        else:
            lo, hi = TYPE_RANGE.get(arg_type or "llong", TYPE_RANGE["llong"])
            value = hi if sub.kind == "min" else lo
    elif sub.dtype == "float64":
        value = 0.0
    out: tuple[tuple[str, Any], ...] = ((sub.name, value),)
    if sub.kind in ("first", "last"):
        out += ((f"{sub.name}__t", 0),)
    return out


def ip_words(name: str) -> tuple[str, str]:
    """The state columns (hi, lo) of MIN/MAX `name` over an `ip` value (dtype "ip"): the
    address's uint64 halves, ordered hi first, then lo, unsigned."""
    return f"{name}__hi", f"{name}__lo"


def udaf_words(name: str, size: int) -> tuple[str, ...]:
    """The state columns of a user-defined aggregate's state of `size` words."""
    return (name,) + tuple(f"{name}__w{j}" for j in range(1, size))


@dataclass(frozen=True)
class SuperAggregate:
    """How the high level combines the partial states of one sub-aggregate (docs/semantics.md
    "Sub-aggregates and super-aggregates").

    kind: sum | min | max | and | or | xor over the state column `name`; `first` / `last`:
    keep the value whose time (`name`_t) is smallest / largest, ties broken by the smaller /
    larger value; for a `distinct` sub-aggregate kind is `max`, taken register by register
    over the `distinct_registers` uint8 registers of each row.
    """

    name: str            # the state column (= SubAggregate.name)
    kind: str
    sub_kind: str        # the SubAggregate kind it combines
    dtype: str
    #: kind "udaf": the user-defined aggregate whose `combine` merges the states
    udaf: Any = None


@dataclass(frozen=True)
class FinalAggregate:
    """An aggregate of the query, computed from the combined states: `expr` is over Fields
    naming state columns, e.g. AVG(len) = float(sum_len) / cnt, COUNT_DISTINCT(x) =
    hll_estimate(distinct_x). `text` is the aggregate as the query wrote it."""

    name: str            # internal column name (_agg0, _agg1 ...)
    expr: Expr
    type: str
    text: str


@dataclass(frozen=True)
class OutputColumn:
    """A result column in SELECT order: name, GSQL type and the expression computing it over
    the rows of the last high-level step (group keys, the window column, final aggregates,
    an input query's columns or a join side's `alias.column`). `temporal` is the column's
    `queries.types.TimeForm` when it increases with time (a reader may window on it)."""

    name: str
    type: str
    expr: Expr
    temporal: Any = None


@dataclass(frozen=True)
class JoinSide:
    """One input of a join: rows of an earlier query (kind "query", input = its name) or of
    the low-level selection plans with `side == alias` (kind "links").

    For a band join `range` is this side's RANGE in the unit of its window attribute `wa`."""

    alias: str
    kind: str
    input: str
    links: tuple[str, ...] = ()
    range: int | None = None
    wa: Expr | None = None
    #: a filter on this side's rows before the join (pushed down from WHERE; Fields qualified
    #: by the alias). For "links" sides it is in the low plans' predicate instead.
    predicate: Expr | None = None


@dataclass(frozen=True)
class JoinPlan:
    """A two-way window join run with OA-Join (docs/semantics.md "Joins").

    type: inner | left | right | outer | semi. Rows l (left) and r (right) join when every pair in
    `keys` is equal (l-side expression, r-side expression), the window matches and `residual`
    holds. Conditions on one side only are pushed to that side (`JoinSide.predicate` or the
    low plans' predicate) unless the side is preserved by an outer join. Window: tumbling when `temporal` is a pair of increasing expressions that must be
    equal; band when both sides carry `range`: l joins r iff
    `l.wa - right.range <= r.wa < l.wa + left.range`. Outer joins keep unmatched rows with
    the other side's columns null (a query reading the join sees a null as 0). A semi join
    (GS-lite's FILTER_JOIN, `queries.filter_join`) outputs each left row that has a match
    once, from the left side's columns only.
    """

    type: str
    left: JoinSide
    right: JoinSide
    keys: tuple[tuple[Expr, Expr], ...]
    temporal: tuple[Expr, Expr] | None
    residual: Expr | None


@dataclass(frozen=True)
class HighLevelPlan:
    """What the high level runs for one query.

    kind:
      - "aggregate": read the partial rows of `inputs` (links, through the low plans; or the
        rows of input queries through `row_plans`), union them (`union`), combine partial
        states of the same (window pane, keys) with `superaggs`, assemble panes into windows
        (`window`: tumbling = one pane; sliding = `window.range_ns // window.pane_ns` panes
        per window, a new window every `window.slide_ns // window.pane_ns` panes), close a
        window once the combined punctuation reaches its end, compute `finals`, keep rows
        where `having` holds, then compute `outputs`.
      - "select": pass rows through (`predicate` first for query inputs), compute `outputs`.
      - "join": `join` (OA-Join) then `outputs` over `alias.column` Fields.
      - "merge": the order-preserving union of the inputs on `merge_fields`.
    inputs: link names when input_kind == "links", query names when "queries"; for a join or
    MERGE over packets, the FROM aliases (the `side` of their low plans).
    union: "meld" (OOP, default) or "merge" (IOP: under `flush iop_slow` or a MERGE); None for
    one input. keys: the group keys of the partial rows (KeyColumn with a Field expr), the
    window column excluded (it is `window.column`, value pane/window id * scale + shift).
    late: "drop" (count) or "correct" (docs/semantics.md "Late data"). correction: under late
    "correct", the name of the extra int output column (the last of `outputs`) that is 0 on
    regular rows and 1 on correction rows (the delta of late data for an already-closed window);
    else None.
    """

    query: str
    kind: str
    inputs: tuple[str, ...]
    input_kind: str
    union: str | None
    outputs: tuple[OutputColumn, ...]
    window: WindowPlan | None = None
    keys: tuple[KeyColumn, ...] = ()
    superaggs: tuple[SuperAggregate, ...] = ()
    finals: tuple[FinalAggregate, ...] = ()
    having: Expr | None = None
    predicate: Expr | None = None
    row_plans: tuple[LowLevelPlan, ...] = ()
    join: JoinPlan | None = None
    merge_fields: tuple[Expr, ...] = ()
    late: str = "drop"
    distinct_registers: int = 64
    correction: str | None = None
    #: a tuple-count window (then `window` is None, the low plans are selections and
    #: `row_plans` holds the plan turning the numbered rows into partial rows)
    rows: RowsWindow | None = None
    #: GS-lite's CLOSING_WHEN (running aggregation; docs/semantics.md): groups stay open across
    #: windows until `closing` (over keys, the window column and finals, like HAVING) holds;
    #: `empty` is each state column's value in a window where an open group got no row
    closing: Expr | None = None
    empty: tuple[tuple[str, Any], ...] = ()
    sampling: SamplingPlan | None = None
    #: a reader of an inner join grouping by both sides' times: the second temporal group
    #: item (a key of `keys`, `column` its name), whose groups also close on the join's
    #: individual punctuation on that time and its joint punctuation (highlevel.joint)
    window2: WindowPlan | None = None


@dataclass(frozen=True)
class QueryPlan:
    """One query: its low-level plans (one per link and, for joins, per side), its high-level
    plan, its DEFINEs (after `--set` overrides), and which later queries read it."""

    name: str
    kind: str
    low: tuple[LowLevelPlan, ...]
    high: HighLevelPlan
    defines: dict = field(default_factory=dict, hash=False, compare=False)
    params: dict = field(default_factory=dict, hash=False, compare=False)
    title: str | None = None
    comment: str | None = None
    read_by: tuple[str, ...] = ()
    #: the analyser's view of the query (queries.analysed.AnalysedQuery), for the reference
    #: evaluator and error messages; not part of the plan proper
    analysed: Any = field(default=None, hash=False, compare=False, repr=False)

    @property
    def output_names(self) -> list[str]:
        return [c.name for c in self.high.outputs]


@dataclass(frozen=True)
class FilePlan:
    """Every query of a file (or of several, `parser.parse_files`), in dependency order: a
    query after every query it reads, in file order otherwise (`queries.query_graph`)."""

    path: str | None
    links: tuple[str, ...]
    queries: tuple[QueryPlan, ...]

    def query(self, name: str) -> QueryPlan:
        for q in self.queries:
            if q.name == name:
                return q
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [q.name for q in self.queries]
