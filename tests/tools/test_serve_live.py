"""`oopscope serve` on a veth pair in a namespace made here: queries submitted, tailed and
cancelled while timed bursts flow, and a SIGKILL under traffic with a restart.

The traffic is `tools.gen.bursts`: one burst per wall-clock second, sent from the middle of
the second, so the exact number of packets of every 1-second window is known.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tests.tools.conftest import veth_pair
from tests.tools.serving import Sender, Server, burst_truth, cli_here, per_window, read_output, wait_for

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

PER_SECOND = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time AS tb;
"""
PER_SOURCE = """
DEFINE { query_name bysrc; }
SELECT tb, srcIP, count(*) AS packets
FROM main.UDP
GROUP BY time AS tb, srcIP;
"""


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("oopsrv")



def _stop_between_bursts(sender: Sender) -> None:
    """Stop the sender as soon as it is between two bursts, with every burst it sent read.
    Burst k is sent from k+0.4 s on and its line printed after it; the next cannot start
    before k+1.4 s. So a kill made (its call returned) before then cuts no burst; a reader
    too late for that waits for the next burst instead."""
    while True:
        sender.read(1)
        second = json.loads(sender.lines[-1])["second"]
        if time.time() < second + 1.1:
            sender.proc.kill()
            if time.time() < second + 1.4:
                break
            raise AssertionError("the sender was killed too late to be sure of its last burst")
    sender.proc.wait()
    assert sender.proc.stdout is not None
    sender.lines += [line for line in sender.proc.stdout.read().splitlines() if line.strip()]


@pytest.fixture
def queries(tmp_path):
    (tmp_path / "persec.gsql").write_text(PER_SECOND)
    (tmp_path / "bysrc.gsql").write_text(PER_SOURCE)
    return tmp_path


