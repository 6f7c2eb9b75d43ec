"""Strings in the vectorised evaluator: ordering comparisons and GS-lite's string functions.

A string value is one of three things (`lowlevel.evaluate`): `StringCodes` (a record link's
strings, uint64 codes into its append-only `capture.strings.StringTable`), an Arrow binary
array (a packet payload, `TCP_data`, or a string a function computed from one), or an object
array of str (constants, the high level's result columns). No Python runs per row:

- over `StringCodes` a function whose other arguments are constants runs once per distinct
  string of the table (pyarrow.compute over `table.arrow()`), and the per-code answer is
  gathered by code; its string results are interned into the same table, so they stay codes;
- over a binary array, regular expressions are Arrow's RE2 kernels; fixed-offset byte and
  word matches, the conversions (`strtoi`, `strtoip`, `get_int`, `strid`) and suffixes at
  per-row offsets are Numba kernels over the array's offsets and bytes;
- over a literal (`strtoip_c('10.0.0.1')`) with constant other arguments, once, repeated;
- order is byte-wise lexicographic (GS-lite's `str_compare`): Arrow's order of binary and
  UTF-8 strings; codes compare through the table's dense rank of each code, kept per table
  and recomputed only when the table has grown.

Regular expressions follow GS-lite's `regcomp(REG_EXTENDED | REG_NEWLINE)` as far as RE2
allows: a search anywhere in the string, `^`/`$` at line ends (`(?m)`), `.` not matching a
newline. GS-lite gives 0 for an empty string, and so do these.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.jit import ngjit
from queries.errors import QueryError
from queries.string_functions import RegexFileError, regex_from_file

U64 = np.uint64

#: table -> (length ranked, dense rank of each code as uint64)
_RANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_ARROW_COMPARE = {"=": pc.equal, "<>": pc.not_equal, "<": pc.less, ">": pc.greater,
                  "<=": pc.less_equal, ">=": pc.greater_equal}
_FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}


def ranks(table) -> np.ndarray:
    """The dense rank (byte-wise order) of every code of `table` so far."""
    n = len(table)
    have = _RANKS.get(table)
    if have is not None and have[0] == n:
        return have[1]
    values = table.arrow()[:n]
    r = pc.rank(pc.cast(values, pa.binary()), sort_keys="ascending", tiebreaker="dense")
    out = r.to_numpy(zero_copy_only=False).astype(U64) - U64(1)     # Arrow's are 1-based
    _RANKS[table] = (n, out)
    return out


def is_codes(v: Any) -> bool:
    return type(v).__name__ == "StringCodes"


def as_binary(v: Any) -> pa.Array:
    """Any string value as an Arrow binary array, one item per row."""
    if is_codes(v):
        v = v.table.decode(v.codes)
    if isinstance(v, pa.ChunkedArray):
        v = v.combine_chunks()
    if not isinstance(v, pa.Array):
        v = pa.array(np.asarray(v, dtype=object), pa.string())
    if pa.types.is_large_binary(v.type) or pa.types.is_large_string(v.type):
        return pc.cast(v, pa.large_binary())
    return pc.cast(v, pa.binary()) if not pa.types.is_binary(v.type) else v


def texts(v: Any) -> np.ndarray:
    """A string value as an object array (bytes of a payload, str otherwise)."""
    if isinstance(v, pa.ChunkedArray):
        v = v.combine_chunks()
    if isinstance(v, pa.Array):
        return np.asarray(v.to_numpy(zero_copy_only=False), dtype=object)
    return v


def compare_literal(op: str, v: Any, text: str) -> np.ndarray | None:
    """`v op 'text'` for string codes or a binary array (None: another kind of value)."""
    if is_codes(v):
        values = v.table.arrow()
        per_code = _ARROW_COMPARE[op](pc.cast(values, pa.binary()), pa.scalar(text.encode(),
                                                                               pa.binary()))
        mask = per_code.to_numpy(zero_copy_only=False).astype(bool)
        return mask[np.asarray(v.codes, np.int64)]
    if isinstance(v, pa.Array):
        out = _ARROW_COMPARE[op](as_binary(v), pa.scalar(text.encode(), pa.binary()))
        return out.to_numpy(zero_copy_only=False).astype(bool)
    return None


def compare(op: str, a: Any, b: Any) -> np.ndarray:
    """`a op b` over two string values, byte-wise."""
    if is_codes(a) and is_codes(b) and a.table is b.table:
        r = ranks(a.table)
        ra, rb = r[np.asarray(a.codes, np.int64)], r[np.asarray(b.codes, np.int64)]
        return np.asarray({"=": np.equal, "<>": np.not_equal, "<": np.less, ">": np.greater,
                           "<=": np.less_equal, ">=": np.greater_equal}[op](ra, rb), bool)
    out = _ARROW_COMPARE[op](as_binary(a), as_binary(b))
    return out.to_numpy(zero_copy_only=False).astype(bool)


# --- the functions ---------------------------------------------------------------------------

def call(name: str, args: list[Any], constants: list[Any], n: int) -> Any:
    """GS-lite string function `name` over evaluated `args`; `constants[i]` is the Python value
    of argument i when it is a literal (None otherwise)."""
    spec = _SPECS[name]
    s_pos = spec[0]
    s = args[s_pos]
    others_constant = all(constants[i] is not None for i in range(len(args)) if i != s_pos)
    if s is None:       # a literal searched in: one value, repeated without a Python loop
        text = constants[s_pos]
        value = pa.scalar(text.encode() if isinstance(text, str) else text, pa.binary())
        if others_constant:
            return _repeat(_apply(name, pa.array([value], pa.binary()), constants, 1, args), n)
        s = pa.repeat(value, n)
    if is_codes(s) and others_constant:
        # once per distinct string of the table, then gathered by code
        table = s.table
        values = pc.cast(table.arrow(), pa.binary())
        per_code = _apply(name, values, constants, len(values), args)
        idx = np.asarray(s.codes, np.int64)
        if isinstance(per_code, pa.Array):      # a string result: codes into the same table
            mapping = table.intern_array(per_code)
            return type(s)(mapping[idx] if len(mapping) else np.zeros(len(idx), U64), table)
        return per_code[idx] if len(per_code) else np.zeros(len(idx), U64)
    out = _apply(name, as_binary(s), constants, n, args)
    if isinstance(out, pa.Array) and isinstance(s, np.ndarray):
        return _objects(out)    # over the high level's object arrays, a string result is one
    return out


def _objects(out: pa.Array) -> np.ndarray:
    """A binary result as an object array of str (bytes that are not UTF-8 replaced)."""
    try:
        text = pc.cast(out, pa.string())
    except pa.ArrowInvalid:
        return np.array([b.decode("utf-8", "replace") for b in out.to_pylist()], dtype=object)
    return np.asarray(text.to_numpy(zero_copy_only=False), dtype=object)


def _repeat(one: Any, n: int) -> Any:
    """A one-row result as n rows."""
    if isinstance(one, pa.Array):
        return pa.repeat(one[0], n)
    return np.repeat(np.asarray(one), n)


def _scalar_or_rows(v: Any, n: int, dtype) -> np.ndarray:
    if isinstance(v, (int, np.integer, bool)):
        return np.broadcast_to(np.asarray(v).astype(dtype), (n,))
    arr = np.asarray(v)
    if arr.ndim == 0:
        return np.broadcast_to(arr.astype(dtype), (n,))
    return arr.astype(dtype, copy=False)


def _ints(i: int, constants, args, n: int) -> np.ndarray:
    c = constants[i]
    return _scalar_or_rows(c if c is not None else args[i], n, np.int64)


def _text(i: int, constants, args, n: int):
    """A string argument: its bytes when constant, else a binary array over the rows."""
    c = constants[i]
    if c is not None:
        return c.encode() if isinstance(c, str) else bytes(c)
    return as_binary(args[i])


def _bool_u64(a) -> np.ndarray:
    if isinstance(a, (pa.Array, pa.ChunkedArray)):
        a = a.to_numpy(zero_copy_only=False)
    return np.asarray(a, bool).astype(U64)


def _regex(pattern: str) -> str:
    # GS-lite compiles with REG_NEWLINE: ^ and $ at line ends, . not across a newline
    return "(?m)" + pattern


def _buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n + 1], data uint8) of a binary array, zero-copy where Arrow allows."""
    if arr.offset or arr.null_count:
        arr = pa.concat_arrays([arr.fill_null(b"")]) if arr.null_count else \
            pa.concat_arrays([arr])
    bufs = arr.buffers()
    large = pa.types.is_large_binary(arr.type)
    offsets = np.frombuffer(bufs[1], np.int64 if large else np.int32)[:len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64, copy=False), data


