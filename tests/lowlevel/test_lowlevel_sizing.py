"""Adaptive tables (`lowlevel.sizing`): a table re-sized between windows gives the same combined
rows as fixed tables of every size, under every flush policy, disorder and late data; and its
size follows the groups it meets (grows for many, shrinks back for few)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.engine import HashAggregator
from lowlevel.hll import hash64
from lowlevel.sizing import MIN_SLOTS, TableSizer, slots_for
from lowlevel.testing import (
    ORDERS,
    Stream,
    arrival_order,
    combined,
    grammatical_punctuation,
    reference_groups,
    run_stream,
)
from queries.planner import DEFAULT_MAX_SLOTS, DEFAULT_SLOTS, plan_text

AGGS = StateLayout([
    AggSpec("cnt", "count"), AggSpec("s_i", "sum", "int64"), AggSpec("mx_f", "max", "float64"),
    AggSpec("fi_i", "first", "int64"), AggSpec("la_u", "last", "uint64"),
    AggSpec("d", "distinct", registers=16),
])
POLICIES = ("oop_lazy", "oop_slow", "iop_slow")


class RandomSizer(TableSizer):
    """Re-sizes at every closed window to a random size from 2 to 256 slots: every resize
    path (grow, shrink, evictions while moving) on small streams."""

    def __init__(self, seed: int):
        super().__init__(2, 256, min_slots=2)
        self.rng = np.random.default_rng(seed)
        self.sizes: list[int] = []

    def choose(self, slots: int, open_pane: int, created: int) -> int:
        if self._pane is not None and open_pane <= self._pane:
            return slots
        self._pane = open_pane
        slots = 1 << int(self.rng.integers(1, 9))
        self.sizes.append(slots)
        return slots


def make_stream(seed: int, n: int, ngroups: int, nkeys: int, span: int, order: str,
                punct_every: int, late: bool) -> tuple[Stream, np.ndarray]:
    """A random stream and which packets are on time (late: punctuation later packets
    violate, so those are dropped)."""
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, span, n)).astype(np.int64)
    ts = ts[arrival_order(ts, order, rng, band=int(rng.integers(1, span // 4 + 2)),
                          block=int(rng.integers(2, 12)))]
    groups = rng.integers(0, 1 << 63, (ngroups, nkeys), dtype=np.uint64)
    keys = groups[rng.integers(0, ngroups, n)]
    ai, au, af, ad = AGGS.empty_args(n)
    ai[:] = rng.integers(-1000, 1000, ai.shape)
    au[:] = rng.integers(0, 1 << 63, au.shape, dtype=np.uint64)
    af[:] = rng.integers(-50, 50, af.shape)
    ad[:] = hash64(rng.integers(0, 40, ad.shape))
    stream = Stream(ts, keys, (ai, au, af, ad), rng.random(n) < 0.9,
                    grammatical_punctuation(ts, rng, punct_every))
    if late and n > 8:
        cuts = np.sort(rng.choice(n - 1, min(8, n - 1), replace=False))
        stream.puncts = [(int(j), int(ts[j]) + int(rng.integers(-5, 15))) for j in cuts]
    seen = np.full(n, np.iinfo(np.int64).min)
    last = np.iinfo(np.int64).min
    for j, p in stream.puncts:
        if p > last:
            last = p
            seen[j + 1:] = last
    return stream, ts >= seen


params = st.fixed_dictionaries({
    "seed": st.integers(0, 2**32 - 1),
    "n": st.integers(0, 500),
    "ngroups": st.integers(1, 60),
    "nkeys": st.integers(1, 3),
    "panes": st.integers(1, 12),
    "order": st.sampled_from(ORDERS),
    "punct_every": st.integers(1, 30),
    "late": st.booleans(),
    "policy": st.sampled_from(POLICIES),
    "m": st.integers(0, 3),
    "probes": st.integers(1, 3),
    "hold_rows": st.sampled_from([0, 0, 25]),
    "punctuation_flush": st.booleans(),
})


def run(prm, slots: int, sizer: TableSizer | None):
    stream, keep = make_stream(prm["seed"], prm["n"], prm["ngroups"], prm["nkeys"],
                               prm["panes"] * 10, prm["order"], prm["punct_every"], prm["late"])
    agg = HashAggregator(AGGS, prm["nkeys"], slots, pane_ns=10, flush=prm["policy"],
                         slow_flush=3, max_disorder=prm["m"], probes=prm["probes"],
                         hold_rows=prm["hold_rows"],
                         punctuation_flush=prm["punctuation_flush"], sizer=sizer)
    return stream, keep, run_stream(agg, stream, batch=int(prm["seed"] % 5) + 3)


def check_promises(out, prm, pane=10):
    """What every table promises, resized or not: punctuation never violated by a later row,
    oop rows out within m windows, iop rows in window order when packets are."""
    end = (out.rows.window + 1) * pane
    for event, p in out.out_puncts:
        assert np.all(end[out.row_event > event] > p), (event, p)
    if prm["policy"] == "iop_slow" and prm["order"] == "in_order" and not prm["late"]:
        assert np.all(np.diff(out.rows.window) >= 0), out.rows.window
    if prm["policy"] != "iop_slow":
        assert np.all(out.row_in_punct < (out.rows.window + 1 + prm["m"]) * pane)
    assert out.counters["resident"] == 0


def check_final(rows) -> None:
    """A row marked final (`lowlevel.finality`) is the only row of its (pane, keys)."""
    if not len(rows):
        return
    assert rows.final is not None and len(rows.final) == len(rows)
    frame = pd.DataFrame(rows.keys.view(np.int64)).assign(w=rows.window)
    many = frame.duplicated(keep=False).to_numpy()
    assert not np.any(rows.final & many), frame[rows.final & many]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params)
def test_adaptive_table_gives_the_rows_of_fixed_tables(prm):
    stream, keep, adaptive = run(prm, 2, RandomSizer(prm["seed"]))
    got = combined(AGGS, adaptive.rows)
    pd.testing.assert_frame_equal(got, reference_groups(AGGS, stream, 10, keep=keep),
                                  check_dtype=False)
    assert adaptive.counters["late"] == int(np.count_nonzero(stream.valid & ~keep))
    check_promises(adaptive, prm)
    check_final(adaptive.rows)
    for slots in (2, 16, 1024):
        _, _, fixed = run(prm, slots, None)
        pd.testing.assert_frame_equal(got, combined(AGGS, fixed.rows), check_dtype=False)
        check_final(fixed.rows)
        assert fixed.counters["late"] == adaptive.counters["late"]
        assert fixed.counters["slots"] == slots and fixed.counters["resizes"] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params)
def test_table_sizer_keeps_the_rows(prm):
    """The real rule, with a floor of 2 slots so that small streams resize too."""
    stream, keep, out = run(prm, 2, TableSizer(2, 256, min_slots=2))
    pd.testing.assert_frame_equal(combined(AGGS, out.rows),
                                  reference_groups(AGGS, stream, 10, keep=keep),
                                  check_dtype=False)
    check_promises(out, prm)


def feed(agg: HashAggregator, rng, window: int, groups: int, packets: int, out: list) -> int:
    """One 10-ns window of `packets` packets over `groups` groups, then its punctuation; the
    rows that left go to `out`; returns the distinct groups of the window."""
    ts = np.sort(rng.integers(window * 10, window * 10 + 10, packets)).astype(np.int64)
    keys = rng.integers(0, groups, (packets, 1)).astype(np.uint64)
    out += agg.append(ts, keys)
    out += agg.punctuate((window + 1) * 10)[0]
    return len(np.unique(keys))


def test_slots_grow_for_many_groups_and_shrink_back_for_few():
    layout = StateLayout([AggSpec("cnt", "count")])
    rng = np.random.default_rng(7)
    agg = HashAggregator(layout, 1, DEFAULT_SLOTS, pane_ns=10,
                         sizer=TableSizer(DEFAULT_SLOTS, 1 << 20))
    sizes: list[int] = []
    rows: list = []
    for w in range(4):
        feed(agg, rng, w, 200_000, 600_000, rows)
        sizes.append(agg.slots)
    assert sizes[0] == 4 * DEFAULT_SLOTS          # one growth step per window ...
    assert sizes[-1] == slots_for(200_000)        # ... to load <= 1/2 of the groups met
    # the groups met (about 190K of 200K), plus the few evicted and created again
    assert agg.sizer is not None and 180_000 <= agg.sizer.groups <= 220_000
    distinct = feed(agg, rng, 4, 200_000, 600_000, rows)
    for w in range(5, 5 + 5):
        feed(agg, rng, w, 100, 1000, rows)
    assert agg.slots == MIN_SLOTS                  # few groups: back to the smallest table
    assert agg.counters["resizes"] >= 3
    rows += agg.finish()[0]
    assert agg.counters["resident"] == 0
    # it fits: window 4's groups left the table about once each (the fixed table of 65,536
    # slots lets out about 2.2 rows per group here)
    window4 = sum(int(np.count_nonzero(c.window == 4)) for c in rows)
    assert distinct <= window4 < 1.1 * distinct, (window4, distinct)


def test_planner_sizes_from_defines():
    q = "DEFINE {{ query_name q; {d} }} SELECT tb, count(*) FROM main.IPV4 GROUP BY time/10 AS tb"
    low = plan_text(q.format(d=""), ["main"]).queries[0].low[0]
    assert (low.slots, low.max_slots) == (DEFAULT_SLOTS, DEFAULT_MAX_SLOTS)
    low = plan_text(q.format(d="expected_groups 300000;"), ["main"]).queries[0].low[0]
    assert (low.slots, low.max_slots) == (1 << 20, DEFAULT_MAX_SLOTS)
    low = plan_text(q.format(d="expected_groups 300000; max_aggregate_slots 5000;"),
                    ["main"]).queries[0].low[0]
    assert (low.slots, low.max_slots) == (8192, 8192)
    # aggregate_slots is a fixed size: no adaptation
    low = plan_text(q.format(d="expected_groups 300000;"), ["main"],
                    overrides={"aggregate_slots": "4"}).queries[0].low[0]
    assert (low.slots, low.max_slots) == (4, 0)


def test_adaptive_tables_probe_more_slots_than_fixed_ones():
    from lowlevel.operator import FIXED_PROBES, LowLevelOperator
    from lowlevel.sizing import ADAPTIVE_PROBES
    from tools.experiments.q81 import q81_plan

    q = "DEFINE { query_name q; } SELECT tb, srcIP, count(*) FROM main.IPV4 GROUP BY time/10 " \
        "AS tb, srcIP"
    adaptive = plan_text(q, ["main"]).queries[0].low[0]
    fixed = plan_text(q, ["main"], overrides={"aggregate_slots": "4096"}).queries[0].low[0]
    assert ADAPTIVE_PROBES > FIXED_PROBES
    assert LowLevelOperator(adaptive).engine.probes == ADAPTIVE_PROBES
    assert LowLevelOperator(fixed).engine.probes == FIXED_PROBES
    # the IOP-vs-OOP experiments model Gigascope's fixed table with its probes
    assert LowLevelOperator(q81_plan(4096, "iop_slow")).engine.probes == FIXED_PROBES
    assert LowLevelOperator(adaptive, probes=1).engine.probes == 1


def test_a_third_probe_cuts_the_evictions_at_the_target_load():
    """At the load an adaptive table is sized for, most groups that two probes evict find
    room in a third: fewer partial rows per group and window."""
    layout = StateLayout([AggSpec("cnt", "count")])
    evictions = {}
    for probes in (2, 3):
        rng = np.random.default_rng(35)
        agg = HashAggregator(layout, 1, slots_for(1500), pane_ns=10, probes=probes,
                             punctuation_flush=True)
        out: list = []
        for w in range(4):
            feed(agg, rng, w, 1500, 20_000, out)
        out += agg.finish()[0]
        evictions[probes] = sum(len(c) for c in out) - 4 * 1500
    assert evictions[3] < evictions[2] / 2, evictions
