"""Tables that fit their groups: the adaptive slot count of a query's hash table, and the
kernel that moves a table's open groups into a table of another size.

A fixed table of 65,536 slots meeting 200K groups per window evicts on most packets: the
high level then combines many partial rows per result row. So an adaptive table is sized
like Gigascope's, from the groups it meets, and is fixed within a window: it is re-chosen
only when the input punctuation closes a window (`HashAggregator.punctuate`). The rule
(`TableSizer`):

- the groups of the windows just closed are estimated as the entries the table created
  meanwhile (every entry is either resident or has left exactly once as a partial row),
  per window closed, leaving out the entries still held of the panes still open (their
  window is counted when it closes: the punctuation that closes a window comes after
  packets of the next one, a timer's period of them or more). Without evictions that is
  exactly the distinct groups; with them an upper bound (an evicted group met again is
  created again);
- the wanted size is the power of two that holds them at a load factor of at most 1/2
  (`slots_for`), at least `MIN_SLOTS`, at most the query's cap (DEFINE
  max_aggregate_slots) and what the memory budget allows;
- it grows at once, at most `GROW_STEP` times per window (the estimate of an overloaded
  table is inflated: a step lets the next window's, exact, estimate finish the growth);
  it shrinks only when the last `HISTORY` windows all wanted a quarter of it or less, so
  a table does not flap between two sizes.

A resize keeps every result: the entries of closed windows leave first as partial rows (no
packet can reach them any more, so each would have left as this one row anyway; under
`iop_slow` every entry older than the current window leaves, older panes first, keeping
the output in window order), then each remaining entry moves to its home in the new
table, state intact; one that finds no free slot there leaves as a partial row (an
eviction, as a collision would have caused).

A query that runs again (a resumed `run`, a restarted appliance) starts at the size its table
had (`first_slots`), not from its declared count: its first window then does not evict.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

from common.jit import ngjit
from lowlevel.flush import C_RESIDENT, CAUSE_EVICT, EMPTY, emit_row
from lowlevel.hashtable import home_slot, min_resident, round_slots

#: the load factor an adaptive table is sized for (few evictions below it at ADAPTIVE_PROBES)
TARGET_LOAD = 0.5
#: the slots an adaptive table's packet probes before evicting: at a load factor up to 1/2 a
#: third probe removes most of the evictions of two (docs/performance.md "Table sizing":
#: partial rows per result row 1.8 -> 1.1 at 10K groups) at no measurable cost, a fourth
#: costs throughput. A fixed table (DEFINE aggregate_slots) keeps the operator's default
#: (2): the IOP-vs-OOP experiments model that table
ADAPTIVE_PROBES = 3
#: the smallest adaptive table (a few-group query still has room for a burst)
MIN_SLOTS = 1 << 10
#: the largest growth in one window
GROW_STEP = 4
#: windows whose estimates must all allow a shrink
HISTORY = 4


def slots_for(groups: int) -> int:
    """The power of two holding `groups` at a load factor of at most TARGET_LOAD."""
    return round_slots(math.ceil(max(1, groups) / TARGET_LOAD))


def first_slots(slots: int, max_slots: int, remembered: int | None,
                allow: Callable[[int], bool] | None = None) -> int:
    """The first slot count of an adaptive table planned at `slots` (from DEFINE
    expected_groups or the default) whose query last ran with `remembered` slots (None: it
    did not): the remembered size, at most `max_slots` and, growing, what `allow` grants
    (halved until it does). A fixed table (DEFINE aggregate_slots) is never given one."""
    if not remembered or remembered <= 0:
        return slots
    want = min(round_slots(remembered), round_slots(max(slots, max_slots)))
    while want > slots and allow is not None and not allow(want):
        want //= 2
    if want < slots and allow is not None:
        allow(want)                 # the budget counts the smaller table
    return want


class TableSizer:
    """Chooses an adaptive table's slot count between windows (module docstring).

    `allow(slots) -> bool`, when given, says whether a table of that many slots fits the
    memory budget (the appliance's, `tools.serve.budget`), which counts it from then on; a
    growth it refuses is halved until it fits or is no growth at all.
    """

    def __init__(self, slots: int, max_slots: int, *, min_slots: int = MIN_SLOTS,
                 allow: Callable[[int], bool] | None = None):
        self.max_slots = round_slots(max(slots, max_slots))
        self.min_slots = min(round_slots(min_slots), round_slots(slots))
        self.allow = allow
        self._recent: deque[int] = deque(maxlen=HISTORY)
        self._pane: int | None = None
        self._created = 0
        #: the last estimate of the groups per window (0 before the first window closed)
        self.groups = 0

    @property
    def started(self) -> bool:
        return self._pane is not None

    def start(self, pane: int) -> None:
        """Count the groups from pane `pane` on (the first pane met: the entries created so
        far are all of it or later)."""
        self._pane, self._created = pane, 0

    def choose(self, slots: int, open_pane: int, created: int) -> int:
        """The slot count for the windows from `open_pane` on (the first pane still open),
        given the entries created so far; `slots` when nothing should change."""
        if self._pane is None:
            self.start(open_pane)
        closed = open_pane - (self._pane if self._pane is not None else open_pane)
        if closed <= 0:
            return slots
        self.groups = (created - self._created) // closed
        self._pane, self._created = open_pane, created
        self._recent.append(self.groups)
        want = min(self.max_slots, max(self.min_slots, slots_for(self.groups)))
        if want > slots:
            want = min(want, slots * GROW_STEP)
            while want > slots and self.allow is not None and not self.allow(want):
                want //= 2
            return max(want, slots)
        settled = min(self.max_slots, max(self.min_slots, slots_for(max(self._recent))))
        if len(self._recent) == HISTORY and settled * 4 <= slots:
            if self.allow is not None:
                self.allow(settled)         # the budget counts the smaller table
            return settled
        return slots


@ngjit
def resident_from(table, pane):
    """Entries held of panes >= `pane` (those of the windows still open)."""
    ri = table[0]
    n = 0
    for s in range(ri.shape[0]):
        tp = ri[s, 0]
        if tp != EMPTY and tp >= pane:
            n += 1
    return n


@ngjit
def flush_closed(table, out, ctl, limit, n_out, cause):
    """Flush every entry of a pane < limit, older panes first; returns the new fill."""
    ri, ru, rf, th = table
    oi, ou, of, oh, ocause = out
    while ctl[C_RESIDENT] > 0:
        low = min_resident(table, ctl)
        if low >= limit:
            break
        for s in range(ri.shape[0]):
            if ri[s, 0] == low:
                n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, s, n_out, cause)
    return n_out


@ngjit
def rehash(table, new, out, ctl, nkeys, probes, mask, shift, n_out):
    """Move every entry of `table` to its home in `new` (empty, `mask + 1` slots); an entry
    whose `probes` slots there are taken leaves as a partial row. Returns the new fill."""
    ri, ru, rf, th = table
    ni, nu, nf, nh = new
    oi, ou, of, oh, ocause = out
    width = ru.shape[1]
    keys = ru[:, 1:1 + nkeys]
    for s in range(ri.shape[0]):
        pane = ri[s, 0]
        if pane == EMPTY:
            continue
        home = home_slot(pane, keys, s, shift)
        free = -1
        for j in range(probes):
            t = (home + j) & mask
            if ni[t, 0] == EMPTY:
                free = t
                break
        if free < 0:
            n_out = emit_row(ri, ru, th, ou, oh, ocause, ctl, s, n_out, CAUSE_EVICT)
            continue
        for k in range(width):
            nu[free, k] = ru[s, k]
        for k in range(th.shape[1]):
            nh[free, k] = th[s, k]
        ri[s, 0] = EMPTY      # moved: the occupancy counts stay as they are
    return n_out


def empty_table(slots: int, width: int, registers: int) -> tuple:
    """A table of `slots` free records (`flush.py` describes the layout)."""
    rec = np.zeros((slots, width), np.uint64)
    rec[:, 0] = np.uint64(1 << 63)  # EMPTY as uint64 bits
    return (rec.view(np.int64), rec, rec.view(np.float64),
            np.zeros((slots, registers), np.uint8))