def _apply(name: str, s: pa.Array, constants, n: int, args) -> Any:
    count = len(s)
    if name in _CONVERSIONS:
        return _convert(name, s, constants, args)
    if name in ("str_regex_match", "str_partial_regex_match", "str_extract_regex",
                "str_extract_regex_null", "str_file_regex_match"):
        target = s
        if name == "str_partial_regex_match":
            k = constants[2]
            if k is None:
                raise QueryError(f"{name}: the length must be a constant")
            target = pc.binary_slice(s, 0, max(int(k), 0))
        if name in ("str_extract_regex", "str_extract_regex_null"):
            found = pc.extract_regex(target, "(?P<m>" + _regex(constants[1]) + ")")
            return pc.fill_null(pc.struct_field(found, [0]), b"")
        pattern = _file_regex(constants[1]) if name == "str_file_regex_match" else \
            constants[1]
        hit = pc.match_substring_regex(target, _regex(pattern))
        nonempty = pc.greater(pc.binary_length(s), 0)
        return _bool_u64(pc.and_(hit, nonempty))
    if name == "str_truncate":
        k = constants[1]
        if k is None:
            raise QueryError(f"{name}: the length must be a constant")
        return pc.binary_slice(s, 0, max(int(k), 0))
    if name in ("str_exists_substr", "str_compare", "str_match_start"):
        t = _text(1, constants, args, count)
        if isinstance(t, bytes):
            if name == "str_exists_substr":
                return _bool_u64(pc.match_substring(s, t))
            if name == "str_match_start":
                return _bool_u64(pc.starts_with(s, t))
            return _bool_u64(pc.equal(s, pa.scalar(t, pa.binary())))
        if name == "str_compare":
            return _bool_u64(pc.equal(s, t))
        so, sd = _buffers(s)
        to, td = _buffers(t)
        return _contains_rows(so, sd, to, td, name == "str_match_start").astype(U64)
    offsets, data = _buffers(s)
    k = _ints(0, constants, args, count)
    if name == "str_match_offset":
        t = _text(1, constants, args, count)
        if isinstance(t, bytes):
            return _match_at(offsets, data, k, np.frombuffer(t, np.uint8)).astype(U64)
        to, td = _buffers(t)
        return _match_at_rows(offsets, data, k, to, td).astype(U64)
    value = _ints(1, constants, args, count)
    if name == "byte_match_offset":
        return _byte_at(offsets, data, k, value, False).astype(U64)
    if name == "byte_match_reverse_offset":
        return _byte_at(offsets, data, k, value, True).astype(U64)
    if name == "net_word_match_offset":
        return _word_at(offsets, data, k, value, False).astype(U64)
    if name == "little_endian_word_match_offset":
        return _word_at(offsets, data, k, value, True).astype(U64)
    raise ValueError(f"unknown string function {name}")


