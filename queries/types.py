"""GSQL value types: result types of operators, functions and aggregates, and temporal forms.

Types: `uint`, `ullong` (unsigned), `int`, `llong` (signed), `float`, `bool`, `ip` (128-bit, two
uint64 halves), `ipv4` (a 32-bit address held in a uint64), `mac` (48-bit in a uint64), `string`.
All integer arithmetic is carried out in 64 bits (numpy uint64/int64, wrapping on overflow), so
`uint` and `ullong` differ only in the declared output type. The rules, shared by the analyser,
the vectorised evaluator and the tests' per-row oracle:

- a non-negative integer literal is `uint` (`ullong` from 2**32), a negative one `llong`;
- `+ * / % & | ^ << >>` on two unsigned operands stay unsigned; `-` on two unsigned operands
  and any mix of signed and unsigned give `llong`; anything with a float gives `float`;
- `/` on integers truncates toward zero, `%` takes the dividend's sign (C); a zero divisor
  gives 0 (never an error: one bad packet must not stop a monitor);
- shifts by a count outside 0..63 give 0 (-1 for a negative signed value shifted right);
- `bool` used as a number is 0/1; a number used as a condition is true when non-zero.

The kinds (unsigned, signed, numeric, address) and `unify` are `queries.typekinds`.
"""

from __future__ import annotations

from dataclasses import dataclass

from queries.function_library import LIBRARY_FUNCTIONS, library_function_type
from queries.stateful import STATEFUL_FUNCTIONS, stateful_type
from queries.string_functions import STRING_FUNCTIONS, string_function_type
from queries.typekinds import ADDRESS, INTEGER, NUMERIC, SIGNED, UNSIGNED, unify, unsigned_kind

#: the largest signed 64-bit integer (llong); ullong goes to 2**64 - 1
LLONG_MAX = 2**63 - 1
NS_PER_DAY = 86_400 * 10**9
#: the longest window or pane, in ns (~146 years): window ends, pane ids and offsets are
#: int64 nanoseconds, which this keeps far from overflowing
MAX_WINDOW_NS = 2**62

ALL_TYPES = ("uint", "ullong", "int", "llong", "float", "bool", "ip", "ipv4", "mac", "string")

ARITH_OPS = ("+", "-", "*", "/", "%")
BIT_OPS = ("&", "|", "^", "<<", ">>")
COMPARE_OPS = ("=", "<>", "<", ">", "<=", ">=")
LOGIC_OPS = ("AND", "OR")

#: numpy dtype name of each non-ip type when evaluated (ip is a (hi, lo) pair of uint64)
NUMPY_DTYPE = {"uint": "uint64", "ullong": "uint64", "int": "int64", "llong": "int64",
               "float": "float64", "bool": "bool", "ipv4": "uint64", "mac": "uint64",
               "string": "object", "ip": "object"}


def literal_type(kind: str, value) -> str:
    """The type of a literal of the parser's `kind` (int | float | string | bool | ip | ipv6)."""
    if kind == "int":
        if value < 0:
            return "llong"
        return "uint" if value < 2**32 else "ullong"
    return {"float": "float", "string": "string", "bool": "bool", "ip": "ipv4",
            "ipv6": "ip"}.get(kind, "string")


def binary_type(op: str, a: str, b: str) -> str | None:
    """Result type of `a op b`, or None when the operands do not fit the operator."""
    if op in LOGIC_OPS:
        return "bool" if a in INTEGER and b in INTEGER else None
    if op in COMPARE_OPS:
        if a in NUMERIC and b in NUMERIC and not (a in ADDRESS or b in ADDRESS):
            return "bool"
        if a in ADDRESS and b in ADDRESS:
            return "bool"
        if a == b == "string":
            # byte-wise lexicographic order, as GS-lite's str_compare
            return "bool"
        if a == b == "mac":
            return "bool"
        return None
    if a in ADDRESS or b in ADDRESS or "string" in (a, b) or "mac" in (a, b):
        # addresses only mask with integers (network part); everything else is meaningless
        if op == "&" and a == "ipv4" and b in INTEGER:
            return "ipv4"
        return None
    if op in BIT_OPS:
        if a not in INTEGER or b not in INTEGER:
            return None
        if op in ("<<", ">>"):
            return "llong" if a in SIGNED else unsigned_kind(a, "uint")
        if a in SIGNED or b in SIGNED:
            return "llong"
        return unsigned_kind(a, b)
    if op in ARITH_OPS:
        if a not in NUMERIC or b not in NUMERIC:
            return None
        if "float" in (a, b):
            return "float"
        if a in SIGNED or b in SIGNED or op == "-":
            return "llong"
        return unsigned_kind(a, b)
    return None


