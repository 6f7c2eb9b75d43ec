"""What the Spark stage of one query needs to know: keys, state columns, window, outputs, links.

`StageSpec` is the aggregate stages' own small contract (`highlevel.aggregate`), built by hand
in tests or from the planner's plan (`from_high_level` maps a `queries.plan.HighLevelPlan`,
`StageSpec.from_low_level` a `queries.plan.LowLevelPlan`). Output and HAVING expressions are
`queries.expressions` trees over key names, state names and the window column; the stage
compiles them to Spark Column expressions (never Python callables over rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import types as T

from common.spool import JOINT_MARKERS, LINK, PUNCT, SEQ, register_column
from highlevel.errors import StageConfigError
from queries.plan import (
    SUBAGG_KINDS,
    LowLevelPlan,
    SubAggregate,
    WindowPlan,
    ip_words,
    udaf_words,
)

KEY_TYPES = ("ip", "int64", "uint64", "float64", "string", "bool")
OUTPUT_TYPES = ("int64", "uint64", "float64", "string", "bool", "ip")
#: "string": MIN/MAX over strings, combined as Spark strings (byte-wise order)
#: "ip": MIN/MAX over an address, two long columns `name__hi`, `name__lo` (`ip_words`)
STATE_DTYPES = ("int64", "uint64", "float64", "string", "ip")


@dataclass(frozen=True)
class KeySpec:
    """A group key: `ip` is the two spool columns `name__hi`, `name__lo`; others one column.
    Integer types of any width arrive as int64 in the spool (see `common.spool`)."""

    name: str
    type: str

    def columns(self) -> tuple[str, ...]:
        return (f"{self.name}__hi", f"{self.name}__lo") if self.type == "ip" else (self.name,)


@dataclass(frozen=True)
class OutputColumn:
    """One SELECT column: name, expression (over keys, states, window column), output type."""

    name: str
    expr: object
    type: str


@dataclass(frozen=True)
class StageExtras:
    """What the stage knows of a query from its low-level plans rather than its high-level one."""

    #: no two partial rows share (window, keys): flow records keyed by their flow id (the
    #: stage combines them by the identity, and may close them on the driver)
    unique_rows: bool = False


@dataclass(frozen=True)
class StageSpec:
    """The high level of one aggregation query."""

    query: str
    links: tuple[str, ...]                  # union inputs: Meld waits for all of them
    window: WindowPlan                      # pane/range/slide/offset, temporal column
    keys: tuple[KeySpec, ...]               # group keys other than the window
    states: tuple[SubAggregate, ...]        # sub-aggregate state columns and combine kinds
    outputs: tuple[OutputColumn, ...]       # SELECT list, in order
    having: object | None = None            # predicate over the same names as outputs
    union: str = "meld"                     # meld | merge (same closing point, see union.py)
    distinct_registers: int = 64            # HLL registers of COUNT_DISTINCT states
    finals: tuple = ()                      # (name, expr over states): names outputs may use
    extras: StageExtras = field(default_factory=StageExtras, hash=False, compare=False)
    late: str = "drop"                      # drop | correct (highlevel.aggregate)
    correction: str | None = None           # late correct: the output marking correction rows
    window2: WindowPlan | None = None       # a join reader's second temporal key (joint.py)
    closing: object | None = None           # CLOSING_WHEN (highlevel.running), like having
    empty: tuple = ()                       # (state column, value) of a carried group's window

    def __post_init__(self):
        if not self.links:
            raise StageConfigError(f"query {self.query!r}: the high level needs the list of "
                                   f"links it unions (got none)")
        for k in self.keys:
            if k.type not in KEY_TYPES:
                raise StageConfigError(f"query {self.query!r}: key `{k.name}` has type "
                                       f"{k.type!r}; allowed: {', '.join(KEY_TYPES)}")
        for s in self.states:
            if s.kind not in SUBAGG_KINDS:
                raise StageConfigError(f"query {self.query!r}: state `{s.name}` has kind "
                                       f"{s.kind!r}; allowed: {', '.join(SUBAGG_KINDS)}")
            if s.kind != "distinct" and s.dtype not in STATE_DTYPES:
                raise StageConfigError(f"query {self.query!r}: state `{s.name}` has dtype "
                                       f"{s.dtype!r}; allowed: {', '.join(STATE_DTYPES)}")
            if s.kind == "udaf" and s.udaf is None:
                raise StageConfigError(f"query {self.query!r}: state `{s.name}` of kind udaf "
                                       f"carries no user-defined aggregate (its `udaf`)")
        for o in self.outputs:
            if o.type not in OUTPUT_TYPES:
                raise StageConfigError(f"query {self.query!r}: output `{o.name}` has type "
                                       f"{o.type!r}; allowed: {', '.join(OUTPUT_TYPES)}")
        if self.late not in ("drop", "correct"):
            raise StageConfigError(f"query {self.query!r}: late {self.late!r}; allowed: drop, "
                                   f"correct")
        if self.correction is not None and self.correction not in {o.name for o in self.outputs}:
            raise StageConfigError(f"query {self.query!r}: correction column "
                                   f"{self.correction!r} is not an output")
        if self.union not in ("meld", "merge"):
            raise StageConfigError(f"query {self.query!r}: union {self.union!r}; allowed: "
                                   f"meld, merge")

    # --- column layout -----------------------------------------------------------------------
    def key_columns(self) -> list[str]:
        return [c for k in self.keys for c in k.columns()]

    def state_columns(self) -> list[tuple[str, str]]:
        """(column, spark type name) of every state column, `__t` times included."""
        out = []
        for s in self.states:
            if s.kind == "distinct":
                out += [(register_column(s.name, i), "int")
                        for i in range(self.distinct_registers)]
                continue
            if s.dtype == "ip":         # MIN/MAX over an address: its two halves
                out += [(w, "long") for w in ip_words(s.name)]
                continue
            spark = {"float64": "double", "string": "string"}.get(s.dtype, "long")
            if s.kind == "udaf":        # its state words, one column each, of one dtype
                out += [(w, spark) for w in udaf_words(s.name, s.udaf.size)]
                continue
            out.append((s.name, spark))
            if s.kind in ("first", "last"):
                out.append((f"{s.name}__t", "long"))
        return out

    def partial_schema(self) -> T.StructType:
        """Spark schema of the combined state (= partial rows without the spool columns)."""
        fields = [T.StructField("window", T.LongType())]
        for k in self.keys:
            for c in k.columns():
                fields.append(T.StructField(c, _spark_key_type(k.type)))
        names = {"long": T.LongType(), "double": T.DoubleType(), "int": T.IntegerType(),
                 "string": T.StringType()}
        fields += [T.StructField(c, names[t]) for c, t in self.state_columns()]
        return T.StructType(fields)

    def spool_schema(self) -> T.StructType:
        meta = [T.StructField(LINK, T.StringType()), T.StructField(SEQ, T.LongType()),
                T.StructField(PUNCT, T.LongType())]
        if self.window2 is not None:
            meta += [T.StructField(c, T.LongType()) for c in JOINT_MARKERS]
        return T.StructType(meta + self.partial_schema().fields)

    def output_arrow_schema(self) -> pa.Schema:
        types = {"int64": pa.int64(), "uint64": pa.uint64(), "float64": pa.float64(),
                 "string": pa.string(), "bool": pa.bool_(), "ip": pa.string()}
        return pa.schema([pa.field(o.name, types[o.type]) for o in self.outputs],
                         metadata={b"oopscope.query": self.query.encode()})

    # --- from the planner --------------------------------------------------------------------
    @classmethod
    def from_low_level(cls, plan: LowLevelPlan, links: tuple[str, ...],
                       outputs: tuple[OutputColumn, ...], having=None,
                       union: str = "meld") -> StageSpec:
        """The stage of a query whose low level runs `plan` on each of `links`."""
        if plan.window is None:
            raise StageConfigError(f"query {plan.query!r} has no window: the Spark stage "
                                   f"combines windowed aggregates only")
        keys = tuple(KeySpec(k.name, _key_type(k.type)) for k in plan.keys)
        return cls(query=plan.query, links=tuple(links), window=plan.window, keys=keys,
                   states=tuple(plan.subaggs), outputs=tuple(outputs), having=having,
                   union=union, distinct_registers=plan.distinct_registers)


def from_high_level(plan, low_plans=()) -> StageSpec:
    """The stage of a `queries.plan.HighLevelPlan` of kind "aggregate" over links.

    HighLevelPlan -> StageSpec: inputs -> links; window -> window; keys (KeyColumn, GSQL type)
    -> KeySpec; superaggs (name, sub_kind, dtype) -> states (SubAggregate(name, sub_kind));
    udaf: the sub-aggregate keeps its `ExternalAggregate` (whose `combine` and `output` the
    stage runs);
    finals (name, expr over state Fields) -> finals; outputs (name, GSQL type, expr over keys,
    the window column and finals) -> outputs; having -> having; union None/"meld"/"merge";
    distinct_registers. `low_plans` (the query's `LowLevelPlan`s): a flow query's partial rows
    are whole flow records keyed by their flow id (`extras["flow"]`), unique per (window, keys),
    which the stage marks as `extras.unique_rows` and then combines by the identity.
    """
    if plan.kind != "aggregate" or plan.input_kind != "links" or plan.window is None:
        raise StageConfigError(f"query {plan.query!r}: the Spark stage runs windowed "
                               f"aggregates over links (got kind {plan.kind!r} over "
                               f"{plan.input_kind!r})")
    states = tuple(SubAggregate(s.name, s.sub_kind, None, s.dtype, s.udaf)
                   for s in plan.superaggs)
    keys = tuple(KeySpec(k.name, _key_type(k.type)) for k in plan.keys)
    outputs = tuple(OutputColumn(o.name, o.expr, output_type(o.type)) for o in plan.outputs)
    return StageSpec(query=plan.query, links=tuple(plan.inputs), window=plan.window, keys=keys,
                     states=states, outputs=outputs, having=plan.having,
                     union=plan.union or "meld", distinct_registers=plan.distinct_registers,
                     finals=tuple((f.name, f.expr) for f in plan.finals),
                     extras=StageExtras(unique_rows=unique_rows(plan, low_plans)),
                     late=plan.late, correction=plan.correction, window2=plan.window2,
                     closing=plan.closing, empty=plan.empty)


def unique_rows(plan, low_plans) -> bool:
    """True when no two partial rows of the query share (window, keys): every low plan is a
    flow table whose flow-id key (unique per flow across links: link tag << 40 | serial,
    `lowlevel.flowtable`) is one of the high level's keys."""
    keys = {k.name for k in plan.keys}
    flows = [lp.flow for lp in low_plans]
    return bool(flows) and all(f is not None and f.key in keys for f in flows)


def output_type(gsql: str) -> str:
    """The stage's output type of a GSQL type name."""
    t = gsql.lower()
    if t in OUTPUT_TYPES:
        return t
    if t in ("ip", "ipv6"):
        return "ip"
    if t in ("float", "double"):
        return "float64"
    if t in ("bool", "boolean"):
        return "bool"
    if t in ("string", "str", "text"):
        return "string"
    if t in ("llong", "int"):
        return "int64"
    return "uint64"   # uint, ullong, ipv4, mac: unsigned in the partial rows


def _spark_key_type(t: str):
    return {"ip": T.LongType(), "int64": T.LongType(), "uint64": T.LongType(),
            "float64": T.DoubleType(), "string": T.StringType(),
            "bool": T.BooleanType()}[t]


def _key_type(schema_type: str) -> str:
    """Key type of the stage for a GSQL/plan type name."""
    t = schema_type.lower()
    if t in ("ip", "ipv6", "ip6", "ipv4_mapped"):
        return "ip"
    if t in ("string", "str", "text"):
        return "string"
    if t in ("float", "float64", "double"):
        return "float64"
    if t in ("bool", "boolean"):
        return "bool"
    if t in ("uint64", "ullong", "uint", "ipv4", "mac"):
        return "uint64"
    return "int64"
