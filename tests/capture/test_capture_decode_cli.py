"""`oopscope decode`: CSV / JSON lines output, field selection, errors, and the text forms of addresses."""

from __future__ import annotations

import csv
import io
import ipaddress
import json
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Dot1Q, Ether
from scapy.packet import Raw

from capture import addresses
from tests.capture.capture_writers import NS, pcap_bytes
from tests.conftest import require_tool
from tools.cli import cli, main
from tools.commands.decode import FIELDS

T0 = 1_650_000_000 * NS + 5
MACS = dict(src="0a:1b:2c:3d:4e:5f", dst="ff:ee:dd:cc:bb:aa")
V6_ADDRS = ["2001:db8:0:0:1:0:0:1", "2001:0:0:1::1", "::1", "fe80::", "::ffff:1.2.3.4", "1:2:3:4:5:6:7:8",
            "2001:db8::", "0:0:1::", "::2:3:4:5:6:7:8"]
PACKETS = [
    Ether(**MACS) / IP(src="10.0.0.1", dst="10.255.0.2", ttl=3) / TCP(sport=1, dport=2, flags="SA", seq=7, ack=9),
    Ether(**MACS) / Dot1Q(vlan=42) / IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=53, dport=999) / Raw(b"r" * 12),
    Ether(**MACS) / IP(src="192.168.1.1", dst="192.168.1.2") / ICMP(type=8),
    Ether(**MACS) / ARP(),
    *[Ether(**MACS) / IPv6(src=a, dst=V6_ADDRS[-1 - i]) / UDP(sport=5, dport=6) for i, a in enumerate(V6_ADDRS)],
]


@pytest.fixture
def capture_file(tmp_path):
    frames = [bytes(p) for p in PACKETS] + [bytes(PACKETS[0])[:20]]  # and a malformed one
    path = tmp_path / "sample.pcap"
    path.write_bytes(pcap_bytes([(T0 + i * 1000, f) for i, f in enumerate(frames)], nano=True))
    return path


def run(*args):
    res = CliRunner().invoke(cli, ["decode", *map(str, args)])
    return res


