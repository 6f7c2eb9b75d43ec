"""IP addresses as Spark columns: two longs holding the uint64 halves, their text and UMIN/UMAX.

Shared by the final expressions (`highlevel.finalize`) and the library's and user-defined
functions' columns (`highlevel.udfcolumns`), which both pass addresses around as `IpValue`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

_INT64_MIN = -(1 << 63)


@dataclass(frozen=True)
class IpValue:
    """An IP address as two int64 columns holding the uint64 halves."""

    hi: Column
    lo: Column


def _group(half: Column, index: int) -> Column:
    return F.lower(F.hex(F.shiftrightunsigned(half, 48 - 16 * index).bitwiseAND(F.lit(0xFFFF))))


def ip_text(ip: IpValue) -> Column:
    """Text form of an address: a.b.c.d when IPv4-mapped (hi = 0, lo >> 32 = 0xFFFF)."""
    v4 = F.concat_ws(".", *[F.shiftrightunsigned(ip.lo, s).bitwiseAND(F.lit(255)).cast("string")
                            for s in (24, 16, 8, 0)])
    groups = [_group(ip.hi, i) for i in range(4)] + [_group(ip.lo, i) for i in range(4)]
    framed = F.concat(F.lit(":"), F.concat_ws(":", *groups), F.lit(":"))
    # RFC 5952: the first longest run of two or more zero groups becomes `::`
    compressed = framed
    for run in range(2, 9):
        pattern = ":" + "0:" * run
        pos = F.locate(pattern, framed)
        cut = F.concat(framed.substr(F.lit(1), pos - 1), F.lit("::"),
                       framed.substr(pos + len(pattern), F.lit(64)))
        compressed = F.when(pos > 0, cut).otherwise(compressed)
    text = F.regexp_replace(F.regexp_replace(compressed, "^:(?!:)", ""), "(?<!:):$", "")
    mapped = (ip.hi == 0) & (F.shiftrightunsigned(ip.lo, 32) == F.lit(0xFFFF))
    return F.when(mapped, v4).otherwise(text)


def _unsigned_less(a: Column, b: Column) -> Column:
    """a < b for longs holding uint64 bit patterns (flipping the sign bit maps the orders)."""
    return a.bitwiseXOR(F.lit(_INT64_MIN)) < b.bitwiseXOR(F.lit(_INT64_MIN))


def ip_min_max(name: str, a: IpValue, b: IpValue) -> IpValue:
    """UMIN/UMAX of two addresses: compared as 128-bit unsigned numbers."""
    less = _unsigned_less(a.hi, b.hi) | ((a.hi == b.hi) & _unsigned_less(a.lo, b.lo))
    first = less if name.endswith("min") else ~less & ~((a.hi == b.hi) & (a.lo == b.lo))
    return IpValue(F.when(first, a.hi).otherwise(b.hi), F.when(first, a.lo).otherwise(b.lo))
