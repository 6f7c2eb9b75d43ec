"""PACKET_FANOUT live capture: a group's sockets split a veth pair's traffic, each packet once, each flow whole."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import Counter, defaultdict

import pytest

from capture.batch import PacketBatch
from capture.errors import CaptureError, InterfaceError
from capture.live import Fanout, LiveCapture, fanout_group_for_process
from common.errors import ConfigError
from tests.capture.test_capture_live import pair  # noqa: F401  (the live tests' veth pair, a fixture)
from tools.gen.veth import VethPair

pytestmark = pytest.mark.needs_root

CLIENT_MAC, SERVER_MAC = "02:00:5e:00:53:0a", "02:00:5e:00:53:0b"   # neither end's address: the stacks ignore them
OUR_MACS = (0x02005E00530A, 0x02005E00530B)
FLOWS = 200
FORWARD, REPLIES = 5, 3         # packets of each flow sent client -> server and back
CLIENT_PORT = 30000             # flow i: client port CLIENT_PORT + i
RING = {"block_size": 1 << 16, "block_count": 32, "frame_timeout_ms": 10}


def _flow_frames() -> tuple[list[bytes], list[bytes]]:
    """FLOWS flows (UDP and TCP, one in four over IPv6): their client-to-server frames, sent from
    inside the namespace, and the replies, sent from this side."""
    from scapy.all import IP, TCP, UDP, Ether, IPv6, Raw

    forward, replies = [], []
    for i in range(FLOWS):
        client, server = ((f"2001:db8:1::{i + 1:x}", f"2001:db8:2::{i % 7 + 1:x}") if i % 4 == 3 else
                          (f"10.10.{i // 250}.{i % 250 + 1}", f"10.20.0.{i % 7 + 1}"))
        ip = IPv6 if ":" in client else IP
        l4 = TCP if i % 2 else UDP
        sport, dport = CLIENT_PORT + i, 443 if l4 is TCP else 53
        forward += [bytes(Ether(src=CLIENT_MAC, dst=SERVER_MAC) / ip(src=client, dst=server) /
                          l4(sport=sport, dport=dport) / Raw(b"q" * (10 * k))) for k in range(FORWARD)]
        replies += [bytes(Ether(src=SERVER_MAC, dst=CLIENT_MAC) / ip(src=server, dst=client) /
                          l4(sport=dport, dport=sport) / Raw(b"r" * (30 * k))) for k in range(REPLIES)]
    return forward, replies


@pytest.fixture(scope="module")
def flows():
    return _flow_frames()


def _send_inside(veth: VethPair, frames: list[bytes]) -> None:
    """Write `frames` on the namespace's end (a packet socket there), read length-prefixed from stdin."""
    code = ("import socket, sys\n"
            "data = sys.stdin.buffer.read()\n"
            "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
            f"s.bind(({veth.inner!r}, 0))\n"
            "i = 0\n"
            "while i < len(data):\n"
            "    n = int.from_bytes(data[i:i + 2], 'big')\n"
            "    s.send(data[i + 2:i + 2 + n])\n"
            "    i += 2 + n\n")
    data = b"".join(len(f).to_bytes(2, "big") + f for f in frames)
    subprocess.run(veth.inside([sys.executable, "-c", code]), input=data, check=True, timeout=60)


def _send_outside(veth: VethPair, frames: list[bytes]) -> None:
    """Write `frames` on this side's end: the captures see them going out."""
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
        s.bind((veth.outer, 0))
        for f in frames:
            s.send(f)


def _send(veth: VethPair, flows) -> int:
    forward, replies = flows
    _send_inside(veth, forward)
    _send_outside(veth, replies)
    return len(forward) + len(replies)


def _drain_all(caps: list[LiveCapture], quiet_s: float = 0.3) -> list[list[PacketBatch]]:
    """Copies of every capture's batches until none of them gets anything for `quiet_s`."""
    got: list[list[PacketBatch]] = [[] for _ in caps]
    rounds = int(quiet_s / 0.05)
    idle = 0
    while idle < rounds:
        idle += 1
        for out, cap in zip(got, caps):
            batch = cap.poll(0.05 / len(caps))
            if batch is not None:
                out.append(batch.copy())
                idle = 0
    return got


