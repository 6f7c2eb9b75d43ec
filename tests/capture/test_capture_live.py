"""Live capture on a TPACKET_V3 ring: known traffic sent from a network namespace over a veth pair, checked against scapy."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from capture.batch import PacketBatch
from capture.errors import CaptureError, InterfaceError
from capture.live import LiveCapture, open_interface
from common.errors import ConfigError, LinkError
from tests.conftest import REPO, require_tool
from tools.gen.veth import VethPair, can_make_pairs

pytestmark = pytest.mark.needs_root

SRC_MAC = "02:00:5e:00:53:01"
DST_MAC = "02:00:5e:00:53:02"   # not the outer end's address: the host stack ignores these frames
SRC_MAC_INT = 0x02005E005301


@pytest.fixture(scope="module")
def pair():
    why = can_make_pairs()
    if why:
        pytest.skip(f"live capture tests: {why}")
    p = VethPair("oopt")
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def traffic(tmp_path_factory):
    """A pcap of known frames (IPv4/IPv6 TCP, UDP, ICMP, a VLAN tag, ARP) and its scapy oracle."""
    from scapy.all import ARP, ICMP, IP, TCP, UDP, Dot1Q, Ether, IPv6, Raw, wrpcap

    eth = Ether(src=SRC_MAC, dst=DST_MAC)
    frames = []
    rng = np.random.default_rng(7)
    for i in range(12):  # flows with different counts and sizes
        for k in range(3 + i * 4):
            size = int(rng.integers(0, 400))
            frames.append(eth / IP(src=f"10.1.0.{i + 1}", dst="10.2.0.1") /
                          TCP(sport=40000 + i, dport=443, flags="A", seq=k) / Raw(b"\0" * size))
    for i in range(6):
        for k in range(5 + i):
            frames.append(eth / IP(src="10.3.0.1", dst=f"10.4.0.{i + 1}") / UDP(sport=5000, dport=53 + i) /
                          Raw(b"\1" * (20 * k)))
    frames += [eth / IP(src="10.5.0.1", dst="10.5.0.2") / ICMP(type=8, id=1, seq=k) for k in range(7)]
    frames += [eth / IPv6(src="2001:db8::1", dst=f"2001:db8::{i + 2:x}") / UDP(sport=7000, dport=8000 + i) /
               Raw(b"\2" * 100) for i in range(9)]
    frames += [eth / IPv6(src="2001:db8::a", dst="2001:db8::b") / TCP(sport=1234, dport=80, flags="S")
               for _ in range(4)]
    frames += [eth / Dot1Q(vlan=42) / IP(src="10.6.0.1", dst="10.6.0.2") / UDP(sport=9, dport=9) / Raw(b"v" * 30)
               for _ in range(6)]
    frames += [eth / ARP(psrc="10.7.0.1", pdst="10.7.0.2") for _ in range(3)]
    order = rng.permutation(len(frames))
    frames = [frames[i] for i in order]
    path = tmp_path_factory.mktemp("live") / "sent.pcap"
    wrpcap(str(path), frames)

    expect: dict[tuple, list[int]] = {}
    for f in frames:
        raw = bytes(f)
        vlan = f[Dot1Q].vlan if Dot1Q in f else 0
        if IP in f:
            ip = f[IP]
            ver, src, dst, proto = 4, ip.src, ip.dst, ip.proto
            l4 = ip.payload
        elif IPv6 in f:
            ip = f[IPv6]
            ver, src, dst, proto = 6, ip.src, ip.dst, ip.nh
            l4 = ip.payload
        else:
            ver, src, dst, proto, l4 = 0, None, None, 0, None
        sport = getattr(l4, "sport", 0) if isinstance(l4, (TCP, UDP)) else 0
        dport = getattr(l4, "dport", 0) if isinstance(l4, (TCP, UDP)) else 0
        key = (ver, src, dst, proto, sport, dport, vlan)
        e = expect.setdefault(key, [0, 0])
        e[0] += 1
        e[1] += len(raw)
    return path, len(frames), expect


def _ip_text(ver: int, hi: int, lo: int) -> str | None:
    if ver == 4:
        return str(ipaddress.IPv4Address(lo & 0xFFFFFFFF))
    if ver == 6:
        return str(ipaddress.IPv6Address((hi << 64) | lo))
    return None


def _observed(batch: PacketBatch) -> dict[tuple, list[int]]:
    """Per 5-tuple (and VLAN) packets and wire bytes of our sender's frames."""
    mine = batch["srcMAC"] == SRC_MAC_INT
    got: dict[tuple, list[int]] = {}
    cols = {k: batch[k][mine].tolist() for k in ("ipversion", "srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo",
                                                  "protocol", "srcPort", "destPort", "vlan", "len")}
    for i in range(int(mine.sum())):
        ver = cols["ipversion"][i]
        key = (ver, _ip_text(ver, cols["srcIP_hi"][i], cols["srcIP_lo"][i]),
               _ip_text(ver, cols["destIP_hi"][i], cols["destIP_lo"][i]), cols["protocol"][i],
               cols["srcPort"][i], cols["destPort"][i], cols["vlan"][i])
        e = got.setdefault(key, [0, 0])
        e[0] += 1
        e[1] += cols["len"][i]
    return got


