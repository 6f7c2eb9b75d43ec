"""What a low-level plan's operator will allocate, estimated from the plan alone (nothing is
allocated): the appliance refuses a query whose tables would not fit its memory budget
before it builds them (`tools.serve.budget`).

An aggregating operator allocates, at once, its hash table of `slots` records and an output
buffer of as many records plus `DRAIN_ROWS` (`lowlevel.engine.HashAggregator`). A record is
`[pane | keys | i bank | u bank | f bank]` uint64 words plus the COUNT_DISTINCT registers
(one byte each), and the output buffer adds one cause byte per row. A flow table has two
more key words (`lowlevel.flowtable`). With `late 'correct'` a second table of the same size
holds the late packets' groups. A selection (no window) holds only the batch it is given.
Per-batch scratch arrays, the Arrow conversion of drained rows and Spark's memory are not
counted: they do not grow with the settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.engine import DRAIN_ROWS
from lowlevel.hashtable import round_slots
from lowlevel.partials import key_width
from queries.plan import LowLevelPlan

WORD = 8


@dataclass(frozen=True)
class Footprint:
    """One operator's estimated allocation: `slots` records of `record_bytes` in each of
    `tables` tables, each with its output buffer."""

    query: str
    link: str
    slots: int
    record_bytes: int
    tables: int

    @property
    def bytes(self) -> int:
        if not self.tables:
            return 0
        table = self.slots * self.record_bytes
        out = (self.slots + 2 + DRAIN_ROWS) * (self.record_bytes + 1)
        return self.tables * (table + out)


def footprint(plan: LowLevelPlan) -> Footprint:
    """The allocation of the operator that runs `plan` (module docstring)."""
    if plan.window is None or plan.source_kind != "link":
        return Footprint(plan.query, plan.link, 0, 0, 0)
    nkeys = sum(key_width(k.type) for k in plan.keys) + (1 if plan.flow is not None else 0)
    specs = [AggSpec(s.name, s.kind, s.dtype, plan.distinct_registers, s.udaf)
             for s in plan.subaggs]
    try:
        layout = StateLayout(specs)
        words = 1 + nkeys + layout.width["i"] + layout.width["u"] + layout.width["f"]
        registers = layout.width["h"]
    except ValueError:          # the operator refuses it anyway: count two words each
        words, registers = 1 + nkeys + 2 * len(specs), 0
    tables = 2 if plan.late == "correct" and plan.flow is None else 1
    return Footprint(plan.query, plan.link, round_slots(plan.slots), WORD * words + registers,
                     tables)
