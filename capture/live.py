"""Live capture on Linux: an AF_PACKET socket with a memory-mapped TPACKET_V3 ring, read as `PacketBatch`es.

    with open_interface("eth0", link="uplink", block_size=1 << 22, block_count=64) as cap:
        while running:
            batch = cap.poll(0.5)          # None when nothing arrived within 0.5 s (a lull)
            if batch is not None:
                feed(batch)
        print(cap.stats.packets, cap.stats.kernel_drops)

The kernel writes packets into `block_count` blocks of `block_size` bytes and hands a block
over when it is full or `frame_timeout_ms` after its first packet (the latency bound of a
quiet link). `poll` walks the handed-over blocks with a Numba kernel (`capture.tpacket`) that
fills the framing columns of `capture.decode.make_columns`, decodes them with the file
reader's `decode_rows`, and only then gives the blocks back: batches never alias the ring.
Like `capture.reader.CaptureReader`, a batch is a VIEW into output columns reused by the next
`poll`: a consumer that keeps one must `batch.copy()` it.

Choices a user may need to know:
- Both directions are captured (what tcpdump does), or only one (`direction="in"` or
  `"out"`, tcpdump's `-Q`). On a loopback device every packet is tapped twice, once going out
  and once coming in: as libpcap does, the outgoing copy is dropped, so each packet counts
  once; `direction="out"` keeps the outgoing copy instead (libpcap would keep nothing). The
  directions and the snap length are applied in the kernel by a small BPF program
  (`capture.tpacket.capture_program`), so what is not wanted takes no ring space.
- A VLAN tag the NIC or the receive path moved into packet metadata is put back into the frame
  (as libpcap does), so `vlan` and the lengths are those of the frame on the wire.
- Drops: the kernel counts packets it could not store because every block was still ours
  (PACKET_STATISTICS, read and accumulated: each read resets the kernel's counters);
  `stats.freezes` counts how often that happened, `stats.losing_blocks` blocks the kernel
  marked as having lost packets before them.
- An interface that goes down is reported once in `stats.problems` and capture resumes when
  it comes back; one that is removed ends the capture (`ended`, iteration stops).
- Payloads (`payload=True`, or the attribute set later, from any thread: it is read once per
  `poll`): each batch also carries its packets' TCP/UDP payload bytes (`PacketBatch.payload`,
  `capture.payload`), copied out of the ring's frames before their blocks are given back. Off,
  nothing is copied and `batch.payload` is None.

Splitting an interface over several captures (PACKET_FANOUT):

    first = LiveCapture("eth0", fanout=Fanout())              # the kernel picks a free group id
    others = [LiveCapture("eth0", fanout=first.fanout) for _ in range(3)]

Sockets in one fanout group share the interface's packets: each packet goes to exactly one of
them (so per-socket counts add up to the interface's), while a capture outside the group still
sees everything. `mode="hash"` (the default) picks the socket from a hash of the addresses,
protocol and ports, made symmetric in July 2016 (kernel commit eb70db875671, Linux 4.7): both
directions of a flow go to the same socket, so per-flow state stays in one place (packet(7) and
packet_mmap.rst only promise "same flow, same socket"). The kernel does not read the ports of an
IP fragment, the first one included, so a datagram's fragments hash on addresses and protocol
alone: they stay together, but may go to another socket than the flow's unfragmented packets.
`defrag=True` (PACKET_FANOUT_FLAG_DEFRAG) has the kernel reassemble IPv4 datagrams before
choosing; the socket then gets the reassembled datagram instead of the fragments on the wire,
and nothing of a datagram whose fragments do not all arrive. Off by default: a monitor counts
what was on the wire. Other modes: "lb" (round robin), "cpu" (the CPU that received the
packet), "qm" (the NIC's receive queue), "rnd", "rollover"; none keeps flows together.

The group is a number of the network namespace (0-65535) that every member names with the same
mode, defrag setting and interface. `Fanout()` has the kernel pick one nobody uses (read it
back as `capture.fanout.group`); `fanout_group_for_process()` derives one from a process id,
for processes that must agree on it before any of them opens a socket. The hash is taken
modulo the group's size: while members join or leave, flows move between sockets, so open them
all before the traffic that matters, and give them the same `direction` (a packet the group
hands to a member whose direction rejects it is lost: it is not offered to another member).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import select
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capture.batch import PacketBatch, tally
from capture.decode import (
    LINK_ETHERNET,
    LINK_RAW,
    DecodeColumns,
    decode_rows,
    make_columns,
)
from capture.errors import InterfaceError
from capture.payload import concat as concat_payloads
from capture.payload import empty as empty_payloads
from capture.payload import gather as gather_payloads
from capture.reader import ReaderStats
from capture.schema import COLUMNS
from capture.tpacket import (
    ETH_P_ALL,
    FANOUT_MODES,
    MAX_SNAPLEN,
    PACKET_FANOUT_FLAG_DEFRAG,
    PACKET_FANOUT_FLAG_UNIQUEID,
    PACKET_RX_RING,
    SOL_PACKET,
    W_WRAPPED,
    add_promiscuous,
    attach_filter,
    block_ready,
    capture_program,
    frame_size_for,
    join_fanout,
    map_ring,
    read_statistics,
    release_blocks,
    ring_request,
    ring_views,
    set_version_v3,
    walk_blocks,
)
from common.errors import ConfigError

log = logging.getLogger(__name__)

#: ARPHRD_* device types -> the pcap link type of what a SOCK_RAW packet socket reads from them
_ARPHRD_LINKS = {
    1: LINK_ETHERNET,       # ARPHRD_ETHER (veth, bridges, bonds, most NICs)
    6: LINK_ETHERNET,       # ARPHRD_IEEE802
    772: LINK_ETHERNET,     # ARPHRD_LOOPBACK: Linux gives loopback frames an Ethernet header
    512: LINK_RAW,          # ARPHRD_PPP: no link header through a packet socket
    519: LINK_RAW,          # ARPHRD_RAWIP
    768: LINK_RAW,          # ARPHRD_TUNNEL (ipip)
    769: LINK_RAW,          # ARPHRD_TUNNEL6
    776: LINK_RAW,          # ARPHRD_SIT
    0xFFFE: LINK_RAW,       # ARPHRD_NONE (tun, wireguard)
}
#: ARPHRD_LOOPBACK: a device whose every packet is tapped going out and again coming in
_ARPHRD_LOOPBACK = 772
#: the snap length a capture needs when no query reads payloads (or `caplen`): every column
#: is decoded from the headers, and Ethernet with two VLAN tags, an MPLS stack, IPv6 with
#: extension headers and TCP with options fit (a frame whose headers do not is `truncated`)
HEADER_SNAPLEN = 256
#: --direction values (tcpdump's -Q)
DIRECTIONS = ("in", "out", "inout")
_PAGE = mmap.PAGESIZE


def _max_ring() -> int:
    """The largest ring accepted: half the physical memory (ring pages are pinned kernel memory)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 1 << 34


