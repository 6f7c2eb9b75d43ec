"""GS-lite's GSQL syntax: its literals, operators, `#name`, query sets in any order and over
several files, DEFINE keys, and a located "not supported yet" for each construct we do not run."""

from __future__ import annotations

import logging

import pytest

from common.errors import ConfigError
from queries import expressions as E
from queries.analysis import analyse_file
from queries.constants import fold
from queries.errors import QueryError
from queries.parser import parse, parse_files
from queries.printer import to_gsql


def analyse(text, links=("main",), path="q.gsql"):
    return analyse_file(parse(text, path=path), list(links), source=text)


def item(text: str) -> E.Node:
    """The first SELECT item of `SELECT <text> FROM main.IP`, parsed."""
    return parse(f"SELECT {text} FROM main.IP").queries[0].statement.items[0].this


def analysed_item(text: str):
    (aq,) = analyse(f"SELECT {text} AS x FROM main.IP")
    return aq.items[0]


def _locate(marked: str) -> tuple[str, int, int]:
    """The text without its `§` marker, and the marker's line and column."""
    i = marked.index("§")
    text = marked[:i] + marked[i + 1:]
    return text, marked[:i].count("\n") + 1, i - (marked.rfind("\n", 0, i) + 1) + 1


# --- literals ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,value,type_", [
    ("HEX'7fff'", 0x7FFF, "uint"),
    ("HEX 'ffffffff'", 0xFFFF_FFFF, "uint"),
    ("hex'A0'", 0xA0, "uint"),
    ("LHEX'7abcdef012'", 0x7A_BCDE_F012, "ullong"),
    ("LHEX'ff'", 0xFF, "ullong"),
    ("LHEX'ffffffffffffffff'", 2**64 - 1, "ullong"),
    ("17UL", 17, "uint"),
    ("4294967295UL", 2**32 - 1, "uint"),
    ("1000000000000ULL", 10**12, "ullong"),
    ("17ULL", 17, "ullong"),
    ("TIMEVAL '12.5'", 12_500_000_000, "llong"),
    ("TIMEVAL '1.0005'", 1_000_000_000, "llong"),      # rint: half to even, as GS-lite
    ("TIMEVAL '1.0015'", 1_002_000_000, "llong"),
    ("TIMEVAL '-1.5'", -1_500_000_000, "llong"),
    ("TIMEVAL '7'", 7_000_000_000, "llong"),
])
def test_gslite_literals_fold_to_integers_of_their_type(text, value, type_):
    node = item(text)
    assert isinstance(node, E.Literal) and node.kind == "int" and node.value == value
    got = analysed_item(text)
    assert got.type == type_
    assert fold(got.expr) is not None and fold(got.expr)[1] == value


def test_suffixed_and_hex_literals_keep_their_type_through_arithmetic():
    assert analysed_item("LHEX'ff' + 1").type == "ullong"
    assert analysed_item("HEX'ff' + 1").type == "uint"
    assert analysed_item("17ULL * 2").type == "ullong"
    assert analysed_item("timestamp - TIMEVAL '1.5'").type == "llong"
    # a literal below 2**32 written plainly stays a uint: the suffix alone declares ullong
    assert analysed_item("17").type == "uint"


@pytest.mark.parametrize("marked,message", [
    ("SELECT §HEX'100000000' FROM main.IP", "does not fit in a uint"),
    ("SELECT §LHEX'xyz' FROM main.IP", "is not hexadecimal digits"),
    ("SELECT §4294967296UL FROM main.IP", "write 4294967296ULL"),
    ("SELECT §18446744073709551616ULL FROM main.IP", "does not fit in a ullong"),
    ("SELECT §TIMEVAL 'noon' FROM main.IP", "is not a number of seconds"),
    ("SELECT §HEX_L 'ff' FROM main.IP", "write HEX'ff'"),
    ("SELECT §LHEX_L 'ff' FROM main.IP", "name of GS-lite's token"),
])
def test_bad_gslite_literals_are_located(marked, message):
    text, line, col = _locate(marked)
    with pytest.raises(QueryError) as info:
        parse(text)
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (line, col)


def test_manual_ipv6_literal_with_dots():
    node = item("IPV6_VAL'0000.2222.4444.6666.8888.aaaa.cccc.eeee'")
    assert node.value == 0x0000_2222_4444_6666_8888_AAAA_CCCC_EEEE


