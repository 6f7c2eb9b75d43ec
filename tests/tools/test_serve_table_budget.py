"""The appliance's memory budget bounds adaptive tables: a table grows only while the budget
holds it (`tools.serve.budget.MemoryBudget.grant`), and what it was granted is free again when
its query ends."""

from __future__ import annotations

from lowlevel.footprint import footprint
from lowlevel.sizing import TableSizer
from queries.planner import plan_text
from tools.serve.budget import MemoryBudget

QUERY = ("DEFINE { query_name pairs; } SELECT tb, srcIP, destIP, count(*) AS n, sum(len) AS b "
         "FROM main.IPV4 GROUP BY time/10 AS tb, srcIP, destIP")


def test_a_table_grows_only_within_the_budget():
    lp = plan_text(QUERY, ["main"]).queries[0].low[0]
    assert lp.max_slots > lp.slots                     # adaptive by default
    fp = footprint(lp)
    budget = MemoryBudget(3 * fp.bytes)       # the grants only: no running query here
    allow = budget.grant("pairs", fp, lambda: [])
    assert allow(2 * lp.slots)                          # about twice the bytes: fits
    assert budget.grown() > 0
    assert not allow(16 * lp.slots)                     # about 16 times: over the budget
    # the sizer halves a refused growth until it fits
    sizer = TableSizer(lp.slots, lp.max_slots, allow=allow)
    sizer.start(0)
    got = sizer.choose(lp.slots, 1, 10 * lp.slots)     # 10x the slots in groups: wants 16x
    assert lp.slots < got < 16 * lp.slots and allow(got)
    other = budget.grant("other", fp, lambda: [])
    assert not other(4 * lp.slots)                      # the first table holds the budget
    budget.release("pairs")
    assert budget.grown() == 0 and other(4 * lp.slots)
