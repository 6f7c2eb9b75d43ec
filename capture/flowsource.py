"""Where flow datagrams come from: the UDP payloads of a capture file (exported datagrams
replayed by capture time), or a UDP socket (a collector), each datagram with its exporter's
address and its arrival time, ready for `capture.flowdecode.FlowDecoder.decode`.

Datagrams, not records, are the unit here: a few dozen records each, so a Python step per
datagram is cheap beside the records' decoding (which never runs per record in Python).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from capture.addresses import ip_text
from capture.schema import L_UDP

log = logging.getLogger(__name__)

#: the socket's receive buffer asked for (the kernel may cap it: net.core.rmem_max)
RCVBUF = 8 << 20
_MAX_DATAGRAM = 65535
#: the socket's drops are read from /proc at most this often (status, metrics, progress)
DROPS_EVERY_S = 0.25
#: the column of /proc/net/udp{,6} holding a socket's drops, and of its inode
_DROPS_COLUMN, _INODE_COLUMN = 12, 9


def socket_drops(sock: socket.socket) -> int | None:
    """The datagrams the kernel dropped for UDP socket `sock` (its receive buffer full, or
    a checksum failed): the `drops` column of its line in /proc/net/udp (udp6 for an
    IPv6 socket), found by the socket's inode. None when the kernel does not say (no
    /proc, another system)."""
    try:
        inode = str(os.fstat(sock.fileno()).st_ino)
    except (OSError, ValueError):
        return None
    name = "/proc/net/udp6" if sock.family == socket.AF_INET6 else "/proc/net/udp"
    try:
        with open(name) as f:
            next(f, None)                               # the header
            for line in f:
                cols = line.split()
                if len(cols) > _DROPS_COLUMN and cols[_INODE_COLUMN] == inode:
                    return int(cols[_DROPS_COLUMN])
    except (OSError, ValueError):
        return None
    return None


@dataclass
class Datagrams:
    """Datagrams in arrival order: payloads, exporter addresses (text), arrival ns."""

    payloads: list = field(default_factory=list)
    exporters: list = field(default_factory=list)
    arrivals: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.payloads)


def read_datagrams(path, port: int | None = None) -> Datagrams:
    """Every UDP payload of capture `path` (to destination `port` when given), with its
    source address and capture time."""
    from capture.reader import open_capture

    out = Datagrams()
    cols = ["payload", "srcIP_hi", "srcIP_lo", "ipversion", "destPort", "timestamp"]
    with open_capture(path, columns=cols) as reader:
        for b in reader:
            c = b.columns
            keep = (c["layers"] & L_UDP) != 0
            if port is not None:
                keep &= c["destPort"] == port
            idx = np.flatnonzero(keep)
            if not len(idx):
                continue
            text = ip_text(c["srcIP_hi"][idx], c["srcIP_lo"][idx], c["ipversion"][idx])
            out.payloads += b.payload.take(idx).to_pylist()
            out.exporters += [str(t) for t in text.tolist()]
            out.arrivals += c["timestamp"][idx].tolist()
    return out


class UdpCollector:
    """A bound UDP socket drained by a thread of its own into a queue, so that the socket's
    buffer empties while the link decodes and the queries work (`receive` takes what came).
    The queue is bounded (`max_queued` datagrams): past it datagrams are counted as
    `dropped` rather than growing memory without end. What the kernel dropped before the
    thread took it (the socket's buffer full) is `kernel_drops`."""

    def __init__(self, host: str, port: int, rcvbuf: int = RCVBUF, max_queued: int = 1 << 18):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.sock.settimeout(0.1)
        self.address = self.sock.getsockname()[:2]
        self.max_queued = max_queued
        self.dropped = 0
        self._kernel_drops = 0
        self._drops_read = 0.0                  # monotonic s of the last /proc read
        self._queue: deque = deque()
        self._ready = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._drain, name="oopscope-netflow-udp",
                                        daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        recv, put, queue = self.sock.recvfrom, self._queue.append, self._queue
        while not self._closing:
            try:
                data, addr = recv(_MAX_DATAGRAM)
            except (TimeoutError, InterruptedError):
                continue
            except OSError:
                return                          # closed
            if len(queue) >= self.max_queued:
                self.dropped += 1
                continue
            put((data, addr[0], time.time_ns()))
            self._ready.set()

    def receive(self, timeout_s: float, max_datagrams: int = 4096) -> Datagrams:
        """The datagrams that came (waiting up to `timeout_s` for the first), at most
        `max_datagrams`."""
        out = Datagrams()
        if not self._queue:
            self._ready.wait(timeout_s)
        self._ready.clear()
        queue = self._queue
        while queue and len(out.payloads) < max_datagrams:
            data, exporter, arrival = queue.popleft()
            out.payloads.append(data)
            out.exporters.append(exporter)
            out.arrivals.append(arrival)
        if queue:
            self._ready.set()
        return out

    @property
    def kernel_drops(self) -> int:
        """Datagrams the kernel dropped at the socket (`socket_drops`), read at most every
        DROPS_EVERY_S (the last count once closed)."""
        now = time.monotonic()
        if now - self._drops_read >= DROPS_EVERY_S and self.sock.fileno() >= 0:
            self._drops_read = now
            n = socket_drops(self.sock)
            if n is not None:
                self._kernel_drops = n
        return self._kernel_drops

    def close(self) -> None:
        self._closing = True
        self._thread.join(timeout=1.0)
        if self.sock.fileno() >= 0:
            self._drops_read = 0.0
            _ = self.kernel_drops                   # the last count, before the socket goes
        self.sock.close()