@dataclass(frozen=True)
class Fanout:
    """Membership of a PACKET_FANOUT group (see the module doc): `group` 0-65535, or None for a
    new group whose id the kernel picks; `mode` one of FANOUT_MODES; `defrag` reassembles IPv4
    datagrams before a member is chosen."""

    group: int | None = None
    mode: str = "hash"
    defrag: bool = False

    def __post_init__(self):
        if self.mode not in FANOUT_MODES:
            raise ConfigError(f"live capture option fanout mode={self.mode!r} is not valid: "
                              f"{', '.join(FANOUT_MODES)}")
        if self.group is not None and (isinstance(self.group, bool) or not isinstance(self.group, int)
                                       or not 0 <= self.group <= 0xFFFF):
            raise ConfigError(f"live capture option fanout group={self.group!r} is not valid: "
                              f"an integer from 0 to 65535, or None to have the kernel pick a free one")

    def describe(self) -> str:
        group = "a new group" if self.group is None else f"group {self.group}"
        return f"fanout {group} (mode {self.mode}{', defrag' if self.defrag else ''})"


def fanout_group_for_process(pid: int | None = None) -> int:
    """A fanout group id derived from a process id (this process's by default): `pid & 0xffff`,
    what the kernel's fanout example does. For worker processes that must agree on a group
    before any of them opens a socket: each passes the parent's pid (`os.getppid()`). Not
    guaranteed free: pids above 65535 wrap, so another process may use the same number
    (joining it fails when its mode or interface differs, and silently shares its packets when
    they do not); `Fanout()` (no group) is the collision-free way when one process opens the
    first socket."""
    return (os.getpid() if pid is None else int(pid)) & 0xFFFF


