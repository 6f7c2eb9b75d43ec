"""GS-lite's string matching and conversion functions: names, signatures and result types.

Source: GS-lite's `cfg/external_fcns.def` (PRED and FUN entries) and the Tigon SQL manual,
chapter 12 (12.1 string matching, 12.2 conversions). Every predicate is also a function
returning the uint 1 or 0 (manual 12.2.2), so `str_match_offset[0, 'GET', TCP_data]` and
`str_match_offset(0, 'GET', TCP_data) = 1` mean the same. A `string` argument is a record
string or a packet payload (`TCP_data`, `UDP_data`); a HANDLE argument (a regular
expression, the constant string of `strtoi_c`, the file of `str_file_regex_match`) must be a
constant, as GS-lite registers it once per query.

The conversions (manual 12.2) read what GS-lite's C library reads: `strtoi` the first run of
decimal digits (leading other bytes skipped, the number wrapping in 32 bits), `strtoip` the
first four runs as the bytes of an IPv4 address; where GS-lite's call fails (no digits, fewer
than four numbers) they give 0, as GS-lite's `strtoi_c` and `strtoip_c` do for a constant.
`get_int(s, n)` is the big-endian word of the bytes n-1 .. n+2 (n counts from 1), `strid(s)`
the same of the first 4 bytes. `str_file_regex_match` reads its regular expression from a
file when the query is planned (`regex_from_file`).

The evaluation lives in `lowlevel.strings` (numpy, pyarrow.compute, Numba) and, for the high
level, in `highlevel.strings`; `check_call` checks a call's constant arguments at its place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from common.datafiles import ANY_FILE, DataFileError, DataFiles
from queries import expressions as E
from queries.errors import QueryError


@dataclass(frozen=True)
class StringFunction:
    """One GS-lite string function: argument kinds (`string`, `uint`, `pattern` for a
    constant regular expression, `count` for a constant length, `handle` for a constant
    string, `regex_file` for the constant name of a file holding a regular expression) and
    its result type."""

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
    StringFunction("str_file_regex_match", ("string", "regex_file", "uint", "uint"), "uint",
                   "str_file_regex_match(s, 'file', t, u): str_regex_match with the regular "
                   "expression of the file (read when the query is planned; t and u, "
                   "GS-lite's reload timing, are not used)"),
    StringFunction("strtoi", ("string",), "uint",
                   "strtoi(s): the first decimal number in s, a uint (0 when there is none)",
                   predicate=False),
    StringFunction("strtoip", ("string",), "ipv4",
                   "strtoip(s): the first four decimal numbers in s as an IPv4 address "
                   "(0.0.0.0 when there are fewer)", predicate=False),
    StringFunction("strtoi_c", ("handle",), "uint",
                   "strtoi_c('text'): strtoi of a constant string", predicate=False),
    StringFunction("strtoip_c", ("handle",), "ipv4",
                   "strtoip_c('text'): strtoip of a constant string", predicate=False),
    StringFunction("get_int", ("string", "uint"), "uint",
                   "get_int(s, n): the big-endian uint of the bytes n-1 .. n+2 of s (n from 1; "
                   "0 when they are not all in s)", predicate=False),
    StringFunction("get_bool", ("string", "uint"), "bool",
                   "get_bool(s, n): get_int(s, n) <> 0", predicate=False),
    StringFunction("get_suffix", ("string", "uint"), "string",
                   "get_suffix(s, n): s from byte n-1 on (n from 1)", predicate=False),
    StringFunction("strid", ("string",), "uint",
                   "strid(s): the big-endian uint of the first 4 bytes of s (zero bytes past "
                   "its end)", predicate=False),
)}

#: argument kinds that must be constants: a regular expression (a GS-lite HANDLE), a length,
#: a constant string (a HANDLE converted once), the name of a file holding a regular expression
PATTERN = "pattern"
COUNT = "count"
HANDLE = "handle"
REGEX_FILE = "regex_file"
_STRINGS = ("string", PATTERN, HANDLE, REGEX_FILE)


def string_function_type(name: str, args: list[str]) -> str | None:
    """Result type of a call of a string function (None: the argument types do not fit)."""
    f = STRING_FUNCTIONS[name]
    if len(args) != len(f.params):
        return None
    for want, got in zip(f.params, args):
        if want in _STRINGS and got != "string":
            return None
        if want in ("uint", COUNT) and got not in _UINT:
            return None
    return f.result


def arity(name: str) -> int:
    return len(STRING_FUNCTIONS[name].params)


# --- constant arguments -------------------------------------------------------------------------

ErrorAt = Callable[[E.Node, str], QueryError]


def check_call(name: str, written: list[E.Expr], args: list[E.Expr],
               error: ErrorAt, files: DataFiles = ANY_FILE) -> list[E.Expr]:
    """The resolved arguments `args` of a call of string function `name`, its constant
    arguments checked (a QueryError made by `error(node, message)` at the argument as
    `written`): a regular expression and a HANDLE string must be string literals, a length
    an integer literal; the file of `str_file_regex_match` is read now, as `files` allows
    (missing, unreadable, not allowed or not one regular expression: an error at the file
    name) and named by its resolved path for every evaluator, as getlpmid's prefix file."""
    out = list(args)
    for i, want in enumerate(STRING_FUNCTIONS[name].params):
        arg = args[i]
        text = isinstance(arg, E.Literal) and isinstance(arg.value, str)
        if want == PATTERN and not text:
            raise error(written[i], f"the regular expression of {name} must be a string "
                        f"literal (GS-lite compiles it once)")
        if want == COUNT and not (isinstance(arg, E.Literal) and isinstance(arg.value, int)):
            raise error(written[i], f"the length of {name} must be an integer literal")
        if want == HANDLE and not text:
            raise error(written[i], f"the argument of {name} must be a string literal (a "
                        f"GS-lite HANDLE, converted once; {name[:-2]}(s) converts any "
                        f"string)")
        if want == REGEX_FILE:
            if not text:
                raise error(written[i], f"the regular expression file of {name} must be a "
                            f"string literal (a GS-lite HANDLE: the file is read once per "
                            f"query)")
            assert isinstance(arg, E.Literal)
            try:
                regex_from_file(arg.value, reread=True, files=files)
                path = files.resolve(arg.value)
            except (RegexFileError, DataFileError) as exc:
                raise error(written[i], str(exc)) from None
            out[i] = arg.replace(value=path)
    return out


