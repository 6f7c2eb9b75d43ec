"""Q8-1 (`queries/library/q8_1.gsql`) as the thesis' experiments run it: its low-level plan
under a flush policy and a table size, with the thesis' DEFINE overrides."""

from __future__ import annotations

from pathlib import Path

#: i of each policy: iop_slow flushes one old group per packet (Gigascope), oop_slow one per 160
SLOW_FLUSH = {"iop_slow": 1, "oop_lazy": 160, "oop_slow": 160}
MAX_DISORDER = 2                 # m: windows an old group may linger (the oop policies)
Q8_1_FILE = Path(__file__).resolve().parents[2] / "queries" / "library" / "q8_1.gsql"


def q81_plan(slots: int, policy: str):
    """Q8-1's low-level plan from the library file with the thesis' DEFINE overrides."""
    from queries.planner import plan_text

    overrides = {"aggregate_slots": str(slots), "flush": policy,
                 "slow_flush": str(SLOW_FLUSH[policy]), "max_lfta_disorder": str(MAX_DISORDER)}
    fp = plan_text(Q8_1_FILE.read_text(), ["main"], overrides=overrides, path=str(Q8_1_FILE))
    return fp.queries[0].low[0]
