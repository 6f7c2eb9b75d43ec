"""The GSQL syntax tree: small node classes declaring their arguments (in the manner of sqlglot).

Every node has `args` (a dict whose keys are the class's `arg_types`) and an optional source
position `pos` (line, column; 1-based) used in error messages. Equality and hashing are
structural and ignore positions, so a parse -> print -> parse round trip compares equal.
Arguments hold nodes, lists/tuples of nodes, dicts, or plain values (str, int, float, bool).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar, NamedTuple, Self, TypeVar


class Pos(NamedTuple):
    line: int
    col: int


N = TypeVar("N", bound="Node")   # find_all(Field) yields Fields


class Node:
    """Base of every tree node."""

    arg_types: ClassVar[dict[str, bool]] = {}   # name -> required
    __slots__ = ("args", "pos")

    def __init__(self, pos: Pos | None = None, **args: Any):
        unknown = set(args) - set(self.arg_types)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no argument(s) {sorted(unknown)}")
        missing = [k for k, req in self.arg_types.items() if req and args.get(k) is None]
        if missing:
            raise TypeError(f"{type(self).__name__} needs argument(s) {missing}")
        for k in self.arg_types:
            args.setdefault(k, None)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "pos", pos)

    def __getattr__(self, name: str) -> Any:
        args = object.__getattribute__(self, "args")
        if name in args:
            return args[name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("syntax tree nodes are immutable; use replace()")

    # --- structure ---------------------------------------------------------------------------
    def _key(self) -> tuple:
        return (type(self).__name__,) + tuple((k, _freeze(self.args[k])) for k in self.arg_types)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.args.items() if v is not None)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        # pickling (plans shipped to Spark workers or other processes): rebuild through
        # __init__, since the slots cannot be set directly on an immutable node
        return (_rebuild_node, (type(self), self.pos, self.args))

    def replace(self, **changes: Any) -> Self:
        """A copy with some arguments changed (position kept)."""
        return type(self)(pos=self.pos, **{**self.args, **changes})

    def children(self) -> Iterator[Node]:
        for value in self.args.values():
            yield from _nodes_in(value)

    def walk(self) -> Iterator[Node]:
        """This node and every descendant, pre-order."""
        yield self
        for child in self.children():
            yield from child.walk()

    def find_all(self, *types: type[N]) -> Iterator[N]:
        return (n for n in self.walk() if isinstance(n, types))

    def transform(self, fn: Callable[[Node], Node]) -> Node:
        """Rebuild bottom-up: children first, then `fn` on the rebuilt node."""
        new_args = {k: _transform_value(v, fn) for k, v in self.args.items()}
        return fn(type(self)(pos=self.pos, **new_args))


def _rebuild_node(cls: type, pos: Pos | None, args: dict) -> Node:
    return cls(pos=pos, **args)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _nodes_in(value: Any) -> Iterator[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _nodes_in(v)


def _transform_value(value: Any, fn: Callable[[Node], Node]) -> Any:
    if isinstance(value, Node):
        return value.transform(fn)
    if isinstance(value, list):
        return [_transform_value(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(_transform_value(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _transform_value(v, fn) for k, v in value.items()}
    return value


# --- expressions -------------------------------------------------------------------------------

class Expr(Node):
    """Base of value expressions."""


class Literal(Expr):
    """A constant. kind: int | float | string | bool | ip (IPv4 as int) | ipv6 (128-bit int).

    type: the GSQL type a GS-lite literal declares where its value alone would say another
    (`17ULL`, `LHEX'ff'`: "ullong"; `TIMEVAL '1.5'`: "llong" nanoseconds), else None; every
    evaluator reads `value` and `kind` only, so such a literal is an ordinary integer to them.
    """

    arg_types = {"value": True, "kind": True, "type": False}


class Column(Expr):
    """A field or column reference, optionally qualified: `srcIP`, `a.srcIP`."""

    arg_types = {"name": True, "table": False}


class Param(Expr):
    """A run-time parameter `$name`."""

    arg_types = {"name": True}


class DefineRef(Expr):
    """GS-lite's `#name`: the value of the query's DEFINE entry `name` (looked up when parsed).

    value: that entry's Literal; the analyser substitutes it (`definitions.substitute_refs`),
    so evaluators never meet this node.
    """

    arg_types = {"name": True, "value": True}


class IfaceParam(Expr):
    """GS-lite's interface property `@name` (or `t.@name`): parsed, refused by the analyser."""

    arg_types = {"name": True, "table": False}


