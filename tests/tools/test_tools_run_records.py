"""`oopscope run` over CSV record links (GS-lite's record sources), through the real command
line (in this process, `run_here`; in a process of its own where the stream it reads is
the point: a FIFO, standard input): GS-lite's CSVEXAMPLE demo with its own schema file, CSV_TCPEXAMPLE
windows on its increasing field, a selection with a WHERE on a string, a FIFO fed while the
run reads it, standard input, and the errors. Expected rows come from the reference
evaluator (`tests.oracles.reference`) over the same file, or are computed here from the
values written; `systemTime` is the wall clock when read, so it is checked to lie between the
times before and after the run and the other columns are compared.
"""

from __future__ import annotations

import csv
import ipaddress
import os
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from capture.records import read_all_records
from queries.planner import plan_text
from queries.schemafile import load_schema
from tests.conftest import REPO
from tests.oracles.reference import evaluate_file
from tests.tools.resuming import run_here

SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"
EXAMPLE = REPO / "tests" / "tools" / "fixtures" / "gslite" / "example.gsql"

#: CSV_EXAMPLE records: repeats (one group, Cnt 2), every type's edge, and malformed lines
EXAMPLE_LINES = [
    "1,2,10.0.0.1,2001:db8::1,hello,TRUE,-3,-40,1.5",
    "1,2,10.0.0.1,2001:db8::1,hello,TRUE,-3,-40,1.5",
    "4294967295,18446744073709551615,255.255.255.255,::,world,false,-2147483648,"
    "-9223372036854775808,-2e3",
    "7,8,192.168.1.7,fe80::1:2,hello,True,2147483647,9223372036854775807,0.25",
    "3,4,10.0.0.3,::ffff:102:304,a b,FALSE,0,0,3",
    "8,9",                                           # line 6: wrong field count
    "x7,9,10.0.0.9,::,hello,TRUE,1,1,1",             # line 7: bad uint
    "5,6,10.0.0.5,::5,hello,TRUE,5,5,5",
]


def run(args: list[str]) -> subprocess.CompletedProcess:
    """`oopscope run ARGS` in this process: its exit code, standard output and error."""
    return run_here([sys.executable, "-m", "tools.cli", "run", *args], check=False)


