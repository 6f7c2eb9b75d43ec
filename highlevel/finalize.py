"""Final expressions and HAVING: `queries.expressions` trees compiled to Spark Column expressions.

Names resolve to group keys, combined state columns (an AVG is `sum / count` over two
states; FIRST/LAST is the state's value column; COUNT(DISTINCT) is `hll_estimate(state)`) and
the temporal column of the window (`window_id * scale + shift`). IP keys are pairs of 64-bit
halves; as output they are text (dotted quad for IPv4-mapped addresses, RFC 5952 for IPv6).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pyspark.sql import Column
from pyspark.sql import functions as F

from common.jit import ngjit, ngjit_inline
from highlevel.combine import hll_estimate_col
from highlevel.errors import StageConfigError
from highlevel.ipcolumns import IpValue, ip_min_max, ip_text
from highlevel.strings import string_function
from highlevel.udfcolumns import (
    external_column,
    getlpmid_column,
    udaf_output_column,
)
from queries import expressions as E
from queries.constants import fold
from queries.function_library import MIN_MAX, PREFIX_MATCH
from queries.inference import type_of
from queries.plan import ip_words
from queries.string_functions import STRING_FUNCTIONS


class Compiler:
    """Compiles expression trees against one stage's names."""

    def __init__(self, spec, window_id: Column | None = None):
        self.spec = spec
        self.window_id = window_id if window_id is not None else F.col("window")
        self.keys = {k.name: k for k in spec.keys}
        self.states = {s.name: s for s in spec.states}
        # every state column (a UDAF's further state words `name__w1`... too)
        self.state_columns = {c for c, _ in spec.state_columns()} \
            if hasattr(spec, "state_columns") else set()
        self.finals = dict(spec.finals)
        # per division or modulo, 1 where its divisor is 0 on a branch the row takes (the
        # quotient is the defined 0; `zero_divisor_column` counts the rows)
        self.zero_terms: list[Column] = []
        self._taken: Column | None = None

    def name(self, name: str):
        w = self.spec.window
        if w.column is not None and name == w.column:
            return self.window_id * F.lit(w.scale) + F.lit(w.shift)
        if name in self.keys:
            key = self.keys[name]
            if key.type == "ip":
                return IpValue(F.col(f"{name}__hi"), F.col(f"{name}__lo"))
            return F.col(name)
        if name in self.states and self.states[name].dtype == "ip":
            return IpValue(*(F.col(w) for w in ip_words(name)))
        if name in self.states or name in self.state_columns:
            return F.col(name)
        if name in self.finals:
            return self.compile(self.finals[name])
        known = sorted(set(self.keys) | set(self.states) | ({w.column} if w.column else set()))
        raise StageConfigError(f"query {self.spec.query!r}: unknown name `{name}` in an output "
                               f"or HAVING expression; known: {', '.join(known)}")

    def compile(self, node) -> Column | IpValue:
        method = getattr(self, f"_{type(node).__name__.lower()}", None)
        if method is None:
            raise StageConfigError(f"query {self.spec.query!r}: {type(node).__name__} cannot be "
                                   f"evaluated in the high level ({node!r})")
        return method(node)

    def column(self, node) -> Column:
        """A plain Spark column (IP values become text)."""
        value = self.compile(node)
        return ip_text(value) if isinstance(value, IpValue) else value

    # --- node kinds --------------------------------------------------------------------------
    def _literal(self, node):
        kind, value = node.kind, node.value
        if kind == "ip":
            return IpValue(F.lit(0), F.lit(0xFFFF_0000_0000 | int(value)))
        if kind == "ipv6":
            hi, lo = int(value) >> 64, int(value) & ((1 << 64) - 1)
            return IpValue(F.lit(_signed(hi)), F.lit(_signed(lo)))
        if kind == "int" and value >= 1 << 63:
            # a ullong above the int64 range: Spark has no unsigned type, so the value travels
            # as its bit pattern, as every uint64 column does (common/spool.py "Types")
            return F.lit(_signed(int(value)))
        return F.lit(value)

    def _column(self, node):
        return self.name(node.name)

    def _field(self, node):
        # a resolved reference of the planner: a key, the window column, a final or a state
        return self.name(node.name)

    def _unary(self, node):
        if node.op == "-" and isinstance(node.this, E.Literal) and node.this.kind == "int":
            # a negative literal: one constant (negating -2^63 would overflow in ANSI mode)
            return F.lit(_signed(-int(node.this.value) & _MASK))
        this = self.column(node.this)
        return {"-": lambda: -this, "~": lambda: F.bitwise_not(this),
                "NOT": lambda: ~this}[node.op.upper() if node.op.isalpha() else node.op]()

    def _binary(self, node):
        left, right = self.compile(node.left), self.compile(node.right)
        op = node.op.upper()
        if isinstance(left, IpValue) or isinstance(right, IpValue):
            if not (isinstance(left, IpValue) and isinstance(right, IpValue)) or \
                    op not in ("=", "<>"):
                raise StageConfigError(f"query {self.spec.query!r}: IP values only compare "
                                       f"with = or <> to IP values ({node!r})")
            same = (left.hi == right.hi) & (left.lo == right.lo)
            return same if op == "=" else ~same
        if op in _COMPARE:
            return self._compare(node, op, left, right)
        if op in ("/", "%") and not self._never_zero(node.right):
            zero = right == 0
            self.zero_terms.append(zero if self._taken is None else zero & self._taken)
        ops = {
            "+": lambda: left + right, "-": lambda: left - right, "*": lambda: left * right,
            # a zero divisor gives 0 in every path (queries/types.py), never Spark's
            # DIVIDE_BY_ZERO: a divisor that is 0 on some rows must not stop the query
            "/": lambda: F.when(right == 0, F.lit(0)).otherwise(left / right),
            "%": lambda: F.when(right == 0, F.lit(0)).otherwise(left % right),
            "&": lambda: left.bitwiseAND(right), "|": lambda: left.bitwiseOR(right),
            "^": lambda: left.bitwiseXOR(right),
            "<<": lambda: F.shiftleft(left, _shift_bits(node)),
            ">>": lambda: F.shiftright(left, _shift_bits(node)),
            "AND": lambda: left & right, "OR": lambda: left | right,
        }
        if op not in ops:
            raise StageConfigError(f"query {self.spec.query!r}: operator {node.op!r} is not "
                                   f"supported in the high level")
        return ops[op]()

    def _never_zero(self, node) -> bool:
        """A COUNT state: at least 1 in every row of a group (AVG's divisor)."""
        state = self.states.get(getattr(node, "name", None)) \
            if isinstance(node, (E.Column, E.Field)) else None
        return state is not None and state.kind == "count"

    def _compare(self, node, op: str, left: Column, right: Column) -> Column:
        """`left op right` as the vectorised evaluator compares (`lowlevel.values.compare`):
        a 64-bit unsigned value is compared as unsigned, though Spark holds it in a long."""
        unsigned = [_unsigned64(self._type(x)) for x in (node.left, node.right)]
        if unsigned == [True, True]:
            # flipping the sign bit maps uint64 order onto int64 order (the cast: a count of
            # distinct values is a Spark double holding an integer)
            left, right = (x.cast("long").bitwiseXOR(F.lit(_INT64_MIN)) for x in (left, right))
        elif True in unsigned:
            # an unsigned value of 2^63 or more (negative as a long) exceeds every signed one
            big = (left if unsigned[0] else right) < F.lit(0)
            result = _COMPARE[op](left, right)
            when_big = _UNSIGNED_ABOVE[op] if unsigned[0] else _UNSIGNED_ABOVE[_FLIP[op]]
            return F.when(big, F.lit(when_big)).otherwise(result)
        return _COMPARE[op](left, right)

    def _type(self, node) -> str:
        """The GSQL type of a planned expression (`llong` for names that carry none)."""
        return type_of(node)

    def _in(self, node):
        this = self.column(node.this)
        return this.isin([self.column(i) for i in node.items])

    def _func(self, node):
        name, args = node.name.lower(), list(node.args["args"] or [])
        if name in ("hll_estimate", "count_distinct"):
            (arg,) = args
            if not isinstance(arg, (E.Column, E.Field)) or \
                    arg.name not in self.states:
                raise StageConfigError(f"query {self.spec.query!r}: {name}() takes a "
                                       f"COUNT_DISTINCT state column ({node!r})")
            return F.round(hll_estimate_col(arg.name, self.spec.distinct_registers))
        if name == "ip_str":
            return self.column(args[0])
        if name == "udaf_output":
            # a user-defined aggregate's `output` over its combined state words
            return udaf_output_column(node.external, [self.column(a) for a in args])
        if node.external is not None:
            return external_column(node, self.compile, self.spec.query)
        if name in PREFIX_MATCH:
            return getlpmid_column(args[1].value, self.compile(args[0]))
        if name == "if":
            return self._func(node.replace(name="if_else"))
        if name in MIN_MAX:
            a, b = self.compile(args[0]), self.compile(args[1])
            if isinstance(a, IpValue) and isinstance(b, IpValue):
                return ip_min_max(name, a, b)
            op = "<" if name.endswith("min") else ">"
            first = self._compare(E.Binary(op=op, left=args[0], right=args[1]), op, a, b)
            return F.when(first, a).otherwise(b)
        if name in ("eq", "geq", "leq"):
            op = {"eq": "=", "geq": ">=", "leq": "<="}[name]
            a, b = self.compile(args[0]), self.compile(args[1])
            if isinstance(a, IpValue) and isinstance(b, IpValue):
                return self._binary(E.Binary(op=op, left=args[0], right=args[1])).cast("long")
            return self._compare(E.Binary(op=op, left=args[0], right=args[1]), op, a,
                                 b).cast("long")
        if name == "non_temporal":
            return self.compile(args[0])
        if name == "sqrt":
            return F.sqrt(self.column(args[0]).cast("double"))
        if name == "uint" and self._type(args[0]) == "ip":
            value = self.compile(args[0])
            assert isinstance(value, IpValue)
            return value.lo.bitwiseAND(F.lit(0xFFFF_FFFF))
        if name == "if_else":
            cond, outer = self.column(args[0]), self._taken
            try:
                self._taken = cond if outer is None else cond & outer
                a = self.column(args[1])
                self._taken = ~cond if outer is None else ~cond & outer
                b = self.column(args[2])
            finally:
                self._taken = outer
            return F.when(cond, a).otherwise(b)
        casts = {"int": "long", "llong": "long", "uint": "long", "ullong": "long",
                 "float": "double", "double": "double", "string": "string", "str": "string"}
        if name in casts:
            return self.column(args[0]).cast(casts[name])
        if name == "abs":
            return F.abs(self.column(args[0]))
        if name in STRING_FUNCTIONS:
            return string_function(name, args, self.column)
        raise StageConfigError(f"query {self.spec.query!r}: function {name}() is not available "
                               f"in the high level")

    def _aggregate(self, node):
        raise StageConfigError(f"query {self.spec.query!r}: aggregate {node.name} must be "
                               f"rewritten to its state columns before the high level "
                               f"(e.g. AVG(x) -> sum_x / count)")


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_MASK = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_COMPARE = {"=": lambda a, b: a == b, "<>": lambda a, b: a != b, "<": lambda a, b: a < b,
            ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}
