"""Window configurations (`TumblingWindow`, `SlidingWindow`) and the pane/window arithmetic.

The low level aggregates tumbling *panes* of g = gcd(range, slide); the high level combines
panes into windows (Paned-WID; docs/semantics.md, "Windows"). Pane p covers timestamps
[p*g - offset, (p+1)*g - offset); window w (counted in slides) covers panes
[(w+1)*k - n, (w+1)*k) with k = slide/g, n = range/g, and ends at (w+1)*slide - offset.
A window may close once the combined punctuation P satisfies end(w) <= P.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd
from typing import TypeVar

import numpy as np
from pyspark.sql import Column
from pyspark.sql import functions as F

from highlevel.errors import StageConfigError

#: one id (pane, window) or an array of them: the arithmetic is the same
Ids = TypeVar("Ids", int, np.ndarray)


@dataclass(frozen=True)
class TumblingWindow:
    """A tumbling window of `length_ns`; `offset_ns` shifts the grid (origin = -offset)."""

    length_ns: int
    offset_ns: int = 0

    def build(self) -> WindowLogic:
        if self.length_ns <= 0:
            raise StageConfigError(f"window `length` ({self.length_ns} ns) must be positive")
        return WindowLogic(self.length_ns, self.length_ns, self.offset_ns)


@dataclass(frozen=True)
class SlidingWindow:
    """[RANGE range_ns, SLIDE slide_ns]; panes of gcd(range, slide)."""

    range_ns: int
    slide_ns: int
    offset_ns: int = 0

    def build(self) -> WindowLogic:
        if self.range_ns <= 0 or self.slide_ns <= 0:
            raise StageConfigError(f"window `range` ({self.range_ns}) and `slide` "
                                   f"({self.slide_ns}) must be positive (ns)")
        if self.slide_ns > self.range_ns:
            raise StageConfigError(f"window `slide` ({self.slide_ns}) can't exceed `range` "
                                   f"({self.range_ns})")
        return WindowLogic(self.range_ns, self.slide_ns, self.offset_ns)


def window_config(plan) -> TumblingWindow | SlidingWindow:
    """The window configuration of a `queries.plan.WindowPlan`."""
    if plan.range_ns == plan.slide_ns:
        if plan.pane_ns != plan.range_ns:
            raise StageConfigError(f"tumbling window of {plan.range_ns} ns needs panes of the "
                                   f"same length (got pane {plan.pane_ns} ns)")
        return TumblingWindow(plan.range_ns, plan.offset_ns)
    if plan.pane_ns != gcd(plan.range_ns, plan.slide_ns):
        raise StageConfigError(f"sliding window panes must be gcd(range, slide) = "
                               f"{gcd(plan.range_ns, plan.slide_ns)} ns (got {plan.pane_ns})")
    return SlidingWindow(plan.range_ns, plan.slide_ns, plan.offset_ns)


def floor_div(x: Column, d: int) -> Column:
    # Spark's `div` truncates toward zero; windows before the epoch need a true floor
    return (x - F.pmod(x, F.lit(d))).cast("long") / F.lit(d)


class WindowLogic:
    """Pane and window arithmetic, in Python and as Spark column expressions."""

    def __init__(self, range_ns: int, slide_ns: int, offset_ns: int):
        self.range_ns, self.slide_ns, self.offset_ns = range_ns, slide_ns, offset_ns
        self.pane_ns = gcd(range_ns, slide_ns)
        self.k = slide_ns // self.pane_ns      # panes per slide
        self.n = range_ns // self.pane_ns      # panes per window

    @property
    def tumbling(self) -> bool:
        return self.k == 1 and self.n == 1

    # --- Python ------------------------------------------------------------------------------
    def pane_end(self, pane: Ids) -> Ids:
        return (pane + 1) * self.pane_ns - self.offset_ns

    def window_end(self, window: Ids) -> Ids:
        return (window + 1) * self.slide_ns - self.offset_ns

    def windows_of_pane(self, pane: int) -> range:
        return range(pane // self.k, (pane + self.n) // self.k)

    def last_window_of_pane(self, pane: int) -> int:
        return (pane + self.n) // self.k - 1

    # --- Spark -------------------------------------------------------------------------------
    def pane_end_col(self, pane: Column) -> Column:
        return (pane + 1) * F.lit(self.pane_ns) - F.lit(self.offset_ns)

    def window_end_col(self, window: Column) -> Column:
        return (window + 1) * F.lit(self.slide_ns) - F.lit(self.offset_ns)

    def first_window_col(self, pane: Column) -> Column:
        return floor_div(pane, self.k).cast("long")

    def last_window_col(self, pane: Column) -> Column:
        return (floor_div(pane + F.lit(self.n), self.k) - 1).cast("long")

    def windows_col(self, pane: Column) -> Column:
        """Array of the window ids pane `pane` belongs to."""
        return F.sequence(self.first_window_col(pane), self.last_window_col(pane))

    def retained_col(self, pane: Column, punctuation: int) -> Column:
        """True for a pane some still-open window needs after closing at `punctuation`."""
        return self.window_end_col(self.last_window_col(pane)) > F.lit(punctuation)