# --- operators --------------------------------------------------------------------------------

def test_bang_is_not_binding_as_tightly_as_unary_minus():
    node = item("!len = 0")
    assert isinstance(node, E.Binary) and node.op == "="
    assert node.left == E.Unary(op="NOT", this=E.Column(name="len"))
    assert item("!!len") == E.Unary(op="NOT", this=E.Unary(op="NOT", this=E.Column(name="len")))
    # NOT (the keyword) stays loose: NOT a = b negates the comparison
    assert isinstance(item("NOT len = 0"), E.Unary)
    assert analysed_item("!len").type == "bool"
    assert item("len != 3").op == "<>"      # `!=` stays one operator


def test_unary_plus_is_the_identity():
    assert item("+len") == E.Column(name="len")
    assert item("-+3") == E.Unary(op="-", this=E.Literal(value=3, kind="int"))
    assert item("2 * +3") == item("2 * 3")


# --- round trip -------------------------------------------------------------------------------

ROUND_TRIP = """\
DEFINE { query_name rt; port 80; host 'h'; visibility 'external'; }
SELECT HEX'7fff', LHEX'7abcdef012', LHEX'ff', 17UL, 17ULL, 1000000000000ULL,
       TIMEVAL '12.5', TIMEVAL '-1.25', -TIMEVAL '2', !len, +ttl, !len = 1, #port, #host,
       count$(*), sum$(len), @Name, a.@Host
FILTER_JOIN(time, 15) FROM main.TCP a, main.TCP b
WHERE str_match_offset[0, 'HTTP', a.len] AND is_http_port[] AND a.x = b.x
GROUP BY time/60 AS tb, CUBE(srcIP, destIP AS d), ROLLUP(a, b),
         GROUPING_SETS((a, b), (c))
SUPERGROUP a, b
HAVING count(*) > 1
CLEANING WHEN count(*) > 10
CLEANING_BY count(*) > 1
CLOSING_WHEN count(*) = 0;
MERGE a.time : b.time SLACK 5 FROM x a, y b
"""


def test_round_trip_of_every_gslite_form():
    tree = parse(ROUND_TRIP)
    text = to_gsql(tree)
    assert parse(text) == tree
    assert to_gsql(parse(text)) == text
    assert "255ULL" in text and "TIMEVAL '12.500'" in text and "#port" in text
    assert "CLEANING_WHEN" in text           # the two-word spelling prints as GS-lite's lexer


# --- #name --------------------------------------------------------------------------------------

def test_define_reference_is_substituted_with_the_define_value():
    text = "DEFINE { port 80; host 'web'; } SELECT len FROM main.TCP WHERE destPort = #port " \
           "AND link = #host"
    (aq,) = analyse(text)
    literals = [n for n in aq.where.find_all(E.Literal)]
    assert E.Literal(value=80, kind="int") in literals
    assert E.Literal(value="web", kind="string") in literals
    assert not list(aq.where.find_all(E.DefineRef))


def test_define_reference_folds_and_keeps_its_own_position():
    tree = parse("DEFINE { n 60; } SELECT tb, count(*) FROM main.IP GROUP BY time/#n AS tb")
    ref = tree.queries[0].statement.group_by[0].this.right
    assert isinstance(ref, E.DefineRef) and fold(ref) == ("u", 60)
    (aq,) = analyse("DEFINE { n 60; } SELECT tb, count(*) FROM main.IP GROUP BY time/#n AS tb")
    assert aq.temporal is not None and aq.temporal.form.pane_ns == 60 * 10**9


def test_missing_define_key_is_a_located_error():
    text, line, col = _locate("DEFINE { port 80; }\nSELECT len FROM main.IP WHERE len = §#prot")
    with pytest.raises(QueryError) as info:
        parse(text, path="q.gsql")
    err = info.value
    assert "#prot: the query's DEFINE block has no key 'prot' (its keys: port)" in err.message
    assert (err.path, err.line, err.column) == ("q.gsql", line, col)


def test_a_key_read_as_define_reference_is_no_unknown_key():
    (aq,) = analyse("DEFINE { http_host 'x'; } SELECT len FROM main.IP WHERE link = #http_host")
    assert "http_host" not in aq.defines
    with pytest.raises(QueryError, match="unknown DEFINE key 'http_host'"):
        analyse("DEFINE { http_host 'x'; } SELECT len FROM main.IP")