def unary_type(op: str, a: str) -> str | None:
    if op == "NOT":
        return "bool" if a in INTEGER else None
    if op == "-":
        return "float" if a == "float" else "llong" if a in INTEGER - {"ipv4", "mac"} else None
    if op == "~":
        return a if a in INTEGER - {"bool", "ipv4", "mac"} else None
    return None


#: scalar functions: name -> (argument count, description). Type rules in `function_type`.
FUNCTIONS = {
    "prefix": (2, "prefix(ip, n): the first n bits of an address (network part)"),
    "uint": (1, "UINT(x): x as unsigned 64-bit"),
    "ullong": (1, "ULLONG(x): x as unsigned 64-bit"),
    "llong": (1, "LLONG(x): x as signed 64-bit"),
    "int": (1, "INT(x): x as signed 64-bit"),
    "float": (1, "FLOAT(x): x as a float"),
    "if_else": (3, "if_else(c, a, b): a where c holds, else b"),
    "ip_str": (1, "ip_str(ip): the address as text (display only: SELECT / HAVING)"),
}
#: GS-lite's string matching functions (`queries.string_functions`)
FUNCTIONS.update({name: (len(f.params), f.doc) for name, f in STRING_FUNCTIONS.items()})
#: GS-lite's MIN/MAX, conditional, numeric and prefix functions (`queries.function_library`)
FUNCTIONS.update({name: (f.arity, f.doc) for name, f in LIBRARY_FUNCTIONS.items()})
#: functions only the high level may run (they build Python strings)
HIGH_LEVEL_ONLY = frozenset({"ip_str"})


def high_level_only(node) -> str | None:
    """Why a call (an `expressions.Func`) runs in the high level only, or None: ip_str is for
    display, and a user-defined function not declared LFTA_LEGAL stays out of the low level
    as GS-lite keeps it out of its LFTAs (`queries.udf`)."""
    if node.name in HIGH_LEVEL_ONLY:
        return "is for display"
    external = node.args.get("external")
    if external is not None and not external.lfta_legal:
        return (f"is not LFTA_LEGAL (declared at {external.declared_at}): it runs in the high "
                f"level only")
    return None


def function_type(name: str, args: list[str]) -> str | None:
    """Result type of a function call (None when the argument types do not fit)."""
    if name in STATEFUL_FUNCTIONS:
        return stateful_type(name, args)
    if name in STRING_FUNCTIONS:
        return string_function_type(name, args)
    if name in LIBRARY_FUNCTIONS:
        return library_function_type(name, args)
    if name == "prefix":
        return args[0] if args[0] in ADDRESS and args[1] in INTEGER else None
    if name in ("uint", "ullong"):
        # UINT(ip): the IPv4 address of an IPv4-mapped address (GS-lite's UINT(IP))
        return name if args[0] in NUMERIC or (name, args[0]) == ("uint", "ip") else None
    if name in ("llong", "int"):
        return name if args[0] in NUMERIC else None
    if name == "float":
        return "float" if args[0] in NUMERIC else None
    if name == "if_else":
        return unify(args[1], args[2]) if args[0] in INTEGER else None
    if name == "ip_str":
        return "string" if args[0] in ADDRESS else None
    return None


AGGREGATES = ("COUNT", "SUM", "MIN", "MAX", "AVG", "AND_AGGR", "OR_AGGR", "XOR_AGGR", "FIRST",
              "LAST", "COUNT_DISTINCT", "END_REASON")