def test_csv_rows_one_per_packet(capture_file):
    res = run(capture_file)
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert list(rows[0]) == list(FIELDS)
    assert len(rows) == len(PACKETS) + 1
    tcp, udp, icmp, arp = rows[:4]
    assert tcp["srcIP"] == "10.0.0.1" and tcp["destIP"] == "10.255.0.2" and tcp["ttl"] == "3"
    assert tcp["flags"] == str(0x12) and tcp["seq"] == "7" and tcp["ack"] == "9"
    assert tcp["srcMAC"] == MACS["src"] and tcp["destMAC"] == MACS["dst"]
    assert tcp["time"] == str(T0 // NS) and tcp["timestamp"] == str(T0)
    assert tcp["vlan"] == "" and tcp["icmp_type"] == "" and tcp["link"] == "sample" and tcp["reason"] == "ok"
    assert udp["vlan"] == "42" and udp["payload_len"] == "12" and udp["flags"] == "" and udp["srcPort"] == "53"
    assert icmp["icmp_type"] == "8" and icmp["srcPort"] == ""
    assert arp["reason"] == "non_ip_ethertype" and arp["srcIP"] == "" and arp["eth_type"] == str(0x0806)
    assert rows[-1]["reason"] == "truncated_ip_header" and rows[-1]["caplen"] == "20"


def test_ipv6_text_matches_tshark(capture_file):
    tshark = require_tool("tshark")
    out = subprocess.run([tshark, "-r", str(capture_file), "-T", "fields", "-e", "ipv6.src", "-e", "ipv6.dst",
                          "-Y", "ipv6"], capture_output=True, text=True, check=True).stdout
    theirs = [line.split("\t") for line in out.splitlines()]
    rows = list(csv.DictReader(io.StringIO(run(capture_file, "--fields", "srcIP,destIP").stdout)))
    ours = [[r["srcIP"], r["destIP"]] for r in rows[4:4 + len(V6_ADDRS)]]
    assert ours == theirs
    assert all(ipaddress.ip_address(a) == ipaddress.ip_address(b) for a, b in zip([o[0] for o in ours], V6_ADDRS))


def test_jsonl_with_nulls(capture_file):
    res = run(capture_file, "--format", "jsonl", "--fields", "srcIP,srcPort,flags,reason,link,vlan", "--link", 'we"ird')
    objs = [json.loads(line) for line in res.stdout.splitlines()]
    assert objs[0] == {"srcIP": "10.0.0.1", "srcPort": 1, "flags": 18, "reason": "ok", "link": 'we"ird', "vlan": None}
    assert objs[1]["flags"] is None and objs[1]["vlan"] == 42
    assert objs[3]["srcIP"] is None and objs[3]["reason"] == "non_ip_ethertype"


def test_fields_limit_and_link(capture_file):
    res = run(capture_file, "--fields", "link,srcPort", "--limit", "2", "--link", "a,b")
    assert res.exit_code == 0
    assert res.stdout.splitlines() == ["link,srcPort", '"a,b",1', '"a,b",53']
    assert run(capture_file, "--limit", "0").stdout.splitlines() == [",".join(FIELDS)]


def test_unknown_field_is_a_usage_error(capture_file):
    res = run(capture_file, "--fields", "srcIP,bogus")
    assert res.exit_code == 2
    assert "bogus" in res.output and "valid fields" in res.output and "payload_len" in res.output


def _main(argv, capsys):
    with pytest.raises(SystemExit) as ex:
        main(argv)
    return ex.value.code, capsys.readouterr()


def test_missing_file_and_bad_file_are_one_line_errors(tmp_path, capsys):
    code, out = _main(["decode", str(tmp_path / "none.pcap")], capsys)
    assert code == 1 and "not found" in out.err and out.err.count("\n") == 1
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(b"hello world, not a capture")
    code, out = _main(["decode", str(bad)], capsys)
    assert code == 1 and "bad magic" in out.err and "byte 0" in out.err and "Traceback" not in out.err


def test_truncated_file_warns_or_fails_in_strict_mode(capture_file, tmp_path, capsys):
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(capture_file.read_bytes()[:-7])
    res = run(cut)
    assert res.exit_code == 0
    assert len(res.stdout.splitlines()) == 1 + len(PACKETS)  # every complete packet
    assert "ends inside the last record" in res.stderr
    code, out = _main(["decode", str(cut), "--strict"], capsys)
    assert code == 1 and "ends inside the last record" in out.err
    assert len(out.out.splitlines()) == 1 + len(PACKETS)


def test_help():
    res = CliRunner().invoke(cli, ["decode", "--help"])
    assert res.exit_code == 0 and "--fields" in res.output


# --- the address helpers ------------------------------------------------------------------
def test_vectorised_ipv4_and_mac_text_against_stdlib():
    rng = np.random.default_rng(1)
    v4 = rng.integers(0, 2**32, 500, dtype=np.uint64)
    v4[:3] = [0, 2**32 - 1, 0x0A000001]
    assert addresses.ipv4_text(v4).tolist() == [str(ipaddress.IPv4Address(int(x))) for x in v4]
    macs = rng.integers(0, 2**48, 300, dtype=np.uint64)
    assert addresses.mac_text(macs).tolist() == [":".join(f"{int(m):012x}"[i:i + 2] for i in range(0, 12, 2))
                                                  for m in macs]


def test_ip_text_mixed_versions_and_round_trip():
    texts = ["10.1.2.3", "2001:db8::1", "0.0.0.0", "::", "255.255.255.255"]
    halves = [addresses.ip_to_halves(t) for t in texts]
    hi = np.array([h for h, _ in halves], np.uint64)
    lo = np.array([lo for _, lo in halves], np.uint64)
    assert addresses.ip_text(hi, lo).tolist() == texts
    assert [addresses.halves_to_text(h, lo_) for h, lo_ in halves] == texts
    # an IPv4-mapped address in an IPv6 packet prints as IPv6 when the version is given
    h, lo_ = addresses.ip_to_halves("1.2.3.4")
    assert addresses.ip_text(np.array([h], np.uint64), np.array([lo_], np.uint64), np.array([6])).tolist() == \
        ["::ffff:1.2.3.4"]
    assert addresses.mac_to_int("0a:1b:2c:3d:4e:5f") == 0x0A1B2C3D4E5F


def _format_one_field(kind, lo, hi=None, ipver=None):
    n = len(lo)
    text_bytes = addresses.format_rows(
        np.array([kind]), np.asarray(lo, np.uint64).reshape(1, n),
        np.zeros((1, n), np.uint64) if hi is None else np.asarray(hi, np.uint64).reshape(1, n),
        np.ones((1, n), np.uint8), np.full(n, 6 if ipver is None else ipver, np.uint8), np.zeros(1, np.uint8),
        np.zeros(1, np.uint8), np.zeros(2, np.int64), np.zeros(1, np.uint8), np.zeros(2, np.int64),
        np.zeros(1, np.uint8), np.zeros(2, np.int64), np.frombuffer(b"\n", np.uint8),
        out := np.empty(n * 64, np.uint8))
    return out[:text_bytes].tobytes().decode().splitlines()


def test_numba_ipv6_text_matches_inet_ntop():
    import socket

    rng = np.random.default_rng(7)
    words = rng.integers(0, 65536, (3000, 8))
    words[rng.random((3000, 8)) < 0.5] = 0  # plenty of zero runs of every length and place
    words[:4] = [[0] * 8, [0] * 5 + [0xFFFF, 0x0102, 0x0304], [0] * 6 + [0x0102, 0x0304], [0] * 7 + [1]]
    hi = np.zeros(len(words), np.uint64)
    lo = np.zeros(len(words), np.uint64)
    for k in range(4):
        hi = (hi << np.uint64(16)) | words[:, k].astype(np.uint64)
        lo = (lo << np.uint64(16)) | words[:, 4 + k].astype(np.uint64)
    expected = [socket.inet_ntop(socket.AF_INET6, int(h).to_bytes(8, "big") + int(lo_).to_bytes(8, "big"))
                for h, lo_ in zip(hi, lo)]
    assert _format_one_field(addresses.KIND_IP, lo, hi) == expected
    assert expected[1] == "::ffff:1.2.3.4"


def test_numba_decimal_and_mac_text():
    vals = np.array([0, 9, 10, 255, 65535, 2**32 - 1, 2**64 - 1], np.uint64)
    assert _format_one_field(addresses.KIND_UINT, vals) == [str(int(v)) for v in vals]
    assert _format_one_field(addresses.KIND_INT, np.array([-5, 0, 2**62], np.int64).view(np.uint64)) == \
        ["-5", "0", str(2**62)]
    macs = np.array([0, 0x0A1B2C3D4E5F, 2**48 - 1], np.uint64)
    assert _format_one_field(addresses.KIND_MAC, macs) == ["00:00:00:00:00:00", "0a:1b:2c:3d:4e:5f",
                                                            "ff:ff:ff:ff:ff:ff"]
    v4 = np.array([0xFFFF_0000_0000 | 0x0A000001, 0xFFFF_0000_0000 | 0xFFFFFFFF], np.uint64)
    assert _format_one_field(addresses.KIND_IP, v4, ipver=4) == ["10.0.0.1", "255.255.255.255"]


def test_verbose_count_is_of_the_packets_printed(capture_file):
    """`-v decode --limit N` reported the reader's whole first batch (65536 packets for a
    large capture); the count and the reasons are those of the rows printed."""
    import sys

    from tests.tools.resuming import run_here

    # in this process (`run_here`): the command's exit code, stdout and stderr lines
    res = run_here([sys.executable, "-m", "tools.cli", "-v", "decode", str(capture_file),
                    "--limit", "2"], check=False)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 1 + 2
    assert "2 packets printed (--limit 2), reasons {'ok': 2}" in res.stderr, res.stderr
    # news is not labelled a warning (nor INFO)
    assert "oopscope: " + str(capture_file) in res.stderr and "INFO" not in res.stderr
    res = run_here([sys.executable, "-m", "tools.cli", "-v", "decode", str(capture_file)])
    total = len(PACKETS) + 1
    assert f"{total} packets printed, reasons" in res.stderr
    assert "'non_ip_ethertype': 1" in res.stderr     # the ARP frame, the last ones too


@pytest.mark.parametrize("flags,py4j", [([], "WARNING"), (["-v"], "WARNING"),
                                        (["-vv"], "WARNING"), (["-vvv"], "DEBUG")])
def test_py4j_bridge_chatter_only_with_vvv(capture_file, flags, py4j):
    """`-v` printed every call of the Python-JVM bridge ("Received command c on object id
    p0"): its loggers stay at WARNING unless -vvv (-vv's timings would measure them)."""
    import sys

    code = ("import logging\nfrom tools.cli import main\n"
            f"main({[*flags, 'decode', str(capture_file), '--limit', '0']!r})\n"
            "log = logging.getLogger('py4j.clientserver')\n"
            "print(logging.getLevelName(log.getEffectiveLevel()))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[-1] == py4j