# --- DEFINE keys --------------------------------------------------------------------------------

def test_gslite_define_keys_warn_and_are_ignored(caplog):
    text = "DEFINE {\n  query_name q;\n  visibility 'external';\n  real_time 'true';\n}\n" \
           "SELECT len FROM main.IP"
    with caplog.at_level(logging.WARNING):
        (aq,) = analyse(text)
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("q.gsql:3:3: DEFINE key 'visibility' is GS-lite's and has no "
                            "effect here") for m in messages), messages
    assert any(m.startswith("q.gsql:4:3: DEFINE key 'real_time'") for m in messages)
    assert "visibility" not in aq.defines and len(aq.warnings) == 2


def test_keys_neither_ours_nor_gslites_stay_errors():
    text, line, col = _locate("DEFINE { visibility x; §frobnicate 1; } SELECT len FROM main.IP")
    with pytest.raises(QueryError) as info:
        analyse(text)
    assert "unknown DEFINE key 'frobnicate'" in info.value.message
    assert (info.value.line, info.value.column) == (line, col)
    with pytest.raises(ConfigError, match="unknown DEFINE key 'visibility'"):
        analyse_file(parse("SELECT len FROM main.IP"), ["main"], overrides={"visibility": "x"})


# --- query sets ---------------------------------------------------------------------------------

def test_a_query_may_read_a_query_defined_later():
    # the manual's query set (6.3), reading tcp_pkts before defining it
    text = ("SELECT tb, srcIP, count(*)\nFROM tcp_pkts\nGROUP BY tb, srcIP;\n"
            "DEFINE{\n query_name tcp_pkts;\n}\nSELECT time/60 as tb, srcIP\nFROM main.TCP\n"
            "WHERE protocol = 6")
    out = analyse(text, path="count_tcp.gsql")
    assert [aq.name for aq in out] == ["tcp_pkts", "count_tcp"]     # dependency order
    assert out[1].sources[0].query == "tcp_pkts"


def test_independent_queries_keep_file_order():
    text = ("DEFINE { query_name c; } SELECT len FROM b; DEFINE { query_name a; } SELECT len "
            "FROM main.IP; DEFINE { query_name b; } SELECT len FROM a")
    assert [aq.name for aq in analyse(text)] == ["a", "b", "c"]
    text = ("DEFINE { query_name x; } SELECT len FROM main.IP; "
            "DEFINE { query_name y; } SELECT len FROM main.IP")
    assert [aq.name for aq in analyse(text)] == ["x", "y"]


def test_a_cycle_is_located_and_named():
    marked = ("DEFINE { query_name a; } SELECT len FROM b;\n"
              "DEFINE { query_name b; } SELECT len FROM §c;\n"
              "DEFINE { query_name c; } SELECT len FROM b;\n"
              "DEFINE { query_name d; } SELECT len FROM a")
    text, line, col = _locate(marked)
    with pytest.raises(QueryError) as info:
        analyse(text)
    err = info.value
    assert "queries read each other in a cycle: 'b' -> 'c' -> 'b'" in err.message
    assert (err.line, err.column) == (line, col)
    text, line, col = _locate("DEFINE { query_name a; } SELECT len FROM §a")
    with pytest.raises(QueryError, match="reads itself") as info:
        analyse(text)
    assert (info.value.line, info.value.column) == (line, col)


# --- several files ------------------------------------------------------------------------------

def test_parse_files_makes_one_query_set(tmp_path):
    top = tmp_path / "top.gsql"
    top.write_text("SELECT tb, c FROM counts")
    counts = tmp_path / "counts.v1.gsql"
    counts.write_text("DEFINE { query_name counts; }\n"
                      "SELECT tb, count(*) AS c FROM main.IP GROUP BY time/60 AS tb")
    tree = parse_files([top, counts])
    assert [(q.name, q.path) for q in tree.queries] == [("top", str(top)),
                                                       ("counts", str(counts))]
    out = analyse_file(tree, ["main"])
    assert [aq.name for aq in out] == ["counts", "top"]


