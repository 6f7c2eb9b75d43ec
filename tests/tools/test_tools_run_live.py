"""`oopscope run --interface`: live capture on a veth pair in a namespace made here, stopped by SIGTERM."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, require_tool
from tests.tools.conftest import veth_pair

pytestmark = pytest.mark.needs_root

QUERY = """
DEFINE { query_name flows; }
SELECT tb, srcIP, destIP, srcPort, destPort, COUNT(*) AS packets, SUM(len) AS bytes
FROM main.UDP
GROUP BY time/60 AS tb, srcIP, destIP, srcPort, destPort;
"""


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("ooprun")


def udp_flows(path: Path, packets: int = 240, flows: int = 4) -> Counter:
    """A pcap of UDP frames on `flows` known flows (198.51.100.1 .. onwards, a port each);
    returns packets and bytes per flow."""
    from scapy.all import IP, UDP, Ether, Raw, wrpcap

    frames, expect = [], Counter()
    for i in range(packets):
        flow = i % flows
        src, dst = f"198.51.{100 + flow // 120}.{1 + flow % 120}", "203.0.113.9"
        sport, dport = 40000 + flow, 5000 + flow % 2
        f = (Ether(src="02:00:5e:00:53:01", dst="02:00:5e:00:53:02") /
             IP(src=src, dst=dst) / UDP(sport=sport, dport=dport) / Raw(b"x" * (10 + i % 50)))
        frames.append(f)
        key = (src, dst, sport, dport)
        expect[key + ("packets",)] += 1
        expect[key + ("bytes",)] += len(f)
    wrpcap(str(path), frames)
    return expect


def _wait_for_progress(proc, timeout: float = 60.0) -> str:
    """The progress line appears once the capture sockets are open; the log lines before
    it."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line.decode(errors="replace"))
        if line.startswith(b"oopscope: ") and b" packets (" in line:
            return "".join(lines)
    raise AssertionError("oopscope run never started capturing:\n" + "".join(lines))


def run_while_sending(pair, pcap, pps: int, args: list[str]) -> tuple[str, str]:
    """`oopscope run ARGS --progress` while the frames of `pcap` are sent into the pair at
    `pps`, stopped by SIGTERM a second later: (the log before capture began, the rest of
    stderr); asserts a clean stop."""
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", *args, "--progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        head = _wait_for_progress(proc)
        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, f"--pps={pps}", str(pcap)])
        time.sleep(1.0)                       # a frame timeout or two: the last block retires
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = err.decode()
    assert proc.returncode == 0, text
    assert "run ended: stopped" in text
    return head, text


@pytest.mark.slow
def test_run_on_an_interface_counts_exactly_the_sent_packets(pair, tmp_path):
    require_tool("tcpreplay")
    pcap = tmp_path / "sent.pcap"
    expect = udp_flows(pcap)
    query = tmp_path / "flows.gsql"
    query.write_text(QUERY)
    out = tmp_path / "flows.csv"
    _, err = run_while_sending(pair, pcap, 400, ["run", str(query), "--interface",
                                                 f"main={pair.outer}", "--output",
                                                 f"flows={out}"])
    assert f"[interface {pair.outer}]" in err and " 0 kernel drops" in err
    rows = pd.read_csv(out)
    mine = rows[rows["srcIP"].str.startswith("198.51.100.")]
    got = Counter()
    for r in mine.itertuples(index=False):
        key = (r.srcIP, r.destIP, int(r.srcPort), int(r.destPort))
        got[key + ("packets",)] += int(r.packets)
        got[key + ("bytes",)] += int(r.bytes)
    assert got == expect
    assert all(ipaddress.ip_address(a) for a in rows["destIP"])


def test_unknown_interface_is_one_clear_line(tmp_path):
    query = tmp_path / "flows.gsql"
    query.write_text(QUERY)
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "run", str(query),
                           "--interface", "main=nosuch0"], capture_output=True, cwd=REPO,
                          timeout=120)
    err = proc.stderr.decode().strip().splitlines()
    assert proc.returncode == 1
    assert err[-1].startswith("oopscope: error:") and "nosuch0" in err[-1]
    assert "Traceback" not in proc.stderr.decode()
