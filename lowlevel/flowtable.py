"""The flow-table mode of the low level: NetFlow-style flows with idle timeout, FIN/RST end and end reasons.

A query switched into flow mode (DEFINE `idle_timeout` and/or `flow_end`, see docs/gsql.md "Flow
queries") runs this instead of the plain sub-aggregation table. It is the same fixed hash table
(`hashtable.py`: home slot, `probes` consecutive slots, `aggregates.update_slot`, `flush.emit`),
with a record of `[pane | group keys | flow id | last | state banks]`: a group (the 5-tuple and
the bucket) is a *flow*, and a flow can end before its bucket does. By arrival order within a
link:

- a packet arriving more than `idle` after its flow's last packet (`ts - last > idle`) ends
  that flow (reason 1, idle) and starts a new one;
- with `flow_end fin_rst` a TCP packet carrying FIN or RST is added and then ends its flow
  (reason 3, end detected); the next packet of the 5-tuple starts a new flow;
- a packet whose probe slots are all taken by other flows evicts the least recently active one
  (reason 5, lack of resources) and starts its own;
- a flow's *event time* is its idle expiry `last + idle + 1` or its bucket end, whichever comes
  first (ties: idle); the reason is 1 or 2 (active) accordingly. At punctuation p, every flow
  whose event time is <= h = min(p, the link's largest capture time seen) leaves with that
  reason: so the reasons depend on the data, never on how often punctuation comes (a heartbeat
  ahead of the data decides nothing the data could not);
- at the end of input the flows whose event time is <= the link's largest capture time leave
  with reason 1 or 2, every other flow with reason 4 (forced end).

A due flow may stay in the table a little longer without changing any result (a later packet
of its 5-tuple would end it with the same reason; its bucket's packets are late by then), so
the table is scanned for idle flows at most every idle/16 of capture time, and at once when a
bucket has ended (so the high level can close the window). Scanning at every punctuation would
cost a full table walk each time.

The flow id (a hidden group key the planner adds) is `link tag << 40 | serial`: unique per
flow, so the high level's combine of equal (window, keys) rows is the identity on flow rows.
The end reason is written into the state column of the query's END_REASON() aggregate (a `max`
sub-aggregate over the constant 0: the kernel sets it when the flow leaves). Nothing is
allocated per packet; one packet produces at most two rows, a punctuation at most `slots`.
"""

from __future__ import annotations

import zlib

import numpy as np

from common.jit import ngjit, ngjit_inline
from lowlevel.aggregates import StateLayout, update_slot
from lowlevel.engine import HashAggregator, Partials
from lowlevel.flush import (
    C_CUR,
    C_LATE,
    C_RESIDENT,
    CAUSE_BOUND,
    CAUSE_EVICT,
    CAUSE_FINISH,
    EMPTY,
    NCTL,
    P_LATE,
    P_MASK,
    P_PROBES,
    P_SHIFT,
    count_pane,
    emit,
    move_cur,
)
from lowlevel.hashtable import PREFETCH_AHEAD, home_slot, min_resident, prefetch_record
from lowlevel.specialize import specialized

#: IPFIX flowEndReason (IE 136)
REASON_IDLE, REASON_ACTIVE, REASON_END, REASON_FORCED, REASON_EVICTED = 1, 2, 3, 4, 5
REASONS = {1: "idle", 2: "active", 3: "end", 4: "forced", 5: "evicted"}

# flow params words
F_IDLE = 0          # idle timeout (ns); -1: none
F_REASON_W = 1      # record word of the END_REASON state; -1: the query has none
F_TAG = 2           # link tag << 40, or-ed into every flow id
F_PANE = 3          # pane_ns
F_OFFSET = 4        # offset_ns
NFPARAMS = 5

# flow ctl words, after the hash table's
C_SERIAL = NCTL     # flows started
C_DUE = NCTL + 1    # a lower bound of the smallest event time of a resident flow
C_REASON = NCTL + 2  # 6 words: rows out per reason (index = reason)
NFCTL = C_REASON + 6