def _replay(pair: VethPair, pcap: Path, pps: int) -> None:
    require_tool("tcpreplay")
    pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, f"--pps={pps}", str(pcap)])


def _drain(cap: LiveCapture, quiet_s: float = 0.5) -> list[PacketBatch]:
    """Copies of every batch until nothing arrives for `quiet_s` (the frame timeout is shorter)."""
    out = []
    while (b := cap.poll(quiet_s)) is not None:
        out.append(b.copy())
    return out


def _check_capture(batches: list[PacketBatch], traffic, t0: int, t1: int, snaplen: int) -> None:
    _, n_sent, expect = traffic
    assert batches, "nothing captured"
    allb = PacketBatch.concat(batches)
    assert _observed(allb) == expect
    mine = allb["srcMAC"] == SRC_MAC_INT
    assert int(mine.sum()) == n_sent
    ts = allb["timestamp"]
    assert np.all(np.diff(ts) >= 0), "timestamps go backwards"
    assert t0 <= int(ts[0]) and int(ts[-1]) <= t1, "timestamps are not the capture time in ns"
    assert np.array_equal(allb["caplen"], np.minimum(allb["len"], snaplen))
    reasons = Counter(allb["reason"][mine].tolist())
    assert reasons[3] == 3 and set(reasons) <= {0, 3}   # ARP is non-IP, every other frame decodes fully
    assert np.all(allb["vlan"][mine & (allb["protocol"] == 17) & (allb["srcPort"] == 9)] == 42)


@pytest.mark.slow
def test_sent_traffic_is_captured_exactly(pair, traffic):
    """Read after the sender finished: 64 blocks retired every 20 ms hold the whole 0.2 s burst."""
    pcap = traffic[0]
    with open_interface(pair.outer, link="wire", block_size=1 << 16, block_count=64, frame_timeout_ms=20) as cap:
        assert cap.poll(0) is None
        t0 = time.time_ns()
        _replay(pair, pcap, pps=2000)
        t1 = time.time_ns()
        batches = _drain(cap)
        stats = cap.stats
        assert all(b.link == "wire" for b in batches)
        assert stats.kernel_drops == 0 and stats.freezes == 0
        assert stats.packets == sum(len(b) for b in batches) == stats.kernel_packets
        assert stats.bytes == sum(int(b["len"].sum()) for b in batches)
        assert stats.malformed == 0 and set(stats.reasons) <= {"ok", "non_ip_ethertype"}
    _check_capture(batches, traffic, t0, t1, snaplen=262144)


def test_small_ring_small_batches_snaplen_promiscuous(pair, traffic):
    """Blocks of one page, far fewer than the traffic needs, read while it arrives in batches of
    5 rows (so batches end inside blocks and the ring wraps); frames cut at 80 bytes."""
    pcap = traffic[0]
    flags = Path(f"/sys/class/net/{pair.outer}/flags")
    cap = LiveCapture(pair.outer, block_size=4096, block_count=16, frame_timeout_ms=10, batch_size=5,
                      snaplen=80, promiscuous=True)
    assert int(flags.read_text(), 16) & 0x100, "promiscuous mode not set"
    batches: list[PacketBatch] = []
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            b = cap.poll(0.05)
            if b is not None:
                assert len(b) <= 5
                batches.append(b.copy())

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        t0 = time.time_ns()
        _replay(pair, pcap, pps=1000)
        t1 = time.time_ns()
        time.sleep(0.2)      # > frame timeout: the last block is handed over
    finally:
        stop.set()
        reader.join()
    batches += _drain(cap, 0.2)
    stats = cap.stats
    cap.close()
    assert not int(flags.read_text(), 16) & 0x100, "promiscuous mode left on after close"
    assert stats.kernel_drops == 0
    assert stats.blocks > 16, "the ring did not wrap"
    _check_capture(batches, traffic, t0, t1, snaplen=80)


