"""The flow-record decoder (`capture.flowdecode`) against real exporters and collectors:
softflowd's v5 / v9 / IPFIX and oopscope's own exporter, decoded per 5-tuple equal to nfdump
over the same datagrams; a real capture of v9 datagrams equal to tshark's cflow dissector; the
templates' state across a restart; a fuzz over mutated datagrams (counted, never raised)."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture.addresses import ip_text
from capture.flowdecode import REASONS, FlowDecoder
from capture.flowsource import read_datagrams
from tests.conftest import nfcapd, require_tool

CAPTURE = "skype.pcap"        # IPv4 and IPv6 flows, TCP, UDP, ICMP
KEY = ["src", "dst", "sport", "dport", "proto"]


def softflowd_datagrams(pcap: Path, version: int) -> list[bytes]:
    """What `softflowd -r pcap -v version` sends, received on a socket of ours."""
    exe = require_tool("softflowd")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    # no -c/-p: with a control socket path of its own softflowd -r stays up after EOF
    sf = subprocess.Popen([exe, "-r", str(pcap), "-n", f"127.0.0.1:{port}", "-v", str(version),
                           "-a", "-d", "-6"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sf.wait(timeout=30)
    except subprocess.TimeoutExpired:
        sf.kill()
        sf.wait()
    out = []
    sock.settimeout(1.0)
    try:
        while True:
            out.append(sock.recv(65535))
    except TimeoutError:
        pass
    finally:
        sock.close()
    return out


def nfdump_records(datagrams: list[bytes], tmp: Path, with_first: bool = False) -> pd.DataFrame:
    """The datagrams sent to a real nfcapd, read back with nfdump: one row per record (and
    its flow start and end, ms, `with_first`)."""
    flowdir = tmp / "nfcapd"
    flowdir.mkdir()
    with nfcapd(flowdir) as port, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))
            time.sleep(0.002)                 # nfcapd's socket is not ours to size
    proc = subprocess.run([require_tool("nfdump"), "-R", str(flowdir), "-o", "json"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TZ": "UTC"})
    assert proc.returncode == 0, proc.stderr
    rows = [(r.get("src4_addr") or r["src6_addr"], r.get("dst4_addr") or r["dst6_addr"],
             r.get("src_port", 0),
             r.get("dst_port", r.get("icmp_type", 0) * 256 + r.get("icmp_code", 0)),
             r["proto"], r["in_packets"], r["in_bytes"],
             int(pd.Timestamp(r["first"], tz="UTC").value // 10**6),
             int(pd.Timestamp(r["last"], tz="UTC").value // 10**6))
            for r in json.loads(proc.stdout or "[]") if r["type"] == "FLOW"]
    df = pd.DataFrame(rows, columns=KEY + ["packets", "bytes", "first_ms", "last_ms"])
    return df if with_first else df.drop(columns=["first_ms", "last_ms"])


def decoded(cols: dict) -> pd.DataFrame:
    return pd.DataFrame({
        "src": ip_text(cols["srcIP_hi"], cols["srcIP_lo"], cols["ipversion"]).tolist(),
        "dst": ip_text(cols["destIP_hi"], cols["destIP_lo"], cols["ipversion"]).tolist(),
        "sport": cols["srcPort"].astype(int), "dport": cols["destPort"].astype(int),
        "proto": cols["protocol"].astype(int), "packets": cols["packets"].astype(int),
        "bytes": cols["bytes"].astype(int)})


def totals(df: pd.DataFrame) -> pd.DataFrame:
    return df.groupby(KEY)[["packets", "bytes"]].sum().sort_index()


def decode_all(datagrams: list[bytes], exporter: str = "127.0.0.1") -> tuple[FlowDecoder, dict]:
    dec = FlowDecoder()
    cols = dec.decode(datagrams, [exporter] * len(datagrams), list(range(len(datagrams))))
    return dec, cols


@pytest.mark.parametrize("version", [5, 9, 10], ids=lambda v: f"v{v}")
def test_softflowd_decoded_as_nfdump_reads_it(pcaps_dir, tmp_path, version):
    datagrams = softflowd_datagrams(pcaps_dir / CAPTURE, version)
    assert len(datagrams) > 5
    dec, cols = decode_all(datagrams)
    assert dec.stats.malformed == 0 and dec.pending == 0, dec.stats.describe()
    assert dec.stats.sequence_gaps == 0
    ours = decoded(cols)
    theirs = nfdump_records(datagrams, tmp_path)
    assert len(ours) == len(theirs) > 300
    pd.testing.assert_frame_equal(totals(ours), totals(theirs), check_dtype=False)
    if version != 5:
        assert set(cols["ipversion"].tolist()) == {4, 6}
    # flow times inside the capture's minutes, first <= last <= export
    assert (cols["first"] <= cols["last"]).all() and (cols["last"] <= cols["export"] + 10**9).all()


def own_exporter_datagrams(pcaps_dir, tmp_path, version: int, template_every: int = 8):
    """skype.pcap's flows as oopscope's exporter sends them (templates every
    `template_every` messages), read back from the capture it writes."""
    from tools.netflow.exporter import Exporter

    pcap = tmp_path / "dg.pcap"
    ex = Exporter(None, version, pcap=str(pcap), template_every_messages=template_every)
    try:
        ex.export(_flow_table(_skype_flows(pcaps_dir)))
    finally:
        ex.close()
    return read_datagrams(pcap)


@pytest.mark.parametrize("version", [5, 9, 10], ids=lambda v: f"v{v}")
def test_own_exporter_decoded_as_nfdump_reads_it(pcaps_dir, tmp_path, version):
    dg = own_exporter_datagrams(pcaps_dir, tmp_path, version)
    dec = FlowDecoder()
    cols = dec.decode(dg.payloads, dg.exporters, dg.arrivals)
    assert dec.stats.malformed == 0 and dec.stats.sequence_gaps == 0, dec.stats.describe()
    ours = decoded(cols)
    theirs = nfdump_records(dg.payloads, tmp_path)
    assert len(ours) == len(theirs) > 100
    pd.testing.assert_frame_equal(totals(ours), totals(theirs), check_dtype=False)


def _flow_table(g: pd.DataFrame):
    """Per-5-tuple flows as the exporter's input table (addresses as the query writes them)."""
    import pyarrow as pa

    return pa.table({"srcIP": ip_text(g.srcIP_hi.to_numpy(np.uint64), g.srcIP_lo.to_numpy(np.uint64),
                                      g.ipversion.to_numpy()).tolist(),
                     "destIP": ip_text(g.destIP_hi.to_numpy(np.uint64),
                                       g.destIP_lo.to_numpy(np.uint64),
                                       g.ipversion.to_numpy()).tolist(),
                     "srcPort": g.srcPort.to_numpy(), "destPort": g.destPort.to_numpy(),
                     "protocol": g.protocol.to_numpy(), "packets": g.packets.to_numpy(),
                     "bytes": g.bytes.to_numpy(), "first_ns": g.first_ns.to_numpy(),
                     "last_ns": g.last_ns.to_numpy()})


