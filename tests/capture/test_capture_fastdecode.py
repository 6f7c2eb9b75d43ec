"""The reader's fast decode path and its options (`columns`, `prefetch`) against the general decoder.

Oracle: `capture.decode.decode_rows` (the general decoder, itself checked against scapy and
tshark elsewhere) on the same framed records: the fast path must give every row the same
values, on the real captures and on mutated Ethernet/IPv4 frames that sit on the borders of
the fast path (lengths, header length, fragments, IPv6 next headers, TCP data offset, short
snaps).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP
from scapy.layers.inet6 import ICMPv6EchoRequest, IPv6, IPv6ExtHdrFragment
from scapy.layers.l2 import Ether

from capture.decode import decode_rows, make_columns
from capture.fastdecode import DECODED_COLUMNS, column_mask, decode_rows_fast
from capture.pcapfile import frame_pcap
from capture.reader import open_capture, read_all
from capture.schema import COLUMNS
from tests.capture.capture_writers import NS, pcap_bytes
from tests.conftest import shared_pcaps

BASE = [bytes(Ether() / IP(src="10.1.2.3", dst="192.168.9.8") / TCP(sport=1234, dport=80) / (b"x" * 30)),
        bytes(Ether() / IP(src="10.1.2.3", dst="192.168.9.8") / UDP(sport=53, dport=999) / (b"y" * 12)),
        bytes(Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / ICMP(type=8, code=0)),
        bytes(Ether() / IP(src="1.2.3.4", dst="5.6.7.8", proto=47) / (b"z" * 20)),
        bytes(Ether() / IPv6(src="2001:db8::1", dst="fe80::2:3", tc=0xA5, hlim=9)
              / TCP(sport=4321, dport=443, flags="FA") / (b"v" * 25)),
        bytes(Ether() / IPv6(src="::ffff:10.0.0.1", dst="2001:db8:ffff::9") / UDP(sport=5353,
                                                                                dport=53)
              / (b"w" * 9)),
        bytes(Ether() / IPv6(src="2001:db8::7", dst="ff02::1") / ICMPv6EchoRequest()),
        bytes(Ether() / IPv6(src="2001:db8::7", dst="ff02::1", nh=1) / ICMP(type=3)),
        bytes(Ether() / IPv6(src="2001:db8::7", dst="2001:db8::8") / IPv6ExtHdrFragment(offset=0)
              / UDP(sport=1, dport=2) / (b"f" * 16)),
        bytes(Ether() / IPv6(src="2001:db8::7", dst="2001:db8::8", nh=59) / (b"n" * 8))]


def _both(buf: np.ndarray, link: int = 1):
    """Rows of a pcap buffer decoded by decode_rows and by decode_rows_fast (all columns)."""
    outs = []
    for fast in (False, True):
        out = make_columns(4096)
        pos, row, _, _ = frame_pcap(buf, 24, len(buf), False, 1000, 0, link, 0, out, 0, 4096)
        if fast:
            decode_rows_fast(buf, out, 0, row, column_mask(None))
        else:
            decode_rows(buf, out, 0, row)
        outs.append((out, row))
    return outs


def _assert_same(a, b, n):
    for name in DECODED_COLUMNS:
        np.testing.assert_array_equal(getattr(a, name)[:n], getattr(b, name)[:n], err_msg=name)


@settings(max_examples=300, deadline=None)
@given(base=st.sampled_from(range(len(BASE))),
       edits=st.lists(st.tuples(st.integers(12, 60), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 40), wire_extra=st.integers(-20, 20))
@pytest.mark.slow
def test_fast_path_equals_general_decoder(base, edits, cut, wire_extra):
    frame = bytearray(BASE[base])
    for pos, val in edits:
        if pos < len(frame):
            frame[pos] = val
    cap = bytes(frame[:max(1, len(frame) - cut)])
    wire = max(len(cap), len(frame) + wire_extra)
    raw = pcap_bytes([(NS, cap, wire)], 1)
    (a, n), (b, m) = _both(np.frombuffer(raw, np.uint8))
    assert n == m == 1
    _assert_same(a, b, n)


def test_plain_ipv6_frames_take_the_fast_path():
    """The equality tests above would pass with every IPv6 frame left to decode_frame: the
    fast path must take them (its return value counts the rows it left), except the one
    with an extension header."""
    from capture.fastdecode import decode_rows_flow

    for i, frame in enumerate(BASE):
        raw = np.frombuffer(pcap_bytes([(NS, frame, len(frame))], 1), np.uint8)
        (a, _), (b, _) = _both(raw)
        _assert_same(a, b, 1)
        left = decode_rows_fast(raw, b, 0, 1, column_mask(None))
        flow = make_columns(4)
        frame_pcap(raw, 24, len(raw), False, 1000, 0, 1, 0, flow, 0, 4)
        assert decode_rows_flow(raw, flow, 0, 1) == left
        fragment = b"\x86\xdd" == frame[12:14] and frame[20] == 44
        assert left == (1 if fragment else 0), (i, frame[12:14].hex())
    assert int(b.ipversion[0]) in (4, 6)


def test_fast_path_equals_general_decoder_on_real_captures():
    paths = shared_pcaps()
    if not paths:
        pytest.skip("../shared/pcaps is absent")
    checked = 0
    for path in paths:
        raw = path.read_bytes()
        if raw[:4] not in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") or len(raw) > 4 << 20:
            continue  # little-endian pcap files of modest size: the framing is the same
        link = int.from_bytes(raw[20:24], "little")
        buf = np.frombuffer(raw, np.uint8)
        out_a, out_b = make_columns(1 << 16), make_columns(1 << 16)
        pos = 24
        while True:
            p1, n, st_, _ = frame_pcap(buf, pos, len(buf), False, 1000, 0, link, 0, out_a, 0, 1 << 16)
            frame_pcap(buf, pos, len(buf), False, 1000, 0, link, 0, out_b, 0, 1 << 16)
            decode_rows(buf, out_a, 0, n)
            decode_rows_fast(buf, out_b, 0, n, column_mask(None))
            _assert_same(out_a, out_b, n)
            checked += n
            if n < (1 << 16) or p1 == pos:
                break
            pos = p1
    assert checked > 1000


@pytest.fixture(scope="module")
def mixed_capture(tmp_path_factory):
    frames = [BASE[i % len(BASE)] for i in range(700)] + [b"\x00" * 10, BASE[0][:30]]
    path = tmp_path_factory.mktemp("fast") / "mixed.pcap"
    path.write_bytes(pcap_bytes([(NS + i * 1000, f) for i, f in enumerate(frames)], 1))
    return path


def test_columns_option_decodes_only_those(mixed_capture):
    full = read_all(mixed_capture)
    few = read_all(mixed_capture, columns=["srcIP_lo", "destIP_lo"])
    for name in ("timestamp", "len", "caplen", "layers", "reason", "srcIP_lo", "destIP_lo"):
        np.testing.assert_array_equal(full[name], few[name], err_msg=name)
    assert full["ttl"].any() and not few["ttl"].any()
    with pytest.raises(ValueError, match="nope"):
        open_capture(mixed_capture, columns=["nope"])


@pytest.mark.parametrize("prefetch", [1, 3])
def test_prefetch_gives_the_same_batches(mixed_capture, prefetch):
    with open_capture(mixed_capture, batch_size=64) as r:
        plain = [b.copy() for b in r]
    with open_capture(mixed_capture, batch_size=64, prefetch=prefetch) as r:
        ahead = []
        for b in r:
            # the batch stays valid while the thread decodes ahead: check it after a pause
            first = int(b["timestamp"][0])
            ahead.append(b.copy())
            assert int(b["timestamp"][0]) == first
        assert r.stats.packets == sum(len(b) for b in plain)
    assert len(plain) == len(ahead)
    for p, a in zip(plain, ahead):
        for c in COLUMNS:
            np.testing.assert_array_equal(p[c.name], a[c.name], err_msg=c.name)


def test_prefetch_abandoned_and_errors(mixed_capture, tmp_path):
    with open_capture(mixed_capture, batch_size=16, prefetch=2) as r:
        for i, _ in enumerate(r):
            if i == 2:
                break   # close() must stop the thread
    assert r._ahead is not None and not r._ahead._thread.is_alive()
    # a broken record: every packet before it arrives, then the error
    raw = bytearray(mixed_capture.read_bytes())
    bad = tmp_path / "bad.pcap"
    rec = 24 + 16 + len(BASE[0])
    raw[rec + 8:rec + 12] = (10 << 20).to_bytes(4, "little")   # impossible captured length
    bad.write_bytes(bytes(raw))
    from capture.errors import CaptureFormatError
    got = 0
    with pytest.raises(CaptureFormatError):
        with open_capture(bad, batch_size=16, prefetch=2, strict=True) as r:
            for b in r:
                got += len(b)
    assert got == 1
    # not strict: the read-ahead thread steps over the damage like the plain reader
    with open_capture(bad, batch_size=16) as plain:
        want = [b["timestamp"].copy() for b in plain]
    with open_capture(bad, batch_size=16, prefetch=2) as ahead:
        got_ts = [b["timestamp"].copy() for b in ahead]
    assert len(want) > 1 and all(np.array_equal(a, b) for a, b in zip(want, got_ts))
    assert ahead.stats.resyncs == plain.stats.resyncs == 1


def test_flow_columns_decoder_equals_general_decoder(mixed_capture):
    from capture.fastdecode import FLOW_COLUMNS

    full = read_all(mixed_capture)
    flow = read_all(mixed_capture, columns=sorted(FLOW_COLUMNS))
    for name in sorted(FLOW_COLUMNS) + ["timestamp", "len", "caplen"]:
        np.testing.assert_array_equal(full[name], flow[name], err_msg=name)
    assert full["ttl"].any() and not flow["ttl"].any()


@settings(max_examples=200, deadline=None)
@given(base=st.sampled_from(range(len(BASE))),
       edits=st.lists(st.tuples(st.integers(12, 60), st.integers(0, 255)), max_size=4),
       cut=st.integers(0, 40))
def test_flow_decoder_on_mutated_frames(base, edits, cut):
    from capture.fastdecode import FLOW_COLUMNS, decode_rows_flow

    frame = bytearray(BASE[base])
    for pos, val in edits:
        if pos < len(frame):
            frame[pos] = val
    raw = pcap_bytes([(NS, bytes(frame[:max(1, len(frame) - cut)]), len(frame))], 1)
    buf = np.frombuffer(raw, np.uint8)
    a, b = make_columns(4), make_columns(4)
    for out in (a, b):
        frame_pcap(buf, 24, len(buf), False, 1000, 0, 1, 0, out, 0, 4)
    decode_rows(buf, a, 0, 1)
    decode_rows_flow(buf, b, 0, 1)
    for name in FLOW_COLUMNS:
        assert getattr(a, name)[0] == getattr(b, name)[0], name
