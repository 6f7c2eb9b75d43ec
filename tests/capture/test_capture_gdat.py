"""GDAT record sources (`capture.gdat`): GS-lite's binary tuple files read back value by value
for its GDAT_EXAMPLE protocol, the header's schema as GS-lite lays a tuple out, and the
malformed cases (a cut tuple, a bad header, a string past its tuple's end, a corrupt length,
a short tuple), streams (a FIFO, standard input) and the errors.

The files are written here by a small writer made from the format as GS-lite's sources and the
Tigon SQL contributor manual (section 6) define it, with `struct` and `ipaddress`, never with
the reader's code: a 3-line header and the NUL-terminated schema text, then tuples of a
big-endian length, the fields little-endian in schema order, the type byte, the string bytes.
"""

from __future__ import annotations

import ipaddress
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from capture.gdat import GdatFormatError, GdatReader, parse_header
from capture.records import RecordReader, open_records, read_all_records
from capture.recordsource import RecordError
from capture.schema import record_column
from queries.schemafile import load_schema, schema_from_text

REPO = Path(__file__).resolve().parents[2]
GSLITE_SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"
MANUAL_SCHEMA = (REPO / "tests" / "queries" / "fixtures" / "manual"
                 / "gdat_header_schema_contributor_sec6.1.txt")
MAPPED = 0x0000_FFFF_0000_0000

# --- a GDAT writer, from the format --------------------------------------------------------------

#: GS-lite type -> (struct format, bytes); V_STR is (length, offset, reserved)
SIZES = {"UINT": 4, "BOOL": 4, "IP": 4, "INT": 4, "ULLONG": 8, "LLONG": 8, "FLOAT": 8,
         "IPV6": 16, "V_STR": 12}
#: the file fields of GS-lite's GDAT_EXAMPLE protocol (get_gdat_<type>_pos1 .. pos10)
EXAMPLE_FIELDS = [("UINT", "uintOldTime"), ("UINT", "uintInPosition1"),
                  ("ULLONG", "ullongInPosition2"), ("IP", "ipInPosition3"),
                  ("IPV6", "ipv6InPosition4"), ("V_STR", "stringInPosition5"),
                  ("BOOL", "boolInPosition6"), ("INT", "intInPosition7"),
                  ("LLONG", "llongInPosition8"), ("FLOAT", "floatInPosition9")]


def schema_text(fields, stream: str = "example") -> str:
    """The STREAM parse tree a GS-lite header carries (as gsgdatprint writes it)."""
    body = "".join(f" {t} {n} get_field_{n};\n" for t, n in fields)
    return (f"FTA{{\nSTREAM {stream} {{\n{body}}}\nDEFINE{{\n query_name '{stream}';\n"
            f" visibility 'external';\n}}\nSelect {fields[0][1]} From x.y\n}}\n")


def header(text: str, version: int = 4) -> bytes:
    raw = text.encode() + b"\0"                     # SCHEMALENGTH counts the NUL
    return b"GDAT\nVERSION:%d\nSCHEMALENGTH:%d\n" % (version, len(raw)) + raw


def pack_tuple(values, fields=EXAMPLE_FIELDS, kind: int = 0) -> bytes:
    """One tuple with its length: the fixed part, the type byte, the string payloads."""
    fixed_size = sum(SIZES[t] for t, _ in fields)
    fixed, payload = b"", b""
    for (t, _), v in zip(fields, values):
        if t in ("UINT", "BOOL"):
            fixed += struct.pack("<I", v)
        elif t == "IP":
            fixed += struct.pack("<I", int(ipaddress.IPv4Address(v)))
        elif t == "INT":
            fixed += struct.pack("<i", v)
        elif t == "ULLONG":
            fixed += struct.pack("<Q", v)
        elif t == "LLONG":
            fixed += struct.pack("<q", v)
        elif t == "FLOAT":
            fixed += struct.pack("<d", v)
        elif t == "IPV6":
            fixed += ipaddress.IPv6Address(v).packed
        else:
            data = v.encode() if isinstance(v, str) else v
            fixed += struct.pack("<III", len(data), fixed_size + 1 + len(payload), 0)
            payload += data
    body = fixed + bytes([kind]) + payload
    return struct.pack(">I", len(body)) + body


