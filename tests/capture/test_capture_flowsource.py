"""A NETFLOW collector's socket (`capture.flowsource`): the datagrams the kernel drops at a
real UDP socket whose reader is paused, read from /proc/net/udp{,6} by the socket's inode,
and the collector's accounting: every datagram sent is received, dropped at the socket or
dropped by the collector's queue, none twice."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from capture.flowsource import UdpCollector, socket_drops

#: a datagram of the size routers send (a v9 export packet near the MTU)
DATAGRAM = bytes(1400)


def _flood(address, n: int, family=socket.AF_INET) -> None:
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        for _ in range(n):
            s.sendto(DATAGRAM, address)


def _drain(sock: socket.socket) -> int:
    sock.setblocking(False)
    n = 0
    while True:
        try:
            sock.recv(65535)
        except BlockingIOError:
            return n
        n += 1


@pytest.mark.parametrize("family, host", [(socket.AF_INET, "127.0.0.1"),
                                          (socket.AF_INET6, "::1")])
def test_drops_of_a_paused_socket(family, host):
    """A socket with a small receive buffer, nobody reading, flooded: the kernel drops
    what does not fit; what it kept plus its drops is what was sent (loopback loses
    nothing else). Another socket's drops are not taken for ours."""
    with socket.socket(family, socket.SOCK_DGRAM) as sock, \
            socket.socket(family, socket.SOCK_DGRAM) as other:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.bind((host, 0))
        other.bind((host, 0))
        assert socket_drops(sock) == 0
        _flood(sock.getsockname()[:2], 500, family)
        drops = socket_drops(sock)
        kept = _drain(sock)
        assert drops is not None and drops > 0 and kept > 0
        assert kept + drops == 500
        assert socket_drops(other) == 0
    assert socket_drops(sock) is None            # closed: nothing to say


def test_collector_accounts_for_every_datagram():
    """A collector with a small socket buffer and a queue of 50, not asked for its
    datagrams: sent at a pace its thread keeps up with, they fill the queue and then are
    counted as its `dropped`; flooded, the socket drops what its buffer cannot hold
    meanwhile. Received + queue drops + socket drops == sent, after close too. (Each phase
    goes on until its drops show, so a busy machine changes how many are sent, not what
    holds.)"""
    col = UdpCollector("127.0.0.1", 0, rcvbuf=4096, max_queued=50)
    try:
        sent = 0
        deadline = time.monotonic() + 20
        while col.dropped == 0 and time.monotonic() < deadline:
            _flood(col.address, 5)
            sent += 5
            time.sleep(0.005)
        while col.kernel_drops == 0 and time.monotonic() < deadline:
            _flood(col.address, 1000)
            sent += 1000
            time.sleep(0.05)
        assert col.dropped > 0 and col.kernel_drops > 0
        received = 0
        # the thread takes what the socket kept; then the test takes the queue
        while time.monotonic() < deadline:
            time.sleep(0.3)
            if col.dropped + col.kernel_drops + col.queued == sent:
                break
        while True:
            got = col.receive(0.2)
            if not len(got):
                break
            received += len(got)
        assert received == 50
        assert received + col.dropped + col.kernel_drops == sent
    finally:
        col.close()
    assert received + col.dropped + col.kernel_drops == sent


def test_batches_handed_on_in_order_across_buffers(monkeypatch):
    """The thread joins its batches into buffers of STAGE_BYTES (here a few datagrams'
    worth): taken together, batches of one buffer come as one view of it and those of
    several as one copy; either way every datagram comes once, in order, with its length
    and sender."""
    import capture.flowsource as fs

    monkeypatch.setattr(fs, "STAGE_BYTES", 5000)
    col = UdpCollector("127.0.0.1", 0)
    sent = [bytes([i % 251]) * (100 + 37 * (i % 40)) for i in range(300)]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i, d in enumerate(sent):
                s.sendto(d, col.address)
                if i % 7 == 0:
                    time.sleep(0.002)            # several batches of the thread's
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < len(sent) and time.monotonic() < deadline:
            blob, lengths, exporters, arrivals = col.receive_joined(0.2, max_datagrams=50)
            assert len(lengths) == len(exporters) == len(arrivals) <= 50 + fs.SLOTS
            assert len(blob) == int(lengths.sum())
            assert set(exporters) <= {"127.0.0.1"}
            ends = np.cumsum(lengths).tolist()
            got += [bytes(blob[a:b]) for a, b in zip([0, *ends[:-1]], ends)]
    finally:
        col.close()
    assert got == sent
