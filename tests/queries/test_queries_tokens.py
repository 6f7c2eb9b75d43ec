"""The GSQL lexer: numbers against Python's own parsing, strings, operators, comments, positions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from queries.tokens import Kind, quote_string, tokenize


def kinds_values(text: str) -> list[tuple[Kind, object]]:
    return [(t.kind, t.value) for t in tokenize(text)][:-1]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**80))
def test_integers_decimal_and_hex_match_python(n):
    assert kinds_values(str(n)) == [(Kind.INT, n)]
    assert kinds_values(hex(n)) == [(Kind.INT, n)]
    assert kinds_values(hex(n).upper().replace("0X", "0x")) == [(Kind.INT, n)]


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e300, allow_nan=False, allow_infinity=False))
def test_floats_match_python(x):
    text = repr(x)
    assert kinds_values(text) == [(Kind.FLOAT, float(text))]


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_characters="\n"), max_size=20))
def test_strings_round_trip_through_quoting(s):
    assert kinds_values(quote_string(s)) == [(Kind.STRING, s)]


def test_operators_longest_match():
    text = "<< >> <= >= <> != + - * / % & | ^ ~ = < > [ ] ( ) , ; . : { }"
    assert [v for _, v in kinds_values(text)] == text.split()
    assert [v for _, v in kinds_values("a<<=b")] == ["a", "<<", "=", "b"]
    assert [v for _, v in kinds_values("x<>y!=z")] == ["x", "<>", "y", "!=", "z"]


def test_comments_words_and_parameters():
    text = "Select -- a comment ; 'not a string\nx // another\n$Window_2 _a1"
    assert kinds_values(text) == [(Kind.IDENT, "Select"), (Kind.IDENT, "x"),
                                  (Kind.PARAM, "Window_2"), (Kind.IDENT, "_a1")]
    assert tokenize("select")[0].upper == "SELECT"


def test_positions_are_one_based_lines_and_columns():
    text = "SELECT a,\n  b FROM\n\tIP"
    got = [(t.value, t.line, t.col, t.length) for t in tokenize(text)]
    assert got == [("SELECT", 1, 1, 6), ("a", 1, 8, 1), (",", 1, 9, 1), ("b", 2, 3, 1),
                   ("FROM", 2, 5, 4), ("IP", 3, 2, 2), ("", 3, 4, 1)]
    assert tokenize("")[0][1:4] == ("", 1, 1)


def test_number_edge_cases():
    assert kinds_values("1.") == [(Kind.INT, 1), (Kind.OP, ".")]
    assert kinds_values("1e") == [(Kind.INT, 1), (Kind.IDENT, "e")]
    assert kinds_values("2E+3") == [(Kind.FLOAT, 2000.0)]
    assert kinds_values("10minutes") == [(Kind.INT, 10), (Kind.IDENT, "minutes")]
    assert kinds_values("1e999")[0][0] is Kind.ERROR


def test_problems_become_error_tokens_and_lexing_continues():
    toks = tokenize("'abc\nx ? 0xg \\")   # `!` and `$` are GS-lite operators now
    assert [(t.kind, t.line, t.col) for t in toks] == [
        (Kind.ERROR, 1, 1), (Kind.IDENT, 2, 1), (Kind.ERROR, 2, 3), (Kind.ERROR, 2, 5),
        (Kind.ERROR, 2, 9), (Kind.EOF, 2, 10)]
    assert "unterminated string" in toks[0].value


def test_brace_depth_for_recovery():
    toks = tokenize("DEFINE { a 1; } ; {{ ; }")
    depth = {(t.value, t.col): t.depth for t in toks}
    assert depth[(";", 13)] == 1 and depth[(";", 17)] == 0 and depth[(";", 22)] == 2
