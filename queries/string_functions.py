"""GS-lite's string matching functions and predicates: names, signatures and result types.

Source: GS-lite's `cfg/external_fcns.def` (PRED and FUN entries) and the Tigon SQL manual,
chapter 12.2 "String Matching and Extraction". Every predicate is also a function returning
the uint 1 or 0 (manual 12.2.2), so `str_match_offset[0, 'GET', TCP_data]` and
`str_match_offset(0, 'GET', TCP_data) = 1` mean the same. A `string` argument is a record
string or a packet payload (`TCP_data`, `UDP_data`); a HANDLE argument (a regular
expression) must be a constant, as GS-lite registers it once per query.

The evaluation lives in `lowlevel.strings` (numpy, pyarrow.compute, Numba) and, for the high
level, in `highlevel.finalize`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StringFunction:
    """One GS-lite string function: argument kinds (`string`, `uint`, `pattern` for a
    constant regular expression, `count` for a constant length) and its result type."""

    name: str
    params: tuple[str, ...]
    result: str
    doc: str
    predicate: bool = True      # also GS-lite predicate syntax `name[...]`


_UINT = ("uint", "ullong", "int", "llong", "bool")

STRING_FUNCTIONS: dict[str, StringFunction] = {f.name: f for f in (
    StringFunction("str_exists_substr", ("string", "string"), "uint",
                   "str_exists_substr(s, t): 1 when t occurs in s"),
    StringFunction("str_compare", ("string", "string"), "uint",
                   "str_compare(s, t): 1 when s and t are equal"),
    StringFunction("str_match_start", ("string", "string"), "uint",
                   "str_match_start(s, t): 1 when s starts with t"),
    StringFunction("str_match_offset", ("uint", "string", "string"), "uint",
                   "str_match_offset(k, t, s): 1 when t occurs in s at byte k"),
    StringFunction("byte_match_offset", ("uint", "uint", "string"), "uint",
                   "byte_match_offset(k, b, s): 1 when byte k of s is b"),
    StringFunction("byte_match_reverse_offset", ("uint", "uint", "string"), "uint",
                   "byte_match_reverse_offset(k, b, s): 1 when byte k from the end of s (1: "
                   "the last) is b"),
    StringFunction("net_word_match_offset", ("uint", "uint", "string"), "uint",
                   "net_word_match_offset(k, w, s): 1 when the 32-bit big-endian word at byte "
                   "k of s is w"),
    StringFunction("little_endian_word_match_offset", ("uint", "uint", "string"), "uint",
                   "little_endian_word_match_offset(k, w, s): 1 when the 32-bit little-endian "
                   "word at byte k of s is w"),
    StringFunction("str_regex_match", ("string", "pattern"), "uint",
                   "str_regex_match(s, 're'): 1 when the regular expression matches somewhere "
                   "in s"),
    StringFunction("str_partial_regex_match", ("string", "pattern", "count"), "uint",
                   "str_partial_regex_match(s, 're', n): str_regex_match over the first n "
                   "bytes of s"),
    StringFunction("str_truncate", ("string", "count"), "string",
                   "str_truncate(s, n): the first n bytes of s", predicate=False),
    StringFunction("str_extract_regex", ("string", "pattern"), "string",
                   "str_extract_regex(s, 're'): the first match of the regular expression in "
                   "s; a row where it does not match is discarded (queries.partial_functions)",
                   predicate=False),
    StringFunction("str_extract_regex_null", ("string", "pattern"), "string",
                   "str_extract_regex_null(s, 're'): the first match of the regular "
                   "expression in s, '' when none", predicate=False),
)}

#: argument kinds that must be constants: a regular expression (a GS-lite HANDLE), a length
PATTERN = "pattern"
COUNT = "count"


def string_function_type(name: str, args: list[str]) -> str | None:
    """Result type of a call of a string function (None: the argument types do not fit)."""
    f = STRING_FUNCTIONS[name]
    if len(args) != len(f.params):
        return None
    for want, got in zip(f.params, args):
        if want in ("string", PATTERN) and got != "string":
            return None
        if want in ("uint", COUNT) and got not in _UINT:
            return None
    return f.result


def arity(name: str) -> int:
    return len(STRING_FUNCTIONS[name].params)
