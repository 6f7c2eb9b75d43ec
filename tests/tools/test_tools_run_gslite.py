"""GS-lite constructs end to end (`tools.pipeline.runner.run` over a generated capture) against the reference."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows

NS = 1_000_000_000
MANUAL = Path(__file__).resolve().parents[1] / "queries" / "fixtures" / "manual"

CUBE = """
DEFINE { query_name cube; aggregate_slots 64; }
SELECT tb, srcIP, destPort, protocol, count(*) AS n, SUM(ip_len) AS bytes
FROM main.IPV4
GROUP BY time/60 AS tb, CUBE(srcIP, destPort), protocol
"""

FILTER_JOIN = """
DEFINE { query_name fj; algorithm hash; }
SELECT R.time, R.srcIP, R.destIP, R.srcPort, R.destPort, R.ip_len
FILTER_JOIN(time, 15) FROM main.TCP R, main.TCP S
WHERE R.srcIP = S.srcIP AND R.destIP = S.destIP AND R.srcPort = S.srcPort
  AND R.destPort = S.destPort AND S.flags & 2 = 2 AND R.payload_len <> 0
"""

# manual example 23's inputs (the manual does not show them): two streams with a temporal tb
PACKET_SUMS = """
DEFINE { query_name PacketSum1; }
SELECT tb, srcIP, count(*) AS n FROM main.TCP GROUP BY time/10 AS tb, srcIP;
DEFINE { query_name PacketSum2; }
SELECT tb, srcIP, count(*) AS n FROM main.UDP GROUP BY time/10 AS tb, srcIP;
"""


@pytest.fixture(scope="module")
def pcap(tmp_path_factory) -> Path:
    from tools.gen.traffic import TrafficConfig, generate

    cfg = TrafficConfig(packets=20_000, duration_ns=150 * NS, groups=200, tcp=0.7, udp=0.3,
                        icmp=0.0, seed=5)
    return generate(cfg.validate(), tmp_path_factory.mktemp("gslite") / "g.pcap")["l0"]


@pytest.fixture(scope="module")
def short_pcap(tmp_path_factory) -> Path:
    """45 s of capture time: three FILTER_JOIN(time, 15) windows. The band join it runs as
    costs per second of capture (its panes are 1 tick): 150 s cost twice the CPU for the
    same comparison."""
    from tools.gen.traffic import TrafficConfig, generate

    cfg = TrafficConfig(packets=6_000, duration_ns=45 * NS, groups=200, tcp=0.7, udp=0.3,
                        icmp=0.0, seed=5)
    return generate(cfg.validate(), tmp_path_factory.mktemp("gslite") / "s.pcap")["l0"]


def _run_and_compare(text: str, name: str, pcap: Path, tmp_path: Path):
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    path = tmp_path / "q.gsql"
    path.write_text(text)
    out = tmp_path / f"{name}.csv"
    run(RunConfig(str(path), (("main", str(pcap)),), outputs=((name, str(out)),)))
    plan = plan_text(text, ["main"], path=str(path))
    want = evaluate_file(plan, {"main": read_all(pcap, "main")})[name]
    assert len(want) > 0
    assert_same_rows(out, want, plan.query(name))


@pytest.mark.slow
def test_cube_runs_as_the_reference(pcap, tmp_path):
    _run_and_compare(CUBE, "cube", pcap, tmp_path)


@pytest.mark.slow
def test_filter_join_runs_as_the_reference(short_pcap, tmp_path):
    _run_and_compare(FILTER_JOIN, "fj", short_pcap, tmp_path)


@pytest.mark.slow
def test_manual_cube_example_runs(pcap, tmp_path):
    text = (MANUAL / "20_groupby_cube.gsql").read_text().replace("eth0.", "main.")
    _run_and_compare(text, "q", pcap, tmp_path)


@pytest.mark.slow
def test_manual_merge_example_runs(pcap, tmp_path):
    """Example 23 unchanged, after two queries standing for its PacketSum1/2 streams."""
    text = PACKET_SUMS + (MANUAL / "23_merge_packetsum.gsql").read_text()
    _run_and_compare(text, "q", pcap, tmp_path)
