"""A capture file replayed as a link of the appliance carries the packets' payloads (a query
submitted later may read `TCP_data` / `UDP_data`): the payloads taken from its packet ring
equal dpkt's of the same file."""

from __future__ import annotations

import time

import dpkt

from capture.punctuation import LinkTimer
from tests.tools.test_tools_run_live_payload import payload_traffic
from tools.pipeline.links import ReplayLink


def dpkt_payloads(path) -> list[bytes]:
    out = []
    with open(path, "rb") as f:
        for _, frame in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(frame).data
            out.append(bytes(ip.data.data))
    return out


def test_replayed_link_carries_payloads(tmp_path):
    pcap = tmp_path / "sent.pcap"
    payload_traffic(pcap)
    replay = ReplayLink("main", str(pcap), LinkTimer(0, 10**9), period_ns=10**8, speed=100.0)
    replay.start()
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(got) < 300 and time.monotonic() < deadline:
        batch, _ = replay.ring.take(64)
        if batch is None:
            time.sleep(0.01)
            continue
        assert batch.payload is not None and len(batch.payload) == len(batch)
        got += batch.payload.to_pylist()
    replay.ring.release()
    replay.stop()
    replay.join(timeout=10)
    assert replay.error is None
    assert got == dpkt_payloads(pcap)
