"""Errors that name the likely fix: keyword typos, SQL words GSQL lacks, column spellings,
the record protocol's own clock in the window hint."""

from __future__ import annotations

import pytest

from capture.schema import BUILTIN
from queries.errors import QueryError
from queries.hints import keyword_typo, likely_column
from queries.parser import parse
from queries.planner import plan_text
from queries.schemafile import schema_from_files


def parse_error(text: str) -> QueryError:
    with pytest.raises(QueryError) as info:
        parse(text, path="t.gsql")
    return info.value


def marked(e: QueryError) -> str:
    """The source text under the error's ^ marker."""
    line = e.source.split("\n")[e.line - 1]
    return line[e.column - 1:e.column - 1 + e.length]


# query, the word the marker is under, what the message must say
TYPOS = [
    ("SELECT tb, count(*) FROM main.IPV4 GRUOP BY time/60 AS tb", "GRUOP", "did you mean GROUP BY?"),
    ("SELECT srcIP FORM main.IPV4", "FORM", "did you mean FROM?"),
    ("SELCT srcIP FROM main.IPV4", "SELCT", "did you mean SELECT?"),
    ("SELECT srcIP FROM main.IPV4 WHRE len > 10", "WHRE", "did you mean WHERE?"),
    ("SELECT srcIP FROM main.IPV4 WHERE len > 10 GROPU BY srcIP", "GROPU",
     "did you mean GROUP BY?"),
    ("SELECT tb, count(*) FROM main.IPV4 GROUP BY time/60 AS tb HAVNG count(*) > 1", "HAVNG",
     "did you mean HAVING?"),
    ("DEFNIE { query_name q; } SELECT srcIP FROM main.IPV4", "DEFNIE", "did you mean DEFINE?"),
]


@pytest.mark.parametrize("text, word, hint", TYPOS)
def test_a_keyword_typo_is_named_at_the_typo(text, word, hint):
    e = parse_error(text)
    assert hint in e.message
    assert marked(e) == word


SQL_WORDS = [
    ("SELECT tb, count(*) FROM main.IPV4 GROUP BY time/60 AS tb ORDER BY tb", "ORDER",
     ["no ORDER BY", "sort the output"]),
    ("SELECT time FROM main.IPV4 ORDER BY time", "ORDER", ["no ORDER BY", "sort the output"]),
    ("SELECT time FROM main.IPV4 LIMIT 10", "LIMIT", ["no LIMIT", "HAVING"]),
    ("SELECT a.time FROM main.IPV4 a JOIN main.TCP b ON a.time = b.time", "JOIN",
     ["INNER_JOIN FROM a, b WHERE a.time = b.time"]),
    ("SELECT DISTINCT srcIP FROM main.IPV4", "DISTINCT", ["GROUP BY", "COUNT(DISTINCT x)"]),
    ("SELECT srcIP FROM main.IPV4 WHERE srcIP LIKE 'a'", "LIKE", ["str_regex_match"]),
]


@pytest.mark.parametrize("text, word, says", SQL_WORDS)
def test_an_sql_word_gsql_lacks_says_what_to_write_instead(text, word, says):
    e = parse_error(text)
    assert marked(e) == word
    for part in says:
        assert part in e.message


def test_ordinary_names_are_no_keyword_typos():
    for name in ("srcIP", "time", "len", "flags", "where", "Group", "tb", "destPort"):
        assert keyword_typo(name) is None, name


def test_a_column_spelled_otherwise_is_found():
    known = sorted(c for c, f in BUILTIN.fields("TCP").items() if f.alias_of is None)
    for name, meant in [("srcAddr", "srcIP"), ("source_ip", "srcIP"), ("dst_port", "destPort"),
                        ("destinationAddress", "destIP"), ("proto", "protocol"),
                        ("sport", "srcPort"), ("dstAddr", "destIP"), ("protcol", "protocol")]:
        assert likely_column(name, known) == meant, name


def plan_error(text: str, links=("main",), schema=BUILTIN) -> QueryError:
    with pytest.raises(QueryError) as info:
        plan_text(text, list(links), path="t.gsql", schema=schema)
    return info.value


def test_unknown_column_suggests_the_same_thing_at_its_first_use():
    text = ("SELECT tb, srcAddr, count(*)\nFROM main.IPV4\n"
            "GROUP BY time/60 AS tb, srcAddr")
    e = plan_error(text)
    assert "did you mean 'srcIP'?" in e.message
    assert (e.line, e.column) == (1, 12)     # its first use, in SELECT


READINGS = """PROTOCOL READINGS {
    uint ts get_csv_uint_pos1 (increasing);
    string sensor get_csv_string_pos2;
    uint value get_csv_uint_pos3;
}
"""


def test_a_record_protocol_without_window_is_shown_its_own_clock():
    schema = schema_from_files([("s.txt", READINGS)])
    e = plan_error("SELECT sensor, sum(value) FROM csv.READINGS GROUP BY sensor", ("csv",),
                   schema)
    assert "GROUP BY ts/60 AS tb" in e.message
    assert "time/60" not in e.message


@pytest.mark.parametrize("text, hint", [
    ("SELECT time FROM main.IPV5", "did you mean IPV4?"),
    ("SELECT time FROM main.TPC", "did you mean TCP?"),
    ("SELECT tb, count(*) FROM main.IPV4 GROUP BY time/60 AS tb HAVING cnt(*) > 1",
     "did you mean COUNT?"),
    ("DEFINE { query_nam x; } SELECT time FROM main.IPV4", "did you mean query_name?"),
    ("DEFINE { flush oop_slwo; } SELECT tb, count(*) FROM main.IPV4 GROUP BY time/60 AS tb",
     "did you mean oop_slow?"),
    ("DEFINE { query_name abc; } SELECT time, srcIP FROM main.IPV4; SELECT time FROM abd",
     "did you mean 'abc'?"),
    ("PARAM { min_bytes uint; } SELECT time FROM main.IPV4 WHERE len > $min_byte",
     "did you mean $min_bytes?"),
])
def test_a_misspelt_name_is_given_the_likely_one(text, hint):
    assert hint in plan_error(text).message


def test_no_guess_for_a_name_like_none():
    e = plan_error("SELECT time FROM main.QWERTY")
    assert "did you mean" not in e.message


@pytest.mark.parametrize("text, hint", [
    ("SELECT * FROM main.IPV4", "GSQL has no SELECT *: name the columns"),
    ("SELECT time FROM main.IPV4 WHERE len == 5", "a single ="),
])
def test_sql_habits_are_told_apart(text, hint):
    assert hint in parse_error(text).message


@pytest.mark.parametrize("text, hint", [
    ("SELECT time FROM main.IPV4 WHERE srcIP = '10.0.0.1'", "IP_VAL '10.0.0.1'"),
    ("SELECT time FROM main.IPV4 WHERE protocol = 'tcp'", "tcp is 6"),
    ("SELECT time FROM main.IPV4 WHERE len > '100'", "without quotes (100)"),
    ("SELECT time AS t FROM main.IPV4 WHERE t > 5", "t is a SELECT name"),
    ("SELECT tb, count(*) FROM main.IPV4 GROUP BY tb", "GROUP BY time/60 AS tb"),
])
def test_what_a_wrong_operand_or_name_meant(text, hint):
    assert hint in plan_error(text).message
