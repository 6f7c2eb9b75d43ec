"""A NETFLOW collector link of `oopscope run` (`--netflow-in NAME=HOST:PORT`) over time: its
windows close while the exporters are silent (the link's punctuation goes on by the wall
clock), and a resumable run killed with SIGKILL mid-stream restarts knowing the templates,
writing no window twice and counting no record twice."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from capture.flowdecode import FlowDecoder
from capture.flowsource import read_datagrams
from tests.capture.test_capture_flowdecode import _flow_table, _skype_flows, decoded
from tests.conftest import free_udp_port, java_children, niceness, udp_port_bound

REPO = Path(__file__).resolve().parents[2]
#: windows of 10 s on flow end; the exporter's datagrams come in order of flow end, their
#: export time the latest end rounded up to the second: a 2 s idle lag covers them
QUERY = ("SELECT tb, srcIP, sum(bytes) AS b, sum(packets) AS p FROM r1.NETFLOW "
         "GROUP BY last/10000000000 AS tb, srcIP\n")
#: a guard against a run that never gets there (a failure, not a timing)
DEADLINE = 300


@pytest.fixture(scope="module")
def datagrams(pcaps_dir, tmp_path_factory) -> list[bytes]:
    """Our exporter's v9 datagrams of skype.pcap's IPv4 flows in order of flow end, small (a
    few records each), templates in the first datagram only. (The exporter puts a batch's
    IPv6 records after its IPv4 ones: in order of flow end per family only.)"""
    from tools.netflow.exporter import Exporter

    pcap = tmp_path_factory.mktemp("dg") / "dg.pcap"
    flows = _skype_flows(pcaps_dir)
    flows = flows[flows.ipversion == 4].sort_values("last_ns", kind="stable")
    ex = Exporter(None, 9, pcap=str(pcap), mtu=400, template_every_messages=1 << 30,
                  template_every_s=1e9)
    ex.export(_flow_table(flows))
    ex.close()
    return read_datagrams(pcap).payloads


def expected(datagrams: list[bytes]) -> pd.DataFrame:
    """Per (10 s bin of flow end, source): bytes and packets of the datagrams' records."""
    dec = FlowDecoder()
    cols = dec.decode(datagrams, ["127.0.0.1"] * len(datagrams), [0] * len(datagrams))
    df = decoded(cols).assign(tb=cols["last"] // 10**10)
    out = df.groupby(["tb", "src"]).agg(b=("bytes", "sum"), p=("packets", "sum"))
    out.index.names = ["tb", "srcIP"]
    return out.sort_index()


def written(path: Path) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=["tb", "srcIP", "b", "p"]).set_index(["tb", "srcIP"])
    df = pd.read_csv(path).astype({"tb": int, "b": int, "p": int})
    return df.set_index(["tb", "srcIP"]).sort_index()


def start(tmp_path: Path, port: int, *extra: str, log: str = "err") -> subprocess.Popen:
    (tmp_path / "q.gsql").write_text(QUERY)
    err = open(tmp_path / log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "run", str(tmp_path / "q.gsql"),
                             "--netflow-in", f"r1=127.0.0.1:{port}",
                             "--netflow-in-idle-timeout", "2s", *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)
    err.close()
    deadline = time.monotonic() + DEADLINE
    while not udp_port_bound(port):
        assert proc.poll() is None, (tmp_path / log).read_text()
        assert time.monotonic() < deadline, "the collector did not bind its port"
        time.sleep(0.05)
    return proc


def send(port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))
            time.sleep(0.001)               # the collector's socket, not the test, is sized


def wait_for(cond, proc: subprocess.Popen, log: Path) -> None:
    """Wait until `cond()` holds while `proc` still runs."""
    deadline = time.monotonic() + DEADLINE
    while not cond():
        assert proc.poll() is None, log.read_text()[-4000:]
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.1)


def stop(proc: subprocess.Popen, log: Path) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=DEADLINE)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    return text


def test_windows_close_while_the_exporter_is_silent(datagrams, tmp_path):
    """Every datagram sent, then silence: every window is written while the run still runs,
    the last one included (its end lies past the last export time minus the idle lag: only
    the punctuation going on by the wall clock closes it), and equal to the records' sums.
    The socket is a live link: the driver JVM runs at the live niceness, below the low
    level's."""
    want = expected(datagrams)
    out = tmp_path / "q.csv"
    port = free_udp_port()
    proc = start(tmp_path, port, "--output", f"q={out}")
    try:
        sent = time.time()
        send(port, datagrams)
        wait_for(lambda: len(written(out)) >= len(want), proc, tmp_path / "err")
        written_by = time.time()
        assert proc.poll() is None
        jvms = java_children(proc.pid)
        assert len(jvms) == 1 and niceness(jvms[0]) == 5 and niceness(proc.pid) == 0
        err = stop(proc, tmp_path / "err")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"{len(datagrams)} datagrams (v9: {len(datagrams)}), 0 sequence gaps, 0 late " \
        "records" in err, err
    # when the low level was done with the last record (bench.netflow_in times runs by it):
    # after the first datagram went out, before the last window was written
    done = re.search(r"link r1: the low level was done with the last record at ([\d.]+) "
                     r"\(epoch s\)", err)
    assert done and sent < float(done.group(1)) < written_by, err
    pd.testing.assert_frame_equal(written(out), want, check_dtype=False)