#: name -> (position of the string the function is computed over,)
_SPECS = {
    "str_exists_substr": (0,), "str_compare": (0,), "str_match_start": (0,),
    "str_match_offset": (2,), "byte_match_offset": (2,), "byte_match_reverse_offset": (2,),
    "net_word_match_offset": (2,), "little_endian_word_match_offset": (2,),
    "str_regex_match": (0,), "str_partial_regex_match": (0,), "str_truncate": (0,),
    "str_extract_regex": (0,), "str_extract_regex_null": (0,), "str_file_regex_match": (0,),
    "strtoi": (0,), "strtoip": (0,), "strtoi_c": (0,), "strtoip_c": (0,), "get_int": (0,),
    "get_bool": (0,), "get_suffix": (0,), "strid": (0,),
}


# --- conversions (manual 12.2) -----------------------------------------------------------------

_CONVERSIONS = ("strtoi", "strtoip", "strtoi_c", "strtoip_c", "get_int", "get_bool",
                "get_suffix", "strid")
_LOW32 = U64(0xFFFF_FFFF)


def _file_regex(path: str | None) -> str:
    """The regular expression of str_file_regex_match's file (read when the query was
    planned, `queries.string_functions.regex_from_file`)."""
    if path is None:
        raise QueryError("str_file_regex_match: the regular expression file must be a "
                         "string literal")
    try:
        return regex_from_file(path)
    except RegexFileError as exc:
        raise QueryError(f"str_file_regex_match: {exc}") from None


