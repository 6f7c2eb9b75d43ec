"""Vectorised evaluation of GSQL expressions over a packet batch or a dict of result columns.

`evaluate(expr, batch, params=None)` returns one numpy array per expression (length = rows of
the batch): uint64 for unsigned types (uint, ullong, ipv4 as 32-bit values, mac), int64 for
signed, float64, bool, an object array of str for strings (a record batch's string field:
`StringCodes`, codes into the link's intern table, decoded only where the text itself is
needed), and for `ip` a tuple (hi, lo) of uint64 arrays. No Python runs per row except in `ip_str` (display only, high level).
Semantics are those of `queries.types` (integer division truncates toward zero, a zero divisor
gives 0, 64-bit wrapping arithmetic). `evaluate_columns` does the same over named columns
(a dict or a pandas DataFrame; an `ip` column may be a (hi, lo) tuple or an object array of
128-bit Python ints), for the high level's finalisation, HAVING and outputs.

Both take `zeros`, a bool array of one item per row, to learn which rows met a zero divisor
(their quotient or remainder is the defined 0, and the run counts them): the evaluator sets
the item of every row whose value depended on such a division. The branch of `if_else` a row
does not take is evaluated too (vectorised) but does not count: `if_else(n = 0, 0, x / n)` is
a guarded division, not a fault. The values and the operations on them are `lowlevel.values`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from capture.schema import PROTOCOLS
from lowlevel import strings
from lowlevel.hll import estimate
from lowlevel.values import (
    FLIP,
    I64,
    LOW32,
    U64,
    StringCodes,
    Value,
    as_number,
    binary,
    cast,
    compare,
    compare_arrays,
    if_else,
    ip_strings,
    plain,
    prefix,
    truthy,
)
from queries import expressions as E
from queries.errors import QueryError
from queries.function_library import LIBRARY_FUNCTIONS
from queries.string_functions import STRING_FUNCTIONS


def _fields_by_name() -> dict:
    out = {}
    for proto in ("PACKET", "IP", "TCP", "UDP", "ICMP"):
        for f in PROTOCOLS[proto].fields:
            out[f.name] = f
    return out


#: unresolved Columns over a packet batch: the widest meaning (srcIP is the 128-bit address)
_FIELDS = _fields_by_name()


def batch_field(batch, name: str, type_: str, columns: tuple | None) -> Value:
    """A packet field as its evaluated value (see the module docstring)."""
    n = batch.n
    if name == "link":
        return np.full(n, batch.link, dtype=object)
    if name in ("time", "timestamp_ms"):
        v = batch[name]
        return v.astype(U64) if name == "time" else v.astype(I64)
    if type_ == "ip":
        assert columns is not None   # an ip field is two physical columns
        hi, lo = columns
        return (batch[hi].astype(U64, copy=False), batch[lo].astype(U64, copy=False))
    col = columns[0] if columns else name
    raw = batch[col]
    if type_ == "string":
        if isinstance(raw, pa.Array):       # TCP_data / UDP_data: Arrow binary (capture.payload)
            return raw
        # a record batch's string field: codes into the link's table (capture.records)
        return StringCodes(raw, batch.strings[col])
    if type_ == "ipv4":
        return raw.astype(U64) & LOW32
    if type_ == "bool":
        return raw != 0
    if type_ in ("int", "llong"):
        return raw.astype(I64, copy=False)
    if type_ == "float":
        return raw.astype(np.float64, copy=False)
    return raw.astype(U64, copy=False)


def evaluate(expr: E.Expr, batch, params: Mapping[str, Any] | None = None,
             zeros: np.ndarray | None = None, functions: FunctionHook | None = None) -> Value:
    """Evaluate `expr` over every packet of `batch` (a capture.batch.PacketBatch); `zeros`:
    see the module's docstring; `functions`: see `Evaluator`."""

    def lookup(node):
        if isinstance(node, E.Field):
            return batch_field(batch, node.name, node.type, node.columns)
        fmt = getattr(batch, "format", None)
        f = _FIELDS.get(node.name) if fmt is None else \
            next((x for x in fmt.fields if x.name == node.name), None)
        if f is None or node.table is not None:
            raise QueryError.at(node, f"unknown packet field {node.name!r}")
        return batch_field(batch, f.name, f.type, f.columns)

    return Evaluator(lookup, batch.n, params, zeros, functions).ev(expr)


