"""GS-lite's types and literals where GS-lite accepts them (issue 36): `ushort` fields read by
`get_csv_ushort_posN` / `get_gdat_ushort_posN`, `fstringN` fields, the manual's typed literals
`IPV4_VAL:'1.2.3.4'`, and a schema file whose protocol oopscope cannot read: one warning at
load, an error only for the query that reads that protocol. Expected values are computed here
from the text written (ipaddress, int(..., 16)), not by oopscope."""

from __future__ import annotations

import ipaddress
import logging

import numpy as np
import pytest

from capture.records import read_all_records
from capture.schema import record_column
from queries.errors import QueryError
from queries.parser import parse
from queries.planner import plan_text
from queries.schemafile import schema_from_text

SCHEMA = """
PROTOCOL base {
    uint systemTime get_system_time (low_cardinality, required, increasing, snap_len 0);
}
PROTOCOL CSV_SHORT (base) {
    ushort shortKey get_csv_ushort_pos1;
    USHORT shortValue get_csv_ushort_pos2;
    fstring8 code get_csv_string_pos3;
}
PROTOCOL GDAT_SHORT (base) {
    ushort s get_gdat_ushort_pos1;
}
PROTOCOL TCP_PACKETS (base) {
    uint sequence_number get_tcp_sequence_number (snap_len 138) [foo];
}
PROTOCOL TCP_MORE (TCP_PACKETS) {
    uint extra get_csv_uint_pos1;
}
PROTOCOL TIMED (base) {
    timeval t get_csv_uint_pos1;
}
"""


@pytest.fixture
def schema(caplog):
    with caplog.at_level(logging.WARNING, logger="queries.schemafile"):
        s = schema_from_text(SCHEMA, "tigon_schema.txt")
    return s, [r.getMessage() for r in caplog.records]


def test_ushort_and_fstring_fields_load(schema):
    s, _ = schema
    fields = s.fields("CSV_SHORT")
    assert {n: f.type for n, f in fields.items()} == {
        "systemTime": "uint", "shortKey": "uint", "shortValue": "uint", "code": "string"}
    assert s.record_format("CSV_SHORT").kind == "csv"
    assert s.record_format("GDAT_SHORT").kind == "gdat"


def test_unreadable_protocols_warn_once_each_and_name_why(schema):
    s, warnings = schema
    unreadable = {"TCP_PACKETS", "TCP_MORE", "TIMED"}
    for name in unreadable:
        assert s.protocol(name).unreadable
        assert sum(f"protocol {name} cannot be read" in w for w in warnings) == 1
    tcp = next(w for w in warnings if "protocol TCP_PACKETS" in w)
    assert "get_tcp_sequence_number" in tcp and "tigon_schema.txt:" in tcp
    assert "timeval" in next(w for w in warnings if "protocol TIMED" in w)
    assert "inherits from TCP_PACKETS" in next(w for w in warnings if "protocol TCP_MORE" in w)
    assert len(warnings) == len(unreadable)


def test_a_query_of_a_readable_protocol_plans_beside_unreadable_ones(schema):
    s, _ = schema
    plan = plan_text("SELECT systemTime, shortKey, count(*) FROM [csv].CSV_SHORT "
                     "GROUP BY systemTime, shortKey", ["csv"], schema=s)
    assert [q.name for q in plan.queries]


@pytest.mark.parametrize("protocol, why", [("TCP_PACKETS", "get_tcp_sequence_number"),
                                           ("TCP_MORE", "inherits from TCP_PACKETS"),
                                           ("TIMED", "timeval")])
def test_a_query_reading_an_unreadable_protocol_is_refused(schema, protocol, why):
    s, _ = schema
    with pytest.raises(QueryError) as e:
        plan_text(f"SELECT systemTime FROM [csv].{protocol}", ["csv"], schema=s)
    text = str(e.value)
    assert f"protocol {protocol}" in text and "cannot be read" in text and why in text


def test_ushort_values_are_read_and_out_of_range_ones_are_malformed(schema, tmp_path):
    s, _ = schema
    lines = ["0|65535|abc", "7|300|x", "65536|1|big", "-1|2|neg", "12|34|ok"]
    path = tmp_path / "short.csv"
    path.write_text("\n".join(lines) + "\n")
    batch = read_all_records(path, s.record_format("CSV_SHORT"), "csv", separator="|")
    good = [ln.split("|") for ln in lines if 0 <= int(ln.split("|")[0]) <= 0xFFFF]
    assert list(batch.columns[record_column("shortKey")]) == [int(g[0]) for g in good]
    assert list(batch.columns[record_column("shortValue")]) == [int(g[1]) for g in good]
    assert batch.columns[record_column("shortKey")].dtype == np.uint64


@pytest.mark.parametrize("literal, kind, value", [
    ("IPV4_VAL:'1.2.3.4'", "ip", int(ipaddress.IPv4Address("1.2.3.4"))),
    ("IPV4_VAL'10.0.0.255'", "ip", int(ipaddress.IPv4Address("10.0.0.255"))),
    ("IP_VAL:'135.207.26.120'", "ip", int(ipaddress.IPv4Address("135.207.26.120"))),
    ("IPV6_VAL:'2001:db8::1'", "ipv6", int(ipaddress.IPv6Address("2001:db8::1"))),
    ("IPv6_VAL:'fe80::1'", "ipv6", int(ipaddress.IPv6Address("fe80::1"))),
    ("HEX:'7fff'", "int", int("7fff", 16)),
    ("LHEX:'7abcdef012'", "int", int("7abcdef012", 16)),
])
def test_typed_literals_as_the_manual_prints_them(literal, kind, value):
    where = parse(f"SELECT srcIP FROM IPV4 WHERE destIP = {literal}").queries[0].statement.where
    assert (where.right.kind, where.right.value) == (kind, value)


def test_the_manual_query_with_ipv4_val_plans_as_ip_val_does():
    manual = plan_text("SELECT srcIP, time FROM IPV4 WHERE destIP = IPV4_VAL:'1.2.3.4'",
                       ["main"])
    plain = plan_text("SELECT srcIP, time FROM IPV4 WHERE destIP = IP_VAL'1.2.3.4'", ["main"])
    other = plan_text("SELECT srcIP, time FROM IPV4 WHERE destIP = IP_VAL'1.2.3.5'", ["main"])
    assert str(manual.queries[0].low) == str(plain.queries[0].low)
    assert str(manual.queries[0].low) != str(other.queries[0].low)


@pytest.mark.parametrize("literal, message", [
    ("IPV4_VAL:'300.1.2.3'", "bad IPv4 address"),
    ("IPV4_VAL: 17", "quoted address"),
    ("IP_VAL: 17", "quoted address"),
    ("HEX:'xyz'", "not hexadecimal"),
])
def test_bad_typed_literals_are_one_clear_error(literal, message):
    with pytest.raises(QueryError) as e:
        parse(f"SELECT srcIP FROM IPV4 WHERE destIP = {literal}")
    assert message in str(e.value)