_FLIP = {"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
#: `u op s` when the unsigned u is at least 2^63, whatever the signed s
_UNSIGNED_ABOVE = {"=": False, "<>": True, "<": False, ">": True, "<=": False, ">=": True}


def _unsigned64(gsql_type: str | None) -> bool:
    # bool is unsigned too, but a Spark boolean; addresses are compared whole
    return gsql_type in ("uint", "ullong", "mac")


def _shift_bits(node) -> int:
    # Spark's shift functions take a constant bit count (the planner refuses constant counts
    # outside 0..63)
    value = fold(node.right)
    if value is None or value[0] == "f":
        raise StageConfigError(f"shift by a non-constant amount is not supported ({node!r})")
    return int(value[1])


def output_columns(spec, window_id: Column | None = None) -> list[Column]:
    """The SELECT list as Spark columns, cast to the output types.

    An `ip` output that is a bare IP key (or `ip_str(key)`) is selected as its two halves
    `name__hi`, `name__lo` and turned into text on the driver (`ip_text_arrow`): the text
    expression is large and costs more in Spark's per-batch planning than the formatting.
    """
    compiler = Compiler(spec, window_id)
    cols = []
    for out in spec.outputs:
        value = compiler.compile(unwrap_ip_str(out.expr))
        if out.type == "ip" and isinstance(value, IpValue):
            cols += [value.hi.alias(f"{out.name}__hi"), value.lo.alias(f"{out.name}__lo")]
            continue
        c = ip_text(value) if isinstance(value, IpValue) else value
        spark_type = {"int64": "long", "uint64": "long", "float64": "double",
                      "string": "string", "bool": "boolean", "ip": "string"}[out.type]
        cols.append(c.cast(spark_type).alias(out.name))
    if spec.having is not None:
        compiler.column(spec.having)        # for its divisions only
    if compiler.zero_terms:
        cols.append(zero_divisor_column(compiler.zero_terms))
    return cols


#: the hidden output column that is true on a row whose outputs or HAVING met a zero divisor
ZERO_DIVISORS = "__zero_divisors"


def zero_divisor_column(terms: list[Column]) -> Column:
    hit = terms[0]
    for t in terms[1:]:
        hit = hit | t
    return F.coalesce(hit, F.lit(False)).alias(ZERO_DIVISORS)


def unwrap_ip_str(node):
    if isinstance(node, E.Func) and node.name.lower() == "ip_str":
        return node.args["args"][0]
    return node


def having_column(spec, window_id: Column | None = None) -> Column | None:
    if spec.having is None:
        return None
    return Compiler(spec, window_id).column(spec.having)


def ip_text_arrow(hi: pa.Array, lo: pa.Array) -> pa.Array:
    """Text of addresses given as int64 bit patterns of the uint64 halves: a.b.c.d when
    IPv4-mapped, otherwise RFC 5952 (lower-case hex, the first longest run of two or more zero
    groups as `::`), as `ipaddress` writes them; null where `hi` or `lo` is null.

    The kernel `write_ip_text` writes the string array's offsets and UTF-8 bytes directly, no
    Python object per address: `ipaddress`, or a table of text pieces joined by Arrow, took
    many times as long for a column of flow records (docs/performance.md).
    """
    n = len(hi)
    if n > _IP_TEXT_ROWS:   # int32 offsets address 2 GiB of text: longer columns by pieces
        step = _IP_TEXT_ROWS
        return pa.concat_arrays([ip_text_arrow(hi.slice(s, step), lo.slice(s, step))
                                 for s in range(0, n, step)])
    h, l = (np.asarray(a.fill_null(0) if a.null_count else a).view(np.uint64) for a in (hi, lo))
    has_nulls = hi.null_count > 0 or lo.null_count > 0
    valid = np.asarray(hi.is_valid()) & np.asarray(lo.is_valid()) if has_nulls \
        else np.ones(0, np.bool_)
    offsets = np.empty(n + 1, np.int32)
    data = np.empty(n * IP_TEXT_WIDTH, np.uint8)   # untouched pages are never mapped
    size = write_ip_text(h, l, valid, offsets, data)
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if has_nulls else None
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data[:size].copy()),
                                       bitmap, n - int(valid.sum()) if has_nulls else 0)


