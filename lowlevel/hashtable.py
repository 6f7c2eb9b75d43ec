"""The fixed-size hash table of sub-aggregates: the per-packet kernel and its punctuation steps.

One table per (query, link) operator, allocated once: `slots` (a power of two) records of the
hidden leading key `pane`, the group keys stacked as uint64 words, and the state banks of
`aggregates.StateLayout` (layout: `flush.py`). A packet hashes (pane, keys) to a home slot and probes `probes`
consecutive slots (the deployed Gigascope checks the next entry): a match is updated, else a
free probe slot is taken, else a resident entry is evicted as a partial row and the packet's
group takes its slot (which one, and what must go first, is the flush policy: `flush.py`).
Nothing is allocated per packet or per group; output rows go to a preallocated buffer that
the Python wrapper drains. Every kernel writes from a given row (the rows the wrapper still
holds there) and returns the new fill, so rows can accumulate over many calls. The append
kernel stops early (returning where) when the buffer might not hold the rows one more packet
can produce (at most `slots`), so it never overflows.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from common.jit import ngjit, ngjit_inline
from lowlevel.aggregates import update_slot
from lowlevel.flush import (
    C_ANCIENT,
    C_BOUND,
    C_CUR,
    C_LATE,
    C_RESIDENT,
    C_RING,
    C_STALE,
    C_TICK,
    C_WALKING,
    CAUSE_BOUND,
    CAUSE_EVICT,
    CAUSE_FINISH,
    EMPTY,
    P_EVERY,
    P_LATE,
    P_M,
    P_MASK,
    P_OFFSET,
    P_PANE,
    P_POLICY,
    P_PROBES,
    P_SHIFT,
    PANE_RING,
    POLICY_IOP_SLOW,
    POLICY_OOP_LAZY,
    count_pane,
    emit_row,
    flush_below,
    forced_full_flush,
    new_window,
    pace_threshold,
    paced_sweep,
    slow_flush_step,
)

_SEED = np.uint64(0x9E3779B97F4A7C15)
_K1 = np.uint64(0xBF58476D1CE4E5B9)
_K2 = np.uint64(0x94D049BB133111EB)
_S32 = np.uint64(32)


def round_slots(slots: int) -> int:
    """The table size for a requested number of slots: the next power of two, at least 2."""
    slots = max(2, int(slots))
    return 1 << (slots - 1).bit_length()


@ngjit_inline
def home_slot(pane, keys, i, shift):
    """Home slot of (pane, keys[i]): multiply-xorshift over the words, top bits of the last
    product (cheaper than a full mix per word, and every key bit reaches the top bits)."""
    h = (np.uint64(pane) ^ _SEED) * _K1
    for j in range(keys.shape[1]):
        h = (h ^ keys[i, j]) * _K2
        h ^= h >> _S32
    h *= _K1
    return np.int64(h >> np.uint64(shift))


#: packets ahead whose home record is prefetched (the table is far larger than the caches at
#: the group counts that matter; hashing is independent of the table, so homes are computed
#: in a first pass and the main pass prefetches ahead)
PREFETCH_AHEAD = 16


@intrinsic
def prefetch_cell(typingctx, arr, row, col):
    """Hint the CPU to load the cache line of arr[row, col] (2-D array) for writing."""
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, signature.args[0], ary,
                                       [args[1], args[2]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@ngjit_inline
def prefetch_row(arr, row):
    """Hint the CPU to load the cache line of arr[row, 0] for writing."""
    prefetch_cell(arr, row, 0)


@ngjit_inline
def prefetch_record(arr, row):
    """Hint the CPU to load every cache line of record arr[row] (a wide record spans several:
    a flow's 19 words are 152 bytes, and the keys and the states lie on different lines)."""
    width = arr.shape[1]
    for c in range(0, width, 8):
        prefetch_cell(arr, row, c)
    prefetch_cell(arr, row, width - 1)


@ngjit
def append(table, out, ctl, params, ops, ident, start, n_out, panes, ts, keys, ai, au, af, ad,
           valid, homes):
    """Fold packets [start, n) into the table (the `append` step); returns (next packet, fill).

    `panes` and `homes` are scratch [n] the call with start == 0 fills (pane of each packet
    from `ts` and params P_PANE/P_OFFSET, and its home slot); calls resuming at start > 0
    reuse them.

    `valid[i]` false skips packet i (WHERE, protocol); a packet with time < params[P_LATE]
    (the input punctuation) is late: skipped and counted in ctl[C_LATE]. Rows are written to
    `out` from row `n_out` on (rows before it are still held by the caller); the returned fill
    is the row after the last one written. When fewer than `slots + 2` free output rows remain
    the kernel returns early with the index of the first unprocessed packet so that the caller
    can drain `out` and call again.
    """
    ri, ru, rf, th = table
    oi, ou, of, oh, ocause = out
    policy = params[P_POLICY]
    probes = params[P_PROBES]
    every = params[P_EVERY]
    mask = params[P_MASK]
    shift = params[P_SHIFT]
    late_before = params[P_LATE]
    size = ri.shape[0]
    width = ru.shape[1]
    nh = th.shape[1]
    cap = out[0].shape[0]
    nk = keys.shape[1]
    n = panes.shape[0]
    pane_ns = params[P_PANE]
    offset = params[P_OFFSET]
    m = params[P_M]
    pace = size / pane_ns       # paced bound sweep: slots per ns of the current pane
    pace_at = pace_threshold(ctl, size, pane_ns, offset, pace)
    if start == 0:
        # panes computed here rather than by numpy in the wrapper: one pass, no temporaries
        for i in range(n):
            q = (ts[i] + offset) // pane_ns
            panes[i] = q
            homes[i] = home_slot(q, keys, i, shift)
    for i in range(start, n):
        if i + PREFETCH_AHEAD < n:
            # the probe window may straddle two cache lines: fetch both ends
            ahead = homes[i + PREFETCH_AHEAD]
            prefetch_row(ri, ahead)
            prefetch_row(ri, (ahead + probes - 1) & mask)
        if n_out + size + 2 > cap:
            return i, n_out
        if not valid[i]:
            continue
        if ts[i] < late_before:
            ctl[C_LATE] += 1
            continue
        p = panes[i]
        if p > ctl[C_CUR]:
            n_out = new_window(table, out, ctl, params, p, n_out)
            pace_at = pace_threshold(ctl, size, pane_ns, offset, pace)
        if policy != POLICY_OOP_LAZY and ctl[C_WALKING] != 0:
            tick = ctl[C_TICK] + 1
            if tick >= every:
                tick = 0
                n_out = slow_flush_step(ri, ru, th, ou, oh, ocause, ctl, n_out)
            ctl[C_TICK] = tick
        if ts[i] >= pace_at:
            target = min(size, np.int64((ts[i] + offset - ctl[C_CUR] * pane_ns) * pace) + 1)
            n_out = paced_sweep(ri, ru, th, ou, oh, ocause, ctl, m, target, n_out)
            pace_at = pace_threshold(ctl, size, pane_ns, offset, pace)
        home = homes[i]
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
        if match < 0:
            if free < 0:
                cur = ctl[C_CUR]
                victim = -1
                if policy == POLICY_IOP_SLOW:
                    # an old entry may go at once (its window precedes every new one) ...
                    for j in range(probes):
                        s = (home + j) & mask
                        if ri[s, 0] < cur:
                            victim = s
                            break
                    if victim < 0:
                        # ... a new-window entry only after every old one: the IOP surge
                        n_out = forced_full_flush(table, out, ctl, n_out)
                        victim = home
                else:
                    victim = home
                    vp = ri[home, 0]
                    for j in range(1, probes):
                        s = (home + j) & mask
                        if ri[s, 0] < vp:
                            victim = s
                            vp = ri[s, 0]
                n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, victim, n_out, CAUSE_EVICT)
                free = victim
            # create: the identity record, then pane and keys
            for k in range(1 + nk, width):
                ru[free, k] = ident[k]
            ri[free, 0] = p
            count_pane(ctl, p, 1)
            for k in range(nk):
                ru[free, 1 + k] = keys[i, k]
            for k in range(nh):
                th[free, k] = 0
            ctl[C_RESIDENT] += 1
            if p < ctl[C_CUR] and policy == POLICY_IOP_SLOW:
                ctl[C_STALE] = 1
            match = free
        # one call site: a second inlined copy of the branchy update slows the whole loop
        update_slot(ri, ru, rf, th, match, i, ops, ts, ai, au, af, ad)
    return n, n_out


