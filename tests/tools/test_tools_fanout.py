"""`--fanout N` (issue 23): an interface captured by N processes in one PACKET_FANOUT group,
each with its own low level, their partial rows melded as sub-links. Live traffic of many
flows on a veth pair in a namespace made here: `run --fanout 2` writes the rows of
`--fanout 1`, which are the packets sent; both members captured a share."""

from __future__ import annotations

import os
import re
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
from tests.tools.test_tools_run_live import QUERY, udp_flows

pytestmark = pytest.mark.needs_root


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("oopfan")


@pytest.fixture(scope="module")
def traffic(tmp_path_factory) -> tuple[Path, Counter]:
    """A pcap of UDP frames on 240 flows; packets and bytes per flow."""
    path = tmp_path_factory.mktemp("fanout") / "sent.pcap"
    return path, udp_flows(path, packets=1440, flows=240)


def _run(pair, pcap: Path, tmp_path: Path, fanout: int) -> tuple[Counter, str]:
    require_tool("tcpreplay")
    query = tmp_path / "flows.gsql"
    query.write_text(QUERY)
    out, spool = tmp_path / f"flows-{fanout}.csv", tmp_path / f"spool-{fanout}"
    log = tmp_path / f"run-{fanout}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "run", str(query),
                                 "--interface", f"main={pair.outer}", "--fanout", str(fanout),
                                 "--spool", str(spool), "--output", f"flows={out}",
                                 "--progress"],
                                stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                start_new_session=True)
    try:
        _wait_until_capturing(proc, spool, fanout, log)
        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, "--pps=2000", str(pcap)])
        time.sleep(1.0)                       # a frame timeout or two: the last block retires
        proc.send_signal(signal.SIGTERM)    # the run only: it stops its members and Spark
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text and "run ended: stopped" in text, text[-3000:]
    got = Counter()
    rows = pd.read_csv(out)
    for r in rows[rows["srcIP"].str.startswith("198.51.")].itertuples(index=False):
        key = (r.srcIP, r.destIP, int(r.srcPort), int(r.destPort))
        got[key + ("packets",)] += int(r.packets)
        got[key + ("bytes",)] += int(r.bytes)
    return got, text


def _wait_until_capturing(proc, spool: Path, fanout: int, log: Path) -> None:
    """One process: its progress line (shown once the socket is open); N members: each
    member's heartbeat (written once its socket is open)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if fanout > 1:
            if len(list(spool.glob("agents/*.json"))) == fanout:
                return
        elif " packets (" in log.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"never started capturing: {log.read_text()[-3000:]}")


@pytest.mark.slow
def test_fanout_two_gives_the_rows_of_one(pair, traffic, tmp_path):
    pcap, expect = traffic
    one, _ = _run(pair, pcap, tmp_path, 1)
    two, text = _run(pair, pcap, tmp_path, 2)
    assert one == expect
    assert two == expect
    # each member had its share (its summary on the run's stderr)
    shares = {m.group(1): int(m.group(2))
              for m in re.finditer(r"link main#(\d): (\d+) packets", text)}
    assert set(shares) == {"0", "1"}, text[-3000:]
    assert all(n > 100 for n in shares.values()), shares
    assert "link main: " in text and "fanout of 2" in text
