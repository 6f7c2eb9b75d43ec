"""Every counter of the appliance says since when it counts (issue 38): a query's across a
kill -9 and restart agree with the rows in its output files (`queries`, `cancel`'s reply,
`/metrics`), the links' count from the process's start and their rates follow the traffic
within seconds; `queries` shows the gaps and dated first windows; a tail of a cancelled
query prints its last rows; serve's own lines are news, not warnings. Real servers."""

from __future__ import annotations

import json
import time

import pytest

from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, metric_samples, per_window, read_output, wait_for


def _query(server: Server, name: str = "persec") -> dict:
    return next(q for q in server.client.queries() if q["name"] == name)


def _rows(out) -> int:
    table = read_output(out)[0]
    return 0 if table is None else table.num_rows


def _day(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9))


@pytest.mark.slow
def test_counters_agree_with_the_outputs_after_kill9_and_restart(ten_seconds_pcap, tmp_path):
    state = tmp_path / "state"
    args = ["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"]
    server = Server(args, state, tmp_path / "serve.log").start()
    query = tmp_path / "persec.gsql"
    query.write_text(PER_SECOND)
    out = state / "out.csv"
    try:
        server.wait_spark()
        # an output named like a file is a directory of part files, and submit says so
        res = server.cli("submit", str(query), "--output", "persec=out.csv")
        assert f"it writes into {out}/, a directory of part files" in res.stdout
        assert f"persec -> {out}/ (a directory of part files" in res.stdout
        wait_for(lambda: _rows(out) >= 3, 90, "three windows")
        since = _query(server)["counted_since_ns"]
        assert since == json.loads((state / "queries" / "persec.json").read_text())[
            "submitted_ns"]
        record = state / "queries" / "persec.json"
        wait_for(lambda: json.loads(record.read_text())["counted"].get("totals", {}).get(
            "partial_rows", 0) > 0, 30, "the counters saved in the record")
        saved = json.loads(record.read_text())["counted"]["totals"]
        killed_at = time.time_ns()
        server.kill9()
        written = _rows(out)
        assert written >= 3
        server.start()
        # the rows written before the crash count; the process's counters say they restarted
        low = _rows(out)
        q = _query(server)
        high = _rows(out)
        assert written <= low <= q["rows_out"] <= high, (written, low, q["rows_out"], high)
        assert q["partial_rows"] >= saved["partial_rows"] > 0
        assert q["counted_since_ns"] == since
        st = server.client.status()
        assert st["counters_since_ns"] > killed_at
        assert st["links"][0]["since_ns"] == st["counters_since_ns"]
        assert q["gaps"] and q["gaps"][-1]["reason"] == "restart"
        server.wait_spark()
        # more windows after the restart: the tail below shows the last 20 of them all
        wait_for(lambda: _rows(out) >= max(25, written + 3), 120, "windows after the restart")
        # `queries`: since when, the first window with its date, the gap, all in UTC
        res = server.cli("queries")
        q = _query(server)
        assert "SINCE (UTC)" in res.stdout and "FIRST WINDOW (UTC)" in res.stdout
        assert _day(since) in res.stdout and _day(q["first_window_ns"]) in res.stdout
        gap = q["gaps"][-1]
        assert (f"persec: gap from {_day(gap['from_ns'])} to {_day(gap['to_ns'])} UTC "
                f"(restart)") in res.stdout, res.stdout
        # cancel's summary, `queries` and the metrics agree with the files
        res = server.cli("cancel", "persec")
        table = read_output(out)[0]
        per_window(table)                              # no window written twice
        rows = table.num_rows
        assert f"({rows} rows in all since its submission at {_day(since)} UTC)" in \
            res.stdout, (rows, res.stdout)
        q = _query(server)
        m = metric_samples(server.client)
        assert q["state"] == "cancelled" and q["rows_out"] == rows
        assert m[("oopscope_query_rows_total", (("query", "persec"),))] == rows
        assert m[("oopscope_query_partial_rows_total", (("query", "persec"),))] == \
            q["partial_rows"] >= saved["partial_rows"]
        # the table's size and the reduction: the same in `queries` and the metrics
        assert q["slots"] >= 1024
        assert m[("oopscope_query_table_slots", (("query", "persec"),))] == q["slots"]
        assert q["partials_per_row"] == pytest.approx(q["partial_rows"] / rows, abs=1e-3)
        assert m[("oopscope_query_partials_per_row", (("query", "persec"),))] == \
            q["partials_per_row"] >= 1
        assert m[("oopscope_query_counted_since_seconds", (("query", "persec"),))] == \
            pytest.approx(since / 1e9)
        assert m[("oopscope_start_time_seconds", ())] == \
            pytest.approx(st["counters_since_ns"] / 1e9)
        # no packet is malformed, and the series exist (an alert needs them)
        for reason in ("truncated_ip_header", "bad_ip_length"):
            assert m[("oopscope_link_malformed_total",
                      (("link", "main"), ("reason", reason)))] == 0
        # a tail of the cancelled query: its last rows, and it ends
        res = server.cli("tail", "persec", "--format", "csv")
        assert "query persec is not running (cancelled): its last 20 rows" in res.stderr
        lines = res.stdout.splitlines()
        assert lines[0] == "tb,packets,bytes" and len(lines) == 21
        last = table.slice(rows - 20).column("tb").to_pylist()
        assert [int(line.split(",")[0]) for line in lines[1:]] == last
        # -v shows no chatter of the Python-JVM bridge
        assert "Received command" not in server.log_path.read_text(errors="replace")
    finally:
        assert server.stop() == 0, server.log()
    # started again, the server has none of its rows in memory: they are read back
    server.start()
    try:
        res = server.cli("tail", "persec", "--format", "csv")
        assert [int(line.split(",")[0]) for line in res.stdout.splitlines()[1:]] == last
        assert _query(server)["rows_out"] == rows
        res = server.cli("tail", "nothing", check=False)
        assert res.returncode == 1 and "no running query 'nothing'" in res.stderr
    finally:
        assert server.stop() == 0, server.log()


