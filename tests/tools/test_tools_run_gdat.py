"""`oopscope run` over GDAT record links (GS-lite's binary tuple files), through the real command
line (in this process, `run_here`; in a process of its own for standard input, the stream
it reads): an aggregate and a selection over GS-lite's GDAT_EXAMPLE protocol, a
window on a record clock, standard input, and the errors. Expected rows are computed here from
the values written and compared with the reference evaluator (`tests.oracles.reference`) over
the batch the GDAT reader gives; `systemTime` is the wall clock when read, so groups that a
second boundary splits are added up before comparing.

The files are written by the test writer of tests/capture/test_capture_gdat.py (made from the
format, not from the reader).
"""

from __future__ import annotations

import csv
import ipaddress
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from capture.records import read_all_records
from queries.planner import plan_text
from queries.schemafile import load_schema
from tests.capture.test_capture_gdat import EXAMPLE_FIELDS, header, pack_tuple, schema_text
from tests.conftest import REPO
from tests.oracles.reference import evaluate_file
from tests.tools.resuming import run_here

SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"

#: GDAT_EXAMPLE rows: repeated groups, every type's edges; the 5th is written with a string
#: past its tuple's end and a cut copy of the 1st ends the file (both malformed)
ROWS = [
    (1, 2, 3, "10.0.0.1", "2001:db8::1", "hello", 1, -3, -40, 1.5),
    (2, 2, 4, "10.0.0.2", "2001:db8::2", "hello", 0, -7, 100, -2.5),
    (3, 5, 2**64 - 1, "255.255.255.255", "::", "world", 1, -2**31, -2**63, 1e300),
    (4, 5, 0, "0.0.0.0", "fe80::1:2", "world", 0, 2**31 - 1, 2**63 - 1, 0.25),
    (5, 9, 9, "1.2.3.4", "::1", "lost", 1, -1, 1, 1.0),
    (6, 2, 6, "192.168.1.7", "::ffff:1.2.3.4", "hello", 1, 0, 5, 7.0),
    (7, 5, 7, "172.16.0.1", "2001:db8::7", "skip", 1, -9, 9, 3.0),
]
BAD = 4                      # index of the row written with a bad string


def gdat_bytes() -> tuple[bytes, dict]:
    """The file and where its malformed tuples start (for the summary line)."""
    data = header(schema_text(EXAMPLE_FIELDS))
    where = {}
    for i, row in enumerate(ROWS):
        tup = bytearray(pack_tuple(row))
        if i == BAD:
            where["bad"] = len(data)
            tup[4 + 36:4 + 40] = (1000).to_bytes(4, "little")    # the string's length
        data += bytes(tup)
    where["cut"] = len(data)
    return data + pack_tuple(ROWS[0])[:30], where


GOOD = [r for i, r in enumerate(ROWS) if i != BAD]


def run(args: list[str], *, stdin: bytes | None = None, timeout: int = 600):
    """`oopscope run ARGS`: in this process, or in a process of its own reading `stdin`
    (its descriptor 0 is what a `-` link reads)."""
    cmd = [sys.executable, "-m", "tools.cli", "run", *args]
    if stdin is None:
        return run_here(cmd, check=False)
    res = subprocess.run(cmd, input=stdin, capture_output=True, cwd=REPO, timeout=timeout,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    res.stdout, res.stderr = res.stdout.decode(), res.stderr.decode()
    return res


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def reference(query_text: str, path: Path, schema_path: Path, protocol: str) -> dict:
    schema = load_schema([schema_path])
    plan = plan_text(query_text, ["g"], schema=schema)
    batch = read_all_records(path, schema.record_format(protocol), "g")
    return {name: frame.to_dict("records")
            for name, frame in evaluate_file(plan, {"g": batch}).items()}


AGG_QUERY = """
DEFINE { query_name 'agg'; }
select uintInPosition1 as u, stringInPosition5 as s, count(*) as n,
       sum(llongInPosition8) as total, max(floatInPosition9) as top, min(intInPosition7) as low
from [g].GDAT_EXAMPLE
group by systemTime, uintInPosition1, stringInPosition5
"""


def merged(rows, key, n="n") -> dict:
    """Per (u, s): count and sum added, max and min combined over the systemTime groups."""
    out: dict = {}
    for r in rows:
        k = key(r)
        got = (int(r[n]), int(r["total"]), float(r["top"]), int(r["low"]))
        if k in out:
            a = out[k]
            got = (a[0] + got[0], a[1] + got[1], max(a[2], got[2]), min(a[3], got[3]))
        out[k] = got
    return out


def test_aggregate_over_gdat_example(tmp_path):
    data, where = gdat_bytes()
    path = tmp_path / "example.gdat"
    path.write_bytes(data)
    query = tmp_path / "agg.gsql"
    query.write_text(AGG_QUERY)
    out = tmp_path / "agg.csv"
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"g={path}",
               "--output", f"agg={out}"])
    assert res.returncode == 0, res.stderr
    got = merged(read_rows(out), lambda r: (int(r["u"]), r["s"]))
    by_hand: dict = defaultdict(list)
    for r in GOOD:
        by_hand[(r[1], r[5])].append(r)
    assert got == {k: (len(v), sum(r[8] for r in v), max(r[9] for r in v),
                       min(r[7] for r in v)) for k, v in by_hand.items()}
    ref = reference(AGG_QUERY, path, SCHEMA, "GDAT_EXAMPLE")["agg"]
    assert got == merged(ref, lambda r: (int(r["u"]), r["s"]))
    assert f"link g: {len(GOOD)} records" in res.stderr
    assert (f"link g: 2 malformed records skipped: 1 bad string (record 5 at byte "
            f"{where['bad']}: stringInPosition5 at offset 73 + length 1000 > "
            f"{len(pack_tuple(ROWS[BAD])) - 4} bytes), "
            f"1 truncated tuple (record 8 at byte {where['cut']}: 30 of "
            f"{len(pack_tuple(ROWS[0]))} bytes)") in res.stderr


