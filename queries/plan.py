"""Query plans as plain data: what the low level runs per link and what the high level runs.

The planner (`queries.planner`) builds these; `lowlevel/` and `highlevel/` consume them.
Nothing here is code to exec: expressions are `queries.expressions` trees, evaluated over
packet batches by `queries.vectorized.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FLUSH_POLICIES = ("oop_lazy", "oop_slow", "iop_slow")
SUBAGG_KINDS = ("count", "sum", "min", "max", "and", "or", "xor", "first", "last", "distinct")

Expr = Any  # a queries.expressions node


@dataclass(frozen=True)
class WindowPlan:
    """How packets are bucketed in time.

    The low level groups by pane id `(timestamp_ns + offset_ns) // pane_ns` (tumbling panes);
    a tumbling window is one pane. A sliding window [RANGE r, SLIDE s] has panes of
    g = gcd(r, s); window w (counted in slides) covers panes [(w+1)*s/g - r/g, (w+1)*s/g).
    The temporal output column (e.g. `tb` of `GROUP BY time/60 AS tb`) has value
    `window_id * scale + shift`.
    """

    pane_ns: int
    range_ns: int
    slide_ns: int
    offset_ns: int = 0
    column: str | None = None
    scale: int = 1
    shift: int = 0

    @property
    def sliding(self) -> bool:
        return self.range_ns != self.slide_ns

    def pane_end_ns(self, pane: int) -> int:
        """First timestamp (ns) after pane `pane`: the pane may close when punctuation >= this."""
        return (pane + 1) * self.pane_ns - self.offset_ns

    def window_end_ns(self, window: int) -> int:
        return (window + 1) * self.slide_ns - self.offset_ns


@dataclass(frozen=True)
class KeyColumn:
    """A group key (or projected column): output name, expression, schema type.

    `type` decides the physical layout: `ip` is two uint64 columns (hi, lo); every other
    type is one column.
    """

    name: str
    expr: Expr
    type: str


@dataclass(frozen=True)
class SubAggregate:
    """A low-level partial aggregate; its state columns are named `name` (and `name`_t for
    first/last, the time of the value)."""

    name: str
    kind: str            # one of SUBAGG_KINDS
    arg: Expr | None     # None for count(*)
    dtype: str           # numpy dtype name of the state: int64 | uint64 | float64


@dataclass(frozen=True)
class LowLevelPlan:
    """What one link's low-level operator runs for one query."""

    query: str
    link: str
    protocol: str                       # rows must belong to this protocol (schema mask)
    predicate: Expr | None              # WHERE, evaluated per packet
    window: WindowPlan | None           # None: a non-aggregating (selection) query
    keys: tuple[KeyColumn, ...]         # group keys other than the window
    subaggs: tuple[SubAggregate, ...]
    projections: tuple[KeyColumn, ...] = ()   # selection queries: columns passed through
    slots: int = 1 << 16                # hash-table size, a power of two
    flush: str = "oop_lazy"             # FLUSH_POLICIES
    slow_flush: int = 160               # i: one old group every i packets (oop_slow, iop_slow)
    max_disorder: int = 2               # m: windows an old group may linger (oop_*)
    distinct_registers: int = 64        # HLL registers per group for COUNT_DISTINCT
    extras: dict = field(default_factory=dict, hash=False, compare=False)
