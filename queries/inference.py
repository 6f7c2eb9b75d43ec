"""Types and time forms of resolved expressions, and the AND-splitting of conditions.

`type_of` gives the GSQL type of an expression the analyser has resolved (Fields carry their
types; operators follow `queries.types`); `form_of` tells whether an expression increases with
packet time and how (`queries.types.TimeForm`): the base time fields and anything derived from
them by `/ const`, `* const`, `+ const`, `- const` and integer casts.
"""

from __future__ import annotations

from typing import cast

from queries import expressions as E
from queries import types as T


def type_of(expr: E.Expr, params: dict[str, str] | None = None) -> str:
    """The GSQL type of a resolved expression (checked by `Scope.resolve` already)."""
    if isinstance(expr, E.Field):
        return expr.type
    if isinstance(expr, E.Literal):
        # a GS-lite literal may declare a wider type than its value (17ULL, LHEX'ff')
        return expr.type or T.literal_type(expr.kind, expr.value)
    if isinstance(expr, E.Param):
        return (params or {}).get(expr.name, "llong")
    if isinstance(expr, E.Unary):
        return T.unary_type(expr.op, type_of(expr.this, params)) or "llong"
    if isinstance(expr, E.Binary):
        return T.binary_type(expr.op, type_of(expr.left, params), type_of(expr.right, params)) or "llong"
    if isinstance(expr, E.In):
        return "bool"
    if isinstance(expr, E.Func):
        if expr.external is not None:
            return expr.external.returns
        return T.function_type(expr.name, [type_of(a, params) for a in expr.args["args"]]) or "llong"
    if isinstance(expr, E.SuperAggregate):
        args = [a for a in expr.arguments if not isinstance(a, E.Star)]
        if expr.name in ("COUNT", "COUNT_DISTINCT"):
            return "ullong" if expr.name == "COUNT" else "int"
        return T.aggregate_type(expr.name, type_of(args[0], params) if args else None) or "llong"
    if isinstance(expr, E.Aggregate):
        if expr.udaf is not None and not isinstance(expr.udaf, (bool, tuple)):
            return expr.udaf.returns
        arg = None if isinstance(expr.arg, E.Star) else type_of(expr.arg, params)
        return T.aggregate_type(expr.name, arg) or "llong"
    return "llong"


def conjuncts(expr: E.Expr | None) -> list[E.Expr]:
    """The terms of a condition's AND chain, left to right."""
    if expr is None:
        return []
    return cast(list[E.Expr], E.chain_terms(expr, "AND"))


def conjoin(parts: list[E.Expr]) -> E.Expr | None:
    """`p0 AND p1 AND ...` (balanced, as the parser builds chains); None for no parts."""
    return E.chain("AND", list(parts)) if parts else None


def sides_of(expr: E.Expr) -> set[str]:
    return {f.table for f in expr.find_all(E.Field)}


def unit_ns(form: T.TimeForm) -> int | None:
    """Nanoseconds per unit of a temporal value (None when it is not a plain time count)."""
    if form.offset_ns or form.shift or form.pane_ns % form.scale:
        return None
    return form.pane_ns // form.scale


def constant_of(expr: E.Expr, param_value) -> int | None:
    if isinstance(expr, E.Literal) and expr.kind == "int":
        return expr.value
    if isinstance(expr, E.Param) and param_value is not None:
        v = param_value(expr.name)
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    if isinstance(expr, E.Unary) and expr.op == "-":
        v = constant_of(expr.this, param_value)
        return None if v is None else -v
    return None


def form_of(expr: E.Expr, param_value=None) -> T.TimeForm | None:
    """The time form of an increasing expression (None when not increasing)."""
    if isinstance(expr, E.Field):
        return expr.form
    if isinstance(expr, E.Func) and expr.name in ("uint", "ullong", "llong", "int"):
        return form_of(expr.args["args"][0], param_value)
    if isinstance(expr, E.Binary) and expr.op in ("/", "*", "+", "-"):
        lf = form_of(expr.left, param_value)
        rc = constant_of(expr.right, param_value)
        if lf is not None and rc is not None:
            if expr.op == "/":
                return lf.divide(rc)
            if expr.op == "*":
                return lf.multiply(rc)
            return lf.add(rc if expr.op == "+" else -rc)
        rf = form_of(expr.right, param_value)
        lc = constant_of(expr.left, param_value)
        if rf is not None and lc is not None:
            if expr.op == "*":
                return rf.multiply(lc)
            if expr.op == "+":
                return rf.add(lc)
    return None
