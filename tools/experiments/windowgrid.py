"""Window aggregation over disordered streams, the IOP way and the OOP way (thesis 6.1.3).

Models used by `tools/bench_disorder.py` and the window tests, over plain numpy arrays in
arrival order (`ts` int64 ns, one value per tuple):

- `WindowGrid`: the window arithmetic of docs/semantics.md "Windows" (`wids`, extent, end), written
  independently of `queries.plan.WindowPlan` so each can check the other.
- `slack_windows`: the buffering baseline. A sort buffer with a slack (in time) releases tuples
  once they are `slack` older than the largest time seen; the window aggregate downstream sees
  an ordered stream and closes window w when the released frontier passes its end, i.e. when a
  tuple with time >= end(w) + slack arrives. A tuple behind the frontier is late:
  *consistent* slack drops it from every window it belongs to, *generous* slack only from the
  windows already closed (thesis L996).
- `source_punctuation`: the punctuation a source that knows its disorder would insert (the
  thesis pre-processed its data the same way): after arrival j, "every later tuple has time >=
  min(ts[j+1:])", emitted only where that bound advanced by `every_ns`.
- `WidOperator`: WID (thesis L813), an order-agnostic window aggregate: each tuple is folded into
  the partial states of all its windows at once, a window is output when punctuation passes its
  end; a tuple whose windows are already closed is counted late and dropped.
- `assemble_panes`: the window-level half of Paned-WID over the pane rows of the low level,
  each window computed from the rows that had arrived when punctuation closed it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MODES = ("consistent", "generous")


@dataclass(frozen=True)
class WindowGrid:
    """[RANGE range_ns, SLIDE slide_ns] on a fixed origin (-offset_ns): with x = t + offset,
    wids(x) = [floor(x/s), floor((x+r)/s)), extent(w) = [(w+1)s - r, (w+1)s) in x."""

    range_ns: int
    slide_ns: int
    offset_ns: int = 0

    def first_and_count(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = np.asarray(ts, np.int64) + np.int64(self.offset_ns)
        first = np.floor_divide(x, self.slide_ns)
        return first, np.floor_divide(x + self.range_ns, self.slide_ns) - first

    def expand(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tuple index, window id) for every membership of every tuple."""
        first, count = self.first_and_count(ts)
        rows = np.repeat(np.arange(len(first)), count)
        starts = np.cumsum(count) - count
        wid = np.repeat(first, count) + (np.arange(len(rows)) - np.repeat(starts, count))
        return rows, wid

    def end(self, w):
        return (np.asarray(w, np.int64) + 1) * self.slide_ns - self.offset_ns

    def start(self, w):
        return self.end(w) - self.range_ns


@dataclass
class WindowResult:
    """Per window (sorted ids): tuple count and value sum as the method output them, and the
    arrival index after which each was emitted (n: only at end of input)."""

    wid: np.ndarray
    count: np.ndarray
    total: np.ndarray
    emitted_after: np.ndarray
    dropped: int = 0            # tuples (consistent) or (tuple, window) memberships dropped

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.total / self.count


def exact_windows(ts: np.ndarray, values: np.ndarray, grid: WindowGrid) -> WindowResult:
    """Every non-empty window's count and sum over the whole input (arrival order ignored)."""
    rows, wid = grid.expand(ts)
    ids, inv = np.unique(wid, return_inverse=True)
    count = np.bincount(inv, minlength=len(ids)).astype(np.int64)
    total = np.bincount(inv, weights=np.asarray(values, np.float64)[rows], minlength=len(ids))
    return WindowResult(ids, count, total, np.full(len(ids), len(ts), np.int64))