class RegexFileError(ValueError):
    """The file of str_file_regex_match cannot be read or does not hold one regular
    expression."""

    def __init__(self, path: str, message: str):
        super().__init__(f"regular expression file {path}: {message}")
        self.path = path


#: resolved path -> the regular expression read from it (by the last query planned)
_REGEX_FILES: dict[str, str] = {}


def regex_from_file(path: str, reread: bool = False, files: DataFiles = ANY_FILE) -> str:
    """The regular expression in the file `path` names, read as `files` allows (relative:
    to the working directory, or to the appliance's first --data-dir): the file's text
    without the line end closing it, one line. Read once: when a query is planned
    (`reread`, `check_call`), else by the first evaluator that asks; evaluators then use what
    was read, so a file changed while a query runs is not read again by it (GS-lite's reload
    timeout is not implemented). RegexFileError when it may not or cannot be read or is not
    one valid regular expression (checked by RE2, the low level's engine); the error never
    shows what the file holds."""
    try:
        real = files.resolve(path)
        if not reread and real in _REGEX_FILES:
            return _REGEX_FILES[real]
        data = files.read(path)
    except DataFileError as exc:
        raise RegexFileError(path, exc.rule) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RegexFileError(path, "is not UTF-8 text") from None
    pattern = text[:-1] if text.endswith("\n") else text
    pattern = pattern[:-1] if pattern.endswith("\r") else pattern
    if not pattern:
        raise RegexFileError(path, "is empty: it must hold one regular expression")
    if "\n" in pattern or "\r" in pattern:
        raise RegexFileError(path, "holds more than one line: it must hold one regular "
                             "expression (write alternatives as a|b)")
    _check_regex(path, pattern)
    _REGEX_FILES[real] = pattern
    return pattern


def _check_regex(path: str, pattern: str) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        pc.match_substring_regex(pa.array([""], pa.string()), "(?m)" + pattern)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        # Arrow's text is "Invalid regular expression: <RE2's kind>: <the part of the
        # pattern>": only the kind is said, the pattern is the file's contents
        parts = str(exc).split(": ")
        why = f" ({parts[1].strip()})" if len(parts) > 2 else ""
        raise RegexFileError(path, f"is not a regular expression{why}") from None