def _convert(name: str, s: pa.Array, constants, args) -> Any:
    count = len(s)
    offsets, data = _buffers(s)
    if name in ("strtoi", "strtoi_c"):
        values, ok = _numbers(offsets, data, 1)
        return np.where(ok, values[:, 0], U64(0))
    if name in ("strtoip", "strtoip_c"):
        return _strtoip(offsets, data)
    if name == "strid":
        return _word_from(offsets, data, np.zeros(count, np.int64), True)
    n = _ints(1, constants, args, count)
    if name == "get_suffix":      # a kernel: Arrow's binary_slice fails past some ends
        return _slices(offsets, data, np.maximum(n - 1, 0))
    # get_int(s, n): bytes n-1 .. n+2; n = 0 has no byte n-1
    word = _word_from(offsets, data, np.where(n >= 1, n - 1, -1), False)
    return word != 0 if name == "get_bool" else word


def _strtoip(offsets: np.ndarray, data: np.ndarray) -> np.ndarray:
    """GS-lite's strtoip per row: the first four runs of digits a, b, c, d (each wrapping in
    32 bits) as `a << 24 | b << 16 | c << 8 | d` in 32 bits; 0 where there are fewer."""
    values, ok = _numbers(offsets, data, 4)
    ip = U64(0)
    for k, shift in enumerate((24, 16, 8, 0)):
        ip = ip | ((values[:, k] << U64(shift)) & _LOW32)
    return np.where(ok, ip, U64(0))


def _slices(offsets: np.ndarray, data: np.ndarray, start: np.ndarray) -> pa.Array:
    """Each row's bytes from its own offset `start[i]` on, as a binary array."""
    out_offsets, out_data = _suffixes(offsets, data, start)
    count = len(start)
    if out_offsets[-1] < 2**31:
        return pa.Array.from_buffers(pa.binary(), count, [
            None, pa.py_buffer(out_offsets.astype(np.int32)), pa.py_buffer(out_data)])
    return pa.Array.from_buffers(pa.large_binary(), count, [
        None, pa.py_buffer(out_offsets), pa.py_buffer(out_data)])


# --- kernels ---------------------------------------------------------------------------------

@ngjit
def _match_at(offsets, data, k, pattern):
    """Per row: `pattern` at byte k[i] of the row's bytes (GS-lite str_match_offset)."""
    n = len(offsets) - 1
    out = np.zeros(n, np.bool_)
    m = len(pattern)
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        at = k[i]
        if at < 0 or length - at < m:
            continue
        ok = True
        for j in range(m):
            if data[start + at + j] != pattern[j]:
                ok = False
                break
        out[i] = ok
    return out


@ngjit
def _match_at_rows(offsets, data, k, toffsets, tdata):
    n = len(offsets) - 1
    out = np.zeros(n, np.bool_)
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        ts = toffsets[i]
        m = toffsets[i + 1] - ts
        at = k[i]
        if at < 0 or length - at < m:
            continue
        ok = True
        for j in range(m):
            if data[start + at + j] != tdata[ts + j]:
                ok = False
                break
        out[i] = ok
    return out


@ngjit
def _contains_rows(offsets, data, toffsets, tdata, at_start):
    """Per row: the row's needle occurs in its haystack (anywhere, or at its start)."""
    n = len(offsets) - 1
    out = np.zeros(n, np.bool_)
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        ts = toffsets[i]
        m = toffsets[i + 1] - ts
        last = 0 if at_start else length - m
        for x in range(0, last + 1):
            if x + m > length:
                break
            ok = True
            for j in range(m):
                if data[start + x + j] != tdata[ts + j]:
                    ok = False
                    break
            if ok:
                out[i] = True
                break
    return out


@ngjit
def _byte_at(offsets, data, k, value, reverse):
    """Per row: byte k[i] (from the end when `reverse`, 1 = the last) equals value[i] & 255."""
    n = len(offsets) - 1
    out = np.zeros(n, np.bool_)
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        at = length - k[i] if reverse else k[i]
        if at < 0 or at >= length:
            continue
        out[i] = data[start + at] == (value[i] & 255)
    return out


@ngjit
def _word_at(offsets, data, k, value, little):
    """Per row: the 32-bit word at byte k[i] (big- or little-endian) equals value[i]."""
    n = len(offsets) - 1
    out = np.zeros(n, np.bool_)
    for i in range(n):
        start = offsets[i]
        length = offsets[i + 1] - start
        at = k[i]
        if at < 0 or at + 4 > length:
            continue
        p = start + at
        if little:
            w = (np.int64(data[p + 3]) << 24) | (np.int64(data[p + 2]) << 16) | \
                (np.int64(data[p + 1]) << 8) | np.int64(data[p])
        else:
            w = (np.int64(data[p]) << 24) | (np.int64(data[p + 1]) << 16) | \
                (np.int64(data[p + 2]) << 8) | np.int64(data[p + 3])
        out[i] = w == (value[i] & 0xFFFFFFFF)
    return out


