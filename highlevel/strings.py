"""GS-lite's string functions (`queries.string_functions`) as Spark columns, for outputs and
HAVING over string keys and results.

Spark's strings are UTF-8 and its `binary` type is bytes: offsets and lengths are taken in
bytes by casting to binary, as the low level counts them (`lowlevel.strings`). Regular
expressions run on Java's engine here (RE2 in the low level): the patterns GS-lite's
examples use (classes, alternation, anchors) mean the same in both. The conversions find
their runs of digits with Java regular expressions (ASCII digits: the same runs as the low
level's byte scan) and wrap them in 32 bits with decimal arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from queries import expressions as E
from queries.string_functions import regex_from_file


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


_UINT32 = 4294967296
#: GS-lite's strtoip: the first four runs of digits (other characters before each skipped)
_FOUR_NUMBERS = r"^[^0-9]*([0-9]+)[^0-9]+([0-9]+)[^0-9]+([0-9]+)[^0-9]+([0-9]+)"


def _uint32(digits: Column) -> Column:
    """A run of decimal digits as C reads it into a wrapping uint32: its value modulo 2^32,
    which its last 32 digits decide (10^32 is a multiple of 2^32); '' gives 0."""
    last = F.substring(digits, -32, 32).cast("decimal(38,0)")
    value = F.pmod(last, F.lit(_UINT32).cast("decimal(38,0)")).cast("long")
    return F.when(F.length(digits) > 0, value).otherwise(F.lit(0).cast("long"))


def _strtoip(s: Column) -> Column:
    parts = [_uint32(F.regexp_extract(s, _FOUR_NUMBERS, k)) for k in (1, 2, 3, 4)]
    ip = F.lit(0).cast("long")
    for part, shift in zip(parts, (24, 16, 8, 0)):
        ip = ip.bitwiseOR(F.shiftleft(part, shift).bitwiseAND(F.lit(0xFFFFFFFF)))
    found = F.length(F.regexp_extract(s, _FOUR_NUMBERS, 4)) > 0
    return F.when(found, ip).otherwise(F.lit(0).cast("long"))


def _file_regex(node) -> str:
    """The regular expression of str_file_regex_match's file, as its query was planned with
    (`queries.string_functions.regex_from_file`; the analyser insists on a literal)."""
    path = _const(node)
    if not isinstance(path, str):
        raise ValueError("str_file_regex_match: the regular expression file must be a string "
                         "literal")
    return regex_from_file(path)


def _conversion(name: str, args: list, column: Callable[[object], Column]) -> Column:
    """strtoi, strtoip, get_int, get_bool, get_suffix, strid (and the _c forms)."""
    if name in ("strtoi", "strtoi_c"):
        return _uint32(F.regexp_extract(column(args[0]), "[0-9]+", 0))
    if name in ("strtoip", "strtoip_c"):
        return _strtoip(column(args[0]))
    data = column(args[0]).cast("binary")
    if name == "strid":         # the first 4 bytes, zero bytes past the end
        return _word(F.concat(data, F.unhex(F.lit("00000000"))), F.lit(0), False)
    n = column(args[1]).cast("long")
    if name == "get_suffix":
        return F.decode(F.substring(data, F.greatest(n, F.lit(1)), F.length(data) + 1),
                        "UTF-8")
    inside = (n >= 1) & (n + 3 <= F.length(data))
    word = F.when(inside, _word(data, n - 1, False)).otherwise(F.lit(0).cast("long"))
    return word != 0 if name == "get_bool" else word


def string_function(name: str, args: list, column: Callable[[object], Column]) -> Column:
    """The Spark column of `name(args)`; `column` compiles an argument."""
    if name in ("strtoi", "strtoip", "strtoi_c", "strtoip_c", "get_int", "get_bool",
                "get_suffix", "strid"):
        return _conversion(name, args, column)
    if name in ("str_regex_match", "str_partial_regex_match", "str_extract_regex",
                "str_extract_regex_null", "str_file_regex_match"):
        s = column(args[0])
        pattern = "(?m)" + (_file_regex(args[1]) if name == "str_file_regex_match"
                            else str(_const(args[1])))
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
