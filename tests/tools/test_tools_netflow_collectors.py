"""NetFlow v5 / v9 / IPFIX export of a real capture's flows, read back by nfcapd/nfdump, tshark
and the PyPI `netflow` package: every record and field equal to ours, no sequence failures."""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import nfcapd, require_tool
from tools.netflow.exporter import Exporter, make_encoder
from tools.netflow.records import address_text, from_table

CAPTURE = "skype.pcap"  # IPv4 and IPv6 (mDNS) flows, TCP, UDP, ICMP and other protocols
VERSIONS = (5, 9, 10)


def _reference_flows(path: Path) -> pa.Table:
    """Flow records per 5-tuple and minute with pandas (an oracle independent of the query)."""
    from capture.reader import read_all

    c = read_all(path).columns
    ip = (c["ipversion"] == 4) | (c["ipversion"] == 6)
    df = pd.DataFrame({k: c[k][ip] for k in ("timestamp", "srcIP_hi", "srcIP_lo", "destIP_hi",
                                             "destIP_lo", "srcPort", "destPort", "protocol",
                                             "ip_len", "flags", "tos", "ipversion", "vlan",
                                             "icmp_type", "icmp_code")})
    ported = df.protocol.isin([6, 17])
    df.loc[~ported, ["srcPort", "destPort"]] = 0
    icmp = df.protocol.isin([1, 58])  # NetFlow's convention: destPort = type * 256 + code
    df.loc[icmp, "destPort"] = (df.icmp_type[icmp].astype(np.uint16) * 256 + df.icmp_code[icmp])
    df.loc[df.protocol != 6, "flags"] = 0
    df["tb"] = df.timestamp // 60_000_000_000
    keys = ["tb", "srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo", "srcPort", "destPort",
            "protocol", "ipversion", "vlan"]
    r = df.groupby(keys, sort=True).agg(
        packets=("timestamp", "size"), bytes=("ip_len", "sum"),
        first_ns=("timestamp", "min"), last_ns=("timestamp", "max"),
        tcp_flags=("flags", lambda s: np.bitwise_or.reduce(s.values)),
        tos=("tos", lambda s: np.bitwise_or.reduce(s.values))).reset_index()
    r["srcIP"] = address_text(r.srcIP_hi.to_numpy(np.uint64), r.srcIP_lo.to_numpy(np.uint64))
    r["destIP"] = address_text(r.destIP_hi.to_numpy(np.uint64), r.destIP_lo.to_numpy(np.uint64))
    r["end_reason"] = 2
    cols = ["tb", "srcIP", "destIP", "srcPort", "destPort", "protocol", "packets", "bytes",
            "first_ns", "last_ns", "tcp_flags", "tos", "vlan", "ipversion", "end_reason"]
    return pa.Table.from_pandas(r[cols], preserve_index=False)


def _query_flows(path: Path) -> pa.Table | None:
    """The shipped `netflow` query's rows by the reference evaluator (None if it has none)."""
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    text = (Path(__file__).resolve().parents[2] / "queries/library/netflow.gsql").read_text()
    plan = plan_text(text, ["main"])
    if "netflow" not in [q.name for q in plan.queries]:
        return None
    frame = evaluate_file(plan, {"main": read_all(path, link="main")})["netflow"]
    rec = from_table(frame)
    # as `oopscope run` writes them: addresses as text
    return pa.table({**{c: frame[c].to_numpy() for c in frame.columns
                        if c not in ("srcIP", "destIP")},
                     "srcIP": address_text(rec.src_hi, rec.src_lo),
                     "destIP": address_text(rec.dst_hi, rec.dst_lo)})


@pytest.fixture(scope="session")
def flows(pcaps_dir) -> pa.Table:
    table = _query_flows(pcaps_dir / CAPTURE)
    reference = _reference_flows(pcaps_dir / CAPTURE)
    if table is None:  # before the netflow query: the pandas flows stand in
        table = reference
    # per-5-tuple totals of the query's records equal the independent pandas meter's
    key = ["srcIP", "destIP", "srcPort", "destPort", "protocol"]
    totals = [t.group_by(key).aggregate([("packets", "sum"), ("bytes", "sum")])
              .sort_by([(k, "ascending") for k in key]).to_pylist() for t in (table, reference)]
    assert totals[0] == totals[1]
    assert table.num_rows > 400 and set(table.column("ipversion").to_pylist()) == {4, 6}
    return table


