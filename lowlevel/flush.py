"""The flush policies of the fixed hash table: IOP slow flush, OOP lazy flush, OOP slow flush.

docs/semantics.md "Flush policies" and the thesis Fig 8-6. An entry is *old* when its pane
(window) is below the operator's current pane `cur` (the largest pane seen in data or
punctuation), so "at a new window all entries are marked old" costs nothing: raising `cur` marks
them.

- `iop_slow`: at a new window, if the previous walk is unfinished, the old entries it left are
  flushed at once; then a cursor walk starts at slot 0. While walking, every `slow_flush`-th
  packet first flushes the next old entry at the cursor (the cursor skips non-old slots, so
  one call outputs one old entry; Fig 8-6 with i = 1). A packet whose probe slots hold only
  new-window entries of other groups forces a flush of ALL remaining old entries (a forced
  full flush) before the resident entry is evicted: output stays in window order.
- `oop_lazy`: no walk; old entries leave when a packet needs their slot, plus the bound: once
  pane `cur` starts (or punctuation reaches it), every entry of a pane <= cur - 1 - m is
  flushed (so every entry of window w is out before window w + m closes). That sweep is
  *paced*: while pane `cur` runs, a second cursor walks the table in step with the packets'
  time through the pane (slot `size * elapsed / pane` by the time `elapsed` into it) and
  flushes the entries the next start will make due (panes <= cur - m), so at the boundary
  only entries created behind the cursor remain, and no window start stalls the packet loop
  for a table scan (the thesis' "spread the workload across window boundaries").
- `oop_slow`: `oop_lazy` plus the walk of `iop_slow` (one old entry every `slow_flush`
  packets), without the forced full flushes.

Kernel state: `table = (ri, ru, rf, th)`: one record row per slot, `ru` uint64 [slots, W] with
`ri`/`rf` its int64/float64 views (the same memory): word 0 the pane (`EMPTY` marks a free
slot), words 1..nkeys the keys, then the state columns of the i, u and f banks; `th` the HLL
registers (uint8). One record is one or two cache lines, so a packet touches one place.
`out = (oi, ou, of, oh, cause)` is the preallocated partial-row buffer in the same layout:
kernels write rows from a fill position `n_out` they are given on and return the new fill
(rows before it are ones the wrapper still holds); `ctl` holds int64 control words and
counters (indices `C_*`), `params` settings (`P_*`).
"""

from __future__ import annotations

import numpy as np

from common.jit import ngjit, ngjit_inline

EMPTY = np.iinfo(np.int64).min

POLICY_OOP_LAZY, POLICY_OOP_SLOW, POLICY_IOP_SLOW = 0, 1, 2
POLICIES = {"oop_lazy": POLICY_OOP_LAZY, "oop_slow": POLICY_OOP_SLOW, "iop_slow": POLICY_IOP_SLOW}

# why a partial row left the table (the `cause` of an output row)
CAUSE_EVICT = 0     # a packet needed its slot (collision)
CAUSE_SLOW = 1      # the slow-flush cursor walk
CAUSE_AT_ONCE = 2   # iop: a new window began before the walk ended
CAUSE_FORCED = 3    # iop: forced full flush (collision with a new-window entry)
CAUSE_BOUND = 4     # oop: the m-window bound
CAUSE_FINISH = 5    # end of input
CAUSES = ("evict", "slow", "at_once", "forced", "bound", "finish")

# ctl words
C_CUR = 0           # current pane (EMPTY before the first packet)
C_CURSOR = 1        # slow-flush cursor
C_WALKING = 2       # 1 while a slow-flush walk is in progress
C_STALE = 3         # iop: an old entry was created out of order (the walk cannot see it)
C_TICK = 4          # packets since the last slow-flush step
C_BOUND = 5         # oop: panes <= this have been swept by the m bound
C_WINDOWS = 6       # new windows started
C_FORCED = 7        # forced full flushes (iop)
C_CAUSE = 8         # 6 words: rows out per cause
C_RESIDENT = 14     # occupied slots
C_ANCIENT = 15      # occupied slots of panes <= cur - PANE_RING
C_RING = 16         # PANE_RING words: occupied slots of pane q at C_RING + (q mod PANE_RING)
PANE_RING = 64      # so the oldest resident pane is found without scanning the table
C_LATE = C_RING + PANE_RING     # late packets dropped (time < params[P_LATE])
C_PACE = C_LATE + 1             # oop: the paced bound sweep's next slot (slots: done)
NCTL = C_PACE + 1