def _tshark(pcap: Path, *fields: str, port: int = 2057) -> list[list[str]]:
    proc = subprocess.run([require_tool("tshark"), "-r", str(pcap), "-d",
                           f"udp.port=={port},cflow", "-T", "fields", "-E", "occurrence=a",
                           "-E", "aggregator=;", *sum([["-e", f] for f in fields], [])],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split("\t") for line in proc.stdout.splitlines()]


def test_real_v9_capture_as_tshark_reads_it(pcaps_dir):
    """netflowv9.pcap holds data sets whose templates were sent before the capture began:
    tshark finds no template for any; we hold every one of them, decode no record, count
    no malformation, and read the same headers."""
    pcap = pcaps_dir / "netflowv9.pcap"
    dg = read_datagrams(pcap)
    rows = _tshark(pcap, "cflow.version", "cflow.source_id", "cflow.sequence",
                   "cflow.flowset_id")
    assert len(rows) == len(dg) == 10
    dec = FlowDecoder()
    cols = dec.decode(dg.payloads, dg.exporters, dg.arrivals)
    data_sets = sum(len([x for x in r[3].split(";") if int(x) >= 256]) for r in rows)
    assert len(cols["srcPort"]) == 0 and dec.pending == data_sets > 0
    assert dec.stats.malformed == 0 and dec.stats.versions == {9: 10}
    seqs = [int(r[2]) for r in rows]
    gaps = sum(b != a + 1 for a, b in zip(seqs, seqs[1:]))
    assert dec.stats.sequence_gaps == gaps
    assert dec.drop_pending() == data_sets and dec.stats.reasons == {"no_template": data_sets}


