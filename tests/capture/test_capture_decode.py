"""The frame decoder on packets crafted with scapy: every link type, protocol, VLAN/QinQ, tunnel and malformation.

Well-formed packets are checked field by field against scapy's own dissection of the same
bytes (an independent decoder); malformed ones against the reason the schema documents.
"""

from __future__ import annotations

import struct

import pytest
from scapy.contrib.mpls import MPLS
from scapy.layers.inet import GRE, ICMP, IP, TCP, UDP, IPOption_RR, fragment
from scapy.layers.inet6 import (
    ICMPv6EchoRequest,
    IPv6,
    IPv6ExtHdrDestOpt,
    IPv6ExtHdrFragment,
    IPv6ExtHdrHopByHop,
    IPv6ExtHdrRouting,
)
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether
from scapy.packet import Raw

from capture import schema
from capture.reader import read_all
from capture.schema import REASON_CODES
from tests.capture.capture_writers import (
    NS,
    Interface,
    Section,
    pcap_bytes,
    pcapng_bytes,
)

T0 = 1_700_000_000 * NS + 123_456_000
ETH = dict(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


def decode(tmp_path, frames, link=1, **kw):
    """Rows of a pcap holding `frames` (bytes or (bytes, wire_len)) on `link`."""
    recs = [(T0 + i * 1000, *(f if isinstance(f, tuple) else (f,))) for i, f in enumerate(frames)]
    path = tmp_path / f"t{link}.pcap"
    path.write_bytes(pcap_bytes([(t, bytes(fr), *rest) for t, fr, *rest in recs], link, **kw))
    return read_all(path)


def row(batch, i=0) -> dict:
    return {name: batch[name][i].item() for name in batch.columns}


def _mac(text: str) -> int:
    return int(text.replace(":", ""), 16)


def _v4(text: str) -> int:
    return struct.unpack(">I", bytes(map(int, text.split("."))))[0]


def scapy_expect(pkt) -> dict:
    """The schema fields of a scapy-dissected packet (outer IP header, its next protocol)."""
    e: dict = {"layers": 0}
    layer = pkt
    if isinstance(layer, Ether):
        e.update(srcMAC=_mac(layer.src), destMAC=_mac(layer.dst), layers=schema.L_ETH)
        e["eth_type"] = layer.type
        layer = layer.payload
    if isinstance(layer, (Dot1Q, Dot1AD)):
        e["vlan"] = layer.vlan
        e["layers"] |= schema.L_VLAN
        while isinstance(layer, (Dot1Q, Dot1AD)):
            e["eth_type"] = layer.type
            layer = layer.payload
    while isinstance(layer, MPLS):
        layer = layer.payload
    if isinstance(layer, IP):
        e.update(ipversion=4, srcIP_hi=0, srcIP_lo=0xFFFF_0000_0000 | _v4(layer.src),
                 destIP_lo=0xFFFF_0000_0000 | _v4(layer.dst),
                 protocol=layer.proto, ttl=layer.ttl, tos=layer.tos, ip_len=layer.len,
                 frag_offset=layer.frag * 8, is_fragment=int(bool(layer.flags.MF) or layer.frag > 0))
        e["layers"] |= schema.L_IPV4
        ip_payload = layer.len - layer.ihl * 4
        later = layer.frag > 0
        nxt = layer.payload
    elif isinstance(layer, IPv6):
        import ipaddress

        s, d = int(ipaddress.IPv6Address(layer.src)), int(ipaddress.IPv6Address(layer.dst))
        e.update(ipversion=6, srcIP_hi=s >> 64, srcIP_lo=s & (2**64 - 1), destIP_hi=d >> 64,
                 destIP_lo=d & (2**64 - 1), ttl=layer.hlim, tos=layer.tc, ip_len=layer.plen + 40,
                 protocol=layer.nh, is_fragment=0, frag_offset=0)
        e["layers"] |= schema.L_IPV6
        ip_payload = layer.plen
        later = False
        nxt = layer.payload
        while isinstance(nxt, (IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment)):
            ip_payload -= len(bytes(nxt)) - len(bytes(nxt.payload))
            e["protocol"] = nxt.nh
            if isinstance(nxt, IPv6ExtHdrFragment):
                e.update(is_fragment=1, frag_offset=nxt.offset * 8)
                later = nxt.offset > 0
            nxt = nxt.payload
    else:
        return e
    if e["is_fragment"]:
        e["layers"] |= schema.L_FRAG
    if later:
        return e
    if isinstance(nxt, TCP):
        e.update(srcPort=nxt.sport, destPort=nxt.dport, flags=int(nxt.flags), seq=nxt.seq, ack=nxt.ack,
                 win=nxt.window, payload_len=ip_payload - nxt.dataofs * 4)
        e["layers"] |= schema.L_TCP
    elif isinstance(nxt, UDP):
        e.update(srcPort=nxt.sport, destPort=nxt.dport, payload_len=ip_payload - 8)
        e["layers"] |= schema.L_UDP
    elif isinstance(nxt, (ICMP, ICMPv6EchoRequest)):
        e.update(icmp_type=nxt.type, icmp_code=nxt.code)
        e["layers"] |= schema.L_ICMP
    return e


def assert_matches(got: dict, expected: dict) -> None:
    for k, v in expected.items():
        assert got[k] == v, (k, got[k], v)


TCP_PKT = IP(src="10.1.2.3", dst="192.168.7.9", ttl=61, tos=0x28) / TCP(
    sport=40000, dport=443, flags="PA", seq=123456789, ack=987654321, window=5000) / Raw(b"x" * 100)
UDP_OPT = IP(src="10.0.0.1", dst="10.0.0.2", options=[IPOption_RR()]) / UDP(sport=53, dport=5353) / Raw(b"q" * 33)
V6_EXT = IPv6(src="2001:db8::1", dst="2001:db8:0:1::ff", hlim=7, tc=0x10) / IPv6ExtHdrHopByHop() / \
    IPv6ExtHdrRouting(addresses=["2001:db8::99"]) / IPv6ExtHdrDestOpt() / UDP(sport=1000, dport=2000) / Raw(b"z" * 10)

ETHERNET_CASES = {
    "tcp": Ether(**ETH) / TCP_PKT,
    "udp with IP options": Ether(**ETH) / UDP_OPT,
    "icmp": Ether(**ETH) / IP(src="1.2.3.4", dst="5.6.7.8") / ICMP(type=3, code=1) / Raw(b"e" * 28),
    "vlan": Ether(**ETH) / Dot1Q(vlan=100) / IP(src="1.1.1.1", dst="2.2.2.2") / UDP(sport=1, dport=2),
    "qinq": Ether(**ETH) / Dot1AD(vlan=200) / Dot1Q(vlan=300) / IPv6(src="::1", dst="fe80::1") /
    TCP(sport=22, dport=5555, flags="S"),
    "ipv6 extension headers": Ether(**ETH) / V6_EXT,
    "ipv6 first fragment": Ether(**ETH) / IPv6(src="2001:db8::a", dst="2001:db8::b") /
    IPv6ExtHdrFragment(offset=0, m=1, nh=6) / TCP(sport=80, dport=8080, flags="A"),
    "ipv6 later fragment": Ether(**ETH) / IPv6(src="2001:db8::a", dst="2001:db8::b") /
    IPv6ExtHdrFragment(offset=185, m=0, nh=17) / Raw(b"f" * 40),
    "icmpv6": Ether(**ETH) / IPv6(src="2001:db8::1", dst="2001:db8::2") / ICMPv6EchoRequest(),
    "mpls": Ether(**ETH) / MPLS(label=16, s=0) / MPLS(label=17, s=1) / TCP_PKT,
    "4in4 tunnel": Ether(**ETH) / IP(src="9.9.9.9", dst="8.8.8.8") / TCP_PKT,
    "6in4 tunnel": Ether(**ETH) / IP(src="9.9.9.9", dst="8.8.8.8") / V6_EXT,
    "4in6 tunnel": Ether(**ETH) / IPv6(src="2001:db8::9", dst="2001:db8::8") / TCP_PKT,
    "gre": Ether(**ETH) / IP(src="9.9.9.9", dst="8.8.8.8") / GRE() / TCP_PKT,
}


@pytest.mark.parametrize("name", list(ETHERNET_CASES))
@pytest.mark.slow
def test_ethernet_frames_match_scapy(tmp_path, name):
    pkt = ETHERNET_CASES[name]
    raw = bytes(pkt)
    got = row(decode(tmp_path, [raw]))
    expected = scapy_expect(Ether(raw))
    assert_matches(got, expected)
    assert got["reason"] == 0
    assert got["len"] == got["caplen"] == len(raw)
    assert got["timestamp"] == T0


def test_tunnels_report_outer_protocol(tmp_path):
    rows = decode(tmp_path, [bytes(ETHERNET_CASES[n]) for n in ("4in4 tunnel", "6in4 tunnel", "4in6 tunnel", "gre")])
    assert rows["protocol"].tolist() == [4, 41, 4, 47]
    assert rows["srcPort"].tolist() == [0, 0, 0, 0]
    assert (rows["layers"] & (schema.L_TCP | schema.L_UDP)).tolist() == [0, 0, 0, 0]


def test_ipv4_fragments(tmp_path):
    big = IP(src="10.0.0.1", dst="10.0.0.2", id=7) / UDP(sport=1234, dport=5678) / Raw(b"a" * 3000)
    frags = fragment(big, fragsize=1000)
    rows = decode(tmp_path, [bytes(Ether(**ETH) / f) for f in frags])
    assert len(frags) == 4  # 3008 bytes of UDP in 1000-byte pieces
    for i, f in enumerate(frags):
        got = row(rows, i)
        assert_matches(got, scapy_expect(Ether(bytes(Ether(**ETH) / f))))
        assert got["is_fragment"] == 1 and got["layers"] & schema.L_FRAG
    # the first fragment has the UDP header, later ones none
    assert rows["srcPort"].tolist() == [1234, 0, 0, 0]
    assert rows["frag_offset"].tolist() == [0, 1000, 2000, 3000]
    assert rows["reason"].tolist() == [0, 0, 0, 0]


# --- link types other than Ethernet: the same IP packets behind each link header ----------
V4 = bytes(TCP_PKT)
V6 = bytes(IPv6(src="2001:db8::5", dst="2001:db8::6") / UDP(sport=9, dport=10) / Raw(b"u" * 7))

LINK_CASES = [
    ("SLL", 113, bytes(CookedLinux(pkttype=0, lladdrtype=1, lladdrlen=6, src=bytes.fromhex("020000000009") + b"\0\0",
                                   proto=0x0800)) + V4, V4, 0x0800),
    ("SLL2", 276, bytes(CookedLinuxV2(proto=0x86DD, ifindex=3, lladdrtype=1, lladdrlen=6,
                                      src=bytes.fromhex("020000000009") + b"\0\0")) + V6, V6, 0x86DD),
    ("null LE", 0, struct.pack("<I", 2) + V4, V4, 0x0800),
    ("null BE", 0, struct.pack(">I", 2) + V4, V4, 0x0800),
    ("null IPv6 (FreeBSD 28)", 0, struct.pack("<I", 28) + V6, V6, 0x86DD),
    ("null IPv6 (Darwin 30)", 0, struct.pack("<I", 30) + V6, V6, 0x86DD),
    ("null IPv6 (BSD 24)", 0, struct.pack(">I", 24) + V6, V6, 0x86DD),
    ("loop", 108, struct.pack(">I", 2) + V4, V4, 0x0800),
    ("raw 101 v4", 101, V4, V4, 0),
    ("raw 101 v6", 101, V6, V6, 0),
    ("raw 12", 12, V4, V4, 0),
    ("raw 14", 14, V6, V6, 0),
    ("ipv4 228", 228, V4, V4, 0),
    ("ipv6 229", 229, V6, V6, 0),
    ("PPP with HDLC framing", 9, b"\xff\x03\x00\x21" + V4, V4, 0x0800),
    ("PPP bare", 9, b"\x00\x57" + V6, V6, 0x86DD),
    ("PPP compressed protocol", 9, b"\x21" + V4, V4, 0x0800),
    ("PPP carrying Cisco HDLC", 9, b"\x0f\x00\x08\x00" + V4, V4, 0x0800),
    ("PPP-in-HDLC 50", 50, b"\xff\x03\x00\x57" + V6, V6, 0x86DD),
    ("Cisco HDLC", 104, b"\x0f\x00\x08\x00" + V4, V4, 0x0800),
    ("Cisco HDLC broadcast v6", 104, b"\x8f\x00\x86\xdd" + V6, V6, 0x86DD),
]


@pytest.mark.parametrize("name,link,frame,ip,eth_type", LINK_CASES, ids=[c[0] for c in LINK_CASES])
def test_link_types_match_scapy(tmp_path, name, link, frame, ip, eth_type):
    got = row(decode(tmp_path, [frame], link=link))
    expected = scapy_expect(IP(ip) if ip[0] >> 4 == 4 else IPv6(ip))
    assert_matches(got, expected)
    assert got["reason"] == 0
    assert got["eth_type"] == eth_type
    assert not got["layers"] & schema.L_ETH
    if name.startswith("SLL"):
        assert got["srcMAC"] == 0x020000000009 and got["destMAC"] == 0


@pytest.mark.parametrize("link,frame", [
    (104, b"\x0f\x00\x80\x35" + b"\0" * 20),       # Cisco SLARP
    (9, b"\xc0\x21" + b"\0" * 20),                 # PPP LCP
    (0, struct.pack("<I", 7) + V4),                # an address family that is not IP
    (113, bytes(CookedLinux(proto=0x0806)) + bytes(ARP())),
    (1, bytes(Ether(**ETH) / ARP())),
    (1, bytes(Ether(**ETH, type=0x88CC) / Raw(b"l" * 40))),  # LLDP
])
def test_non_ip_frames_are_kept_with_benign_reason(tmp_path, link, frame):
    got = row(decode(tmp_path, [frame], link=link))
    assert got["reason"] == REASON_CODES["non_ip_ethertype"]
    assert got["ipversion"] == 0 and not got["layers"] & schema.L_IP


# --- malformations: each kept as a row with its reason ------------------------------------
def _ip_bytes(**fields) -> bytearray:
    return bytearray(bytes(IP(src="10.0.0.1", dst="10.0.0.2", **fields) / TCP(sport=1, dport=2) / Raw(b"p" * 20)))


def _eth(payload: bytes, etype=0x0800) -> bytes:
    return bytes(Ether(**ETH, type=etype)) + bytes(payload)


def _with(b: bytearray, offset: int, value: int) -> bytearray:
    b = bytearray(b)
    b[offset] = value
    return b


TCP_V4 = _ip_bytes()
MALFORMED = [
    ("short ethernet", 1, bytes(10), "truncated_link_header", 0),
    ("short SLL", 113, bytes(10), "truncated_link_header", 0),
    ("short SLL2", 276, bytes(19), "truncated_link_header", 0),
    ("short null", 0, bytes(3), "truncated_link_header", 0),
    ("empty PPP", 9, b"\xff", "truncated_link_header", 0),
    ("cut vlan tag", 1, bytes(Ether(**ETH) / Dot1Q(vlan=5))[:16], "truncated_vlan_tag", schema.L_ETH),
    ("cut IPv4 header", 1, _eth(TCP_V4[:12]), "truncated_ip_header", schema.L_ETH),
    ("no IP bytes", 1, _eth(b""), "truncated_ip_header", schema.L_ETH),
    ("cut IPv6 header", 1, _eth(V6[:30], 0x86DD), "truncated_ip_header", schema.L_ETH),
    ("IPv6 under 0x0800", 1, _eth(V6), "bad_ip_version", schema.L_ETH),
    ("version 5 on raw link", 101, bytes([0x50]) + V4[1:], "bad_ip_version", 0),
    ("IHL 4", 1, _eth(_with(TCP_V4, 0, 0x44)), "bad_ihl", schema.L_ETH),
    ("options cut", 1, _eth(_with(TCP_V4, 0, 0x4F)[:40]), "truncated_ip_header", schema.L_ETH),
    ("total length below IHL", 1, _eth(_with(_with(TCP_V4, 2, 0), 3, 10)), "bad_ip_length",
     schema.L_ETH | schema.L_IPV4),
    ("total length beyond the wire", 1, _eth(_with(TCP_V4, 2, 0x05)), "bad_ip_length",
     schema.L_ETH | schema.L_IPV4 | schema.L_TCP),
    ("IPv6 payload beyond the wire", 1, _eth(_with(bytearray(V6), 4, 0x10), 0x86DD), "bad_ip_length",
     schema.L_ETH | schema.L_IPV6 | schema.L_UDP),
    ("cut IPv6 extension header", 1,
     (_eth(bytes(IPv6(src="::1", dst="::2") / IPv6ExtHdrRouting(addresses=["::3", "::4"]) / UDP()), 0x86DD)[:66],
      14 + 40 + 40 + 8),
     "truncated_ipv6_ext_header", schema.L_ETH | schema.L_IPV6),
    ("TCP data offset 3", 1, _eth(_with(TCP_V4, 32, 0x30)), "bad_tcp_offset",
     schema.L_ETH | schema.L_IPV4 | schema.L_TCP),
    ("TCP data offset beyond the packet", 1, _eth(_with(TCP_V4, 32, 0xF0)), "bad_tcp_offset",
     schema.L_ETH | schema.L_IPV4 | schema.L_TCP),
]


@pytest.mark.parametrize("name,link,frame,reason,layers", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_frames_are_rows_with_reason(tmp_path, name, link, frame, reason, layers):
    # a frame cut by the snap length is (bytes, wire length)
    good = bytes(Ether(**ETH) / TCP_PKT) if link == 1 else V4 if link == 101 else None
    frames = [frame] + ([good] if good else [])
    rows = decode(tmp_path, frames, link=link)
    assert len(rows) == len(frames)  # nothing lost, nothing raised
    got = row(rows)
    assert schema.REASONS[got["reason"]] == reason
    assert got["layers"] == layers
    if good:
        assert rows["reason"][1] == 0 and rows["srcPort"][1] == 40000  # the next packet is fine


def test_snaplen_cut_transport_and_payload_from_ip_length(tmp_path):
    full = bytes(Ether(**ETH) / TCP_PKT)
    rows = decode(tmp_path, [(full[:54], len(full)), (full[:40], len(full))], snaplen=54)
    a, b = row(rows, 0), row(rows, 1)
    assert a["reason"] == 0 and a["payload_len"] == 100 and a["caplen"] == 54 and a["len"] == len(full)
    assert schema.REASONS[b["reason"]] == "truncated_transport_header"
    assert b["layers"] == schema.L_ETH | schema.L_IPV4 and b["srcIP_lo"] & 0xFFFFFFFF == 0x0A010203


def test_record_longer_than_wire_or_snaplen(tmp_path):
    """Longer than the wire length: flagged. Longer than the header's snap length: read
    whole, as tshark reads it (issue 25; tests/capture/test_capture_reliability.py)."""
    full = bytes(Ether(**ETH) / TCP_PKT)
    rows = decode(tmp_path, [(full, 60), full], snaplen=100)
    assert [schema.REASONS[r] for r in rows["reason"]] == ["bad_record_length", "ok"]
    assert rows["srcPort"].tolist() == [40000, 40000]  # decoded anyway, then flagged


def test_tso_zero_ip_length(tmp_path):
    frame = _eth(_with(_with(TCP_V4, 2, 0), 3, 0))
    got = row(decode(tmp_path, [frame]))
    assert got["reason"] == 0 and got["ip_len"] == len(TCP_V4) and got["payload_len"] == 20


def test_pcapng_unknown_interface_and_unsupported_link(tmp_path):
    sec = Section(interfaces=[Interface(link=1), Interface(link=147)])
    frame = bytes(Ether(**ETH) / TCP_PKT)
    sec.items = [("epb", 0, 1, frame), ("epb", 1, 2, frame), ("epb", 5, 3, frame)]
    path = tmp_path / "u.pcapng"
    path.write_bytes(pcapng_bytes([sec]))
    from capture.reader import open_capture

    with open_capture(path) as r:
        rows = [b.copy() for b in r]
    reasons = [schema.REASONS[x] for x in rows[0]["reason"]]
    assert reasons == ["ok", "unsupported_link_type", "unsupported_link_type"]
    assert r.stats.reasons == {"ok": 1, "unsupported_link_type": 2}
    assert any("147" in p for p in r.stats.problems)