def test_errors_of_parse_files_point_into_their_own_file(tmp_path):
    good = tmp_path / "good.gsql"
    good.write_text("SELECT len FROM main.IP")
    bad = tmp_path / "bad.gsql"
    bad.write_text("-- a comment\nSELECT len FROM main.IP WHERE nosuch > 1")
    with pytest.raises(QueryError) as info:
        analyse_file(parse_files([good, bad]), ["main"])
    err = info.value
    assert (err.path, err.line, err.column) == (str(bad), 2, 31)
    assert "WHERE nosuch > 1" in str(err)       # the snippet comes from bad.gsql
    worse = tmp_path / "worse.gsql"
    worse.write_text("SELECT (len FROM main.IP")
    with pytest.raises(QueryError) as info:
        parse_files([worse, tmp_path / "missing.gsql"])
    assert [e.path for e in info.value.all] == [str(worse), str(tmp_path / "missing.gsql")]


def test_parse_files_refuses_a_name_clash_naming_both_places(tmp_path):
    a = tmp_path / "a.gsql"
    a.write_text("DEFINE { query_name counts; }\nSELECT len FROM main.IP")
    b = tmp_path / "b.gsql"
    b.write_text("SELECT len FROM main.IP;\n\nDEFINE { query_name counts; } SELECT ttl FROM main.IP")
    with pytest.raises(QueryError) as info:
        parse_files([a, b])
    err = info.value
    assert err.message.startswith(f"query name 'counts' is already used at {a}:1:21")
    assert (err.path, err.line, err.column) == (str(b), 3, 21)


# --- constructs we do not run -------------------------------------------------------------------

