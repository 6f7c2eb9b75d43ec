"""The array-level sub-aggregation engine: a fixed hash table, a flush policy and punctuation.

`HashAggregator` is what the plan-driven operator (`operator.py`) drives, and what tests and
benchmarks drive directly with plain arrays: packet timestamps (ns), group keys stacked as
uint64 columns, argument banks and a validity mask. It owns the table and the output buffer
(both allocated once), runs the jitted kernels and drains output into `Partials` chunks.

Output holding. The kernels write the rows that leave the table into `out` (`slots + 2 +
DRAIN_ROWS` rows) from its current fill on. With `hold_rows` 0 each call drains what it wrote.
With `hold_rows` > 0 (at most DRAIN_ROWS) rows stay in `out` across `append` calls and are
drained in one copy once that many are held, or when the append kernel stops early for room;
every advancing `punctuate` and `finish` drain everything, so no row is handed out after a
punctuation that covers it. (A packet batch off a ring is a few hundred packets: draining at
each one costs more than folding them.)

Punctuation. The input punctuation `p` (low-watermark, ns: no later packet has time < p) is
given with `punctuate(p)`. Packets with time < the punctuation already seen are *late*: the
kernels count and drop them (they could otherwise revive a window the operator has declared
complete). The engine's own punctuation is the largest pane-aligned p' such that no partial
row of a window ending at or before p' can still come from it:
`p' = min(p, start of the oldest pane still in the table)`, made monotone. For `iop_slow`
that reaches p once the walk has flushed the old window; for `oop_*` the m bound keeps it
within m windows of p. `finish()` flushes everything and returns the final punctuation: the
end of the last pane seen (or the input punctuation if larger): nothing more ever follows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from lowlevel.aggregates import StateLayout
from lowlevel.finality import Finality
from lowlevel.flush import (
    C_CAUSE,
    C_CUR,
    C_CURSOR,
    C_FORCED,
    C_LATE,
    C_PACE,
    C_RESIDENT,
    C_STALE,
    C_TICK,
    C_WALKING,
    C_WINDOWS,
    CAUSE_BOUND,
    CAUSES,
    EMPTY,
    NPARAMS,
    P_EVERY,
    P_LATE,
    P_M,
    P_MASK,
    P_OFFSET,
    P_PANE,
    P_POLICY,
    P_PROBES,
    P_SHIFT,
    POLICIES,
    flush_below,
    make_ctl,
)
from lowlevel.hashtable import advance, append, finish, min_resident, round_slots
from lowlevel.sizing import TableSizer, empty_table, flush_closed, rehash, resident_from

log = logging.getLogger(__name__)

#: output rows drained per kernel call beyond the table size
DRAIN_ROWS = 1 << 16


@dataclass
class Partials:
    """A chunk of partial rows: pane ids, stacked uint64 keys, state banks, and why each left."""

    window: np.ndarray          # int64 [n]
    keys: np.ndarray            # uint64 [n, nkeys]
    banks: tuple                # (i int64 [n, wi], u uint64 [n, wu], f float64 [n, wf], h uint8 [n, wh])
    cause: np.ndarray           # uint8 [n], flush.CAUSE_*
    #: bool [n]: the row is its (pane, group)'s only one (`lowlevel.finality`); None when
    #: the table does not tell (a flow table, a selection)
    final: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.window)

    @staticmethod
    def concat(chunks: list[Partials], layout: StateLayout, nkeys: int) -> Partials:
        if not chunks:
            return Partials(np.zeros(0, np.int64), np.zeros((0, nkeys), np.uint64),
                            layout.empty_banks(0), np.zeros(0, np.uint8))
        finals = [c.final for c in chunks if c.final is not None]
        return Partials(np.concatenate([c.window for c in chunks]),
                        np.concatenate([c.keys for c in chunks]),
                        tuple(np.concatenate([c.banks[b] for c in chunks]) for b in range(4)),
                        np.concatenate([c.cause for c in chunks]),
                        np.concatenate(finals) if len(finals) == len(chunks) else None)


class HashAggregator:
    """Sub-aggregation of one packet stream into a table of `slots` (power of two), fixed, or
    with `sizer` re-sized when punctuation closes a window (`lowlevel.sizing`)."""

    def __init__(self, layout: StateLayout, nkeys: int, slots: int, *, pane_ns: int,
                 offset_ns: int = 0, flush: str = "oop_lazy", slow_flush: int = 160,
                 max_disorder: int = 2, probes: int = 2, hold_rows: int = 0,
                 punctuation_flush: bool = False, sizer: TableSizer | None = None):
        if flush not in POLICIES:
            raise ValueError(f"flush policy {flush!r} is not one of {sorted(POLICIES)}")
        if pane_ns <= 0:
            raise ValueError(f"window pane must be positive, not {pane_ns} ns")
        if slow_flush < 1 or max_disorder < 0 or probes < 1 or hold_rows < 0:
            raise ValueError(f"slow_flush ({slow_flush}) must be >= 1, max_disorder "
                             f"({max_disorder}) >= 0, probes ({probes}) >= 1, hold_rows "
                             f"({hold_rows}) >= 0")
        self.layout = layout
        self.nkeys = nkeys
        self.slots = round_slots(slots)
        self.sizer = sizer
        self.resizes = 0
        self._probes_asked = probes
        self.probes = min(probes, self.slots)
        self.pane_ns = int(pane_ns)
        self.offset_ns = int(offset_ns)
        self.flush = flush
        #: every entry of a pane the input punctuation closed leaves at once, instead of up
        #: to m panes later (the appliance: a window's rows then follow its punctuation,
        #: where the policy's lag would add m windows of latency)
        self.punctuation_flush = punctuation_flush
        self.params = np.zeros(NPARAMS, np.int64)
        self.params[P_POLICY] = POLICIES[flush]
        self.params[P_PROBES] = self.probes
        self.params[P_EVERY] = slow_flush
        self.params[P_M] = max_disorder
        self._size_params()
        self.params[P_PANE] = self.pane_ns
        self.params[P_OFFSET] = self.offset_ns
        self.params[P_LATE] = EMPTY
        self.ctl = make_ctl()
        #: which rows are final (None: this table does not say, e.g. a flow table)
        self.finality: Finality | None = Finality(self.pane_ns, self.offset_ns)
        self.ops, self.ident, self._base = layout.record_ops(nkeys)
        # user-defined aggregates run in a kernel with their update calls written in
        self._append = append
        if layout.udafs:
            from lowlevel.specialize import specialized

            self._append = specialized(append, self.ops, layout.udafs)
        self.table = empty_table(self.slots, len(self.ident), layout.width["h"])
        self.out = self._out_buffer()
        self.in_punct: int | None = None
        self.out_punct: int | None = None
        self.rows_out = 0     # rows drained (the rows still held are `held`)
        self.final_rows = 0   # of them, final (`lowlevel.finality`)
        #: rows kept in `out` across appends before they are drained (module docstring)
        self.hold_rows = min(int(hold_rows), DRAIN_ROWS)
        self.held = 0
        # per-packet scratch the append kernel fills, sized to the largest batch seen
        self._panes = np.empty(0, np.int64)
        self._homes = np.empty(0, np.int64)

    # --- helpers -----------------------------------------------------------------------------
    def _size_params(self) -> None:
        self.params[P_PROBES] = self.probes
        self.params[P_MASK] = self.slots - 1
        self.params[P_SHIFT] = 64 - (self.slots.bit_length() - 1)

    def _out_buffer(self) -> tuple:
        """The output buffer of the table's size (module docstring)."""
        cap = self.slots + 2 + DRAIN_ROWS
        orec = np.zeros((cap, len(self.ident)), np.uint64)
        return (orec.view(np.int64), orec, orec.view(np.float64),
                np.zeros((cap, self.layout.width["h"]), np.uint8), np.zeros(cap, np.uint8))

    @property
    def late(self) -> int:
        """Late packets dropped."""
        return int(self.ctl[C_LATE])

    def pane_of(self, ts_ns):
        return (ts_ns + self.offset_ns) // self.pane_ns

    def pane_start(self, pane: int) -> int:
        return pane * self.pane_ns - self.offset_ns

    def _drain(self, n_out: int) -> Partials:
        """Rows [0, n_out) of `out` as a chunk (copies); `out` is empty again."""
        oi, ou, of, oh, cause = self.out
        self.rows_out += n_out
        self.held = 0
        b, w, nk = self._base, self.layout.width, self.nkeys
        # one transposing copy of the record words: each key and state column comes out
        # contiguous (Partials arrays are column-major views of it), so turning them into
        # Arrow arrays copies nothing more
        cols = ou[:n_out].T.copy()
        ci = cols.view(np.int64)
        banks = (ci[b["i"]:b["i"] + w["i"]].T, cols[b["u"]:b["u"] + w["u"]].T,
                 cols.view(np.float64)[b["f"]:b["f"] + w["f"]].T, oh[:n_out].copy())
        final = None
        if self.finality is not None:
            final = self.finality.flags(ci[0], cols[1:1 + nk])
            self.final_rows += int(np.count_nonzero(final))
        return Partials(ci[0], cols[1:1 + nk].T, banks, cause[:n_out].copy(), final)

    # --- the pipeline steps ------------------------------------------------------------------
    def append(self, ts: np.ndarray, keys: np.ndarray, args=None,
               valid: np.ndarray | None = None) -> list[Partials]:
        """Fold packets into the table; returns the partial rows that left it meanwhile (with
        `hold_rows`, the held rows once there are enough of them).

        ts: int64 ns [n]; keys: uint64 [n, nkeys]; args: (i, u, f, d) argument banks as
        `StateLayout.empty_args` shapes them (None when no sub-aggregate takes one); valid:
        bool [n] (packets to skip are False).
        """
        return self._fold(*self._prepare(ts, keys, args, valid))

    def append_prepared(self, ts: np.ndarray, keys: np.ndarray, args: tuple,
                        valid: np.ndarray) -> list[Partials]:
        """`append` of arrays already in the kernel's dtypes and shapes, contiguous (row- or
        column-major), and `args` never None (the operator builds them so): nothing
        converted or checked."""
        return self._fold(ts, keys, args, valid)

    def _fold(self, ts, keys, args, valid) -> list[Partials]:
        n = len(ts)
        if self.sizer is not None and not self.sizer.started and n:
            # the groups are counted from the first packet's pane: by the first window's
            # end its entries may have left already (punctuation_flush), and counting from
            # the oldest one still held would take two windows' groups for one
            first = ts if valid.all() else ts[valid]
            if len(first):
                self.sizer.start(int(self.pane_of(int(first.min()))))
        if len(self._panes) < n:
            self._panes = np.empty(n, np.int64)
            self._homes = np.empty(n, np.int64)
        panes, homes = self._panes[:n], self._homes[:n]   # the kernel fills them
        ai, au, af, ad = args
        chunks = []
        start = 0
        while start < n:
            start, self.held = self._append(self.table, self.out, self.ctl, self.params, self.ops,
                                      self.ident, start, self.held, panes, ts, keys, ai, au,
                                      af, ad, valid, homes)
            if self.held and (start < n or self.held >= self.hold_rows):
                chunks.append(self._drain(self.held))
        return chunks

    def _prepare(self, ts, keys, args, valid, nkeys: int | None = None):
        """The kernel's input arrays (dtypes and shapes checked once per batch)."""
        ts = np.ascontiguousarray(ts, dtype=np.int64)
        n = len(ts)
        nkeys = self.nkeys if nkeys is None else nkeys
        keys = _contiguous(keys, np.uint64).reshape(n, nkeys)
        if args is None:
            args = self.layout.empty_args(n)
        ai, au, af, ad = (_contiguous(a, d) for a, d in
                          zip(args, (np.int64, np.uint64, np.float64, np.uint64)))
        for a, w in zip((ai, au, af, ad), "iufd"):
            if a.shape != (n, self.layout.arg_width[w]):
                raise ValueError(f"argument bank {w!r} has shape {a.shape}, expected "
                                 f"{(n, self.layout.arg_width[w])}")
        valid = np.ones(n, bool) if valid is None else np.asarray(valid, dtype=bool)
        return ts, keys, (ai, au, af, ad), valid

    def punctuate(self, p_ns: int) -> tuple[list[Partials], int | None]:
        """Input punctuation p: flush what the policy says; returns rows (every held one too)
        and the new output punctuation (None when it did not advance)."""
        p_ns = int(p_ns)
        if self.in_punct is not None and p_ns <= self.in_punct:
            return [], None
        self.in_punct = p_ns
        if self.finality is not None:
            self.finality.punctuate(self.held, p_ns)
        self.params[P_LATE] = p_ns      # the kernels drop and count earlier packets
        self.held = advance(self.table, self.out, self.ctl, self.params,
                            int(self.pane_of(p_ns)), self.held)
        if self.punctuation_flush and self.ctl[C_RESIDENT] > 0:
            # each slot leaves once: with what `advance` flushed, at most the table's size
            # beyond the held rows, which `out` has room for
            self.held = flush_below(self.table, self.out, self.ctl, int(self.pane_of(p_ns)),
                                    self.held, CAUSE_BOUND)
        chunks = self._adapt(int(self.pane_of(p_ns)))
        if self.held:
            chunks.append(self._drain(self.held))
        return chunks, self._raise_out(p_ns)

    def _created(self) -> int:
        """Entries created so far: each is resident or has left once as a partial row."""
        c = self.ctl
        return int(c[C_RESIDENT]) + sum(int(c[C_CAUSE + k]) for k in range(len(CAUSES)))

    def _adapt(self, open_pane: int) -> list[Partials]:
        """Re-choose the table's size when punctuation has closed a window (windows before
        `open_pane`); returns the rows a resize let out."""
        if self.sizer is None or self.ctl[C_CUR] == EMPTY:
            return []
        if not self.sizer.started:
            # the oldest pane still held is the first one met (nothing has left it yet,
            # unless evicted, and then a later one: the estimate errs high, so grows)
            low = min_resident(self.table, self.ctl)
            self.sizer.start(min(open_pane, int(low)) if low != EMPTY else open_pane)
        created = self._created() - resident_from(self.table, open_pane)
        slots = self.sizer.choose(self.slots, open_pane, created)
        return self.resize(slots, open_pane) if slots != self.slots else []

    def resize(self, slots: int, open_pane: int) -> list[Partials]:
        """Move the table to `slots` slots at a window boundary (`lowlevel.sizing`): the
        entries of panes before `open_pane` (closed: no packet reaches them) leave first,
        the others move with their state. Returns the rows that left (held ones first)."""
        slots = round_slots(slots)
        cur = int(self.ctl[C_CUR])
        # iop keeps its output in window order: every entry older than the current window
        # leaves now (older panes first), so any eviction below is of the current window
        limit = max(open_pane, cur) if self.flush == "iop_slow" else open_pane
        n = flush_closed(self.table, self.out, self.ctl, limit, self.held, CAUSE_BOUND)
        self.slots, self.probes = slots, min(self._probes_asked, slots)
        self._size_params()
        new = empty_table(slots, len(self.ident), self.layout.width["h"])
        n = rehash(self.table, new, self.out, self.ctl, self.nkeys, self.probes, slots - 1,
                   int(self.params[P_SHIFT]), n)
        chunks = [self._drain(n)] if n else []
        self.table, self.out = new, self._out_buffer()
        self.resizes += 1
        # the walks went by slot positions of the old table: start them again over this one
        c = self.ctl
        c[C_STALE] = 0
        old = min_resident(self.table, c)
        c[C_WALKING] = int(self.flush != "oop_lazy" and old != EMPTY and old < cur)
        c[C_CURSOR] = 0
        c[C_TICK] = 0
        c[C_PACE] = 0 if self.flush != "iop_slow" else slots
        log.debug("table resized to %d slots (%d groups per window)", slots,
                  self.sizer.groups if self.sizer else 0)
        return chunks

    def _raise_out(self, bound: int) -> int | None:
        low = min_resident(self.table, self.ctl)
        if low != EMPTY:
            bound = min(bound, self.pane_start(int(low)))
        if self.out_punct is None or bound > self.out_punct:
            self.out_punct = bound
            return bound
        return None

    def finish(self) -> tuple[list[Partials], int]:
        """End of input: flush every entry; returns rows (every held one too) and the final
        punctuation."""
        if self.finality is not None:       # nothing follows: every pane is closed
            self.finality.punctuate(self.held, np.iinfo(np.int64).max)
        self.held = finish(self.table, self.out, self.ctl, self.held)
        chunks = [self._drain(self.held)] if self.held else []
        final = self.in_punct if self.in_punct is not None else np.iinfo(np.int64).min
        cur = int(self.ctl[C_CUR])
        if cur != EMPTY:
            final = max(final, self.pane_start(cur + 1))
        if self.out_punct is not None:
            final = max(final, self.out_punct)
        self.out_punct = final
        return chunks, final

    @property
    def counters(self) -> dict[str, int]:
        c = self.ctl
        causes = {f"rows_{name}": int(c[C_CAUSE + k]) for k, name in enumerate(CAUSES)}
        rows_out = self.rows_out + self.held     # rows that left the table, held ones too
        return {
            "late": self.late,
            "rows_out": rows_out,
            "evictions": causes["rows_evict"],
            "flushed": rows_out - causes["rows_evict"],
            "final_rows": self.final_rows,
            "forced_full_flushes": int(c[C_FORCED]),
            "windows": int(c[C_WINDOWS]),
            "resident": int(c[C_RESIDENT]),
            "slots": self.slots,
            "resizes": self.resizes,
            **causes,
        }


def _contiguous(a, dtype) -> np.ndarray:
    """`a` as an array of `dtype`, row- or column-major as it is (the operator hands over
    column-major keys and arguments), copied only when it is neither."""
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous or a.flags.f_contiguous else np.ascontiguousarray(a)
