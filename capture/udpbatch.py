"""Many UDP datagrams per system call: `recvmmsg(2)` through ctypes into one preallocated
buffer (a slot per datagram) with arrays of their lengths and sender addresses.

    rx = UdpBatchReceiver(sock, slots=1024, slot_size=16384)
    n = rx.receive(timeout_s=0.1)          # datagrams now in rx.buffer[i, :rx.lengths[i]]
    rx.sender(i)                           # ("192.0.2.1", 2055)

A flow collector at a million records a second gets ~40,000 datagrams a second: one
`recvfrom` each (a Python call, a bytes object, a tuple for the address) costs more than
decoding their records. One `recvmmsg` takes up to `slots` datagrams in one call and makes no
Python object per datagram. Where recvmmsg is missing (not Linux, no libc symbol) the same
arrays are filled by a loop of `recvfrom_into` (`fallback=True` forces it, for the tests).

A datagram longer than its slot is cut to it, its `lengths` entry keeps the length it had
(`MSG_TRUNC`): a reader sees it is cut and counts it as malformed.

`big_receive_buffer` sizes a socket's receive buffer: `SO_RCVBUFFORCE` (root, past
net.core.rmem_max) else `SO_RCVBUF` (capped by rmem_max); it returns what the kernel gave.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import select
import socket
import sys

import numpy as np

from common.jit import ngjit

log = logging.getLogger(__name__)

#: Linux constants (not all in the socket module)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
MSG_TRUNC = getattr(socket, "MSG_TRUNC", 0x20)
MSG_WAITFORONE = 0x10000
#: the largest sockaddr (sockaddr_in6 is 28 bytes)
ADDR_SIZE = 28


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc_recvmmsg():
    """libc's recvmmsg, or None where it is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.recvmmsg
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_RECVMMSG = _libc_recvmmsg()