UNSUPPORTED = [
    # CLOSING_WHEN runs (highlevel.running); what it cannot be combined with is located
    ("SELECT count(*) [RANGE 1 minute] AS n FROM main.IP GROUP BY srcIP "
     "§CLOSING_WHEN count(*) = 0", "CLOSING_WHEN carries groups from one time window to the "
     "next: it needs a temporal group item"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, CUBE(srcIP) "
     "§CLOSING_WHEN count(*) = 0", "CLOSING_WHEN with CUBE, ROLLUP or GROUPING_SETS"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb CLOSING_WHEN §avg(len)",
     "CLOSING_WHEN must be a condition, not a float value"),
    ("SELECT len FROM main.IP WHERE len > 0 §CLOSING_WHEN len = 0", "CLOSING_WHEN closes groups: it needs "
     "GROUP BY"),
    ("DEFINE { late 'correct'; } SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb "
     "§CLOSING_WHEN count(*) = 0", "late 'correct' is not for running aggregation"),
    ("SELECT tb, §MAX(TCP_data) FROM main.TCP GROUP BY time/60 AS tb CLOSING_WHEN count(*) = 0",
     "MAX over strings in a running aggregation (CLOSING_WHEN) is not supported"),
    # sampling queries run (queries.sampling); their rules are located
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb §CLEANING_WHEN count$(*) > 9",
     "CLEANING_WHEN needs CLEANING_BY"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb\n§CLEANING BY count(*) > 1",
     "CLEANING_BY needs CLEANING_WHEN"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, srcIP, destIP "
     "SUPERGROUP srcIP, §ttl", "SUPERGROUP item 'ttl' is not a GROUP BY item"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, srcIP SUPERGROUP §tb",
     "'tb' is the temporal group item"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb CLEANING_WHEN §count(*) > 9 "
     "CLEANING_BY count(*) > 1", "CLEANING_WHEN may not read the group's aggregates (COUNT)"),
    ("SELECT tb, §count$(*) FROM main.IP", "a sampling query (super-aggregates, "
     "SUPERGROUP, CLEANING_WHEN/BY) groups its rows"),
    ("SELECT tb, count(*) FROM main.IP WHERE §sum$(len) > 3 GROUP BY time/60 AS tb",
     "super-aggregate SUM$ is not allowed in WHERE"),
    ("SELECT tb, §ssdo_clean() FROM main.IP GROUP BY time/60 AS tb",
     "SELECT may call only the stateful functions that read the final state"),
    ("SELECT tb, count(*) FROM main.IP WHERE §ssample(len) = TRUE GROUP BY time/60 AS tb",
     "stateful function ssample takes 2 argument(s)"),
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, srcIP HAVING "
     "§ssfinal_clean(srcIP) = TRUE", "stateful function ssfinal_clean takes numbers"),
    ("SELECT tb, §local_count() FROM main.IP GROUP BY time/60 AS tb",
     "function local_count is not supported yet (a GS-lite stateful function"),
    ("SELECT len, §@Name FROM main.IP", "GS-lite construct interface property @Name"),
    ("SELECT len FROM main.IP t WHERE §t.@Dir = 1", "interface property @Dir"),
    ("SELECT len FROM main.TCP WHERE len > 0 AND §http_port[destPort]",
     "GS-lite predicate http_port[...] is not known (oopscope has no predicate functions"),
    ("SELECT len FROM main.TCP WHERE §str_match_offset[0, 'HTTP', len]",
     "str_match_offset does not take (uint, string, uint)"),
    ("SELECT len FROM main.TCP WHERE str_regex_match[TCP_data, §link]",
     "the regular expression of str_regex_match must be a string literal"),
    ("SELECT tb, §median(len) FROM main.IP GROUP BY time/60 AS tb",
     "unknown aggregate 'median' (aggregates: COUNT, SUM, MIN, MAX, AVG"),
    ("SELECT tb FROM main.IP GROUP BY time/60 AS tb HAVING §mediann(len) > 2",
     "unknown aggregate 'mediann'"),
    ("SELECT tb, §moving_avg(len, 5) FROM main.TCP GROUP BY time/10 as tb",
     "aggregate moving_avg is not supported yet (a GS-lite user-defined aggregate"),
    ("SELECT §coutn(len) FROM main.IP", "unknown function 'coutn' (functions: "),
    ("SELECT §if_els(len > 1, 1, 0) FROM main.IP", "did you mean if_else?"),
    ("SELECT tb, §frob(tb) FROM main.IP GROUP BY time/60 AS tb", "unknown function 'frob'"),
    ("SELECT len FROM main.IP WHERE str_file_regex_match(link, §'nosuch.txt', 1, 2) = 1",
     "regular expression file nosuch.txt: not found"),
    ("SELECT getlpmid(srcIP, §'./nosuch_local.tbl') FROM main.IPV4",
     "prefix file ./nosuch_local.tbl: not found"),
    ("SELECT §str_between_substrings(link, 'a', 'b') FROM main.IP",
     "function str_between_substrings is not supported yet"),
    ("SELECT §timestamptosec(time) FROM main.IP",
     "function timestamptosec is not supported yet: timestamp is in nanoseconds here"),
    ("SELECT §get_int(link, 'x') FROM main.IP", "get_int does not take (string, string)"),
    ("SELECT len, §ssthreshold() FROM main.IP WHERE ssample(len, 100) = TRUE",
     "a selection may call stateful functions in WHERE only"),
]


@pytest.mark.parametrize("marked,message", UNSUPPORTED, ids=[m for _, m in UNSUPPORTED])
def test_unsupported_construct_is_located(marked, message):
    text, line, col = _locate(marked)
    with pytest.raises(QueryError) as info:
        analyse(text)
    err = info.value
    assert message in err.message, err.message
    assert (err.path, err.line, err.column) == ("q.gsql", line, col), str(err)
    assert "^" in str(err)


@pytest.mark.parametrize("marked,message", [
    ("SELECT len FROM §'dwarf9'.eth0.IP", "host-qualified source 'host'.iface.PROTOCOL"),
    ("SELECT len FROM §dwarf9.eth0.IP", "host-qualified source host.iface.PROTOCOL"),
    ("SELECT len FROM §csv_example/ex2_src", "library query name (lib/query)"),
    ("SELECT §$ FROM main.IP", "'$' must start a parameter name"),
    ("SELECT tb, §cnt(*) FROM main.IP GROUP BY time/60 AS tb", "unknown aggregate 'cnt'"),
])
def test_unsupported_sources_are_parse_errors(marked, message):
    text, line, col = _locate(marked)
    with pytest.raises(QueryError) as info:
        parse(text)
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (line, col)


def test_the_first_construct_in_the_text_is_reported():
    text, line, col = _locate("SELECT tb, §@Name FROM main.IP WHERE http_port[destPort] "
                              "GROUP BY time/60 AS tb, CUBE(srcIP)")
    with pytest.raises(QueryError) as info:
        analyse(text)
    assert (info.value.line, info.value.column) == (line, col)