SELECT_QUERY = """
DEFINE { query_name 'sel'; }
select uintOldTime as t, ullongInPosition2 as big, ipInPosition3 as ip,
       ipv6InPosition4 as ip6, boolInPosition6 as b, floatInPosition9 as f,
       stringInPosition5 as s
from [g].GDAT_EXAMPLE
where intInPosition7 < 0 and stringInPosition5 <> 'skip'
"""


def ip6_text(value: int) -> str:
    if value >> 32 == 0xFFFF:                   # IPv4-mapped: shown as IPv4
        return str(ipaddress.IPv4Address(value & 0xFFFF_FFFF))
    return str(ipaddress.IPv6Address(value))


def test_selection_over_gdat_example_from_standard_input(tmp_path):
    data, _ = gdat_bytes()
    path = tmp_path / "example.gdat"
    path.write_bytes(data)
    query = tmp_path / "sel.gsql"
    query.write_text(SELECT_QUERY)
    want = sorted((r[0], r[2], r[3], ip6_text(int(ipaddress.IPv6Address(r[4]))),
                   bool(r[6]), r[9], r[5]) for r in GOOD if r[7] < 0 and r[5] != "skip")
    assert len(want) == 3

    def rows(path):
        return sorted((int(r["t"]), int(r["big"]), r["ip"], r["ip6"],
                       r["b"].lower() == "true", float(r["f"]), r["s"])
                      for r in read_rows(path))

    for link, stdin in ((f"g={path}", None), ("g=-", data)):
        out = tmp_path / "sel.csv"
        res = run([str(query), "--schema", str(SCHEMA), "--link", link,
                   "--output", f"sel={out}"], stdin=stdin)
        assert res.returncode == 0, res.stderr
        assert rows(out) == want
    ref = reference(SELECT_QUERY, path, SCHEMA, "GDAT_EXAMPLE")["sel"]
    assert sorted((int(r["t"]), int(r["big"]), str(ipaddress.IPv4Address(int(r["ip"]))),
                   ip6_text(int(r["ip6"])), bool(r["b"]), float(r["f"]), r["s"])
                  for r in ref) == want


TIMED_SCHEMA = """
PROTOCOL GDAT_TIMED {
    uint t get_gdat_uint_pos1 (increasing);
    uint v get_gdat_uint_pos2;
    string s get_gdat_string_pos6;
}
"""
WINDOW_QUERY = """
DEFINE { query_name 'win'; }
select tb, count(*) as n, sum(v) as total, max(v) as top
from [g].GDAT_TIMED
where s <> 'odd'
group by t/10 as tb
"""


def test_windows_on_a_record_clock(tmp_path):
    rows = [(t, (t * 37) % 101, 0, "10.0.0.1", "::1", "odd" if t % 3 == 0 else "even", 0, 0,
             0, 0.0) for t in range(95)]
    path = tmp_path / "timed.gdat"
    path.write_bytes(header(schema_text(EXAMPLE_FIELDS))
                     + b"".join(pack_tuple(r) for r in rows))
    schema = tmp_path / "timed.txt"
    schema.write_text(TIMED_SCHEMA)
    query = tmp_path / "win.gsql"
    query.write_text(WINDOW_QUERY)
    out = tmp_path / "win.csv"
    res = run([str(query), "--schema", str(schema), "--link", f"g={path}",
               "--output", f"win={out}"])
    assert res.returncode == 0, res.stderr
    acc: dict = defaultdict(list)
    for r in rows:
        if r[5] != "odd":
            acc[r[0] // 10].append(r[1])
    want = {tb: (len(v), sum(v), max(v)) for tb, v in acc.items()}
    got = {int(r["tb"]): (int(r["n"]), int(r["total"]), int(r["top"])) for r in read_rows(out)}
    assert got == want
    ref = reference(WINDOW_QUERY, path, schema, "GDAT_TIMED")["win"]
    assert {int(r["tb"]): (int(r["n"]), int(r["total"]), int(r["top"])) for r in ref} == want


def test_errors_are_one_clear_line(tmp_path):
    query = tmp_path / "agg.gsql"
    query.write_text(AGG_QUERY)
    text = tmp_path / "records.csv"
    text.write_text("1,2,10.0.0.1,2001:db8::1,hello,TRUE,-3,-40,1.5\n")
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"g={text}"])
    assert res.returncode == 1
    assert res.stderr == (f"oopscope: error: {text}: byte 0: not a GDAT file: it does not "
                          f"start with the line 'GDAT' (found b'1,2,10.0.0.1,200')\n")

    fields = list(EXAMPLE_FIELDS)
    fields[5] = ("UINT", "notAString")
    wrong = tmp_path / "wrong.gdat"
    wrong.write_bytes(header(schema_text(fields)))
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"g={wrong}"])
    assert res.returncode == 1
    assert (f"{wrong}: field stringInPosition5 of protocol GDAT_EXAMPLE is read by "
            f"get_gdat_string_pos6, but field 6 of the file's schema (STREAM example) is "
            f"notAString, a UINT (that function reads a V_STR)") in res.stderr
    assert "Traceback" not in res.stderr
