"""NetFlow encoders on synthetic edge cases (decoded with struct / the PyPI `netflow` package),
the UDP sender against a closed port, the sink, and `oopscope export netflow`."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tools.errors import NetflowInputError, NetflowTargetError
from tools.netflow.exporter import make_encoder
from tools.netflow.records import from_table
from tools.netflow.sender import UdpSender, parse_target
from tools.results.netflow import NetflowSink

U32 = 2**32 - 1
T0 = 1_431_969_641_947_000_000  # 2015-05-18: capture time, far from the wall clock


def table(n: int, v6_every: int = 0, **override) -> pa.Table:
    i = np.arange(n)
    src = [f"2001:db8::{k:x}" if v6_every and k % v6_every == 0 else f"10.0.{k // 256}.{k % 256}"
           for k in range(n)]
    cols = {"tb": T0 // 60_000_000_000 + i // 1000, "srcIP": src,
            "destIP": ["2001:db8::1:2" if ":" in s else "192.0.2.7" for s in src],
            "srcPort": 1024 + i, "destPort": np.full(n, 443), "protocol": np.full(n, 6),
            "packets": 1 + i, "bytes": 60 * (1 + i), "first_ns": T0 + i * 1_000_000_123,
            "last_ns": T0 + i * 1_000_000_123 + 5_500_000_000, "tcp_flags": np.full(n, 0x1B),
            "tos": np.full(n, 0x10), "vlan": np.full(n, 7),
            "ipversion": [6 if ":" in s else 4 for s in src], "end_reason": np.full(n, 3)}
    cols.update(override)
    return pa.table(cols)


def v5_records(payload: bytes):
    version, count, uptime, secs, nsecs, seq = struct.unpack(">HHIIII", payload[:20])
    assert version == 5 and len(payload) == 24 + 48 * count
    rows = [struct.unpack(">IIIHHIIIIHHBBBBHHBBH", payload[24 + 48 * k:72 + 48 * k])
            for k in range(count)]
    return (count, uptime, secs, nsecs, seq), rows


def test_v5_splits_counters_over_32_bits_and_keeps_totals():
    big = table(3, packets=[2**33 + 5, 7, U32], bytes=[3 * 2**32, 420, U32 + 1])
    enc = make_encoder(5, 1472)
    (payload, n, _), = enc.encode(from_table(big))
    _, rows = v5_records(payload)
    # k = max(ceil(pkts/U32), ceil(bytes/U32)): 4 for the first, 1, then 2 for bytes = 2^32
    assert n == len(rows) == 4 + 1 + 2 and enc.stats["split_extra"] == 4
    by_port = {}
    for r in rows:
        assert r[5] <= U32 and r[6] <= U32
        by_port.setdefault(r[9], []).append(r)
    assert [sum(r[5] for r in by_port[p]) for p in (1024, 1025, 1026)] == [2**33 + 5, 7, U32]
    assert [sum(r[6] for r in by_port[p]) for p in (1024, 1025, 1026)] == [3 * 2**32, 420, U32 + 1]
    assert len({(r[7], r[8]) for r in by_port[1024]}) == 1  # same times in every part


def test_v5_skips_ipv6_counts_them_and_numbers_flows():
    t = table(61, v6_every=4)
    enc = make_encoder(5, 1472)
    out = enc.encode(from_table(t))
    n6 = sum(v == 6 for v in t.column("ipversion").to_pylist())
    assert enc.stats["skipped_ipv6"] == n6 == 16
    heads = [v5_records(p)[0] for p, _, _ in out]
    assert [h[0] for h in heads] == [30, 15]
    assert [h[4] for h in heads] == [0, 30]  # flow_sequence = flows exported before
    src = {r[0] for p, _, _ in out for r in v5_records(p)[1]}
    assert all((a >> 24) == 10 for a in src)


@pytest.mark.parametrize("n,expect", [(0, []), (30, [30]), (31, [30, 1])])
def test_v5_thirty_records_a_datagram(n, expect):
    enc = make_encoder(5, 1472)
    out = enc.encode(from_table(table(n)))
    assert [v5_records(p)[0][0] for p, _, _ in out] == expect


def test_v5_times_are_capture_times_consistent_with_the_header():
    t = table(45)
    out = make_encoder(5, 1472).encode(from_table(t))
    first = []
    for p, _, export_ms in out:
        (count, uptime, secs, nsecs, _), rows = v5_records(p)
        boot = secs * 1000 + nsecs // 10**6 - uptime
        assert export_ms == secs * 1000 + nsecs // 10**6
        for r in rows:
            assert boot + r[7] <= boot + r[8] <= export_ms  # export time >= every record's end
            first.append(boot + r[7])
    assert first == [v // 10**6 for v in t.column("first_ns").to_pylist()]
    assert abs(out[0][2] / 1000 - time.time()) > 3 * 365 * 86400  # not the wall clock


def _sets(payload: bytes, header: int) -> list[tuple[int, bytes]]:
    out, pos = [], header
    while pos < len(payload):
        sid, length = struct.unpack(">HH", payload[pos:pos + 4])
        assert length >= 4 and length % 4 == 0  # padded to 4 bytes
        out.append((sid, payload[pos + 4:pos + length]))
        pos += length
    assert pos == len(payload)
    return out


@pytest.mark.parametrize("mtu", [576, 1500, 9000])
def test_v9_count_sequence_and_mtu(mtu):
    t = table(700, v6_every=3)
    enc = make_encoder(9, mtu - 28, template_every_messages=5, template_every_s=10**9)
    out = enc.encode(from_table(t))
    total = 0
    for k, (p, n, _) in enumerate(out):
        assert len(p) <= mtu - 28
        version, count, uptime, secs, seq, source = struct.unpack(">HHIIII", p[:20])
        assert version == 9 and seq == k
        records = 0
        for sid, body in _sets(p, 20):
            if sid == 0:   # two templates: 256 (IPv4), 257 (IPv6)
                records += 2
            elif sid == 1:  # one options template
                records += 1
            elif sid == 258:  # the sampling options record: scope, interval, algorithm
                records += 1
                assert struct.unpack(">IIB", body[:9]) == (0, 1, 1)
            else:
                size = enc.size4 if sid == 256 else enc.size6
                records += len(body) // size
        assert count == records
        assert (k % 5 == 0) == any(sid == 0 for sid, _ in _sets(p, 20))
        total += n
    assert total == 700


def test_templates_are_resent_every_n_seconds_of_export_time():
    t = table(600)  # one record a second: 600 s of capture time
    out = make_encoder(10, 1472, template_every_messages=10**6, template_every_s=120).encode(
        from_table(t))
    sent = [export_ms for p, _, export_ms in out if any(sid == 2 for sid, _ in _sets(p, 16))]
    assert len(sent) >= 4 and all(120_000 <= b - a < 180_000 for a, b in zip(sent, sent[1:]))


def test_ipfix_sequence_counts_data_records_and_options_when_sampled():
    t = table(400, v6_every=5)
    enc = make_encoder(10, 1472, sampling_interval=100, template_every_messages=3)
    out = enc.encode(from_table(t))
    expect_seq = 0
    for k, (p, n, export_ms) in enumerate(out):
        version, length, export_s, seq, domain = struct.unpack(">HHIII", p[:16])
        assert version == 10 and length == len(p) and export_s * 1000 == export_ms
        assert seq == expect_seq
        sets = _sets(p, 16)
        options = sum(1 for sid, _ in sets if sid == 258)
        assert options == (1 if k % 3 == 0 else 0)
        expect_seq += n + options  # an options data record is a data record (RFC 7011)
    netflow = pytest.importorskip("netflow")
    templates = {"netflow": {}, "ipfix": {}}
    got = []
    for p, _, _ in out:
        got += [f.data for f in netflow.parse_packet(p, templates).flows
                if "packetDeltaCount" in f.data]
    assert [d["flowEndReason"] for d in got] == [3] * 400
    assert sorted(d["flowStartMilliseconds"] for d in got) == \
        sorted(v // 10**6 for v in t.column("first_ns").to_pylist())
    assert {d["vlanId"] for d in got} == {7}


def test_records_accept_integer_and_text_addresses_and_name_bad_input():
    ints = from_table(table(3, srcIP=[0x0A000001, 0x0A000002, 0xC0000207]))
    assert ints.src_v4.tolist() == [0x0A000001, 0x0A000002, 0xC0000207]
    assert not ints.is_v6.any()
    text = from_table(table(2, srcIP=["::ffff:10.0.0.1", "2001:db8::5"],
                            destIP=["192.0.2.1", "2001:DB8::6"], ipversion=[4, 6]))
    assert text.is_v6.tolist() == [False, True] and text.src_v4[0] == 0x0A000001
    with pytest.raises(NetflowInputError, match="srcIP.*'10.0.0.300'"):
        from_table(table(1, srcIP=["10.0.0.300"]))
    with pytest.raises(NetflowInputError, match="first_ns"):
        from_table(table(2).drop_columns(["first_ns"]))
    minimal = from_table(table(2).select(["srcIP", "destIP", "srcPort", "destPort", "protocol",
                                          "packets", "bytes", "first_ns", "last_ns"]))
    assert minimal.end_reason.tolist() == [2, 2] and minimal.vlan.tolist() == [0, 0]


@pytest.mark.parametrize("text", ["host", "1.2.3.4:http", "[::1", "[::1]x", "1.2.3.4:0",
                                  ":2055", "1.2.3.4:70000"])
def test_bad_targets_are_named(text):
    with pytest.raises(NetflowTargetError, match="collector"):
        parse_target(text)


def test_parse_target_forms():
    assert parse_target("127.0.0.1:2055") == ("127.0.0.1", 2055)
    assert parse_target("[::1]:4739") == ("::1", 4739)
    assert parse_target("::1", default_port=9995) == ("::1", 9995)


def _closed_port(family=socket.AF_INET, host="127.0.0.1") -> int:
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("family,host", [(socket.AF_INET, "127.0.0.1"),
                                         (socket.AF_INET6, "::1")], ids=["v4", "v6"])
def test_down_collector_counts_failures_and_raises_nothing(family, host):
    try:
        port = _closed_port(family, host)
    except OSError:
        pytest.skip(f"no {host} on this machine")
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sender = UdpSender(target, pace=0)
    datagrams = [(b"x" * 100, 3, 0)] * 20
    for d in datagrams:  # ICMP port unreachable comes back as ECONNREFUSED on a later send
        sender.send([d])
        time.sleep(0.002)
    sender.close()
    s = sender.stats
    assert s.failed_datagrams > 0 and s.errors.get("ECONNREFUSED", 0) == s.failed_datagrams
    assert s.datagrams + s.failed_datagrams == 20
    assert s.records + s.failed_records == 60


def test_sink_sends_each_batch_once_and_survives_a_dead_collector():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(2)
        sink = NetflowSink(f"127.0.0.1:{rx.getsockname()[1]}", 10, pace=0)
        assert sink.write(0, table(50)) is True
        assert sink.write(0, table(50)) is False  # a re-run batch is not sent twice
        assert sink.write(1, table(0)) is True
        size = sink.exporter.encoder.size4
        received = 0
        while received < 50:
            received += sum(len(b) // size for sid, b in _sets(rx.recv(65535), 16) if sid == 256)
        sink.close()
        assert received == 50
        assert sink.stats()["sent"]["records"] == 50
    dead = NetflowSink(f"127.0.0.1:{_closed_port()}", 9, pace=0)
    for batch in range(5):
        assert dead.write(batch, table(40))
        time.sleep(0.002)
    dead.close()
    assert dead.failed() > 0


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_export_command_replays_results_files(tmp_path, fmt):
    t = table(75, v6_every=5)
    path = tmp_path / f"flows.{fmt}"
    if fmt == "csv":
        pacsv.write_csv(t, path)
    elif fmt == "parquet":
        pq.write_table(t, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in t.to_pylist()))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5)
        proc = _cli("export", "netflow", str(path), "--to", f"127.0.0.1:{rx.getsockname()[1]}",
                    "--version", "5", "--pcap", str(tmp_path / "out.pcap"))
        assert proc.returncode == 0, proc.stderr
        assert "60 records" in proc.stderr and "15 IPv6 records skipped" in proc.stderr
        counts = [struct.unpack(">HH", rx.recv(65535)[:4])[1] for _ in range(2)]
    assert counts == [30, 30]
    assert (tmp_path / "out.pcap").stat().st_size == 24 + 2 * (16 + 42) + 2 * (24 + 30 * 48)


def test_export_command_errors_are_one_line(tmp_path):
    bad = tmp_path / "flows.csv"
    bad.write_text("srcIP,destIP\n1.2.3.4,5.6.7.8\n")
    for args, needle in [(["nope.csv", "--to", "127.0.0.1:2055"], "no such results file"),
                         ([str(bad), "--to", "127.0.0.1:2055"], "lack the column"),
                         ([str(bad), "--to", "127.0.0.1"], "is not HOST:PORT")]:
        proc = _cli("export", "netflow", *args)
        assert proc.returncode == 1, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
