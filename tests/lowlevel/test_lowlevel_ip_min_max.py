"""MIN and MAX over IPv6 addresses in the low level: the two-word state (hi, lo) compared as
one 128-bit unsigned number, folded per packet by the kernels and combined across evicted
partial rows (`lowlevel.aggregates` OP_MIN_IP / OP_MAX_IP, `combine_states`).

Expected values are computed here with Python's `ipaddress` over the values written (CSV
records) or over the packet batch's address columns, independently of the evaluator; the
reference evaluator (`tests.oracles.reference`) is checked against the same values. The
values include addresses that differ only in their low half, halves at and above 2^63 (a
signed comparison would order them wrongly) and a group of one row.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict

import numpy as np
import pytest

from capture.reader import read_all
from capture.records import read_all_records
from lowlevel.aggregates import AggSpec, StateLayout, combine_states
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.planner import plan_text
from queries.schemafile import schema_from_text
from tests.oracles.reference import evaluate_file
from tools.gen.traffic import NS, TrafficConfig, generate

SCHEMA = """
PROTOCOL base { uint systemTime get_system_time (increasing); }
PROTOCOL V6 (base) {
    uint t get_csv_uint_pos1 (increasing);
    IPV6 k get_csv_ipv6_pos2;
    IPV6 v get_csv_ipv6_pos3;
}
"""
QUERY = ("SELECT tb, k, count(*) AS n, min(v) AS lo, max(v) AS hi FROM [l].V6 "
         "GROUP BY t/10 AS tb, k")

#: (t, key, value): per key one ordering trap
CRAFTED = [
    # only the low half differs, and the low half crosses 2^63
    (1, "::1", "2001:db8::8000:0:0:0"), (2, "::1", "2001:db8::1"),
    (3, "::1", "2001:db8::ffff:ffff:ffff:ffff"), (4, "::1", "2001:db8::7fff:ffff:ffff:ffff"),
    # the high half at and above 2^63, and the extremes
    (1, "::2", "8000::"), (2, "::2", "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    (3, "::2", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), (4, "::2", "::"),
    (5, "::2", "ffff::1"),
    # a group of one row
    (6, "fe80::1", "fe80::dead:beef"),
]


def _lines(rng) -> list[tuple[int, str, str]]:
    rows = list(CRAFTED)
    halves = [0, 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1]
    for i in range(400):
        pick = int(rng.integers(0, len(halves)))
        hi = halves[pick] if i % 3 else int(rng.integers(0, 2**63)) * 2 + i % 2
        lo = halves[(pick + i) % len(halves)] if i % 2 else int(rng.integers(0, 2**63)) * 2 + 1
        key = f"2001:db8::{i % 7:x}"
        rows.append((i // 40 + 7, key, str(ipaddress.IPv6Address(hi << 64 | lo))))
    return rows + [(17, "::1", "::ffff:a00:1")]   # t increases: the last window's one row


def _expected(rows) -> dict[tuple[int, int], tuple[int, int, int]]:
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for t, k, v in rows:
        groups[(t // 10, int(ipaddress.IPv6Address(k)))].append(int(ipaddress.IPv6Address(v)))
    return {g: (len(vs), min(vs), max(vs)) for g, vs in groups.items()}


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    rows = _lines(np.random.default_rng(3))
    path = tmp_path_factory.mktemp("ipminmax") / "v6.csv"
    path.write_text("".join(f"{t},{k},{v}\n" for t, k, v in rows))
    return path, rows


@pytest.mark.parametrize("slots", [1, 4, 1 << 12])
def test_min_max_over_ipv6_records(records, slots):
    path, rows = records
    plan = plan_text(QUERY, ["l"], schema=schema_from_text(SCHEMA),
                     overrides={"aggregate_slots": str(slots)})
    qp = plan.queries[0]
    lp = qp.low[0]
    assert [(s.kind, s.dtype) for s in lp.subaggs][1:] == [("min", "ip"), ("max", "ip")]
    op = LowLevelOperator(lp)
    batch = read_all_records(path, lp.record, "l")
    out = []
    for start in range(0, len(batch), 37):
        out += op.process(batch.slice(start, start + 37))
    last, _ = op.finish()
    out += last
    if slots == 1:
        assert op.counters["evictions"] > 0     # several partial rows per group to combine
    table = combine_partials(out, op.schema)
    assert {"min_v__hi", "min_v__lo", "max_v__hi", "max_v__lo"} <= set(table.column_names)
    got = {(int(r.tb), int(r.k)): (int(r.n), int(r.lo), int(r.hi))
           for r in finalize(qp, table).itertuples()}
    want = _expected(rows)
    assert got == want
    assert want[(0, int(ipaddress.IPv6Address("fe80::1")))][0] == 1
    ref = evaluate_file(plan, {"l": batch})[qp.name]
    assert {(int(r.tb), int(r.k)): (int(r.n), int(r.lo), int(r.hi))
            for r in ref.itertuples()} == want


def test_combine_states_orders_halves_unsigned():
    """Three partial rows of one group, one of another: the smallest / largest pair wins,
    hi first, each half unsigned."""
    layout = StateLayout([AggSpec("m", "min", "ip"), AggSpec("x", "max", "ip")])
    hi = np.array([2**63, 5, 5, 1], np.uint64)
    lo = np.array([0, 2**63 + 1, 2**63, 7], np.uint64)
    states = {"m__hi": hi, "m__lo": lo, "x__hi": hi, "x__lo": lo}
    keys, out = combine_states(layout, [np.array([0, 0, 0, 1])], states)
    assert list(keys[0]) == [0, 1]
    assert [(int(a), int(b)) for a, b in zip(out["m__hi"], out["m__lo"])] == \
        [(5, 2**63), (1, 7)]
    assert [(int(a), int(b)) for a, b in zip(out["x__hi"], out["x__lo"])] == \
        [(2**63, 0), (1, 7)]


@pytest.fixture(scope="module")
def v6_packets(tmp_path_factory):
    """Generated IPv6 traffic whose source addresses are rewritten to ordering traps: a few
    high halves (some >= 2^63), low halves drawn from both sides of 2^63."""
    out = tmp_path_factory.mktemp("ipminmax") / "v6.pcap"
    cfg = TrafficConfig(packets=8_000, duration_ns=120 * NS, groups=60, ipv6=0.5, seed=11)
    batch = read_all(generate(cfg, out)["l0"], link="main").copy()
    rng = np.random.default_rng(7)
    n = len(batch)
    his = np.array([0x2001_0db8 << 32, 2**63, 2**64 - 1, 2**63 - 1], np.uint64)
    batch.columns["srcIP_hi"][:] = his[rng.integers(0, len(his), n)]
    batch.columns["srcIP_lo"][:] = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    return batch


@pytest.mark.parametrize("slots", [8, 1 << 12])
def test_min_max_over_packet_addresses(v6_packets, slots):
    text = ("SELECT tb, destPort, count(*) AS n, min(srcIP) AS lo, max(srcIP) AS hi "
            "FROM main.IPV6 GROUP BY time/30 AS tb, destPort")
    plan = plan_text(text, ["main"], overrides={"aggregate_slots": str(slots)})
    qp = plan.queries[0]
    op = LowLevelOperator(qp.low[0])
    out = []
    for start in range(0, len(v6_packets), 1000):
        out += op.process(v6_packets.slice(start, start + 1000))
    last, _ = op.finish()
    out += last
    got = {(int(r.tb), int(r.destPort)): (int(r.n), int(r.lo), int(r.hi))
           for r in finalize(qp, combine_partials(out, op.schema)).itertuples()}
    # expected: straight from the batch's columns, as Python ints
    c = v6_packets.columns
    v6 = c["ipversion"] == 6 if "ipversion" in c else None
    assert v6 is not None and v6.sum() > 1000
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for ts, port, h, lo in zip(c["timestamp"][v6], c["destPort"][v6], c["srcIP_hi"][v6],
                               c["srcIP_lo"][v6]):
        groups[(int(ts) // (30 * NS), int(port))].append(int(h) << 64 | int(lo))
    want = {g: (len(vs), min(vs), max(vs)) for g, vs in groups.items()}
    assert got == want
    assert any(v[2] >> 127 for v in want.values())      # a high half >= 2^63 was the max


def test_sampling_query_refuses_min_over_an_address():
    """The sampling kernel keeps aggregates as float64 words: one located line, no plan."""
    from queries.errors import QueryError

    text = ("SELECT tb, srcPort, count(*) AS n, min(destIP) AS m, count$(*) AS sn FROM main.IP "
            "GROUP BY time/60 AS tb, srcPort CLEANING_WHEN count_distinct$(*) >= 2 "
            "CLEANING_BY sum(len) > 100")
    with pytest.raises(QueryError, match=r":1:36: MIN over an address in a sampling query"):
        plan_text(text, ["main"])
