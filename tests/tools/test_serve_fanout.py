"""`oopscope serve --interface main=IFACE --fanout 2` (issue 23): the appliance captures its
interface with two member agents in one PACKET_FANOUT group, each running the low level of
the submitted queries on its own sub-link, the stages melding them. Live traffic of many UDP
flows on a veth pair in a namespace made here, sent after the query's first window began:
the rows are the packets sent per flow, both members captured a share, `status` shows them,
and a member that dies is reported with its share silent."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from tests.conftest import require_tool
from tests.tools.conftest import veth_pair
from tests.tools.serving import Server, read_output, wait_for
from tests.tools.test_tools_fanout import traffic  # noqa: F401 - the module's pcap fixture

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

FLOWS = """
DEFINE { query_name flows; }
SELECT tb, srcIP, destIP, srcPort, destPort, COUNT(*) AS packets, SUM(len) AS bytes
FROM main.UDP
GROUP BY time AS tb, srcIP, destIP, srcPort, destPort;
"""


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("oopsfan")


def _per_flow(directory) -> Counter:
    table, _ = read_output(directory)
    got = Counter()
    if table is None:
        return got
    for r in table.to_pylist():
        if not str(r["srcIP"]).startswith("198.51."):
            continue
        key = (r["srcIP"], r["destIP"], int(r["srcPort"]), int(r["destPort"]))
        got[key + ("packets",)] += int(r["packets"])
        got[key + ("bytes",)] += int(r["bytes"])
    return got


def _members(server: Server) -> list[dict]:
    return server.client.status()["fanout"].get("main", [])


def test_serve_fanout_two_gives_the_packets_sent(pair, traffic, tmp_path):  # noqa: F811
    require_tool("tcpreplay")
    pcap, expect = traffic
    server = Server(["--interface", f"main={pair.outer}", "--fanout", "2"],
                    tmp_path / "state", tmp_path / "serve.log")
    try:
        server.start()
        # both members capture (their heartbeats), and the server offers link main
        wait_for(lambda: [m["state"] for m in _members(server)] == ["running", "running"], 60,
                 f"two running members:\n{server.log()}")
        server.wait_spark()
        reply = server.client.submit(text=FLOWS, file="flows.gsql")
        assert reply["links"] == ["main"], reply
        assert sorted(reply["agents"]) == ["main#0", "main#1"], reply
        wait_for(lambda: time.time_ns() > reply["first_window_ns"] + 10**8, 15,
                 "the first window")
        # both members took the query: their next heartbeats say so (a loaded machine's
        # heartbeat can be seconds old when the window starts)

        def working() -> bool:
            work = {a["host"]: a["work"] for a in server.client.status()["agents"]}
            return all("flows" in w for w in work.values()) and len(work) == 2

        wait_for(working, 30, "both members working on flows")

        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, "--pps=2000", str(pcap)])
        out = tmp_path / "state" / "flows"
        # generous: under a loaded machine the query's first micro-batches can take a while;
        # the wait ends as soon as the rows are all there
        try:
            wait_for(lambda: _per_flow(out) == expect, 120, "the flows' rows")
        except AssertionError:
            got = _per_flow(out)
            wrong = {k: (got.get(k), v) for k, v in expect.items() if got.get(k) != v}
            raise AssertionError(f"{len(wrong)} of {len(expect)} flow counts differ "
                                 f"(got, sent), e.g. {list(wrong.items())[:3]}; extra "
                                 f"{sorted(set(got) - set(expect))[:3]}:\n"
                                 f"{server.log()}") from None

        # each member had its share, in the status and its heartbeat
        wait_for(lambda: all(m["packets"] > 100 for m in _members(server)), 10,
                 f"both members' shares: {_members(server)}")
        members = _members(server)
        link = next(x for x in server.client.status()["links"] if x["name"] == "main")
        assert link["packets"] == sum(m["packets"] for m in members), (link, members)
        assert "fanout of 2" in link["source"] and link["error"] is None, link
        text = server.cli("status").stdout
        assert "main#0" in text and "main#1" in text and "fanout of 2" in text, text

        # a member that dies: reported, its share silent, the other goes on
        victim = members[1]
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: _members(server)[1]["state"].startswith("exited"), 15,
                 "the dead member in the status")
        link = next(x for x in server.client.status()["links"] if x["name"] == "main")
        assert "main#1 exited" in link["error"], link
        full = server.log_path.read_text()
        assert "fanout member main#1" in full and "is silent" in full, full[-4000:]
        assert _members(server)[0]["state"] == "running"
    finally:
        code = server.stop()
    log = server.log()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert _per_flow(tmp_path / "state" / "flows") == expect
