"""The Linux TPACKET_V3 receive ring: socket options, ring layout and the Numba kernel that walks retired blocks.

Layout (linux/if_packet.h; host byte order, every header 4-byte aligned, blocks page aligned):

    block:  tpacket_block_desc { u32 version; u32 offset_to_priv;
            tpacket_hdr_v1 { u32 block_status @8; u32 num_pkts @12; u32 offset_to_first_pkt @16;
                             u32 blk_len @20; u64 seq_num @24; ts_first @32; ts_last @40 } }
    packet: tpacket3_hdr { u32 tp_next_offset @0; u32 tp_sec @4; u32 tp_nsec @8; u32 tp_snaplen @12;
            u32 tp_len @16; u32 tp_status @20; u16 tp_mac @24; u16 tp_net @26;
            u32 tp_rxhash @28; u32 tp_vlan_tci @32; u16 tp_vlan_tpid @36 }  (tp_mac: from the header)

The kernel hands a whole block to user space (block_status & TP_STATUS_USER) when it is full
or when `retire_blk_tov` ms passed since its first packet; user space gives it back by writing
TP_STATUS_KERNEL. Blocks are used in ring order, so one cursor (block, packet, offset) walks
them. When the next block is still ours the kernel freezes the queue and drops (counted in
PACKET_STATISTICS: tp_drops, tp_freeze_q_cnt; each read resets them).
"""

from __future__ import annotations

import ctypes
import mmap
import socket
import struct

import numpy as np

from common.jit import ngjit

# --- socket options (linux/if_packet.h, asm-generic/socket.h) ---------------------------------
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
PACKET_RESERVE = 12
PACKET_FANOUT = 18
PACKET_MR_PROMISC = 1
TPACKET_V3 = 2
SO_ATTACH_FILTER = 26
ETH_P_ALL = 0x0003
#: sockaddr_ll.sll_pkttype of a packet the host sends (linux/if_packet.h)
PACKET_OUTGOING = 4
#: PACKET_FANOUT modes (linux/if_packet.h PACKET_FANOUT_*), by the names `capture.live.Fanout` takes
FANOUT_MODES = {"hash": 0, "lb": 1, "cpu": 2, "rollover": 3, "rnd": 4, "qm": 5}
#: the kernel picks a group id nobody uses (Linux 4.12); the group id passed must be 0
PACKET_FANOUT_FLAG_UNIQUEID = 0x2000
#: IPv4 fragments are reassembled before the group picks a socket (the socket gets the datagram)
PACKET_FANOUT_FLAG_DEFRAG = 0x8000

# classic BPF (linux/filter.h): the instructions capture_program uses
BPF_LDB_ABS = 0x30        # BPF_LD | BPF_B | BPF_ABS: A = the byte at k (k < 0: ancillary data)
BPF_JEQ_K = 0x15          # BPF_JMP | BPF_JEQ | BPF_K: pc += A == k ? jt : jf
BPF_RET_K = 0x06          # BPF_RET | BPF_K: keep k bytes of the packet (0: drop it)
#: the ancillary "offset" SKF_AD_OFF + SKF_AD_PKTTYPE (-0x1000 + 4): loads skb->pkt_type
SKF_AD_PKTTYPE = (-0x1000 + 4) & 0xFFFF_FFFF

TP_STATUS_KERNEL = 0
TP_STATUS_USER = 1 << 0
TP_STATUS_LOSING = 1 << 2
TP_STATUS_VLAN_VALID = 1 << 4
TP_STATUS_BLK_TMO = 1 << 5
TP_STATUS_VLAN_TPID_VALID = 1 << 6

TPACKET_ALIGNMENT = 16
#: TPACKET_ALIGN(sizeof(struct tpacket3_hdr)) + sizeof(struct sockaddr_ll): frame data starts later
TPACKET3_HDRLEN = 48 + 20
#: PACKET_RESERVE: room before the frame to put back a VLAN tag the NIC (or the receive path)
#: took out into metadata, as libpcap does
VLAN_TAG_LEN = 4
#: the largest snap length accepted (libpcap's MAXIMUM_SNAPLEN)
MAX_SNAPLEN = 262144

# walk status codes
W_EMPTY = 0       # the block at the cursor is still the kernel's: nothing more to read now
W_FULL = 1        # the output batch is full; the cursor stays inside the block
W_WRAPPED = 2     # every block was read in this call (the caller releases them, then reads on)

# --- ring geometry --------------------------------------------------------------------------


def frame_size_for(snaplen: int, block_size: int) -> int:
    """The nominal frame size of `tpacket_req3` (V3 frames are variable; the kernel only checks
    it divides into blocks): room for the headers and a snap-length frame, capped by a block."""
    want = TPACKET3_HDRLEN + VLAN_TAG_LEN + 16 + snaplen
    want = (want + TPACKET_ALIGNMENT - 1) // TPACKET_ALIGNMENT * TPACKET_ALIGNMENT
    return min(want, block_size)