# params words
P_POLICY, P_PROBES, P_EVERY, P_M, P_MASK, P_SHIFT = 0, 1, 2, 3, 4, 5
P_PANE, P_OFFSET = 6, 7     # pane length and window offset (ns): the kernel computes panes
P_LATE = 8                  # input punctuation (ns; EMPTY before any): earlier packets are late
NPARAMS = 9


def make_ctl() -> np.ndarray:
    ctl = np.zeros(NCTL, np.int64)
    ctl[C_CUR] = EMPTY
    ctl[C_BOUND] = EMPTY
    ctl[C_PACE] = np.iinfo(np.int64).max    # no sweep before the first pane
    return ctl


@ngjit_inline
def count_pane(ctl, pane, delta):
    """Keep the per-pane occupancy counts (pane <= cur always holds for a resident entry)."""
    if pane <= ctl[C_CUR] - PANE_RING:
        ctl[C_ANCIENT] += delta
    else:
        ctl[C_RING + (pane & (PANE_RING - 1))] += delta


@ngjit_inline
def emit(table, out, ctl, s, n_out, cause):
    """Copy slot s to output row n_out, free the slot; returns the next output row."""
    ri, ru, rf, th = table
    oi, ou, of, oh, ocause = out
    return emit_row(ri, ru, th, ou, oh, ocause, ctl, s, n_out, cause)


@ngjit_inline
def emit_row(ri, ru, th, ou, oh, ocause, ctl, s, n_out, cause):
    """`emit` on the arrays themselves. Per-packet and per-slot loops call this with arrays
    unpacked once: unpacking the tuples at each call costs a reference-count call per array,
    on every evicted entry."""
    for j in range(ru.shape[1]):
        ou[n_out, j] = ru[s, j]
    for j in range(th.shape[1]):
        oh[n_out, j] = th[s, j]
    ocause[n_out] = cause
    count_pane(ctl, ri[s, 0], -1)
    ri[s, 0] = EMPTY
    ctl[C_CAUSE + cause] += 1
    ctl[C_RESIDENT] -= 1
    return n_out + 1


@ngjit_inline
def any_below(ctl, limit):
    """Whether some resident entry has a pane < limit (from the occupancy counts: the table
    scan of `flush_below` costs a pass over the whole table)."""
    if ctl[C_RESIDENT] == 0:
        return False
    cur = ctl[C_CUR]
    if cur == EMPTY or ctl[C_ANCIENT] > 0:
        return True
    for q in range(cur - PANE_RING + 1, min(limit, cur + 1)):
        if ctl[C_RING + (q & (PANE_RING - 1))] > 0:
            return True
    return False


@ngjit
def flush_below(table, out, ctl, limit, n_out, cause):
    """Flush every entry whose pane is < limit, in slot order."""
    if not any_below(ctl, limit):
        return n_out
    ri, ru, rf, th = table
    oi, ou, of, oh, ocause = out
    for s in range(ri.shape[0]):
        if ctl[C_RESIDENT] == 0:
            break
        tp = ri[s, 0]
        if tp != EMPTY and tp < limit:
            n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, s, n_out, cause)
    return n_out


@ngjit_inline
def slow_flush_step(ri, ru, th, ou, oh, ocause, ctl, n_out):
    """Output the next old entry at the cursor (skipping others); end the walk at the end.
    (Arrays, not the table/out tuples: it runs per packet; see `emit_row`.)"""
    size = ri.shape[0]
    cur = ctl[C_CUR]
    c = ctl[C_CURSOR]
    while c < size:
        tp = ri[c, 0]
        c += 1
        if tp != EMPTY and tp < cur:
            n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, c - 1, n_out, CAUSE_SLOW)
            break
    if c >= size or ctl[C_RESIDENT] == 0:
        ctl[C_WALKING] = 0
    ctl[C_CURSOR] = c
    return n_out