# --- the manual's queries -------------------------------------------------------------------------
# Taken verbatim from tigon-sql-user-manual-2014.txt, but for what its PDF conversion added:
# a `!` (an image marker) before some lines, curly quotes, and a string broken over two lines.

MANUAL = {
    "6.2.1 selection": "SELECT  sourceIP, destIP \nFROM IPV4 \nWHERE protocol=1 ",
    "6.2.7 comments": ("//  A simple query \nSELECT  sourceIP, destIP // just source and dest \n"
                       "FROM IPV4 \nWHERE protocol=6   -- All TCP  "),
    "6.2.9 outer join": ("SELECT R.sourceIP, R.destIP, R.tb, R.length_sum,S.length_sum \n"
                         "OUTER_JOIN from Inpackets R, Outpackets S \n"
                         "WHERE R.sourceIP = S.destIP and R.destIP = S.sourceIP and \n"
                         "R.tb = S.tb"),
    "6.2.10 filter join": (
        "DEFINE{ \n        algorithm hash; \n} \n"
        " SELECT R.subinterface, R.time, R.timewarp, R.srcIP, R.srcPort, \nR.destIP, R.destPort, \n"
        "        R.sequence_number, R.ack_number \nFILTER_JOIN(time, 15) from   TCP R,TCP S \n"
        " WHERE  R.srcIP = S.srcIP and        //key \n        R.destIP = S.destIP and      //key \n"
        "        R.srcPort = S.srcPort and    //key \n        R.destPort = S.destPort and  //key \n"
        "        R.protocol = 6 and \n        S.protocol = 6 and \n        R.offset = 0 and \n"
        "        S.offset = 0 and \n        R.data_length <> 0 and \n"
        "        S.data_length <> 0 and \n        str_match_offset[0,'HTTP',S.TCP_data] and \n"
        "        str_regex_match[R.TCP_data,'.(mov|wav|mp3|mpg|mpeg|wma|wmv'] \n"
        " //  expensive single relational predicate "),
    "6.2.11 group by": ("SELECT sourceIP, tb, count(*), max(offset) \nFROM eth0.IPV4 T \n"
                        "WHERE T.protocol=1 \nGROUP BY T.sourceIP, T.time/60 as tb \n"
                        "HAVING count(*) > 5 "),
    "6.2.11.2 cube": (" SELECT sourceIP, destIP, count(*) \nFROM eth0.IPV4 T \n"
                      "GROUP BY T.time/60 as tb, Cube(sourceIP, destIP) "),
    "6.2.12 running aggregation": (" SELECT tb, srcIP, moving_avg(len,5) \n FROM TCP \n"
                                   " WHERE protocol = 6 \n GROUP BY time/10 as tb, srcIP \n"
                                   " HAVING moving_avg(len,5)>0 \n CLOSING_WHEN count(*)=0 "),
    "6.2.14 merge": "Merge P1.tb : P2.tb \nFROM PacketSum1 P1, PacketSum2 P2 ",
    "6.3 query set": (" SELECT tb, srcIP, count(*) \n FROM tcp_pkts \n GROUP BY tb, srcIP; \n"
                      " DEFINE{ \n  query_name tcp_pkts; \n } \n SELECT time/60 as tb, srcIP \n"
                      " FROM TCP \n WHERE protocol = 6 and offset = 0 "),
    "9.1.2 aggregation": ("DEFINE { \nquery_name 'src'; \naggregate_slots 2000; \n} \n"
                          "SELECT tb*300 as timebucket, srcIP, sum(len) as total_bytes, "
                          "count(*) \nas packets \nFROM [default].IPV4 \nWHERE ipversion=4 \n"
                          "GROUP BY time/300 as tb, srcIP "),
    "9.1.3 computed groups": (
        "SELECT tb*60, min(timestamp), max(timestamp), \n"
        "          destIP, dest_port, hostheader, count(*) \nFROM TCP \n"
        "WHERE ipversion=4 and offset=0 and protocol=6 and  \n"
        "          str_match_start[TCP_data, 'GET'] \n"
        "GROUP BY time/60 as tb, destIP, dest_port, \n"
        " str_extract_regex(TCP_data,'[Hh][Oo][Ss][Tt]: [0-9A-Z\\\\.:]*') as \n Hostheader \n"
        "HAVING count (*) > 1 "),
    "9.1.5 query set": (
        "DEFINE{ \nquery_name 'traffic';  \n} \n"
        "SELECT tb*300 as timebucket, application, localID, remoteID, direction, \n"
        "        SUM(packets) ,SUM(total_bytes) \nFROM total \nGROUP BY \n"
        "        timebucket/300 as tb, \n        application, \n        localID, \n"
        "        remoteID, \n        direction \n; \n"
        "DEFINE{ \nquery_name 'total';  \n} \nmerge t1.timebucket : t2.timebucket  \n"
        "FROM traffic_baseflow t1 ,  traffic_portflow t2 \n; \n"
        "DEFINE { \nquery_name 'traffic_baseflow'; \naggregate_slots '8192'; \n} \n"
        "SELECT  time as timebucket, application,localID,remoteID,direction, \n"
        "        ULLONG(COUNT(*)) as packets, \n        ULLONG(SUM(len)) as total_bytes \n"
        "FROM IPV4 \nWHERE ipversion=4 and not (offset=0 and (protocol=6 or protocol=17)) \n"
        "GROUP BY \n        time, \n"
        "        prot2app(protocol,'../../mappings/protocolclass') as \napplication, \n"
        "        getlpmid(srcIP,'./remoteprefix.tbl') + INT(1) as localID, \n"
        "        getlpmid(destIP,'./remoteprefix.tbl') + INT(1) as remoteID, \n"
        "        INT(1000) as direction \n;              \n"
        "DEFINE { \nquery_name 'traffic_portflow'; \n} \n"
        "SELECT  time as timebucket, application, localID,remoteID,direction, \n"
        "         ULLONG(COUNT(*)) as packets, \n        ULLONG(SUM(len)) as total_bytes \n"
        "FROM DataProtocol \nWHERE ipversion=4 and offset=0 and (protocol=6 or protocol=17) \n"
        "GROUP BY \n        time, \n        port2app(protocol, srcPort, destPort, \n"
        "           '../../mappings/port2class.txt')  as application, \n"
        "        getlpmid(srcIP,'./remoteprefix.tbl') + INT(1) as localID, \n"
        "        getlpmid(destIP,'./remoteprefix.tbl') + INT(1) as remoteID, \n"
        "        INT(1000) as direction \n"),
    "13.8 local triggers": (
        "DEFINE { \nquery_name 'type_header' ; \nreal_time 'true'; \nvisibility 'external'; \n} \n"
        "SELECT @Host, @Name,time,len,timewarp,raw_packet_data \nFROM IPV4 \n"
        "WHERE ipversion = 4 and total_length < hdr_length \n; "),
}


