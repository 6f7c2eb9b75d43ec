"""CSV record sources (`capture.records`): every GS-lite type parsed as its C format reads it,
separators, malformed lines counted with their line numbers, interned strings, and the
stream sources (a FIFO fed by a writer thread, standard input).

Expected values are computed here from the text written (Python's `ipaddress`, `int`,
`float`), never copied from the reader's output. The protocols are GS-lite's own
`cfg/packet_schema.txt` (a verbatim copy under tests/queries/fixtures/gslite/).
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from capture.batch import RecordBatch
from capture.records import RecordReader, detect_separator, read_all_records, resolve_separator
from capture.recordsource import RecordError, field_columns
from capture.schema import record_column
from queries.schemafile import load_schema, schema_from_text

REPO = Path(__file__).resolve().parents[2]
GSLITE_SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"
MAPPED = 0x0000_FFFF_0000_0000


@pytest.fixture(scope="module")
def schema():
    return load_schema([GSLITE_SCHEMA])


@pytest.fixture(scope="module")
def example(schema):
    return schema.record_format("CSV_EXAMPLE")


@pytest.fixture(scope="module")
def tcp(schema):
    return schema.record_format("CSV_TCPEXAMPLE")


def write(tmp_path: Path, text: str, name: str = "r.csv") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def col(batch: RecordBatch, name: str) -> np.ndarray:
    return batch[record_column(name)]


def ip6(text: str) -> tuple[int, int]:
    v = int(ipaddress.IPv6Address(text))
    return v >> 64, v & (2**64 - 1)


def reader_stats(path, fmt, **kw):
    with RecordReader(path, fmt, "csv", **kw) as r:
        batches = [b for b in r if len(b)]
    return batches, r


# --- types ---------------------------------------------------------------------------------

ROWS = [
    # uint, ullong, IP, IPV6, string, bool, int, llong, float
    ("0", "18446744073709551615", "10.0.0.1", "2001:db8::1", "hello", "TRUE", "-2147483648",
     "-9223372036854775808", "1.5"),
    ("4294967295", "0", "255.255.255.255", "1:2:3:4:5:6:7:8", "", "false", "2147483647",
     "9223372036854775807", "-2e3"),
    (" 7 ", "+12", "0.0.0.0", "::", "a b,c", "True", "+5", "-0", " .25 "),
]


def test_every_type_parsed_as_gslite_reads_it(tmp_path, example):
    p = write(tmp_path, "\n".join(",".join(r) for r in ROWS[:2]) + "\n")
    b = read_all_records(p, example, "csv")
    assert len(b) == 2
    assert col(b, "uintInPosition1").dtype == np.uint64
    assert col(b, "uintInPosition1").tolist() == [0, 4294967295]
    assert col(b, "ullongInPosition2").tolist() == [2**64 - 1, 0]
    assert col(b, "ipInPosition3").tolist() == [MAPPED | int(ipaddress.IPv4Address(a))
                                                for a in ("10.0.0.1", "255.255.255.255")]
    assert col(b, "intInPosition7").dtype == np.int64
    assert col(b, "intInPosition7").tolist() == [-2**31, 2**31 - 1]
    assert col(b, "llongInPosition8").tolist() == [-2**63, 2**63 - 1]
    assert col(b, "floatInPosition9").tolist() == [1.5, -2000.0]
    assert col(b, "boolInPosition6").tolist() == [1, 0]
    hi, lo = b[record_column("ipv6InPosition4") + "_hi"], b[record_column("ipv6InPosition4") + "_lo"]
    assert list(zip(hi.tolist(), lo.tolist())) == [ip6("2001:db8::1"), ip6("1:2:3:4:5:6:7:8")]
    table = b.strings[record_column("stringInPosition5")]
    assert [table.text(c) for c in col(b, "stringInPosition5")] == ["hello", ""]
    assert col(b, "schemaId").tolist() == [0, 0]      # GS-lite leaves a CSV record's unset
    assert b.offsets.tolist() == [1, 2]


def test_spaces_signs_and_float_forms(tmp_path, example):
    p = write(tmp_path, ",".join(ROWS[2]).replace("a b,c", "a b") + "\n")
    b = read_all_records(p, example, "csv")
    assert col(b, "uintInPosition1").tolist() == [7]
    assert col(b, "ullongInPosition2").tolist() == [12]
    assert col(b, "intInPosition7").tolist() == [5]
    assert col(b, "llongInPosition8").tolist() == [0]
    assert col(b, "floatInPosition9").tolist() == [0.25]
    assert col(b, "boolInPosition6").tolist() == [1]
    assert b[record_column("ipv6InPosition4") + "_hi"].tolist() == [0]
    table = b.strings[record_column("stringInPosition5")]
    assert table.text(int(col(b, "stringInPosition5")[0])) == "a b"   # kept as written


@pytest.mark.parametrize("text, expected", [
    ("TRUE", 1), ("true", 1), ("True", 1), ("FALSE", 0), ("1", 0), ("TRUEX", 0),
    (" TRUE", 0), ("", 0), ("yes", 0),
])
def test_bool_rule(tmp_path, text, expected):
    s = schema_from_text("PROTOCOL B { bool b get_csv_bool_pos1; uint n get_csv_uint_pos2; }")
    p = write(tmp_path, f"{text},1\n")
    b = read_all_records(p, s.record_format("B"), "csv", separator=",")
    assert b[record_column("b")].tolist() == [expected]


INT_SCHEMA = """PROTOCOL N { uint u get_csv_uint_pos1; int i get_csv_int_pos2;
ullong ul get_csv_ullong_pos3; llong ll get_csv_llong_pos4; float f get_csv_float_pos5; }"""


@pytest.mark.parametrize("line, reason", [
    ("4294967296,0,0,0,0", "bad uint"),
    ("-1,0,0,0,0", "bad uint"),
    ("x7,0,0,0,0", "bad uint"),
    (",0,0,0,0", "bad uint"),
    ("0,2147483648,0,0,0", "bad int"),
    ("0,-2147483649,0,0,0", "bad int"),
    ("0,1.5,0,0,0", "bad int"),
    ("0,0,18446744073709551616,0,0", "bad ullong"),
    ("0,0,0,9223372036854775808,0", "bad llong"),
    ("0,0,0,0,abc", "bad float"),
    ("0,0,0,0,1.5x", "bad float"),
    ("0,0,0", "wrong field count"),
])
def test_out_of_range_and_unparsable_values_are_malformed(tmp_path, line, reason):
    fmt = schema_from_text(INT_SCHEMA).record_format("N")
    p = write(tmp_path, f"1,2,3,4,5\n{line}\n6,7,8,9,10\n")
    batches, r = reader_stats(p, fmt)
    good = RecordBatch.concat(batches)
    assert good[record_column("u")].tolist() == [1, 6]
    assert good.offsets.tolist() == [1, 3]
    assert r.stats.reasons == {reason: 1}
    assert r.stats.examples[reason][0][0] == 2


@pytest.mark.parametrize("text, ok", [
    ("2001:db8::1", True), ("::", True), ("::1", True), ("1::", True), ("1:2::3", True),
    ("1:2:3:4:5:6:7:8", True), ("FFFF:0:0:0:0:0:0:abcd", True),
    ("1:2:3", False), ("1::2::3", False), ("12345::", False), ("1:2:3:4:5:6:7:8:9", False),
    ("1:2:3:4:5:6:7:8::", False), ("g::", False), (":1::", False), ("1:", False),
])
def test_ipv6_forms(tmp_path, text, ok):
    fmt = schema_from_text("PROTOCOL V { IPV6 a get_csv_ipv6_pos1; uint n get_csv_uint_pos2; }"
                           ).record_format("V")
    p = write(tmp_path, f"{text};1\n")
    batches, r = reader_stats(p, fmt, separator=";")
    if not ok:
        assert r.stats.reasons == {"bad ipv6": 1}
        return
    b = batches[0]
    hi, lo = (b[c] for c in field_columns(fmt.fields[0]))
    assert (int(hi[0]), int(lo[0])) == ip6(text)


@pytest.mark.parametrize("text, ok", [
    ("1.2.3.4", True), ("255.0.0.1", True), ("256.1.1.1", False), ("1.2.3", False),
    ("1.2.3.4.5", False), ("1..2.3", False), ("a.b.c.d", False), ("1.2.3.0004", False),
])
def test_ipv4_forms(tmp_path, text, ok):
    fmt = schema_from_text("PROTOCOL V { IP a get_csv_ip_pos1; uint n get_csv_uint_pos2; }"
                           ).record_format("V")
    p = write(tmp_path, f"{text}\t1\n")
    batches, r = reader_stats(p, fmt)
    if not ok:
        assert r.stats.reasons == {"bad ip": 1}
        return
    assert batches[0][record_column("a")].tolist() == [MAPPED | int(ipaddress.IPv4Address(text))]


# --- separators, malformed lines, clocks -------------------------------------------------------

@pytest.mark.parametrize("sep", [",", "|", "\t", ";"])
def test_separator_detected_from_the_first_line(tmp_path, tcp, sep):
    p = write(tmp_path, f"1{sep}10\n2{sep}20\n")
    batches, r = reader_stats(p, tcp)
    assert r.separator == sep
    assert RecordBatch.concat(batches)[record_column("value")].tolist() == [10, 20]


def test_separator_given_and_named():
    assert resolve_separator("tab") == "\t"
    assert resolve_separator("|") == "|"
    assert resolve_separator(None) is None
    with pytest.raises(ValueError, match="one ASCII character"):
        resolve_separator("ab")
    # a line holding several candidates: the one giving the protocol's fields
    assert detect_separator(b"a,b;c;d", 3) == ";"
    assert detect_separator(b"abc", 1) == ","


def test_malformed_lines_counted_with_line_numbers(tmp_path, tcp):
    text = "1,10\n2,20\n\n3\nx7,30\n4,40,extra\n5,50\n6,\n"
    p = write(tmp_path, text)
    batches, r = reader_stats(p, tcp, batch_size=2)
    good = RecordBatch.concat(batches)
    # extra fields are ignored, as GS-lite reads positions; blank lines are not records
    assert good[record_column("ivalue")].tolist() == [1, 2, 4, 5]
    assert good.offsets.tolist() == [1, 2, 6, 7]
    assert r.stats.reasons == {"wrong field count": 1, "bad uint": 2}
    assert r.stats.examples["wrong field count"] == [(4, None)]
    assert r.stats.examples["bad uint"] == [(5, "x7"), (8, "")]
    assert r.stats.describe() == ("1 wrong field count (line 4), "
                                  "2 bad uint (line 5: 'x7', line 8: '')")
    assert r.stats.records == 4 and r.stats.lines == 8


def test_record_clock_and_system_clock(tmp_path, tcp, example):
    p = write(tmp_path, "100,1\n105,2\n103,3\n")
    b = read_all_records(p, tcp, "csv")
    assert tcp.clock == "ivalue" and not tcp.system_clock
    assert b["timestamp"].tolist() == [100 * 10**9, 105 * 10**9, 103 * 10**9]
    assert not b.in_order
    before = time.time_ns()
    b = read_all_records(write(tmp_path, ",".join(ROWS[0]) + "\n", "e.csv"), example, "csv")
    after = time.time_ns()
    assert example.system_clock
    assert before <= int(b["timestamp"][0]) <= after
    assert before // 10**9 <= int(col(b, "systemTime")[0]) <= after // 10**9


def test_chunk_and_batch_boundaries_do_not_matter(tmp_path, tcp):
    text = "".join(f"{i},{i * 7}\n" for i in range(1000)) + "1000,7000"   # no final newline
    p = write(tmp_path, text)
    whole = read_all_records(p, tcp, "csv")
    cut = read_all_records(p, tcp, "csv", batch_size=7, chunk_size=64)
    assert whole[record_column("value")].tolist() == [i * 7 for i in range(1001)]
    assert cut[record_column("value")].tolist() == whole[record_column("value")].tolist()
    assert cut.offsets.tolist() == list(range(1, 1002))


def test_strings_interned_once_per_link(tmp_path, example):
    rows = [",".join(("1", "2", "10.0.0.1", "::1", s, "TRUE", "1", "2", "0.5"))
            for s in ["a", "b", "a", "c", "b", "a"]]
    p = write(tmp_path, "\n".join(rows) + "\n")
    with RecordReader(p, example, "csv", batch_size=2) as r:
        batches = list(r)
    tables = {id(b.strings[record_column("stringInPosition5")]) for b in batches}
    assert len(tables) == 1                              # one table for the link's life
    codes = np.concatenate([col(b, "stringInPosition5") for b in batches])
    assert codes.dtype == np.uint64
    assert codes.tolist() == [0, 1, 0, 2, 1, 0]           # stable across batches
    table = r.strings
    assert len(table) == 3
    assert table.decode(codes).to_pylist() == ["a", "b", "a", "c", "b", "a"]
    assert table.code_of("c") == 2 and table.code_of("zzz") is None


def test_the_csv_reader_sends_gdat_to_its_own_reader(tmp_path, schema):
    p = write(tmp_path, "1,2\n")
    with pytest.raises(RecordError, match="GDAT records are read by capture.gdat.GdatReader"):
        RecordReader(p, schema.record_format("GDAT_EXAMPLE"), "g")


def test_missing_file_is_one_clear_error(tmp_path, tcp):
    with pytest.raises(RecordError, match="record file not found"):
        RecordReader(tmp_path / "nope.csv", tcp, "csv")


# --- streams -----------------------------------------------------------------------------------

def test_fifo_records_processed_as_they_arrive(tmp_path, tcp):
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    first_seen = threading.Event()

    def writer():
        with open(fifo, "w") as w:
            w.write("1,10\n2,20\n")
            w.flush()
            # the rest only once the reader has handed on the first records: a reader that
            # waited for the end of the stream would never get here (the test times out)
            assert first_seen.wait(20)
            w.write("3,30\n4,40")          # the last line ends with the stream

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    got = []
    with RecordReader(fifo, tcp, "csv", separator=",") as r:
        assert r.stream
        for b in r:
            got += b[record_column("value")].tolist()
            if got:
                first_seen.set()
    t.join(5)
    assert got == [10, 20, 30, 40]
    assert r.stats.records == 4


def test_quiet_stream_hands_on_empty_batches_when_asked(tmp_path, tcp):
    fifo = tmp_path / "quiet.fifo"
    os.mkfifo(fifo)
    release = threading.Event()

    def writer():
        with open(fifo, "w") as w:
            w.write("1,10\n")
            w.flush()
            release.wait(20)
            w.write("2,20\n")

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    sizes = []
    with RecordReader(fifo, tcp, "csv", idle_batches=True) as r:
        for b in r:
            sizes.append(len(b))
            if sizes.count(0) >= 2:
                release.set()
    t.join(5)
    assert sizes[0] == 1 and sizes.count(0) >= 2 and sizes[-1] in (0, 1)
    assert sum(sizes) == 2


def test_stdin(tmp_path):
    code = (
        "import sys\n"
        "from capture.records import RecordReader\n"
        "from queries.schemafile import load_schema\n"
        f"fmt = load_schema([{str(GSLITE_SCHEMA)!r}]).record_format('CSV_TCPEXAMPLE')\n"
        "r = RecordReader('-', fmt, 'csv')\n"
        "vals = [v for b in r for v in b['r.value'].tolist()]\n"
        "print(r.stream, vals, r.stats.describe())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input="1|10\n2|20\nz|30\n",
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True [10, 20] 1 bad uint (line 3: 'z')"


READINGS = """PROTOCOL READINGS {
    uint ts get_csv_uint_pos1 (increasing);
    string sensor get_csv_string_pos2;
    uint value get_csv_uint_pos3;
}
"""


@pytest.mark.parametrize("text, given, named", [
    ("1;a;10\n2;b;20\n", ",", "--csv-separator ';'"),
    ("1|a|10\n", ";", "--csv-separator '|'"),
    ("1\ta\t10\n", ",", "--csv-separator tab"),
    ("1 a 10\n", ",", "--csv-separator space"),
    ("1   a   10\n", " ", "runs of spaces"),
    ("x,y\n", None, "no separator makes its first line"),
])
def test_every_record_malformed_names_the_separator(tmp_path, text, given, named):
    fmt = schema_from_text(READINGS).record_format("READINGS")
    path = tmp_path / "r.csv"
    path.write_text(text)
    reader = RecordReader(path, fmt, "csv", separator=given)
    assert sum(len(b) for b in reader) == 0
    (problem,) = reader.stats.problems
    assert f"all {text.count(chr(10))} records were malformed" in problem
    assert named in problem
    assert "1;a" not in problem and "x,y" not in problem       # never the file's contents


def test_some_good_records_are_no_problem(tmp_path):
    fmt = schema_from_text(READINGS).record_format("READINGS")
    path = tmp_path / "r.csv"
    path.write_text("1,a,10\nbad\n")
    reader = RecordReader(path, fmt, "csv")
    assert sum(len(b) for b in reader) == 1
    assert reader.stats.malformed == 1 and reader.stats.problems == []


def test_space_separated_records_are_detected(tmp_path):
    fmt = schema_from_text(READINGS).record_format("READINGS")
    assert detect_separator(b"1 a 10", 3) == " "
    assert detect_separator(b"1,a b,10", 3) == ","      # a comma still wins
    assert detect_separator(b"a b", 1) == ","           # one field: nothing to split
    path = tmp_path / "r.csv"
    path.write_text("1 a 10\n2 b 20\n")
    batch = read_all_records(path, fmt, "csv")
    assert len(batch) == 2