def divides(expr) -> bool:
    """Whether `expr` (None, or an expression tree) holds a division or modulo."""
    return expr is not None and hasattr(expr, "walk") and any(
        isinstance(n, E.Binary) and n.op in ("/", "%") for n in expr.walk())


def calls_user_function(expr) -> bool:
    """Whether `expr` (None, or an expression tree) calls a user-defined function."""
    return expr is not None and hasattr(expr, "walk") and any(
        isinstance(n, E.Func) and getattr(n, "external", None) is not None
        for n in expr.walk())


def evaluate_predicate(expr: E.Expr | None, batch, params: Mapping[str, Any] | None = None) -> np.ndarray:
    """WHERE over a batch as a bool mask (a number counts as true when non-zero; None: all)."""
    if expr is None:
        return np.ones(batch.n, bool)
    return truthy(evaluate(expr, batch, params))


def pane_ids(window, batch) -> np.ndarray:
    """The pane id of every packet for a `plan.WindowPlan` over packets:
    `(timestamp + offset_ns) // pane_ns` (int64, floor division)."""
    ts = batch["timestamp"].astype(I64, copy=False)
    return np.floor_divide(ts + np.int64(window.offset_ns), np.int64(window.pane_ns))


def frame_value(col) -> Value:
    """A result column as an evaluated value (ip object columns become (hi, lo))."""
    if isinstance(col, tuple):
        return col
    arr = np.asarray(getattr(col, "to_numpy", lambda: col)())
    if arr.dtype == object and len(arr) and isinstance(arr[0], (int, np.integer)) \
            and not isinstance(arr[0], bool):
        ints = [int(v) for v in arr]
        return (np.array([v >> 64 for v in ints], U64), np.array([v & 0xFFFF_FFFF_FFFF_FFFF for v in ints], U64))
    return arr


def evaluate_columns(expr: E.Expr, columns: Mapping[str, Any], n: int | None = None,
                     params: Mapping[str, Any] | None = None,
                     zeros: np.ndarray | None = None,
                     functions: FunctionHook | None = None) -> Value:
    """Evaluate `expr` over named result columns; a Field/Column `t.x` reads `t.x`, else `x`."""
    if n is None:
        n = _rows(columns)

    def lookup(node):
        key = f"{node.table}.{node.name}" if node.table else node.name
        if key not in columns:
            raise QueryError.at(node, f"no column {key!r} among {', '.join(map(str, columns))}")
        return frame_value(columns[key])

    return Evaluator(lookup, n, params, zeros, functions).ev(expr)


def _rows(columns) -> int:
    if hasattr(columns, "columns") and hasattr(columns, "index"):
        return len(columns)
    for v in columns.values():
        return len(v[0]) if isinstance(v, tuple) else len(v)
    return 0


# --- the evaluator ------------------------------------------------------------------------------

#: `functions(node, args, n)`: the value of a call (`args`: evaluated arguments, a literal
#: argument as its Python value), or NotImplemented to evaluate it as usual
FunctionHook = Callable[[E.Func, list, int], Any]


