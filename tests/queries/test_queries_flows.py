"""Flow queries: analysis errors, and a crafted scapy trace with known flows and end reasons
(FIN mid-bucket, idle gap, active bucket end, idle at the end, forced end) through the
reference evaluator and the low level."""

from __future__ import annotations

from pathlib import Path

import pytest

from capture.reader import read_all
from common.errors import ConfigError
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.errors import QueryError
from queries.parser import parse
from queries.planner import plan_file, plan_text
from tests.oracles.reference import evaluate_file

NETFLOW = Path(__file__).resolve().parents[2] / "queries" / "library" / "netflow.gsql"
FLOW = ("SELECT tb, srcIP, END_REASON() AS r, count(*) FROM main.IP "
        "GROUP BY time/60 AS tb, srcIP")


@pytest.mark.parametrize("text,message,line,col", [
    (FLOW, "END_REASON() is only for flow queries", 1, 19),
    ("DEFINE { idle_timeout 0s; }\n" + FLOW, "DEFINE idle_timeout: '0s' is not a positive", 1, 23),
    ("DEFINE { idle_timeout 'soon'; }\n" + FLOW, "'soon' is not a duration", 1, 23),
    ("DEFINE { flow_end fin; }\n" + FLOW, "'fin' is not one of fin_rst, none", 1, 19),
    ("DEFINE { idle_timeout 5s; }\nSELECT srcIP FROM main.IP", "makes a flow query", 1, 10),
])
def test_flow_analysis_errors(text, message, line, col):
    with pytest.raises(QueryError) as exc:
        plan_text(text, ["main"])
    assert message in str(exc.value)
    assert f"<query>:{line}:{col}:" in str(exc.value)


def test_bad_idle_timeout_override():
    text = NETFLOW.read_text()
    with pytest.raises(ConfigError, match="--set idle_timeout=15 parsecs"):
        plan_text(text, ["main"], overrides={"idle_timeout": "15 parsecs"})


T0 = 1_700_000_040          # a minute boundary


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    from scapy.all import ICMP, IP, TCP, UDP, Ether, IPv6, wrpcap

    def tcp(t, flags, sport=1000):
        return t, Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=sport, dport=80,
                                                                    flags=flags)

    def udp(t, src, sport):
        return t, Ether() / IP(src=src, dst="10.0.0.9") / UDP(sport=sport, dport=53) / b"q"

    pkts = [tcp(0, "S"), tcp(1, "A"), tcp(2, "PA"), tcp(3, "FA"),     # A: FIN mid-bucket (3)
            tcp(4, "A"),                                               # A': idle (4+15 < 60)
            udp(5, "10.0.0.3", 7), udp(6, "10.0.0.3", 7),              # B: idle gap (1)
            udp(27, "10.0.0.3", 7),                                    # B': idle (27+15 < 60)
            udp(50, "10.0.0.4", 8), udp(55, "10.0.0.4", 8),            # C: active (2)
            udp(62, "10.0.0.5", 9),                                    # D: idle at the end (1)
            (64, Ether() / IP(src="10.0.0.6", dst="10.0.0.7") / ICMP(type=8)),   # E: forced
            (90, Ether() / IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=1, dport=2)),
            (100, Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1001, dport=80,
                                                                      flags="R")),  # RST (3)
            (101, Ether() / IP(src="10.0.0.8", dst="10.0.0.9") / TCP(sport=5, dport=6))]
    frames = []
    for t, p in pkts:
        p.time = T0 + t
        frames.append(p)
    path = tmp_path_factory.mktemp("crafted") / "flows.pcap"
    wrpcap(str(path), frames)
    return read_all(path, link="main")


EXPECTED = {  # (srcIP low 32 bits, srcPort, destPort, first s) -> (packets, end_reason)
    (0x0A000001, 1000, 80, 0): (4, 3), (0x0A000001, 1000, 80, 4): (1, 1),
    (0x0A000003, 7, 53, 5): (2, 1), (0x0A000003, 7, 53, 27): (1, 1),
    (0x0A000004, 8, 53, 50): (2, 2), (0x0A000005, 9, 53, 62): (1, 1),
    (0x0A000006, 0, 8 * 256, 64): (1, 1), (1, 1, 2, 90): (1, 4),
    (0x0A000001, 1001, 80, 100): (1, 3), (0x0A000008, 5, 6, 101): (1, 4),
}


def records(df):
    return {(int(s) & 0xFFFF_FFFF, int(sp), int(dp), (int(f) // 10**9) - T0): (int(n), int(r))
            for s, sp, dp, f, n, r in zip(df["srcIP"], df["srcPort"], df["destPort"],
                                          df["first_ns"], df["packets"], df["end_reason"])}


def test_crafted_trace_reference_and_low_level(crafted):
    text = NETFLOW.read_text()
    fp = plan_file(parse(text), ["main"], source=text)
    ref = evaluate_file(fp, {"main": crafted})["netflow"]
    # ICMP 10.0.0.6 at 64: idle expiry 64 + 15 <= 101 (last capture) < bucket end 120 -> 1
    assert records(ref) == EXPECTED
    qp = fp.queries[0]
    for step in (1, len(crafted)):
        op = LowLevelOperator(qp.low[0])
        out = []
        for a in range(0, len(crafted), step):
            out += op.process(crafted.slice(a, min(len(crafted), a + step)))
            if a + step < len(crafted):
                out += op.punctuate(int(crafted["timestamp"][a + step]))[0]
        out += op.finish()[0]
        got = finalize(qp, combine_partials(out, op.schema))
        assert records(got) == EXPECTED
        assert list(got.columns) == list(ref.columns)
