"""Where datagrams go: a UDP sender that never raises on a dead collector, and a pcap writer.

`UdpSender` connects a UDP socket to HOST:PORT (IPv4 or IPv6), so that an ICMP port
unreachable from a collector that is down comes back as ECONNREFUSED on a later send: every
failed send (refused, unreachable network, no buffer space ...) is counted with its errno and
the records it carried, logged once per kind, and never raised: a collector that is down never
stops a query. Pacing: a collector on loopback (nfcapd) reads one datagram per syscall and
drops what overflows its socket buffer, so by default the sender keeps to `pace` datagrams a
second (checked every `burst` datagrams); 0 disables pacing.

`PcapWriter` writes the same datagrams as Ethernet/IP/UDP packets (timestamps = export
times) so tshark can decode them (`-d udp.port==PORT,cflow`).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass, field

from tools.errors import NetflowTargetError

log = logging.getLogger(__name__)

DEFAULT_PORT = 2055
#: datagrams a second by default (~60k v9 records/s): a collector with its default socket
#: receive buffer (nfcapd: 208 KiB) loses datagrams sent faster, and most of them unpaced.
#: Raise --pace for a collector with a big socket buffer (`nfcapd -B 33554432`).
DEFAULT_PACE = 2_000


def parse_target(text: str, default_port: int | None = None) -> tuple[str, int]:
    """(host, port) of `HOST:PORT`, `[IPv6]:PORT` or a bare IPv6 address with a default port."""
    text = text.strip()
    host = text
    raw_port: str | int | None = None   # as given (or the default), checked below
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise NetflowTargetError(f"collector {text!r}: missing ']' after the IPv6 address")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise NetflowTargetError(f"collector {text!r}: expected :PORT after ']'")
            raw_port = rest[1:]
    elif text.count(":") == 1:
        host, raw_port = text.split(":")
    elif text.count(":") > 1:  # a bare IPv6 address
        host = text
    if raw_port is None:
        if default_port is None:
            raise NetflowTargetError(f"collector {text!r} is not HOST:PORT (e.g. 127.0.0.1:2055 "
                                     f"or [::1]:2055)")
        raw_port = default_port
    try:
        port = int(raw_port)
    except ValueError:
        raise NetflowTargetError(f"collector {text!r}: port {raw_port!r} is not a number") from None
    if not 0 < port < 65536:
        raise NetflowTargetError(f"collector {text!r}: port {port} is not in 1..65535")
    if not host:
        raise NetflowTargetError(f"collector {text!r}: no host")
    return host, port


def resolve(host: str, port: int) -> tuple[int, tuple]:
    """(address family, sockaddr) of a UDP destination."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise NetflowTargetError(f"collector {host}:{port}: cannot resolve {host!r}: "
                                 f"{exc.strerror}") from None
    family, _, _, _, sockaddr = infos[0]
    return family, sockaddr


def max_payload(mtu: int, ipv6: bool) -> int:
    """UDP payload bytes in one unfragmented datagram of a path with this MTU."""
    return mtu - (40 if ipv6 else 20) - 8


@dataclass
class SendStats:
    datagrams: int = 0
    records: int = 0
    bytes: int = 0
    failed_datagrams: int = 0
    failed_records: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"datagrams": self.datagrams, "records": self.records, "bytes": self.bytes,
                "failed_datagrams": self.failed_datagrams, "failed_records": self.failed_records,
                "errors": dict(self.errors)}


