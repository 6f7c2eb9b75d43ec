"""Constant folding (`queries.constants`) against the vectorised evaluator (`lowlevel.evaluate`),
the run-time semantics it must reproduce: on random constant expressions at the 64-bit edges,
every value folding gives is the value every row gets at run time. The analyser refuses
divisors and shift counts by what folding says, so folding must never be wrong."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lowlevel.evaluate import evaluate
from queries import expressions as E
from queries.constants import fold
from tests.oracles.samples import random_batch

EDGES = [0, 1, 2, 3, 7, 63, 64, 65, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**63 + 1,
         2**64 - 2, 2**64 - 1]
_ints = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1))
_leaves = st.one_of(
    st.builds(lambda v: E.Literal(value=v, kind="int"), _ints),
    st.builds(lambda v: E.Literal(value=v, kind="bool"), st.booleans()),
    st.builds(lambda v: E.Literal(value=v, kind="float"),
              st.sampled_from([0.0, -0.0, 0.5, -2.5, 3.0, 1e18, 9.3e18, 2.0**64])),
)
_INT_OPS = ["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>", "=", "<>", "<", ">", "<=", ">=",
            "AND", "OR"]


def _trees(leaves, ops, casts=("uint", "llong", "float")):
    return st.recursive(
        leaves,
        lambda sub: st.one_of(
            st.builds(lambda op, a, b: E.Binary(op=op, left=a, right=b), st.sampled_from(ops),
                      sub, sub),
            st.builds(lambda op, a: E.Unary(op=op, this=a), st.sampled_from(["-", "~", "NOT"]),
                      sub),
            st.builds(lambda f, a: E.Func(name=f, args=[a]),
                      st.sampled_from(casts), sub),
            st.builds(lambda c, a, b: E.Func(name="if_else", args=[c, a, b]), sub, sub, sub),
        ),
        max_leaves=8,
    )


def _runtime(expr):
    try:
        with np.errstate(all="ignore"):
            value = evaluate(expr, random_batch(1, seed=1))
    except (TypeError, ValueError, OverflowError):
        return None             # not an expression the analyser would let through
    return value[0] if isinstance(value, np.ndarray) else None


def _same(folded, runtime) -> bool:
    kind, value = folded
    if kind == "f":
        return isinstance(runtime, (float, np.floating)) and (
            value == runtime or (math.isnan(value) and math.isnan(runtime)))
    if kind == "b":
        return isinstance(runtime, (bool, np.bool_)) and bool(runtime) == value
    dtype = np.uint64 if kind == "u" else np.int64
    return isinstance(runtime, np.integer) and runtime.dtype == dtype and int(runtime) == value


@settings(max_examples=400, deadline=None)
@given(_trees(_leaves, _INT_OPS))
def test_folding_gives_the_value_every_row_gets(expr):
    folded = fold(expr)
    if folded is None:
        return
    runtime = _runtime(expr)
    if runtime is None:
        return
    assert _same(folded, runtime), (folded, runtime, expr)


@settings(max_examples=200, deadline=None)
@given(_trees(st.builds(lambda v: E.Literal(value=v, kind="int"), _ints),
              ["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>"], ("uint", "llong")))
def test_integer_expressions_always_fold(expr):
    """Folding does not shy away: integer arithmetic always has a value."""
    folded = fold(expr)
    assert folded is not None
    assert _same(folded, _runtime(expr)), (folded, expr)


def test_parameters_fold_with_their_values_and_columns_never():
    div = E.Binary(op="-", left=E.Param(name="p"), right=E.Literal(value=3, kind="int"))
    assert fold(div, {"p": 3}.get) == ("i", 0)
    assert fold(div, {}.get) is None and fold(div) is None
    assert fold(E.Binary(op="*", left=E.Column(name="len"), right=E.Literal(value=0, kind="int"))) \
        is None
    assert fold(E.Literal(value=int("ffff0a000001", 16), kind="ip")) is None


def _value(v) -> E.Expr:
    """A constant of any sign and kind, as the parser builds it (a minus is a Unary)."""
    if isinstance(v, bool):
        return E.Literal(value=v, kind="bool")
    if isinstance(v, float):
        return E.Literal(value=v, kind="float") if v >= 0 else \
            E.Unary(op="-", this=E.Literal(value=-v, kind="float"))
    return E.Literal(value=v, kind="int") if v >= 0 else \
        E.Unary(op="-", this=E.Literal(value=-v, kind="int"))


SMALL = [-2**63, -7, -2, -1, 0, 1, 2, 3, 7, 64, 2**63 - 1, 2**63, 2**64 - 1, True, 2.5, -0.5]


def test_every_operator_on_every_pair_of_edge_values():
    """Exhaustively, beside the random trees: signs, wrap-around, truncation, shifts."""
    checked = 0
    for op in _INT_OPS:
        for a in SMALL:
            for b in SMALL:
                expr = E.Binary(op=op, left=_value(a), right=_value(b))
                folded, runtime = fold(expr), _runtime(expr)
                if folded is None or runtime is None:
                    continue
                assert _same(folded, runtime), (folded, runtime, a, op, b)
                checked += 1
    assert checked > len(_INT_OPS) * len(SMALL) ** 2 * 0.8