@dataclass
class LiveStats(ReaderStats):
    """What a live capture has seen: the reader's counters plus the kernel's and the ring's."""

    kernel_packets: int = 0     # packets the kernel passed to the socket (captured + dropped)
    kernel_drops: int = 0       # packets dropped because the ring was full
    freezes: int = 0            # times the kernel found the next block still ours (queue frozen)
    losing_blocks: int = 0      # blocks handed over with TP_STATUS_LOSING (drops happened before them)
    timeout_blocks: int = 0     # blocks handed over by the frame timeout rather than full
    bad_headers: int = 0        # packets skipped because their ring header was inconsistent
    blocks: int = 0             # blocks read

    def count(self, cols: dict[str, np.ndarray]) -> None:
        self.packets += len(cols["len"])
        wire, captured, _ = tally(cols["len"], cols["caplen"], cols["reason"], self.reason_counts,
                                  cols["timestamp"])
        self.bytes += int(wire)
        self.captured_bytes += int(captured)


def interfaces() -> list[str]:
    """Names of the network interfaces of this namespace, sorted."""
    try:
        return sorted(name for _, name in socket.if_nameindex())
    except OSError:
        net = Path("/sys/class/net")
        return sorted(p.name for p in net.iterdir()) if net.is_dir() else []


def _interface_index(interface: str) -> int:
    try:
        return socket.if_nametoindex(interface)
    except (OSError, ValueError):
        names = ", ".join(interfaces()) or "none"
        raise InterfaceError(f"interface {interface!r} does not exist (interfaces here: {names})") from None


def _device_type(interface: str) -> int | None:
    """The interface's ARPHRD_* device type, or None without sysfs (an unusual container)."""
    try:
        return int(Path(f"/sys/class/net/{interface}/type").read_text().strip())
    except (OSError, ValueError):
        return None


def _link_type(interface: str) -> int:
    hatype = _device_type(interface)
    if hatype is None:
        return LINK_ETHERNET  # no sysfs: the common case
    link = _ARPHRD_LINKS.get(hatype)
    if link is None:
        raise InterfaceError(f"interface {interface!r} has device type ARPHRD {hatype}, whose frames oopscope "
                             f"does not decode (Ethernet, loopback and raw-IP devices are supported)")
    return link


def _check_options(snaplen: int, block_size: int, block_count: int, frame_timeout_ms: int, batch_size: int,
                   direction: str = "inout") -> None:
    def bad(option: str, value, allowed: str):
        raise ConfigError(f"live capture option {option}={value!r} is not valid: {allowed}")

    if direction not in DIRECTIONS:
        bad("direction", direction, ", ".join(DIRECTIONS))

    if not 1 <= snaplen <= MAX_SNAPLEN:
        bad("snaplen", snaplen, f"between 1 and {MAX_SNAPLEN} bytes")
    if block_size < _PAGE or block_size % _PAGE:
        bad("block_size", block_size, f"a positive multiple of the page size ({_PAGE} bytes)")
    if block_size >= 1 << 31:
        bad("block_size", block_size, "below 2 GiB")
    if block_count < 1:
        bad("block_count", block_count, "at least 1")
    if block_size * block_count > _max_ring():
        bad("block_count", block_count, f"the ring (block_size * block_count) must stay within half the "
            f"memory ({_max_ring() >> 20} MiB): the kernel pins it")
    if not 0 <= frame_timeout_ms < 1 << 31:
        bad("frame_timeout_ms", frame_timeout_ms, "0 (the kernel's default) or a positive number of ms")
    if batch_size < 1:
        bad("batch_size", batch_size, "at least 1")