def ring_request(block_size: int, block_count: int, frame_size: int, timeout_ms: int) -> bytes:
    """struct tpacket_req3 (no private area, no feature request)."""
    frame_nr = (block_size // frame_size) * block_count
    return struct.pack("7I", block_size, block_count, frame_size, frame_nr, timeout_ms, 0, 0)


def set_version_v3(sock: socket.socket) -> None:
    sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
    sock.setsockopt(SOL_PACKET, PACKET_RESERVE, VLAN_TAG_LEN)


def capture_program(snaplen: int, outgoing: bool = True, incoming: bool = True) -> list[tuple[int, int, int, int]]:
    """The classic BPF program of a capture, as (code, jt, jf, k) instructions: keep the first
    `snaplen` bytes of each packet (what libpcap does), of the outgoing packets (the socket
    address's packet type PACKET_OUTGOING, which the kernel gives the copy it taps on the way
    out), the incoming ones (every other type), or both. Both: the one instruction
    `ret #snaplen`. Filtering here rather than on the ring keeps the copies not wanted out of
    the ring altogether (on loopback, half its traffic)."""
    if not (outgoing or incoming):
        raise ValueError("a capture keeps outgoing packets, incoming ones or both")
    keep = (BPF_RET_K, 0, 0, snaplen)
    if outgoing and incoming:
        return [keep]
    # A = skb->pkt_type; if A == PACKET_OUTGOING goto (outgoing ? keep : drop)
    test = (BPF_JEQ_K, 0, 1, PACKET_OUTGOING) if outgoing else (BPF_JEQ_K, 1, 0, PACKET_OUTGOING)
    return [(BPF_LDB_ABS, 0, 0, SKF_AD_PKTTYPE), test, keep, (BPF_RET_K, 0, 0, 0)]


def attach_filter(sock: socket.socket, program: list[tuple[int, int, int, int]]) -> None:
    """SO_ATTACH_FILTER a classic BPF program (`capture_program`)."""
    raw = b"".join(struct.pack("HBBI", *insn) for insn in program)     # struct sock_filter[]
    insns = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
    prog = struct.pack("HxxxxxxQ", len(program), ctypes.addressof(insns))  # struct sock_fprog {len; filter*}
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)  # the kernel copies the program


def add_promiscuous(sock: socket.socket, ifindex: int) -> None:
    """PACKET_ADD_MEMBERSHIP PACKET_MR_PROMISC: dropped by the kernel when the socket closes."""
    mreq = struct.pack("iHH8s", ifindex, PACKET_MR_PROMISC, 0, b"")
    sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)


def join_fanout(sock: socket.socket, group: int, mode: int, flags: int = 0) -> int:
    """PACKET_FANOUT: join (or create) fanout group `group` of this network namespace with mode
    `mode` (FANOUT_MODES) and PACKET_FANOUT_FLAG_* `flags`; the socket must be bound. Returns the
    group id joined, which is the kernel's pick with PACKET_FANOUT_FLAG_UNIQUEID."""
    # packed unsigned: with DEFRAG the value does not fit the C int Python's int form would use
    sock.setsockopt(SOL_PACKET, PACKET_FANOUT, struct.pack("I", group | ((mode | flags) << 16)))
    # getsockopt answers id | mode << 16 | flags >> 8 << 24
    return struct.unpack("I", sock.getsockopt(SOL_PACKET, PACKET_FANOUT, 4))[0] & 0xFFFF


def read_statistics(sock: socket.socket) -> tuple[int, int, int]:
    """(packets, drops, freezes) since the previous read (the kernel resets them on each read).

    For TPACKET_V3 `tp_packets` already includes `tp_drops` (packets that passed the filter).
    """
    raw = sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
    packets, drops, freezes = struct.unpack("3I", raw[:12])
    return packets, drops, freezes


