"""`oopscope serve` with record links (`--schema FILE --records NAME=PROTOCOL:PATH`), as real
processes, and `oopscope submit --schema` (its `main`, in this process): a file of records
timed by their own field, replayed, with the server SIGKILLed halfway and restarted (every
window written once, equal to the windows computed here from the records written); a FIFO of
wall-clock records whose writer comes and goes, with a malformed line; and the errors of a
record link and of a query that reads a link as what it does not carry."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools.serving import Server, cli_here, read_output, wait_for

SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"

TCP_QUERY = """
DEFINE { query_name 'tcp'; }
select tb, sum(value) as total, count(*) as cnt, max(value) as top
from [csv].CSV_TCPEXAMPLE
group by ivalue/10 as tb
"""

#: CSV_EXAMPLE records are timed by the wall clock when read (base: systemTime)
EXAMPLE_QUERY = """
DEFINE { query_name 'example'; }
select tb, count(*) as cnt, sum(uintInPosition1) as total
from [csv].CSV_EXAMPLE
group by systemTime as tb
"""



def tcp_values(n: int) -> list[tuple[int, int]]:
    return [(i, (i * 37) % 101) for i in range(n)]


def tcp_windows(values, first_tb: int) -> dict[int, tuple[int, int, int]]:
    acc: dict[int, list[int]] = defaultdict(list)
    for ivalue, value in values:
        if ivalue // 10 >= first_tb:
            acc[ivalue // 10].append(value)
    return {tb: (sum(v), len(v), max(v)) for tb, v in acc.items()}


def written_windows(directory: Path) -> dict[int, tuple[int, int, int]]:
    table, _ = read_output(directory)
    if table is None:
        return {}
    rows = table.to_pylist()
    tbs = [int(r["tb"]) for r in rows]
    assert len(tbs) == len(set(tbs)), f"a window was written twice: {sorted(tbs)}"
    return {int(r["tb"]): (int(r["total"]), int(r["cnt"]), int(r["top"])) for r in rows}


@pytest.mark.slow
def test_record_file_link_survives_kill9_with_every_window_once(tmp_path):
    values = tcp_values(700)
    data = tmp_path / "tcp.csv"
    data.write_text("".join(f"{i}|{v}\n" for i, v in values))
    # the query's directory holds GS-lite's packet_schema.txt: submit sends it along
    qdir = tmp_path / "queries"
    qdir.mkdir()
    shutil.copy(SCHEMA, qdir / "packet_schema.txt")
    query = qdir / "tcp.gsql"
    query.write_text(TCP_QUERY)
    state = tmp_path / "state"
    # 20x: the 70 windows replayed in 35 s (most of them after the restart, at ~0.35
    # CPU-seconds a second); the query is still submitted before window 40 and the server
    # killed long before the file's end
    args = ["--schema", str(SCHEMA), "--records", f"csv=CSV_TCPEXAMPLE:{data}",
            "--csv-separator", "|", "--speed", "20"]
    server = Server(args, state, tmp_path / "serve.log").start()
    out = state / "tcp"
    try:
        server.wait_spark()
        cli_here(server, "submit", str(query))
        (info,) = server.client.queries()
        first_tb = int(info["first_window_ns"]) // 10**10
        assert 0 <= first_tb < 40, info
        wait_for(lambda: len(written_windows(out)) >= 4, 120, "windows written before the kill")
        before = written_windows(out)
        assert max(before) < 65, "the file ended before the kill: nothing to resume"
        server.kill9()

        server = Server(args, state, tmp_path / "serve.log").start()
        server.wait_spark()
        wait_for(lambda: max(written_windows(out), default=0) >= 69, 240,
                 "the last window after the restart")
        (info,) = server.client.queries()
        assert info["gaps"] == [], info["gaps"]      # read again from its start: no gap
    finally:
        server.stop()
    got = written_windows(out)
    expected = tcp_windows(values, first_tb)
    assert got == expected
    assert all(got[tb] == before[tb] for tb in before)
    # the restart read past the records of the windows written before the kill
    assert "read past" in (tmp_path / "serve.log").read_text()


def _feed(path: Path, lines: list[str]) -> None:
    with open(path, "w") as f:               # blocks until the server opens it
        for line in lines:
            f.write(line + "\n")
            f.flush()
            time.sleep(0.01)


@pytest.mark.slow
def test_fifo_of_wall_clock_records_and_the_errors(tmp_path):
    fifo = tmp_path / "feed.fifo"
    os.mkfifo(fifo)
    query = tmp_path / "example.gsql"
    query.write_text(EXAMPLE_QUERY)
    state = tmp_path / "state"
    server = Server(["--schema", str(SCHEMA), "--records", f"csv=CSV_EXAMPLE:{fifo}",
                     "--lull-slack", "1s"], state, tmp_path / "serve.log").start()
    try:
        server.wait_spark()
        reply = cli_here(server, "submit", str(query), "--schema", str(SCHEMA))
        assert "runs on csv" in reply.stdout
        (info,) = server.client.queries()
        wait_for(lambda: time.time_ns() > int(info["first_window_ns"]), 30,
                 "the first window's start")
        good = [f"{u},{u * 2},10.0.0.{u % 250},::1,s{u % 3},TRUE,-{u},{u},0.5"
                for u in range(1, 301)]
        # two writers one after the other: the link waits for the second
        _feed(fifo, good[:150] + ["7,x"])              # + one malformed line
        time.sleep(0.5)
        _feed(fifo, good[150:])
        out = state / "example"

        def counted():
            table, _ = read_output(out)
            return table is not None and sum(table.column("cnt").to_pylist()) == len(good)
        wait_for(counted, 60, "every record counted once the lull closed its window")
        table, _ = read_output(out)
        assert sum(table.column("total").to_pylist()) == sum(range(1, 301))
        status = server.client.status()
        (link,) = status["links"]
        assert link["malformed"] == 1 and link["packets"] == len(good)

        # a query reading the record link as packets, and a protocol declared otherwise
        bad = tmp_path / "bad.gsql"
        bad.write_text("select time, count(*) as n from csv.TCP group by time")
        res = cli_here(server, "submit", str(bad), check=False)
        assert res.returncode != 0
        assert "reads link csv as packets of TCP" in res.stderr
        assert "carries records of CSV_EXAMPLE" in res.stderr
        other = tmp_path / "other" / "packet_schema.txt"
        other.parent.mkdir()
        other.write_text("PROTOCOL base { uint systemTime get_system_time (increasing); }\n"
                         "PROTOCOL CSV_EXAMPLE (base) { uint uintInPosition1 "
                         "get_csv_uint_pos2; }\n")
        (other.parent / "q.gsql").write_text(EXAMPLE_QUERY.replace(
            "'example'", "'other'").replace(", sum(uintInPosition1) as total", ""))
        res = cli_here(server, "submit", str(other.parent / "q.gsql"), check=False)
        assert res.returncode != 0
        assert "as its own schema file declares it" in res.stderr
    finally:
        assert server.stop() == 0


def _serve(args: list[str], tmp_path: Path):
    return subprocess.run([sys.executable, "-m", "tools.cli", "serve", *args, "--state",
                           str(tmp_path / "state")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_record_link_errors_at_start(tmp_path):
    data = tmp_path / "records.csv"
    data.write_text("1,2\n")
    res = _serve(["--schema", str(SCHEMA), "--records", f"csv=NOPE:{data}"], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert f"--records csv=NOPE:{data}: no protocol NOPE" in res.stderr
    assert "CSV_EXAMPLE" in res.stderr                       # the protocols it has
    res = _serve(["--schema", str(SCHEMA), "--records", f"csv=CSV_EXAMPLE:{data}"], tmp_path)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    assert "timed by the wall clock when read" in res.stderr and "FIFO" in res.stderr
    res = _serve(["--schema", str(SCHEMA), "--records", f"csv=TCP:{data}"], tmp_path)
    assert "TCP is a packet protocol" in res.stderr
    res = _serve(["--schema", str(SCHEMA), "--records", f"csv=CSV_TCPEXAMPLE:"
                  f"{tmp_path / 'missing.csv'}"], tmp_path)
    assert res.returncode != 0 and "record file not found" in res.stderr
    res = _serve(["--records", "csv-without-protocol"], tmp_path)
    assert res.returncode != 0 and "is not NAME=PROTOCOL:PATH" in res.stderr
