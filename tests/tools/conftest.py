"""Fixtures of the tools' tests: a veth pair in a namespace for the live tests, a generated
capture, and a real `oopscope serve` that replays it in a loop with a per-second query
running (the live page's test reads it)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from tests.conftest import REPO
from tests.tools.serving import Server, wait_for


def veth_pair(name: str):
    """A module's veth pair (`tools.gen.veth.VethPair`), or the test skipped saying why
    none can be made here; use in a module fixture: `yield from veth_pair("oopxyz")`."""
    from tools.gen.veth import VethPair, can_make_pairs

    why = can_make_pairs()
    if why:
        pytest.skip(f"live capture needs a network namespace and a veth pair: {why}")
    with VethPair(name) as p:
        yield p


PER_SECOND = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time AS tb;
"""


@pytest.fixture(scope="session")
def spark_session():
    """The process-wide Spark session the runs use (`highlevel.session`), started once."""
    from highlevel.session import get_session

    return get_session()


@pytest.fixture(scope="session")
def ten_seconds_pcap(tmp_path_factory):
    """20,000 packets over 10 s of capture time (the generator's manifest beside it)."""
    path = tmp_path_factory.mktemp("serve-pcap") / "ten.pcap"
    subprocess.run([sys.executable, "-m", "tools.cli", "gen", str(path), "-n", "20k",
                    "--duration", "10s", "--groups", "50"], cwd=REPO, check=True,
                   capture_output=True)
    return path


@pytest.fixture(scope="module")
def served_page(ten_seconds_pcap, tmp_path_factory):
    """A server replaying the capture in a loop with query `persec` running; `.url`, `.query`."""
    d = tmp_path_factory.mktemp("served-page")
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop"], d / "state",
                    d / "serve.log").start()
    try:
        server.wait_spark()
        server.client.submit(text=PER_SECOND, file="persec.gsql")
        wait_for(lambda: server.client.queries()[0]["rows_out"] >= 2, 90, "persec's rows")
        yield SimpleNamespace(url=server.client.server, query="persec", server=server)
    finally:
        server.stop()