@pytest.mark.parametrize("version", [9, 10], ids=lambda v: f"v{v}")
def test_own_exporter_pcap_as_tshark_reads_it(pcaps_dir, tmp_path, version):
    from tools.netflow.sender import DEFAULT_PORT

    g = _skype_flows(pcaps_dir)
    pcap = tmp_path / "dg.pcap"
    from tools.netflow.exporter import Exporter

    ex = Exporter(None, version, pcap=str(pcap), template_every_messages=8)
    ex.export(_flow_table(g))
    ex.close()
    dg = read_datagrams(pcap)
    _, cols = decode_all(dg.payloads)
    rows = _tshark(pcap, "cflow.srcaddr", "cflow.srcaddrv6", "cflow.srcport", "cflow.dstport",
                   "cflow.protocol", "cflow.packets", "cflow.octets", port=DEFAULT_PORT)
    theirs = []
    for r in rows:
        src = [x for x in (r[0] + ";" + r[1]).split(";") if x]
        per = [x.split(";") if x else [] for x in r[2:]]
        theirs += list(zip(src, *[[int(v) for v in p] for p in per]))
    ours = decoded(cols)
    mine = sorted(zip(ours.src, ours.sport, ours.dport, ours.proto, ours.packets, ours.bytes))
    assert len(theirs) > 100
    assert mine == sorted(theirs)


def _skype_flows(pcaps_dir: Path) -> pd.DataFrame:
    from capture.reader import read_all

    c = read_all(pcaps_dir / CAPTURE).columns
    ip = (c["ipversion"] == 4) | (c["ipversion"] == 6)
    df = pd.DataFrame({k: c[k][ip] for k in ("timestamp", "srcIP_hi", "srcIP_lo", "destIP_hi",
                                             "destIP_lo", "srcPort", "destPort", "protocol",
                                             "ip_len", "ipversion")})
    return df.groupby(["srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo", "srcPort", "destPort",
                       "protocol", "ipversion"]).agg(packets=("timestamp", "size"),
                                                     bytes=("ip_len", "sum"),
                                                     first_ns=("timestamp", "min"),
                                                     last_ns=("timestamp", "max")).reset_index()


def test_templates_survive_a_restart(pcaps_dir):
    """A decoder made from the state of one that saw the templates decodes at once what
    follows; one without them holds the data sets."""
    datagrams = softflowd_datagrams(pcaps_dir / CAPTURE, 9)
    _, whole = decode_all(datagrams)
    first = FlowDecoder()
    head = first.decode(datagrams[:1], ["127.0.0.1"], [0])
    state = json.loads(json.dumps(first.state()))
    restarted = FlowDecoder.from_state(state)
    tail = restarted.decode(datagrams[1:], ["127.0.0.1"] * (len(datagrams) - 1),
                            [0] * (len(datagrams) - 1))
    assert restarted.pending == 0 and restarted.stats.sequence_gaps == 0
    assert len(head["bytes"]) + len(tail["bytes"]) == len(whole["bytes"])
    assert int(head["bytes"].sum() + tail["bytes"].sum()) == int(whole["bytes"].sum())
    cold = FlowDecoder()
    cold.decode(datagrams[1:], ["127.0.0.1"] * (len(datagrams) - 1), [0] * (len(datagrams) - 1))
    assert cold.pending > 0 or cold.stats.records < len(tail["bytes"])


def test_held_sets_decoded_when_their_template_comes(pcaps_dir):
    """Datagrams reordered so the data come before the templates: decoded all the same."""
    datagrams = softflowd_datagrams(pcaps_dir / CAPTURE, 10)
    _, whole = decode_all(datagrams)
    dec = FlowDecoder()
    late = dec.decode(datagrams[1:], ["127.0.0.1"] * (len(datagrams) - 1),
                      [0] * (len(datagrams) - 1))
    assert len(late["bytes"]) == 0 and dec.pending > 0
    rest = dec.decode(datagrams[:1], ["127.0.0.1"], [0])
    assert dec.pending == 0
    assert int(rest["bytes"].sum()) == int(whole["bytes"].sum())


