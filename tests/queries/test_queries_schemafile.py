"""Schema files (GS-lite's packet_schema.txt format): reading, errors at file:line:col, record
protocols in the analysis and the plans, Gigascope's packet field names, `explain --schema`."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from capture.schema import BUILTIN, GIGASCOPE_ALIASES, PROTOCOLS, protocol_fields
from lowlevel.operator import LowLevelOperator
from queries.errors import QueryError, SchemaError
from queries.explain import explain_text
from queries.planner import plan_text
from queries.schemafile import TYPES, load_schema, schema_for, schema_from_text

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gslite"
#: GS-lite's cfg/packet_schema.txt, verbatim
GSLITE_SCHEMA = FIXTURES / "packet_schema.txt"
DOC = Path(__file__).resolve().parents[2] / "docs" / "gsql.md"


@pytest.fixture(scope="module")
def gslite():
    return load_schema([GSLITE_SCHEMA])


def schema_error(text: str, path: str = "s.txt") -> SchemaError:
    with pytest.raises(SchemaError) as info:
        schema_from_text(text, path)
    return info.value


# --- GS-lite's own schema file -----------------------------------------------------------------

def test_gslite_packet_schema_reads(gslite):
    assert gslite.files == (str(GSLITE_SCHEMA),)
    assert {"base", "CSV_EXAMPLE", "CSV_TCPEXAMPLE", "GDAT_EXAMPLE"} <= set(gslite.names())
    assert "csv_example" in gslite and gslite.canonical("csv_example") == "CSV_EXAMPLE"
    base = gslite.protocol("base")
    assert base.record is None and not base.queryable
    assert [gslite.protocol(p).record for p in ("CSV_EXAMPLE", "CSV_TCPEXAMPLE",
                                                "GDAT_EXAMPLE")] == ["csv", "csv", "gdat"]
    assert gslite.protocol("CSV_EXAMPLE").where == f"{GSLITE_SCHEMA}:6"
    fields = gslite.fields("CSV_EXAMPLE")
    # inherited fields first, then the protocol's own
    assert list(fields)[:3] == ["systemTime", "schemaId", "uintInPosition1"]
    assert {n: f.type for n, f in fields.items()} == {
        "systemTime": "uint", "schemaId": "uint", "uintInPosition1": "uint",
        "ullongInPosition2": "ullong", "ipInPosition3": "ipv4", "ipv6InPosition4": "ip",
        "stringInPosition5": "string", "boolInPosition6": "bool", "intInPosition7": "int",
        "llongInPosition8": "llong", "floatInPosition9": "float"}
    assert fields["ipv6InPosition4"].columns == ("r.ipv6InPosition4_hi", "r.ipv6InPosition4_lo")
    assert fields["uintInPosition1"].columns == ("r.uintInPosition1",)
    assert fields["uintInPosition1"].accessor == "get_csv_uint_pos1"
    assert fields["systemTime"].properties == {"low_cardinality", "required", "increasing",
                                               "snap_len 0"}


def test_clock_of_the_gslite_protocols(gslite):
    csv = gslite.record_format("CSV_EXAMPLE")
    assert (csv.kind, csv.clock, csv.clock_unit_ns, csv.system_clock) == \
        ("csv", "systemTime", 10**9, True)
    tcp = gslite.record_format("CSV_TCPEXAMPLE")
    assert (tcp.clock, tcp.system_clock) == ("ivalue", False)
    assert gslite.record_format("IPV4") is None


# --- the format --------------------------------------------------------------------------------

def test_comments_unpack_functions_and_several_parents():
    schema = schema_from_text("""
