"""The GSQL lexer: query text to a list of tokens with 1-based line/column positions.

Words are all lexed as `IDENT` tokens; the parser decides which are keywords by their upper-case
spelling (keywords are case-insensitive and only the `RESERVED` words cannot name a column, a
link or an alias). A lexing problem (unterminated string, stray character, bad number) becomes an
`ERROR` token carrying its message, so the parser reports it at the right place and can recover
at the next `;` like for any other syntax error.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple


class Kind(StrEnum):
    IDENT = "identifier"
    INT = "integer"
    FLOAT = "number"
    STRING = "string"
    PARAM = "parameter"
    OP = "operator"
    EOF = "end of input"
    ERROR = "error"


class Token(NamedTuple):
    kind: Kind
    # Any: which type depends on `kind` (mypy cannot narrow a value by its token's kind)
    value: Any          # str for IDENT/OP/STRING/PARAM (PARAM without `$`), int, float, error text
    line: int
    col: int
    length: int         # characters of source text the token spans (for the error marker)
    depth: int          # `{}` nesting depth before the token (recovery skips to a `;` at depth 0)
    #: INT tokens written with GS-lite's `ULL` suffix: "ullong" (the type they declare), else
    #: None (`UL` declares uint, which every integer below 2**32 has anyway)
    declared: str | None = None

    @property
    def upper(self) -> str:
        """The upper-case spelling of a word (empty for other tokens): keyword tests use it."""
        return self.value.upper() if self.kind is Kind.IDENT else ""

    def describe(self) -> str:
        """The token as an error message names it."""
        if self.kind is Kind.EOF:
            return "end of input"
        if self.kind is Kind.STRING:
            return f"string {_quote(self.value)}"
        if self.kind is Kind.PARAM:
            return f"parameter ${self.value}"
        if self.kind is Kind.OP:
            return f"'{self.value}'"
        return f"{self.kind.value} '{self.value}'" if self.kind is not Kind.IDENT \
            else f"'{self.value}'"


#: the longest name (column, link, query, alias, parameter): query names become file and
#: directory names (spool, checkpoint), which file systems limit to 255 bytes
MAX_NAME_LENGTH = 64

#: words that always are keywords: they cannot be used as column, link, query or alias names
RESERVED = frozenset({
    "SELECT", "FROM", "WHERE", "GROUP", "BY", "HAVING", "AS", "AND", "OR", "NOT", "IN", "UNION",
    "DEFINE", "PARAM", "MERGE", "TRUE", "FALSE", "IP_VAL", "IPV6_VAL", "DISTINCT",
    "INNER_JOIN", "LEFT_OUTER_JOIN", "RIGHT_OUTER_JOIN", "OUTER_JOIN",
})

# longest first, so `<<` wins over `<` and `<>` over `<`, `!=` over `!`. GS-lite's own: `!`
# (logical negation), `#name` (a DEFINE value), `@name` (an interface property) and the `$` of
# a super-aggregate (`count$(*)`; `$name` is a parameter token of its own)
OPERATORS = ("<<", ">>", "<=", ">=", "<>", "!=",
             "+", "-", "*", "/", "%", "&", "|", "^", "~", "=", "<", ">", "!", "#", "@",
             "[", "]", "(", ")", ",", ";", ".", ":", "{", "}")

#: GS-lite's integer suffixes (its lexer: `[0-9]+UL` is a uint, `[0-9]+ULL` a ullong); GS-lite
#: has no `L` or `LL`
INT_SUFFIXES = {"UL": "uint", "ULL": "ullong"}
UINT_MAX = 2**32 - 1

_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_REST = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def quote_string(text: str) -> str:
    """A GSQL string literal for `text` (the printer uses it)."""
    return _quote(text)


def tokenize(text: str) -> list[Token]:
    """Every token of `text`, ending with one EOF token (lexing problems become ERROR tokens)."""
    return _Lexer(text).run()


class _Lexer:
    def __init__(self, text: str):
        self.text = text
        self.i = 0
        self.line = 1
        self.line_start = 0
        self.depth = 0
        self.tokens: list[Token] = []

    def run(self) -> list[Token]:
        text, n = self.text, len(self.text)
        while True:
            self._skip_space_and_comments()
            if self.i >= n:
                break
            ch = text[self.i]
            if ch in _IDENT_START:
                self._word()
            elif ch in _DIGITS:
                self._number()
            elif ch == "'":
                self._string()
            elif ch == "$":
                self._param()
            else:
                self._operator()
        self._eof()
        return self.tokens

    # --- helpers ------------------------------------------------------------------------------
    def _col(self, i: int) -> int:
        return i - self.line_start + 1

    def _emit(self, kind: Kind, value: object, start: int) -> None:
        self.tokens.append(Token(kind, value, self.line, self._col(start), self.i - start,
                                 self.depth))

    def _error(self, message: str, start: int, end: int) -> None:
        self.i = end
        self.tokens.append(Token(Kind.ERROR, message, self.line, self._col(start),
                                 max(1, end - start), self.depth))

    def _skip_space_and_comments(self) -> None:
        text, n = self.text, len(self.text)
        while self.i < n:
            ch = text[self.i]
            if ch == "\n":
                self.i += 1
                self.line += 1
                self.line_start = self.i
            elif ch in " \t\r\f\v":
                self.i += 1
            elif text.startswith("--", self.i) or text.startswith("//", self.i):
                end = text.find("\n", self.i)
                self.i = n if end < 0 else end
            else:
                return

    def _eof(self) -> None:
        # point an "unexpected end of input" just after the last token, not at a blank line
        if self.tokens:
            last = self.tokens[-1]
            line, col = last.line, last.col + last.length
        else:
            line, col = 1, 1
        self.tokens.append(Token(Kind.EOF, "", line, col, 1, self.depth))

    # --- token rules --------------------------------------------------------------------------
    def _word(self) -> None:
        start, text, n = self.i, self.text, len(self.text)
        self.i += 1
        while self.i < n and text[self.i] in _IDENT_REST:
            self.i += 1
        if self.i - start > MAX_NAME_LENGTH:
            self._error(f"a name of {self.i - start:,} characters is too long (at most "
                        f"{MAX_NAME_LENGTH})", start, self.i)
            return
        self._emit(Kind.IDENT, text[start:self.i], start)

    def _number(self) -> None:
        start, text, n = self.i, self.text, len(self.text)
        if text.startswith(("0x", "0X"), start):
            j = start + 2
            while j < n and text[j] in _HEX:
                j += 1
            if j == start + 2 or (j < n and text[j] in _IDENT_REST):
                k = j
                while k < n and text[k] in _IDENT_REST:
                    k += 1
                self._error(f"bad hexadecimal number '{text[start:k]}'", start, k)
                return
            self.i = j
            self._emit(Kind.INT, int(text[start + 2:j], 16), start)
            return
        j = start
        while j < n and text[j] in _DIGITS:
            j += 1
        is_float = False
        if j + 1 < n and text[j] == "." and text[j + 1] in _DIGITS:
            is_float = True
            j += 1
            while j < n and text[j] in _DIGITS:
                j += 1
        if j < n and text[j] in "eE":
            k = j + 1
            if k < n and text[k] in "+-":
                k += 1
            if k < n and text[k] in _DIGITS:
                is_float = True
                j = k
                while j < n and text[j] in _DIGITS:
                    j += 1
        self.i = j
        literal = text[start:j]
        if is_float:
            value = float(literal)
            if value != value or value in (float("inf"), float("-inf")):
                self._error(f"number '{literal}' is out of range", start, j)
                return
            self._emit(Kind.FLOAT, value, start)
        elif j - start > 4000:      # past the digits Python converts (far past 64 bits anyway)
            self._error(f"integer of {j - start} digits does not fit in 64 bits", start, j)
        else:
            self._integer(int(literal), start)

    def _integer(self, value: int, start: int) -> None:
        """An integer, with GS-lite's `UL` / `ULL` suffix when one follows its digits."""
        text, n, j = self.text, len(self.text), self.i
        k = j
        while k < n and text[k] in _IDENT_REST:
            k += 1
        suffix = text[j:k].upper()
        if suffix not in INT_SUFFIXES:
            self._emit(Kind.INT, value, start)     # `15s` in DEFINE: a number, then a unit
            return
        declared = INT_SUFFIXES[suffix]
        limit = UINT_MAX if declared == "uint" else 2**64 - 1
        if value > limit:
            hint = f": write {value}ULL for a ullong" if declared == "uint" and value < 2**64 \
                else ""
            self._error(f"integer {text[start:k]} does not fit in a {declared} "
                        f"(at most {limit}){hint}", start, k)
            return
        self.i = k
        # only a ullong below 2**32 declares more than its value says (docs/gsql.md "Literals")
        kept = "ullong" if declared == "ullong" and value <= UINT_MAX else None
        self.tokens.append(Token(Kind.INT, value, self.line, self._col(start), k - start,
                                 self.depth, kept))

    def _string(self) -> None:
        start, text, n = self.i, self.text, len(self.text)
        j = start + 1
        parts: list[str] = []
        while True:
            end = text.find("'", j)
            newline = text.find("\n", j)
            if end < 0 or (0 <= newline < end):
                stop = n if newline < 0 else newline
                self._error("unterminated string (a string ends with ' on the same line; "
                            "write '' for a quote inside it)", start, stop)
                return
            parts.append(text[j:end])
            if end + 1 < n and text[end + 1] == "'":
                parts.append("'")
                j = end + 2
                continue
            self.i = end + 1
            self._emit(Kind.STRING, "".join(parts), start)
            return

    def _param(self) -> None:
        start, text, n = self.i, self.text, len(self.text)
        j = start + 1
        if j >= n or text[j] not in _IDENT_START:
            # the `$` of a GS-lite super-aggregate (`count$(*)`); the parser tells a stray one
            self.i = j
            self._emit(Kind.OP, "$", start)
            return
        j += 1
        while j < n and text[j] in _IDENT_REST:
            j += 1
        self.i = j
        self._emit(Kind.PARAM, text[start + 1:j], start)

    def _operator(self) -> None:
        start, text = self.i, self.text
        for op in OPERATORS:
            if text.startswith(op, start):
                self.i = start + len(op)
                if op == "}":
                    self.depth = max(0, self.depth - 1)
                self._emit(Kind.OP, op, start)
                if op == "{":
                    self.depth += 1
                return
        ch = text[start]
        shown = repr(ch) if not ch.isprintable() or ch == "'" else f"'{ch}'"
        self._error(f"unexpected character {shown}", start, start + 1)
