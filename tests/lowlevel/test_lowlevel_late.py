"""Late data at the low level (docs/semantics.md "Late data"): `late 'drop'` counts and drops,
`late 'correct'` routes late packets to a late partition whose marked partial rows carry the same
windows.

Oracles: the patent's worked example (p[49]-p[52]) and a plain numpy count/sum per
(window, key) over every packet, whatever the arrival order, punctuation and table size.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from capture.batch import PacketBatch
from lowlevel.operator import LATE_MARKER, LowLevelOperator
from lowlevel.testing import PATENT_MINUTES, patent_segments
from queries.planner import plan_text

NS = 1_000_000_000

PATENT = """DEFINE {{ query_name rollup5; {late} }}
SELECT tb, COUNT(*) AS cnt FROM main.PACKET GROUP BY time/300 AS tb;"""


def packets(minutes, lens=None) -> PacketBatch:
    b = PacketBatch.empty("main", len(minutes))
    b.columns["timestamp"][:] = np.asarray(minutes, np.int64) * 60 * NS + 30 * NS
    b.columns["len"][:] = 100 if lens is None else lens
    return b


def run_patent(late: str):
    qp = plan_text(PATENT.format(late=late), ["main"]).queries[0]
    op = LowLevelOperator(qp.low[0])
    rows = []
    for minutes, punct in patent_segments():
        rows += op.process(packets(minutes))
        rows += op.punctuate(punct)[0]
    rows += op.finish()[0]
    return op, pa.Table.from_batches(rows) if rows else None


def test_patent_vector_low_level_drop_and_correct():
    op, table = run_patent("")
    assert op.plan.late == "drop"
    assert (op.counters["late"], op.counters["late_corrected"]) == (6, 0)
    assert LATE_MARKER not in table.column_names
    cnt = [c for c in table.column_names if c.startswith("cnt")][0]
    assert sum(table.column(cnt).to_pylist()) == 10          # the patent's 10 of 16

    op, table = run_patent("late 'correct';")
    assert op.plan.late == "correct"
    c = op.counters
    assert (c["late"], c["late_corrected"], c["packets_in"]) == (0, 6, 16)
    marker = np.asarray(table.column(LATE_MARKER))
    counts = np.asarray(table.column(cnt))
    windows = np.asarray(table.column("window"))
    assert int(counts.sum()) == 16                              # nothing lost
    assert int(counts[marker == 1].sum()) == 6                  # the late partition's rows
    assert c["late_rows_out"] == int(np.count_nonzero(marker == 1))
    per_window = {int(w): int(counts[windows == w].sum()) for w in np.unique(windows)}
    minutes = PATENT_MINUTES
    assert per_window == {w: sum(1 for m in minutes if m // 5 == w) for w in range(3)}
    # the late partition's rows are for windows the main table's punctuation already passed
    assert set(windows[marker == 1]) <= {0, 1}


KEYED = """DEFINE {{ query_name k; late '{late}'; aggregate_slots {slots}; flush {flush}; }}
SELECT tb, srcPort, COUNT(*) AS cnt, SUM(len) AS bytes FROM main.UDP
GROUP BY time/10 AS tb, srcPort;"""


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), slots=st.sampled_from([2, 8, 1024]),
       flush=st.sampled_from(["oop_lazy", "oop_slow", "iop_slow"]),
       late=st.sampled_from(["drop", "correct"]))
def test_correct_keeps_every_packet_drop_counts_the_rest(seed, slots, flush, late):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 200))
    t = np.sort(rng.integers(0, 100 * NS, n))
    # disorder: a share of packets arrive far behind (up to 40 s late)
    delay = np.where(rng.random(n) < 0.3, rng.integers(0, 40 * NS, n), 0)
    order = np.argsort(t + delay, kind="stable")
    ts, ports = t[order], rng.integers(1, 4, n)[order]
    lens = rng.integers(40, 1500, n)[order]
    qp = plan_text(KEYED.format(late=late, slots=slots, flush=flush), ["main"]).queries[0]
    op = LowLevelOperator(qp.low[0])
    rows, expected_late = [], 0
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(6, n - 1), replace=False))
    p, a0 = None, 0
    for a1 in list(cuts) + [n]:
        b = PacketBatch.empty("main", a1 - a0)
        b.columns["timestamp"][:] = ts[a0:a1]
        b.columns["srcPort"][:] = ports[a0:a1]
        b.columns["len"][:] = lens[a0:a1]
        b.columns["layers"][:] = 0xFFFF
        if p is not None:
            expected_late += int(np.count_nonzero(ts[a0:a1] < p))
        rows += op.process(b)
        p = int(ts[:a1].max()) // (10 * NS) * (10 * NS)       # the link timer's value
        rows += op.punctuate(p)[0]
        a0 = a1
    rows += op.finish()[0]
    table = pa.Table.from_batches(rows)
    kind = {s.kind: s.name for s in qp.low[0].subaggs}      # the sub-aggregate states
    got: dict = {}
    for w, k, c, s in zip(*(np.asarray(table.column(x)) for x in ("window", "srcPort",
                                                                     kind["count"],
                                                                     kind["sum"]))):
        g = got.setdefault((int(w), int(k)), [0, 0])
        g[0] += int(c)
        g[1] += int(s)
    c = op.counters
    if late == "correct":
        want: dict = {}
        for ti, k, ln in zip(ts, ports, lens):
            g = want.setdefault((int(ti // (10 * NS)), int(k)), [0, 0])
            g[0] += 1
            g[1] += int(ln)
        assert got == want
        assert (c["late"], c["late_corrected"]) == (0, expected_late)
    else:
        assert c["late"] == expected_late
        assert sum(g[0] for g in got.values()) == n - expected_late
