"""Semantic analysis: every wrong query is a QueryError naming the problem at the right line and column."""

from __future__ import annotations

import pytest

from common.errors import ConfigError
from queries import expressions as E
from queries.analysis import analyse_file
from queries.errors import QueryError
from queries.parser import parse
from queries.types import TimeForm


def analyse(text, links=("main",), params=None, overrides=None):
    return analyse_file(parse(text), list(links), params, overrides, source=text)


# (query text with the error position marked by `@`, a fragment of the message)
ERRORS = [
    ("SELECT tb, count(*) FROM main.IP WHERE @count(*) > 1 GROUP BY time/60 AS tb",
     "aggregate COUNT is not allowed in WHERE"),
    ("SELECT tb, SUM(@count(*)) FROM main.IP GROUP BY time/60 AS tb",
     "not allowed in the argument of SUM"),
    ("@SELECT srcIP, count(*) FROM main.IP GROUP BY srcIP", "needs a temporal group item"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, @time AS t2",
     "at most one temporal group item"),
    ("SELECT tb, @len, count(*) FROM main.IP GROUP BY time/60 AS tb",
     "'len' must be a GROUP BY item or inside an aggregate"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, @seq",
     "unknown column 'seq' in protocol IP"),
    ("DEFINE { @nosuch 1; } SELECT len FROM main.IP", "unknown DEFINE key 'nosuch'"),
    ("DEFINE { flush @fast; } SELECT len FROM main.IP", "'fast' is not one of oop_lazy"),
    ("DEFINE { late @maybe; } SELECT len FROM main.IP", "not one of drop, correct"),
    ("DEFINE { aggregate_slots @0; } SELECT len FROM main.IP", "not a positive integer"),
    ("DEFINE { max_lfta_disorder @-2; } SELECT len FROM main.IP", "not a positive integer"),
    ("SELECT len FROM @other.IP", "unknown link 'other': this run has main"),
    ("SELECT len FROM main.IP WHERE len > @$x", "undeclared parameter $x"),
    ("PARAM { x ip; } SELECT len FROM main.IP WHERE len @> $x", "> does not apply to uint and ip"),
    ("PARAM { w uint; } SELECT tb, count(*) FROM main.IP GROUP BY time/@$w AS tb",
     "parameter $w needs a value to plan the window"),
    ("SELECT len FROM @nosuchquery", "unknown query or protocol 'nosuchquery'"),
    ("DEFINE { query_name t; }\nPARAM { n uint; x @frob; }\nSELECT len FROM main.IP",
     "parameter x: unknown type 'frob'"),
    ("DEFINE { query_name a; } SELECT len FROM @b; DEFINE { query_name b; } SELECT len FROM a",
     "queries read each other in a cycle: 'a' -> 'b' -> 'a'"),
    ("DEFINE { query_name a; } SELECT len FROM @a", "reads itself"),
    ("SELECT srcIP @+ 1 FROM main.IP", "+ does not apply to ip and uint"),
    ("SELECT len FROM main.IP WHERE @ip_str(srcIP) = '1.2.3.4'", "ip_str is for display"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, @ip_str(srcIP) AS s",
     "ip_str is for display"),
    ("SELECT prefix(srcIP, @200) FROM main.IP", "prefix length 200 is outside 0..128"),
    ("SELECT prefix(srcIP, @len) FROM main.IP", "prefix length must be a constant"),
    ("SELECT prefix(srcIP, @33) FROM main.IPV4", "outside 0..32"),
    ("SELECT @frob(len) FROM main.IP", "unknown function 'frob'"),
    ("SELECT @uint(len, 2) FROM main.IP", "uint takes 1 argument"),
    ("SELECT a.len, b.len INNER_JOIN FROM main.IP a, main.IP b WHERE a.srcIP @= b.destIP",
     "a join needs an equality between the two temporal attributes"),
    ("SELECT @len INNER_JOIN FROM main.IP a, main.IP b WHERE a.time = b.time",
     "column 'len' is ambiguous"),
    ("SELECT a.len INNER_JOIN FROM main.IP a, main.IP b WHERE a.time = b.time AND @c.len = 1",
     "unknown source 'c'"),
    ("SELECT len FROM main.IP WHERE @srcIP", "WHERE must be a condition"),
    ("SELECT @SUM(srcIP) [RANGE 1 minute] FROM main.IP", "SUM does not apply to a ip value"),
    ("SELECT count(*) @[RANGE 1 minute, SLIDE 2 minutes] FROM main.IP", "can't exceed RANGE"),
    ("SELECT count(*) [RANGE 1 minute], SUM(len) @[RANGE 2 minutes] FROM main.IP",
     "same window"),
    ("SELECT count(*) @[RANGE 1 minute, WA len] FROM main.IP", "'len' is not increasing"),
    ("SELECT tb, count(*) @[RANGE 1 minute] FROM main.IP GROUP BY time/60 AS tb",
     "cannot be combined"),
    ("SELECT len AS a, @ttl AS a FROM main.IP", "two output columns are named 'a'"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb HAVING @len > 3",
     "must be a GROUP BY item or inside an aggregate in HAVING"),
    ("SELECT @99999999999999999999999 FROM main.IP", "does not fit in 64 bits"),
    ("SELECT tb, @count(*) INNER_JOIN FROM main.IP a, main.IP b WHERE a.time = b.time "
     "GROUP BY a.time AS tb", "a join cannot aggregate"),
    ("SELECT a.len INNER_JOIN FROM main.IP a, @main.IP b", "a join needs a WHERE"),
    ("DEFINE { query_name q; } SELECT tb, count(*) AS c FROM main.IP GROUP BY time/60 AS tb;\n"
     "SELECT c @+ IP_VAL '1.2.3.4' FROM q", "+ does not apply to ullong and ipv4"),
    ("DEFINE { query_name q; } SELECT tb, count(*) AS c FROM main.IP GROUP BY time/60 AS tb;\n"
     "SELECT @nope FROM q", "unknown column 'nope' in query 'q'"),
]


