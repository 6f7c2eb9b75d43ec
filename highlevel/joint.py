"""A reader of an inner OA-Join grouping by both sides' times: groups closed on the join's
individual punctuation on each time and on its joint punctuation (docs/semantics.md, "Joins:
OA-Join and joint punctuation"; thesis 7.2).

`GROUP BY time/10 AS lb, ytime/10 AS rb` over a band join of x and y: a group holds results
with x.time in lb's window (ending at e_1) and y.time in rb's window (ending at e_2). The join
promises, after each of its micro-batches (`JoinStage.sink_punctuation` for a joint sink):
- individual punctuation (i_1, i_2): no later result has x.time < i_1, nor y.time < i_2;
- joint punctuation (j_1, j_2): no later result has x.time < j_1 *and* y.time < j_2.
So the group is complete once e_1 <= i_1, or e_2 <= i_2, or e_1 <= j_1 and e_2 <= j_2
(`highlevel.join.group_closed`): a box closes it as soon as both times pass, where the first
time's slab alone would wait for the band's width. The spool files carry the four values
(PUNCT and `JOINT_MARKERS`); this stage applies them in file order like Meld, closes the groups
that the new values cover and the old did not, counts a row of a group the old values covered
as late (dropped, or a correction row under late 'correct'), and keeps the rest open.

The first temporal item is the stage's window (its punctuation, i_1, is what the stage gives
its own readers: every later output row has e_1 > i_1); the second is a key whose value v
places the group on the other time: e_2 = end of pane floor((v - shift) / scale).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from common.spool import JOINT_MARKERS
from highlevel.aggregate import AggregateStage
from highlevel.batchfiles import SpoolFileMarker
from highlevel.errors import StageConfigError
from highlevel.state import StageState
from highlevel.windows import TumblingWindow, floor_div

#: state.extra key: [i_1, i_2, j_1, j_2] (ns, None until known) the groups are closed through
BOUNDS = "joint_bounds"


def _later(old, new):
    """The larger of two bounds, None being 'no bound yet'."""
    if new is None:
        return old
    return new if old is None else max(old, new)


class JointStage(AggregateStage):
    """An aggregation over an inner join's rows with two temporal group items."""

    marker_columns = JOINT_MARKERS

    def __init__(self, spec, spool, checkpoint, sinks, **options):
        if spec.window2 is None or len(spec.links) != 1:
            raise StageConfigError(f"query {spec.query!r}: a joint-punctuation stage reads one "
                                   f"join and has a second temporal key")
        super().__init__(spec, spool, checkpoint, sinks, **options)
        if not self.window.tumbling:
            raise StageConfigError(f"query {spec.query!r}: two temporal group items make "
                                   f"tumbling windows only")
        w2 = spec.window2
        self.late_reads = (w2.column,)
        self.second = TumblingWindow(w2.pane_ns, w2.offset_ns).build()
        value = F.col(w2.column)
        pane = value - F.lit(w2.shift) if w2.shift else value
        if w2.scale != 1:
            pane = floor_div(pane, w2.scale)
        self._end1 = self.window.pane_end_col(F.col("window"))
        self._end2 = self.second.pane_end_col(pane.cast("long"))
        self._next: list | None = None

    # --- the bounds ---------------------------------------------------------------------------
    def bounds(self, state: StageState | None = None) -> list:
        """[i_1, i_2, j_1, j_2] of `state` (the committed one by default)."""
        b = (state or self.state).extra.get(BOUNDS)
        return list(b) if b is not None else [None] * 4

    def _file_marker(self, f: SpoolFileMarker):
        values = [f.punctuation, *f.joint]
        if all(v is None for v in values):
            return None
        return [None if v is None else int(v) for v in values]

    def _meld(self, state: StageState, files: list[SpoolFileMarker]) -> int | None:
        """Apply each file's four values in sequence order (`Stage._in_order`); returns
        i_1, the stage's own punctuation."""
        bounds = self.bounds(state)
        for _, (i1, i2, j1, j2) in self._in_order(state, files):
            bounds[0], bounds[1] = _later(bounds[0], i1), _later(bounds[1], i2)
            if j1 is not None and j2 is not None:
                # joint punctuation is monotone on both times: the latest box holds every
                # earlier one
                bounds[2], bounds[3] = _later(bounds[2], j1), _later(bounds[3], j2)
        state.extra[BOUNDS] = bounds
        self._next = bounds
        return bounds[0]

    def advanced(self, prev: StageState, state: StageState, punctuation) -> bool:
        return self.bounds(state) != self.bounds(prev)

    # --- which groups are closed ---------------------------------------------------------------
    def closed_col(self, bounds) -> Column:
        """True for a group (window, second key) that `bounds` covers."""
        i1, i2, j1, j2 = bounds
        cond = F.lit(False)
        if i1 is not None:
            cond = cond | (self._end1 <= F.lit(i1))
        if i2 is not None:
            cond = cond | F.coalesce(self._end2 <= F.lit(i2), F.lit(False))
        if j1 is not None and j2 is not None:
            cond = cond | ((self._end1 <= F.lit(j1))
                           & F.coalesce(self._end2 <= F.lit(j2), F.lit(False)))
        return cond

    def late_columns(self, is_row: Column, before) -> tuple[Column, Column]:
        late = is_row & self.closed_col(self.bounds())
        return late, is_row & ~late

    def closing(self, before, upto) -> Column:
        return self.closed_col(self._next) & ~self.closed_col(self.bounds())

    def retained(self, punctuation) -> Column:
        return ~self.closed_col(self._next)