_I64_MAX = np.iinfo(np.int64).max
SERIAL_BITS = 40


def link_tag(link: str) -> int:
    """The high bits of a link's flow ids (23 bits of crc32: flows of different links differ)."""
    return (zlib.crc32(link.encode()) & 0x7F_FFFF) << SERIAL_BITS


@ngjit_inline
def flow_event(ri, s, lw, fparams):
    """(event time, reason) of the flow in slot s: idle expiry or bucket end, the earlier."""
    end = (ri[s, 0] + 1) * fparams[F_PANE] - fparams[F_OFFSET]
    idle = fparams[F_IDLE]
    if idle >= 0:
        t = ri[s, lw] + idle + 1
        if t <= end:
            return t, REASON_IDLE
    return end, REASON_ACTIVE


@ngjit_inline
def emit_flow(table, out, ctl, fparams, s, n_out, reason):
    """The flow of slot s leaves with `reason` (written into its END_REASON state)."""
    rw = fparams[F_REASON_W]
    if rw >= 0:
        table[0][s, rw] = reason
    ctl[C_REASON + reason] += 1
    cause = CAUSE_EVICT if reason == REASON_EVICTED else (
        CAUSE_FINISH if reason == REASON_FORCED else CAUSE_BOUND)
    return emit(table, out, ctl, s, n_out, cause)


@ngjit
def flow_append(table, out, ctl, params, fparams, ops, ident, start, panes, ts, keys, ai, au,
                af, ad, valid, ends, homes):
    """Fold packets [start, n) into the flow table; returns (next packet, rows written).

    `ends[i]` marks a packet that ends its flow after being added (TCP FIN/RST). Returns early
    when fewer than 2 free output rows remain (the most one packet can produce). Late packets
    (time < params[P_LATE]) are skipped and counted in ctl[C_LATE].
    """
    ri, ru, rf, th = table
    probes = params[P_PROBES]
    mask = params[P_MASK]
    shift = params[P_SHIFT]
    idle = fparams[F_IDLE]
    tag = fparams[F_TAG]
    late_before = params[P_LATE]
    width = ru.shape[1]
    cap = out[0].shape[0]
    nk = keys.shape[1]
    fw = 1 + nk          # the flow id word
    lw = 2 + nk          # the last-packet time word
    n = panes.shape[0]
    n_out = 0
    if start == 0:
        for i in range(n):
            homes[i] = home_slot(panes[i], keys, i, shift)
    for i in range(start, n):
        if i + PREFETCH_AHEAD < n:
            ahead = homes[i + PREFETCH_AHEAD]
            for j in range(probes):
                prefetch_record(ri, (ahead + j) & mask)
        if n_out + 2 > cap:
            return i, n_out
        if not valid[i]:
            continue
        t = ts[i]
        if t < late_before:
            ctl[C_LATE] += 1
            continue
        p = panes[i]
        if p > ctl[C_CUR]:
            move_cur(ctl, p)
        home = homes[i]
        # the probe of hashtable.append, repeated: as a shared inline helper returning
        # (match, free) it made both kernels slower
        match = -1
        free = -1
        for j in range(probes):
            s = (home + j) & mask
            tp = ri[s, 0]
            if tp == EMPTY:
                if free < 0:
                    free = s
            elif tp == p:
                same = True
                for k in range(nk):
                    if ru[s, 1 + k] != keys[i, k]:
                        same = False
                        break
                if same:
                    match = s
                    break
        if match >= 0 and idle >= 0 and t - ri[match, lw] > idle:
            n_out = emit_flow(table, out, ctl, fparams, match, n_out, REASON_IDLE)
            free = match
            match = -1
        if match < 0:
            if free < 0:
                # every probe slot holds another flow: the least recently active one goes
                victim = home
                vl = ri[home, lw]
                for j in range(1, probes):
                    s = (home + j) & mask
                    if ri[s, lw] < vl:
                        victim = s
                        vl = ri[s, lw]
                n_out = emit_flow(table, out, ctl, fparams, victim, n_out, REASON_EVICTED)
                free = victim
            for k in range(1 + nk, width):
                ru[free, k] = ident[k]
            ri[free, 0] = p
            count_pane(ctl, p, 1)
            for k in range(nk):
                ru[free, 1 + k] = keys[i, k]
            ri[free, fw] = tag | ctl[C_SERIAL]
            ctl[C_SERIAL] += 1
            ri[free, lw] = t
            for k in range(th.shape[1]):
                th[free, k] = 0
            ctl[C_RESIDENT] += 1
            due, _ = flow_event(ri, free, lw, fparams)
            if due < ctl[C_DUE]:
                ctl[C_DUE] = due
            match = free
        update_slot(ri, ru, rf, th, match, i, ops, ts, ai, au, af, ad)
        if t > ri[match, lw]:
            ri[match, lw] = t
        if ends[i]:
            n_out = emit_flow(table, out, ctl, fparams, match, n_out, REASON_END)
    return n, n_out