@pytest.mark.parametrize("name", sorted(MANUAL))
def test_the_manuals_queries_get_past_the_parser(name):
    tree = parse(MANUAL[name], path="manual.gsql")
    assert tree.queries
    again = parse(to_gsql(tree))
    assert [q.statement for q in again.queries] == [q.statement for q in tree.queries]


@pytest.mark.parametrize("name,message", [
    ("6.2.12 running aggregation", "aggregate moving_avg is not supported yet"),
    ("9.1.5 query set", "unknown function 'prot2app'"),    # traffic_baseflow comes first
    ("13.8 local triggers", "GS-lite construct interface property @Host"),
])
def test_the_manuals_gslite_constructs_are_named(name, message):
    with pytest.raises(QueryError) as info:
        analyse(MANUAL[name])
    assert message in info.value.message


def test_merge_slack_is_accepted_with_a_warning(caplog):
    """GS-lite's runtime does not apply a MERGE's SLACK; ours is exact under any disorder, so
    the plan is the MERGE's own and a located warning says the slack changes nothing."""
    from queries.planner import plan_text

    head = "DEFINE { query_name m; } MERGE a.time : b.time"
    with caplog.at_level("WARNING"):
        slack = plan_text(f"{head} SLACK 10 FROM main.IP a, main.IP b", ["main"])
    plain = plan_text(f"{head} FROM main.IP a, main.IP b", ["main"])
    assert slack.queries[0].high == plain.queries[0].high
    assert "1:48: MERGE ... SLACK has no effect here" in caplog.text
