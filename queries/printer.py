"""Syntax trees back to text: `to_gsql` prints GSQL that parses to the same tree; `dump_tree` an outline.

`to_gsql` parenthesises by precedence (only where the parse would differ), prints keywords in
upper case and hex numbers in decimal, and keeps every query's DEFINE/PARAM blocks, so
`parse(to_gsql(parse(text))) == parse(text)` (query names come back from `query_name` or the
same default naming). `dump_tree` is the readable form the golden tests compare.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from queries.expressions import (
    CHAIN_OPS,
    Aggregate,
    Binary,
    Column,
    DefineRef,
    Duration,
    ExtraClause,
    Field,
    FilterJoin,
    Func,
    GroupingPattern,
    GroupItem,
    IfaceParam,
    In,
    Literal,
    Merge,
    Node,
    Param,
    PredicateCall,
    Query,
    QueryFile,
    Select,
    SelectItem,
    Source,
    Star,
    SuperAggregate,
    Unary,
    WindowSpec,
    chain_terms,
    is_chain,
)
from queries.gslite import timeval_text
from queries.parse_expr import BINARY_PRECEDENCE, COMPARISON, NOT_PRECEDENCE
from queries.tokens import RESERVED, quote_string

_ATOM = 100     # precedence of things that never need parentheses
_UNARY = 50


def to_gsql(node: Node) -> str:
    """GSQL text for a file, a query, a statement, an expression or any other node."""
    printer = _PRINTERS.get(type(node))
    if printer is None:
        raise TypeError(f"cannot print a {type(node).__name__} as GSQL")
    return printer(node)


# --- files and queries -------------------------------------------------------------------------

def _file(node: QueryFile) -> str:
    return "\n\n".join(_query(q) + ";" for q in node.queries) + "\n"


def _query(node: Query) -> str:
    parts = []
    if node.defines:
        entries = "".join(f"    {key} {_define_value(v)};\n" for key, v in node.defines.items())
        parts.append("DEFINE {\n" + entries + "}")
    if node.params:
        defaults = node.param_defaults or {}
        entries = "".join(
            f"    {name} {type_}" + (f" = {_constant(defaults[name])}" if name in defaults
                                   else "") + ";\n"
            for name, type_ in node.params.items())
        parts.append("PARAM {\n" + entries + "}")
    parts.append(to_gsql(node.statement))
    return "\n".join(parts)


def _define_value(lit: Literal) -> str:
    if lit.kind == "string" and _is_bare_word(lit.value):
        return lit.value
    return _constant(lit)


def _constant(lit: Literal) -> str:
    """A literal where a sign folds into the constant (DEFINE values, PARAM defaults)."""
    if lit.kind in ("int", "float") and lit.value < 0:
        return "-" + _literal(lit.replace(value=-lit.value))
    return _literal(lit)


def _is_bare_word(text: str) -> bool:
    return (text != "" and text.isascii() and (text[0].isalpha() or text[0] == "_")
            and all(c.isalnum() or c == "_" for c in text) and text.upper() not in RESERVED)


def _select(node: Select) -> str:
    lines = ["SELECT " + ", ".join(_select_item(i) for i in node.items)]
    join = f"{node.join} " if node.join else ""
    if node.filter_join is not None:
        join = to_gsql(node.filter_join) + " "
    lines.append(join + "FROM " + ", ".join(_source(s) for s in node.sources))
    if node.where is not None:
        lines.append("WHERE " + _expr(node.where))
    if node.group_by:
        lines.append("GROUP BY " + ", ".join(to_gsql(g) for g in node.group_by))
    extra = list(node.extra or [])
    # GS-lite's clause order: SUPERGROUP before HAVING, the CLEANING / CLOSING ones after it
    lines.extend(to_gsql(c) for c in extra if c.keyword == "SUPERGROUP")
    if node.having is not None:
        lines.append("HAVING " + _expr(node.having))
    lines.extend(to_gsql(c) for c in extra if c.keyword != "SUPERGROUP")
    return "\n".join(lines)


def _merge(node: Merge) -> str:
    fields = " : ".join(_expr(f) for f in node.fields)
    slack = f" {to_gsql(node.slack)}" if node.slack is not None else ""
    return f"MERGE {fields}{slack}\nFROM " + ", ".join(_source(s) for s in node.sources)


def _extra_clause(node: ExtraClause) -> str:
    if node.items:
        return f"{node.keyword} " + ", ".join(_expr(c) for c in node.items)
    return f"{node.keyword} {_expr(node.this)}"


def _grouping_pattern(node: GroupingPattern) -> str:
    sets = [", ".join(_group_item(g) for g in items) for items in node.sets]
    if node.kind == "GROUPING_SETS":
        return "GROUPING_SETS(" + ", ".join(f"({s})" for s in sets) + ")"
    return f"{node.kind}({sets[0]})"


def _filter_join(node: FilterJoin) -> str:
    return f"FILTER_JOIN({_expr(node.column)}, {node.range})"


def _select_item(node: SelectItem) -> str:
    return _expr(node.this) + (f" AS {node.alias}" if node.alias else "")


def _group_item(node: GroupItem) -> str:
    return _expr(node.this) + (f" AS {node.alias}" if node.alias else "")


def _source(node: Source) -> str:
    if node.query is not None:
        text = node.query
    elif node.links is None:
        text = node.protocol
    elif node.union == "union":
        text = " UNION ".join(f"{link}.{node.protocol}" for link in node.links)
    elif len(node.links) == 1 and node.union != "list":
        text = f"{node.links[0]}.{node.protocol}"
    else:
        text = "[" + ", ".join(node.links) + f"].{node.protocol}"
    if node.window is not None:
        text += " " + _window(node.window)
    if node.alias:
        text += f" {node.alias}"
    return text


# --- expressions -------------------------------------------------------------------------------

def _precedence(node: Node) -> int:
    if isinstance(node, Binary):
        return BINARY_PRECEDENCE[node.op]
    if isinstance(node, In):
        return COMPARISON
    if isinstance(node, Unary):
        return NOT_PRECEDENCE if node.op == "NOT" else _UNARY
    if isinstance(node, Literal) and node.kind in ("int", "float") and node.value < 0:
        return _UNARY   # printed with a sign, like a unary minus
    return _ATOM


def _wrap(node: Node, parens: bool) -> str:
    text = _expr(node)
    return f"({text})" if parens else text


def _expr(node: Node) -> str:
    return to_gsql(node)


def _binary(node: Binary) -> str:
    p = BINARY_PRECEDENCE[node.op]
    if node.op in CHAIN_OPS:
        if is_chain(node, node.op):
            # the balanced tree the parser builds from a flat chain: printed flat, it parses
            # back to the same tree (no term of the chain is itself an `op` node)
            return f" {node.op} ".join(_wrap(t, _precedence(t) < p)
                                       for t in chain_terms(node, node.op))
        # any other shape: an operand that is itself an `op` chain goes in parentheses, so it
        # parses back as one term
        left = _wrap(node.left, _precedence(node.left) < p or _same_op(node.left, node.op))
        right = _wrap(node.right, _precedence(node.right) <= p)
        return f"{left} {node.op} {right}"
    left_p, right_p = _precedence(node.left), _precedence(node.right)
    # left-associative: a right operand of equal precedence needs parentheses; comparisons
    # do not chain, so an operand that is itself a comparison always does
    left = _wrap(node.left, left_p < p or (p == COMPARISON and left_p == p))
    right = _wrap(node.right, right_p <= p)
    return f"{left} {node.op} {right}"


def _same_op(node: Node, op: str) -> bool:
    return isinstance(node, Binary) and node.op == op


def _unary(node: Unary) -> str:
    if node.op == "NOT":
        return "NOT " + _wrap(node.this, _precedence(node.this) < _UNARY)
    # never print `--` (a comment) or `-(-x)` as `- -x`: only atoms go without parentheses
    return node.op + _wrap(node.this, _precedence(node.this) < _ATOM)


def _in(node: In) -> str:
    this = _wrap(node.this, _precedence(node.this) <= COMPARISON)
    return f"{this} IN [" + ", ".join(_expr(i) for i in node.items) + "]"


def _literal(node: Literal) -> str:
    kind, value = node.kind, node.value
    if kind == "bool":
        return "TRUE" if value else "FALSE"
    if kind == "string":
        return quote_string(value)
    if kind == "ip":
        return f"IP_VAL '{ipaddress.IPv4Address(value)}'"
    if kind == "ipv6":
        return f"IPV6_VAL '{ipaddress.IPv6Address(value).compressed}'"
    if kind == "float":
        return repr(float(value))
    if node.type == "ullong":
        return f"{int(value)}ULL"
    if node.type == "llong" and int(value) % 10**6 == 0:
        return timeval_text(int(value))
    return str(int(value))


def _column(node: Column) -> str:
    return f"{node.table}.{node.name}" if node.table else node.name


def _func(node: Func) -> str:
    return f"{node.name}(" + ", ".join(_expr(a) for a in node.arguments) + ")"


def _super_aggregate(node: SuperAggregate) -> str:
    return f"{node.name}$(" + ", ".join(_expr(a) for a in node.arguments) + ")"


def _predicate(node: PredicateCall) -> str:
    return f"{node.name}[" + ", ".join(_expr(a) for a in node.arguments) + "]"


def _iface_param(node: IfaceParam) -> str:
    return (f"{node.table}." if node.table else "") + f"@{node.name}"


def _aggregate(node: Aggregate) -> str:
    text = "END_REASON()" if node.name == "END_REASON" else f"{node.name}({_expr(node.arg)})"
    if node.window is not None:
        text += " " + _window(node.window)
    return text


def _window(node: WindowSpec) -> str:
    parts = []
    rows = f"ROWS {node.rows}" if node.rows is not None else None
    if node.partition_by:
        # `[PARTITION BY a, b ROWS n]`: the thesis form, without a comma before ROWS
        partition = "PARTITION BY " + ", ".join(_column(c) for c in node.partition_by)
        parts.append(partition if rows is None else f"{partition} {rows}")
    elif rows is not None:
        parts.append(rows)
    if node.all:
        parts.append("RANGE ALL")
    elif node.range is not None:
        parts.append("RANGE " + _duration(node.range))
    if node.slide is not None:
        parts.append("SLIDE " + _duration(node.slide))
    if node.wa is not None:
        parts.append(f"WA {node.wa}")
    return "[" + ", ".join(parts) + "]"


def _duration(node: Duration) -> str:
    value = node.value
    number = repr(float(value)) if isinstance(value, float) else str(value)
    return f"{number} {node.unit}"


_PRINTERS: dict[type, Callable[[Any], str]] = {
    QueryFile: _file, Query: _query, Select: _select, Merge: _merge,
    SelectItem: _select_item, GroupItem: _group_item, Source: _source,
    Binary: _binary, Unary: _unary, In: _in, Literal: _literal, Column: _column,
    Param: lambda n: f"${n.name}", Star: lambda n: "*", Func: _func, Aggregate: _aggregate,
    WindowSpec: _window, Duration: _duration,
    DefineRef: lambda n: f"#{n.name}", IfaceParam: _iface_param, PredicateCall: _predicate,
    SuperAggregate: _super_aggregate, GroupingPattern: _grouping_pattern,
    ExtraClause: _extra_clause, FilterJoin: _filter_join,
    Field: _column,   # a column the analyser resolved prints as the reference it came from
}


# --- outline -----------------------------------------------------------------------------------

def dump_tree(node: Node, positions: bool = True) -> str:
    """An indented outline of a tree: one node per line with its plain arguments and position."""
    lines: list[str] = []
    _dump(node, "", 0, lines, positions)
    return "\n".join(lines) + "\n"


def _dump(value: Any, label: str, depth: int, lines: list[str], positions: bool) -> None:
    pad = "  " * depth
    if isinstance(value, Node):
        plain = [f"{k}={v!r}" for k, v in value.args.items()
                 if v is not None and not _has_nodes(v)]
        where = f" @{value.pos.line}:{value.pos.col}" if positions and value.pos else ""
        lines.append(f"{pad}{label}{type(value).__name__}"
                     + (" " + " ".join(plain) if plain else "") + where)
        for k, v in value.args.items():
            if v is not None and _has_nodes(v):
                _dump(v, f"{k}: ", depth + 1, lines, positions)
    elif isinstance(value, (list, tuple)):
        lines.append(f"{pad}{label.rstrip()}")
        for i, v in enumerate(value):
            _dump(v, f"[{i}] ", depth + 1, lines, positions)
    elif isinstance(value, dict):
        lines.append(f"{pad}{label.rstrip()}")
        for k, v in value.items():
            _dump(v, f"{k}: ", depth + 1, lines, positions)
    else:
        lines.append(f"{pad}{label}{value!r}")


def _has_nodes(value: Any) -> bool:
    if isinstance(value, Node):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_nodes(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nodes(v) for v in value.values())
    return False