@ngjit
def _numbers(offsets, data, want):
    """Per row: its first `want` runs of decimal digits as GS-lite's `nextint` reads them
    (other bytes before a run skipped, the value wrapping in 32 bits), and whether the row
    has that many."""
    n = len(offsets) - 1
    values = np.zeros((n, want), np.uint64)
    ok = np.zeros(n, np.bool_)
    for i in range(n):
        p = offsets[i]
        end = offsets[i + 1]
        found = 0
        while found < want:
            while p < end and (data[p] < 48 or data[p] > 57):
                p += 1
            if p == end:
                break
            v = np.int64(0)
            while p < end and 48 <= data[p] <= 57:
                v = (v * 10 + np.int64(data[p] - 48)) & 0xFFFFFFFF
                p += 1
            values[i, found] = v
            found += 1
        ok[i] = found == want
    return values, ok


@ngjit
def _word_from(offsets, data, start, pad):
    """Per row: the big-endian 32-bit word of the 4 bytes from byte start[i]; 0 where start
    is negative or, unless `pad` (bytes past the end read as 0), where they pass the end."""
    n = len(offsets) - 1
    out = np.zeros(n, np.uint64)
    for i in range(n):
        s = offsets[i]
        length = offsets[i + 1] - s
        at = start[i]
        if at < 0 or (not pad and at + 4 > length):
            continue
        w = np.uint64(0)
        for j in range(4):
            w = w << np.uint64(8)
            if at + j < length:
                w = w | np.uint64(data[s + at + j])
        out[i] = w
    return out


@ngjit
def _suffixes(offsets, data, start):
    """(offsets, bytes) of each row's bytes from byte start[i] (>= 0) on."""
    n = len(offsets) - 1
    begin = np.empty(n, np.int64)
    out_offsets = np.zeros(n + 1, np.int64)
    for i in range(n):
        b = offsets[i] + min(start[i], offsets[i + 1] - offsets[i])
        begin[i] = b
        out_offsets[i + 1] = out_offsets[i] + offsets[i + 1] - b
    out = np.empty(out_offsets[n], np.uint8)
    for i in range(n):
        k = out_offsets[i]
        for p in range(begin[i], offsets[i + 1]):
            out[k] = data[p]
            k += 1
    return out_offsets, out


# --- MIN / MAX over strings --------------------------------------------------------------------

class StringOrder:
    """The order of one link's strings for MIN/MAX states, which must stay fixed-width.

    A MIN or MAX over a string keeps, per table slot, the dense rank of its current value in
    the byte-wise order of the link's strings, in the uint64 bank where the kernel's unsigned
    MIN/MAX ops maintain it. The table is append-only but a new string may fall between two
    old ones, so ranks are recomputed when the table has grown (once per batch at most) and
    every state holding an old rank is moved to its new rank (`refresh` gives the map); rows
    leave as text, `texts` turning ranks back into codes and codes into strings.
    """

    def __init__(self, table) -> None:
        self.table = table
        self.n = 0
        self.rank = np.zeros(0, U64)            # code -> rank
        self.code_at = np.zeros(0, np.int64)    # rank -> code

    def refresh(self) -> np.ndarray | None:
        """Rank every string of the table; old rank -> new rank when there were ranks before
        and the table grew (None: nothing to move)."""
        n = len(self.table)
        if n == self.n:
            return None
        new = ranks(self.table)
        moved = new[self.code_at] if self.n else None
        self.rank = new
        self.code_at = np.argsort(new, kind="stable").astype(np.int64)
        self.n = n
        return moved

    def ranks_of(self, codes: np.ndarray) -> np.ndarray:
        return self.rank[np.asarray(codes, np.int64)]

    def texts(self, state: np.ndarray) -> pa.Array:
        """The strings of rank values (a rank beyond the table: an empty group, '')."""
        state = np.asarray(state, U64)
        valid = state < U64(self.n)
        codes = self.code_at[np.where(valid, state, 0).astype(np.int64)] if self.n else \
            np.zeros(len(state), np.int64)
        out = self.table.decode(codes.astype(U64)) if self.n else \
            pa.array([""] * len(state), pa.string())
        return out if valid.all() else pc.if_else(pa.array(valid), out, "")


def move_ranks(column: np.ndarray, moved: np.ndarray) -> None:
    """Rewrite old ranks in a state column (a view) as new ones, in place; other values (an
    empty slot's identity) stay."""
    old = column < U64(len(moved))
    column[old] = moved[column[old].astype(np.int64)]
