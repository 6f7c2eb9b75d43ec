"""`oopscope serve --spool SHARED` and a capture agent in watch mode (`oopscope agent` without a
query file) over the same directory, as real processes: the agent lends the server its link
`edge` (a generated capture replayed in a loop, stamped with the wall clock); a query
submitted to the server `FROM edge.IPV4` has its low level run on the agent and its rows
written and tailed by the server; `oopscope status` lists the agent, its link and its work;
a cancel ends the agent's part; and a query whose agent is SIGKILLed still cancels with every
window closed.

The truth: the agent logs where each pass of the file lies in wall-clock time, so the packets
of every 1-second window are known from the file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.tools.serving import Server, metric_samples, per_window, read_output, wait_for

pytestmark = pytest.mark.slow

NS = 1_000_000_000
PER_SECOND = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets, sum(len) AS bytes
FROM edge.IPV4
GROUP BY time AS tb;
"""
PASS = re.compile(r"link edge: pass (\d+) of .*: capture time (\d+) ns is wall time (\d+) ns")


class Agent:
    """`oopscope -v agent --link edge=PCAP --loop --spool SHARED --host-id HOST` (watch mode)."""

    def __init__(self, pcap: Path, shared: Path, host: str, log: Path):
        self.log_path = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.cli", "-v", "agent", "--link", f"edge={pcap}",
                 "--loop", "--spool", str(shared), "--host-id", host],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1"))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def kill9(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def replay_truth(pcap: Path, log: str) -> dict[int, int]:
    """{second: IPv4 packets} of what the agent replayed: each pass of the file stamped from
    the wall time its log gives (as `tools.pipeline.links.ReplayLink` does, at speed 1)."""
    from capture.reader import read_all

    batch = read_all(pcap, "edge")
    ts = batch["timestamp"][batch["ipversion"] == 4]
    counts: dict[int, int] = {}
    for m in PASS.finditer(log):
        t0, w0 = int(m.group(2)), int(m.group(3))
        stamped = w0 + ((ts - t0) / 1.0).astype(np.int64)
        secs, n = np.unique(stamped // NS, return_counts=True)
        for s, c in zip(secs.tolist(), n.tolist()):
            counts[s] = counts.get(s, 0) + c
    return counts


def _agent_status(server: Server, host: str) -> dict | None:
    return next((a for a in server.client.status()["agents"] if a["host"] == host), None)


def test_a_query_on_an_agents_link(ten_seconds_pcap, tmp_path):
    shared = tmp_path / "shared"
    (tmp_path / "persec.gsql").write_text(PER_SECOND)
    (tmp_path / "nowhere.gsql").write_text(PER_SECOND.replace("edge.IPV4", "nowhere.IPV4"))
    agent = Agent(ten_seconds_pcap, shared, "edge-host", tmp_path / "agent.log")
    server = Server(["--spool", str(shared)], tmp_path / "state", tmp_path / "serve.log")
    tail = None
    try:
        server.start()
        wait_for(lambda: (a := _agent_status(server, "edge-host")) and a["live"]
                 and "edge" in a["links"], 60, "the agent's heartbeat")
        st = server.cli("status")
        assert re.search(r"edge-host\s+running\s+\S+ ago\s+edge\s", st.stdout), st.stdout
        assert st.stdout.count("edge-host") == 1
        # a link nobody captures is refused with the links there are
        bad = server.cli("submit", str(tmp_path / "nowhere.gsql"), check=False)
        assert bad.returncode == 1 and "no link nowhere" in bad.stderr, bad.stderr
        assert "its links are edge" in bad.stderr, bad.stderr
        server.wait_spark()

        reply = server.client.submit(text=PER_SECOND, file="persec.gsql")
        assert reply["agents"] == {"edge": "edge-host"}
        first = reply["first_window_ns"] // NS
        tail = subprocess.Popen([sys.executable, "-m", "tools.cli", "tail", "persec", "--format",
                                 "jsonl", "--server", server.client.server], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = tmp_path / "state" / "persec"
        # five written: the first four then end at least a second before the cancel below,
        # as the check of whole windows at the end wants (four written, the fourth could end
        # within half a second of it when the high level keeps up that closely)
        wait_for(lambda: len(per_window(read_output(out)[0])) >= 5, 90,
                 f"five windows of persec:\n{server.log()}\n{agent.log()[-3000:]}")
        a = _agent_status(server, "edge-host")
        assert a["work"]["persec"]["state"] == "running", a
        assert a["work"]["persec"]["attached_ns"] < reply["first_window_ns"], a
        st = server.cli("status").stdout
        assert re.search(r"edge-host\s+running\s+.*\s+edge\s+.*persec", st), st
        q = server.client.queries()[0]
        assert q["partial_rows"] > 0 and q["links"] == ["edge"], q
        # its table is the agent's: the server shows its size (the default, or the smallest
        # once a few windows of one group each let it shrink) and the reduction over its rows
        assert q["slots"] in (1024, 65536), q
        assert q["partials_per_row"] == pytest.approx(q["partial_rows"] / q["rows_out"],
                                                      abs=1e-3), q
        beat = json.loads((shared / "agents" / "edge-host.json").read_text())
        assert beat["tables"]["persec"]["edge"]["slots"] in (1024, 65536), beat

        cancelled_at = time.time_ns()
        res = server.cli("cancel", "persec")
        assert "cancelled" in res.stdout
        # the agent ended its part: its heartbeat no longer lists the work, nor the server
        # the work item
        wait_for(lambda: _agent_status(server, "edge-host")["work"] == {}, 10,
                 "the agent's heartbeat without persec")
        beat = json.loads((shared / "agents" / "edge-host.json").read_text())
        assert beat["work"] == {} and beat["state"] == "running"
        assert not list((shared / "work").glob("*.json"))
        assert "query persec (generation 1) cancelled: its low level on edge ended" \
            in agent.log()
        tail_out, tail_err = tail.communicate(timeout=60)
        assert "ended" in tail_err
        # what it ended with: the agent's table and partial rows, over the rows written,
        # the same in `queries` and the metrics (the agent's partial rows as it reported
        # them before the cancel: those of the windows it closed after are not counted)
        q = next(q for q in server.client.queries() if q["name"] == "persec")
        done = read_output(out)[0].num_rows
        assert q["state"] == "cancelled" and q["rows_out"] == done, q
        assert q["slots"] in (1024, 65536), q
        assert q["partials_per_row"] == pytest.approx(q["partial_rows"] / done, abs=1e-3)
        m = metric_samples(server.client)
        assert m[("oopscope_query_table_slots", (("query", "persec"),))] == q["slots"]
        assert m[("oopscope_query_partials_per_row", (("query", "persec"),))] == \
            q["partials_per_row"] > 0

        # an agent killed while it runs a query: the cancel still closes every window
        again = server.client.submit(text=PER_SECOND, file="persec.gsql", name="again")
        wait_for(lambda: "again" in _agent_status(server, "edge-host")["work"], 15,
                 "the agent running `again`")
        wait_for(lambda: time.time_ns() > again["first_window_ns"] + 2 * NS, 15,
                 "two windows of `again`")
        agent.kill9()
        wait_for(lambda: not _agent_status(server, "edge-host")["live"], 15,
                 "the agent declared silent")
        assert "silent" in server.cli("status").stdout
        res = server.cli("cancel", "again")
        assert "cancelled" in res.stdout
        assert "agent edge-host did not end link edge" in server.log()
        again_rows = per_window(read_output(tmp_path / "state" / "again")[0])
        assert again_rows and min(again_rows) == again["first_window_ns"] // NS
    finally:
        if tail is not None and tail.poll() is None:
            tail.kill()
        code = server.stop()
        agent.stop()
    assert code == 0, server.log()
    assert "Traceback" not in server.log() and "Traceback" not in agent.log()

    # every window from the first to the cancel, once, each exactly the packets the agent
    # replayed in it; the window the cancel cut holds no more
    truth = replay_truth(ten_seconds_pcap, agent.log())
    table, _ = read_output(tmp_path / "state" / "persec")
    got = per_window(table)
    assert min(got) == first
    whole = [w for w in got if (w + 1) * NS <= cancelled_at - NS // 2]
    assert len(whole) >= 4, got
    assert set(range(first, max(whole) + 1)) <= set(got)
    for w, n in got.items():
        if w in whole:
            assert n == truth.get(w, 0), (w, n, truth.get(w))
        else:
            assert n <= truth.get(w, 0), (w, n, truth.get(w))
    # the tail saw exactly the rows written
    tailed = sorted((r["tb"], r["packets"]) for r in map(json.loads, tail_out.splitlines())
                    if r)
    assert tailed == sorted(got.items())