def _on_windows(ids: np.ndarray, wid: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    pos = np.searchsorted(ids, wid)
    return np.bincount(pos, weights=weights, minlength=len(ids))


def slack_windows(ts: np.ndarray, values: np.ndarray, grid: WindowGrid, slack_ns: int,
                  mode: str, windows: np.ndarray | None = None) -> WindowResult:
    """The buffering implementation with a time slack over tuples in arrival order.

    `windows`: the window ids to report (default: every window some tuple belongs to); a
    window that lost all its tuples reports count 0."""
    if mode not in MODES:
        raise ValueError(f"slack mode {mode!r} is not one of {', '.join(MODES)}")
    ts = np.asarray(ts, np.int64)
    values = np.asarray(values, np.float64)
    n = len(ts)
    seen = np.maximum.accumulate(ts) if n else ts
    rows, wid = grid.expand(ts)
    ids = np.unique(wid) if windows is None else np.asarray(windows, np.int64)
    # window w closes on the first arrival that lifts the frontier (seen - slack) to end(w)
    emitted = np.searchsorted(seen, grid.end(ids) + np.int64(slack_ns), side="left")
    if mode == "consistent":
        late = ts < seen - np.int64(slack_ns)
        keep = ~late[rows]
        dropped = int(np.count_nonzero(late))
    else:
        # a membership counts if the tuple arrived before its window was closed
        pos = np.searchsorted(ids, wid)
        known = (pos < len(ids)) & (ids[np.minimum(pos, len(ids) - 1)] == wid)
        keep = np.zeros(len(rows), bool)
        keep[known] = rows[known] < emitted[pos[known]]
        dropped = int(np.count_nonzero(known & ~keep))
    known = np.isin(wid, ids)
    sel = keep & known
    count = _on_windows(ids, wid[sel], None).astype(np.int64)
    total = _on_windows(ids, wid[sel], values[rows[sel]])
    return WindowResult(ids, count, total, emitted.astype(np.int64), dropped)


def source_punctuation(ts: np.ndarray, every_ns: int) -> list[tuple[int, int]]:
    """Grammatical punctuation `(after_arrival, p)`: p = min of every later time, emitted right
    after the arrival where it first exceeds the previous punctuation by `every_ns` or more."""
    ts = np.asarray(ts, np.int64)
    n = len(ts)
    if n < 2:
        return []
    later_min = np.minimum.accumulate(ts[::-1])[::-1][1:]      # later_min[j] = min(ts[j+1:])
    out: list[tuple[int, int]] = []
    last = None
    step = max(1, int(every_ns))
    j = 0
    while j < n - 1:
        target = later_min[j] if last is None else last + step
        # later_min is non-decreasing: jump straight to where it reaches the target
        j = int(np.searchsorted(later_min, target, side="left"))
        if j >= n - 1:
            break
        p = int(later_min[j])
        out.append((j, p))
        last = p
        j += 1
    return out


def assemble_panes(pane: np.ndarray, row_event: np.ndarray, states: dict[str, np.ndarray],
                   punctuation: list[tuple[int, int]], pane_ns: int, grid: WindowGrid,
                   windows: np.ndarray, end_event: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Paned-WID's window level over pane rows: window w is closed by the first punctuation
    (event, P) with P >= end(w) (else at `end_event`) and sums the additive `states` of the
    rows of its panes that had arrived by that event. Returns (sums per window, closing event).
    """
    ends = grid.end(windows)
    pe = np.array([e for e, _ in punctuation] + [end_event], np.int64)
    pv = np.array([p for _, p in punctuation] + [np.iinfo(np.int64).max], np.int64)
    pv = np.maximum.accumulate(pv)
    closing = pe[np.searchsorted(pv, ends, side="left")]
    # pane p lies in windows [floor(p*g/s), floor((p*g + r)/s)) when g divides r and s
    pane_start = np.asarray(pane, np.int64) * pane_ns - grid.offset_ns
    rows, wid = grid.expand(pane_start)
    pos = np.searchsorted(windows, wid)
    ok = (pos < len(windows)) & (windows[np.minimum(pos, len(windows) - 1)] == wid)
    ok[ok] &= row_event[rows[ok]] <= closing[pos[ok]]
    sums = {name: np.bincount(pos[ok], weights=np.asarray(v, np.float64)[rows[ok]],
                              minlength=len(windows)) for name, v in states.items()}
    return sums, closing


@dataclass
class WidOperator:
    """WID: per (window, group) partial states of COUNT, SUM, MIN, MAX, folded per tuple into
    every window of wids(t); window w is output once punctuation P >= end(w)."""

    grid: WindowGrid
    state: dict = field(default_factory=dict)
    punctuation: int | None = None
    late: int = 0

    def process(self, ts: np.ndarray, groups: np.ndarray, values: np.ndarray) -> None:
        ts = np.asarray(ts, np.int64)
        if self.punctuation is not None:
            ok = ts >= self.punctuation
            self.late += int(np.count_nonzero(~ok))
            ts, groups, values = ts[ok], np.asarray(groups)[ok], np.asarray(values)[ok]
        rows, wid = self.grid.expand(ts)
        g = np.asarray(groups)[rows]
        v = np.asarray(values)[rows]
        for w, k, x in zip(wid.tolist(), g.tolist(), v.tolist()):
            s = self.state.get((w, k))
            if s is None:
                self.state[(w, k)] = [1, x, x, x]
            else:
                s[0] += 1
                s[1] += x
                s[2] = min(s[2], x)
                s[3] = max(s[3], x)

    def punctuate(self, p: int) -> list[tuple]:
        """Rows (window, group, count, sum, min, max) of the windows closed by p."""
        if self.punctuation is not None and p <= self.punctuation:
            return []
        self.punctuation = p
        return self._emit(lambda w: int(self.grid.end(w)) <= p)

    def finish(self) -> list[tuple]:
        return self._emit(lambda w: True)

    def _emit(self, closed) -> list[tuple]:
        done = sorted(k for k in self.state if closed(k[0]))
        return [(w, k, *self.state.pop((w, k))) for w, k in done]