def test_poll_returns_none_on_a_silent_interface(pair):
    with open_interface(pair.outer, block_size=1 << 16, block_count=4, frame_timeout_ms=10) as cap:
        start = time.monotonic()
        assert cap.poll(0.3) is None
        assert time.monotonic() - start >= 0.29   # it waited (a lull is observable), it did not spin out
        assert not cap.ready()
        assert cap.stats.packets == 0 and cap.stats.kernel_packets == 0


def test_close_is_idempotent_and_ends_iteration(pair):
    cap = LiveCapture(pair.outer, block_size=1 << 16, block_count=2)
    fd = cap.fileno()
    assert fd >= 0
    cap.close()
    cap.close()
    assert cap.closed
    assert cap.poll(0.1) is None
    assert list(cap) == []
    with pytest.raises(ValueError):
        cap.fileno()


def test_nonexistent_interface_is_a_clear_error():
    with pytest.raises(InterfaceError) as err:
        open_interface("xyz0")
    msg = str(err.value)
    assert "interface 'xyz0' does not exist" in msg and "lo" in msg
    assert isinstance(err.value, LinkError) and isinstance(err.value, CaptureError)


@pytest.mark.parametrize("option, value", [("block_size", 1000), ("block_count", 0), ("snaplen", 0),
                                           ("snaplen", 1 << 20), ("frame_timeout_ms", -1), ("batch_size", 0)])
def test_invalid_ring_options_name_the_option(option, value):
    with pytest.raises(ConfigError, match=f"{option}={value}"):
        LiveCapture("lo", **{option: value})


def test_ring_larger_than_half_the_memory_is_a_config_error():
    with pytest.raises(ConfigError, match="block_count=65536.*half the memory"):
        LiveCapture("lo", block_size=1 << 30, block_count=1 << 16)


def test_without_cap_net_raw_the_message_says_so():
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    code = ("from capture.live import open_interface\n"
            "from common.errors import OopscopeError\n"
            "try:\n    open_interface('lo')\n"
            "except OopscopeError as e:\n    print('ERROR', e)\n")
    res = subprocess.run([setpriv, "--bounding-set=-net_raw", "--inh-caps=-net_raw", sys.executable, "-c", code],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ERROR ")
    assert "root" in res.stdout and "CAP_NET_RAW" in res.stdout and "'lo'" in res.stdout


def _send_raw_frames(pair: VethPair, count: int) -> None:
    """`count` broadcast ARP-typed frames sent from inside the namespace (a plain packet socket)."""
    code = ("import socket\n"
            "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
            f"s.bind(({pair.inner!r}, 0))\n"
            f"for _ in range({count}):\n"
            "    s.send(b'\\xff' * 6 + bytes.fromhex('02005e005301') + b'\\x08\\x06' + bytes(46))\n")
    pair.run_inside([sys.executable, "-c", code])


def test_interface_down_up_and_removed():
    """Down: reported once, capture resumes when it is up again; removed: the capture ends."""
    why = can_make_pairs()
    if why:
        pytest.skip(f"live capture tests: {why}")
    with VethPair("oopr") as own:
        cap = LiveCapture(own.outer, block_size=1 << 16, block_count=8, frame_timeout_ms=10)
        subprocess.run(["ip", "link", "set", own.outer, "down"], check=True)
        assert cap.poll(0.3) is None
        assert len(cap.stats.problems) == 1 and "went down" in cap.stats.problems[0] and not cap.ended
        subprocess.run(["ip", "link", "set", own.outer, "up"], check=True)
        _send_raw_frames(own, 5)
        got = _drain(cap, 0.3)
        assert sum(len(b) for b in got) == 5
        assert all(int(v) == SRC_MAC_INT for b in got for v in b["srcMAC"])
        subprocess.run(["ip", "link", "del", own.outer], check=True)
        assert cap.poll(0.3) is None
        assert cap.ended and "was removed" in cap.stats.problems[-1]
        assert list(cap) == []
        cap.close()