-- a comment
UNPACK_FCNS {
    unpack_TCP unpack_tcp_group 2;
    foo unpack_foo_group 1;
    bar unpack_bar_group 1
}
PROTOCOL clock { ullong ts get_csv_ullong_pos1 (increasing); }   // the time
PROTOCOL tags { string tag get_csv_string_pos2 (subtype 'label', snap_len 20); }
PROTOCOL both (clock, tags) [unpack_TCP] {
    ushort port get_csv_uint_pos3 (required) [foo, bar];
}
""")
    both = schema.protocol("both")
    assert (both.parent, both.parents, both.record) == ("clock", ("tags",), "csv")
    fields = schema.fields("both")
    assert list(fields) == ["ts", "tag", "port"]
    assert fields["port"].type == "uint"            # ushort is read as a uint
    assert fields["tag"].properties == {"subtype label", "snap_len 20"}
    fmt = schema.record_format("both")
    assert (fmt.clock, fmt.clock_unit_ns) == ("ts", 1)   # a 64-bit clock counts ns


@pytest.mark.parametrize("spelling", sorted(TYPES))
def test_every_type_spelling(spelling):
    ours = TYPES[spelling]
    accessor = {"ipv4": "ip", "ip": "ipv6"}.get(ours, ours)
    schema = schema_from_text(f"PROTOCOL P {{ {spelling} x get_gdat_{accessor}_pos1; }}")
    assert schema.fields("P")["x"].type == ours


def test_the_manual_type_names():
    assert {k: TYPES[k] for k in ("IP", "IPV6", "ushort", "v_str", "string", "int")} == {
        "IP": "ipv4", "IPV6": "ip", "ushort": "uint", "v_str": "string", "string": "string",
        "int": "int"}


def test_unknown_attribute_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="queries.schemafile"):
        schema = schema_from_text("PROTOCOL P {\n  uint x get_csv_uint_pos1 (fancy);\n}", "w.txt")
    assert "fancy" in schema.fields("P")["x"].properties
    assert "w.txt:2:29: unknown field attribute 'fancy'" in caplog.text


def test_a_builtin_protocol_is_skipped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="queries.schemafile"):
        schema = schema_from_text("PROTOCOL TCP (IP) {\n  uint ttl get_ipv4_ttl;\n}", "b.txt")
    assert schema.protocol("TCP") is PROTOCOLS["TCP"]
    assert "b.txt:1:10: protocol TCP is built in" in caplog.text


ERRORS = [
    ("PROTOCOL P { uint8 x get_csv_uint_pos1; }", 1, 14, "unknown type 'uint8'"),
    ("PROTOCOL P { ip x get_csv_ip_pos1; }", 1, 14, "did you mean IP?"),
    ("PROTOCOL P {\n  uint a get_csv_uint_pos1;\n  uint b get_gdat_uint_pos2;\n}", 3, 10,
     "mixes record formats: b is read by get_gdat_uint_pos2 (at s.txt:3:8) but a by "
     "get_csv_uint_pos1 (at s.txt:2:8)"),
    ("PROTOCOL A { uint a get_csv_uint_pos1; }\nPROTOCOL B (A) { uint b get_gdat_uint_pos2; }",
     2, 25, "mixes record formats"),
    ("PROTOCOL P { uint x get_csv_ullong_pos2; }", 1, 21,
     "declared uint but get_csv_ullong_pos2 reads a ullong"),
    ("PROTOCOL P { IPV6 x get_csv_ip_pos2; }", 1, 21, "read it with get_csv_ipv6_pos2"),
    ("PROTOCOL P { uint x get_csv_uint_pos0; }", 1, 21, "record positions start at 1"),
    ("PROTOCOL P { uint x get_csv_uint_pos1;\n  uint x get_csv_uint_pos2; }", 2, 8,
     "field x is declared twice in protocol P: here and at s.txt:1:19"),
    ("PROTOCOL A { uint x get_csv_uint_pos1; }\nPROTOCOL B { uint x get_csv_uint_pos2; }\n"
     "PROTOCOL C (A, B) { uint y get_csv_uint_pos3; }", 3, 10,
     "protocol C has field x twice, through its parents: at s.txt:1:19 and at s.txt:2:19"),
    ("PROTOCOL A (B) { uint a get_csv_uint_pos1; }\nPROTOCOL B (A) { uint b get_csv_uint_pos2; }",
     1, 10, "inheritance cycle: A -> B -> A"),
    ("PROTOCOL A (nope) { uint a get_csv_uint_pos1; }", 1, 13, "unknown parent protocol 'nope'"),
    ("PROTOCOL A (IPV4) { uint a get_csv_uint_pos1; }", 1, 13,
     "inherits from the built-in packet protocol IPV4"),
    ("PROTOCOL A { uint a get_csv_uint_pos1; }\nPROTOCOL a { uint b get_csv_uint_pos1; }", 2, 10,
     "protocol a is declared twice: here and at s.txt:1:10"),
    ("PROTOCOL A { uint a; }", 1, 19, "field a of protocol A has no access function"),
    ("PROTOCOL A { uint a get_csv_uint_pos1 (snap_len); }", 1, 40,
     "field attribute snap_len needs a value"),
    ("PROTOCOL A { uint a get_csv_uint_pos1 (increasing 3); }", 1, 51,
     "field attribute increasing takes no value"),
    ("PROTOCOL A { string t get_system_time; }", 1, 14, "get_system_time gives an integer"),
    ("protocol A { uint a get_csv_uint_pos1; }", 1, 1, "write PROTOCOL in capitals"),
    ("PROTOCOL A { uint a get_csv_uint_pos1; } #", 1, 42, "unexpected character '#'"),
    ("/* no */ PROTOCOL A { uint a get_csv_uint_pos1; }", 1, 1, "unexpected character '/'"),
    ("STREAM S { uint a; }", 1, 1, "STREAM declarations are not supported"),
    ("PROTOCOL A { uint a get_csv_uint_pos1 }", 1, 39,
     "expected ';' after the declaration of field a, found '}'"),
    ("PROTOCOL A { }", 1, 14, "protocol A declares no field"),
    ("PROTOCOL A { uint a get_csv_uint_pos1;", 1, 39, "expected '}' to close protocol A, "
     "found the end of the file"),
]


#: declarations oopscope cannot read: the file loads, the protocol is refused when read
UNREADABLE = [
    ("PROTOCOL P { timeval x get_csv_uint_pos1; }", "field x is a timeval", "s.txt:1:14"),
    ("PROTOCOL P { uint x get_ipv4_ttl; }",
     "field x is read by get_ipv4_ttl, which is not a record access function", "s.txt:1:21"),
]


@pytest.mark.parametrize("text,fragment,place", UNREADABLE, ids=[u[1][:30] for u in UNREADABLE])
def test_unreadable_protocols_load_and_are_refused_when_read(text, fragment, place, caplog):
    schema = schema_from_text(text, "s.txt")
    assert fragment in schema.protocol("P").unreadable
    assert any(fragment in r.getMessage() and place in r.getMessage() for r in caplog.records)
    with pytest.raises(QueryError) as info:
        plan_text("SELECT x FROM [csv].P", ["csv"], schema=schema)
    assert "protocol P" in str(info.value) and fragment in str(info.value)


@pytest.mark.parametrize("text,line,col,fragment", ERRORS, ids=[e[3][:40] for e in ERRORS])
def test_errors_say_file_line_col(text, line, col, fragment):
    err = schema_error(text)
    assert isinstance(err, QueryError)
    assert (err.path, err.line, err.column) == ("s.txt", line, col), str(err)
    assert str(err).startswith(f"s.txt:{line}:{col}: ")
    assert fragment in err.message, err.message
    assert "^" in str(err).splitlines()[-1]


def test_unreadable_file_is_a_schema_error(tmp_path):
    with pytest.raises(SchemaError, match="no such schema file"):
        load_schema([tmp_path / "missing.txt"])


def test_protocols_may_extend_those_of_an_earlier_load(gslite, tmp_path):
    more = tmp_path / "more.txt"
    more.write_text("PROTOCOL MORE (base) { uint v get_csv_uint_pos1; }\n")
    schema = load_schema([more], base=gslite)
    assert list(schema.fields("MORE")) == ["systemTime", "schemaId", "v"]
    assert schema.files == (str(GSLITE_SCHEMA), str(more))
    dup = tmp_path / "dup.txt"
    dup.write_text("PROTOCOL CSV_EXAMPLE { uint v get_csv_uint_pos1; }\n")
    with pytest.raises(SchemaError, match=r"dup.txt:1:10: protocol CSV_EXAMPLE is already "
                                          r"declared \(at .*packet_schema.txt:6\)"):
        load_schema([dup], base=gslite)


# --- schema_for: the packet_schema.txt beside a query file --------------------------------------

def test_schema_beside_the_query_file(tmp_path, caplog):
    (tmp_path / "packet_schema.txt").write_text(GSLITE_SCHEMA.read_text())
    query = tmp_path / "q.gsql"
    with caplog.at_level(logging.INFO, logger="queries.schemafile"):
        schema = schema_for([query])
    assert "CSV_EXAMPLE" in schema
    assert schema.files == (str(tmp_path / "packet_schema.txt"),)
    assert "beside the query file" in caplog.text and "as GS-lite does" in caplog.text
    # the same file given with --schema is read once
    again = schema_for([query], [tmp_path / "packet_schema.txt"])
    assert again.files == (str(tmp_path / "packet_schema.txt"),)
    assert schema_for([tmp_path / "sub" / "q.gsql"]) is BUILTIN


# --- record protocols in queries ---------------------------------------------------------------

@pytest.mark.parametrize("source,links", [("CSV_EXAMPLE", ["main"]),
                                          ("[csv].CSV_EXAMPLE", ["csv"]),
                                          ("csv.csv_example", ["csv"])])
def test_record_sources_plan(gslite, source, links):
    fp = plan_text(f"SELECT systemTime, uintInPosition1, count(*) AS n FROM {source} "
                   f"GROUP BY systemTime, uintInPosition1", links, schema=gslite)
    q = fp.queries[0]
    assert [p.link for p in q.low] == links
    low = q.low[0]
    assert low.protocol == "CSV_EXAMPLE"
    assert low.record == gslite.record_format("CSV_EXAMPLE")
    # GS-lite groups by systemTime directly: it is the clock, so it makes 1-second windows
    assert low.window is not None and low.window.pane_ns == 10**9
    assert q.high.window.column == "systemTime"
    assert [k.name for k in low.keys] == ["uintInPosition1"]
    assert low.keys[0].expr.columns == ("r.uintInPosition1",)


def test_the_clock_makes_windows_like_time(gslite):
    fp = plan_text("SELECT tb, value, sum(value) AS s FROM CSV_TCPEXAMPLE "
                   "GROUP BY ivalue/10 AS tb, value", ["main"], schema=gslite)
    w = fp.queries[0].low[0].window
    assert (w.pane_ns, w.column) == (10 * 10**9, "tb")
    spec = plan_text("SELECT count(*) [RANGE 10 seconds, SLIDE 5 seconds] AS n "
                     "FROM CSV_TCPEXAMPLE", ["main"], schema=gslite)
    assert spec.queries[0].low[0].window.range_ns == 10 * 10**9
    # in CSV_TCPEXAMPLE systemTime is an ordinary field: ivalue is the clock
    with pytest.raises(QueryError, match="needs a temporal group item"):
        plan_text("SELECT systemTime, count(*) FROM CSV_TCPEXAMPLE GROUP BY systemTime",
                  ["main"], schema=gslite)


def test_selection_and_join_over_records(gslite):
    sel = plan_text("SELECT ivalue, value FROM CSV_TCPEXAMPLE WHERE value > 3", ["csv"],
                    schema=gslite).queries[0]
    assert sel.kind == "select" and sel.low[0].record.protocol == "CSV_TCPEXAMPLE"
    join = plan_text("SELECT l.ivalue, l.value, r.value AS rv INNER_JOIN FROM "
                     "a.CSV_TCPEXAMPLE l, b.CSV_TCPEXAMPLE r WHERE l.ivalue = r.ivalue",
                     ["a", "b"], schema=gslite).queries[0]
    assert [(p.link, p.side, p.record.kind) for p in join.low] == [("a", "l", "csv"),
                                                                    ("b", "r", "csv")]


def test_protocol_errors_in_queries(gslite):
    with pytest.raises(QueryError) as info:
        plan_text("SELECT a\nFROM main.FOO", ["main"], path="t.gsql")
    assert str(info.value).startswith("t.gsql:2:11: unknown protocol 'FOO' (one of PACKET, IP")
    with pytest.raises(QueryError) as info:
        plan_text("SELECT a\nFROM [main, x].FOO", ["main", "x"], path="t.gsql", schema=gslite)
    assert str(info.value).startswith("t.gsql:2:16: unknown protocol 'FOO'")
    assert "CSV_EXAMPLE" in info.value.message and str(GSLITE_SCHEMA) in info.value.message
    with pytest.raises(QueryError, match=r"t.gsql:1:24: protocol base .* is a base of record "
                                         r"protocols; read one of those \(CSV_EXAMPLE"):
        plan_text("SELECT systemTime FROM base", ["main"], path="t.gsql", schema=gslite)
    with pytest.raises(QueryError, match="unknown column 'time' in protocol CSV_EXAMPLE"):
        plan_text("SELECT time FROM CSV_EXAMPLE", ["main"], schema=gslite)


# --- GS-lite's demos, verbatim -----------------------------------------------------------------

@pytest.mark.parametrize("demo,links,kinds", [
    ("csvexample/example.gsql", ["csv"], [("example", "aggregate", "csv")]),
    ("gdatexample/example.gsql", ["gdat"], [("example", "aggregate", "gdat")]),
    # CSV_SINGLE is an interface there: CSV_SINGLE.SingleFile reads protocol SingleFile
    ("pipe/queries.gsql", ["CSV_SINGLE"], [("example1", "aggregate", "csv"),
                                           ("example2", "select", "csv")]),
])
def test_gslite_demos_plan_with_their_schema(demo, links, kinds):
    path = FIXTURES / demo
    schema = schema_for([path])
    assert schema.files == (str(path.parent / "packet_schema.txt"),)
    fp = plan_text(path.read_text(), links, path=str(path), schema=schema)
    assert [(q.name, q.kind, q.low[0].record.kind) for q in fp.queries] == kinds
    first = fp.queries[0]
    # they group by systemTime directly: one window per second of the record clock
    assert first.high.window.pane_ns == 10**9 and first.high.window.column == "systemTime"


def test_explain_shows_schema_record_format_and_clock(gslite):
    text = explain_text("SELECT tb, count(*) AS n FROM CSV_TCPEXAMPLE GROUP BY ivalue/10 AS tb",
                        links=["csv"], schema=gslite)
    assert f"schema files: {GSLITE_SCHEMA}" in text
    assert "records: csv (systemTime uint = get_system_time, schemaId uint = get_schemaId, " \
           "ivalue uint = get_csv_uint_pos1, value uint = get_csv_uint_pos2)" in text
    assert "clock: ivalue, the record's increasing field read by get_csv_uint_pos1, in " \
           "seconds" in text
    assert "window: tumbling 10s" in text


def test_explain_cli_takes_schema_files(tmp_path):
    from click.testing import CliRunner

    from tools.cli import cli

    query = tmp_path / "q.gsql"
    query.write_text("SELECT systemTime, count(*) AS n FROM [csv].CSV_EXAMPLE GROUP BY "
                     "systemTime\n")
    res = CliRunner().invoke(cli, ["explain", str(query), "--schema", str(GSLITE_SCHEMA)])
    assert res.exit_code == 0, res.output
    assert f"schema files: {GSLITE_SCHEMA}" in res.output
    assert "records: csv (" in res.output
    assert "clock: systemTime = the wall clock when a record is read (get_system_time)" \
        in res.output
    missing = CliRunner().invoke(cli, ["explain", str(query), "--schema", str(tmp_path / "no")])
    assert missing.exit_code == 2 and "--schema" in missing.output
    unknown = CliRunner().invoke(cli, ["explain", str(query)])
    assert unknown.exit_code == 1
    assert "unknown protocol 'CSV_EXAMPLE'" in str(unknown.exception)


# --- Gigascope's packet field names ------------------------------------------------------------

ALIAS_PAIRS = [
    ("SELECT tb, sourceIP AS a, source_port AS p, count(*) AS n FROM IPV4 WHERE offset = 0 "
     "AND total_length > 40 GROUP BY time/60 AS tb, sourceIP AS s, source_port AS sp",
     "SELECT tb, srcIP AS a, srcPort AS p, count(*) AS n FROM IPV4 WHERE frag_offset = 0 "
     "AND ip_len > 40 GROUP BY time/60 AS tb, srcIP AS s, srcPort AS sp"),
    ("SELECT time, sourceIP AS a, dest_port AS b, sequence_number AS c, ack_number AS d, "
     "data_length AS e FROM TCP",
     "SELECT time, srcIP AS a, destPort AS b, seq AS c, ack AS d, payload_len AS e FROM TCP"),
    ("SELECT time, source_port AS a FROM [l1, l2].UDP WHERE dest_port = 53",
     "SELECT time, srcPort AS a FROM [l1, l2].UDP WHERE destPort = 53"),
]


@pytest.mark.parametrize("gigascope,ours", ALIAS_PAIRS)
def test_gigascope_names_plan_as_ours(gigascope, ours):
    a = plan_text(gigascope, ["l1", "l2"]).queries[0]
    b = plan_text(ours, ["l1", "l2"]).queries[0]
    assert a.low == b.low
    assert a.high == b.high


def test_aliases_keep_the_protocol_type():
    assert protocol_fields("IPV4")["sourceIP"].type == "ipv4"
    assert protocol_fields("IP")["sourceIP"].type == "ip"
    for alias, (ours, _) in GIGASCOPE_ALIASES.items():
        for p in PROTOCOLS:
            fields = protocol_fields(p)
            assert (alias in fields) == (ours in fields), (p, alias)


def test_payload_fields_are_read_only_by_the_queries_naming_them():
    plan = plan_text("SELECT time\nFROM TCP WHERE data_length > 0 AND TCP_data = 'GET'",
                     ["main"], path="q.gsql")
    low = plan.queries[0].low[0]
    assert "payload" in LowLevelOperator(low).read_columns
    plain = plan_text("SELECT time FROM TCP WHERE data_length > 0", ["main"])
    assert "payload" not in LowLevelOperator(plain.queries[0].low[0]).read_columns
    with pytest.raises(QueryError, match="unknown column 'UDP_data' in protocol TCP"):
        plan_text("SELECT UDP_data FROM TCP", ["main"])


def test_alias_table_is_documented():
    text = DOC.read_text()
    for alias, (ours, _) in GIGASCOPE_ALIASES.items():
        assert re.search(rf"\| `{alias}` \| `{ours}` \|", text), alias


# --- interface sets ----------------------------------------------------------------------------

@pytest.mark.parametrize("source,links,union", [
    ("[eth0, eth1].IPV4", ["eth0", "eth1"], "meld"),
    ("[eth1].IPV4", ["eth1"], None),
    ("eth0.IPV4", ["eth0"], None),
    ("IPV4", ["eth0", "eth1"], "meld"),
    # GS-lite's default interface set is what a source without interfaces reads
    ("[default].IPV4", ["eth0", "eth1"], "meld"),
])
def test_an_interface_set_is_a_set_of_links(source, links, union):
    q = plan_text(f"SELECT time, srcIP FROM {source}", ["eth0", "eth1"]).queries[0]
    assert [p.link for p in q.low] == links
    assert q.high.inputs == tuple(links) and q.high.union == union


def test_layers_of_schema_files_replace_and_inherit():
    """A server's schema files, then a query's: the query's protocols replace the server's
    of their names and may inherit from them; within one layer a protocol declared again is
    still an error."""
    from queries.schemafile import layered_schema

    server = [("server.txt", "PROTOCOL base { uint t get_system_time (increasing); }\n"
                             "PROTOCOL R (base) { uint a get_csv_uint_pos1; }\n")]
    own = [("own.txt", "PROTOCOL R (base) { uint a get_csv_uint_pos2; string s "
                       "get_csv_string_pos3; }\n"
                       "PROTOCOL S (R) { uint b get_csv_uint_pos4; }\n")]
    schema = layered_schema([server, own])
    assert schema.record_format("R").fields != layered_schema([server]).record_format(
        "R").fields
    assert [f.name for f in schema.record_format("S").fields] == ["t", "a", "s", "b"]
    assert schema.fields("R")["a"].accessor == "get_csv_uint_pos2"
    with pytest.raises(SchemaError, match="R is declared twice"):
        layered_schema([server + [("again.txt", "PROTOCOL R (base) { uint a "
                                                "get_csv_uint_pos1; }\n")]])


def test_an_explicit_schema_replaces_the_one_beside_the_query(tmp_path, caplog):
    # a protocol declared beside the query and in a --schema file was "declared twice", and
    # the file beside the query could not be left out
    (tmp_path / "packet_schema.txt").write_text(
        "PROTOCOL READINGS { uint ts get_csv_uint_pos1 (increasing); }\n")
    mine = tmp_path / "mine.txt"
    mine.write_text("PROTOCOL READINGS { uint ts get_csv_uint_pos1 (increasing); "
                    "float value get_csv_float_pos2; }\n")
    query = tmp_path / "q.gsql"
    with caplog.at_level(logging.INFO, logger="queries.schemafile"):
        schema = schema_for([query], [mine])
    assert schema.files == (str(mine),)
    assert "value" in schema.fields("READINGS")
    assert "not reading" in caplog.text and "--schema" in caplog.text
    # without --schema the file beside the query is still read, as GS-lite does
    assert schema_for([query]).files == (str(tmp_path / "packet_schema.txt"),)