_SEED: dict[str, list[bytes]] = {}


def mutate(data, datagram: bytes, most: int) -> bytes:
    """`datagram` with up to `most` edits drawn by hypothesis: a byte flipped, the rest cut
    off, or a 16-bit field (a length, a count, an id) zeroed or maxed."""
    b = bytearray(datagram)
    for _ in range(data.draw(st.integers(0, most))):
        if not b:
            break
        op = data.draw(st.sampled_from(["flip", "cut", "zero16", "big16"]))
        i = data.draw(st.integers(0, len(b) - 1))
        if op == "flip":
            b[i] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del b[i:]
        elif i + 1 < len(b):
            b[i:i + 2] = b"\0\0" if op == "zero16" else b"\xff\xff"
    return bytes(b)


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_datagrams_counted_never_raised(pcaps_dir, data):
    if not _SEED:
        for v in (5, 9, 10):
            _SEED[str(v)] = softflowd_datagrams(pcaps_dir / CAPTURE, v)[:3]
    version = data.draw(st.sampled_from(["5", "9", "10"]))
    originals = _SEED[version]
    mutated = [mutate(data, d, 6) for d in originals]
    dec = FlowDecoder(max_pending=8)
    cols = dec.decode(mutated, ["192.0.2.7"] * len(mutated), [0] * len(mutated))
    assert set(dec.stats.reasons) <= set(REASONS)
    assert all(e == "192.0.2.7" for e, _ in dec.stats.by_exporter)
    assert len(cols["bytes"]) == dec.stats.records
    # the link's meld takes whatever came (an options record may give any timeout or boot)
    from capture.flowreader import FlowMeld

    for clock in ("first", "last"):
        meld = FlowMeld(60 * 10**9, clock, 15 * 10**9)
        meld.admit(cols[clock])
        p = meld.advance(meld.punctuation(dec))
        assert (p is None) == (not dec.latest_export)
    if mutated == originals:
        assert dec.stats.malformed == 0


def _v9(seq: int, *sets: bytes) -> bytes:
    return struct.pack(">HHIIII", 9, len(sets), 1000, 1_700_000_000, seq, 0) + b"".join(sets)


def _template_set(*fields: tuple[int, int]) -> bytes:
    body = struct.pack(">HH", 256, len(fields)) + b"".join(struct.pack(">HH", *f)
                                                          for f in fields)
    return struct.pack(">HH", 0, 4 + len(body)) + body


def test_a_template_set_sent_again_decodes_as_the_first():
    """Exporters resend their template sets every few datagrams; the decoder skips one equal
    to the set it learned last (`capture.flowknown`), so a redefinition, a return to
    the first definition and a faulty set (counted each time) must still be read."""
    packets_first = _template_set((8, 4), (2, 4), (1, 4))     # srcIP, packets, bytes
    bytes_first = _template_set((8, 4), (1, 4), (2, 4))      # srcIP, bytes, packets
    data = struct.pack(">HHIII", 256, 16, 0x0A000001, 5, 700)
    faulty = _template_set((8, 4), (2, 0))                   # a field of length 0
    plan = [packets_first, packets_first, bytes_first, bytes_first, packets_first, faulty,
            faulty]
    datagrams = [_v9(i, s, data) for i, s in enumerate(plan)]
    dec = FlowDecoder()
    # one call, then a call per datagram (the walk stops at each template datagram)
    cols = [dec.decode(datagrams, ["192.0.2.1"] * len(datagrams), list(range(len(plan))))]
    for i, d in enumerate(datagrams):
        cols.append(dec.decode([d], ["192.0.2.1"], [i]))
    want_packets = [5, 5, 700, 700, 5, 5, 5]      # the faulty set leaves the last one
    assert cols[0]["packets"].tolist() == want_packets
    assert cols[0]["bytes"].tolist() == [700 if p == 5 else 5 for p in want_packets]
    assert [int(c["packets"][0]) for c in cols[1:]] == [5, 5, 700, 700, 5, 5, 5]
    assert dec.stats.reasons == {"bad_template": 4}
    assert dec.stats.sequence_gaps == 1        # the second pass starts the numbers again
