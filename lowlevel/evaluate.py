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
a guarded division, not a fault.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from capture.schema import PROTOCOLS
from lowlevel import strings
from lowlevel.hll import estimate
from queries import expressions as E
from queries.errors import QueryError
from queries.function_library import LIBRARY_FUNCTIONS
from queries.string_functions import STRING_FUNCTIONS

U64 = np.uint64
I64 = np.int64
MAPPED = U64(0x0000_FFFF_0000_0000)
LOW32 = U64(0xFFFF_FFFF)
ALL64 = U64(0xFFFF_FFFF_FFFF_FFFF)

Value = Any   # np.ndarray, (hi, lo), or StringCodes


class StringCodes:
    """A string value over a record batch: uint64 codes into the link's intern table
    (`capture.strings.StringTable`), not per-row Python objects. `=`/`<>` against a literal or
    another string of the same link compare codes; group keys and projected columns keep the
    codes (decoded to text when partial rows are made); any other use decodes to an object
    array (`plain`)."""

    __slots__ = ("codes", "table")

    def __init__(self, codes: np.ndarray, table):
        self.codes = codes
        self.table = table

    def __len__(self) -> int:
        return len(self.codes)

    def decode(self) -> np.ndarray:
        return self.table.objects(self.codes)


def plain(v: Value) -> Value:
    """`v` with string codes decoded to an object array of str, and an Arrow array (a packet
    payload) as an object array of bytes (other values as they are)."""
    if isinstance(v, StringCodes):
        return v.decode()
    return strings.texts(v) if isinstance(v, (pa.Array, pa.ChunkedArray)) else v


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

def truthy(v: Value) -> np.ndarray:
    v = plain(v)
    if isinstance(v, tuple):
        return (v[0] != 0) | (v[1] != 0)
    if v.dtype == np.bool_:
        return v
    return v != 0


def _num(v: np.ndarray) -> np.ndarray:
    return v.astype(U64) if v.dtype == np.bool_ else v


def _promote_ip(v: Value) -> tuple:
    if isinstance(v, tuple):
        return v
    return (np.zeros(len(v), U64), MAPPED | (np.asarray(v, U64) & LOW32))