@ngjit
def forced_full_flush(table, out, ctl, n_out):
    """iop: flush all old entries now (a new-window entry must be evicted, order first)."""
    if ctl[C_WALKING] != 0 or ctl[C_STALE] != 0:
        ctl[C_FORCED] += 1
        n_out = flush_below(table, out, ctl, ctl[C_CUR], n_out, CAUSE_FORCED)
        ctl[C_WALKING] = 0
        ctl[C_STALE] = 0
    return n_out


@ngjit
def bound_flush(table, out, ctl, params, n_out):
    """oop: flush every entry of a pane <= cur - 1 - m (swept once per new horizon)."""
    horizon = ctl[C_CUR] - 1 - params[P_M]
    if ctl[C_CUR] != EMPTY and horizon > ctl[C_BOUND]:
        n_out = flush_below(table, out, ctl, horizon + 1, n_out, CAUSE_BOUND)
        ctl[C_BOUND] = horizon
    return n_out


@ngjit_inline
def move_cur(ctl, pane):
    """Raise the current pane to `pane` (> cur), keeping the per-pane occupancy ring."""
    cur = ctl[C_CUR]
    if cur != EMPTY:
        # panes leaving the ring's range move to the ancient count
        for q in range(cur - PANE_RING + 1, min(pane - PANE_RING, cur) + 1):
            k = C_RING + (q & (PANE_RING - 1))
            ctl[C_ANCIENT] += ctl[k]
            ctl[k] = 0
    ctl[C_CUR] = pane
    ctl[C_WINDOWS] += 1


@ngjit
def new_window(table, out, ctl, params, pane, n_out):
    """Pane `pane` > cur begins: every resident entry becomes old; start the policy's flush."""
    policy = params[P_POLICY]
    cur = ctl[C_CUR]
    if policy == POLICY_IOP_SLOW:
        if cur != EMPTY and (ctl[C_WALKING] != 0 or ctl[C_STALE] != 0):
            n_out = flush_below(table, out, ctl, cur, n_out, CAUSE_AT_ONCE)
        ctl[C_STALE] = 0
    move_cur(ctl, pane)
    if policy != POLICY_OOP_LAZY and ctl[C_RESIDENT] > 0:
        ctl[C_WALKING] = 1
        ctl[C_CURSOR] = 0
        ctl[C_TICK] = 0
    if policy != POLICY_IOP_SLOW:
        n_out = bound_flush(table, out, ctl, params, n_out)
        # the paced sweep of this pane: only when something is already due at the next start
        due = any_below(ctl, ctl[C_CUR] - params[P_M] + 1)
        ctl[C_PACE] = 0 if due else table[0].shape[0]
    return n_out


PACE_STEP = 64      # slots the paced sweep advances at a time (one time check per step)


@ngjit_inline
def pace_threshold(ctl, size, pane_ns, offset, pace):
    """The packet time from which the paced sweep is PACE_STEP slots behind its target (the
    append loop compares each packet's time with it: no arithmetic per packet); the largest
    int64 when the sweep is done or off."""
    c = ctl[C_PACE]
    if c >= size:
        return np.iinfo(np.int64).max
    t = min(c + PACE_STEP, size)
    return ctl[C_CUR] * pane_ns - offset + np.int64((t - 1) / pace)


@ngjit_inline
def paced_sweep(ri, ru, th, ou, oh, ocause, ctl, m, target, n_out):
    """oop: advance the paced bound sweep to slot `target`, flushing entries of a pane
    <= cur - m (due at the next pane's start) on the way."""
    c = ctl[C_PACE]
    due = ctl[C_CUR] - m
    while c < target:
        tp = ri[c, 0]
        if tp != EMPTY and tp <= due:
            n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, c, n_out, CAUSE_BOUND)
        c += 1
    ctl[C_PACE] = c
    return n_out