def _expected(flows: pa.Table, version: int) -> list[tuple]:
    """What a collector must decode: (src, dst, sport, dport, proto, pkts, bytes, first ms,
    last ms, flags, tos) per record; v5 carries IPv4 only."""
    d = flows.to_pydict()
    out = []
    for i in range(flows.num_rows):
        if version == 5 and d["ipversion"][i] == 6:
            continue
        out.append((d["srcIP"][i], d["destIP"][i], int(d["srcPort"][i]), int(d["destPort"][i]),
                    int(d["protocol"][i]), int(d["packets"][i]), int(d["bytes"][i]),
                    d["first_ns"][i] // 10**6, d["last_ns"][i] // 10**6, int(d["tcp_flags"][i]),
                    int(d["tos"][i])))
    return sorted(out)


@pytest.fixture(scope="session", params=VERSIONS, ids=lambda v: f"v{v}")
def collected(request, flows, tmp_path_factory):
    """Export `flows` to a fresh nfcapd and to a pcap; (version, nfcapd dir, pcap, port, exporter)."""
    version = request.param
    work = tmp_path_factory.mktemp(f"nf{version}")
    flowdir = work / "flows"
    flowdir.mkdir()
    with nfcapd(flowdir) as port:
        ex = Exporter(f"127.0.0.1:{port}", version, pcap=str(work / "datagrams.pcap"),
                      template_every_messages=8)
        ex.export(flows)
        ex.close()
    return version, flowdir, work / "datagrams.pcap", port, ex


