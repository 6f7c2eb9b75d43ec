"""GS-lite's function library and user-defined functions over evaluated columns (numpy).

`call(node, args, n)` evaluates a call of a `queries.function_library` function or of a
user-defined one (`node.external`, `queries.udf`) for `lowlevel.evaluate.Evaluator`: `args`
are evaluated values, a string literal (a prefix file, a HANDLE) as its Python value. Every
function works on whole columns: MIN/MAX with the exact comparisons of `lowlevel.values`, getlpmid
with the Numba kernel of `lowlevel.lpm`, a user function with one call per batch.
"""

from __future__ import annotations

import logging

import numpy as np

from lowlevel import lpm
from lowlevel import values as V
from queries import expressions as E
from queries.errors import QueryError
from queries.prefixfile import PrefixFileError

log = logging.getLogger(__name__)

U64 = np.uint64
I64 = np.int64
_DTYPES = {"uint": U64, "ullong": U64, "ipv4": U64, "int": I64, "llong": I64,
           "float": np.float64, "bool": np.bool_}


class UserFunctionError(QueryError):
    """A user-defined function that failed or returned something unusable (names the
    function, its module and the query's line and column)."""


def call(node: E.Func, args: list, n: int):
    if node.external is not None:
        return call_external(node, args, n)
    name = node.name
    if name in ("umin", "umax", "llmin", "llmax"):
        return min_max(name, args[0], args[1])
    if name == "if":
        return V.if_else(*args)
    if name in ("eq", "geq", "leq"):
        op = {"eq": "=", "geq": ">=", "leq": "<="}[name]
        return V.compare(op, args[0], args[1]).astype(U64)
    if name == "non_temporal":
        return args[0]
    if name == "sqrt":
        with np.errstate(invalid="ignore"):
            return np.sqrt(V.cast("float", args[0]))
    if name in ("getlpmid", "getv6lpmid"):
        try:
            return lpm.getlpmid(args[0], args[1])
        except PrefixFileError as exc:
            raise QueryError.at(node, str(exc)) from None
    raise ValueError(f"unknown function {name}")


def min_max(name: str, a, b):
    """UMIN/UMAX/LLMIN/LLMAX: the comparison of `<` (exact across signed and unsigned), the
    result in the two values' common type (`V.if_else` converts as it does)."""
    smaller = V.compare("<", a, b) if name.endswith("min") else V.compare(">", a, b)
    out = V.if_else(smaller, a, b)
    if name.startswith("ll") and not isinstance(out, tuple) and out.dtype == np.bool_:
        out = out.astype(U64)
    return out


def argument(value, gsql: str, n: int):
    """An evaluated value as a user function receives it (`queries.udf`)."""
    if gsql == "ip":
        hi, lo = V.promote_ip(value)
        return (np.ascontiguousarray(np.broadcast_to(hi, (n,))),
                np.ascontiguousarray(np.broadcast_to(lo, (n,))))
    if gsql == "string":
        if isinstance(value, str):
            return np.full(n, value, dtype=object)
        return np.asarray(value, dtype=object)
    arr = np.broadcast_to(np.asarray(value), (n,))
    if gsql == "bool":
        return arr != 0
    if gsql == "ipv4":
        return np.ascontiguousarray(arr.astype(U64) & U64(0xFFFF_FFFF))
    dtype = _DTYPES[gsql]
    if dtype is not np.float64 and arr.dtype == np.float64:
        arr = np.nan_to_num(np.trunc(arr)).astype(I64)
    return np.ascontiguousarray(arr.astype(dtype))


def result(value, gsql: str, n: int, what: str):
    """A user function's return value as an evaluated column of `gsql` (ValueError saying
    what is wrong)."""
    if gsql == "ip":
        if not (isinstance(value, tuple) and len(value) == 2):
            raise ValueError(f"{what} must return a (hi, lo) pair of uint64 arrays (IPV6)")
        return tuple(np.broadcast_to(np.asarray(v, U64), (n,)).copy() for v in value)
    arr = np.asarray(value)
    if arr.ndim == 0:
        arr = np.broadcast_to(arr, (n,))
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"{what} returned {arr.shape} values for {n} rows")
    if gsql == "string":
        return np.array([str(x) for x in arr], dtype=object)
    if gsql == "bool":
        return arr.astype(bool)
    try:
        with np.errstate(all="ignore"):
            out: np.ndarray = arr.astype(_DTYPES[gsql])
    except (TypeError, ValueError):
        raise ValueError(f"{what} returned {arr.dtype} values, not {gsql}") from None
    return out & U64(0xFFFF_FFFF) if gsql == "ipv4" else out


def call_external(node: E.Func, args: list, n: int):
    """One call of a user function over the batch (`queries.udf` has the convention)."""
    from queries.udf import implementation

    fn = node.external
    impl = implementation(fn.module, fn.name)
    what = f"{fn.name} ({fn.module})"
    if impl is None:
        raise UserFunctionError.at(node, f"{fn.module} no longer defines {fn.name}")
    passed = [value if handle else argument(value, gsql, n)
              for value, gsql, handle in zip(args, fn.params, fn.handles)]
    try:
        out = impl(*passed)
    except Exception as exc:
        raise UserFunctionError.at(node, f"{what} failed: {type(exc).__name__}: {exc}") \
            from exc
    try:
        return result(out, fn.returns, n, what)
    except ValueError as exc:
        raise UserFunctionError.at(node, str(exc)) from None
