"""The traffic generator (`oopscope gen`, tools.gen.traffic, tools.gen.pcapwrite) checked against tshark, dpkt and scapy."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from dataclasses import replace

import dpkt
import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import require_tool
from tools.cli import cli
from tools.gen.traffic import (
    NS,
    TrafficConfig,
    build_frames,
    flow_table,
    generate,
    link_packets,
    manifest_path,
    write_pcap,
)

#: small chunks, so the per-flow state and the disorder carry cross chunk boundaries
CHUNK = 1000
MIXED = TrafficConfig(packets=3000, duration_ns=30 * NS, groups=60, flows=240, tcp=0.7, udp=0.25, icmp=0.05,
                      ipv6=0.25, reverse=0.4, seed=7)


def _ns(text: str) -> int:
    sec, _, frac = text.partition(".")
    return int(sec) * NS + int(frac.ljust(9, "0")[:9])


def _ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def _addr(hi, lo, version) -> list[int]:
    """Integers of the addresses in the columns (IPv4 as 32-bit values, IPv6 as 128-bit)."""
    return [int(lo) & 0xFFFFFFFF if v == 4 else (int(h) << 64) | int(lo) for h, lo, v in zip(hi, lo, version)]


def tshark_fields(path, fields: list[str], *options: str) -> list[dict[str, str]]:
    tshark = require_tool("tshark")
    cmd = [tshark, "-r", str(path), "-n", "-T", "fields", "-E", "separator=\t", "-E", "occurrence=f"]
    for o in options:
        cmd += ["-o", o]
    for f in fields:
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [dict(zip(fields, line.split("\t"))) for line in out.splitlines()]


def _iter_with_headers(path):
    """(ts_ns, frame bytes, (caplen, wire len)) per record, read with dpkt's pcap header classes."""
    with open(path, "rb") as fh:
        data = fh.read()
    fh_hdr = dpkt.pcap.FileHdr(data[:24])
    nano = fh_hdr.magic == dpkt.pcap.TCPDUMP_MAGIC_NANO
    off = 24
    while off < len(data):
        ph = dpkt.pcap.LEPktHdr(data[off:off + 16])
        frac = ph.tv_usec if nano else ph.tv_usec * 1000
        yield ph.tv_sec * NS + frac, data[off + 16:off + 16 + ph.caplen], (ph.caplen, ph.len)
        off += 16 + ph.caplen


