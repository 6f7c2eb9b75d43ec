"""The flow-record decoder: NetFlow v5, v9 and IPFIX datagrams in, the NETFLOW protocol's
columns out (one row per flow record), whatever mix of versions and exporters.

    dec = FlowDecoder()
    cols = dec.decode(payloads, exporters, arrivals)   # bytes, exporter address, arrival ns
    dec.stats.reasons                                   # malformed input by reason

The version is read per datagram (5, 9 or 10 = IPFIX). The datagrams of a call are joined
into one buffer and walked by a Numba kernel (`capture.flowkernels.walk_datagrams`: headers,
data sets of known templates, sequence numbers) as long as they are plain v9 / IPFIX data
datagrams, stepping over the template and options sets an exporter resends unchanged
(`capture.flowknown`); one that needs more (a new or changed template or option, v5, an
unknown template, anything malformed) is read here in Python in its place, and the walk
goes on after it. The data
records of all data sets of a call are then decoded by one kernel call
(`capture.flowkernels.decode_sets`) with each set's template as arrays, so no Python runs
per record, nor per plain datagram. Templates and options live in a
`capture.flowtemplates.TemplateCache` per (exporter, observation domain, template id); a
data set whose template is not known yet is held (at most `max_pending` sets, oldest
dropped and counted as `no_template`) and decoded in the call that brings its template. Sequence numbers are checked per (exporter, domain) as
nfcapd does: a datagram whose sequence is not the one expected counts a gap.

Malformed input never raises: a datagram (or the rest of it) that cannot be read is counted by
reason and by exporter (`FlowStats`), and everything else in the call is decoded. Reasons:
`truncated_header`, `bad_version`, `bad_set_length` (shorter than a set header, or past the
datagram's end: a zero length would loop for ever), `truncated_template`, `bad_template`
(no fields, a zero-length field, or a record of no bytes), `truncated_record`, `bad_count`
(v5: more records than the datagram holds), `no_template`.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from capture import flowkernels as fk
from capture.flowknown import KnownSets
from capture.flowtemplates import (
    OPT_ACTIVE_TIMEOUT,
    OPT_IDLE_TIMEOUT,
    OPT_SAMPLING,
    OPT_SYSTEM_INIT_MS,
    V5_TEMPLATE_ROW,
    Template,
    TemplateCache,
)

log = logging.getLogger(__name__)

#: the options read from options data, by element
_OPTION_NAMES = {**{ie: "sampling" for ie in OPT_SAMPLING},
                 OPT_ACTIVE_TIMEOUT: "active_timeout_s", OPT_IDLE_TIMEOUT: "idle_timeout_s",
                 OPT_SYSTEM_INIT_MS: "system_init_ms"}

#: the NETFLOW columns the decoder fills, in order, with their dtypes
FLOW_COLUMNS: tuple[tuple[str, type], ...] = (
    ("export", np.int64), ("arrival", np.int64),
    ("exporter_hi", np.uint64), ("exporter_lo", np.uint64), ("domain", np.uint32),
    ("version", np.uint8), ("ipversion", np.uint8),
    ("srcIP_hi", np.uint64), ("srcIP_lo", np.uint64),
    ("destIP_hi", np.uint64), ("destIP_lo", np.uint64),
    ("srcPort", np.uint16), ("destPort", np.uint16), ("protocol", np.uint8),
    ("tcp_flags", np.uint8), ("tos", np.uint8), ("packets", np.uint64), ("bytes", np.uint64),
    ("first", np.int64), ("last", np.int64), ("input", np.uint32), ("output", np.uint32),
    ("src_as", np.uint32), ("dst_as", np.uint32),
    ("next_hop_hi", np.uint64), ("next_hop_lo", np.uint64), ("sampling", np.uint32),
)
_SLOT_OF = {"srcIP_hi": fk.S_SRC_HI, "srcIP_lo": fk.S_SRC_LO, "destIP_hi": fk.S_DST_HI,
            "destIP_lo": fk.S_DST_LO, "srcPort": fk.S_SRCPORT, "destPort": fk.S_DSTPORT,
            "protocol": fk.S_PROTOCOL, "tcp_flags": fk.S_TCP_FLAGS, "tos": fk.S_TOS,
            "packets": fk.S_PACKETS, "bytes": fk.S_BYTES, "first": fk.S_FIRST,
            "last": fk.S_LAST, "input": fk.S_INPUT, "output": fk.S_OUTPUT,
            "src_as": fk.S_SRC_AS, "dst_as": fk.S_DST_AS, "next_hop_hi": fk.S_NH_HI,
            "next_hop_lo": fk.S_NH_LO}

REASONS = ("truncated_header", "bad_version", "bad_set_length", "truncated_template",
           "bad_template", "truncated_record", "bad_count", "no_template")
#: data sets held for a template not seen yet, at most
MAX_PENDING = 1024
_V5_HEADER, _V5_RECORD, _V9_HEADER, _IPFIX_HEADER = 24, 48, 20, 16
_DTYPES = dict(FLOW_COLUMNS)
#: the slots (beyond its own, `_SLOT_OF`) a column is made from
_NEEDS = {"sampling": (fk.S_SAMPLING,),
          "ipversion": (fk.S_IPVERSION, fk.S_SRC_HI, fk.S_SRC_LO)}
for _addr in ("srcIP", "destIP", "next_hop"):
    # an address's halves are decoded together (`decode_sets`)
    _NEEDS[_addr + "_hi"] = _NEEDS[_addr + "_lo"] = (_SLOT_OF[_addr + "_hi"],
                                                     _SLOT_OF[_addr + "_lo"])
_MAPPED = 0x0000_FFFF_0000_0000


def address_pair(text: str) -> tuple[int, int]:
    """An address as the schema's two 64-bit halves (IPv4-mapped for IPv4)."""
    a = ipaddress.ip_address(text)
    if a.version == 4:
        return 0, _MAPPED | int(a)
    v = int(a)
    return v >> 64, v & ((1 << 64) - 1)


