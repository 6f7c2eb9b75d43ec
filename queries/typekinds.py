"""GSQL's kinds of types (unsigned, signed, integer, numeric, address) and the common type of two.

The kinds are what the type rules of `queries.types` and of the function library
(`queries.function_library`) test operands against; `unify` is the common type of two
branches (`if_else`, `IF`), two IN items or two MIN/MAX operands.
"""

from __future__ import annotations

UNSIGNED = frozenset({"uint", "ullong", "bool", "mac", "ipv4"})
SIGNED = frozenset({"int", "llong"})
INTEGER = UNSIGNED | SIGNED
NUMERIC = INTEGER | {"float"}
ADDRESS = frozenset({"ip", "ipv4"})


def unsigned_kind(a: str, b: str) -> str:
    """The unsigned result type of two unsigned operands: `ullong` when either is one."""
    return "ullong" if "ullong" in (a, b) else "uint"


def unify(a: str, b: str) -> str | None:
    """The common type of two branches (if_else) or IN items, or None."""
    if a == b:
        return a
    if a in ADDRESS and b in ADDRESS:
        return "ip"
    if a in NUMERIC - ADDRESS and b in NUMERIC - ADDRESS:
        if "float" in (a, b):
            return "float"
        if a in SIGNED or b in SIGNED:
            return "llong"
        return unsigned_kind(a, b)
    return None
