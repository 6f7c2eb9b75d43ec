"""Parse errors: message, line and column, the source line with a marker, several errors at once."""

from __future__ import annotations

import pickle

import pytest

from common.errors import OopscopeError
from queries.errors import QueryError
from queries.expressions import Column, Pos
from queries.parser import parse, parse_file


def error_of(text: str, path: str | None = "t.gsql") -> QueryError:
    with pytest.raises(QueryError) as info:
        parse(text, path=path)
    return info.value


def marker_column(rendered: str) -> int:
    """1-based column of the first `^` on the marker line (the snippet is indented by 2)."""
    marker = rendered.splitlines()[-1]
    return marker.index("^") - 2 + 1


# text, expected line, column, a fragment of the message
CASES = [
    ("SELECT a FROM", 1, 14, "expected a source"),
    ("SELECT a, FROM IP", 1, 11, "expected an expression, found keyword FROM"),
    ("SELECT a IP", 1, 10, "expected FROM after the select list"),
    # an unknown protocol is the analysis' error (schema files add protocols):
    # tests/queries/test_queries_schemafile.py
    ("SELECT (a + b FROM IP", 1, 15, "expected ')'"),
    ("SELECT 'abc FROM IP", 1, 8, "unterminated string"),
    ("SELECT a FROM IP WHERE srcIP = IP_VAL '10.1.2'", 1, 39, "bad IPv4 address"),
    ("SELECT a FROM IP WHERE srcIP = IPV6_VAL '2001:::1'", 1, 41, "bad IPv6 address"),
    ("SELECT a FROM IP WHERE srcIP = IP_VAL 10", 1, 39, "a quoted address"),
    ("SELECT count(*) [RANGE 5 fortnights] FROM IP", 1, 26, "unknown time unit 'fortnights'"),
    ("SELECT count(*) [RANGE 1000 rows] FROM IP", 1, 29, "[ROWS n]"),
    ("SELECT count(*) [RANGE 5] FROM IP", 1, 25, "a time unit"),
    ("SELECT count(*) [RANGE 5 min, RANGE 2 min] FROM IP", 1, 31, "RANGE given twice"),
    ("SELECT count(*) [] FROM IP", 1, 18, "empty window spec"),
    ("SELECT count(*) [SIZE 5 min] FROM IP", 1, 18, "RANGE, SLIDE, WA"),
    ("SELECT sum(*) FROM IP", 1, 12, "only COUNT takes '*'"),
    ("SELECT sum(a, b) FROM IP", 1, 13, "takes one argument"),
    ("SELECT count() FROM IP", 1, 14, "takes one argument"),
    ("SELECT max(DISTINCT a) FROM IP", 1, 12, "DISTINCT is only allowed"),
    ("SELECT a < b < c FROM IP", 1, 14, "cannot be chained"),
    ("SELECT a FROM IP GROUP BY time/60", 1, 27, "needs a name"),
    ("SELECT a FROM IP GROUP BY a WHERE b", 1, 29, "WHERE must come before GROUP BY"),
    ("SELECT a FROM IP WHERE a WHERE b", 1, 26, "WHERE given twice"),
    ("SELECT a FROM x, y", 1, 18, "state its type"),
    ("SELECT a INNER_JOIN FROM x", 1, 10, "needs two sources"),
    ("SELECT a INNER_JOIN FROM x, y, z", 1, 32, "at most two sources"),
    ("SELECT a FROM l1.IP UNION l2.TCP", 1, 27, "same protocol"),
    ("SELECT a FROM IP UNION l2.IP", 1, 18, "UNION combines"),
    ("SELECT a FROM [l1, l2] IP", 1, 24, "a protocol after the list of links"),
    ("MERGE a.time FROM x, y", 1, 14, "MERGE a.time : b.time"),
    ("DEFINE { query_name 5; } SELECT a FROM IP", 1, 10, "query_name must be a name"),
    ("DEFINE { flush oop_slow; flush iop_slow; } SELECT a FROM IP", 1, 26, "given twice"),
    ("DEFINE { flush oop_slow } DEFINE { late drop } SELECT a FROM IP", 1, 27,
     "a second DEFINE block"),
    ("DEFINE { flush oop_slow late drop } SELECT a FROM IP", 1, 25, "';' after the DEFINE"),
    ("PARAM { x } SELECT a FROM IP", 1, 11, "the type of parameter x"),
    ("PARAM { x uint; x int; } SELECT a FROM IP", 1, 17, "declared twice"),
    ("PARAM { x uint = y; } SELECT a FROM IP", 1, 9, "must be a constant"),
    ("DEFINE { flush x; }", 1, 20, "SELECT or MERGE"),
    ("FROM IP", 1, 1, "SELECT, MERGE, DEFINE or PARAM"),
    ("SELECT a FROM IP junk more", 1, 23, "';' or the end of the query"),
    ("SELECT a AS FROM FROM IP", 1, 13, "reserved words cannot be used as names"),
    ("SELECT $ FROM IP", 1, 8, "'$' must start a parameter"),
    ("SELECT a ? b FROM IP", 1, 10, "unexpected character '?'"),
    ("SELECT 0x FROM IP", 1, 8, "bad hexadecimal number"),
    ("SELECT 0x1G FROM IP", 1, 8, "bad hexadecimal number '0x1G'"),
    ("SELECT a IN 1 FROM IP", 1, 13, "to open the IN list"),
    ("-- only a comment\n", 1, 1, "no query in the file"),
]