ROWS = [
    # uintOldTime, uint, ullong, IP, IPV6, string, bool, int, llong, float
    (1, 2, 3, "10.0.0.1", "2001:db8::1", "hello", 1, -3, -40, 1.5),
    (4294967295, 4294967295, 2**64 - 1, "255.255.255.255", "::", "", 0, -2**31, -2**63,
     -2e3),
    (7, 0, 0, "0.0.0.0", "fe80::1:2", "wörld", 7, 2**31 - 1, 2**63 - 1, 0.25),
    (8, 9, 10, "192.168.1.7", "::ffff:1.2.3.4", "hello", 0, 0, 0, float("inf")),
]


@pytest.fixture(scope="module")
def schema():
    return load_schema([GSLITE_SCHEMA])


@pytest.fixture(scope="module")
def example(schema):
    return schema.record_format("GDAT_EXAMPLE")


def write(tmp_path: Path, data: bytes, name: str = "r.gdat") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def example_file(tmp_path: Path, rows=ROWS, name: str = "r.gdat") -> Path:
    return write(tmp_path, header(schema_text(EXAMPLE_FIELDS))
                 + b"".join(pack_tuple(r) for r in rows), name)


def col(batch, name: str) -> np.ndarray:
    return batch[record_column(name)]


def read(path, fmt, **kw):
    with open_records(path, fmt, "g", **kw) as r:
        batches = [b for b in r if len(b)]
    return batches, r


def check_rows(batch, rows) -> None:
    """Every column of a GDAT_EXAMPLE batch against the values written."""
    assert col(batch, "uintOldTime").tolist() == [r[0] for r in rows]
    assert col(batch, "uintInPosition1").tolist() == [r[1] for r in rows]
    assert col(batch, "ullongInPosition2").tolist() == [r[2] for r in rows]
    assert col(batch, "ipInPosition3").tolist() == \
        [MAPPED | int(ipaddress.IPv4Address(r[3])) for r in rows]
    v6 = [int(ipaddress.IPv6Address(r[4])) for r in rows]
    assert col(batch, "ipv6InPosition4_hi").tolist() == [v >> 64 for v in v6]
    assert col(batch, "ipv6InPosition4_lo").tolist() == [v & (2**64 - 1) for v in v6]
    table = batch.strings[record_column("stringInPosition5")]
    assert table.decode(col(batch, "stringInPosition5")).to_pylist() == [r[5] for r in rows]
    assert col(batch, "boolInPosition6").tolist() == [int(r[6] != 0) for r in rows]
    assert col(batch, "intInPosition7").tolist() == [r[7] for r in rows]
    assert col(batch, "llongInPosition8").tolist() == [r[8] for r in rows]
    assert col(batch, "floatInPosition9").tolist() == [r[9] for r in rows]
    assert col(batch, "schemaId").tolist() == [0] * len(rows)


# --- values --------------------------------------------------------------------------------------