@dataclass
class FlowStats:
    """What a decoder has seen: datagrams, records, malformed input by reason (and by
    exporter), sequence gaps per (exporter, domain) and the records they lost."""

    datagrams: int = 0
    records: int = 0
    bytes: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    by_exporter: dict[tuple[str, str], int] = field(default_factory=dict)
    gaps: dict[tuple[str, int], int] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)

    @property
    def malformed(self) -> int:
        return sum(self.reasons.values())

    @property
    def sequence_gaps(self) -> int:
        return sum(self.gaps.values())

    def note(self, exporter: str, reason: str, count: int = 1) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + count
        key = (exporter, reason)
        self.by_exporter[key] = self.by_exporter.get(key, 0) + count

    def describe(self) -> str:
        """`2 bad_version (192.0.2.1: 2), ...`."""
        parts = []
        for reason, count in self.reasons.items():
            who = ", ".join(f"{e}: {n}" for (e, r), n in self.by_exporter.items() if r == reason)
            parts.append(f"{count} {reason} ({who})")
        return ", ".join(parts)


@dataclass
class _Sets:
    """The data sets of one call, gathered for the kernel (parallel lists)."""

    chunks: list = field(default_factory=list)      # bytes objects, concatenated for the kernel
    size: int = 0
    start: list = field(default_factory=list)
    end: list = field(default_factory=list)
    row: list = field(default_factory=list)
    unix_ms: list = field(default_factory=list)
    uptime_ms: list = field(default_factory=list)
    dgram: list = field(default_factory=list)       # index into the call's datagram context
    sampling: list = field(default_factory=list)

    def add(self, body: bytes, row: int, unix_ms: int, uptime_ms: int, ctx: int,
            sampling: int) -> None:
        self.chunks.append(body)
        self.start.append(self.size)
        self.size += len(body)
        self.end.append(self.size)
        self.row.append(row)
        self.unix_ms.append(unix_ms)
        self.uptime_ms.append(uptime_ms)
        self.dgram.append(ctx)
        self.sampling.append(sampling)


@dataclass(frozen=True)
class _Held:
    """A data set waiting for its template."""

    exporter: str
    domain: int
    template_id: int
    body: bytes
    version: int
    export_ns: int
    arrival_ns: int
    uptime_ms: int


@dataclass
class _Walk:
    """What `fk.walk_datagrams` writes in a call: per datagram (domain, export seconds,
    version; 0 = not walked by it) and per data set."""

    ctx_dom: np.ndarray
    ctx_export_s: np.ndarray
    ctx_ver: np.ndarray
    s_start: np.ndarray
    s_end: np.ndarray
    s_row: np.ndarray
    s_unix_ms: np.ndarray
    s_uptime: np.ndarray
    s_dgram: np.ndarray
    s_sampling: np.ndarray
    n_sets: np.ndarray

    @classmethod
    def make(cls, datagrams: int, size: int) -> _Walk:
        # room for a set per datagram and one per 256 bytes beyond (a datagram past it is
        # read in Python instead)
        cap = datagrams + size // 256 + 16
        z = np.zeros
        return cls(z(datagrams, np.int64), z(datagrams, np.int64), z(datagrams, np.int64),
                   z(cap, np.int64), z(cap, np.int64), z(cap, np.int32), z(cap, np.int64),
                   z(cap, np.int64), z(cap, np.int64), z(cap, np.uint64), z(1, np.int64))


@dataclass
class _Seq:
    """The sequence expectations as arrays for the walk (`FlowDecoder._next_seq`)."""

    exp: np.ndarray
    dom: np.ndarray
    ver: np.ndarray
    last: np.ndarray
    step: np.ndarray
    gaps: np.ndarray
    n: np.ndarray

    @property
    def arrays(self) -> tuple:
        return self.exp, self.dom, self.ver, self.last, self.step, self.gaps, self.n

    @classmethod
    def make(cls, expected: dict, code, room: int) -> _Seq:
        m = len(expected) + room
        sq = cls(np.zeros(m, np.int32), np.zeros(m, np.int64), np.zeros(m, np.int64),
                 np.full(m, -1, np.int64), np.zeros(m, np.int64), np.zeros(m, np.int64),
                 np.array([len(expected)], np.int64))
        for r, ((e, d, v), x) in enumerate(expected.items()):
            sq.exp[r], sq.dom[r], sq.ver[r] = code(e), d, v
            sq.last[r], sq.step[r] = x >> 32, x & 0xFFFF_FFFF
        return sq


