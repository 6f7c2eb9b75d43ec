"""Payloads of a live capture (`LiveCapture(payload=True)`): TCP and UDP frames with known
payloads sent from a network namespace over a veth pair; each captured payload equals the one
scapy put in the frame (cut where the snap length cuts the frame), and without payloads asked
for, a batch has none."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from capture.batch import PacketBatch
from capture.live import LiveCapture
from tests.capture.test_capture_live import DST_MAC, SRC_MAC, SRC_MAC_INT, _drain
from tests.capture.test_capture_live import _replay as replay
from tools.gen.veth import VethPair, can_make_pairs

pytestmark = pytest.mark.needs_root



@pytest.fixture(scope="module")
def pair():
    why = can_make_pairs()
    if why:
        pytest.skip(f"live capture tests: {why}")
    with VethPair("ooplp") as p:
        yield p


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A pcap of frames with known transport payloads, and per frame (in sending order) the
    payload a capture must report: TCP/UDP over IPv4 and IPv6, one VLAN-tagged, empty ones,
    and ICMP and ARP (no transport payload: empty)."""
    from scapy.all import ARP, ICMP, IP, TCP, UDP, Dot1Q, Ether, IPv6, Raw, wrpcap

    rng = np.random.default_rng(11)
    eth = Ether(src=SRC_MAC, dst=DST_MAC)
    frames, payloads = [], []
    for i in range(120):
        data = rng.integers(0, 256, int(rng.integers(0, 1400)), dtype=np.uint8).tobytes()
        kind = i % 6
        if kind == 0:
            f = eth / IP(src="10.1.0.1", dst="10.2.0.1") / TCP(sport=40000 + i, dport=80, flags="PA") / Raw(data)
        elif kind == 1:
            f = eth / IP(src="10.1.0.1", dst="10.2.0.1") / UDP(sport=5000, dport=53 + i) / Raw(data)
        elif kind == 2:
            f = eth / IPv6(src="2001:db8::1", dst="2001:db8::2") / UDP(sport=7000, dport=8000) / Raw(data)
        elif kind == 3:
            f = eth / IPv6(src="2001:db8::1", dst="2001:db8::2") / TCP(sport=1234, dport=443, flags="A") / Raw(data)
        elif kind == 4:
            f = eth / Dot1Q(vlan=42) / IP(src="10.6.0.1", dst="10.6.0.2") / UDP(sport=9, dport=9) / Raw(data)
        else:
            f = eth / IP(src="10.1.0.1", dst="10.2.0.1") / TCP(sport=40000, dport=80, flags="S")
            data = b""
        frames.append(f)
        payloads.append(data)
    frames += [eth / IP(src="10.5.0.1", dst="10.5.0.2") / ICMP() / Raw(b"ping" * 10),
               eth / ARP(psrc="10.7.0.1", pdst="10.7.0.2")]
    payloads += [b"", b""]
    for f, p in zip(frames, payloads):          # the oracle: scapy's own transport payload
        l4 = f[TCP] if TCP in f else f[UDP] if UDP in f else None
        assert (bytes(l4.payload) if l4 is not None else b"") == p
    path = tmp_path_factory.mktemp("live-payload") / "sent.pcap"
    wrpcap(str(path), frames)
    return path, payloads, [len(bytes(f)) for f in frames]


def _replay(pair: VethPair, pcap, pps: int = 2000) -> None:
    replay(pair, pcap, pps)


def _mine(batches: list[PacketBatch]) -> PacketBatch:
    allb = PacketBatch.concat(batches)
    return allb.take(allb["srcMAC"] == SRC_MAC_INT)


@pytest.mark.slow
def test_payloads_equal_the_sent_ones(pair, traffic):
    """Small blocks and batches of 7 rows: a poll gathers payloads over several walks of the
    ring, which wraps, and over a VLAN tag put back into the frame."""
    pcap, payloads, _ = traffic
    with LiveCapture(pair.outer, block_size=1 << 14, block_count=8, frame_timeout_ms=10,
                     batch_size=7, payload=True) as cap:
        got: list[PacketBatch] = []
        stop = threading.Event()

        def consume():                 # read while the frames arrive: the ring is small
            while not stop.is_set():
                b = cap.poll(0.05)
                if b is not None:
                    got.append(b.copy())

        reader = threading.Thread(target=consume)
        reader.start()
        try:
            _replay(pair, pcap, pps=1000)
            time.sleep(0.1)            # > the frame timeout: the last block is handed over
        finally:
            stop.set()
            reader.join()
        got += _drain(cap, 0.3)
        assert cap.stats.kernel_drops == 0 and cap.stats.blocks > 8
    assert all(b.payload is not None and len(b.payload) == b.n for b in got)
    mine = _mine(got)
    assert mine.payload.to_pylist() == payloads
    assert np.array_equal(mine["vlan"][4::6][:20], np.full(20, 42))


def test_snap_length_cuts_the_payloads(pair, traffic):
    pcap, payloads, lengths = traffic
    with LiveCapture(pair.outer, block_size=1 << 16, block_count=8, frame_timeout_ms=10,
                     snaplen=96, payload=True) as cap:
        _replay(pair, pcap)
        mine = _mine(_drain(cap, 0.3))
    caplen, wire = mine["caplen"].tolist(), mine["len"].tolist()
    assert wire == lengths                                           # every frame, in order
    want = [p[:max(0, c - (w - len(p)))] for p, c, w in zip(payloads, caplen, wire)]
    assert mine.payload.to_pylist() == want
    assert any(len(w) < len(p) for w, p in zip(want, payloads))     # some were cut
    assert max(caplen) <= 96 + 4                                     # + a VLAN tag put back


def test_no_payloads_unless_asked_and_switching_on_at_run_time(pair, traffic):
    pcap, payloads, _ = traffic
    with LiveCapture(pair.outer, block_size=1 << 16, block_count=8, frame_timeout_ms=10) as cap:
        assert cap.payload is False
        _replay(pair, pcap)
        off = _drain(cap, 0.3)
        assert off and all(b.payload is None for b in off)
        assert _mine(off).n == len(payloads)
        cap.payload = True                # as the appliance does when a payload query arrives
        _replay(pair, pcap)
        on = _drain(cap, 0.3)
    assert on and all(b.payload is not None for b in on)
    assert _mine(on).payload.to_pylist() == payloads


def test_the_snap_length_changes_at_run_time(pair, traffic):
    """`set_snaplen`: the appliance keeps the headers until a query reads payloads, then whole
    frames, then the headers again; the frames captured meanwhile follow each value."""
    from common.errors import ConfigError

    pcap, payloads, lengths = traffic
    with LiveCapture(pair.outer, block_size=1 << 16, block_count=8, frame_timeout_ms=10,
                     payload=True) as cap:
        cap.set_snaplen(96)
        _replay(pair, pcap)
        short = _mine(_drain(cap, 0.3))
        cap.set_snaplen(cap._ring_snaplen)
        _replay(pair, pcap)
        whole = _mine(_drain(cap, 0.3))
        with pytest.raises(ConfigError, match="the 262144 bytes the capture was opened with"):
            cap.set_snaplen(cap._ring_snaplen + 1)
    assert short["len"].tolist() == whole["len"].tolist() == lengths
    assert max(short["caplen"].tolist()) <= 96 + 4                  # + a VLAN tag put back
    assert whole["caplen"].tolist() == lengths
    assert whole.payload.to_pylist() == payloads
