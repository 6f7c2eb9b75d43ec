"""The payload column (`capture.payload`): TCP/UDP payload bytes equal to dpkt's reading of
real captures, present only when asked for, cut where the capture cut the packet, and located
through VLAN tags and non-Ethernet links (the general decoder's path)."""

from __future__ import annotations

import warnings

import dpkt
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Raw

from capture.reader import open_capture, read_all
from tests.capture.capture_writers import NS, pcap_bytes

REAL = ["http-lines-split.pcap", "bittorrent.pcap", "ftp.pcap", "dhcp.pcapng",
        "skype-conference-call.pcap"]


def dpkt_payloads(path) -> list[bytes | None]:
    """Per packet the TCP/UDP payload dpkt finds (b"" for other packets, None: dpkt cannot
    read the frame)."""
    out: list[bytes | None] = []
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = dpkt.pcapng.Reader(f) if str(path).endswith("ng") else dpkt.pcap.Reader(f)
        for _, buf in reader:
            try:
                ip = dpkt.ethernet.Ethernet(buf).data
            except dpkt.dpkt.UnpackError:
                out.append(None)
                continue
            fragment = isinstance(ip, dpkt.ip.IP) and (ip.mf or ip.offset)
            if isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) and not fragment and \
                    isinstance(ip.data, (dpkt.tcp.TCP, dpkt.udp.UDP)):
                out.append(bytes(ip.data.data))
            else:
                out.append(b"")
    return out


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("batch_size", [5, 65536])
def test_payload_bytes_equal_dpkts(pcaps_dir, name, batch_size):
    path = pcaps_dir / name
    batch = read_all(path, columns=["payload", "layers"], batch_size=batch_size)
    got = batch.payload.to_pylist()
    want = dpkt_payloads(path)
    assert len(got) == len(want) == batch.n
    compared = [(g, w) for g, w in zip(got, want) if w is not None]
    assert compared and all(g == w for g, w in compared)
    assert any(g for g, _ in compared)


def test_no_payload_unless_asked(pcaps_dir):
    path = pcaps_dir / "bittorrent.pcap"
    with open_capture(path) as reader:
        assert all(b.payload is None for b in reader)
    with open_capture(path, columns=["srcPort", "payload"]) as reader:
        batches = list(reader)
    assert all(b.payload is not None and len(b.payload) == b.n for b in batches)
    with pytest.raises(KeyError, match="not captured"):
        read_all(path)["payload"]


def test_payload_survives_take_and_slice(pcaps_dir):
    batch = read_all(pcaps_dir / "ftp.pcap", columns=["payload", "layers"])
    mask = batch["srcPort"] == batch["srcPort"]   # all
    mask[::3] = False
    kept = batch.take(mask)
    assert kept.payload.to_pylist() == [p for p, m in zip(batch.payload.to_pylist(), mask) if m]
    assert batch.slice(10, 20).payload.to_pylist() == batch.payload.to_pylist()[10:20]


def test_snap_length_cuts_the_payload_not_payload_len(tmp_path):
    body = b"GET /index.html HTTP/1.1\r\nHost: example.org\r\n\r\n"
    frames = [
        bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=1, dport=80) / Raw(body)),
        bytes(Ether() / Dot1Q(vlan=7) / IPv6() / UDP(sport=5, dport=53) / Raw(b"\x01\x02xyz")),
        bytes(Ether() / IP() / TCP() / Raw(b"a")),            # padded to 60 bytes on the wire
    ]
    frames[2] = frames[2] + b"\x00" * (60 - len(frames[2]))
    cut = 14 + 20 + 20 + 10
    records = [(NS, frames[0][:cut], len(frames[0])), (2 * NS, frames[1]), (3 * NS, frames[2])]
    path = tmp_path / "cut.pcap"
    path.write_bytes(pcap_bytes(records, snaplen=cut))
    batch = read_all(path, columns=["payload", "payload_len"])
    assert batch.payload.to_pylist() == [body[:10], b"\x01\x02xyz", b"a"]
    assert batch["payload_len"].tolist() == [len(body), 5, 1]
