"""Which partial rows are final: the only row of their (pane, group) this table will ever emit.

A group's entry that leaves the table while its pane is still open (an eviction, or the m
bound, before the input punctuation has passed the pane's end) may be followed by another
entry of the same group and pane; one that leaves after the punctuation passed the pane's end
cannot (later packets of the pane are late, and dropped). So a row is *final* when it left
after its pane closed and no entry of its (pane, group) left before while the pane was open.

The high level needs no combine for a final row of a single link's tumbling window: it is the
window's result for its group already (`highlevel.finalrows`). With a table that fits its
groups, nearly every row is final.

`Finality` tracks this with one array of `FILTER` pane stamps, indexed by a hash of (pane,
keys): a row that leaves an open pane raises its cell to its pane; a row that leaves a closed
pane is final when its cell is below its pane. Cells only grow, so a row's own earlier pieces
are always seen; another group's, or a later pane's, in the same cell make a row look partial
when it is final, which costs a combine, never a wrong result. With the few open-pane rows of
a table that fits, few cells are raised.
"""

from __future__ import annotations

import numpy as np

from common.jit import ngjit

#: cells of the stamp filter (8 bytes each: 2 MiB per table)
FILTER = 1 << 18
_EMPTY = np.iinfo(np.int64).min
_K1 = np.uint64(0xBF58476D1CE4E5B9)
_K2 = np.uint64(0x94D049BB133111EB)
_S31 = np.uint64(31)


@ngjit
def final_flags(window, keys, pane_ns, offset, split, before, after, stamps, final):
    """Fill `final[r]` for rows r in emission order: rows [0, split) left under input
    punctuation `before`, the others under `after` (module docstring). `keys` is
    [nkeys, n] (one row per key word)."""
    mask = stamps.shape[0] - 1
    for r in range(window.shape[0]):
        p = window[r]
        h = np.uint64(p) * _K1
        for k in range(keys.shape[0]):
            h = (h ^ keys[k, r]) * _K2
            h ^= h >> _S31
        cell = np.int64(h & np.uint64(mask))
        punct = before if r < split else after
        if (p + 1) * pane_ns - offset > punct:      # the pane was still open
            if stamps[cell] < p:
                stamps[cell] = p
            final[r] = False
        else:
            final[r] = stamps[cell] < p


class Finality:
    """The stamp filter of one table, and the input punctuation its rows left under."""

    def __init__(self, pane_ns: int, offset_ns: int):
        self.pane_ns, self.offset_ns = int(pane_ns), int(offset_ns)
        self.stamps = np.full(FILTER, _EMPTY, np.int64)
        self.punctuation = _EMPTY       # the input punctuation now (EMPTY: none yet)
        # the rows held when the punctuation last moved left under the one before it
        self._split = 0
        self._before = _EMPTY

    def punctuate(self, held: int, punctuation: int) -> None:
        """The input punctuation moves to `punctuation` with `held` rows not drained yet
        (the table drains every row at each punctuation, so those left under the current
        one)."""
        self._split, self._before = held, self.punctuation
        self.punctuation = max(self.punctuation, int(punctuation))

    def flags(self, window: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """The final flags of the rows drained now (in the order they left the table);
        `keys`: [nkeys, n]."""
        final = np.empty(len(window), np.bool_)
        final_flags(window, keys, self.pane_ns, self.offset_ns, self._split, self._before,
                    self.punctuation, self.stamps, final)
        self._split = 0
        return final