def _compare_arrays(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = {"=": np.equal, "<>": np.not_equal, "<": np.less, ">": np.greater,
          "<=": np.less_equal, ">=": np.greater_equal}[op]
    return np.asarray(fn(a, b), dtype=bool)


_FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
#: result of `unsigned op negative signed` (the unsigned side is always larger)
_UNSIGNED_VS_NEGATIVE = {"=": False, "<>": True, "<": False, ">": True, "<=": False, ">=": True}


def compare(op: str, a: Value, b: Value) -> np.ndarray:
    if isinstance(a, (StringCodes, pa.Array)) or isinstance(b, (StringCodes, pa.Array)):
        if isinstance(a, StringCodes) and isinstance(b, StringCodes) and a.table is b.table \
                and op in ("=", "<>"):
            return _compare_arrays(op, a.codes, b.codes)
        # byte-wise order (lowlevel.strings): codes through their ranks, the rest in Arrow
        return strings.compare(op, a, b)
    if op not in ("=", "<>") and (_is_text(a) or _is_text(b)):
        return strings.compare(op, a, b)
    if isinstance(a, tuple) or isinstance(b, tuple):
        (ah, al), (bh, bl) = _promote_ip(a), _promote_ip(b)
        eq = (ah == bh) & (al == bl)
        if op == "=":
            return eq
        if op == "<>":
            return ~eq
        lt = (ah < bh) | ((ah == bh) & (al < bl))
        return {"<": lt, "<=": lt | eq, ">": ~(lt | eq), ">=": ~lt}[op]
    if a.dtype == object or b.dtype == object:
        return _compare_arrays(op, a, b)
    a, b = _num(a), _num(b)
    if a.dtype == U64 and b.dtype == I64:
        res = _compare_arrays(op, a, b.astype(U64, copy=False))
        return np.where(b < 0, _UNSIGNED_VS_NEGATIVE[op], res)
    if a.dtype == I64 and b.dtype == U64:
        return compare(_FLIP[op], b, a)
    return _compare_arrays(op, a, b)


def _is_text(v: Value) -> bool:
    return isinstance(v, np.ndarray) and v.dtype == object and len(v) > 0 \
        and isinstance(v[0], (str, bytes))


def _arith_dtype(op: str, a: np.ndarray, b: np.ndarray):
    if a.dtype == np.float64 or b.dtype == np.float64:
        return np.float64
    if op == "-" or a.dtype == I64 or b.dtype == I64:
        return I64
    return U64


def _divide(a: np.ndarray, b: np.ndarray, dt) -> np.ndarray:
    zero = b == 0
    safe = np.where(zero, dt(1), b).astype(dt)
    if dt is np.float64:
        q = a / safe
    elif dt is U64:
        q = a // safe
    else:
        q = a // safe
        # floor -> truncation toward zero (C): step back up when signs differ and inexact
        q = q + ((np.fmod(a, safe) != 0) & ((a < 0) != (safe < 0)))
    return np.where(zero, dt(0), q).astype(dt)


def _modulo(a: np.ndarray, b: np.ndarray, dt) -> np.ndarray:
    zero = b == 0
    safe = np.where(zero, dt(1), b).astype(dt)
    r = np.fmod(a, safe)
    return np.where(zero, dt(0), r).astype(dt)


def _shift(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = _num(a)
    dt = a.dtype.type
    b = _num(b)
    if b.dtype == I64:
        valid = (b >= 0) & (b < 64)
    else:
        valid = b < U64(64)
    count = np.where(valid, b, 0).astype(dt)
    if op == "<<":
        res = np.left_shift(a, count)
        fill = np.zeros_like(a)
    else:
        res = np.right_shift(a, count)
        fill = np.where(a < 0, dt(-1), dt(0)) if dt is I64 else np.zeros_like(a)
    return np.where(valid, res, fill).astype(dt)


def binary(op: str, a: Value, b: Value) -> Value:
    if op not in _FLIP:
        a, b = plain(a), plain(b)
    if op == "AND":
        return truthy(a) & truthy(b)
    if op == "OR":
        return truthy(a) | truthy(b)
    if op in _FLIP:
        return compare(op, a, b)
    if op in ("<<", ">>"):
        return _shift(op, a, b)
    a, b = _num(a), _num(b)
    if op in ("&", "|", "^"):
        dt = I64 if (a.dtype == I64 or b.dtype == I64) else U64
        fn = {"&": np.bitwise_and, "|": np.bitwise_or, "^": np.bitwise_xor}[op]
        return fn(a.astype(dt, copy=False), b.astype(dt, copy=False))
    dt = _arith_dtype(op, a, b)
    a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return _divide(a, b, dt)
        if op == "%":
            return _modulo(a, b, dt)
    raise ValueError(f"unknown operator {op}")


def _mask_bits(k: np.ndarray, width: int) -> np.ndarray:
    """Per row, a uint64 with the top `k` of `width` (<= 64) low bits set."""
    k = np.clip(np.asarray(k).astype(I64), 0, width)
    full = ALL64 if width == 64 else U64((1 << width) - 1)
    shift = np.where(k == 0, 0, width - k).astype(U64)
    return np.where(k == 0, U64(0), (full << shift) & full).astype(U64)


def prefix(addr: Value, n: Value) -> Value:
    if not isinstance(addr, tuple):
        return np.asarray(addr, U64) & _mask_bits(n, 32)
    hi, lo = addr
    n = np.asarray(n).astype(I64)
    mapped = (hi == 0) & ((lo >> U64(32)) == U64(0xFFFF))
    v4 = (lo & ~LOW32) | (lo & _mask_bits(np.minimum(n, 32), 32))
    hi6 = hi & _mask_bits(np.minimum(n, 64), 64)
    lo6 = lo & _mask_bits(np.maximum(n - 64, 0), 64)
    return (np.where(mapped, hi, hi6), np.where(mapped, v4, lo6))


def ip_strings(addr: Value) -> np.ndarray:
    """Addresses as text (Python per row: display only)."""
    if not isinstance(addr, tuple):
        return np.array([str(ipaddress.IPv4Address(int(v) & 0xFFFFFFFF)) for v in addr],
                        dtype=object)
    out = []
    for h, l in zip(addr[0].tolist(), addr[1].tolist()):
        if h == 0 and (l >> 32) == 0xFFFF:
            out.append(str(ipaddress.IPv4Address(l & 0xFFFFFFFF)))
        else:
            out.append(str(ipaddress.IPv6Address((h << 64) | l)))
    return np.array(out, dtype=object)


def cast(name: str, v: Value) -> np.ndarray:
    if isinstance(v, tuple):    # UINT(ip): the IPv4 address of an IPv4-mapped address
        return v[1] & LOW32
    v = _num(v)
    with np.errstate(all="ignore"):
        if name in ("uint", "ullong"):
            if v.dtype == np.float64:
                v = np.nan_to_num(np.trunc(v)).astype(I64)
            return v.astype(U64)
        if name in ("llong", "int"):
            if v.dtype == np.float64:
                v = np.nan_to_num(np.trunc(v))
            return v.astype(I64)
        return v.astype(np.float64)


def if_else(c: Value, a: Value, b: Value) -> Value:
    cond = truthy(c)
    if isinstance(a, StringCodes) and isinstance(b, StringCodes) and a.table is b.table:
        return StringCodes(np.where(cond, a.codes, b.codes), a.table)
    a, b = plain(a), plain(b)
    if isinstance(a, tuple) or isinstance(b, tuple):
        (ah, al), (bh, bl) = _promote_ip(a), _promote_ip(b)
        return (np.where(cond, ah, bh), np.where(cond, al, bl))
    if a.dtype == object or b.dtype == object:
        return np.where(cond, a, b)
    a, b = _num(a), _num(b)
    if a.dtype == b.dtype:
        return np.where(cond, a, b)
    dt = _arith_dtype("+", a, b)
    return np.where(cond, a.astype(dt, copy=False), b.astype(dt, copy=False))


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
            v = _num(v)
            if node.op == "-":
                with np.errstate(all="ignore"):
                    return -v if v.dtype == np.float64 else -(v.astype(I64))
            return ~v
        if isinstance(node, E.Binary):
            if node.op in _FLIP:
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
                op = _FLIP[op]      # 'text' < s is s > 'text'
            done = strings.compare_literal(op, v, text)
            if done is not None:
                return done
        if not isinstance(v, StringCodes):
            return compare(op, v, self.constant(text, "string"))
        code = v.table.code_of(text)
        if code is None:          # a text the link has never carried equals no row
            return np.full(len(v), op == "<>")
        return _compare_arrays(op, v.codes, np.asarray(code, U64))

    def _zero_divisors(self, divisor: Value) -> None:
        if isinstance(divisor, tuple):
            zero = (divisor[0] == 0) & (divisor[1] == 0)
        else:
            zero = _num(divisor) == 0
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
