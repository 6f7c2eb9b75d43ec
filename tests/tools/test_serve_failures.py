"""A query that fails after it was accepted releases what it held, as a cancel does (issue 34,
finding 4): its spool thread, its queue, its low-level tables and their memory."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.tools.serving import Server, wait_for

#: 2^22 slots: a low-level table of ~30 MB, so that ten kept would show in the RSS
BIG = """
DEFINE { query_name big; aggregate_slots 4194304; }
SELECT tb, srcIP, count(*) AS packets
FROM main.IPV4
GROUP BY time AS tb, srcIP;
"""


def _threads_and_rss_mb(pid: int) -> tuple[int, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines())
    return int(status["Threads"]), int(status["VmRSS"].split()[0]) / 1024


def _break_spool(state: Path, name: str) -> None:
    """The query's spool directory becomes a file: its next spool write fails (ENOTDIR),
    and with it the query's low level (a stage starting meanwhile fails on it too)."""
    partials = state / "run" / name / "g1" / "spool" / "big" / "partials"
    while True:
        shutil.rmtree(partials, ignore_errors=True)
        try:
            partials.write_text("")
            return
        except IsADirectoryError:      # made again meanwhile (a stage starting): again
            continue


def _fail_one(server: Server, state: Path, name: str) -> dict:
    reply = server.client.submit(text=BIG, file="big.gsql", name=name)
    assert reply["name"] == name
    _break_spool(state, name)
    return wait_for(lambda: next((q for q in server.client.queries()
                                  if q["name"] == name and q["state"] == "failed"), None),
                    60, f"{name} to fail")


@pytest.mark.slow
def test_failed_queries_release_threads_and_memory(ten_seconds_pcap, tmp_path):
    state = tmp_path / "state"
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"], state,
                    tmp_path / "serve.log").start()
    try:
        pid = server.proc.pid
        server.wait_spark()                       # its threads there before the count
        # what a first query loads once (kernels compiled, a stage's first start, a first
        # failure), before the count: one that runs and is cancelled, one that fails
        server.client.submit(text=BIG, file="big.gsql", name="runs")
        wait_for(lambda: server.client.queries()[0]["rows_out"] > 0, 90, "a first window")
        server.client.cancel("runs")
        _fail_one(server, state, "warmup")
        time.sleep(2)
        threads0, rss0 = _threads_and_rss_mb(pid)
        for k in range(10):
            q = _fail_one(server, state, f"fails{k}")
            assert "spool" in q["error"] or "did not start" in q["error"], q["error"]
        time.sleep(2)
        threads1, rss1 = _threads_and_rss_mb(pid)
        # each failure used to keep its spool thread (+10) and its tables (~30 MB each);
        # some MB a submission still costs whether it fails or is cancelled (Spark's side)
        assert threads1 <= threads0 + 3, (threads0, threads1)
        assert rss1 - rss0 < 96, (rss0, rss1)
        # its spool is gone as a cancel's is; the server goes on
        assert not (state / "run" / "fails9" / "g1").exists()
        assert server.client.status()["links"][0]["packets"] > 0
    finally:
        assert server.stop() == 0, server.log()
