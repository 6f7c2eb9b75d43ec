"""Operations on evaluated GSQL values: comparisons, arithmetic, casts, `if_else`, prefixes.

A value is a numpy array over the rows: uint64 for unsigned types (uint, ullong, ipv4 as 32-bit
values, mac), int64 for signed, float64, bool, an object array of str for strings, `StringCodes`
(a record batch's string field: codes into the link's intern table) or an Arrow binary array
(a payload), and for `ip` a tuple (hi, lo) of uint64 arrays. The semantics are those of
`queries.types`: integer division truncates toward zero, a zero divisor gives 0, arithmetic
wraps in 64 bits, an unsigned and a signed value compare exactly. The evaluator
(`lowlevel.evaluate`) and the function library (`lowlevel.library`) compute with these.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import numpy as np
import pyarrow as pa

from lowlevel import strings

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


def truthy(v: Value) -> np.ndarray:
    """A value as a condition: a number is true when non-zero, an address when not ::."""
    v = plain(v)
    if isinstance(v, tuple):
        return (v[0] != 0) | (v[1] != 0)
    if v.dtype == np.bool_:
        return v
    return v != 0


def as_number(v: np.ndarray) -> np.ndarray:
    """A bool array as the uint64 0/1 it counts as (other arrays as they are)."""
    return v.astype(U64) if v.dtype == np.bool_ else v


def promote_ip(v: Value) -> tuple:
    """An address as (hi, lo): an IPv4 one as its IPv4-mapped IPv6 address."""
    if isinstance(v, tuple):
        return v
    return (np.zeros(len(v), U64), MAPPED | (np.asarray(v, U64) & LOW32))


def compare_arrays(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = {"=": np.equal, "<>": np.not_equal, "<": np.less, ">": np.greater,
          "<=": np.less_equal, ">=": np.greater_equal}[op]
    return np.asarray(fn(a, b), dtype=bool)


#: the comparison with its operands swapped (`a < b` is `b > a`)
FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
#: result of `unsigned op negative signed` (the unsigned side is always larger)
_UNSIGNED_VS_NEGATIVE = {"=": False, "<>": True, "<": False, ">": True, "<=": False, ">=": True}


def compare(op: str, a: Value, b: Value) -> np.ndarray:
    if isinstance(a, (StringCodes, pa.Array)) or isinstance(b, (StringCodes, pa.Array)):
        if isinstance(a, StringCodes) and isinstance(b, StringCodes) and a.table is b.table \
                and op in ("=", "<>"):
            return compare_arrays(op, a.codes, b.codes)
        # byte-wise order (lowlevel.strings): codes through their ranks, the rest in Arrow
        return strings.compare(op, a, b)
    if op not in ("=", "<>") and (_is_text(a) or _is_text(b)):
        return strings.compare(op, a, b)
    if isinstance(a, tuple) or isinstance(b, tuple):
        (ah, al), (bh, bl) = promote_ip(a), promote_ip(b)
        eq = (ah == bh) & (al == bl)
        if op == "=":
            return eq
        if op == "<>":
            return ~eq
        lt = (ah < bh) | ((ah == bh) & (al < bl))
        return {"<": lt, "<=": lt | eq, ">": ~(lt | eq), ">=": ~lt}[op]
    if a.dtype == object or b.dtype == object:
        return compare_arrays(op, a, b)
    a, b = as_number(a), as_number(b)
    if a.dtype == U64 and b.dtype == I64:
        res = compare_arrays(op, a, b.astype(U64, copy=False))
        return np.where(b < 0, _UNSIGNED_VS_NEGATIVE[op], res)
    if a.dtype == I64 and b.dtype == U64:
        return compare(FLIP[op], b, a)
    return compare_arrays(op, a, b)


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
    a = as_number(a)
    dt = a.dtype.type
    b = as_number(b)
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
    if op not in FLIP:
        a, b = plain(a), plain(b)
    if op == "AND":
        return truthy(a) & truthy(b)
    if op == "OR":
        return truthy(a) | truthy(b)
    if op in FLIP:
        return compare(op, a, b)
    if op in ("<<", ">>"):
        return _shift(op, a, b)
    a, b = as_number(a), as_number(b)
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
    v = as_number(v)
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
        (ah, al), (bh, bl) = promote_ip(a), promote_ip(b)
        return (np.where(cond, ah, bh), np.where(cond, al, bl))
    if a.dtype == object or b.dtype == object:
        return np.where(cond, a, b)
    a, b = as_number(a), as_number(b)
    if a.dtype == b.dtype:
        return np.where(cond, a, b)
    dt = _arith_dtype("+", a, b)
    return np.where(cond, a.astype(dt, copy=False), b.astype(dt, copy=False))