def _per_flow(batches: list[PacketBatch]) -> Counter:
    """Packets of our flows per flow, keyed (ipversion, protocol, client port): both directions
    of a flow count under one key."""
    counts: Counter = Counter()
    for b in batches:
        mine = (b["srcMAC"] == OUR_MACS[0]) | (b["srcMAC"] == OUR_MACS[1])
        for ver, proto, sport, dport in zip(b["ipversion"][mine].tolist(), b["protocol"][mine].tolist(),
                                            b["srcPort"][mine].tolist(), b["destPort"][mine].tolist()):
            counts[ver, proto, max(sport, dport)] += 1
    return counts


def _expected() -> Counter:
    return Counter({(6 if i % 4 == 3 else 4, 6 if i % 2 else 17, CLIENT_PORT + i): FORWARD + REPLIES
                    for i in range(FLOWS)})


def _open(veth: VethPair, fanout: Fanout | None) -> LiveCapture:
    return LiveCapture(veth.outer, fanout=fanout, **RING)


def test_two_sockets_split_the_packets_and_keep_flows_whole(pair, flows):  # noqa: F811
    """Hash mode: the two members' counts add up to what was sent, each has a fair share of the
    flows, every flow (both directions) is on one member; a capture outside the group sees all."""
    first = _open(pair, Fanout())
    second = _open(pair, first.fanout)
    outside = _open(pair, None)
    with first, second, outside:
        assert first.fanout is not None and first.fanout == second.fanout
        sent = _send(pair, flows)
        got = _drain_all([first, second, outside])
        stats = [cap.stats for cap in (first, second, outside)]
    per_socket = [_per_flow(batches) for batches in got[:2]]
    everything = _per_flow(got[2])

    assert everything == _expected(), "the capture outside the group did not see every packet once"
    assert sum(per_socket[0].values()) + sum(per_socket[1].values()) == sent
    assert per_socket[0] + per_socket[1] == _expected(), "a packet was lost or delivered twice"
    assert not set(per_socket[0]) & set(per_socket[1]), "a flow was split between the sockets"
    shares = [len(p) for p in per_socket]
    assert min(shares) >= FLOWS // 5, f"flows per socket {shares}: the group did not spread them"
    for st, batches in zip(stats, got):
        assert st.kernel_drops == 0
        assert st.packets == sum(len(b) for b in batches)


def test_one_socket_in_a_group_sees_what_a_plain_capture_sees(pair, flows):  # noqa: F811
    alone = _open(pair, Fanout(fanout_group_for_process()))
    plain = _open(pair, None)
    with alone, plain:
        assert alone.fanout == Fanout(fanout_group_for_process())
        _send(pair, flows)
        got = _drain_all([alone, plain])
    assert _per_flow(got[0]) == _per_flow(got[1]) == _expected()
    assert sum(len(b) for b in got[0]) == sum(len(b) for b in got[1])


def test_round_robin_splits_flows(pair, flows):  # noqa: F811
    """lb mode: packets alternate between the members, so flows are spread over both."""
    first = _open(pair, Fanout(mode="lb"))
    second = _open(pair, first.fanout)
    with first, second:
        sent = _send(pair, flows)
        got = _drain_all([first, second])
    per_socket = [_per_flow(batches) for batches in got]
    assert per_socket[0] + per_socket[1] == _expected()
    counts = [sum(p.values()) for p in per_socket]
    assert abs(counts[0] - counts[1]) <= sent // 20, counts
    assert len(set(per_socket[0]) & set(per_socket[1])) > FLOWS // 2


