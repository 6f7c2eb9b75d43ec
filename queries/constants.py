"""Constant folding: the value of an expression made of literals and parameters with a value.

The analyser folds the operands that must be known when a query is planned and refuses the
ones that cannot work, at their line and column, instead of leaving them to fail or to be
silently defined at run time: a divisor or modulus that is always 0, a shift count outside
0..63 (`queries.analysis`). Folding follows the run-time semantics of the vectorised
evaluator (`lowlevel.evaluate`, stated in `queries.types`), value by value in Python: an
unsigned value is a uint64, a signed one an int64, both wrapping; division truncates toward
zero and a zero divisor gives 0; a shift by a count outside 0..63 gives 0 (-1 for a negative
signed value shifted right). A value is a (kind, number) pair, kind "u" (uint64), "i" (int64),
"f" (float64) or "b" (bool), as the evaluator's numpy dtypes. Whatever folding cannot decide
for certain (addresses, strings, columns, parameters without a value, float corner cases) is
None: not a constant, left to run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from queries import expressions as E

Value = tuple[str, int | float | bool]
ParamValue = Callable[[str], object]

_MASK = (1 << 64) - 1


def _u(v: int) -> Value:
    return "u", v & _MASK


def _i(v: int) -> Value:
    v &= _MASK
    return "i", v - (1 << 64) if v >> 63 else v


def _int(value: object) -> Value | None:
    """A literal or parameter value as the evaluator holds it (`Evaluator.constant`)."""
    if isinstance(value, bool):
        return "b", value
    if isinstance(value, int):
        return _u(value) if value >= 0 else _i(value)
    if isinstance(value, float):
        return "f", value
    return None


def _num(v: Value) -> Value:
    """A bool used as a number is a uint64 0 or 1."""
    return ("u", int(v[1])) if v[0] == "b" else v


def _as(kind: str, v: Value) -> Value:
    """Reinterpret an integer value as uint64 / int64 (numpy's astype between them)."""
    return _u(int(v[1])) if kind == "u" else _i(int(v[1]))


def fold(expr: E.Node, param_value: ParamValue | None = None) -> Value | None:
    """The constant value of `expr` (a resolved expression), or None when it is not one."""
    if isinstance(expr, E.Literal):
        return _int(expr.value) if expr.kind in ("int", "float", "bool") else None
    if isinstance(expr, E.DefineRef):
        return fold(expr.value, param_value)
    if isinstance(expr, E.Param):
        return None if param_value is None else _int(param_value(expr.name))
    if isinstance(expr, E.Unary):
        v = fold(expr.this, param_value)
        if v is None:
            return None
        if expr.op == "NOT":
            return "b", not v[1]
        v = _num(v)
        if expr.op == "-":
            return ("f", -v[1]) if v[0] == "f" else _i(-int(v[1]))
        if expr.op == "~" and v[0] != "f":
            return (_u if v[0] == "u" else _i)(~int(v[1]))
        return None
    if isinstance(expr, E.Binary):
        left = fold(expr.left, param_value)
        right = fold(expr.right, param_value) if left is not None else None
        return None if left is None or right is None else binary(expr.op, left, right)
    if isinstance(expr, E.Func):
        return _func(expr, param_value)
    return None


def _func(expr: E.Func, param_value: ParamValue | None) -> Value | None:
    args = [fold(a, param_value) for a in expr.arguments]
    if any(a is None for a in args):
        return None
    if expr.name in ("uint", "ullong", "llong", "int", "float") and len(args) == 1:
        v = _num(args[0])   # type: ignore[arg-type]   # None excluded above
        if expr.name == "float":
            return "f", float(v[1])
        if v[0] == "f":
            x = float(v[1])
            if not math.isfinite(x) or abs(x) >= 2.0**63:
                return None     # numpy's casts of these are platform-defined: run time's
            v = _i(math.trunc(x))
        return _as("u" if expr.name in ("uint", "ullong") else "i", v)
    if expr.name == "if_else" and len(args) == 3:
        cond, a, b = args
        a, b = _num(a), _num(b)   # type: ignore[arg-type]
        if a[0] != b[0]:
            kind = "f" if "f" in (a[0], b[0]) else "i"
            a, b = (_convert(kind, x) for x in (a, b))
        return a if _truthy(cond) else b   # type: ignore[arg-type]
    return None


def _convert(kind: str, v: Value) -> Value:
    return ("f", float(v[1])) if kind == "f" else _as(kind, v)


def _truthy(v: Value) -> bool:
    return v[1] != 0


def _arith_kind(op: str, a: Value, b: Value) -> str:
    if "f" in (a[0], b[0]):
        return "f"
    return "i" if op == "-" or "i" in (a[0], b[0]) else "u"


def binary(op: str, a: Value, b: Value) -> Value | None:
    """`a op b` with the evaluator's semantics (`lowlevel.values.binary`)."""
    if op == "AND":
        return "b", _truthy(a) and _truthy(b)
    if op == "OR":
        return "b", _truthy(a) or _truthy(b)
    a, b = _num(a), _num(b)
    if op in ("=", "<>", "<", ">", "<=", ">="):
        if "f" in (a[0], b[0]) and a[0] != b[0]:
            return None          # numpy compares an integer with a float in float64
        x, y = a[1], b[1]
        return "b", {"=": x == y, "<>": x != y, "<": x < y, ">": x > y, "<=": x <= y,
                     ">=": x >= y}[op]
    if op in ("<<", ">>"):
        if a[0] == "f" or b[0] == "f":
            return None
        count = int(b[1])
        make = _u if a[0] == "u" else _i
        if not 0 <= count < 64:
            return make(-1 if op == ">>" and a[0] == "i" and int(a[1]) < 0 else 0)
        return make(int(a[1]) << count if op == "<<" else int(a[1]) >> count)
    if op in ("&", "|", "^"):
        if a[0] == "f" or b[0] == "f":
            return None
        kind = "i" if "i" in (a[0], b[0]) else "u"
        x, y = int(_as(kind, a)[1]), int(_as(kind, b)[1])
        v = x & y if op == "&" else x | y if op == "|" else x ^ y
        return _as(kind, ("i", v))
    kind = _arith_kind(op, a, b)
    if kind == "f":
        x, y = float(a[1]), float(b[1])
        if op in ("/", "%") and y == 0:
            return "f", 0.0
        try:
            result = {"+": x + y, "-": x - y, "*": x * y}[op] if op in ("+", "-", "*") \
                else x / y if op == "/" else math.fmod(x, y)
        except (OverflowError, ValueError):
            return None
        return "f", result
    x, y = int(_as(kind, a)[1]), int(_as(kind, b)[1])
    make = _u if kind == "u" else _i
    if op == "+":
        return make(x + y)
    if op == "-":
        return make(x - y)
    if op == "*":
        return make(x * y)
    if y == 0:
        return make(0)
    q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)    # truncated toward zero
    return make(q) if op == "/" else make(x - q * y)