def test_every_gdat_example_value_read_back(tmp_path, example):
    p = example_file(tmp_path)
    before = time.time()
    batch = read_all_records(p, example, "g")
    after = time.time()
    assert len(batch) == len(ROWS)
    check_rows(batch, ROWS)
    assert col(batch, "uintOldTime").dtype == np.uint64
    assert col(batch, "intInPosition7").dtype == np.int64
    assert col(batch, "floatInPosition9").dtype == np.float64
    assert col(batch, "boolInPosition6").dtype == np.uint8
    assert col(batch, "stringInPosition5").dtype == np.uint64
    # systemTime is the wall clock when read (GDAT_EXAMPLE's clock, via base)
    st = col(batch, "systemTime")
    assert all(int(before) <= s <= int(after) + 1 for s in st.tolist())
    assert (batch["timestamp"] // 10**9 == st).all()
    assert batch.offsets.tolist() == [1, 2, 3, 4]                    # tuple numbers
    assert batch["len"].tolist() == [len(pack_tuple(r)) for r in ROWS]


def test_dtypes_and_strings_match_the_csv_reader(tmp_path, schema, example):
    """The same values through CSV_EXAMPLE and GDAT_EXAMPLE give the same columns."""
    csv = tmp_path / "r.csv"
    csv.write_text("2,3,10.0.0.1,2001:db8::1,hello,TRUE,-3,-40,1.5\n"
                   "9,10,192.168.1.7,::ffff:102:304,hello,FALSE,0,0,2\n")   # no dotted tail in CSV
    a = read_all_records(csv, schema.record_format("CSV_EXAMPLE"), "c")
    b = read_all_records(example_file(tmp_path, [ROWS[0], ROWS[3][:9] + (2.0,)]), example,
                         "g")
    for name in ("uintInPosition1", "ullongInPosition2", "ipInPosition3",
                 "ipv6InPosition4_hi", "ipv6InPosition4_lo", "stringInPosition5",
                 "boolInPosition6", "intInPosition7", "llongInPosition8", "floatInPosition9"):
        assert col(a, name).dtype == col(b, name).dtype, name
        assert col(a, name).tolist() == col(b, name).tolist(), name


def test_batches_across_small_buffers_keep_values_and_string_codes(tmp_path, example):
    rows = [(i, i * 3, i * 2**40, f"10.0.{i % 256}.{i % 7}", f"2001:db8::{i:x}",
             ["a", "bb", "ccc"][i % 3], i % 2, -i, -i * 2**33, i / 4) for i in range(50)]
    p = example_file(tmp_path, rows)
    batches, r = read(p, example, batch_size=7, chunk_size=64)
    # a batch holds the whole tuples read so far, at most batch_size of them
    assert max(len(b) for b in batches) == 7 and len(batches) > 8
    tables = {id(b.strings[record_column("stringInPosition5")]) for b in batches}
    assert len(tables) == 1
    from capture.batch import RecordBatch
    whole = RecordBatch.concat(batches)
    check_rows(whole, rows)
    assert col(whole, "stringInPosition5").tolist() == [i % 3 for i in range(50)]
    assert r.stats.records == 50 and r.stats.malformed == 0
    assert r.stats.bytes == p.stat().st_size


def test_a_record_clock_times_the_records(tmp_path):
    schema = schema_from_text("PROTOCOL T { uint t get_gdat_uint_pos1 (increasing);\n"
                              "ullong v get_gdat_ullong_pos3; }")
    fmt = schema.record_format("T")
    batch = read_all_records(example_file(tmp_path), fmt, "g")
    assert batch["timestamp"].tolist() == [r[0] * 10**9 for r in ROWS]
    assert col(batch, "v").tolist() == [r[2] for r in ROWS]


def test_the_manuals_record_example(tmp_path):
    """Contributor manual 6.2: INT foo, STRING bar, the record (35, "foobar") is 23 bytes,
    the string at offset 17 (4 + 12 + the type byte)."""
    fields = [("INT", "foo"), ("V_STR", "bar")]
    tup = pack_tuple((35, "foobar"), fields)
    assert len(tup) == 4 + 23 and struct.unpack("<III", tup[8:20]) == (6, 17, 0)
    p = write(tmp_path, header(schema_text(fields, "m")) + tup)
    schema = schema_from_text("PROTOCOL M { int foo get_gdat_int_pos1;\n"
                              "string bar get_gdat_string_pos2; }")
    batch = read_all_records(p, schema.record_format("M"), "m")
    assert col(batch, "foo").tolist() == [35]
    assert batch.strings[record_column("bar")].decode(col(batch, "bar")).to_pylist() == \
        ["foobar"]


def test_the_manuals_header_schema_lays_out_as_gs_lite(tmp_path):
    """Section 6.1's STREAM example: eleven fields packed by their table sizes."""
    text = MANUAL_SCHEMA.read_text()
    text = text[text.index("FTA{"):]
    data = header(text)
    got = parse_header(data, "m.gdat")
    assert got is not None
    assert got.stream == "example" and got.version == 4 and got.header_bytes == len(data)
    sizes = [4, 4, 8, 4, 16, 12, 4, 4, 8, 8, 4]
    assert [f.size for f in got.fields] == sizes
    assert [f.offset for f in got.fields] == [sum(sizes[:i]) for i in range(11)]
    assert [f.type for f in got.fields][4:6] == ["IPV6", "V_STR"]
    assert got.fixed_size == 76
    assert parse_header(data[:-1], "m.gdat") is None            # not whole yet


def test_trace_and_eof_tuples_are_not_records(tmp_path, example):
    data = header(schema_text(EXAMPLE_FIELDS)) + pack_tuple(ROWS[0]) \
        + pack_tuple(ROWS[1], kind=1) + struct.pack(">I", 0) + pack_tuple(ROWS[2]) \
        + pack_tuple(ROWS[3], kind=2)
    batches, r = read(write(tmp_path, data), example)
    assert sum(len(b) for b in batches) == 2
    check_rows(batches[0], [ROWS[0], ROWS[2]])
    assert batches[0].offsets.tolist() == [1, 4]
    assert r.stats.malformed == 0
    assert r.stats.skipped == {"trace": 1, "empty": 1, "end of file": 1}


# --- malformed tuples ----------------------------------------------------------------------------

def test_truncated_last_tuple_is_counted(tmp_path, example):
    whole = header(schema_text(EXAMPLE_FIELDS)) + b"".join(pack_tuple(r) for r in ROWS[:3])
    last = pack_tuple(ROWS[3])
    for cut in (2, 4, len(last) - 1):            # in the length, at its end, in the data
        p = write(tmp_path, whole + last[:cut])
        batches, r = read(p, example)
        check_rows(batches[0], ROWS[:3])
        assert r.stats.reasons == {"truncated tuple": 1}
        need = "at least 4" if cut < 4 else str(len(last))
        assert r.stats.describe() == \
            f"1 truncated tuple (record 4 at byte {len(whole)}: {cut} of {need} bytes)"
        assert r.stats.bytes == len(whole) + cut


def test_string_past_the_end_of_its_tuple(tmp_path, example):
    bad = bytearray(pack_tuple(ROWS[0]))
    # the string's length field (at 4 + 36 in the tuple with its length prefix) made too long
    struct.pack_into("<I", bad, 4 + 36, 500)
    data = header(schema_text(EXAMPLE_FIELDS)) + pack_tuple(ROWS[1]) + bytes(bad) \
        + pack_tuple(ROWS[2])
    batches, r = read(write(tmp_path, data), example)
    check_rows(batches[0], [ROWS[1], ROWS[2]])
    assert r.stats.reasons == {"bad string": 1}
    at = len(header(schema_text(EXAMPLE_FIELDS))) + len(pack_tuple(ROWS[1]))
    # GDAT_EXAMPLE's fixed part is 72 bytes: the first string's bytes start at 73
    assert r.stats.describe() == (f"1 bad string (record 2 at byte {at}: stringInPosition5 "
                                  f"at offset 73 + length 500 > {len(bad) - 4} bytes)")
    # a consumer that does not read the string never sees it bad
    batches, r = read(write(tmp_path, data), example,
                      columns=("timestamp", record_column("uintInPosition1")))
    assert sum(len(b) for b in batches) == 3 and r.stats.malformed == 0


def test_short_tuple(tmp_path, example):
    short = pack_tuple(ROWS[0])[4:4 + 20]            # uintOldTime .. ullong, then cut
    data = header(schema_text(EXAMPLE_FIELDS)) + struct.pack(">I", len(short)) + short \
        + pack_tuple(ROWS[1])
    batches, r = read(write(tmp_path, data), example)
    check_rows(batches[0], [ROWS[1]])
    assert r.stats.reasons == {"short tuple": 1}
    assert "record 1 at byte" in r.stats.describe()
    assert "20 bytes, ipInPosition3 needs 20" not in r.stats.describe()
    assert "20 bytes, ipv6InPosition4 needs 36" in r.stats.describe()


def test_corrupt_length_skips_to_the_next_readable_tuple(tmp_path, example):
    head = header(schema_text(EXAMPLE_FIELDS)) + pack_tuple(ROWS[0])
    junk = struct.pack(">I", 0xFFFF_FFF0) + bytes(range(37))
    rest = [ROWS[1], ROWS[2], ROWS[3], ROWS[0], ROWS[2]]
    data = head + junk + b"".join(pack_tuple(r) for r in rest)
    for kw in ({}, {"chunk_size": 64, "batch_size": 2}):
        batches, r = read(write(tmp_path, data), example, **kw)
        from capture.batch import RecordBatch
        check_rows(RecordBatch.concat(batches), [ROWS[0], *rest])
        assert r.stats.reasons == {"bad tuple length": 1}
        assert r.stats.describe() == (f"1 bad tuple length (record 2 at byte {len(head)}: "
                                      f"length {0xFFFF_FFF0}, {len(junk)} bytes skipped)")
        assert r.stats.bytes == len(data)


def test_corrupt_length_near_the_end(tmp_path, example):
    head = header(schema_text(EXAMPLE_FIELDS)) + pack_tuple(ROWS[0])
    data = head + struct.pack(">I", 10**6) + b"xyz" + pack_tuple(ROWS[1])
    batches, r = read(write(tmp_path, data), example)
    check_rows(batches[0], [ROWS[0]])
    check_rows(batches[1], [ROWS[1]])       # one tuple ending exactly at the end is enough
    data = head + struct.pack(">I", 10**6) + b"no tuple follows"
    batches, r = read(write(tmp_path, data), example)
    assert sum(len(b) for b in batches) == 1
    assert r.stats.describe().endswith("20 bytes skipped)")


# --- headers and the file's schema -----------------------------------------------------------------

@pytest.mark.parametrize("data, offset, problem", [
    (b"1,2\n", 0, "not a GDAT file: it does not start with the line 'GDAT'"),
    (b"", 0, "not a GDAT file: it is empty"),
    (b"GDATA\nVERSION:4\n", 0, "not a GDAT file"),
    (b"GDAT\nVERSION:x\nSCHEMALENGTH:3\nabc", 5, "VERSION: is not followed by a number"),
    (b"GDAT\nVERSION:9\nSCHEMALENGTH:3\nabc", 5, "GDAT version 9 is not one GS-lite reads"),
    (b"GDAT\nVERS", 9, "it ends inside its header"),
    (b"GDAT\nVERSION:4\nSCHEMALENGTH:400\nFTA{", 36, "it ends inside its header"),
    (b"GDAT\nVERSION:4\nSCHEMALENGTH:4\nabc\0", 30, "holds no STREAM"),
    (b"GDAT\nVERSION:4\nSCHEMALENGTH:24\nSTREAM s { WHAT x; }\0\0\0\0", 31,
     "field 1 of the header's STREAM s"),
])
def test_not_gdat_is_one_error_naming_file_and_byte(tmp_path, example, data, offset,
                                                    problem):
    p = write(tmp_path, data, "bad.gdat")
    with pytest.raises(GdatFormatError) as info:
        GdatReader(p, example, "g")
    msg = str(info.value)
    assert msg.startswith(f"{p}: byte {offset}: ") and problem in msg
    assert "\n" not in msg and isinstance(info.value, RecordError)


def test_the_files_schema_must_give_each_field_read(tmp_path, example):
    fields = list(EXAMPLE_FIELDS)
    fields[2] = ("UINT", "notAnUllong")
    p = write(tmp_path, header(schema_text(fields)))
    with pytest.raises(RecordError, match=r"field ullongInPosition2 of protocol GDAT_EXAMPLE "
                       r"is read by get_gdat_ullong_pos3, but field 3 of the file's schema "
                       r"\(STREAM example\) is notAnUllong, a UINT \(that function reads a "
                       r"ULLONG\)"):
        GdatReader(p, example, "g")
    p = write(tmp_path, header(schema_text(EXAMPLE_FIELDS[:9])))
    with pytest.raises(RecordError, match=r"floatInPosition9 .* read by get_gdat_float_pos10, "
                       r"but the file's schema \(STREAM example\) has 9 fields"):
        GdatReader(p, example, "g")


def test_header_variants_gs_lite_accepts(tmp_path):
    """Older versions, lower-case types, properties, comments, TIMEVAL and FSTRING fields
    laid out before the fields read."""
    text = ("FTA{ -- a comment\nSTREAM s (x) {\n timeval tv get_tv;\n fstring5 f;\n"
            " uint n get_n (increasing, subtype foo) [unpack];\n string s get_s;\n}\n"
            "DEFINE { query_name 's'; }\nSelect n From y\n}")
    fields = [("UINT", "n"), ("V_STR", "s")]
    tup = pack_tuple((42, "zz"), fields)
    # shift the fields by the 21 bytes of the TIMEVAL and FSTRING5 before them
    body = bytes(21) + tup[4:8] + struct.pack("<III", 2, 21 + 16 + 1, 0) + b"\0" + b"zz"
    data = header(text, version=2) + struct.pack(">I", len(body)) + body
    schema = schema_from_text("PROTOCOL S { uint n get_gdat_uint_pos3;\n"
                              "string s get_gdat_string_pos4; }")
    batch = read_all_records(write(tmp_path, data), schema.record_format("S"), "s")
    assert col(batch, "n").tolist() == [42]
    assert batch.strings[record_column("s")].decode(col(batch, "s")).to_pylist() == ["zz"]


def test_the_csv_reader_points_to_the_gdat_one(tmp_path, example):
    p = example_file(tmp_path)
    with pytest.raises(RecordError, match="GDAT records are read by capture.gdat.GdatReader"):
        RecordReader(p, example, "g")
    assert isinstance(open_records(p, example, "g"), GdatReader)


def test_missing_file_is_one_clear_error(tmp_path, example):
    with pytest.raises(RecordError, match="record file not found"):
        GdatReader(tmp_path / "nope.gdat", example, "g")


# --- streams -----------------------------------------------------------------------------------

def test_fifo_tuples_read_as_they_arrive(tmp_path, example):
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    data = header(schema_text(EXAMPLE_FIELDS)) + pack_tuple(ROWS[0]) + pack_tuple(ROWS[1])
    cut = len(header(schema_text(EXAMPLE_FIELDS))) - 20
    first_seen = threading.Event()

    def writer():
        with open(fifo, "wb") as w:
            # the header in two parts, then a tuple cut in the middle
            for part in (data[:cut], data[cut:-10]):
                w.write(part)
                w.flush()
                time.sleep(0.2)
            w.write(data[-10:])
            w.flush()
            # the rest only once the reader has handed the first tuples on
            assert first_seen.wait(20)
            w.write(pack_tuple(ROWS[2]) + pack_tuple(ROWS[3]))

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    got = []
    with GdatReader(fifo, example, "g") as r:
        assert r.stream
        for b in r:
            if len(b):
                got.append(b)
                first_seen.set()
    t.join(10)
    from capture.batch import RecordBatch
    check_rows(RecordBatch.concat(got), ROWS)
    assert r.stats.malformed == 0


def test_standard_input(tmp_path):
    data = header(schema_text(EXAMPLE_FIELDS)) + b"".join(pack_tuple(r) for r in ROWS) \
        + pack_tuple(ROWS[0])[:9]
    code = ("from capture.records import read_all_records\n"
            "from queries.schemafile import load_schema\n"
            f"s = load_schema([{str(GSLITE_SCHEMA)!r}])\n"
            "from capture.records import open_records\n"
            "with open_records('-', s.record_format('GDAT_EXAMPLE'), 'g') as r:\n"
            "    n = sum(len(b) for b in r)\n"
            "print(n, r.link, r.stats.describe())\n")
    res = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                         cwd=REPO, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stderr.decode()
    at = len(data) - 9
    assert res.stdout.decode().strip() == \
        f"4 g 1 truncated tuple (record 5 at byte {at}: 9 of {len(pack_tuple(ROWS[0]))} bytes)"