class LiveCapture:
    """Packets of one interface as `PacketBatch`es, from a TPACKET_V3 ring (see the module doc).

    `poll(timeout_s)` gives the next batch or None after `timeout_s` of nothing; iterating
    gives batches (no empty ones) until `close()`. Use as a context manager.
    """

    def __init__(self, interface: str, link: str | None = None, *, snaplen: int = MAX_SNAPLEN,
                 promiscuous: bool = False, block_size: int = 1 << 22, block_count: int = 64,
                 frame_timeout_ms: int = 100, batch_size: int = 65536, direction: str = "inout",
                 fanout: Fanout | None = None, payload: bool = False):
        self.interface = str(interface)
        self.link = link if link is not None else self.interface
        snaplen, block_size, block_count = int(snaplen), int(block_size), int(block_count)
        frame_timeout_ms, batch_size = int(frame_timeout_ms), int(batch_size)
        _check_options(snaplen, block_size, block_count, frame_timeout_ms, batch_size, direction)
        if fanout is not None and not isinstance(fanout, Fanout):
            raise ConfigError(f"live capture option fanout={fanout!r} is not valid: "
                              f"a capture.live.Fanout or None")
        #: the fanout group joined, with the id the kernel picked when none was asked for
        self.fanout: Fanout | None = None
        self.direction = direction
        #: the kernel hands a block over at most this long after its first packet
        self.frame_timeout_ms = frame_timeout_ms
        self.snaplen = snaplen
        self._ring_snaplen = snaplen          # what the ring's frames were sized for
        self.block_size = block_size
        self.block_count = block_count
        self.batch_size = batch_size
        #: batches carry TCP/UDP payloads (module doc); may be switched from another thread
        self.payload = bool(payload)
        self.ended = False
        self._stats = LiveStats()
        self._sock: socket.socket | None = None
        self._mm: mmap.mmap | None = None
        self._ifindex = _interface_index(self.interface)
        self._link_type = _link_type(self.interface)
        self.loopback = _device_type(self.interface) == _ARPHRD_LOOPBACK
        try:
            self._open(promiscuous, frame_timeout_ms)
            if fanout is not None:
                self.fanout = self._join_fanout(fanout)
        except BaseException:
            self.close()
            raise
        self._out: DecodeColumns = make_columns(batch_size)
        self._cursor = np.zeros(3, np.int64)
        self._done = np.zeros(block_count, np.int64)
        self._counters = np.zeros(3, np.int64)
        self._poller = select.poll()
        self._poller.register(self.fileno(), select.POLLIN | select.POLLERR)   # _open made the socket
        self._down = False
        self._warm()

    # --- setup -----------------------------------------------------------------------------
    def _open(self, promiscuous: bool, timeout_ms: int) -> None:
        name = self.interface
        try:
            # protocol 0 at creation: the socket sees nothing until bind() names the interface
            # and ETH_P_ALL, so no other interface's packets slip into the ring in between
            self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        except PermissionError:
            raise InterfaceError(f"capturing on interface {name!r} needs root or the CAP_NET_RAW capability "
                                 f"(opening a packet socket was refused)") from None
        except OSError as exc:
            raise InterfaceError(f"cannot open a packet socket for interface {name!r}: "
                                 f"{exc.strerror or exc}") from None
        sock = self._sock
        frame = frame_size_for(self.snaplen, self.block_size)
        # on loopback both copies of a packet are tapped: keep one (libpcap keeps the
        # incoming one; with "out", the outgoing one)
        outgoing = self.direction == "out" or (self.direction == "inout" and not self.loopback)
        incoming = self.direction != "out"
        self._directions = (outgoing, incoming)
        try:
            set_version_v3(sock)
            attach_filter(sock, capture_program(self.snaplen, outgoing, incoming))
        except OSError as exc:
            raise InterfaceError(f"interface {name!r}: the kernel refused TPACKET_V3 ({exc.strerror or exc}); "
                                 f"Linux 3.2 or later is needed") from None
        try:
            sock.setsockopt(SOL_PACKET, PACKET_RX_RING, ring_request(self.block_size, self.block_count, frame, timeout_ms))
        except OSError as exc:
            size = self.block_size * self.block_count
            if exc.errno == errno.ENOMEM:
                raise ConfigError(f"live capture ring of {self.block_count} blocks of {self.block_size} bytes "
                                  f"({size >> 20} MiB) could not be allocated: lower block_count or "
                                  f"block_size") from None
            raise ConfigError(f"the kernel refused the live capture ring for {name!r} (block_size="
                              f"{self.block_size}, block_count={self.block_count}, frame_timeout_ms={timeout_ms}):"
                              f" {exc.strerror or exc}") from None
        self._mm = map_ring(sock, self.block_size * self.block_count)
        self._r8, self._r16, self._r32 = ring_views(self._mm)
        try:
            sock.bind((name, ETH_P_ALL))
            if promiscuous:
                add_promiscuous(sock, self._ifindex)
        except OSError as exc:
            if exc.errno == errno.ENODEV:
                _interface_index(name)  # gone since we looked: the "does not exist" message
            raise InterfaceError(f"cannot capture on interface {name!r}: {exc.strerror or exc}") from None
        log.info("capturing on %s (link %s): %d blocks of %d KiB, snaplen %d, %s%s", name, self.link,
                 self.block_count, self.block_size >> 10, self.snaplen,
                 "outgoing and incoming" if outgoing and incoming else "outgoing" if outgoing else "incoming",
                 ", promiscuous" if promiscuous else "")

    def set_snaplen(self, snaplen: int) -> None:
        """Keep `snaplen` bytes of each frame from now on (the kernel's filter is replaced; the
        ring, sized for the snap length the capture was opened with, stays): the appliance
        captures headers only until a query reads payloads. At most the opening snap length."""
        snaplen = int(snaplen)
        if self._sock is None or snaplen == self.snaplen:
            return
        if not 1 <= snaplen <= self._ring_snaplen:
            raise ConfigError(f"live capture option snaplen={snaplen!r} is not valid: between 1 "
                              f"and the {self._ring_snaplen} bytes the capture was opened with")
        try:
            attach_filter(self._sock, capture_program(snaplen, *self._directions))
        except OSError as exc:
            raise InterfaceError(f"interface {self.interface!r}: the kernel refused a new snap "
                                 f"length ({exc.strerror or exc})") from None
        log.info("capture on %s keeps %d bytes of each frame", self.interface, snaplen)
        self.snaplen = snaplen

    def _join_fanout(self, fanout: Fanout) -> Fanout:
        """Join the group once bound: the kernel refuses an unbound socket. A packet arriving in
        the microseconds between bind and join reaches this socket and the group both; the
        other order possible (join with a drop-all filter, then attach the real one) would lose
        such packets instead, the first member's too."""
        assert self._sock is not None   # _open made it
        mode = FANOUT_MODES[fanout.mode]
        flags = PACKET_FANOUT_FLAG_DEFRAG if fanout.defrag else 0
        if fanout.group is None:
            flags |= PACKET_FANOUT_FLAG_UNIQUEID
        where = f"interface {self.interface!r}: cannot join {fanout.describe()}"
        try:
            group = join_fanout(self._sock, fanout.group or 0, mode, flags)
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno == errno.EINVAL and fanout.group is None:
                why = "this kernel cannot pick a free group id (Linux 4.12 or later can); name a group"
            elif exc.errno == errno.EINVAL:
                newer = "" if fanout.mode in ("hash", "lb", "cpu") else \
                    f" (or this kernel lacks mode {fanout.mode!r})"
                why = (f"group {fanout.group} exists in this network namespace with another mode, defrag "
                       f"setting or interface{newer}; pick another group or the same options")
            elif exc.errno == errno.ENOSPC:
                why = "the group is full"
            elif exc.errno == errno.ENOMEM and fanout.group is None:
                why = "every group id is in use"
            elif exc.errno == errno.ENOPROTOOPT:
                why = "this kernel has no PACKET_FANOUT (Linux 3.1 or later has)"
            raise InterfaceError(f"{where}: {why}") from None
        joined = Fanout(group, fanout.mode, fanout.defrag)
        log.info("capture on %s joined %s", self.interface, joined.describe())
        return joined

    def _warm(self) -> None:
        """Load (or compile) the kernels now, with calls that touch nothing: a first poll takes
        about a second otherwise, which would break its timeout."""
        walk_blocks(self._r32, self._r16, self._r8, self.block_size, self.block_count, self._cursor,
                    self._link_type, self.snaplen, True, self._out, 0, 0, self._done, self._counters)
        decode_rows(self._r8, self._out, 0, 0)
        gather_payloads(self._r8, self._out, 0, 0)     # cached on disk: cheap even when unused
        release_blocks(self._r32, self.block_size, self._done, 0)
        block_ready(self._r32, self.block_size, 0)

    # --- context manager -------------------------------------------------------------------
    def __enter__(self) -> LiveCapture:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop capturing (idempotent). The kernel counters are read one last time first."""
        if self._sock is not None:
            self._read_kernel_stats()
        # the numpy views pin the mapping: drop them before unmapping
        self._r8 = self._r16 = self._r32 = None  # type: ignore[assignment]  # closed: no use follows
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def closed(self) -> bool:
        return self._sock is None

    def fileno(self) -> int:
        """The socket's descriptor (readable when a block is handed over), for a caller's own poll."""
        if self._sock is None:
            raise ValueError("live capture is closed")
        return self._sock.fileno()

    # --- statistics ------------------------------------------------------------------------
    @property
    def stats(self) -> LiveStats:
        """Counters so far (reads and accumulates the kernel's, which reset on every read)."""
        if self._sock is not None:
            self._read_kernel_stats()
        return self._stats

    def _read_kernel_stats(self) -> None:
        assert self._sock is not None   # callers check that the capture is open
        try:
            packets, drops, freezes = read_statistics(self._sock)
        except OSError as exc:  # not expected on a live socket; never fatal
            log.debug("PACKET_STATISTICS failed on %s: %s", self.interface, exc)
            return
        st = self._stats
        st.kernel_packets += packets
        st.kernel_drops += drops
        st.freezes += freezes

    # --- reading ---------------------------------------------------------------------------
    def ready(self) -> bool:
        """True when a handed-over block waits to be read (poll(0) would return a batch)."""
        if self._sock is None:
            return False
        return bool(block_ready(self._r32, self.block_size, self._cursor[0]))

    def poll(self, timeout_s: float) -> PacketBatch | None:
        """The packets of the blocks handed over so far (up to `batch_size`), waiting up to
        `timeout_s` seconds for one; None when nothing came (or the capture is closed/ended)."""
        if self._sock is None or self.ended:
            return None
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        while True:
            batch = self._read()
            if batch is not None:
                self._down = False
                return batch
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            events = self._poller.poll(max(1, int(left * 1000 + 0.999)))
            if any(ev & select.POLLERR for _, ev in events):
                self._socket_error()
                if self.ended:
                    return None
                time.sleep(min(left, 0.05))  # the interface is down: do not spin on POLLERR

    def __iter__(self) -> Iterator[PacketBatch]:
        """Batches until close() (or until the interface is removed); lulls are skipped."""
        while self._sock is not None and not self.ended:
            batch = self.poll(0.1)
            if batch is not None:
                yield batch

    def _read(self) -> PacketBatch | None:
        out = self._out
        row = 0
        # read once: another thread may switch it, and a batch has payloads for all rows or none
        parts: list | None = [] if self.payload else None
        while row < self.batch_size:
            first = row
            row, status, ndone = walk_blocks(
                self._r32, self._r16, self._r8, self.block_size, self.block_count, self._cursor,
                self._link_type, self.snaplen, self._link_type == LINK_ETHERNET, out, row, self.batch_size,
                self._done, self._counters)
            # decode (and copy the payloads) while the frames are still ours; only then give
            # their blocks back
            decode_rows(self._r8, out, first, row)
            if parts is not None and row > first:
                parts.append(gather_payloads(self._r8, out, first, row))
            if ndone:
                release_blocks(self._r32, self.block_size, self._done, ndone)
                self._stats.blocks += ndone
            if status != W_WRAPPED:
                break
        c = self._counters
        st = self._stats
        st.losing_blocks, st.timeout_blocks, st.bad_headers = int(c[0]), int(c[1]), int(c[2])
        if row == 0:
            return None
        cols = {col.name: getattr(out, col.name)[:row] for col in COLUMNS}
        st.count(cols)
        payload = None
        if parts is not None:
            payload = concat_payloads(parts) if parts else empty_payloads(row)
        return PacketBatch(self.link, cols, payload=payload)

    def _socket_error(self) -> None:
        """POLLERR: the interface went down (resumes when it comes back up) or was removed (ends)."""
        assert self._sock is not None   # polled only while open
        err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # reading clears it
        try:
            index = socket.if_nametoindex(self.interface)
        except OSError:
            index = 0
        if index != self._ifindex:
            msg = f"interface {self.interface!r} was removed; capture on link {self.link!r} ended"
            self.ended = True
        elif not self._down:
            msg = f"interface {self.interface!r} went down ({os.strerror(err) if err else 'error'}); waiting for it"
            self._down = True
        else:
            return
        self._stats.problems.append(msg)
        log.warning("%s", msg)


def snaplen_for(columns) -> int:
    """The snap length a capture needs for consumers that read `columns` (None: they cannot
    tell): every byte for payloads and `caplen`, the headers otherwise (as GS-lite derives a
    query's snap length from the fields it reads)."""
    if columns is None or "payload" in columns or "caplen" in columns:
        return MAX_SNAPLEN
    return HEADER_SNAPLEN


def open_interface(interface: str, link: str | None = None, **options) -> LiveCapture:
    """Open a live capture on `interface` (the link is named after it unless `link` is given).

    Options: snaplen, promiscuous, block_size, block_count, frame_timeout_ms, batch_size,
    direction ("in", "out" or "inout"), fanout (a `Fanout`; see LiveCapture and the module doc),
    payload (batches carry TCP/UDP payloads).
    Raises InterfaceError (missing interface, no permission, undecodable device type, a fanout
    group that cannot be joined) and ConfigError (invalid options), both with a one-line message.
    """
    return LiveCapture(interface, link, **options)