def _locate(marked: str) -> tuple[str, int, int]:
    i = marked.index("@")
    text = marked[:i] + marked[i + 1:]
    line = marked[:i].count("\n") + 1
    col = i - (marked.rfind("\n", 0, i) + 1) + 1
    return text, line, col


@pytest.mark.parametrize("marked,message", ERRORS, ids=[m for _, m in ERRORS])
def test_semantic_error_at_the_right_place(marked, message):
    text, line, col = _locate(marked)
    if marked.lstrip().startswith("SELECT a.x"):
        text = text.replace("a.x", "a.len")
    with pytest.raises(QueryError) as info:
        analyse(text)
    err = info.value
    assert message in err.message
    assert (err.line, err.column) == (line, col), str(err)
    # the rendered message shows the offending line with a marker
    assert text.splitlines()[line - 1] in str(err) and "^" in str(err)


def test_undeclared_or_mistyped_run_parameters():
    text = "PARAM { n uint; } SELECT len FROM main.IP WHERE len > $n"
    with pytest.raises(ConfigError, match="parameter n: '-3' is not a uint"):
        analyse(text, params={"n": "-3"})
    with pytest.raises(ConfigError, match="unknown parameter"):
        analyse(text, params={"m": "3"})
    (aq,) = analyse(text, params={"n": "0x10"})
    assert aq.param_values == {"n": 16}


def test_param_default_must_match_its_type():
    with pytest.raises(QueryError, match="default of parameter n is not a uint"):
        analyse("PARAM { n uint = 'x'; } SELECT len FROM main.IP WHERE len > $n")
    (aq,) = analyse("PARAM { n uint = 5; } SELECT len FROM main.IP WHERE len > $n")
    assert aq.param_values == {"n": 5}


def test_temporal_inference():
    (aq,) = analyse("SELECT tb, srcIP, count(*) FROM main.IP GROUP BY (time + 30)/60*60 - 5 AS tb, srcIP")
    assert aq.temporal.name == "tb"
    assert aq.temporal.form == TimeForm(60 * 10**9, 30 * 10**9, 60, -5)
    assert aq.outputs[0].form == aq.temporal.form and aq.outputs[1].form is None
    # not increasing: division by a column, modulo
    with pytest.raises(QueryError, match="temporal group item"):
        analyse("SELECT t, count(*) FROM main.IP GROUP BY time % 60 AS t")


def test_temporal_column_of_a_query_is_temporal_for_its_reader():
    text = ("DEFINE { query_name m; } SELECT tb, count(*) AS c FROM main.IP GROUP BY time/60 AS tb;"
            "SELECT t5, SUM(c) FROM m GROUP BY tb/5 AS t5")
    m, r = analyse(text)
    assert m.outputs[0].form == TimeForm(60 * 10**9)
    assert r.temporal.form == TimeForm(300 * 10**9)


def test_qualified_names_in_joins_resolve_to_their_side():
    text = ("SELECT a.len, b.len, a.srcIP INNER_JOIN FROM main.TCP a, main.UDP b "
            "WHERE a.time = b.time AND a.srcIP = b.destIP")
    (aq,) = analyse(text)
    assert [(i.expr.table, i.expr.name) for i in aq.items] == [("a", "len"), ("b", "len"), ("a", "srcIP")]
    assert [i.name for i in aq.items] == ["len", "len_2", "srcIP"]
    assert aq.join_temporal is not None and len(aq.join_keys) == 1


def test_ipv4_queries_see_32_bit_addresses():
    (aq,) = analyse("SELECT srcIP, destIP FROM main.IPV4")
    assert [i.type for i in aq.items] == ["ipv4", "ipv4"]
    (aq,) = analyse("SELECT srcIP FROM main.IPV6")
    assert aq.items[0].type == "ip"
    assert isinstance(aq.items[0].expr, E.Field) and aq.items[0].expr.columns == ("srcIP_hi", "srcIP_lo")


def test_bare_protocol_reads_every_link():
    (aq,) = analyse("SELECT len FROM IP", links=("x", "y"))
    assert aq.sources[0].links == ("x", "y")


def test_several_errors_in_one_file_are_reported_by_the_parser_or_the_first_by_analysis():
    text = "SELECT len FROM main.IP;\nSELECT nope FROM main.IP"
    with pytest.raises(QueryError) as info:
        analyse(text)
    assert (info.value.line, info.value.column) == (2, 8)
