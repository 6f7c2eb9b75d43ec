"""`oopscope run --interface` with queries that read payloads (`UDP_data`, `TCP_data`): frames
with known payloads sent over a veth pair from a namespace while the run captures the outer
end; a selection of UDP payloads and a regular-expression count over TCP payloads, compared
with what the test sent."""

from __future__ import annotations

import csv
import re
import time
from collections import Counter

import pytest

from tests.conftest import require_tool
from tests.tools.conftest import veth_pair
from tests.tools.test_tools_run_live import run_while_sending

pytestmark = pytest.mark.needs_root

QUERY = """
DEFINE { query_name hellos; }
SELECT time, srcPort, destPort, UDP_data
FROM main.UDP
WHERE str_match_start(UDP_data, 'hello') = 1;

DEFINE { query_name gets; }
SELECT tb, destPort, COUNT(*) AS n, SUM(data_length) AS bytes
FROM main.TCP
WHERE str_regex_match(TCP_data, '^(GET|POST) /[a-z0-9]+ HTTP/1\\.1')
GROUP BY time/60 AS tb, destPort;
"""
REQUEST = re.compile(rb"^(GET|POST) /[a-z0-9]+ HTTP/1\.1", re.MULTILINE)


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("ooprp")


ETH = {"src": "02:00:5e:00:53:01", "dst": "02:00:5e:00:53:02"}


def payload_traffic(path) -> tuple[Counter, Counter, Counter, int]:
    """A pcap of UDP and TCP frames with known payloads; returns the `hellos` rows expected
    ((srcPort, destPort, text) counted), the `gets` packets and payload bytes per destPort,
    and the number of frames."""
    from scapy.all import IP, TCP, UDP, Ether, Raw, wrpcap

    eth = Ether(**ETH)
    frames, hellos, gets, get_bytes = [], Counter(), Counter(), Counter()
    for i in range(300):
        if i % 2:
            text = (f"hello {i} " + "x" * (i % 37)) if i % 3 else f"bye {i}, hello"
            sport, dport = 40000 + i % 5, 5000 + i % 3
            frames.append(eth / IP(src="198.51.100.1", dst="203.0.113.9") /
                          UDP(sport=sport, dport=dport) / Raw(text.encode()))
            if text.encode().startswith(b"hello"):
                hellos[(sport, dport, text)] += 1
        else:
            body = [b"GET /index%d HTTP/1.1\r\nHost: x\r\n\r\n" % i,
                    b"POST /form HTTP/1.1\r\n\r\n" + b"k=v&" * (i % 50),
                    b"HTTP/1.1 200 OK\r\n\r\nGET /nope HTTP/1.0",
                    b"\x00\x01 GET /x HTTP/1.1", b""][i // 2 % 5]
            dport = (80, 8080, 443)[i % 3]
            frames.append(eth / IP(src="198.51.100.2", dst="203.0.113.9") /
                          TCP(sport=41000, dport=dport, flags="PA") / Raw(body))
            if REQUEST.search(body):
                gets[dport] += 1
                get_bytes[dport] += len(body)
    wrpcap(str(path), frames)
    return hellos, gets, get_bytes, len(frames)


@pytest.mark.slow
def test_live_run_reads_payloads(pair, tmp_path):
    require_tool("tcpreplay")
    pcap = tmp_path / "sent.pcap"
    hellos, gets, get_bytes, n_frames = payload_traffic(pcap)
    assert hellos and gets and len(gets) == 3
    query = tmp_path / "payloads.gsql"
    query.write_text(QUERY)
    out_h, out_g = tmp_path / "hellos.csv", tmp_path / "gets.csv"
    t0 = time.time()
    head, err = run_while_sending(pair, pcap, 500, ["-v", "run", str(query), "--interface",
                                                    f"main={pair.outer}", "--output",
                                                    f"hellos={out_h}", "--output",
                                                    f"gets={out_g}"])
    # its queries read payloads: whole frames are kept (the headers only, otherwise)
    assert re.search(r"capturing on \S+ \(link main\): .*snaplen 262144", head), head
    link = next(line for line in err.splitlines() if line.startswith("link main:"))
    assert f"{n_frames} packets" in link and " 0 ring drops" in link and " 0 kernel drops" in link
    with open(out_h, newline="") as f:
        rows = list(csv.DictReader(f))
    got_h = Counter((int(r["srcPort"]), int(r["destPort"]), r["UDP_data"]) for r in rows)
    assert got_h == hellos
    assert all(t0 - 1 <= int(r["time"]) <= time.time() for r in rows)
    with open(out_g, newline="") as f:
        got_g: Counter = Counter()
        got_bytes: Counter = Counter()
        for r in csv.DictReader(f):
            got_g[int(r["destPort"])] += int(r["n"])
            got_bytes[int(r["destPort"])] += int(r["bytes"])
    assert got_g == gets and got_bytes == get_bytes


def test_a_live_link_drops_what_its_payload_area_cannot_hold(pair, tmp_path):
    """A LiveLink whose ring has a small payload area and nobody taking from it: the packets
    whose payloads find no room are ring drops (offered = processed + dropped, every captured
    packet offered), and the payloads that got through are the ones sent."""
    require_tool("tcpreplay")
    from scapy.all import IP, UDP, Ether, Raw, wrpcap

    from capture.punctuation import LinkTimer
    from tools.pipeline.livelinks import LiveLink

    sent = {10000 + i: bytes([i % 256]) * (200 + 13 * i % 800) for i in range(400)}
    pcap = tmp_path / "udp.pcap"
    wrpcap(str(pcap), [Ether(**ETH) / IP(src="198.51.100.3", dst="203.0.113.9") /
                       UDP(sport=port, dport=9) / Raw(body) for port, body in sent.items()])
    holder = type("Feeds", (), {"timer": LinkTimer(0, 10**9)})
    live = LiveLink("main", pair.outer, holder, period_ns=10**8, ring_rows=4096, payload=True,
                    payload_bytes=1 << 16, options={"block_size": 1 << 16, "block_count": 64,
                                                    "frame_timeout_ms": 10})
    try:
        assert live.capture.payload and live.ring.payload_bytes == 1 << 16
        live.start()
        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, "--pps=2000", str(pcap)])
        time.sleep(0.3)                       # > the frame timeout: the last block retires
        live.stop()
        live.join(timeout=10)
        assert live.error is None
        got = {}
        while True:
            batch, _ = live.ring.take(1000)
            if batch is None:
                break
            got.update(zip(batch["srcPort"].tolist(), batch.payload.to_pylist()))
        live.ring.release()
        st = live.ring.stats()
        assert st.offered == live.capture.stats.packets == len(sent)
        assert st.offered == st.processed + st.dropped and st.processed == len(got)
        assert st.dropped > 0 and st.high_water < 4096      # the bytes ran out, not the rows
        assert got and all(sent[port] == body for port, body in got.items())
    finally:
        live.stop()
        if live.is_alive():
            live.join(timeout=10)
        live.close()