@ngjit
def flow_expire(table, out, ctl, fparams, lw, horizon, forced):
    """Flows whose event time is <= horizon leave (reason 1 or 2); with `forced`, every other
    flow too (reason 4). Returns rows written (at most one per slot)."""
    ri = table[0]
    n_out = 0
    if not forced and horizon < ctl[C_DUE]:
        return 0   # nothing can be due yet: no scan
    nxt = _I64_MAX
    for s in range(ri.shape[0]):
        if ctl[C_RESIDENT] == 0:
            break
        if ri[s, 0] == EMPTY:
            continue
        ev, reason = flow_event(ri, s, lw, fparams)
        if ev <= horizon:
            n_out = emit_flow(table, out, ctl, fparams, s, n_out, reason)
        elif forced:
            n_out = emit_flow(table, out, ctl, fparams, s, n_out, REASON_FORCED)
        elif ev < nxt:
            nxt = ev
    ctl[C_DUE] = nxt
    return n_out


class FlowAggregator(HashAggregator):
    """A `HashAggregator` whose groups are flows (module docstring): `nkeys` hash key words;
    output rows carry one more key word, the flow id."""

    def __init__(self, layout: StateLayout, nkeys: int, slots: int, *, pane_ns: int,
                 offset_ns: int = 0, idle_ns: int | None = None, reason_state: str | None = None,
                 link: str = "", probes: int = 2):
        if idle_ns is not None and idle_ns <= 0:
            raise ValueError(f"idle timeout must be positive, not {idle_ns} ns")
        super().__init__(layout, nkeys + 2, slots, pane_ns=pane_ns, offset_ns=offset_ns,
                         flush="oop_lazy", probes=probes)
        self.hash_keys = nkeys
        self.nkeys = nkeys + 1           # rows carry the flow id, not the last-packet time
        self.finality = None             # a flow's rows are unique per flow id anyway
        self.idle_ns = idle_ns
        self.fparams = np.zeros(NFPARAMS, np.int64)
        self.fparams[F_IDLE] = -1 if idle_ns is None else idle_ns
        self.fparams[F_REASON_W] = -1
        if reason_state is not None:
            bank, col, _ = layout.columns[reason_state]
            if bank != "u":
                raise ValueError(f"the end reason state {reason_state!r} must be uint64")
            self.fparams[F_REASON_W] = self._base["u"] + col
        self.fparams[F_TAG] = link_tag(link)
        self.fparams[F_PANE] = self.pane_ns
        self.fparams[F_OFFSET] = self.offset_ns
        ctl = np.zeros(NFCTL, np.int64)
        ctl[:len(self.ctl)] = self.ctl
        ctl[C_DUE] = _I64_MAX
        self.ctl = ctl
        self._lw = 2 + nkeys
        #: idle flows are looked for at most this often (capture time, ns)
        self.scan_gap = (idle_ns // 16) if idle_ns is not None else self.pane_ns
        self._kernel = specialized(flow_append, self.ops, layout.udafs)
        self._last_scan: int | None = None
        self.max_ts: int | None = None   # the link's largest capture time seen

    def observe(self, ts_max: int) -> None:
        """The link's capture times reached ts_max (packets outside the query count too)."""
        if self.max_ts is None or ts_max > self.max_ts:
            self.max_ts = int(ts_max)

    def append(self, ts: np.ndarray, keys: np.ndarray, args=None,
               valid: np.ndarray | None = None, ends: np.ndarray | None = None) -> list[Partials]:
        """As `HashAggregator.append`, plus `ends`: bool [n], packets that end their flow."""
        ts, keys, (ai, au, af, ad), valid = self._prepare(ts, keys, args, valid, self.hash_keys)
        n = len(ts)
        ends = np.zeros(n, bool) if ends is None else np.ascontiguousarray(ends, dtype=bool)
        if ends.shape != (n,):
            raise ValueError(f"ends has shape {ends.shape}, expected {(n,)}")
        panes, homes = self._scratch(n)
        if n:
            low, high = int(ts.min()), int(ts.max())
            self.observe(high)
            if self.pane_of(low) == self.pane_of(high):
                panes.fill(self.pane_of(low))      # a batch within one pane: no division
            else:
                np.add(ts, self.offset_ns, out=panes)
                np.floor_divide(panes, self.pane_ns, out=panes)
        chunks = []
        start = 0
        while start < n:
            start, n_out = self._kernel(self.table, self.out, self.ctl, self.params,
                                        self.fparams, self.ops, self.ident, start, panes, ts,
                                        keys, ai, au, af, ad, valid, ends, homes)
            if n_out:
                chunks.append(self._drain(n_out))
        return chunks

    def _scratch(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(panes, homes) for n packets: views of buffers reused from batch to batch (the
        kernel reads and writes them only during `append`)."""
        if len(self._panes) < n:      # the base's buffers (empty at first), grown here
            self._panes, self._homes = np.empty(n, np.int64), np.empty(n, np.int64)
        return self._panes[:n], self._homes[:n]

    def punctuate(self, p_ns: int) -> tuple[list[Partials], int | None]:
        """Input punctuation p: flows due by min(p, largest capture time) leave; returns rows
        and the new output punctuation (None when it did not advance)."""
        p_ns = int(p_ns)
        if self.in_punct is not None and p_ns <= self.in_punct:
            return [], None
        self.in_punct = p_ns
        self.params[P_LATE] = p_ns
        chunks = []
        if self.max_ts is not None and self._scan_due(min(p_ns, self.max_ts)):
            horizon = min(p_ns, self.max_ts)
            self._last_scan = horizon
            n_out = flow_expire(self.table, self.out, self.ctl, self.fparams, self._lw,
                                horizon, False)
            if n_out:
                chunks.append(self._drain(n_out))
        return chunks, self._raise_out(p_ns)

    def _scan_due(self, horizon: int) -> bool:
        if horizon < self.ctl[C_DUE]:
            return False
        if self._last_scan is None or horizon >= self._last_scan + self.scan_gap:
            return True
        low = min_resident(self.table, self.ctl)
        return low != EMPTY and self.pane_start(int(low) + 1) <= horizon

    def finish(self) -> tuple[list[Partials], int]:
        """End of input: flows due by the largest capture time leave with reason 1/2, the
        rest with reason 4; returns rows and the final punctuation."""
        horizon = self.max_ts if self.max_ts is not None else np.iinfo(np.int64).min
        n_out = flow_expire(self.table, self.out, self.ctl, self.fparams, self._lw, horizon, True)
        chunks = [self._drain(n_out)] if n_out else []
        more, final = super().finish()   # the table is empty: only the final punctuation
        return chunks + more, final

    @property
    def counters(self) -> dict[str, int]:
        out = super().counters
        out["flows"] = int(self.ctl[C_SERIAL])
        for r, name in REASONS.items():
            out[f"flows_{name}"] = int(self.ctl[C_REASON + r])
        return out