@pytest.mark.parametrize("text, line, col, fragment", CASES, ids=[c[3] for c in CASES])
def test_error_position_and_message(text, line, col, fragment):
    e = error_of(text)
    assert isinstance(e, OopscopeError)
    assert (e.line, e.column) == (line, col), str(e)
    assert fragment in e.message
    rendered = str(e)
    assert rendered.splitlines()[0] == f"t.gsql:{line}:{col}: {e.message}"
    source_line = text.split("\n")[line - 1]
    assert rendered.splitlines()[1] == "  " + source_line
    assert marker_column(rendered) == col


def test_marker_spans_the_offending_token_and_tabs_keep_alignment():
    e = error_of("SELECT a\n\tFROM main.$NOPE")   # a parameter where a protocol goes
    lines = str(e).splitlines()
    assert lines[1] == "  \tFROM main.$NOPE"
    assert lines[2] == "  \t          ^^^^^"


def test_error_without_path_says_query():
    e = error_of("SELECT", path=None)
    assert str(e).startswith("<query>:1:7: expected an expression")


def test_several_errors_reported_together_and_parsing_resumes_after_semicolon():
    text = ("SELECT a FROM IP;\n"
            "SELECT b FROM main.$NOPE;\n"       # error 1
            "DEFINE { flush x; comment 'a; b'; late ??? } SELECT c FROM IP;\n"  # error 2
            "SELECT d FROM IP;\n"
            "SELECT (e FROM IP\n")              # error 3 (at the end)
    e = error_of(text)
    positions = [(x.line, x.column) for x in e.all]
    assert positions == [(2, 20), (3, 40), (5, 11)]
    assert (e.line, e.column) == (2, 20)
    rendered = str(e)
    assert rendered.startswith("3 errors:\n")
    assert rendered.count("t.gsql:") == 3
    assert "t.gsql:3:40: unexpected character '?'" in rendered


def test_semicolons_inside_define_blocks_do_not_end_recovery_early():
    text = "DEFINE { flush ^; late drop; comment x; } SELECT a FROM IP; SELECT b FROM main.$X"
    e = error_of(text)
    assert [(x.line, x.column) for x in e.all] == [(1, 16), (1, 80)]


def test_at_builds_an_error_from_a_node_position():
    text = "SELECT srcIP\nFROM IP\nWHERE nosuch > 1"
    tree = parse(text, path="q.gsql")
    column = tree.queries[0].statement.where.left
    e = QueryError.at(column, "unknown field 'nosuch' in IP", text, path="q.gsql")
    assert (e.line, e.column) == (3, 7)
    assert str(e).splitlines() == ["q.gsql:3:7: unknown field 'nosuch' in IP",
                                   "  WHERE nosuch > 1", "        ^"]
    unplaced = QueryError.at(Column(name="x"), "no position")
    assert str(unplaced) == "<query>: no position"
    assert QueryError.at(Column(pos=Pos(9, 9), name="x"), "far", "one line").line == 9


def test_errors_pickle_with_their_sub_errors():
    e = error_of("SELECT a FROM main.$X; SELECT b FROM main.$Y")
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and len(back.all) == 2


def test_parse_file_errors(tmp_path):
    with pytest.raises(QueryError, match="no such query file"):
        parse_file(tmp_path / "missing.gsql")
    bad = tmp_path / "bad.gsql"
    bad.write_bytes(b"SELECT \xff FROM IP")
    with pytest.raises(QueryError, match="not UTF-8"):
        parse_file(bad)
    broken = tmp_path / "broken.q.gsql"
    broken.write_text("SELECT a FROM IP WHERE")
    with pytest.raises(QueryError) as info:
        parse_file(broken)
    assert str(info.value).startswith(f"{broken}:1:23: expected an expression")
    good = tmp_path / "flows.v2.gsql"
    good.write_text("SELECT a FROM IP")
    assert parse_file(good).queries[0].name == "flows"


def test_long_lines_are_cut_around_the_column():
    text = "SELECT " + " + ".join(["a"] * 100) + " + FROM IP"
    e = error_of(text)
    shown, marker = str(e).splitlines()[1:]
    assert len(shown) < 120 and shown.startswith("  ...")
    assert shown[marker.index("^"):].startswith("FROM")


def test_deep_nesting_is_a_query_error_not_a_recursion_error():
    for text in ["SELECT " + "(" * 3000 + "1" + ")" * 3000 + " FROM IP",
                 "SELECT " + "- " * 3000 + "1 FROM IP",
                 "SELECT " + "NOT " * 3000 + "a FROM IP",
                 "SELECT " + "f(" * 3000 + "1" + ")" * 3000 + " FROM IP"]:
        assert "nested too deeply" in error_of(text).message