def map_ring(sock: socket.socket, nbytes: int) -> mmap.mmap:
    return mmap.mmap(sock.fileno(), nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


# --- the walk kernel ------------------------------------------------------------------------

@ngjit
def walk_blocks(r32, r16, r8, block_size, block_count, cursor, link_type, snaplen, reinsert_vlan,
                out, row, max_rows, done, counters):
    """Fill rows [row, max_rows) of `out` from the user-owned blocks at the cursor.

    `r32`/`r16`/`r8` are uint32/uint16/uint8 views of the same mapped ring. `cursor` (int64[3]:
    block, packets of it already read, byte offset of the next packet in it) is updated in
    place. Per row: timestamp (ns), len, caplen (at most `snaplen`), data_offset (frame start
    in `r8`), link_type, bad_record = 0, record_offset = ring offset of the packet header.
    Blocks read to the end are listed in `done` (their count is returned) and NOT released:
    the caller releases them once the rows are decoded. With `reinsert_vlan`, a VLAN tag the
    kernel moved to metadata is written back in front of the ethertype (in the ring, in the
    PACKET_RESERVE room before the frame), so the row is the frame as it was on the wire.
    `counters` (int64): [0] blocks read whose status said the kernel was losing packets,
    [1] blocks retired by the timeout, [2] packets whose header was inconsistent (skipped).
    Returns (rows filled up to, status W_*, blocks done).
    """
    c_ts = out.timestamp
    c_len = out.len
    c_caplen = out.caplen
    c_data = out.data_offset
    c_link = out.link_type
    c_bad = out.bad_record
    c_rec = out.record_offset
    block = cursor[0]
    pkt = cursor[1]
    off = cursor[2]
    ndone = 0
    status = W_EMPTY
    while True:
        if row >= max_rows:  # checked before a new block is looked at, so it is counted once
            status = W_FULL
            break
        base = block * block_size
        bstat = r32[(base + 8) >> 2]
        if (bstat & TP_STATUS_USER) == 0:
            status = W_EMPTY
            break
        num = np.int64(r32[(base + 12) >> 2])
        if pkt == 0:
            off = np.int64(r32[(base + 16) >> 2])
            if bstat & TP_STATUS_LOSING:
                counters[0] += 1
            if bstat & TP_STATUS_BLK_TMO:
                counters[1] += 1
        while pkt < num and row < max_rows:
            h = base + off
            if off < 48 or off + TPACKET3_HDRLEN > block_size:
                counters[2] += num - pkt   # a broken chain: give the block back, keep going
                pkt = num
                break
            nxt = np.int64(r32[h >> 2])
            sec = np.int64(r32[(h + 4) >> 2])
            nsec = np.int64(r32[(h + 8) >> 2])
            cap = np.int64(r32[(h + 12) >> 2])
            wire = np.int64(r32[(h + 16) >> 2])
            pst = r32[(h + 20) >> 2]
            mac = np.int64(r16[(h + 24) >> 1])
            if off + mac + cap > block_size:
                cap = max(np.int64(0), block_size - off - mac)
            start = h + mac
            if reinsert_vlan and (pst & TP_STATUS_VLAN_VALID) != 0 and cap >= 12 \
                    and mac - VLAN_TAG_LEN >= TPACKET3_HDRLEN:
                tci = r32[(h + 32) >> 2] & 0xFFFF
                tpid = np.int64(0x8100)
                if pst & TP_STATUS_VLAN_TPID_VALID:
                    tpid = np.int64(r16[(h + 36) >> 1])
                start -= VLAN_TAG_LEN
                for k in range(12):  # the MAC addresses move 4 bytes forward
                    r8[start + k] = r8[start + VLAN_TAG_LEN + k]
                r8[start + 12] = np.uint8(tpid >> 8)
                r8[start + 13] = np.uint8(tpid & 0xFF)
                r8[start + 14] = np.uint8(tci >> 8)
                r8[start + 15] = np.uint8(tci & 0xFF)
                cap += VLAN_TAG_LEN
                wire += VLAN_TAG_LEN
            if cap > snaplen:
                cap = snaplen
            c_ts[row] = sec * 1_000_000_000 + nsec
            c_len[row] = wire
            c_caplen[row] = cap
            c_data[row] = start
            c_link[row] = link_type
            c_bad[row] = 0
            c_rec[row] = h
            row += 1
            pkt += 1
            if nxt == 0:
                pkt = num  # the last packet of the block
            else:
                off += nxt
        if pkt < num:
            status = W_FULL
            break
        done[ndone] = block
        ndone += 1
        block = (block + 1) % block_count
        pkt = 0
        off = 0
        if ndone == block_count:
            status = W_WRAPPED
            break
    cursor[0] = block
    cursor[1] = pkt
    cursor[2] = off
    return row, status, ndone


@ngjit
def release_blocks(r32, block_size, done, ndone):
    """Hand blocks back to the kernel (block_status = TP_STATUS_KERNEL), after their rows were decoded."""
    for i in range(ndone):
        r32[(done[i] * block_size + 8) >> 2] = TP_STATUS_KERNEL


@ngjit
def block_ready(r32, block_size, block):
    """True when the block is the user's (retired by the kernel)."""
    return (r32[(block * block_size + 8) >> 2] & TP_STATUS_USER) != 0


def ring_views(mm: mmap.mmap) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """uint8, uint16 and uint32 views of the mapped ring (host byte order, like the kernel's structs)."""
    r8 = np.frombuffer(mm, np.uint8)
    return r8, r8.view(np.uint16), r8.view(np.uint32)
