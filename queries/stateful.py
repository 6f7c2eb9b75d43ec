"""GS-lite's sampling framework in the language: its stateful functions and super-aggregates.

A sampling query (Tigon SQL manual 6.2.13) is an aggregation with GS-lite's `SUPERGROUP`,
`CLEANING_WHEN`, `CLEANING_BY` clauses, super-aggregates `agg$(...)` (aggregates of a
supergroup) or stateful functions (functions of a supergroup's sampling state). This module
names what oopscope runs of it: the stateful functions of GS-lite's `smart_sampling_state`
(the dynamic subset-sum and flow sampling of the manual's chapters 14-15; the kernels are
`highlevel.stateful`) with their arities and result types, and the super-aggregates.
"""

from __future__ import annotations

#: GS-lite's SFUN state these functions keep (one per supergroup and window)
STATE = "smart_sampling_state"

#: stateful function -> (arguments after the implicit state and group count, result type).
#: A sampling decision is a bool (GS-lite's functions return 1 or 0: `= TRUE` compares them)
STATEFUL_FUNCTIONS: dict[str, tuple[int, str]] = {
    "ssample": (2, "bool"),               # (len, sample size): admit the tuple
    "ssdo_clean": (0, "bool"),            # start a cleaning pass now
    "ssclean_with": (1, "bool"),          # (group size): keep the group in a cleaning pass
    "ssfinal_clean": (1, "bool"),         # (group size): keep the group at the window's end
    "ssthreshold": (0, "float"),          # the size threshold z
    "count_distinct": (0, "int"),         # the supergroup's live groups
    "packet_count": (0, "int"),
    "gamma": (0, "float"),
    "do_clean_count": (0, "int"),
    "delay": (0, "int"),
    "newly_closed": (0, "int"),
    "flow_ssample": (1, "bool"),          # (sample size)
    "flow_ssdo_clean": (1, "bool"),       # (max$(time))
    "flow_ssclean_with": (4, "bool"),     # (closed flag, delay, max(time), group size)
    "flow_ssfinal_clean": (4, "bool"),    # (closed flag, delay, max(time), group size)
    "nssample": (2, "bool"),              # (len, threshold): static subset-sum
}

#: the functions that only read the state: what SELECT may call (evaluated once per
#: supergroup on its final state)
ACCESSORS = frozenset({"ssthreshold", "count_distinct", "packet_count", "gamma",
                       "do_clean_count", "delay", "newly_closed"})

#: super-aggregates (`name$(...)`): COUNT_DISTINCT$ is the supergroup's live groups, the others
#: aggregate the rows that passed WHERE (GS-lite removes a cleaned group's COUNT, SUM and
#: XOR_AGGR contribution; MIN and MAX keep it)
SUPER_AGGREGATES = ("COUNT", "SUM", "MIN", "MAX", "XOR_AGGR", "COUNT_DISTINCT")

#: the aggregates a sampling query's groups keep
GROUP_AGGREGATES = ("COUNT", "SUM", "MIN", "MAX", "AVG", "AND_AGGR", "OR_AGGR", "XOR_AGGR")


def stateful_type(name: str, args: list[str]) -> str | None:
    """The result type of a stateful call, None when the arguments do not fit."""
    entry = STATEFUL_FUNCTIONS.get(name)
    numeric = {"uint", "ushort", "int", "ullong", "llong", "float", "bool", "ipv4"}
    if entry is None or len(args) != entry[0] or any(a not in numeric for a in args):
        return None
    return entry[1]
