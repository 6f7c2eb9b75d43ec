"""GS-lite's partial functions: a call that fails discards its row.

`str_extract_regex(s, 're')` is PARTIAL in GS-lite's `external_fcns.def`: where the pattern
does not match, "the function fails" (manual 12.2) and the tuple being built is dropped. Here
the call gives the first match ('' when none, as `str_extract_regex_null`), and the query is
given the condition that makes its rows exist: `str_regex_match(s, 're')` is added to WHERE
for calls evaluated per input row (WHERE, group items, aggregate arguments, the SELECT list
of a selection) and to HAVING for calls over group keys in an aggregation's SELECT or HAVING.
"""

from __future__ import annotations

from collections.abc import Iterable

from queries import expressions as E

#: partial function -> the predicate that holds where it succeeds
PARTIAL = {"str_extract_regex": "str_regex_match"}


def _calls(exprs: Iterable[E.Expr | None], inside_aggregates: bool | None) -> list[E.Func]:
    """Partial calls in `exprs`: all (None), only inside aggregates (True), only outside."""
    out: list[E.Func] = []

    def walk(node: E.Node, in_agg: bool) -> None:
        if isinstance(node, E.Func) and node.name in PARTIAL and \
                (inside_aggregates is None or inside_aggregates == in_agg):
            out.append(node)
        for child in node.children():
            walk(child, in_agg or isinstance(node, E.Aggregate))

    for e in exprs:
        if e is not None:
            walk(e, False)
    return out


def _guard(calls: list[E.Func]) -> E.Expr | None:
    terms: list[E.Expr] = []
    for call in calls:
        term = E.Func(pos=call.pos, name=PARTIAL[call.name], args=list(call.args["args"]))
        if term not in terms:
            terms.append(term)
    guard: E.Expr | None = None
    for t in terms:
        guard = t if guard is None else E.Binary(pos=t.pos, op="AND", left=guard, right=t)
    return guard


def _and(cond: E.Expr | None, guard: E.Expr | None) -> E.Expr | None:
    if guard is None:
        return cond
    return guard if cond is None else E.Binary(pos=cond.pos, op="AND", left=cond, right=guard)


def guard_partial_calls(aq) -> None:
    """Add to an analysed selection or aggregation (`analysed.AnalysedQuery`) the conditions
    under which its partial calls succeed (module docstring)."""
    items = [i.expr for i in aq.items]
    if aq.kind == "aggregate" or aq.group:
        per_row = _calls([aq.where, *(g.expr for g in aq.group)], None) + \
            _calls([*items, aq.having], True)
        per_group = _calls([*items, aq.having], False)
        aq.where = _and(aq.where, _guard(per_row))
        aq.having = _and(aq.having, _guard(per_group))
    else:
        aq.where = _and(aq.where, _guard(_calls([aq.where, *items], None)))
