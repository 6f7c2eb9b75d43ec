"""GS-lite's scalar function library (Tigon SQL manual chapters 12 and 13): names, arities, result types.

- MIN/MAX (13.1): `UMIN`, `UMAX`, `LLMIN`, `LLMAX` of two numbers or two addresses. GS-lite
  declares them per type pair (`UMAX(uint, uint)`, `UMAX(IP, IP)`, `UMAX(FLOAT, uint)` ...);
  here they take any two numbers and give their common type (`queries.typekinds.unify`), and the
  LL forms at least a `ullong`. Mixed signed and unsigned values are compared exactly, as `<`
  compares them.
- Conditional assignment (13.7) and comparisons (12.2): `IF(c, a, b)` is `if_else(c, a, b)`;
  `EQ`, `GEQ`, `LEQ` give the uint 1 or 0.
- Typecasts (13.6): `INT`, `UINT`, `LLONG`, `ULLONG`, `FLOAT` are built in
  (`queries.types.FUNCTIONS`); `UINT(ip)` is the IPv4 address of an address; `non_temporal(x)`
  is x without its time form (it no longer counts as a temporal group key).
- Numeric: `sqrt(x)`, a float (NaN for a negative x, as C's sqrt).
- Prefix functions (12.3): `getlpmid(ip, 'file')` and `getv6lpmid(ip, 'file')`, the id of the
  longest prefix of a prefix file holding the address (-1: none), `lowlevel.lpm`. The file is a
  HANDLE parameter: a constant string, read once per query.

Evaluation: `lowlevel.library` (numpy, both levels' Python paths), `highlevel.finalize` (Spark
columns; getlpmid as an Arrow UDF, `highlevel.udfcolumns`), and the tests' reference evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass

from queries.typekinds import unify

ADDRESS = ("ip", "ipv4")
_INTEGER = ("uint", "ullong", "int", "llong", "bool", "mac", "ipv4")
_NUMBERS = ("uint", "ullong", "int", "llong", "bool", "float")


@dataclass(frozen=True)
class LibraryFunction:
    name: str
    arity: int
    doc: str


LIBRARY_FUNCTIONS: dict[str, LibraryFunction] = {f.name: f for f in (
    LibraryFunction("umin", 2, "UMIN(a, b): the smaller of two numbers or addresses"),
    LibraryFunction("umax", 2, "UMAX(a, b): the larger of two numbers or addresses"),
    LibraryFunction("llmin", 2, "LLMIN(a, b): the smaller of two numbers (at least a ullong)"),
    LibraryFunction("llmax", 2, "LLMAX(a, b): the larger of two numbers (at least a ullong)"),
    LibraryFunction("if", 3, "IF(c, a, b): a where c is not 0, else b (if_else)"),
    LibraryFunction("eq", 2, "EQ(a, b): 1 when a = b, else 0"),
    LibraryFunction("geq", 2, "GEQ(a, b): 1 when a >= b, else 0"),
    LibraryFunction("leq", 2, "LEQ(a, b): 1 when a <= b, else 0"),
    LibraryFunction("non_temporal", 1, "non_temporal(x): x, no longer temporal"),
    LibraryFunction("sqrt", 1, "sqrt(x): the square root of x (a float)"),
    LibraryFunction("getlpmid", 2, "getlpmid(ip, 'prefix_file'): the id of the longest "
                    "prefix of the file holding ip, -1 when none does"),
    LibraryFunction("getv6lpmid", 2, "getv6lpmid(ip, 'prefix_file'): getlpmid for IPv6 "
                    "addresses (the same function here)"),
)}

#: functions whose argument at this index must be a constant string (a GS-lite HANDLE)
HANDLE_ARGUMENTS = {"getlpmid": 1, "getv6lpmid": 1}
MIN_MAX = ("umin", "umax", "llmin", "llmax")
PREFIX_MATCH = ("getlpmid", "getv6lpmid")


def library_function_type(name: str, args: list[str]) -> str | None:
    """Result type of a call of a library function (None: the argument types do not fit)."""
    if name in MIN_MAX:
        a, b = args
        if a in ADDRESS and b in ADDRESS:
            return None if name.startswith("ll") else unify(a, b)
        if a not in _NUMBERS or b not in _NUMBERS:
            return None
        t = unify("uint" if a == "bool" else a, "uint" if b == "bool" else b)
        return "ullong" if name.startswith("ll") and t == "uint" else t
    if name == "if":
        return unify(args[1], args[2]) if args[0] in _INTEGER else None
    if name in ("eq", "geq", "leq"):
        a, b = args
        if (a in ADDRESS) != (b in ADDRESS) or "string" in (a, b) or "mac" in (a, b):
            return None
        return "uint"
    if name == "non_temporal":
        return args[0]
    if name == "sqrt":
        return "float" if args[0] in _NUMBERS else None
    if name in PREFIX_MATCH:
        return "int" if args[0] in ADDRESS and args[1] == "string" else None
    return None