@pytest.fixture(scope="session")
def mixed(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "mixed.pcap"
    paths = generate(MIXED, out, chunk=CHUNK)
    return paths["l0"], link_packets(MIXED, 0, chunk=CHUNK)


def test_tshark_reads_every_field(mixed):
    path, cols = mixed
    rows = tshark_fields(path, [
        "frame.time_epoch", "frame.len", "frame.cap_len", "eth.type", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst",
        "ip.proto", "ipv6.nxt", "ip.len", "ipv6.plen", "ip.ttl", "ipv6.hlim", "tcp.srcport", "tcp.dstport",
        "udp.srcport", "udp.dstport", "tcp.flags", "tcp.seq_raw", "tcp.ack_raw", "tcp.hdr_len", "udp.length",
        "icmp.type", "icmpv6.type", "ip.checksum.status", "tcp.checksum.status", "udp.checksum.status",
        "icmp.checksum.status", "icmpv6.checksum.status", "_ws.malformed"],
        "tcp.check_checksum:TRUE", "udp.check_checksum:TRUE", "ip.check_checksum:TRUE")
    n = len(cols["len"])
    assert len(rows) == n == MIXED.packets
    v4 = cols["ipversion"] == 4
    got = {
        "ts": [_ns(r["frame.time_epoch"]) for r in rows],
        "len": [int(r["frame.len"]) for r in rows],
        "caplen": [int(r["frame.cap_len"]) for r in rows],
        "src": [_ip(r["ip.src"] or r["ipv6.src"]) for r in rows],
        "dst": [_ip(r["ip.dst"] or r["ipv6.dst"]) for r in rows],
        "proto": [int(r["ip.proto"] or r["ipv6.nxt"]) for r in rows],
        "ip_len": [int(r["ip.len"]) if r["ip.len"] else int(r["ipv6.plen"]) + 40 for r in rows],
        "ttl": [int(r["ip.ttl"] or r["ipv6.hlim"]) for r in rows],
        "sport": [int(r["tcp.srcport"] or r["udp.srcport"] or 0) for r in rows],
        "dport": [int(r["tcp.dstport"] or r["udp.dstport"] or 0) for r in rows],
    }
    assert got["ts"] == cols["timestamp"].tolist()
    assert got["len"] == cols["len"].tolist()
    assert got["caplen"] == cols["caplen"].tolist()
    assert got["src"] == _addr(cols["srcIP_hi"], cols["srcIP_lo"], cols["ipversion"])
    assert got["dst"] == _addr(cols["destIP_hi"], cols["destIP_lo"], cols["ipversion"])
    assert got["proto"] == cols["protocol"].tolist()
    assert got["ip_len"] == cols["ip_len"].tolist()
    assert got["ttl"] == cols["ttl"].tolist()
    assert got["sport"] == cols["srcPort"].tolist()
    assert got["dport"] == cols["destPort"].tolist()
    tcp = np.flatnonzero(cols["protocol"] == 6)
    assert [int(rows[i]["tcp.flags"], 16) for i in tcp] == cols["flags"][tcp].tolist()
    assert [int(rows[i]["tcp.seq_raw"]) for i in tcp] == cols["seq"][tcp].tolist()
    assert [int(rows[i]["tcp.ack_raw"]) for i in tcp] == cols["ack"][tcp].tolist()
    assert {rows[i]["tcp.hdr_len"] for i in tcp} == {"20"}
    udp = np.flatnonzero(cols["protocol"] == 17)
    assert [int(rows[i]["udp.length"]) for i in udp] == (cols["ip_len"][udp] - np.where(v4[udp], 20, 40)).tolist()
    icmp = np.flatnonzero((cols["protocol"] == 1) | (cols["protocol"] == 58))
    assert len(icmp) and [int(rows[i]["icmp.type"] or rows[i]["icmpv6.type"]) for i in icmp] == cols["icmp_type"][icmp].tolist()
    # every checksum tshark can verify is good (1), none bad (0); nothing malformed
    for key in ("ip.checksum.status", "tcp.checksum.status", "udp.checksum.status", "icmp.checksum.status",
                "icmpv6.checksum.status"):
        seen = {r[key] for r in rows if r[key]}
        assert seen == {"1"}, (key, seen)
    assert not any(r["_ws.malformed"] for r in rows)
    assert set(cols["ipversion"].tolist()) == {4, 6}


def test_dpkt_reads_identical_packets(mixed):
    path, cols = mixed
    recs = list(_iter_with_headers(path))
    assert len(recs) == len(cols["len"])
    for i, (ts, buf, (caplen, wire)) in enumerate(recs):
        assert ts == cols["timestamp"][i] and caplen == cols["caplen"][i] and wire == cols["len"][i]
        eth = dpkt.ethernet.Ethernet(buf)
        ip = eth.data
        if cols["ipversion"][i] == 4:
            assert isinstance(ip, dpkt.ip.IP) and ip.hl == 5 and ip.len == cols["ip_len"][i]
            assert int.from_bytes(ip.src, "big") == cols["srcIP_lo"][i] & 0xFFFFFFFF
            hdr = buf[14:34]
            s = sum(int.from_bytes(hdr[j:j + 2], "big") for j in range(0, 20, 2))
            while s >> 16:
                s = (s & 0xFFFF) + (s >> 16)
            assert s == 0xFFFF, f"IPv4 header checksum of packet {i}"
        else:
            assert isinstance(ip, dpkt.ip6.IP6) and ip.plen + 40 == cols["ip_len"][i]
            assert int.from_bytes(ip.dst, "big") == (int(cols["destIP_hi"][i]) << 64) | int(cols["destIP_lo"][i])
        t = ip.data
        if cols["protocol"][i] == 6:
            assert isinstance(t, dpkt.tcp.TCP) and t.off == 5 and t.flags == cols["flags"][i]
            assert (t.sport, t.dport, t.seq, t.ack) == (cols["srcPort"][i], cols["destPort"][i], cols["seq"][i], cols["ack"][i])
        elif cols["protocol"][i] == 17:
            assert isinstance(t, dpkt.udp.UDP) and t.ulen == cols["ip_len"][i] - (20 if cols["ipversion"][i] == 4 else 40)
            assert (t.sport, t.dport) == (cols["srcPort"][i], cols["destPort"][i])


def test_scapy_agrees_on_a_snapped_capture(tmp_path):
    from scapy.utils import RawPcapReader

    cfg = TrafficConfig(packets=400, groups=20, flows=40, ipv6=0.5, snaplen=64, sizes="bimodal", seed=2)
    path = generate(cfg, tmp_path / "snap.pcap")["l0"]
    cols = link_packets(cfg, 0)
    got = [(meta.caplen, meta.wirelen, len(data)) for data, meta in RawPcapReader(str(path))]
    assert [g[0] for g in got] == np.minimum(cols["len"], 64).tolist()
    assert [g[1] for g in got] == cols["len"].tolist()
    assert all(c == n for c, _, n in got)
    assert max(cols["len"]) == 1514 and min(cols["caplen"]) >= 60


def test_tcp_connections_have_syn_synack_fin(mixed):
    path, cols = mixed
    rows = tshark_fields(path, ["ip.src", "ipv6.src", "ip.dst", "ipv6.dst", "tcp.srcport", "tcp.dstport", "tcp.flags"])
    conns: dict[tuple, list[tuple[bool, int]]] = {}
    for r in rows:
        if not r["tcp.flags"]:
            continue
        a = (r["ip.src"] or r["ipv6.src"], int(r["tcp.srcport"]))
        b = (r["ip.dst"] or r["ipv6.dst"], int(r["tcp.dstport"]))
        key = tuple(sorted([a, b]))
        conns.setdefault(key, [])
        first = conns[key][0][2] if conns[key] else a
        conns[key].append((a == first, int(r["tcp.flags"], 16), first))
    assert len(conns) == int(np.sum(flow_table(MIXED).protocol == 6))
    bidir_seen = 0
    for pkts in conns.values():
        assert pkts[0][:2] == (True, 0x02)               # SYN from the client
        mid = pkts[1:]
        if len(pkts) >= 2 and not pkts[1][0]:
            bidir_seen += 1
            assert pkts[1][1] == 0x12                    # SYN-ACK from the server
            mid = pkts[2:]
        if len(pkts) >= 2 and mid:
            assert mid[-1][1] == 0x11                    # FIN|ACK last
            assert {f for _, f, _ in mid[:-1]} <= {0x10, 0x18}
    assert bidir_seen > 0


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    runner = CliRunner()
    args = ["-n", "2000", "--groups", "50", "--flows", "100", "--ipv6", "0.2", "--reverse", "0.3",
            "--disorder", "band", "--max-delay", "2s"]
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        res = runner.invoke(cli, ["gen", str(tmp_path / f"{name}.pcap"), *args, "--seed", str(seed)])
        assert res.exit_code == 0, res.output
    a, b, c = ((tmp_path / f"{x}.pcap").read_bytes() for x in "abc")
    assert a == b and a != c and len(a) > 2000 * 60


@pytest.mark.parametrize("reverse", [0.0, 0.5])
def test_group_and_flow_counts_are_exact(tmp_path, reverse):
    cfg = TrafficConfig(packets=6000, groups=500, flows=2000, ipv6=0.2, icmp=0.05, reverse=reverse, seed=11)
    path = generate(cfg, tmp_path / "c.pcap")["l0"]
    pairs, tuples = set(), set()
    for _, buf, _ in _iter_with_headers(path):
        ip = dpkt.ethernet.Ethernet(buf).data
        t = ip.data
        sp, dp = (t.sport, t.dport) if isinstance(t, (dpkt.tcp.TCP, dpkt.udp.UDP)) else (0, 0)
        a, b = (ip.src, sp), (ip.dst, dp)
        proto = ip.p if isinstance(ip, dpkt.ip.IP) else ip.nxt
        if reverse:       # count connections, not directions
            a, b = sorted([a, b])
        pairs.add((a[0], b[0]))
        tuples.add((a, b, proto))
    assert len(pairs) == 500
    assert len(tuples) == 2000
    man = json.loads(manifest_path(tmp_path / "c.pcap").read_text())
    assert man["groups"] == 500 and man["flows"] == 2000 and man["links"][0]["flows_present"] == 2000
    if reverse:
        assert man["links"][0]["directed_pairs"] > 500


def test_band_disorder_stays_within_the_delay(tmp_path):
    delay = 3 * NS
    cfg = TrafficConfig(packets=20000, duration_ns=60 * NS, groups=100, disorder="band", max_delay_ns=delay,
                        disorder_share=0.3, seed=4)
    path = generate(cfg, tmp_path / "band.pcap", chunk=CHUNK)["l0"]
    ts = np.array([int(r["frame.time_epoch"].replace(".", "")) for r in tshark_fields(path, ["frame.time_epoch"])])
    runmax = np.maximum.accumulate(ts)
    lateness = runmax - ts
    assert lateness.max() <= delay
    assert lateness.max() > delay // 2               # the model does make packets late
    assert 0.1 < np.mean(lateness > 0) < 0.5         # about the share asked for
    assert sorted(ts.tolist()) != ts.tolist()
    # the same packets as without disorder, only in another order
    ordered = link_packets(replace(cfg, disorder="none", max_delay_ns=0), 0, chunk=CHUNK)
    banded = link_packets(cfg, 0, chunk=CHUNK)
    assert np.array_equal(banded["timestamp"], ts)
    def rows(c):
        return sorted(zip(c["timestamp"].tolist(), c["flow"].tolist(), c["ip_id"].tolist(), c["len"].tolist()))
    assert rows(banded) == rows(ordered)


def test_block_sorted_disorder(tmp_path):
    block = 5 * NS
    cfg = TrafficConfig(packets=5000, duration_ns=60 * NS, groups=100, disorder="block", block_ns=block, seed=4)
    path = generate(cfg, tmp_path / "block.pcap", chunk=CHUNK)["l0"]
    ts = np.array([ts for ts, _, _ in _iter_with_headers(path)])
    blk = ts // block
    assert np.all(np.diff(blk) >= 0)                 # blocks in order, each block contiguous
    assert len(np.unique(blk)) >= 12
    inside = [np.all(np.diff(ts[blk == b]) >= 0) for b in np.unique(blk)]
    assert not any(inside[1:-1])                     # shuffled within every full block
    ordered = link_packets(replace(cfg, disorder="none", block_ns=0), 0, chunk=CHUNK)
    assert sorted(ts.tolist()) == ordered["timestamp"].tolist()


def test_links_skew_lulls_and_quiet_link(tmp_path):
    out = tmp_path / "multi.pcap"
    res = CliRunner().invoke(cli, ["gen", str(out), "--rate", "200", "--duration", "1min", "--links", "3",
                                   "--skew", "10s", "--quiet-link", "2", "--quiet-rate", "2", "--lulls", "2",
                                   "--lull", "8s", "--groups", "40", "--seed", "3"])
    assert res.exit_code == 0, res.output
    man = json.loads(manifest_path(out).read_text())
    files = [tmp_path / f"multi-l{i}.pcap" for i in range(3)]
    assert man["files"] == [str(f) for f in files]
    start = MIXED.start_ns
    for i, f in enumerate(files):
        ts = np.array([t for t, _, _ in _iter_with_headers(f)])
        assert len(ts) == (12000 if i < 2 else 120) == man["links"][i]["packets"]
        lo = start - i * 10 * NS
        assert ts.min() >= lo and ts.max() < lo + 60 * NS
        assert man["links"][i]["skew_ns"] == i * 10 * NS
        if i < 2:
            assert abs(np.median(ts) - (lo + 30 * NS)) < 3 * NS
            assert man["links"][i]["lulls_ns"] == []
    gaps = man["links"][2]["lulls_ns"]
    ts2 = np.array([t for t, _, _ in _iter_with_headers(files[2])])
    assert len(gaps) == 2
    for a, b in gaps:
        assert b - a >= 8 * NS - 1000
        assert not np.any((ts2 >= a) & (ts2 < b))
    # the quiet link is silent in the gaps but not elsewhere: the longest silence is a lull
    assert np.diff(np.sort(ts2)).max() >= 8 * NS - 1000


def test_rate_duration_and_start(tmp_path):
    out = tmp_path / "rate.pcap"
    res = CliRunner().invoke(cli, ["gen", str(out), "--rate", "1k", "--duration", "5s", "--groups", "10",
                                   "--start", "2025-03-01T10:00:00Z", "-q"])
    assert res.exit_code == 0, res.output
    ts = np.array([t for t, _, _ in _iter_with_headers(out)])
    start = 1_740_823_200 * NS                       # 2025-03-01T10:00:00Z
    assert len(ts) == 5000 and ts.min() >= start and ts.max() < start + 5 * NS
    assert json.loads(manifest_path(out).read_text())["config"]["duration_ns"] == 5 * NS


def test_nanosecond_timestamps(tmp_path):
    cfg = TrafficConfig(packets=500, duration_ns=5 * NS, groups=10, nanosecond=True, seed=1)
    path = generate(cfg, tmp_path / "ns.pcap")["l0"]
    data = path.read_bytes()
    assert int.from_bytes(data[:4], "little") == 0xA1B23C4D
    rows = tshark_fields(path, ["frame.time_epoch"])
    got = [_ns(r["frame.time_epoch"]) for r in rows]
    assert got == link_packets(cfg, 0)["timestamp"].tolist()
    assert any(t % 1000 for t in got)                # really sub-microsecond


def test_write_pcap_against_scapy_frames(tmp_path):
    from scapy.all import ICMP, IP, TCP, UDP, Ether, Raw, rdpcap

    pkts = [Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / TCP(sport=1, dport=2, flags="S"),
            Ether() / IP() / UDP(sport=53, dport=53) / Raw(b"x" * 300),
            Ether() / IP() / ICMP()]
    raw = [bytes(p) for p in pkts]
    width = 80                                       # shorter than the UDP frame: the rest must be zeros
    frames = np.zeros((3, width), np.uint8)
    for i, r in enumerate(raw):
        frames[i, :min(width, len(r))] = np.frombuffer(r[:width], np.uint8)
    wire = np.array([len(r) for r in raw])
    ts = np.array([1_700_000_000_123_456_000, 1_700_000_001_000_000_000, 1_700_000_002_999_999_000])
    write_pcap(tmp_path / "w.pcap", ts, frames, wire, snaplen=200)
    back = rdpcap(str(tmp_path / "w.pcap"))
    assert [int(round(float(p.time) * 1e6)) for p in back] == (ts // 1000).tolist()
    assert bytes(back[0]) == raw[0] and bytes(back[2]) == raw[2]
    assert bytes(back[1]) == raw[1][:width] + bytes(200 - width)
    assert [p.wirelen for p in back] == wire.tolist()
    with pytest.raises(ValueError):
        write_pcap(tmp_path / "bad.pcap", ts, frames, wire, caplen=wire + 1)


def test_build_frames_is_what_the_file_holds(mixed):
    path, cols = mixed
    frames = build_frames(cols)
    for i, (_, buf, (caplen, _)) in enumerate(_iter_with_headers(path)):
        k = min(caplen, frames.shape[1])
        assert buf[:k] == frames[i, :k].tobytes()
        assert buf[k:] == bytes(caplen - k)


def _oopscope(*args):
    """The command line's exit code and output, run in this process (`run_here`)."""
    from tests.tools.resuming import run_here

    return run_here([sys.executable, "-m", "tools.cli", *args], check=False)


@pytest.mark.parametrize("args, status, message", [
    (["--groups", "10", "--flows", "5"], 2, "more groups (10) than flows (5)"),
    (["-n", "100", "--groups", "500"], 2, "more flows (500) than packets"),
    (["--duration", "10parsecs"], 2, "unknown duration unit"),
    (["--disorder", "band"], 2, "maximum delay"),
    (["-n", "10", "--rate", "5", "--duration", "1min", "--groups", "2"], 2, "disagree"),
    (["--sizes", "huge"], 2, "packet-size spec"),
    (["--links", "2", "--quiet-link", "5"], 2, "quiet link 5 does not exist"),
])
def test_cli_usage_errors(tmp_path, args, status, message):
    res = CliRunner().invoke(cli, ["gen", str(tmp_path / "e.pcap"), *args])
    assert res.exit_code == status, res.output
    assert message in res.output and isinstance(res.exception, SystemExit)
    assert not (tmp_path / "e.pcap").exists()


def test_cli_unwritable_output_is_a_runtime_error(tmp_path):
    (tmp_path / "file").write_text("")          # a folder cannot be made under a file
    res = _oopscope("gen", str(tmp_path / "file" / "dir.pcap"), "-n", "100", "--groups", "10")
    assert res.returncode == 1
    assert "cannot write" in res.stderr and "dir.pcap" in res.stderr and "Traceback" not in res.stderr


def test_cli_help_and_summary(tmp_path):
    res = _oopscope("gen", "--help")
    assert res.returncode == 0 and "--disorder" in res.stdout and "--skew" in res.stdout
    res = _oopscope("gen", str(tmp_path / "s.pcap"), "-n", "1k", "--groups", "20")
    assert res.returncode == 0 and res.stdout == ""
    assert "1,000 packets" in res.stderr and res.stderr.count("\n") == 1


def test_our_reader_decodes_generated_captures_like_tshark(mixed, tmp_path):
    """capture.reader.read_all on generated files: every column as generated, and as tshark reads it."""
    from capture.reader import read_all
    from capture.schema import COLUMNS, L_ETH, L_ICMP, L_IPV4, L_IPV6, L_TCP, L_UDP

    bench = TrafficConfig(packets=4000, groups=300, tcp=0.6, udp=0.4, icmp=0.0, snaplen=64, sizes="imix", seed=9)
    snapped = generate(bench, tmp_path / "bench64.pcap")["l0"]
    for path, cols in ((mixed[0], mixed[1]), (snapped, link_packets(bench, 0))):
        batch = read_all(path)
        assert batch.n == len(cols["len"])
        for c in COLUMNS:
            if c.name in cols:
                assert np.array_equal(batch[c.name], cols[c.name].astype(c.dtype)), c.name
        assert not batch["reason"].any() and not batch["vlan"].any() and not batch["is_fragment"].any()
        proto = cols["protocol"]
        want_layers = (L_ETH | np.where(cols["ipversion"] == 4, L_IPV4, L_IPV6)
                       | np.where(proto == 6, L_TCP, np.where(proto == 17, L_UDP, L_ICMP)))
        assert np.array_equal(batch["layers"], want_layers.astype(np.uint16))
        rows = tshark_fields(path, ["frame.time_epoch", "ip.src", "ipv6.src", "ip.dst", "ipv6.dst",
                                    "tcp.srcport", "udp.srcport", "tcp.dstport", "udp.dstport", "tcp.flags",
                                    "frame.len", "frame.cap_len"])
        assert [_ns(r["frame.time_epoch"]) for r in rows] == batch["timestamp"].tolist()
        assert [_ip(r["ip.src"] or r["ipv6.src"]) for r in rows] == _addr(batch["srcIP_hi"], batch["srcIP_lo"], batch["ipversion"])
        assert [_ip(r["ip.dst"] or r["ipv6.dst"]) for r in rows] == _addr(batch["destIP_hi"], batch["destIP_lo"], batch["ipversion"])
        assert [int(r["tcp.srcport"] or r["udp.srcport"] or 0) for r in rows] == batch["srcPort"].tolist()
        assert [int(r["tcp.dstport"] or r["udp.dstport"] or 0) for r in rows] == batch["destPort"].tolist()
        assert [int(r["tcp.flags"] or "0", 16) for r in rows] == batch["flags"].tolist()
        assert [int(r["frame.len"]) for r in rows] == batch["len"].tolist()
        assert [int(r["frame.cap_len"]) for r in rows] == batch["caplen"].tolist()