# --- the kernel of ip_text_arrow -----------------------------------------------------------------
# As in `tools.results.csvwrite`: indices cast to unsigned (`_U(o)`) skip Numba's negative-index
# wraparound, and the loop writes `data` itself (helpers taking arrays left reference-count calls
# in it). Each octet or group is stored as one 4-byte word and `o` advances by its length: the
# bytes past it are overwritten by what follows (one store instead of a loop per digit).
#: the longest text of an address: 8 groups of 4 hex digits and 7 colons
IP_TEXT_WIDTH = 39
_IP_TEXT_ROWS = (2**31 - 1) // IP_TEXT_WIDTH
_U = np.uint64
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_OCTET_TEXT = np.frombuffer(b"".join(b"%-4d" % v for v in range(256)), np.uint8).reshape(256, 4)
_OCTET_LENGTH = np.array([len(str(v)) for v in range(256)], np.int64)


@ngjit
def write_ip_text(h, l, valid, offsets, data):
    """Text of each address (h[i], l[i]) into an Arrow string array's buffers: `offsets` (n + 1
    int32) and `data` (room for IP_TEXT_WIDTH bytes per address). A row whose `valid` is False
    (when `valid` is not empty) stays empty. Returns the number of bytes written."""
    o = 0
    offsets[0] = 0
    for i in range(len(h)):
        if len(valid) and not valid[i]:
            offsets[i + 1] = o
            continue
        if h[i] == 0 and (l[i] >> _U(32)) == _U(0xFFFF):    # IPv4-mapped: a.b.c.d
            for k in range(4):
                data[_U(o)] = 46   # '.' (overwritten by the first octet)
                o += k > 0
                v = _U((l[i] >> _U(24 - 8 * k)) & _U(0xFF))
                word = (_OCTET_TEXT[v, 0], _OCTET_TEXT[v, 1], _OCTET_TEXT[v, 2],
                        _OCTET_TEXT[v, 3])
                for t in range(4):
                    data[_U(o + t)] = word[t]
                o += _OCTET_LENGTH[v]
        else:   # groups joined by ':', the run of zero groups (if any) as '::'
            start, length = _zero_run(h[i], l[i])
            for j in range(8):
                if length and start <= j < start + length:
                    if j == start:
                        data[_U(o)] = 58   # ':'
                        data[_U(o + 1)] = 58
                        o += 2
                    continue
                data[_U(o)] = 58
                o += j > 0 and not (length and j == start + length)
                g = _address_group(h[i], l[i], j)
                word = _U(0)
                for t in range(4):   # the 4 hex digits, the first in the low byte
                    word |= _U(_HEX_DIGITS[_U((g >> (12 - 4 * t)) & 0xF)]) << _U(8 * t)
                size = _hex_digits(g)
                word >>= _U(8 * (4 - size))   # without leading zeros
                for t in range(4):
                    data[_U(o + t)] = np.uint8(word >> _U(8 * t))
                o += size
        offsets[i + 1] = o
    return o


@ngjit_inline
def _zero_run(h, l):
    """(start, length) of the first longest run of two or more zero groups; (0, 0) if none."""
    best_start, best_length, run = 0, 0, 0
    for j in range(8):
        if _address_group(h, l, j) == 0:
            run += 1
            if run > best_length:   # strictly longer: of equal runs the leftmost stays
                best_start, best_length = j - run + 1, run
        else:
            run = 0
    if best_length < 2:
        return 0, 0
    return best_start, best_length


@ngjit_inline
def _address_group(h, l, j):
    """The 16-bit group j (0 the most significant) of the address (h, l)."""
    half = h if j < 4 else l
    return np.int64((half >> np.uint64(48 - 16 * (j % 4))) & np.uint64(0xFFFF))


@ngjit_inline
def _hex_digits(g):
    """Hex digits of a 16-bit group without leading zeros."""
    return 4 if g >= 0x1000 else 3 if g >= 0x100 else 2 if g >= 0x10 else 1
