"""NetFlow v5 encoder: IPv4 records, 30 a datagram, 32-bit counters (big flows split).

Layout (big-endian): a 24-byte header (version 5, count, sys_uptime, unix_secs, unix_nsecs,
flow_sequence = flows exported before this datagram, engine type/id, sampling interval with
the mode in its top 2 bits) and 48-byte records (docs/netflow.md "Wire formats").

Limits of the format, handled and counted:
- IPv6 records cannot be written: skipped, counted in `stats["skipped_ipv6"]`;
- times are 32-bit ms of uptime: each datagram's header and records use the clock's boot
  time for that datagram, which moves ("reboots") wherever a datagram needs it (clock.py);
- dPkts/dOctets are 32-bit: a record whose packets or bytes exceed 2^32-1 is SPLIT into
  k = max(ceil(packets/(2^32-1)), ceil(bytes/(2^32-1))) records with the same key and times,
  the counters divided as evenly as integers allow (the first `total % k` parts get one more),
  so per-flow totals summed by a collector stay exact; `stats["split_extra"]` counts the
  records added. (Capping would lose traffic silently.)
All records are built at once as one numpy structured array; each datagram is a slice.
"""

from __future__ import annotations

import struct

import numpy as np

from tools.netflow.clock import ExportClock
from tools.netflow.records import FlowRecords

U32_MAX = 0xFFFF_FFFF
HEADER = struct.Struct(">HHIIIIBBH")
MAX_RECORDS = 30
RECORD = np.dtype([
    ("srcaddr", ">u4"), ("dstaddr", ">u4"), ("nexthop", ">u4"),
    ("input", ">u2"), ("output", ">u2"), ("dPkts", ">u4"), ("dOctets", ">u4"),
    ("first", ">u4"), ("last", ">u4"), ("srcport", ">u2"), ("dstport", ">u2"),
    ("pad1", "u1"), ("tcp_flags", "u1"), ("prot", "u1"), ("tos", "u1"),
    ("src_as", ">u2"), ("dst_as", ">u2"), ("src_mask", "u1"), ("dst_mask", "u1"),
    ("pad2", ">u2"),
])
assert RECORD.itemsize == 48 and HEADER.size == 24


def sampling_field(interval: int) -> int:
    """The header's sampling word: mode 01 (deterministic) in the top 2 bits, 14-bit interval."""
    if interval <= 1:
        return 0
    if interval >= 1 << 14:
        raise ValueError(f"NetFlow v5 sampling interval {interval} exceeds 14 bits")
    return (1 << 14) | interval


def split_counters(packets: np.ndarray, octets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row index, packets, bytes) of records whose counters fit 32 bits, splitting big ones."""
    m = np.uint64(U32_MAX)
    k = np.maximum(np.maximum((packets + m - np.uint64(1)) // m, (octets + m - np.uint64(1)) // m),
                   np.uint64(1)).astype(np.int64)
    if (k == 1).all():
        return np.arange(len(packets)), packets, octets
    rows = np.repeat(np.arange(len(packets)), k)
    starts = np.cumsum(k) - k
    part = (np.arange(len(rows)) - np.repeat(starts, k)).astype(np.uint64)
    kk = k[rows].astype(np.uint64)
    p, b = packets[rows], octets[rows]
    p_out = p // kk + (part < p % kk).astype(np.uint64)
    b_out = b // kk + (part < b % kk).astype(np.uint64)
    return rows, p_out, b_out


class V5Encoder:
    """Flow records -> NetFlow v5 datagrams; state (sequence, clock) kept across calls."""

    version = 5

    def __init__(self, max_payload: int = 1472, sampling_interval: int = 1, engine_type: int = 0,
                 engine_id: int = 0, clock: ExportClock | None = None):
        self.per_datagram = min(MAX_RECORDS, (max_payload - HEADER.size) // RECORD.itemsize)
        if self.per_datagram < 1:
            raise ValueError(f"a datagram payload of {max_payload} bytes cannot hold one "
                             f"NetFlow v5 record")
        self.sampling = sampling_field(sampling_interval)
        self.engine_type, self.engine_id = engine_type, engine_id
        self.clock = clock or ExportClock()
        self.flow_sequence = 0
        self.stats = {"records_in": 0, "records_out": 0, "skipped_ipv6": 0, "split_extra": 0,
                      "datagrams": 0}

    def _datagrams(self, first_ms: np.ndarray, last_ms: np.ndarray) -> np.ndarray:
        """Row bounds of the datagrams: `per_datagram` records each, fewer where records
        spanning more than the clock's 32-bit range would share one (clock.py)."""
        n = len(first_ms)
        starts = np.arange(0, n, self.per_datagram)
        span = np.maximum.reduceat(last_ms, starts) - np.minimum.reduceat(first_ms, starts)
        if not (span > self.clock.max_span_ms).any():
            return np.append(starts, n)
        bounds = [0]
        while bounds[-1] < n:          # rare: a table spanning months, in no time order
            s = bounds[-1]
            e = min(s + self.per_datagram, n)
            bounds.append(s + self.clock.fitting(first_ms[s:e], last_ms[s:e]))
        return np.array(bounds)

    def encode(self, rec: FlowRecords) -> list[tuple[bytes, int, int]]:
        """Datagrams (payload, data records, export ms) for `rec`, in record order."""
        self.stats["records_in"] += len(rec)
        v6 = rec.is_v6
        if v6.any():
            self.stats["skipped_ipv6"] += int(v6.sum())
            rec = rec.take(~v6)
        n_in = len(rec)
        if n_in == 0:
            return []
        rows, pkts, octs = split_counters(rec.packets, rec.bytes)
        self.stats["split_extra"] += len(rows) - n_in
        n = len(rows)
        first_ms, last_ms = rec.first_ms[rows], rec.last_ms[rows]
        arr = np.zeros(n, RECORD)
        arr["srcaddr"] = rec.src_v4[rows]
        arr["dstaddr"] = rec.dst_v4[rows]
        arr["input"] = np.minimum(rec.input, 0xFFFF)[rows]
        arr["dPkts"] = pkts
        arr["dOctets"] = octs
        arr["srcport"] = rec.src_port[rows]
        arr["dstport"] = rec.dst_port[rows]
        arr["tcp_flags"] = rec.tcp_flags[rows]
        arr["prot"] = rec.protocol[rows]
        arr["tos"] = rec.tos[rows]
        bounds = self._datagrams(first_ms, last_ms)
        # the clock per datagram (it reboots where a datagram needs it), then every record's
        # uptimes at once against the boot time of its datagram
        starts = bounds[:-1]
        earliest = np.minimum.reduceat(first_ms, starts).tolist()
        latest = np.maximum.reduceat(last_ms, starts).tolist()
        stamps = [self.clock.stamp(a, b) for a, b in zip(earliest, latest)]
        boots = np.repeat(np.array([e - u for e, u in stamps], np.int64), np.diff(bounds))
        arr["first"] = self.clock.uptime(first_ms, boots)
        arr["last"] = self.clock.uptime(last_ms, boots)
        out = []
        for (export, uptime), s, e in zip(stamps, starts.tolist(), bounds[1:].tolist()):
            chunk = arr[s:e]
            head = HEADER.pack(5, len(chunk), uptime, export // 1000, 0,
                               self.flow_sequence & U32_MAX, self.engine_type, self.engine_id,
                               self.sampling)
            self.flow_sequence += len(chunk)
            out.append((head + chunk.tobytes(), len(chunk), export))
        self.stats["records_out"] += n
        self.stats["datagrams"] += len(out)
        return out