def _nfdump(*args) -> str:
    nfdump = require_tool("nfdump")
    proc = subprocess.run([nfdump, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TZ": "UTC"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _ms(text: str) -> int:
    """nfdump's 'YYYY-MM-DDTHH:MM:SS.mmm' (UTC) as ms since the epoch."""
    return int(pd.Timestamp(text, tz="UTC").value // 10**6)


_FLAGS = "CEUAPRSF"


def _flag_bits(text: str) -> int:
    """nfdump's flag string ('...A..S.' or with C/E in front) as bits."""
    text = text.rjust(8, ".")
    return sum(1 << (7 - i) for i, ch in enumerate(text) if ch != ".")


def test_nfcapd_reads_every_record(collected, flows):
    version, flowdir, _, _, ex = collected
    assert ex.stats()["sent"]["failed_datagrams"] == 0
    rows = json.loads(_nfdump("-R", str(flowdir), "-o", "json"))
    got = sorted((r.get("src4_addr") or r["src6_addr"], r.get("dst4_addr") or r["dst6_addr"],
                  r.get("src_port", 0),
                  r.get("dst_port", r.get("icmp_type", 0) * 256 + r.get("icmp_code", 0)), r["proto"], r["in_packets"], r["in_bytes"],
                  _ms(r["first"]), _ms(r["last"]), _flag_bits(r.get("tcp_flags", "")), r["src_tos"])
                 for r in rows if r["type"] == "FLOW")
    assert got == _expected(flows, version)
    if version == 5:
        assert ex.stats()["skipped_ipv6"] == sum(v == 6 for v in flows.column("ipversion").to_pylist())


def test_nfdump_sees_no_sequence_failure(collected, flows):
    version, flowdir, _, _, ex = collected
    info = _nfdump("-R", str(flowdir), "-I")
    assert "Sequence failures: 0" in info, info
    assert f"Flows: {len(_expected(flows, version))}" in info
    assert ex.stats()["datagrams"] > 10  # several datagrams, so the sequence was checked


def _tshark_records(pcap: Path, port: int) -> tuple[list[dict], list[dict]]:
    tshark = require_tool("tshark")
    proc = subprocess.run([tshark, "-r", str(pcap), "-d", f"udp.port=={port},cflow", "-T", "json",
                           "--no-duplicate-keys"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    headers, records = [], []

    def walk(node, head, index):
        for _key, value in node.items():
            if isinstance(value, dict):
                if "cflow.packets" in value:
                    records.append({**value, "_head": head, "_packet": index})
                else:
                    walk(value, head, index)

    for index, pkt in enumerate(json.loads(proc.stdout)):
        layer = pkt["_source"]["layers"]["cflow"]
        head = {k: v for k, v in layer.items() if not isinstance(v, dict)}
        head.update(layer.get("cflow.timestamp_tree", {}))
        headers.append({**head, "_tree": layer})
        walk(layer, head, index)
    return headers, records


def _sec_ms(text: str) -> int:
    return int(Decimal(text) * 1000)


def test_tshark_decodes_every_record(collected, flows):
    version, _, pcap, port, ex = collected
    headers, records = _tshark_records(pcap, port)
    got = []
    for r in records:
        head = r["_head"]
        if version == 10:
            first = _ms(r["cflow.timedelta_tree"]["cflow.abstimestart"].replace(" UTC", ""))
            last = _ms(r["cflow.timedelta_tree"]["cflow.abstimeend"].replace(" UTC", ""))
        else:
            times = r.get("cflow.timedelta_tree", r)
            boot = int(head["cflow.unix_secs"]) * 1000 + int(head.get("cflow.unix_nsecs", 0)) // 10**6 \
                - _sec_ms(head["cflow.sysuptime"])
            first = boot + _sec_ms(times["cflow.timestart"])
            last = boot + _sec_ms(times["cflow.timeend"])
        got.append((r.get("cflow.srcaddr") or r["cflow.srcaddrv6"],
                    r.get("cflow.dstaddr") or r["cflow.dstaddrv6"],
                    int(r["cflow.srcport"]), int(r["cflow.dstport"]), int(r["cflow.protocol"]),
                    int(r["cflow.packets"]), int(r["cflow.octets"]), first, last,
                    int(r["cflow.tcpflags"], 16), int(r["cflow.tos"], 16)))
    assert sorted(got) == _expected(flows, version)
    assert len(headers) == ex.stats()["datagrams"]
    # tshark's own sequence analysis flags a gap with expected_sn; there must be none
    assert "expected_sn" not in json.dumps([h["_tree"] for h in headers])
    if version == 9:
        # count = every record of every kind: template, options template, options data, data
        for h in headers:
            tree = h["_tree"]
            n = 0
            for key, value in tree.items():
                if key.startswith("FlowSet") and isinstance(value, dict):
                    if value["cflow.flowset_id"] in ("0", "1"):
                        n += sum(k.startswith("Template") for k in value) or 1
                    else:
                        n += sum(k.startswith("Flow ") for k in value)
            assert int(tree["cflow.count"]) == n
        seqs = [int(h["cflow.sequence"]) for h in headers]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    if version == 10:
        seqs = [int(h["cflow.sequence"]) for h in headers]
        sizes = np.bincount([r["_packet"] for r in records], minlength=len(headers))
        assert seqs[1:] == list(np.cumsum(sizes)[:-1] + seqs[0])


def test_pypi_netflow_decodes_every_record(flows):
    netflow = pytest.importorskip("netflow", reason="pip install netflow (the test extra)")
    rec = from_table(flows)
    for version in VERSIONS:
        enc = make_encoder(version, 1472)
        templates = {"netflow": {}, "ipfix": {}}
        got = []
        for payload, _, _ in enc.encode(rec):
            packet = netflow.parse_packet(payload, templates)
            assert packet.header.version == version
            for f in packet.flows:
                d = f.data
                if version == 5:
                    got.append((d["IPV4_SRC_ADDR"], d["IN_PACKETS"], d["IN_OCTETS"], d["PROTO"],
                                d["SRC_PORT"], d["DST_PORT"], d["TCP_FLAGS"]))
                elif version == 9:
                    if "SAMPLING_INTERVAL" in d:
                        continue
                    src = d.get("IPV4_SRC_ADDR") or d["IPV6_SRC_ADDR"]
                    got.append((src, d["IN_PKTS"], d["IN_BYTES"], d["PROTOCOL"],
                                d["L4_SRC_PORT"], d["L4_DST_PORT"], d["TCP_FLAGS"]))
                else:
                    src = d.get("sourceIPv4Address") or d["sourceIPv6Address"]
                    got.append((src, d["packetDeltaCount"], d["octetDeltaCount"],
                                d["protocolIdentifier"], d["sourceTransportPort"],
                                d["destinationTransportPort"], d["tcpControlBits"]))
        want = [(s, p, b, pr, sp, dp, fl) for s, _, sp, dp, pr, p, b, _, _, fl, _
                in _expected(flows, version)]
        norm = []
        for src, *rest in got:  # the package gives v5 addresses as ints, v9 as text, IPFIX v6 as int
            if isinstance(src, int):
                src = address_text(np.array([0 if src < 2**32 else src >> 64], np.uint64),
                                   np.array([(0xFFFF_0000_0000 | src) if src < 2**32
                                             else src & (2**64 - 1)], np.uint64))[0]
            norm.append((src, *rest))
        assert sorted(norm) == sorted(want), f"v{version}"