def sample_datagrams() -> tuple[bytes, bytes]:
    """Two made-up v9 datagrams of one exporter: a template (srcIP, packets, bytes) with a
    record of it, then a record alone (what warms the kernels, `FlowDecoder.warm`)."""
    tmpl = struct.pack(">HHHHHHHH", 0, 20, 256, 3, 8, 4, 2, 4) + struct.pack(">HH", 1, 4)
    data = struct.pack(">HHIII", 256, 16, 0x0A000001, 5, 700)
    head = struct.pack(">HHIIII", 9, 2, 1000, 1_700_000_000, 0, 0)
    plain = struct.pack(">HHIIII", 9, 1, 1000, 1_700_000_000, 1, 0) + data
    return head + tmpl + data, plain


class FlowDecoder:
    """Decodes datagrams into NETFLOW columns; owns the templates, the held data sets, the
    sequence expectations and the statistics of one input (module docstring)."""

    def __init__(self, templates: TemplateCache | None = None, max_pending: int = MAX_PENDING,
                 wide: bool = False):
        #: every column 64 bits wide (unsigned ones uint64): what a link's batches hold, so
        #: the columns go on without a second conversion
        self.wide = wide
        #: plain datagrams walked by the kernel (False: each read in Python, the reference
        #: the tests hold the walk to)
        self.walk = True
        self.templates = templates if templates is not None else TemplateCache()
        self.stats = FlowStats()
        self.max_pending = max_pending
        self._held: deque[_Held] = deque()
        #: the template and options sets read whole, that exporters resend unchanged
        self._known = KnownSets(self.templates)
        self._next_seq: dict[tuple[str, int, int], int] = {}
        self._pairs: dict[str, tuple[int, int]] = {}
        #: each (exporter, domain)'s latest export time (ns, its clock): its punctuation
        self.latest_export: dict[tuple[str, int], int] = {}
        #: each (exporter, domain)'s latest arrival (ns, ours): whether it has gone silent
        self.latest_arrival: dict[tuple[str, int], int] = {}
        #: held data sets whose template just came (decoded at the end of the call)
        self._ready: list[_Held] = []
        #: IPFIX data records walked (for the sequence step of a message)
        self._ipfix_records = 0
        #: exporters by code (the walk's arrays name them by it), and their address halves
        self._codes: dict[str, int] = {}
        self._names: list[str] = []
        self._pair_rows: list[tuple[int, int]] = []
        self._tk: tuple | None = None
        self._tk_revision = -1
        self.project(None)

    def project(self, columns) -> None:
        """Produce only `columns` (of FLOW_COLUMNS' names; None: every one) from now on: a
        field no query reads is skipped by its length rather than decoded, and its column
        neither built nor handed on (a collector's query reads a few of the 27)."""
        want = {name for name, _ in FLOW_COLUMNS} if columns is None else set(columns)
        self._produce = tuple(name for name, _ in FLOW_COLUMNS if name in want)
        slots = sorted({s for name in self._produce
                        for s in _NEEDS.get(name, (_SLOT_OF[name],) if name in _SLOT_OF
                                            else ())})
        self._slot_row = np.full(fk.N_SLOTS, -1, np.int64)
        self._slot_row[slots] = np.arange(len(slots))
        self._rows = max(1, len(slots))

    @property
    def produces(self) -> tuple[str, ...]:
        """The columns a call returns (`project`)."""
        return self._produce

    @property
    def pending(self) -> int:
        return len(self._held)

    # --- a call ---------------------------------------------------------------------------------

    def decode(self, payloads, exporters, arrivals) -> dict[str, np.ndarray]:
        """The records of `payloads` (bytes), sent by `exporters` (addresses as text), received
        at `arrivals` (ns), as NETFLOW columns (`FLOW_COLUMNS`), in datagram order.

        Plain v9 / IPFIX datagrams of known templates are walked by one kernel call
        (`capture.flowkernels.walk_datagrams`) over the datagrams joined into one buffer; the
        others (templates, options, v5, anything malformed: a datagram in 64 or fewer in a
        steady export) are read here one at a time, in their place, and the kernel goes on
        after them."""
        n = len(payloads)
        lens = np.fromiter(map(len, payloads), np.int64, n)
        return self.decode_joined(b"".join(payloads), lens, exporters, arrivals)

    def decode_joined(self, blob, lens: np.ndarray, exporters,
                      arrivals) -> dict[str, np.ndarray]:
        """`decode` of datagrams given end to end in `blob` (bytes, or a uint8 array), of
        lengths `lens`."""
        n = len(lens)
        buf = np.frombuffer(blob, np.uint8)
        d_start = np.zeros(n, np.int64)
        np.cumsum(lens[:-1], out=d_start[1:])
        code = self._code
        if n and isinstance(exporters, (list, tuple)) and exporters.count(exporters[0]) == n:
            # one exporter (a collector's batch is most often all one router's): a pointer
            # comparison per datagram in C, not a Python call
            codes = np.full(n, code(exporters[0]), np.int32)
        else:
            codes = np.fromiter(map(code, exporters), np.int32, n)
        arr = np.asarray(arrivals, np.int64) if n else np.zeros(0, np.int64)
        self.stats.datagrams += n
        self.stats.bytes += int(lens.sum())
        w = _Walk.make(n, len(blob))
        tk = self._kernel_templates()
        sets = _Sets()                       # the sets of datagrams read here (bytes)
        ctx: list[tuple[str, int, int, int, int]] = []   # exporter, domain, export, arrival, ver
        order: list[int] = []                # each of `sets`' datagram (its place)
        i = 0
        while i < n:
            if not self.walk:
                i = self._read_one(blob, d_start, lens, codes, arr, i, sets, ctx, order)
                continue
            sq = self._kernel_sequences()
            args = (buf, d_start, lens, codes, i, *tk,
                    *self._known.arrays(), *sq.arrays, w.ctx_dom, w.ctx_export_s,
                    w.ctx_ver, w.s_start, w.s_end, w.s_row, w.s_unix_ms, w.s_uptime, w.s_dgram,
                    w.s_sampling, w.n_sets)
            i = fk.walk_datagrams(*args)
            self._sequences_back(sq)
            if i >= n:
                break
            i = self._read_one(blob, d_start, lens, codes, arr, i, sets, ctx, order)
            tk = self._kernel_templates()
        fast = np.flatnonzero(w.ctx_ver)
        self._fast_exports(fast, codes, w, arr)
        return self._run(buf, w, codes, arr, sets, ctx, order, n)

    def _read_one(self, blob, d_start, lens, codes, arr, i, sets, ctx, order) -> int:
        """Read datagram i in Python (`_datagram`), its sets in its place; the next one."""
        exporter = self._names[codes[i]]
        before = len(sets.start)
        data = blob[d_start[i]:d_start[i] + lens[i]]
        try:
            self._datagram(data if isinstance(data, bytes) else data.tobytes(), exporter,
                           int(arr[i]), sets, ctx)
        except (struct.error, IndexError, ValueError):     # a cut we did not foresee
            self.stats.note(exporter, "truncated_header")
        order += [i] * (len(sets.start) - before)
        return i + 1

    def _code(self, exporter) -> int:
        """The exporter's code (stable over the decoder's life)."""
        c = self._codes.get(exporter)
        if c is None:
            exporter = str(exporter)
            c = self._codes[exporter] = len(self._names)
            self._names.append(exporter)
            self._pair_rows.append(self._pair(exporter))
        return c

    def _kernel_templates(self) -> tuple:
        """The template cache as the walk's lookup arrays (remade when it changes)."""
        tc = self.templates
        if self._tk is not None and self._tk_revision == tc.revision:
            return self._tk
        rows = []
        for (exporter, domain, tid), (t, row) in tc._templates.items():
            init = tc.option(exporter, domain, "system_init_ms")
            sampling = min(tc.option(exporter, domain, "sampling") or 0, 0xFFFF_FFFF)
            rows.append((self._code(exporter), domain, tid, row, t.fixed_length,
                         -1 if init is None else init, sampling))
        cols = list(zip(*rows)) if rows else [()] * 7
        dtypes = (np.int32, np.int64, np.int64, np.int32, np.int64, np.int64, np.uint64)
        self._tk = tuple(np.array(c, d) for c, d in zip(cols, dtypes))
        self._tk_revision = tc.revision
        return self._tk

    def _kernel_sequences(self) -> _Seq:
        """The sequence expectations as the walk's arrays (room for new ones)."""
        return _Seq.make(self._next_seq, self._code, 64)

    def _sequences_back(self, sq: _Seq) -> None:
        for r in range(int(sq.n[0])):
            exporter = self._names[sq.exp[r]]
            dom, ver = int(sq.dom[r]), int(sq.ver[r])
            if sq.last[r] >= 0:
                self._next_seq[(exporter, dom, ver)] = (int(sq.last[r]) << 32) | int(sq.step[r])
            if sq.gaps[r]:
                g = (exporter, dom)
                self.stats.gaps[g] = self.stats.gaps.get(g, 0) + int(sq.gaps[r])

    def _fast_exports(self, fast: np.ndarray, codes: np.ndarray, w: _Walk,
                      arr: np.ndarray) -> None:
        """The versions seen and each (exporter, domain)'s latest export and arrival, over
        the datagrams the kernel walked (what `_datagram` notes for the others)."""
        if not len(fast):
            return
        ver = w.ctx_ver[fast]
        for v, k in zip(*np.unique(ver, return_counts=True)):
            self.stats.versions[int(v)] = self.stats.versions.get(int(v), 0) + int(k)
        key = (codes[fast].astype(np.int64) << 32) | w.ctx_dom[fast]
        uk, inv = np.unique(key, return_inverse=True)
        exp_max = np.full(len(uk), -1, np.int64)
        arr_max = np.full(len(uk), -(1 << 63), np.int64)
        np.maximum.at(exp_max, inv, w.ctx_export_s[fast] * 10**9)
        np.maximum.at(arr_max, inv, arr[fast])
        for k, e, a in zip(uk.tolist(), exp_max.tolist(), arr_max.tolist()):
            self._export(self._names[k >> 32], k & 0xFFFF_FFFF, e, a)

    @staticmethod
    def warm() -> None:
        """Compile (or load from Numba's cache) the decoder's kernels by decoding a datagram
        of each kind of call: a collector does this before it binds its socket, as a compile
        under load takes seconds, during which the socket's buffer would overflow."""
        first, plain = sample_datagrams()
        for wide in (False, True):
            dec = FlowDecoder(wide=wide)
            dec.decode([first, plain], ["192.0.2.1"] * 2, [0, 1])
        # a collector's datagrams come as a view of its buffer (a writable array: a type of
        # its own to the kernels), each part of its columns (`project`) as a run reads them
        dec = FlowDecoder(wide=True)
        dec.project(("first", "arrival"))
        blob = np.frombuffer(first + plain, np.uint8).copy()
        lens = np.array([len(first), len(plain)], np.int64)
        dec.decode_joined(blob, lens, ["192.0.2.1"] * 2, [0, 1])

    def drop_pending(self) -> int:
        """Count the held data sets as `no_template` (the input ended); how many."""
        n = len(self._held)
        for h in self._held:
            self.stats.note(h.exporter, "no_template")
        self._held.clear()
        return n

    def _datagram(self, data: bytes, exporter: str, arrival: int, sets: _Sets, ctx) -> None:
        if len(data) < 4:
            self.stats.note(exporter, "truncated_header")
            return
        version = (data[0] << 8) | data[1]
        self.stats.versions[version] = self.stats.versions.get(version, 0) + 1
        if version == 5:
            self._v5(data, exporter, arrival, sets, ctx)
        elif version == 9:
            self._v9(data, exporter, arrival, sets, ctx)
        elif version == 10:
            self._ipfix(data, exporter, arrival, sets, ctx)
        else:
            self.stats.note(exporter, "bad_version")

    def _sequence(self, exporter: str, domain: int, version: int, seq: int, step: int) -> None:
        """Count a gap when `seq` is not the one the previous datagram announced. IPFIX
        exporters differ on whether a message's sequence counts its own records (RFC 7011:
        not; softflowd: yes), so either is taken as in order there."""
        key = (exporter, domain, version)
        prev = self._next_seq.get(key)
        if prev is not None:
            last_seq, last_step = prev >> 32, prev & 0xFFFF_FFFF
            ok = seq == (last_seq + last_step) & 0xFFFF_FFFF
            if version == 10 and not ok:
                ok = seq == (last_seq + step) & 0xFFFF_FFFF
            if not ok:
                g = (exporter, domain)
                self.stats.gaps[g] = self.stats.gaps.get(g, 0) + 1
        self._next_seq[key] = (seq << 32) | (step & 0xFFFF_FFFF)

    def _export(self, exporter: str, domain: int, export_ns: int, arrival: int) -> None:
        key = (exporter, domain)
        if export_ns > self.latest_export.get(key, -1):
            self.latest_export[key] = export_ns
        if arrival > self.latest_arrival.get(key, -(1 << 63)):
            self.latest_arrival[key] = arrival

    def _v5(self, data, exporter, arrival, sets, ctx) -> None:
        if len(data) < _V5_HEADER:
            self.stats.note(exporter, "truncated_header")
            return
        count, uptime, secs, nsecs, seq, etype, eid, sampling = struct.unpack_from(
            ">HIIIIBBH", data, 2)
        domain = (etype << 8) | eid
        if count > 30 or _V5_HEADER + count * _V5_RECORD > len(data):
            self.stats.note(exporter, "bad_count")
            return
        self._sequence(exporter, domain, 5, seq, count)
        export_ns = secs * 10**9 + nsecs
        self._export(exporter, domain, export_ns, arrival)
        ctx.append((exporter, domain, export_ns, arrival, 5))
        interval = sampling & 0x3FFF
        sets.add(data[_V5_HEADER:_V5_HEADER + count * _V5_RECORD], V5_TEMPLATE_ROW,
                 secs * 1000 + nsecs // 1_000_000, uptime, len(ctx) - 1, interval)

    def _v9(self, data, exporter, arrival, sets, ctx) -> None:
        if len(data) < _V9_HEADER:
            self.stats.note(exporter, "truncated_header")
            return
        _count, uptime, secs, seq, domain = struct.unpack_from(">HIIII", data, 2)
        self._sequence(exporter, domain, 9, seq, 1)
        export_ns = secs * 10**9
        self._export(exporter, domain, export_ns, arrival)
        ctx.append((exporter, domain, export_ns, arrival, 9))
        self._sets(data, _V9_HEADER, 9, exporter, domain, secs * 1000, uptime, sets, ctx)

    def _ipfix(self, data, exporter, arrival, sets, ctx) -> None:
        if len(data) < _IPFIX_HEADER:
            self.stats.note(exporter, "truncated_header")
            return
        length, secs, seq, domain = struct.unpack_from(">HIII", data, 2)
        if length < _IPFIX_HEADER or length > len(data):
            self.stats.note(exporter, "truncated_header")
            return
        data = data[:length]
        export_ns = secs * 10**9
        self._export(exporter, domain, export_ns, arrival)
        ctx.append((exporter, domain, export_ns, arrival, 10))
        n_before = self._ipfix_records
        self._sets(data, _IPFIX_HEADER, 10, exporter, domain, secs * 1000, 0, sets, ctx)
        # IPFIX counts data records: the step is this message's, from its sets' fixed
        # lengths (exact for fixed-length templates, which are what exporters send)
        self._sequence(exporter, domain, 10, seq, self._ipfix_records - n_before)

    def _sets(self, data, pos, version, exporter, domain, unix_ms, uptime, sets, ctx) -> None:
        """Walk the sets of a v9 / IPFIX datagram from `pos`."""
        tmpl_ids, opt_ids = (0, 1) if version == 9 else (2, 3)
        end = len(data)
        while pos + 4 <= end:
            set_id, length = struct.unpack_from(">HH", data, pos)
            if length < 4 or pos + length > end:
                self.stats.note(exporter, "bad_set_length")
                return
            body = data[pos + 4:pos + length]
            pos += length
            if set_id == tmpl_ids or set_id == opt_ids:
                self._templates(body, set_id, version, exporter, domain, set_id == opt_ids)
            elif set_id >= 256:
                self._data_set(body, set_id, version, exporter, domain, unix_ms, uptime,
                               sets, ctx)

    def _templates(self, body: bytes, set_id: int, version: int, exporter: str, domain: int,
                   options: bool) -> None:
        """Learn the templates of a (options) template set; IPFIX withdrawals too."""
        code = self._code(exporter)
        if self._known.known(code, domain, set_id, body):
            return                  # learned whole already, and the cache still holds it
        defines = self._learn_set(body, version, exporter, domain, options)
        # a set with a fault is read again each time (its fault counted each time)
        if defines is not None:
            self._known.note_templates(code, exporter, domain, set_id, body, defines)

    def _learn_set(self, body: bytes, version: int, exporter: str, domain: int,
                   options: bool) -> list | None:
        """The set's templates learned (withdrawals too: `KnownSets.note_templates`), or None
        when a fault stopped it (counted)."""
        defines: list = []
        p, end = 0, len(body)
        while end - p >= 4:
            tid, count = struct.unpack_from(">HH", body, p)
            p += 4
            scope = 0
            if options and version == 9:       # scope length and option length, in bytes
                if end - p < 2:
                    self.stats.note(exporter, "truncated_template")
                    return None
                tid, scope_len, opt_len = struct.unpack_from(">HHH", body, p - 4)
                p += 2
                if scope_len % 4 or opt_len % 4:
                    self.stats.note(exporter, "bad_template")
                    return None
                scope, count = scope_len // 4, (scope_len + opt_len) // 4
            elif options:                      # IPFIX: field count, scope field count
                if end - p < 2:
                    self.stats.note(exporter, "truncated_template")
                    return None
                (scope,) = struct.unpack_from(">H", body, p)
                p += 2
            if tid < 256:
                if tid == 0 and count == 0 and end - p < 4:
                    return defines             # padding
                self.stats.note(exporter, "bad_template")
                return None
            if count == 0:
                if version == 10:              # a withdrawal
                    self.templates.withdraw(exporter, domain, tid)
                    defines.append((tid, None))
                    continue
                self.stats.note(exporter, "bad_template")
                return None
            fields = []
            for _ in range(count):
                if end - p < 4:
                    self.stats.note(exporter, "truncated_template")
                    return None
                ie, ln = struct.unpack_from(">HH", body, p)
                p += 4
                pen = 0
                if version == 10 and ie & 0x8000:
                    if end - p < 4:
                        self.stats.note(exporter, "truncated_template")
                        return None
                    (pen,) = struct.unpack_from(">I", body, p)
                    p += 4
                    ie &= 0x7FFF
                if ln == 0 or (ln == 65535 and version == 9):
                    self.stats.note(exporter, "bad_template")
                    return None
                fields.append((ie, ln, pen))
            t = Template(tuple(fields), options, scope)
            if not options and t.fixed_length == 0 and all(ln != 65535 for _, ln, _ in fields):
                self.stats.note(exporter, "bad_template")
                return None
            self.templates.learn(exporter, domain, tid, t)
            self._release(exporter, domain, tid)
            defines.append((tid, t))
        return defines

    def _data_set(self, body, set_id, version, exporter, domain, unix_ms, uptime, sets,
                  ctx) -> None:
        found = self.templates.find(exporter, domain, set_id)
        if found is None:
            export_ns, arrival = ctx[-1][2], ctx[-1][3]
            self._held.append(_Held(exporter, domain, set_id, body, version, export_ns,
                                    arrival, uptime))
            while len(self._held) > self.max_pending:
                old = self._held.popleft()
                self.stats.note(old.exporter, "no_template")
            return
        t, row = found
        if t.options:
            records, noted = self._options_data(body, t, exporter, domain)
            if t.fixed_length and all(ln != fk.VARLEN for _, ln, _ in t.fields):
                # read whole (what is left is padding): the walk steps over a copy while
                # the options are still these
                self._known.note_options(self._code(exporter), exporter, domain, set_id, body,
                                         t, noted, records)
            if version == 10:
                self._ipfix_records += records
            return
        if version == 10:
            # IPFIX's uptime fields count from the exporter's boot (an options record)
            init = self.templates.option(exporter, domain, "system_init_ms")
            # as a 32-bit uptime, as the flows' own uptime fields wrap (the kernel unwraps)
            uptime = (unix_ms - init) & 0xFFFF_FFFF if init is not None else 0
            if t.fixed_length:
                self._ipfix_records += len(body) // t.fixed_length
        sampling = min(self.templates.option(exporter, domain, "sampling") or 0, 0xFFFF_FFFF)
        sets.add(body, row, unix_ms, uptime, len(ctx) - 1, sampling)

    def _options_data(self, body: bytes, t: Template, exporter: str,
                      domain: int) -> tuple[int, dict[str, int]]:
        """Read the options records we use (few, rare: Python is fine here); how many, and
        the options they left."""
        p, end = 0, len(body)
        fixed = t.fixed_length
        records = 0
        noted: dict[str, int] = {}
        while end - p >= max(fixed, 1):
            records += 1
            for ie, ln, pen in t.fields:
                if ln == 65535:
                    if p >= end:
                        return records - 1, noted
                    ln = body[p]
                    p += 1
                    if ln == 255:
                        if end - p < 2:
                            return records - 1, noted
                        ln = (body[p] << 8) | body[p + 1]
                        p += 2
                if p + ln > end:
                    return records - 1, noted
                if not pen and ln <= 8:
                    v = int.from_bytes(body[p:p + ln], "big")
                    name = _OPTION_NAMES.get(ie)
                    if name is not None and v:
                        self.templates.note_option(exporter, domain, name, v)
                        noted[name] = v
                p += ln
        return records, noted

    def _release(self, exporter: str, domain: int, tid: int) -> None:
        """Move the held data sets of a template just learned back into the input (they are
        decoded with the call that brought the template)."""
        if not self._held:
            return
        keep: deque[_Held] = deque()
        ready: list[_Held] = []
        for h in self._held:
            (ready if (h.exporter, h.domain, h.template_id) == (exporter, domain, tid)
             else keep).append(h)
        if ready:
            self._held = keep
            self._ready.extend(ready)

    # --- the kernel -----------------------------------------------------------------------------

    def _run(self, buf: np.ndarray, w: _Walk, codes: np.ndarray, arr: np.ndarray,
             sets: _Sets, ctx: list, order: list, n: int) -> dict[str, np.ndarray]:
        """Decode every data set of the call, the walk's and those read in Python, in
        datagram order, by one kernel call."""
        ready, self._ready = self._ready, []
        for h in ready:
            found = self.templates.find(h.exporter, h.domain, h.template_id)
            if found is None:
                self.stats.note(h.exporter, "no_template")
                continue
            ctx.append((h.exporter, h.domain, h.export_ns, h.arrival_ns, h.version))
            before = len(sets.start)
            self._data_set(h.body, h.template_id, h.version, h.exporter, h.domain,
                           h.export_ns // 1_000_000, h.uptime_ms, sets, ctx)
            order += [n] * (len(sets.start) - before)
        k = int(w.n_sets[0])
        # the call's contexts: the datagrams' (index = datagram), then those read in Python
        c_exp = np.concatenate([codes.astype(np.int64),
                                np.array([self._code(c[0]) for c in ctx], np.int64)])
        c_dom = np.concatenate([w.ctx_dom, np.array([c[1] for c in ctx], np.int64)])
        c_export = np.concatenate([w.ctx_export_s * 10**9,
                                   np.array([c[2] for c in ctx], np.int64)])
        c_arrival = np.concatenate([arr, np.array([c[3] for c in ctx], np.int64)])
        c_ver = np.concatenate([w.ctx_ver, np.array([c[4] for c in ctx], np.int64)])
        if sets.start:
            extra = np.frombuffer(b"".join(sets.chunks), np.uint8)
            base = len(buf)
            buf = np.concatenate([buf, extra])
            key = np.concatenate([w.s_dgram[:k], np.asarray(order, np.int64)])
            pick = np.argsort(key, kind="stable")
            start = np.concatenate([w.s_start[:k], np.asarray(sets.start, np.int64) + base])[pick]
            end = np.concatenate([w.s_end[:k], np.asarray(sets.end, np.int64) + base])[pick]
            row = np.concatenate([w.s_row[:k], np.asarray(sets.row, np.int32)])[pick]
            unix_ms = np.concatenate([w.s_unix_ms[:k], np.asarray(sets.unix_ms, np.int64)])[pick]
            uptime = np.concatenate([w.s_uptime[:k], np.asarray(sets.uptime_ms, np.int64)])[pick]
            dgram = np.concatenate([w.s_dgram[:k], np.asarray(sets.dgram, np.int64) + n])[pick]
            sampling = np.concatenate([w.s_sampling[:k],
                                       np.asarray(sets.sampling, np.uint64)])[pick]
        else:
            start, end, row = w.s_start[:k], w.s_end[:k], w.s_row[:k]
            unix_ms, uptime, dgram = w.s_unix_ms[:k], w.s_uptime[:k], w.s_dgram[:k]
            sampling = w.s_sampling[:k]
        n_sets = len(start)
        tc = self.templates
        fixed = np.where(tc.f_len == fk.VARLEN, 1, tc.f_len).sum(axis=1)[row] \
            if n_sets else np.zeros(0, np.int64)
        cap = int(((end - start) // np.maximum(fixed, 1)).sum()) if n_sets else 0
        out = np.zeros((self._rows, cap), np.uint64)
        out_set = np.zeros(cap, np.int64)
        status = np.zeros(n_sets, np.int8)
        m = fk.decode_sets(buf, start, end, row, unix_ms, uptime, tc.f_count, tc.f_slot,
                           tc.f_kind, tc.f_len, self._slot_row, out, out_set,
                           status) if n_sets else 0
        for s in np.flatnonzero(status == fk.ST_TRUNCATED_RECORD):
            self.stats.note(self._names[c_exp[dgram[s]]], "truncated_record")
        out, rec_set = out[:, :m], out_set[:m]
        self.stats.records += m
        d = dgram[rec_set]
        return self._columns(out, d, sampling[rec_set], c_exp, c_dom, c_export, c_arrival,
                             c_ver)

    def _columns(self, out, d, set_sampling, c_exp, c_dom, c_export, c_arrival,
                 c_ver) -> dict[str, np.ndarray]:
        """The NETFLOW columns produced (`project`) of the decoded records (`out`, a row per
        slot read: `_slot_row`), each of context `d`."""
        want = self._produce
        row = self._slot_row
        cols: dict[str, np.ndarray] = {}
        for name in want:
            slot = _SLOT_OF.get(name)
            if slot is not None:
                # wide: the kernel's own 64-bit row, no copy
                cols[name] = out[row[slot]] if self.wide else out[row[slot]].astype(_DTYPES[name])
        for name, slot in (("first", fk.S_FIRST), ("last", fk.S_LAST)):
            if name in want:
                cols[name] = out[row[slot]].view(np.int64).copy()
        if "exporter_hi" in want or "exporter_lo" in want:
            pairs = np.array(self._pair_rows or [(0, 0)], np.uint64)
            code = c_exp[d]
            cols["exporter_hi"] = pairs[code, 0]
            cols["exporter_lo"] = pairs[code, 1]
        derived = {"domain": lambda: c_dom[d].astype(np.uint32),
                   "export": lambda: c_export[d], "arrival": lambda: c_arrival[d],
                   "version": lambda: c_ver[d].astype(np.uint8)}
        for name, make in derived.items():
            if name in want:
                cols[name] = make()
        if "sampling" in want:
            sampling = out[row[fk.S_SAMPLING]]
            cols["sampling"] = np.where(sampling != 0, sampling, set_sampling).astype(np.uint32)
        if "ipversion" in want:
            src_hi, src_lo = out[row[fk.S_SRC_HI]], out[row[fk.S_SRC_LO]]
            v4 = (src_hi == 0) & ((src_lo >> np.uint64(32)) == 0xFFFF)
            ipv = out[row[fk.S_IPVERSION]].astype(np.uint8)
            cols["ipversion"] = np.where(ipv != 0, ipv, np.where(v4, 4, 6)).astype(np.uint8)
        if self.wide:
            return {name: cols[name] if cols[name].dtype.itemsize == 8 or
                    cols[name].dtype.kind == "i" else cols[name].astype(np.uint64)
                    for name in want}
        return {name: cols[name] for name in want}

    def _pair(self, exporter: str) -> tuple[int, int]:
        p = self._pairs.get(exporter)
        if p is None:
            try:
                p = address_pair(exporter)
            except ValueError:
                p = (0, 0)
            self._pairs[exporter] = p
        return p

    # --- a run's state --------------------------------------------------------------------------

    def state(self) -> dict:
        """Templates, options and sequence expectations (JSON-able)."""
        return {"templates": self.templates.state(),
                "sequences": [[e, d, v, s] for (e, d, v), s in self._next_seq.items()]}

    @classmethod
    def from_state(cls, state: dict, max_pending: int = MAX_PENDING) -> FlowDecoder:
        dec = cls(TemplateCache.from_state(state.get("templates", {})), max_pending)
        for e, d, v, s in state.get("sequences", []):
            dec._next_seq[(str(e), int(d), int(v))] = int(s)
        return dec
