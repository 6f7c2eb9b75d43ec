"""Many datagrams per system call (`capture.udpbatch`) on real loopback sockets: every
datagram's bytes, length and sender kept, cut ones told apart, recvmmsg and the recvfrom_into
fallback alike; and the UDP collector built on it decoding softflowd's real datagrams as the
decoder does them one by one."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from capture.flowdecode import FlowDecoder
from capture.flowsource import UdpCollector
from capture.udpbatch import UdpBatchReceiver, big_receive_buffer, sockaddr_text
from tests.capture.test_capture_flowdecode import CAPTURE, softflowd_datagrams


@pytest.fixture
def pair():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    big_receive_buffer(rx, 8 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    yield rx, tx
    rx.close()
    tx.close()


def drain(r: UdpBatchReceiver) -> list[tuple[bytes, int, tuple]]:
    got: list[tuple[bytes, int, tuple]] = []
    while True:
        n = r.receive(0.2)
        if not n:
            return got
        got += [(r.datagram(i), int(r.lengths[i]), r.sender(i)) for i in range(n)]


@pytest.mark.parametrize("fallback", [False, True], ids=["recvmmsg", "recvfrom_into"])
def test_many_datagrams_in_few_calls(pair, fallback):
    rx, tx = pair
    r = UdpBatchReceiver(rx, slots=64, slot_size=2048, fallback=fallback)
    assert r.uses_recvmmsg == (not fallback)
    sent = [bytes([i % 251]) * (1 + i * 7 % 1500) for i in range(500)]
    for d in sent:
        tx.sendto(d, rx.getsockname())
    calls, got = 0, []
    while len(got) < len(sent):
        n = r.receive(1.0)
        assert n, f"only {len(got)} of {len(sent)} came"
        assert n <= 64
        calls += 1
        got += [(r.datagram(i), r.sender(i)) for i in range(n)]
    assert [g[0] for g in got] == sent
    assert {g[1] for g in got} == {tx.getsockname()}
    # queued before the first call: full batches, not one datagram a call
    assert calls <= len(sent) // 64 + 1


@pytest.mark.parametrize("fallback", [False, True], ids=["recvmmsg", "recvfrom_into"])
def test_cut_and_empty_datagrams(pair, fallback):
    """A datagram longer than its slot keeps its true length (the reader sees the cut); an
    empty one is a datagram of length 0, not the end."""
    rx, tx = pair
    r = UdpBatchReceiver(rx, slots=8, slot_size=100, fallback=fallback)
    for d in (b"a" * 99, b"b" * 100, b"c" * 101, b"", b"d" * 3000, b"e"):
        tx.sendto(d, rx.getsockname())
    got = drain(r)
    assert [(g[0][:1], len(g[0]), g[1]) for g in got] == [
        (b"a", 99, 99), (b"b", 100, 100), (b"c", 100, 101), (b"", 0, 0), (b"d", 100, 3000),
        (b"e", 1, 1)]


def test_nothing_comes_within_the_timeout(pair):
    rx, _ = pair
    r = UdpBatchReceiver(rx, slots=4, slot_size=64)
    t0 = time.perf_counter()
    assert r.receive(0.1) == 0
    assert 0.05 < time.perf_counter() - t0 < 2.0


def test_ipv6_sender():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this host")
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        rx.bind(("::1", 0))
        tx.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    with rx, tx:
        for fallback in (False, True):
            r = UdpBatchReceiver(rx, slots=4, slot_size=64, fallback=fallback)
            tx.sendto(b"v6", rx.getsockname()[:2])
            assert r.receive(1.0) == 1
            assert r.datagram(0) == b"v6"
            assert r.sender(0) == tx.getsockname()[:2]


def test_receive_buffer_reported():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = big_receive_buffer(s, 16 << 20)
        assert got == s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) > 0
        assert sockaddr_text(np.zeros(28, np.uint8))[1] == 0


@pytest.fixture(scope="module")
def v9(pcaps_dir) -> list[bytes]:
    return softflowd_datagrams(pcaps_dir / CAPTURE, 9)


@pytest.mark.parametrize("fallback", [False, True], ids=["recvmmsg", "recvfrom_into"])
def test_collector_decodes_softflowd_as_one_by_one(v9, fallback):
    """softflowd's datagrams sent to the collector many times over come out in order, from
    our address, and decode to the records of decoding them one call each."""
    col = UdpCollector("127.0.0.1", 0, slots=32, fallback=fallback)
    try:
        sent = v9 * 20
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for d in sent:
                tx.sendto(d, col.address)
        payloads, exporters = [], []
        deadline = time.monotonic() + 10
        while len(payloads) < len(sent) and time.monotonic() < deadline:
            got = col.receive(0.2)
            payloads += got.payloads
            exporters += got.exporters
        assert payloads == sent
        assert set(exporters) == {"127.0.0.1"}
        assert col.dropped == 0 and col.rcvbuf > 0
    finally:
        col.close()
    batch = FlowDecoder().decode(payloads, exporters, list(range(len(payloads))))
    one = FlowDecoder()
    singles = [one.decode([d], ["127.0.0.1"], [i]) for i, d in enumerate(sent)]
    for name, col_ in batch.items():
        assert np.array_equal(col_, np.concatenate([s[name] for s in singles])), name
    assert len(batch["first"]) > 0


def test_collector_counts_what_its_queue_cannot_hold(v9):
    """Past `max_queued` datagrams not taken, the thread counts drops instead of growing."""
    col = UdpCollector("127.0.0.1", 0, max_queued=10, slots=4)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            for d in v9 * 10:
                tx.sendto(d, col.address)
        deadline = time.monotonic() + 10
        while col.dropped + 10 < len(v9) * 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        kept = []
        while True:
            got = col.receive(0.2)
            if not len(got):
                break
            kept += got.payloads
        assert len(kept) == 10 and col.dropped == len(v9) * 10 - 10
        assert kept == (v9 * 10)[:10]
    finally:
        col.close()