def aggregate_type(name: str, arg: str | None) -> str | None:
    """Result type of an aggregate over an argument of type `arg` (None for count(*))."""
    if name == "COUNT":
        return "ullong"
    if name == "END_REASON":
        return "uint"
    if name == "COUNT_DISTINCT":
        return "ullong" if arg != "string" else None
    if arg is None:
        return None
    if name == "AVG":
        return "float" if arg in NUMERIC - ADDRESS else None
    if name == "SUM":
        if arg == "float":
            return "float"
        if arg in SIGNED:
            return "llong"
        return "ullong" if arg in UNSIGNED - {"ipv4", "mac"} else None
    if name in ("MIN", "MAX"):
        # strings: byte-wise order (lowlevel.strings.StringOrder keeps the state fixed-width);
        # ip (IPV6): the 128-bit unsigned order, over the (hi, lo) halves
        return arg
    if name in ("FIRST", "LAST"):
        return arg if arg not in ("ip", "string") else None
    if name in ("AND_AGGR", "OR_AGGR", "XOR_AGGR"):
        return arg if arg in INTEGER else None
    return None


@dataclass(frozen=True)
class TimeForm:
    """An increasing value as a function of the packet timestamp (ns):
    `floor((timestamp_ns + offset_ns) / pane_ns) * scale + shift`.

    `time` is TimeForm(10**9), `timestamp_ms` TimeForm(10**6), `timestamp` TimeForm(1);
    `time/60` is TimeForm(60 * 10**9); `time/60*60` TimeForm(60 * 10**9, scale=60).
    """

    pane_ns: int
    offset_ns: int = 0
    scale: int = 1
    shift: int = 0

    def divide(self, c: int) -> TimeForm | None:
        """The form of `self / c` (integer division), or None when it is not a pane form."""
        if c <= 0:
            return None
        if self.scale == 1:
            # floor((k + shift) / c) = floor((ts + off + shift*pane) / (pane*c))
            return TimeForm(self.pane_ns * c, self.offset_ns + self.shift * self.pane_ns)
        if self.scale % c == 0 and self.shift % c == 0:
            return TimeForm(self.pane_ns, self.offset_ns, self.scale // c, self.shift // c)
        if c % self.scale == 0 and self.shift % self.scale == 0:
            k = c // self.scale
            return TimeForm(self.pane_ns * k, self.offset_ns + (self.shift // self.scale) * self.pane_ns)
        return None

    def multiply(self, c: int) -> TimeForm | None:
        if c <= 0:
            return None
        return TimeForm(self.pane_ns, self.offset_ns, self.scale * c, self.shift * c)

    def add(self, c: int) -> TimeForm:
        return TimeForm(self.pane_ns, self.offset_ns, self.scale, self.shift + c)

    def overflow(self) -> str | None:
        """Why windows of this form cannot be computed in 64 bits (None: they can)."""
        if self.pane_ns > MAX_WINDOW_NS:
            return (f"its windows would last {self.pane_ns // NS_PER_DAY // 365:,} years "
                    f"(at most {MAX_WINDOW_NS // NS_PER_DAY // 365})")
        if abs(self.offset_ns) > MAX_WINDOW_NS:
            return "its offset in time is too large"
        # the value of the first and the last window a 64-bit timestamp can fall in
        for ts in (0, LLONG_MAX - max(0, self.offset_ns)):
            value = (ts + self.offset_ns) // self.pane_ns * self.scale + self.shift
            if not -LLONG_MAX - 1 <= value <= LLONG_MAX:
                return "its value does not fit in 64 bits for every capture time"
        return None


def duration_text(ns: int) -> str:
    """A length of time as people write it: `1 second`, `60 seconds`, `5 minutes`, `250 ms`."""
    units = ((3600 * 10**9, "hour"), (60 * 10**9, "minute"), (10**9, "second"),
             (10**6, "millisecond"))
    for size, name in units:
        if ns % size == 0:
            n = ns // size
            return f"{n} {name}" + ("" if n == 1 else "s")
    return f"{ns} ns"


BASE_TIME_FORMS = {
    "time": TimeForm(10**9),
    "timestamp": TimeForm(1),
    "timestamp_ms": TimeForm(10**6),
}