@ngjit
def advance(table, out, ctl, params, pane, n_out):
    """Input punctuation reached pane `pane` (every earlier pane is closed): start it as a new
    window if it is ahead of the data, and for oop apply the m bound. Rows go to `out` from
    row `n_out` on (at most one per slot); returns the new fill."""
    if pane > ctl[C_CUR]:
        n_out = new_window(table, out, ctl, params, pane, n_out)
    if params[P_POLICY] != POLICY_IOP_SLOW and ctl[C_CUR] != EMPTY:
        # sweep again even if this horizon was swept: out-of-order packets may have created
        # entries below it since
        horizon = ctl[C_CUR] - 1 - params[P_M]
        n_out = flush_below(table, out, ctl, horizon + 1, n_out, CAUSE_BOUND)
        ctl[C_BOUND] = max(ctl[C_BOUND], horizon)
    return n_out


@ngjit
def min_resident(table, ctl):
    """Smallest pane in the table (EMPTY when the table is empty)."""
    ri = table[0]
    if ctl[C_RESIDENT] == 0:
        return EMPTY
    if ctl[C_ANCIENT] == 0:
        cur = ctl[C_CUR]
        for q in range(cur - PANE_RING + 1, cur + 1):
            if ctl[C_RING + (q & (PANE_RING - 1))] > 0:
                return q
    best = np.iinfo(np.int64).max
    for s in range(ri.shape[0]):
        tp = ri[s, 0]
        if tp != EMPTY and tp < best:
            best = tp
    return best


@ngjit
def finish(table, out, ctl, n_out):
    """End of input: flush everything, older panes first (keeps iop output in window order).
    Rows go to `out` from row `n_out` on (at most one per slot); returns the new fill."""
    while ctl[C_RESIDENT] > 0:
        low = min_resident(table, ctl)
        n_out = flush_below(table, out, ctl, low + 1, n_out, CAUSE_FINISH)
    ctl[C_WALKING] = 0
    ctl[C_STALE] = 0
    return n_out