class PredicateCall(Expr):
    """GS-lite's predicate function `name[args]` (WHERE / HAVING): parsed, refused by the
    analyser, which knows no predicate functions yet. name: lower case."""

    arg_types = {"name": True, "args": True}

    @property
    def arguments(self) -> list:
        return self.args["args"]


class SuperAggregate(Expr):
    """GS-lite's super-aggregate `name$(args)` (`count$(*)`, `sum$(len)`): the aggregate of a
    SUPERGROUP. Parsed, refused by the analyser. name: upper case for the built-in aggregates,
    else lower case; args: a list (Star for `*`)."""

    arg_types = {"name": True, "args": True}

    @property
    def arguments(self) -> list:
        return self.args["args"]


class Star(Expr):
    """`*` inside count(*)."""

    arg_types: ClassVar[dict[str, bool]] = {}


class Unary(Expr):
    """op: '-', '~' or 'NOT'."""

    arg_types = {"op": True, "this": True}


class Binary(Expr):
    """op: + - * / % & | ^ << >> = <> < > <= >= AND OR (`!=` is normalised to `<>`)."""

    arg_types = {"op": True, "left": True, "right": True}


#: the associative operators whose chains are built balanced (`chain`)
CHAIN_OPS = ("AND", "OR")


def chain(op: str, terms: list[Expr], positions: list[Pos | None] | None = None) -> Expr:
    """`t0 op t1 op ... op tn` as a balanced tree: depth log2(n), so every recursive walk of
    the tree (analysis, printing, evaluation, pickling) stays shallow however many terms a
    condition has (docs/gsql.md "Expressions"). The left half gets the extra term, so two and
    three terms give the left-deep tree the precedence rules give. `positions[k]`: where the
    operator between terms k and k+1 was written (the node joining them carries it)."""
    if not terms:
        raise ValueError("a chain needs at least one term")
    pos = positions if positions is not None else [None] * (len(terms) - 1)

    def build(lo: int, hi: int) -> Expr:
        if hi - lo == 1:
            return terms[lo]
        mid = lo + (hi - lo + 1) // 2
        return Binary(pos=pos[mid - 1], op=op, left=build(lo, mid), right=build(mid, hi))

    return build(0, len(terms))


def chain_terms(node: Node, op: str) -> list[Node]:
    """The terms of the maximal `op` chain rooted at `node`, left to right (iteratively)."""
    terms: list[Node] = []
    stack: list[Node] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Binary) and n.op == op:
            stack.append(n.right)
            stack.append(n.left)
        else:
            terms.append(n)
    return terms


def is_chain(node: Node, op: str) -> bool:
    """Whether the `op` chain rooted at `node` has exactly the shape `chain` gives its terms."""

    def size(n: Node) -> int:      # terms under n, or -1 when some node is not as `chain` builds
        if not (isinstance(n, Binary) and n.op == op):
            return 1
        left, right = size(n.left), size(n.right)
        if left < 0 or right < 0 or left != (left + right + 1) // 2:
            return -1
        return left + right

    return size(node) > 0


class In(Expr):
    """`this IN [items...]`."""

    arg_types = {"this": True, "items": True}


class Func(Expr):
    """A scalar function call; `name` is lower case (prefix, uint, llong, if_else, ip_str ...).
    `external`: a user-defined function's `queries.udf.ExternalFunction` (set by the analyser)."""

    arg_types = {"name": True, "args": True, "external": False}

    @property
    def arguments(self) -> list:
        """The call's arguments (`node.args` is the node's argument dict, as on every node)."""
        return self.args["args"]


class Duration(Node):
    """A time length as written: value and unit (seconds, minutes, hours, ms ...)."""

    arg_types = {"value": True, "unit": True}

    UNIT_NS: ClassVar[dict[str, int]] = {
        "ms": 1_000_000, "millisecond": 1_000_000, "milliseconds": 1_000_000,
        "s": 10**9, "sec": 10**9, "secs": 10**9, "second": 10**9, "seconds": 10**9,
        "min": 60 * 10**9, "mins": 60 * 10**9, "minute": 60 * 10**9, "minutes": 60 * 10**9,
        "h": 3600 * 10**9, "hour": 3600 * 10**9, "hours": 3600 * 10**9,
    }

    @property
    def ns(self) -> int:
        return int(round(self.args["value"] * self.UNIT_NS[self.args["unit"].lower()]))


class WindowSpec(Node):
    """`[RANGE r, SLIDE s, WA attr]`, `[RANGE ALL]`, `[ROWS n]`, `[PARTITION BY a ROWS n]`.

    range/slide: Duration (range None with all=True for a landmark window); rows: int;
    partition_by: list of Column; wa: the attribute name (default `time`).
    """

    arg_types = {"range": False, "slide": False, "wa": False, "rows": False,
                 "partition_by": False, "all": False}