def test_fragments_stay_together_and_defrag_delivers_datagrams(pair):  # noqa: F811
    """Without defrag, a datagram's fragments (hashed without ports) are captured as sent, all on
    one member; with it, a member gets the reassembled datagram, on the socket of the flow's
    other packets, and nothing of a datagram missing a fragment."""
    from scapy.all import IP, UDP, Ether, Raw, fragment

    eth = Ether(src=CLIENT_MAC, dst=SERVER_MAC)
    frames = []
    for k in range(16):
        datagram = eth / IP(src="10.30.0.1", dst=f"10.31.0.{k + 1}", id=k + 1) / UDP(sport=4000 + k, dport=53)
        frames += [bytes(f) for f in fragment(datagram / Raw(b"f" * 2500), fragsize=1000)]    # 3 fragments
        frames.append(bytes(datagram / Raw(b"s" * 20)))                                        # not fragmented
    incomplete = eth / IP(src="10.30.0.1", dst="10.32.0.1", id=99) / UDP(sport=9, dport=9) / Raw(b"i" * 2500)
    frames.append(bytes(fragment(incomplete, fragsize=1000)[0]))

    def capture(defrag: bool) -> list[Counter]:
        first = _open(pair, Fanout(mode="hash", defrag=defrag))
        second = _open(pair, first.fanout)
        with first, second:
            assert first.fanout.defrag is defrag
            _send_inside(pair, frames)
            got = _drain_all([first, second])
        seen = []
        for batches in got:       # per member: (destination, fragment?) -> packets
            c: Counter = Counter()
            for b in batches:
                for dst, frag, length in zip(b["destIP_lo"].tolist(), b["is_fragment"].tolist(), b["len"].tolist()):
                    c[dst & 0xFFFFFFFF, "fragment" if frag else "whole" if length < 100 else "datagram"] += 1
            seen.append(c)
        return seen

    def members(seen: list[Counter], kind: str | None = None) -> dict[int, set[int]]:
        """destination -> the members that got its packets (of `kind`, or of every kind)"""
        where = defaultdict(set)
        for i, c in enumerate(seen):
            for dst, k in c:
                if kind in (None, k):
                    where[dst].add(i)
        return where

    seen = capture(defrag=False)
    assert sum((seen[0] + seen[1]).values()) == len(frames)
    fragments = members(seen, "fragment")
    assert len(fragments) == 17 and all(len(m) == 1 for m in fragments.values()), "a datagram's fragments split"

    seen = capture(defrag=True)
    total = seen[0] + seen[1]
    assert sorted(Counter(kind for _, kind in total.elements()).items()) == [("datagram", 16), ("whole", 16)]
    assert 0x0A200001 not in {dst for dst, _ in total}, "a datagram missing a fragment was delivered"
    assert all(len(m) == 1 for m in members(seen).values()), "a datagram left its flow's socket"


def test_the_kernel_picks_a_group_and_conflicts_name_interface_and_group(pair):  # noqa: F811
    with _open(pair, Fanout()) as first:
        group = first.fanout.group
        assert isinstance(group, int) and 0 <= group <= 0xFFFF
        with pytest.raises(InterfaceError) as err:
            _open(pair, Fanout(group, mode="lb"))
        msg = str(err.value)
        assert f"interface {pair.outer!r}" in msg and f"group {group}" in msg and "another mode" in msg
        assert isinstance(err.value, CaptureError)
        with pytest.raises(InterfaceError, match=f"interface 'lo': cannot join fanout group {group} "):
            LiveCapture("lo", fanout=first.fanout, **RING)   # a group belongs to one interface
        with pytest.raises(InterfaceError, match="defrag"):
            _open(pair, Fanout(group, defrag=True))
        with _open(pair, first.fanout) as second:             # the same options join
            assert second.fanout == first.fanout


def test_invalid_fanout_options_name_the_option():
    with pytest.raises(ConfigError, match="fanout mode='nope' is not valid: hash, lb, cpu"):
        Fanout(mode="nope")
    for group in (70000, -1, 1.5, True):
        with pytest.raises(ConfigError, match=f"fanout group={group!r} is not valid: an integer from 0 to 65535"):
            Fanout(group)
    with pytest.raises(ConfigError, match="option fanout=7 is not valid"):
        LiveCapture("lo", fanout=7)


def test_group_for_a_process_is_its_pid_in_16_bits():
    assert fanout_group_for_process(0x12345) == 0x2345
    assert 0 <= fanout_group_for_process() <= 0xFFFF