def run_process(args: list[str], *, stdin: str | None = None, timeout: int = 600):
    """`oopscope run ARGS` in a process of its own: for a FIFO or standard input, where the
    stream the process reads is what is tested."""
    cmd = [sys.executable, "-m", "tools.cli", "run", *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def reference(query_text: str, path: Path, protocol: str, **options) -> list[dict]:
    schema = load_schema([SCHEMA])
    plan = plan_text(query_text, ["csv"], schema=schema)
    batch = read_all_records(path, schema.record_format(protocol), "csv", **options)
    frame = next(iter(evaluate_file(plan, {"csv": batch}).values()))
    return frame.to_dict("records")


def ip_text(value: int, v4: bool) -> str:
    if v4:
        return str(ipaddress.IPv4Address(int(value) & 0xFFFF_FFFF))
    v = int(value)
    if v >> 32 == 0xFFFF:                           # IPv4-mapped: shown as IPv4
        return str(ipaddress.IPv4Address(v & 0xFFFF_FFFF))
    return str(ipaddress.IPv6Address(v))


def example_key(row: dict, from_reference: bool) -> tuple:
    """A CSV_EXAMPLE result row without systemTime, in comparable form."""
    if from_reference:
        return (int(row["uintInPosition1"]), int(row["ullongInPosition2"]),
                ip_text(row["ipInPosition3"], True), ip_text(row["ipv6InPosition4"], False),
                row["stringInPosition5"], bool(row["boolInPosition6"]),
                int(row["intInPosition7"]), int(row["llongInPosition8"]),
                float(row["floatInPosition9"]))
    return (int(row["uintInPosition1"]), int(row["ullongInPosition2"]), row["ipInPosition3"],
            row["ipv6InPosition4"], row["stringInPosition5"],
            row["boolInPosition6"].lower() == "true", int(row["intInPosition7"]),
            int(row["llongInPosition8"]), float(row["floatInPosition9"]))


def counts(rows: list[dict], from_reference: bool) -> Counter:
    """Cnt per group of the other columns (a run whose reading spans a second boundary
    splits a group over two systemTime values: their counts add up)."""
    out: Counter = Counter()
    for r in rows:
        out[example_key(r, from_reference)] += int(r["Cnt"])
    return out


def check_system_time(rows: list[dict], before: float, after: float) -> None:
    for r in rows:
        assert int(before) <= int(r["systemTime"]) <= int(after) + 1


def test_gslite_csvexample_demo(tmp_path):
    data = tmp_path / "example.csv"
    data.write_text("\n".join(EXAMPLE_LINES) + "\n")
    out = tmp_path / "out.csv"
    before = time.time()
    res = run([str(EXAMPLE), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--output", f"example={out}"])
    after = time.time()
    assert res.returncode == 0, res.stderr
    got = read_rows(out)
    want = reference(EXAMPLE.read_text(), data, "CSV_EXAMPLE")
    assert counts(got, False) == counts(want, True)
    assert sum(int(r["Cnt"]) for r in got) == 6
    check_system_time(got, before, after)
    assert "link csv: 6 records" in res.stderr
    assert ("link csv: 2 malformed records skipped: 1 wrong field count (line 6), "
            "1 bad uint (line 7: 'x7')") in res.stderr


TCP_QUERY = """
DEFINE { query_name 'tcp'; }
select tb, sum(value) as total, count(*) as cnt, max(value) as top
from [csv].CSV_TCPEXAMPLE
group by ivalue/10 as tb
"""


def tcp_lines(start: int, stop: int) -> list[str]:
    return [f"{i}|{(i * 37) % 101}" for i in range(start, stop)]


def tcp_expected(lines: list[str]) -> dict[int, tuple[int, int, int]]:
    acc: dict[int, list[int]] = defaultdict(list)
    for line in lines:
        ivalue, value = (int(x) for x in line.split("|"))
        acc[ivalue // 10].append(value)
    return {tb: (sum(v), len(v), max(v)) for tb, v in acc.items()}


def tcp_rows(path: Path) -> dict[int, tuple[int, int, int]]:
    return {int(r["tb"]): (int(r["total"]), int(r["cnt"]), int(r["top"]))
            for r in read_rows(path)}


def test_csv_tcpexample_windows_on_its_increasing_field(tmp_path):
    lines = tcp_lines(0, 95)
    data = tmp_path / "tcp.csv"
    data.write_text("\n".join(lines) + "\n")
    query = tmp_path / "tcp.gsql"
    query.write_text(TCP_QUERY)
    out = tmp_path / "tcp_out.csv"
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--output", f"tcp={out}", "--csv-separator", "|"])
    assert res.returncode == 0, res.stderr
    assert tcp_rows(out) == tcp_expected(lines)
    ref = reference(TCP_QUERY, data, "CSV_TCPEXAMPLE", separator="|")
    assert tcp_rows(out) == {int(r["tb"]): (int(r["total"]), int(r["cnt"]), int(r["top"]))
                             for r in ref}


SELECT_QUERY = """
DEFINE { query_name 'hellos'; }
select uintInPosition1 as u, stringInPosition5 as s, floatInPosition9 as f
from [csv].CSV_EXAMPLE
where stringInPosition5 = 'hello' and intInPosition7 <> 5;

DEFINE { query_name 'others'; }
select stringInPosition5 as s, count(*) as n
from [csv].CSV_EXAMPLE
where stringInPosition5 <> 'hello'
group by systemTime, stringInPosition5
"""


def test_selection_with_a_where_on_a_string(tmp_path):
    data = tmp_path / "example.csv"
    data.write_text("\n".join(EXAMPLE_LINES) + "\n")
    query = tmp_path / "sel.gsql"
    query.write_text(SELECT_QUERY)
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--output", f"hellos={tmp_path / 'h.csv'}",
               "--output", f"others={tmp_path / 'o.csv'}"])
    assert res.returncode == 0, res.stderr
    good = [line.split(",") for line in EXAMPLE_LINES]
    good = [f for f in good if len(f) == 9 and f[0].isdigit()]
    want = sorted((int(f[0]), f[4], float(f[8])) for f in good
                  if f[4] == "hello" and int(f[6]) != 5)
    got = sorted((int(r["u"]), r["s"], float(r["f"])) for r in read_rows(tmp_path / "h.csv"))
    assert got == want
    others: Counter = Counter()
    for r in read_rows(tmp_path / "o.csv"):
        others[r["s"]] += int(r["n"])
    assert others == Counter(f[4] for f in good if f[4] != "hello")


def test_fifo_fed_while_the_run_reads_it(tmp_path):
    query = tmp_path / "tcp.gsql"
    query.write_text(TCP_QUERY)
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "tcp_out.csv"
    first, rest = tcp_lines(0, 40), tcp_lines(40, 75)
    seen_early = threading.Event()

    def writer():
        with open(fifo, "w") as w:
            w.write("\n".join(first) + "\n")
            w.flush()
            # the windows of the records written so far are written while the stream is
            # still open: the run processes records as they arrive
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if out.exists() and any(r.get("tb") == "0" for r in read_rows(out)):
                    seen_early.set()
                    break
                time.sleep(0.2)
            w.write("\n".join(rest) + "\n")

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    res = run_process([str(query), "--schema", str(SCHEMA), "--link", f"csv={fifo}",
                       "--output", f"tcp={out}"])
    t.join(10)
    assert res.returncode == 0, res.stderr
    assert seen_early.is_set()
    assert tcp_rows(out) == tcp_expected(first + rest)


def test_standard_input(tmp_path):
    out = tmp_path / "out.csv"
    text = "\n".join(line.replace(",", ";") for line in EXAMPLE_LINES) + "\n"
    data = tmp_path / "example.csv"
    data.write_text(text)
    before = time.time()
    res = run_process([str(EXAMPLE), "--schema", str(SCHEMA), "--link", "csv=-",
                       "--output", f"example={out}"], stdin=text)
    after = time.time()
    assert res.returncode == 0, res.stderr
    got = read_rows(out)
    want = reference(EXAMPLE.read_text(), data, "CSV_EXAMPLE")
    assert counts(got, False) == counts(want, True)
    check_system_time(got, before, after)
    assert "link csv: 6 records" in res.stderr and "[-]" in res.stderr


def test_wall_clock_stream_punctuates_during_a_lull(tmp_path):
    """CSV_EXAMPLE is timed by get_system_time: a window closes by the link's timer while
    the FIFO is quiet, before the writer ends the stream."""
    fifo = tmp_path / "sys.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "out.csv"
    closed_while_open = threading.Event()

    def writer():
        with open(fifo, "w") as w:
            w.write(EXAMPLE_LINES[0] + "\n")
            w.flush()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                if out.exists() and read_rows(out):
                    closed_while_open.set()
                    break
                time.sleep(0.2)
            w.write(EXAMPLE_LINES[2] + "\n")

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    res = run_process([str(EXAMPLE), "--schema", str(SCHEMA), "--link", f"csv={fifo}",
                       "--output", f"example={out}"])
    t.join(10)
    assert res.returncode == 0, res.stderr
    assert closed_while_open.is_set()
    assert sum(int(r["Cnt"]) for r in read_rows(out)) == 2


def test_errors_are_one_clear_line(tmp_path):
    data = tmp_path / "example.csv"
    data.write_text(EXAMPLE_LINES[0] + "\n")
    mixed = tmp_path / "mixed.gsql"
    mixed.write_text("DEFINE { query_name 'recs'; }\nselect systemTime, count(*) as n "
                     "from [csv].CSV_EXAMPLE group by systemTime;\n"
                     "DEFINE { query_name 'pkts'; }\nselect time, count(*) as n "
                     "from [csv].IPV4 group by time\n")
    res = run([str(mixed), "--schema", str(SCHEMA), "--link", f"csv={data}"])
    assert res.returncode == 1
    assert ("link csv is read as records of CSV_EXAMPLE by query recs and as packets of "
            "IPV4 by query pkts") in res.stderr
    assert "Traceback" not in res.stderr

    gdat = tmp_path / "gdat.gsql"
    gdat.write_text("select systemTime, count(*) as n from [g].GDAT_EXAMPLE group by systemTime")
    res = run([str(gdat), "--schema", str(SCHEMA), "--link", f"g={data}"])
    assert res.returncode == 1
    # a CSV file given where GDAT records are read: one line naming the file and the byte
    assert "not a GDAT file" in res.stderr and "byte 0" in res.stderr

    res = run([str(EXAMPLE), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--speed", "2"])
    assert res.returncode == 1 and "timed by the wall clock when read" in res.stderr

    res = run([str(EXAMPLE), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--csv-separator", "ab"])
    assert res.returncode == 2 and "--csv-separator" in res.stderr