def big_receive_buffer(sock: socket.socket, size: int) -> int:
    """Ask for a `size`-byte receive buffer (forced past rmem_max when we may); the size
    the kernel gave (it doubles what is asked, for its bookkeeping)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, size)
    except OSError:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
        except OSError as exc:
            log.warning("cannot set the receive buffer to %d bytes: %s", size, exc)
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)


def sockaddr_text(raw) -> tuple[str, int]:
    """(address, port) of a sockaddr_in / sockaddr_in6 as bytes."""
    family = int.from_bytes(bytes(raw[0:2]), sys.byteorder)
    port = (int(raw[2]) << 8) | int(raw[3])
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, bytes(raw[8:24])), port
    return socket.inet_ntop(socket.AF_INET, bytes(raw[4:8])), port


@ngjit
def compact(buffer, lengths, n, out):
    """Datagrams 0..n-1 of `buffer` (cut to their slot) end to end into `out`; bytes
    written."""
    # unsigned indices: no negative-index check per byte, so the loop is vectorised (a
    # plain memory copy's speed, 8x the slice assignment's)
    p = np.uint64(0)
    width = buffer.shape[1]
    flat = buffer.reshape(-1)
    for i in range(n):
        k = np.uint64(min(lengths[i], width))
        base = np.uint64(i * width)
        for j in range(k):
            out[p + j] = flat[base + j]
        p += k
    return p


class UdpBatchReceiver:
    """Receives a bound UDP socket's datagrams `slots` at a time into `buffer` (module
    docstring). After `receive` returned n: datagram i is `buffer[i, :min(lengths[i],
    slot_size)]`, its sender's sockaddr `addresses[i]` (`sender(i)` as text)."""

    def __init__(self, sock: socket.socket, slots: int = 1024, slot_size: int = 16384,
                 fallback: bool = False):
        self.sock = sock
        self.slots = int(slots)
        self.slot_size = int(slot_size)
        self.buffer = np.zeros((self.slots, self.slot_size), np.uint8)
        self.lengths = np.zeros(self.slots, np.int64)
        self.addresses = np.zeros((self.slots, ADDR_SIZE), np.uint8)
        self.uses_recvmmsg = _RECVMMSG is not None and not fallback
        self._fd = sock.fileno()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN)
        if self.uses_recvmmsg:
            self._setup_mmsg()
        else:
            # recvfrom_into wants a writable buffer per slot: views kept once
            self._views = [memoryview(self.buffer[i]) for i in range(self.slots)]

    def _setup_mmsg(self) -> None:
        n = self.slots
        self._iov = (_Iovec * n)()
        self._msgs = (_Mmsghdr * n)()
        base = self.buffer.ctypes.data
        abase = self.addresses.ctypes.data
        for i in range(n):
            self._iov[i].iov_base = base + i * self.slot_size
            self._iov[i].iov_len = self.slot_size
            h = self._msgs[i].msg_hdr
            h.msg_name = abase + i * ADDR_SIZE
            h.msg_namelen = ADDR_SIZE
            h.msg_iov = ctypes.addressof(self._iov[i])
            h.msg_iovlen = 1
        # msg_len of each entry, read as one array after a call (no Python loop)
        stride = ctypes.sizeof(_Mmsghdr)
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * (stride * n)).from_address(
            ctypes.addressof(self._msgs)))
        off = _Mmsghdr.msg_len.offset
        self._msg_len = raw.reshape(n, stride)[:, off:off + 4].view(np.uint32)[:, 0]
        foff = _Msghdr.msg_flags.offset
        self._msg_flags = raw.reshape(n, stride)[:, foff:foff + 4].view(np.int32)[:, 0]
        noff = _Msghdr.msg_namelen.offset
        self._namelen = raw.reshape(n, stride)[:, noff:noff + 4].view(np.uint32)[:, 0]

    def receive(self, timeout_s: float) -> int:
        """Wait up to `timeout_s` for a datagram, then take every one queued (up to
        `slots`) without waiting more; how many (0: none came). Raises OSError when the
        socket is closed."""
        if not self._poll.poll(max(0, int(timeout_s * 1000))):
            return 0
        if self.uses_recvmmsg:
            return self._receive_mmsg()
        return self._receive_loop()

    def _receive_mmsg(self) -> int:
        self._namelen[:] = ADDR_SIZE
        # MSG_TRUNC: a cut datagram's msg_len is the length it had
        n = _RECVMMSG(self._fd, ctypes.addressof(self._msgs), self.slots,
                      MSG_DONTWAIT | MSG_TRUNC, None)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return 0
            raise OSError(err, errno.errorcode.get(err, "recvmmsg failed"))
        lens = self._msg_len[:n].astype(np.int64)
        # a cut datagram: recvmmsg gives the bytes kept; the slot is full and MSG_TRUNC set
        cut = (self._msg_flags[:n] & MSG_TRUNC) != 0
        if cut.any():
            lens[cut] = np.maximum(lens[cut], self.slot_size + 1)
        self.lengths[:n] = lens
        return int(n)

    def _receive_loop(self) -> int:
        n = 0
        recv = self.sock.recvfrom_into
        while n < self.slots:
            try:
                got, addr = recv(self._views[n], self.slot_size, MSG_DONTWAIT | MSG_TRUNC)
            except (BlockingIOError, InterruptedError):
                break
            self.lengths[n] = got
            self._put_address(n, addr)
            n += 1
        return n

    def _put_address(self, i: int, addr) -> None:
        a = self.addresses[i]
        a[:] = 0
        if ":" in addr[0]:
            a[0:2] = np.frombuffer(socket.AF_INET6.to_bytes(2, sys.byteorder), np.uint8)
            a[8:24] = np.frombuffer(socket.inet_pton(socket.AF_INET6, addr[0]), np.uint8)
        else:
            a[0:2] = np.frombuffer(socket.AF_INET.to_bytes(2, sys.byteorder), np.uint8)
            a[4:8] = np.frombuffer(socket.inet_aton(addr[0]), np.uint8)
        a[2], a[3] = addr[1] >> 8, addr[1] & 0xFF

    def kept_lengths(self, n: int) -> np.ndarray:
        """The lengths of datagrams 0..n-1 of the last receive as kept (cut to the slot)."""
        return np.minimum(self.lengths[:n], self.slot_size)

    def join_into(self, n: int, kept: np.ndarray, out: np.ndarray) -> None:
        """Datagrams 0..n-1 of the last receive end to end (cut to their slot, `kept`) into
        `out` (of kept.sum() bytes): one copy, no Python object per datagram."""
        compact(self.buffer, kept, n, out)

    def datagram(self, i: int) -> bytes:
        """Datagram i of the last receive (cut to the slot when it was longer)."""
        return self.buffer[i, :min(int(self.lengths[i]), self.slot_size)].tobytes()

    def sender(self, i: int) -> tuple[str, int]:
        """(address, port) of datagram i's sender."""
        return sockaddr_text(self.addresses[i])