def test_submit_tail_cancel_while_traffic_flows(pair, queries, tmp_path):
    server = Server(["--interface", f"main={pair.outer}"], tmp_path / "state",
                    tmp_path / "serve.log").start()
    sender = None
    try:
        server.wait_spark()
        a = server.client.submit(text=PER_SECOND, file="persec.gsql")
        assert a["name"] == "persec" and "first window starts at" in a["message"]
        # a bad query changes nothing, and says where it is wrong
        bad = cli_here(server, "submit", str(queries / "bad.gsql"), check=False)
        assert bad.returncode == 1 and "no such query file" in bad.stderr
        (queries / "bad.gsql").write_text("SELECT tb, count(*) FROM main.IPV4 GROUP BY tim AS tb;")
        bad = cli_here(server, "submit", str(queries / "bad.gsql"), check=False)
        assert bad.returncode == 1 and "bad.gsql:1:45: unknown column" in bad.stderr, bad.stderr
        assert [q["name"] for q in server.client.queries()] == ["persec"]

        wait_for(lambda: time.time_ns() > a["first_window_ns"], 10, "persec's first window")
        # long enough for a submit and three windows on a loaded machine; stopped once
        # bysrc is cancelled (the bursts after that only add windows persec counts alike)
        sender = Sender(pair, seconds=60)
        sender.read(3)
        sub = cli_here(server, "submit", str(queries / "bysrc.gsql"))
        assert "bysrc runs on main" in sub.stdout
        b = next(q for q in server.client.queries() if q["name"] == "bysrc")
        tail = subprocess.Popen([sys.executable, "-m", "tools.cli", "tail", "bysrc", "--format",
                                 "jsonl", "--server", server.client.server], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # the first full window of bysrc, and two more
        wait_for(lambda: (max(burst_truth(sender.read(1))) * 10**9 > b["first_window_ns"]
                          + 3 * 10**9), 30, "three bysrc windows of traffic")
        cancelled_at = time.time()
        reply = cli_here(server, "cancel", "bysrc")
        assert "cancelled" in reply.stdout
        # a burst after the cancel, so a window only persec counts is checked too
        _stop_between_bursts(sender)
        tail_out, tail_err = tail.communicate(timeout=60)
        assert "ended" in tail_err
        truth = sender.truth
        last = max(truth)
        wait_for(lambda: last in per_window(read_output(tmp_path / "state" / "persec")[0]),
                 60, f"persec's window {last}")
        states = {q["name"]: q["state"] for q in server.client.queries()}
        assert states == {"persec": "running", "bysrc": "cancelled"}
    finally:
        if sender is not None and sender.proc.poll() is None:
            sender.proc.kill()
        code = server.stop()
    assert code == 0, server.log()

    # persec: every window of the traffic, each exactly the packets sent in it, once
    got = per_window(read_output(tmp_path / "state" / "persec")[0])
    assert got == truth, (got, truth)

    # bysrc: nothing before its first window; whole windows exact; the window the cancel cut
    # holds no more than was sent
    table, files = read_output(tmp_path / "state" / "bysrc")
    rows = table.to_pylist()
    first = b["first_window_ns"] // 10**9
    sums: dict = {}
    for r in rows:
        sums[r["tb"]] = sums.get(r["tb"], 0) + r["packets"]
    assert min(sums) >= first
    complete = [w for w in sums if w + 1 <= cancelled_at]
    assert len(complete) >= 2, sums
    for w, n in sums.items():
        if w + 1 <= cancelled_at:
            assert n == truth.get(w, 0), (w, n, truth)
        else:
            assert n <= truth.get(w, 0)
    for w in truth:
        if first <= w and w + 1 <= cancelled_at:
            assert w in sums, f"bysrc lost window {w}"
    # the tail saw exactly the rows written
    tailed = [json.loads(line) for line in tail_out.splitlines() if line.strip()]
    key = lambda r: (r["tb"], r["srcIP"], r["packets"])  # noqa: E731
    assert sorted(map(key, tailed)) == sorted(map(key, rows))


def test_sigkill_under_traffic_then_restart(pair, tmp_path):
    state = tmp_path / "state"
    args = ["--interface", f"main={pair.outer}"]
    server = Server(args, state, tmp_path / "serve.log").start()
    sender = None
    try:
        server.wait_spark()
        a = server.client.submit(text=PER_SECOND, file="persec.gsql")
        wait_for(lambda: time.time_ns() > a["first_window_ns"], 10, "the first window")
        sender = Sender(pair, seconds=90)
        out = state / "persec"
        wait_for(lambda: len(per_window(read_output(out)[0])) >= 3, 60, "three windows")
        before = {f.name: f.read_bytes() for f in read_output(out)[1]}
        server.kill9()
        killed_at = time.time()
        time.sleep(2)
        server.start()
        st = server.client.status()
        assert st["gaps"] and st["gaps"][-1]["reason"] == "server crashed"
        q = server.client.queries()[0]
        gap = q["gaps"][-1]
        restart_first = q["first_window_ns"] // 10**9
        assert restart_first > killed_at
        server.wait_spark()
        wait_for(lambda: len([w for w in per_window(read_output(out)[0])
                              if w >= restart_first]) >= 3, 90, "three windows after the restart")
        _stop_between_bursts(sender)
        last = max(sender.truth)
        wait_for(lambda: last in per_window(read_output(out)[0]), 60, f"window {last}")
    finally:
        if sender is not None and sender.proc.poll() is None:
            sender.proc.kill()
        code = server.stop()
    assert code == 0, server.log()
    table, files = read_output(out)
    got = per_window(table)                        # no window written twice
    assert not list(out.glob(".*.tmp"))
    for name, data in before.items():              # what was written stays as written
        assert (out / name).read_bytes() == data
    truth = sender.truth
    gap_from = gap["from_ns"]
    assert gap_from is not None
    for w, n in truth.items():
        if (w + 1) * 10**9 <= gap_from:            # closed before the crash: not lost
            assert got.get(w) == n, (w, got.get(w), n)
        elif w >= restart_first:                   # after the restart: exact
            assert got.get(w) == n, (w, got.get(w), n)
        else:                                      # in the gap: not written
            assert w not in got, (w, got[w])
    assert any(w >= restart_first for w in got)