@pytest.mark.slow
def test_rates_follow_the_traffic_and_serve_says_what_it_does(ten_seconds_pcap, tmp_path):
    # 20,000 packets at half speed: 1,000 packets/s for 20 s, then nothing
    server = Server(["--link", f"main={ten_seconds_pcap}", "--speed", "0.5"],
                    tmp_path / "state", tmp_path / "serve.log", verbose=False).start()
    try:
        # from the first packets on, not after a long average (it said 0/s for 20 s)
        first = wait_for(lambda: (lambda link: link if link["packets"] else None)(
            server.client.status()["links"][0]), 30, "the first packets")
        t1 = time.monotonic()
        time.sleep(2.5)
        second = server.client.status()["links"][0]
        measured = (second["packets"] - first["packets"]) / (time.monotonic() - t1)
        assert second["packets"] < 20_000, "the capture should still be playing"
        # right from the first seconds, and the rate of the last seconds
        assert first["pps"] > 0, first
        assert 0.4 * measured <= second["pps"] <= 1.6 * measured, (second, measured)
        wait_for(lambda: server.client.status()["links"][0]["packets"] >= 20_000, 60,
                 "the whole capture")
        # the traffic stopped: the rate says so within seconds (it said 1,812/s 20 s on)
        wait_for(lambda: server.client.status()["links"][0]["pps"] == 0, 5, "a zero rate")
        server.wait_spark()
        wait_for(lambda: "Spark is up (it took" in server.log(), 10, "Spark's line")
        log = server.log()
        assert "oopscope: serving on http://" in log
        assert "oopscope: starting Spark (local[*])" in log
        assert "WARNING: serving" not in log
    finally:
        assert server.stop() == 0, server.log()
    log = server.log()
    assert "oopscope: stopping: closing every window" in log and "WARNING: stop" not in log
