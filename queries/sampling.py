"""Sampling queries (GS-lite's stream sampling operator): which queries are, and their checks.

A sampling query (Tigon SQL manual 6.2.13; docs/gsql.md "Sampling queries") is an aggregation
with `SUPERGROUP`, `CLEANING_WHEN` / `CLEANING_BY`, super-aggregates `agg$(...)` or stateful
functions. Its groups of one window are kept per supergroup (the SUPERGROUP items' values),
each with a sampling state (`queries.stateful`); a row is admitted by WHERE's stateful
conjuncts, updates its supergroup's super-aggregates and its group; CLEANING_WHEN, evaluated
after every admitted row, starts a cleaning pass that keeps the supergroup's groups for which
CLEANING_BY holds; at the window's end HAVING makes the final pass. It is sequential: every
decision depends on the state the rows before it left, so it runs in the high level over the
rows of a window in one order (`highlevel.sampling`); the low level only selects (WHERE's
other conjuncts) and projects.

`analyse` checks the clauses and fills `AnalysedQuery.sampling`; what each clause may read is
the manual's: WHERE's stateful arguments read the row; CLEANING_WHEN group items,
super-aggregates and stateful functions (not the group's aggregates); CLEANING_BY, HAVING and
SELECT also the group's aggregates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from queries import expressions as E
from queries.analysed import AnalysedQuery, QueryAnalyser, SamplingInfo
from queries.inference import conjoin, conjuncts
from queries.stateful import ACCESSORS, GROUP_AGGREGATES, STATEFUL_FUNCTIONS

if TYPE_CHECKING:
    from queries.scope import GroupedScope

#: value types the sequential kernel computes with (no addresses, no strings in conditions)
KERNEL_TYPES = frozenset({"uint", "ushort", "int", "ullong", "llong", "float", "bool", "ipv4"})


def stateful_calls(node: E.Node) -> list[E.Func]:
    return [f for f in node.find_all(E.Func) if f.name.lower() in STATEFUL_FUNCTIONS]


def sampling_node(stmt: E.Select) -> E.Node | None:
    """The first node that makes a SELECT a sampling query (a clause, a super-aggregate, a
    stateful call), or None."""
    for c in stmt.extra or []:
        if c.keyword in ("SUPERGROUP", "CLEANING_WHEN", "CLEANING_BY"):
            return c
    parts: list[E.Node] = [*stmt.items, *(c.this for c in stmt.extra or [] if c.this)]
    parts += [p for p in (stmt.where, stmt.having) if p is not None]
    return next((n for p in parts for n in p.walk()
                 if isinstance(n, E.SuperAggregate)
                 or (isinstance(n, E.Func) and n.name.lower() in STATEFUL_FUNCTIONS)), None)


def selection_sampling(stmt: E.Select, marker: E.Node) -> bool:
    """Whether a SELECT without GROUP BY samples rows: stateful calls in WHERE only (GS-lite's
    static subset-sum `WHERE nssample(len, 100) = TRUE`)."""
    return (isinstance(marker, E.Func) and stmt.where is not None
            and any(marker is n for n in stmt.where.walk())
            and not any(c.keyword in ("SUPERGROUP", "CLEANING_WHEN", "CLEANING_BY")
                        for c in stmt.extra or [])
            and not any(True for it in stmt.items for n in it.walk()
                        if isinstance(n, E.SuperAggregate) or (
                            isinstance(n, E.Func) and n.name.lower() in STATEFUL_FUNCTIONS)))


def analyse_selection(a: QueryAnalyser, aq: AnalysedQuery) -> None:
    """A selection whose WHERE calls stateful functions: one sampling state for the whole
    stream, the rows in order; WHERE keeps its other conjuncts."""
    stateful_where: list[E.Expr] = []
    plain: list[E.Expr] = []
    for c in conjuncts(aq.where):
        (stateful_where if stateful_calls(c) else plain).append(c)
    aq.where = conjoin(plain)
    for c in stateful_where:
        _kernel_values(a, c, "WHERE")
    aq.sampling = SamplingInfo((), tuple(stateful_where), None, None)


def analyse(a: QueryAnalyser, aq: AnalysedQuery, stmt: E.Select, grouped: GroupedScope) -> None:
    """Check a sampling query (`aq.kind == "aggregate"`, items and HAVING resolved) and set
    `aq.sampling`; WHERE keeps its conjuncts without stateful calls."""
    clauses: dict[str, E.ExtraClause] = {}
    for c in stmt.extra or []:
        if c.keyword in clauses and c.keyword != "SLACK":
            raise a.error(c, f"{c.keyword} appears twice")
        clauses[c.keyword] = c
    if "CLOSING_WHEN" in clauses:
        raise a.error(clauses["CLOSING_WHEN"], "CLOSING_WHEN in a sampling query is not "
                      "supported (GS-lite ignores it there)")
    if aq.temporal is None:
        raise a.error(stmt, "a sampling query samples per time window: it needs a temporal "
                      "group item (e.g. GROUP BY time/20 AS tb, srcIP)")
    if aq.temporal2 is not None or aq.patterns is not None or a.flow_mode:
        raise a.error(stmt, "a sampling query cannot have a second temporal item, CUBE, "
                      "ROLLUP, GROUPING_SETS or flow settings")
    if aq.defines.get("late") == "correct":
        raise a.error(stmt, "late 'correct' is not for sampling queries: a window's sample "
                      "depends on every row before, so late rows are dropped and counted")
    if ("CLEANING_WHEN" in clauses) != ("CLEANING_BY" in clauses):
        have, missing = ("CLEANING_WHEN", "CLEANING_BY") if "CLEANING_WHEN" in clauses \
            else ("CLEANING_BY", "CLEANING_WHEN")
        raise a.error(clauses[have], f"{have} needs {missing}: one says when to clean, the "
                      f"other which groups stay")
    by_name = {g.name.lower(): g for g in aq.group}
    supergroup: list[str] = []
    if "SUPERGROUP" in clauses:
        for col in clauses["SUPERGROUP"].items:
            g = by_name.get(col.name.lower()) if col.table is None else None
            if g is None:
                raise a.error(col, f"SUPERGROUP item {col.name!r} is not a GROUP BY item "
                              f"(group items: {', '.join(x.name for x in aq.group)})")
            if g is aq.temporal:
                raise a.error(col, f"{g.name!r} is the temporal group item: every window has "
                              f"its own supergroups already, so leave it out of SUPERGROUP")
            if g.name in supergroup:
                raise a.error(col, f"{g.name!r} appears twice in SUPERGROUP")
            supergroup.append(g.name)
    aliases = {i.name: i.expr for i in aq.items}
    when = by = None
    if "CLEANING_WHEN" in clauses:
        node = clauses["CLEANING_WHEN"].this
        when = a.condition(grouped.resolve(node, "CLEANING_WHEN", aliases), node,
                           "CLEANING_WHEN")
        for agg in when.find_all(E.Aggregate):
            raise a.error(agg if agg.pos else node, f"CLEANING_WHEN may not read the group's aggregates "
                          f"({agg.name}): only group items, super-aggregates (e.g. "
                          f"{agg.name.lower()}$(...)) and stateful functions")
        node = clauses["CLEANING_BY"].this
        by = a.condition(grouped.resolve(node, "CLEANING_BY", aliases), node, "CLEANING_BY")
    stateful_where: list[E.Expr] = []
    plain: list[E.Expr] = []
    for c in conjuncts(aq.where):
        (stateful_where if stateful_calls(c) else plain).append(c)
    aq.where = conjoin(plain)
    for c in stateful_where:
        _kernel_values(a, c, "WHERE")
    for clause, expr in (("HAVING", aq.having), ("CLEANING_WHEN", when), ("CLEANING_BY", by)):
        if expr is not None:
            _kernel_values(a, expr, clause)
    for item in aq.items:
        for call in stateful_calls(item.expr):
            if call.name not in ACCESSORS:
                raise a.error(item.node, f"SELECT may call only the stateful functions that "
                              f"read the final state ({', '.join(sorted(ACCESSORS))}); "
                              f"{call.name} decides a sample: call it in WHERE, "
                              f"CLEANING_WHEN, CLEANING_BY or HAVING")
    for expr in [i.expr for i in aq.items] + [aq.having, by]:
        for agg in (expr.find_all(E.Aggregate) if expr is not None else ()):
            if agg.name not in GROUP_AGGREGATES or agg.udaf is not None:
                raise a.error(agg, f"{agg.name} in a sampling query is not supported yet "
                              f"(aggregates: {', '.join(GROUP_AGGREGATES)})")
            if agg.name in ("MIN", "MAX") and agg.arg is not None and \
                    a.type_of(agg.arg) in ("ip", "string"):
                # the sequential kernel keeps aggregates as numbers (float64 words)
                what = "an address" if a.type_of(agg.arg) == "ip" else "a string"
                raise a.error(agg, f"{agg.name} over {what} in a sampling query is not "
                              f"supported yet (its aggregates are numbers)")
    aq.sampling = SamplingInfo(tuple(supergroup), tuple(stateful_where), when, by)


def _kernel_values(a: QueryAnalyser, expr: E.Expr, clause: str) -> None:
    """The sequential kernel computes conditions over numbers: refuse other values."""
    for node in expr.walk():
        if isinstance(node, (E.Field, E.Func, E.Aggregate, E.SuperAggregate, E.Binary,
                             E.Unary, E.Literal)):
            t = a.type_of(node)
            if t not in KERNEL_TYPES:
                raise a.error(node, f"a {t} value in {clause} of a sampling query is not "
                              f"supported yet (its conditions compute with numbers)")
        elif isinstance(node, (E.In, E.Param)):
            raise a.error(node, f"{type(node).__name__} in {clause} of a sampling query is "
                          f"not supported yet")
        if isinstance(node, E.Func) and node.name not in STATEFUL_FUNCTIONS:
            raise a.error(node, f"function {node.name} in {clause} of a sampling query is not "
                          f"supported yet (operators, comparisons and stateful functions are)")