class Aggregate(Expr):
    """An aggregate call. name upper case: COUNT SUM MIN MAX AVG AND_AGGR OR_AGGR XOR_AGGR FIRST
    LAST COUNT_DISTINCT; arg is Star for count(*); window is an optional WindowSpec. udaf: a
    user-defined aggregate's call (name lower case): True as `queries.udf.udaf_calls` marks it,
    its `queries.udf.ExternalAggregate` once resolved."""

    arg_types = {"name": True, "arg": True, "window": False, "udaf": False}


# --- statements --------------------------------------------------------------------------------

class GroupingPattern(Node):
    """GS-lite's extended group-by pattern in GROUP BY: kind CUBE | ROLLUP | GROUPING_SETS;
    sets: a list of lists of GroupItem (one list for CUBE and ROLLUP). Parsed, refused by the
    analyser."""

    arg_types = {"kind": True, "sets": True}


class ExtraClause(Node):
    """A GS-lite clause oopscope parses but does not run; pos is its keyword's.

    keyword: SUPERGROUP (items: Columns), CLEANING_WHEN, CLEANING_BY, CLOSING_WHEN (this: a
    condition) in a SELECT; SLACK (this: an expression) in a MERGE.
    """

    arg_types = {"keyword": True, "this": False, "items": False}


class FilterJoin(Node):
    """GS-lite's `FILTER_JOIN(column, n) FROM r, s` (the join type with its arguments)."""

    arg_types = {"column": True, "range": True}


class SelectItem(Node):
    arg_types = {"this": True, "alias": False}


class GroupItem(Node):
    arg_types = {"this": True, "alias": False}


class Source(Node):
    """A FROM item.

    - `link.PROTO`: links=[link], protocol=PROTO
    - `[l1, l2].PROTO` or `l1.PROTO UNION l2.PROTO`: links=[l1, l2], protocol=PROTO,
      union='list' | 'union'
    - `PROTO`: links=None (every link of the run), protocol=PROTO
    - a query name: query=name
    alias: the correlation name (`a` in `FROM up a`); window: per-source WindowSpec (band joins).
    """

    arg_types = {"links": False, "protocol": False, "query": False, "alias": False,
                 "window": False, "union": False}


class Select(Node):
    """SELECT ... [join type] FROM sources [WHERE] [GROUP BY] [HAVING].

    join: None, or INNER_JOIN | LEFT_OUTER_JOIN | RIGHT_OUTER_JOIN | OUTER_JOIN (or GS-lite's
    FILTER_JOIN, whose arguments are `filter_join`). group_by: GroupItems (and GS-lite's
    GroupingPatterns); extra: GS-lite's further clauses (ExtraClause), in GS-lite's order.
    """

    arg_types = {"items": True, "sources": True, "join": False, "where": False,
                 "group_by": False, "having": False, "extra": False, "filter_join": False}


class Merge(Node):
    """MERGE a.time : b.time FROM s1 a, s2 b (the order-preserving IOP union); slack: GS-lite's
    `SLACK expr` (an ExtraClause), parsed and refused by the analyser."""

    arg_types = {"fields": True, "sources": True, "slack": False}


class Query(Node):
    """One query of a file: DEFINE entries (key -> Literal), PARAM entries (name -> type name).

    param_defaults: name -> Literal for parameters declared with a default
    (`PARAM { min_bytes uint = 1000000; }`); a run-time `--param` overrides it.
    path: the file the query comes from when several files were parsed together
    (`parser.parse_files`), else None (the QueryFile's path).
    """

    arg_types = {"name": False, "defines": False, "params": False, "statement": True,
                 "param_defaults": False, "path": False}


class QueryFile(Node):
    """A parsed file of `;`-separated queries (or the queries of several files, `sources`
    then holding each file's text by path, for error messages)."""

    arg_types = {"queries": True, "path": False, "sources": False}


# --- resolved references (made by queries.analysis, never by the parser) ---------------------

class Field(Expr):
    """A resolved column reference.

    name: the column as the evaluated rows call it; type: its GSQL type (queries.types);
    table: the join side (alias) it belongs to, or None; columns: for packet fields, the
    physical columns of `capture.schema` it reads (a tuple; empty for `link`), None for a
    column of a result frame (a group key, an aggregate, an input query's output column);
    form: a `queries.types.TimeForm` when the column is increasing (temporal), else None.
    """

    arg_types = {"name": True, "type": True, "table": False, "columns": False, "form": False}