class Evaluator:
    """Evaluates an expression tree bottom-up; `lookup` gives a Field/Column's value;
    `functions` may take over calls (the tests' reference evaluator computes getlpmid and
    user functions its own way)."""

    def __init__(self, lookup: Callable, n: int, params: Mapping[str, Any] | None = None,
                 zeros: np.ndarray | None = None, functions: FunctionHook | None = None):
        self.lookup = lookup
        self.n = n
        self.params = params or {}
        self.zeros = zeros
        self.functions = functions
        self._taken: np.ndarray | None = None   # rows whose value counts (if_else branches)

    def constant(self, value, kind: str) -> Value:
        """A literal as n rows: a read-only view of one value (no n-row temporary; numpy
        reads it with stride 0)."""
        n = self.n

        def rows(v, dtype):
            return np.broadcast_to(np.asarray(v, dtype), (n,))

        if kind == "ipv6":
            return (rows(value >> 64, U64), rows(value & 0xFFFF_FFFF_FFFF_FFFF, U64))
        if kind == "ip":
            return rows(value, U64)
        if kind == "bool" or isinstance(value, (bool, np.bool_)):
            return rows(bool(value), bool)
        if kind == "string" or isinstance(value, str):
            return np.full(n, value, dtype=object)
        if isinstance(value, float) or kind == "float":
            return rows(value, np.float64)
        value = int(value)
        return rows(value, U64 if value >= 0 else I64)

    def ev(self, node: E.Node) -> Value:
        if isinstance(node, (E.Field, E.Column)):
            return self.lookup(node)
        if isinstance(node, E.Literal):
            return self.constant(node.value, node.kind)
        if isinstance(node, E.Param):
            if node.name not in self.params:
                raise QueryError.at(node, f"parameter ${node.name} has no value (give "
                                    f"--param {node.name}=...)")
            return self.constant(self.params[node.name], "")
        if isinstance(node, E.Unary):
            v = self.ev(node.this)
            v = plain(v)
            if node.op == "NOT":
                return ~truthy(v)
            v = as_number(v)
            if node.op == "-":
                with np.errstate(all="ignore"):
                    return -v if v.dtype == np.float64 else -(v.astype(I64))
            return ~v
        if isinstance(node, E.Binary):
            if node.op in FLIP:
                quick = self._string_literal(node.op, node.left, node.right)
                if quick is not None:
                    return quick
            left, right = self.ev(node.left), self.ev(node.right)
            if self.zeros is not None and node.op in ("/", "%"):
                self._zero_divisors(right)
            return binary(node.op, left, right)
        if isinstance(node, E.In):
            this = self.ev(node.this)
            if isinstance(this, StringCodes) and all(
                    isinstance(i, E.Literal) and isinstance(i.value, str) for i in node.items):
                codes = [c for i in node.items if (c := this.table.code_of(i.value)) is not None]
                return np.isin(this.codes, np.array(codes, np.uint64))
            if isinstance(this, pa.Array):      # a payload: compared in Arrow, item by item
                out = np.zeros(self.n, bool)
                for item in node.items:
                    out |= compare("=", this, self.ev(item)) if not isinstance(item, E.Literal) \
                        else strings.compare_literal("=", this, str(item.value))
                return out
            this = plain(this)
            out = np.zeros(self.n, bool)
            for item in node.items:
                out |= compare("=", this, self.ev(item))
            return out
        if isinstance(node, E.Func):
            args = node.args["args"]
            if node.name == "prefix" and isinstance(args[1], E.Literal):
                # a constant length: one mask for the whole batch
                return prefix(self.ev(args[0]), int(args[1].value))
            if node.name == "if_else" and self.zeros is not None:
                return self._if_else(*args)
            if node.name == "udaf_output":
                # a user-defined aggregate's result from its combined state words
                from lowlevel.udafs import udaf_output

                words = [np.asarray(self.ev(a)) for a in args]
                return udaf_output(node.external, np.stack(words, axis=1) if words else
                                   np.zeros((0, 0)))
            if node.external is not None or node.name in LIBRARY_FUNCTIONS:
                return self._library_call(node)
            if node.name in STRING_FUNCTIONS:
                # strings stay codes or Arrow arrays: evaluated per distinct string or by
                # Arrow and Numba kernels (lowlevel.strings)
                constants = [a.value if isinstance(a, E.Literal) else None for a in args]
                return strings.call(node.name, [None if c is not None else self.ev(a)
                                                for a, c in zip(args, constants)],
                                    constants, self.n)
            return self.func(node.name, [plain(self.ev(a)) for a in args])
        if isinstance(node, E.Aggregate):
            raise QueryError.at(node, "an aggregate cannot be evaluated per row")
        raise QueryError.at(node, f"cannot evaluate {type(node).__name__}")

    def _string_literal(self, op: str, left: E.Node, right: E.Node) -> np.ndarray | None:
        """`s op 'text'` (either side) over string codes or a payload: `=`/`<>` compare one
        code, the text looked up once in the link's table; an order is computed once per
        distinct string (None: not that case)."""
        if isinstance(right, E.Literal) and isinstance(right.value, str):
            other = left
            text = right.value
        elif isinstance(left, E.Literal) and isinstance(left.value, str):
            other = right
            text = left.value
        else:
            return None
        if not isinstance(other, (E.Field, E.Column)):
            return None
        v = self.ev(other)
        if op not in ("=", "<>") or isinstance(v, pa.Array):
            if other is right:
                op = FLIP[op]      # 'text' < s is s > 'text'
            done = strings.compare_literal(op, v, text)
            if done is not None:
                return done
        if not isinstance(v, StringCodes):
            return compare(op, v, self.constant(text, "string"))
        code = v.table.code_of(text)
        if code is None:          # a text the link has never carried equals no row
            return np.full(len(v), op == "<>")
        return compare_arrays(op, v.codes, np.asarray(code, U64))

    def _zero_divisors(self, divisor: Value) -> None:
        if isinstance(divisor, tuple):
            zero = (divisor[0] == 0) & (divisor[1] == 0)
        else:
            zero = as_number(divisor) == 0
        if self._taken is not None:
            zero = zero & self._taken
        assert self.zeros is not None       # called only when counting
        np.logical_or(self.zeros, zero, out=self.zeros)

    def _if_else(self, c: E.Node, a: E.Node, b: E.Node) -> Value:
        """`if_else` counting the zero divisors of the branch each row takes only."""
        cond = self.ev(c)
        taken, outer = truthy(cond), self._taken
        try:
            self._taken = taken if outer is None else taken & outer
            va = self.ev(a)
            self._taken = ~taken if outer is None else ~taken & outer
            vb = self.ev(b)
        finally:
            self._taken = outer
        return if_else(cond, va, vb)

    def _library_call(self, node: E.Func) -> Value:
        """A GS-lite library function or a user-defined one (`lowlevel.library`): literal
        arguments (prefix files, HANDLE parameters) as their Python values."""
        from lowlevel import library

        if node.name == "if" and node.external is None and self.zeros is not None:
            return self._if_else(*node.args["args"])   # counts the taken branch only
        handles = node.external.handles if node.external is not None else ()
        args = [a.value if isinstance(a, E.Literal) and (a.kind == "string" or
                                                         i < len(handles) and handles[i])
                else plain(self.ev(a)) for i, a in enumerate(node.args["args"])]
        if self.functions is not None:
            done = self.functions(node, args, self.n)
            if done is not NotImplemented:
                return done
        return library.call(node, args, self.n)

    def func(self, name: str, args: list[Value]) -> Value:
        if name == "prefix":
            return prefix(args[0], args[1])
        if name in ("uint", "ullong", "llong", "int", "float"):
            return cast(name, args[0])
        if name == "if_else":
            return if_else(*args)
        if name == "ip_str":
            return ip_strings(args[0])
        if name == "hll_estimate":
            regs = args[0]
            if isinstance(regs, np.ndarray) and regs.dtype == object:
                regs = np.stack(list(regs)) if len(regs) else np.zeros((0, 64), np.uint8)
            return estimate(regs) if len(regs) else np.zeros(0, U64)
        raise ValueError(f"unknown function {name}")
