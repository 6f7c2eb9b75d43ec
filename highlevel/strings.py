"""GS-lite's string functions (`queries.string_functions`) as Spark columns, for outputs and
HAVING over string keys and results.

Spark's strings are UTF-8 and its `binary` type is bytes: offsets and lengths are taken in
bytes by casting to binary, as the low level counts them (`lowlevel.strings`). Regular
expressions run on Java's engine here (RE2 in the low level): the patterns GS-lite's
examples use (classes, alternation, anchors) mean the same in both.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from queries import expressions as E


def _flag(cond: Column) -> Column:
    return F.when(cond, F.lit(1)).otherwise(F.lit(0)).cast("long")


def _const(node) -> object:
    return node.value if isinstance(node, E.Literal) else None


def _count(node) -> int:
    """A constant length argument (the analyser and `lowlevel.strings` insist on one)."""
    value = _const(node)
    return max(int(value), 0) if isinstance(value, int) else 0


def _byte_at(data: Column, at: Column) -> Column:
    """The unsigned byte of `data` (binary) at 0-based `at` (valid where 0 <= at < length)."""
    return F.conv(F.hex(F.substring(data, at + 1, 1)), 16, 10).cast("long")


def _word(data: Column, at: Column, little: bool) -> Column:
    b = [_byte_at(data, at + i) for i in range(4)]
    if little:
        b.reverse()
    return b[0] * 16777216 + b[1] * 65536 + b[2] * 256 + b[3]


def string_function(name: str, args: list, column: Callable[[object], Column]) -> Column:
    """The Spark column of `name(args)`; `column` compiles an argument."""
    if name in ("str_regex_match", "str_partial_regex_match", "str_extract_regex",
                "str_extract_regex_null"):
        s = column(args[0])
        pattern = "(?m)" + str(_const(args[1]))
        if name == "str_partial_regex_match":
            s = F.substring(s, 1, _count(args[2]))
        if name in ("str_extract_regex", "str_extract_regex_null"):
            return F.regexp_extract(s, pattern, 0)
        return _flag(s.rlike(pattern) & (F.length(s) > 0))
    if name == "str_truncate":
        s = column(args[0]).cast("binary")
        return F.decode(F.substring(s, 1, _count(args[1])), "UTF-8")
    if name == "str_exists_substr":
        return _flag(F.instr(column(args[0]), column(args[1])) > 0)
    if name == "str_compare":
        return _flag(column(args[0]) == column(args[1]))
    if name == "str_match_start":
        return _flag(column(args[0]).startswith(column(args[1])))
    at = column(args[0]).cast("long")
    data = column(args[2]).cast("binary")
    size = F.length(data)
    if name == "str_match_offset":
        t = column(args[1]).cast("binary")
        return _flag((at >= 0) & (size - at >= F.length(t))
                     & (F.substring(data, at + 1, F.length(t)) == t))
    value = column(args[1]).cast("long")
    if name in ("byte_match_offset", "byte_match_reverse_offset"):
        pos = size - at if name == "byte_match_reverse_offset" else at
        return _flag((pos >= 0) & (pos < size) & (_byte_at(data, pos) == value % 256))
    little = name == "little_endian_word_match_offset"
    return _flag((at >= 0) & (at + 4 <= size)
                 & (_word(data, at, little) == value.bitwiseAND(F.lit(0xFFFFFFFF))))
