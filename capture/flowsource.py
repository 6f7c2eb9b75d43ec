"""Where flow datagrams come from: the UDP payloads of a capture file (exported datagrams
replayed by capture time), or a UDP socket (a collector), each datagram with its exporter's
address and its arrival time, ready for `capture.flowdecode.FlowDecoder.decode`.

Datagrams, not records, are the unit here. The collector takes them in batches (recvmmsg,
`capture.udpbatch`) and hands them on joined end to end in one buffer with their lengths,
which the decoder walks as is: at a million records a second (~40,000 datagrams) even a
Python step per datagram costs more than the records' decoding.
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
from capture.udpbatch import UdpBatchReceiver, big_receive_buffer, compact, sockaddr_text
from common import settings

log = logging.getLogger(__name__)

#: datagrams taken per system call
SLOTS = 1024
#: a datagram longer than this is cut (and counted malformed): NetFlow/IPFIX exporters keep
#: theirs within a path MTU (jumbo frames included)
_SLOT_SIZE = 16384
#: the collector's thread joins its batches one after the other into buffers of this many
#: bytes, so that the batches queued are handed on as one view, not copied again
STAGE_BYTES = 16 << 20
#: after a receive of fewer datagrams than this, the thread sleeps COALESCE_S before the next
COALESCE_BELOW = 256
COALESCE_S = 0.001
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
    The thread takes many datagrams per system call (`capture.udpbatch`: recvmmsg) and
    queues them a batch at a time, so no Python step runs per datagram on its side. The
    queue is bounded (`max_queued` datagrams): past it datagrams are counted as `dropped`
    rather than growing memory without end. What the kernel dropped before
    the thread took it (the socket's buffer full) is `kernel_drops`."""

    def __init__(self, host: str, port: int, rcvbuf: int | None = None, max_queued: int = 1 << 18,
                 slots: int = SLOTS, fallback: bool = False):
        # the batch copy's kernel compiled (or loaded) before a datagram can wait for it
        compact(np.zeros((1, 1), np.uint8), np.ones(1, np.int64), 1, np.zeros(1, np.uint8))
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            #: the receive buffer the kernel gave (forced past rmem_max as root)
            self.rcvbuf = big_receive_buffer(
                self.sock, settings.netflow_receive_buffer() if rcvbuf is None else rcvbuf)
            self.sock.bind((host, port))
        except OSError:
            self.sock.close()
            raise
        self.address = self.sock.getsockname()[:2]
        self._rx = UdpBatchReceiver(self.sock, slots, _SLOT_SIZE, fallback=fallback)
        log.info("UDP %s:%d: receive buffer %d bytes, %s", *self.address, self.rcvbuf,
                 "recvmmsg" if self._rx.uses_recvmmsg else "recvfrom_into")
        self.max_queued = max_queued
        self.dropped = 0
        self._kernel_drops = 0
        self._drops_read = 0.0                  # monotonic s of the last /proc read
        self._queued = 0
        self._queue: deque = deque()
        self._names: dict[bytes, str] = {}
        self._ready = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._drain, name="oopscope-netflow-udp",
                                        daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        rx, queue = self._rx, self._queue
        stage, used = np.empty(STAGE_BYTES, np.uint8), 0
        while not self._closing:
            try:
                n = rx.receive(0.1)
            except (OSError, ValueError):
                return                          # closed
            if not n:
                continue
            arrival = time.time_ns()
            room = self.max_queued - self._queued
            if n > room:
                self.dropped += n - max(room, 0)
                n = max(room, 0)
                if not n:
                    continue
            lengths = rx.kept_lengths(n)
            size = int(lengths.sum())
            if used + size > len(stage):
                # a new buffer: the old one lives on in the views queued from it
                stage, used = np.empty(max(STAGE_BYTES, size), np.uint8), 0
            rx.join_into(n, lengths, stage[used:used + size])
            exporters = self._exporters(n)
            self._queued += n
            queue.append((stage, used, used + size, lengths, exporters, arrival))
            used += size
            self._ready.set()
            if n < COALESCE_BELOW:
                # a short batch: the exporters send slower than we take, so let a few more
                # datagrams gather than wake for each handful (CPU for the sender side)
                time.sleep(COALESCE_S)

    def _exporters(self, n: int) -> list:
        """The senders' addresses as text, one per datagram (few exporters: a cache)."""
        raw = self._rx.addresses[:n]
        # the sockaddr up to the end of an IPv6 address is the key: a sender's port is in it
        # too, which costs an entry per port, not a wrong name; bounded against senders
        # spoofing addresses
        keys = raw[:, :24]
        first = keys[0].tobytes()
        names = self._names
        if len(names) > 65536:
            names.clear()
        if (keys == keys[0]).all():
            name = names.get(first)
            if name is None:
                name = names[first] = sockaddr_text(raw[0])[0]
            return [name] * n
        out = []
        for i in range(n):
            k = keys[i].tobytes()
            name = names.get(k)
            if name is None:
                name = names[k] = sockaddr_text(raw[i])[0]
            out.append(name)
        return out

    def receive(self, timeout_s: float, max_datagrams: int = 4096) -> Datagrams:
        """The datagrams that came (waiting up to `timeout_s` for the first), at most
        `max_datagrams` (a whole batch of the thread's may pass it), one bytes object each."""
        blob, lengths, exporters, arrivals = self.receive_joined(timeout_s, max_datagrams)
        blob = blob.tobytes()
        ends = np.cumsum(lengths).tolist()
        return Datagrams([blob[a:b] for a, b in zip([0, *ends[:-1]], ends)], exporters,
                         arrivals)

    def receive_joined(self, timeout_s: float, max_datagrams: int = 4096) -> tuple:
        """`receive` as (the datagrams end to end, their lengths, exporters, arrival ns): for
        `FlowDecoder.decode_joined`, no Python object per datagram. The datagrams are a view
        of the thread's buffer when they lie in one (most often), else a copy."""
        if not self._queue:
            self._ready.wait(timeout_s)
        self._ready.clear()
        queue = self._queue
        parts: list[list] = []          # [buffer, start, end] of each run of bytes taken
        lengths, exporters, arrivals = [], [], []
        taken = 0
        while queue and taken < max_datagrams:
            stage, a, b, lens, exps, arrival = queue.popleft()
            self._queued -= len(lens)
            taken += len(lens)
            if parts and parts[-1][0] is stage and parts[-1][2] == a:
                parts[-1][2] = b                # the next bytes of the same buffer
            else:
                parts.append([stage, a, b])
            lengths.append(lens)
            exporters += exps
            arrivals += [arrival] * len(lens)
        if queue:
            self._ready.set()
        views = [stage[a:b] for stage, a, b in parts]
        return (views[0] if len(views) == 1 else
                np.concatenate(views) if views else np.zeros(0, np.uint8),
                np.concatenate(lengths) if lengths else np.zeros(0, np.int64), exporters,
                arrivals)

    @property
    def queued(self) -> int:
        """Datagrams received and waiting in the queue for `receive`."""
        return self._queued

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