def test_kill_restart_mid_stream(datagrams, tmp_path):
    """A resumable collector run is killed (SIGKILL) while datagrams stream in, after it wrote
    some windows; restarted, it decodes the data sets that follow at once (the template came
    only before the kill), writes no window twice and counts no record twice. What the
    killed run held in windows not yet closed is lost with it (UDP: what the exporter sent
    is gone); the windows holding only later records are exact.

    The test's exporter replays history: its clock stands still while the test waits for the
    first windows, while the link's punctuation goes on by the wall clock (as a live
    router's would have): so the killed run takes the datagrams it receives after the wait
    as late, and a window may then be short of them. What holds whatever the timing: every
    window written before the kill is written once and holds exactly the records received
    before it; no window holds more than its records; the last windows are exact."""
    want = expected(datagrams)
    out = tmp_path / "q.csv"
    state = ("--spool", str(tmp_path / "spool"), "--checkpoint", str(tmp_path / "ck"),
             "--output", f"q={out}")
    half = len(datagrams) // 2
    port = free_udp_port()
    proc = start(tmp_path, port, *state)
    try:
        send(port, datagrams[:half])
        wait_for(lambda: len(written(out)) > 0, proc, tmp_path / "err")
        send(port, datagrams[half:half + 2])      # mid-stream: received, then killed
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    before = written(out)
    assert len(before) > 0
    # the windows written hold the records of the first half (the exporter's clock stood
    # still while the test waited; the link's went on by the wall clock, so some records
    # of the two datagrams after came late, which the killed run counted)
    pd.testing.assert_frame_equal(before, expected(datagrams[:half]).loc[before.index],
                                  check_dtype=False)
    rest = datagrams[half + 2:]
    proc = start(tmp_path, port, *state, log="err2")
    try:
        send(port, rest)
        last_window = int(want.index.get_level_values("tb").max())
        wait_for(lambda: last_window in set(written(out).index.get_level_values("tb")),
                 proc, tmp_path / "err2")
        err = stop(proc, tmp_path / "err2")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # every record after the restart decoded at once (no data set waits for a template
    # the killed run received), and none late
    assert "malformed" not in err and "no_template" not in err, err
    assert " 0 late records" in err, err
    n_rest = len(FlowDecoder().decode(datagrams, ["x"] * len(datagrams),
                                      [0] * len(datagrams))["first"]) - \
        len(FlowDecoder().decode(datagrams[:half + 2], ["x"] * (half + 2),
                                 [0] * (half + 2))["first"])
    assert f"link r1: {n_rest} records" in err, err
    after = pd.read_csv(out).astype({"tb": int, "b": int, "p": int})
    # no window written twice: the windows of the killed run are not written again
    assert not after.duplicated(["tb", "srcIP"]).any(), after[after.duplicated(
        ["tb", "srcIP"], keep=False)]
    after = after.set_index(["tb", "srcIP"]).sort_index()
    pd.testing.assert_frame_equal(after.loc[before.index], before, check_dtype=False)
    # nothing counted twice: no window above the records' sums
    both = after.join(want, rsuffix="_want", how="left")
    assert (both.b <= both.b_want).all() and (both.p <= both.p_want).all()
    # the windows of records sent after the restart only are exact
    late_tb = int(pd.Series(want.index.get_level_values("tb")).max())
    pd.testing.assert_frame_equal(after.xs(late_tb, level="tb", drop_level=False),
                                  want.xs(late_tb, level="tb", drop_level=False),
                                  check_dtype=False)


def _receive_queue(port: int) -> int | None:
    """Bytes waiting in the receive buffer of the socket bound to UDP `port` (None: none)."""
    with open("/proc/net/udp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port:
                return int(cols[4].split(":")[1], 16)
    return None


def test_socket_drops_of_a_paused_run_in_its_summary(datagrams, tmp_path, monkeypatch):
    """The run is stopped (SIGSTOP) while 20000 datagrams flood its collector: the kernel
    drops what its socket's buffer cannot hold. Continued and stopped, the run's summary
    says how many the socket dropped (read from /proc/net/udp), and with the datagrams it
    decoded that is every one sent."""
    # a small socket buffer, as the test's flood means to overflow it (the default holds it)
    monkeypatch.setenv("OOPSCOPE_NETFLOW_RCVBUF", str(1 << 21))

    port = free_udp_port()
    proc = start(tmp_path, port)
    sent = 20000
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(sent):
                    s.sendto(datagrams[i % len(datagrams)], ("127.0.0.1", port))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        # the collector's thread empties the socket's buffer
        wait_for(lambda: _receive_queue(port) == 0, proc, tmp_path / "err")
        err = stop(proc, tmp_path / "err")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    m = re.search(r"link r1: (\d+) datagrams .*, (\d+) datagrams dropped at the socket \(its "
                  r"buffer full\), (\d+) by the collector's queue", err)
    assert m, err
    decoded, dropped, queue = (int(x) for x in m.groups())
    assert dropped > 1000 and decoded > 1000 and queue == 0, err
    assert decoded + dropped == sent, err