class UdpSender:
    """Sends datagrams to one collector; counts what went and what failed, never raises."""

    def __init__(self, target: str, pace: float = DEFAULT_PACE, burst: int = 16,
                 sndbuf: int | None = None):
        self.host, self.port = parse_target(target)
        self.family, self.sockaddr = resolve(self.host, self.port)
        self.ipv6 = self.family == socket.AF_INET6
        self.pace, self.burst = float(pace), max(1, int(burst))
        self.stats = SendStats()
        self.sock = socket.socket(self.family, socket.SOCK_DGRAM)
        if sndbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sndbuf))
        self._connected = False
        self._connect()
        self._t0: float | None = None
        self._paced = 0

    def _connect(self) -> None:
        try:
            self.sock.connect(self.sockaddr)
            self._connected = True
        except OSError as exc:  # no route now: count on send, try again later
            self._fail(exc, 0, count=False)

    def _fail(self, exc: OSError, records: int, count: bool = True) -> None:
        name = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__
        if name not in self.stats.errors:
            log.warning("netflow: sending to %s:%d failed: %s (counted, not raised)",
                        self.host, self.port, os.strerror(exc.errno) if exc.errno else exc)
        self.stats.errors[name] = self.stats.errors.get(name, 0) + 1
        if count:
            self.stats.failed_datagrams += 1
            self.stats.failed_records += records

    def _wait(self) -> None:
        """Keep to `pace` datagrams a second, sleeping once per `burst` datagrams."""
        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        self._paced += 1
        if self._paced % self.burst == 0:
            ahead = self._t0 + self._paced / self.pace - now
            if ahead > 0:
                time.sleep(ahead)
            elif ahead < -1.0:  # long idle: do not burst to catch up
                self._t0, self._paced = now, 0

    def send(self, datagrams) -> None:
        """Send (payload, records, export ms) datagrams; failures counted, never raised."""
        for payload, records, _ in datagrams:
            if self.pace > 0:
                self._wait()
            try:
                if not self._connected:
                    self.sock.connect(self.sockaddr)
                    self._connected = True
                self.sock.send(payload)
            except OSError as exc:
                self._fail(exc, records)
                continue
            self.stats.datagrams += 1
            self.stats.records += records
            self.stats.bytes += len(payload)

    def close(self) -> None:
        self.sock.close()


class PcapWriter:
    """Datagrams as Ethernet/IPv4 or IPv6/UDP packets in a classic pcap (µs timestamps)."""

    def __init__(self, path, dst: tuple[str, int] = ("127.0.0.1", DEFAULT_PORT),
                 src: tuple[str, int] | None = None):
        """`path`: a file name, or a binary file object to write into (`tools.results`)."""
        self.dst_ip = ipaddress.ip_address(dst[0])
        self.ipv6 = self.dst_ip.version == 6
        self.src_ip = ipaddress.ip_address(src[0] if src else ("::1" if self.ipv6 else "127.0.0.1"))
        self.dst_port = dst[1]
        self.src_port = src[1] if src else 50000
        self.packets = 0
        self.fh = open(path, "wb") if isinstance(path, (str, os.PathLike)) else path
        self.fh.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))

    @staticmethod
    def _checksum(data: bytes) -> int:
        if len(data) % 2:
            data += b"\0"
        total = sum(struct.unpack(f">{len(data) // 2}H", data))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        return (~total & 0xFFFF) or 0xFFFF

    def _frame(self, payload: bytes) -> bytes:
        udp_len = 8 + len(payload)
        udp = struct.pack(">HHHH", self.src_port, self.dst_port, udp_len, 0) + payload
        if self.ipv6:
            pseudo = (self.src_ip.packed + self.dst_ip.packed
                      + struct.pack(">IxxxB", udp_len, 17))
            csum = self._checksum(pseudo + udp)
            udp = udp[:6] + struct.pack(">H", csum) + udp[8:]
            ip = (struct.pack(">IHBB", 6 << 28, udp_len, 17, 64)
                  + self.src_ip.packed + self.dst_ip.packed)
            ethertype = 0x86DD
        else:
            head = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + udp_len, self.packets & 0xFFFF,
                               0x4000, 64, 17, 0, self.src_ip.packed, self.dst_ip.packed)
            ip = head[:10] + struct.pack(">H", self._checksum(head)) + head[12:]
            ethertype = 0x0800
        eth = b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01" + struct.pack(">H", ethertype)
        return eth + ip + udp

    def send(self, datagrams) -> None:
        for payload, _, export_ms in datagrams:
            frame = self._frame(payload)
            self.fh.write(struct.pack("<IIII", export_ms // 1000, (export_ms % 1000) * 1000,
                                      len(frame), len(frame)) + frame)
            self.packets += 1

    def close(self) -> None:
        self.fh.close()
