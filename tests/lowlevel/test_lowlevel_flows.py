"""The flow table (lowlevel.flowtable) against the reference evaluator's independent flow loop:
generated traffic with FIN/RST, idle gaps, several buckets and disorder, punctuation every
10 ms, every second or only at the end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capture.reader import read_all
from capture.schema import L_TCP
from lowlevel.flowtable import FlowAggregator
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.parser import parse
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file
from tools.gen.traffic import NS, TrafficConfig, generate

NETFLOW = Path(__file__).resolve().parents[2] / "queries" / "library" / "netflow.gsql"
TUPLE = ["srcIP", "destIP", "srcPort", "destPort", "protocol"]
COLUMNS = ["tb", "srcIP", "destIP", "srcPort", "destPort", "protocol", "packets", "bytes",
           "first_ns", "last_ns", "tcp_flags", "tos", "vlan", "ipversion", "end_reason"]


@pytest.fixture(scope="session")
def flow_batch(tmp_path_factory):
    """40K packets over 4 minutes: 1500 flows with 30 s mean lifetimes (TCP ends with FIN),
    IPv4 and IPv6, TCP/UDP/ICMP, both directions, band disorder up to 2 s; 1% of the TCP
    packets get RST added."""
    cfg = TrafficConfig(packets=40_000, duration_ns=240 * NS, groups=300, flows=1500,
                        flow_duration_ns=30 * NS, ipv6=0.2, reverse=0.5, tcp=0.7, udp=0.27,
                        icmp=0.03, disorder="band", max_delay_ns=2 * NS, disorder_share=0.2,
                        seed=3)
    path = generate(cfg, tmp_path_factory.mktemp("flows") / "flows.pcap")["l0"]
    batch = read_all(path, link="main").copy()
    tcp = np.flatnonzero((batch["layers"] & L_TCP) != 0)
    rst = np.random.default_rng(1).choice(tcp, len(tcp) // 100, replace=False)
    batch.columns["flags"][rst] |= 0x04
    return batch


def plan(**overrides):
    text = NETFLOW.read_text()
    fp = plan_file(parse(text), ["main"], overrides={k: str(v) for k, v in overrides.items()},
                   source=text)
    return fp, fp.queries[0]


def sorted_frame(df: pd.DataFrame) -> pd.DataFrame:
    df = df[COLUMNS].copy()
    for c in COLUMNS:
        df[c] = [int(x) for x in df[c]]
    return df.sort_values(COLUMNS).reset_index(drop=True)


def punctuation_cuts(ts: np.ndarray, step_ns: int | None) -> list[tuple[int, int]]:
    """(after packet j, p): grammatical punctuation (p <= every later packet's time) each time
    the capture clock (running max) enters a new `step_ns` tick; none for step None."""
    if step_ns is None or len(ts) < 2:
        return []
    suffix_min = np.minimum.accumulate(ts[::-1])[::-1]
    tick = np.maximum.accumulate(ts) // step_ns
    cuts = np.flatnonzero(tick[1:] != tick[:-1])   # packet j is the last of its tick
    return [(int(j), int(suffix_min[j + 1])) for j in cuts]


def run_kernel(qp, batch, step_ns, slots=None):
    """The operator's own key/argument evaluation once, then the flow kernel fed slice by
    slice with punctuation between slices (a cheap way to punctuate every 10 ms)."""
    low = qp.low[0]
    if slots is not None:
        low = low.__class__(**{**low.__dict__, "slots": slots})
    op = LowLevelOperator(low)
    eng: FlowAggregator = op.engine
    ts = batch["timestamp"]
    keys, args = op._stack_keys(batch), op._args(batch)
    ends = ((batch["layers"] & L_TCP) != 0) & ((batch["flags"] & 0x05) != 0)
    valid = (batch["layers"] & low_mask(low)) != 0
    out, a = [], 0
    for j, p in punctuation_cuts(ts, step_ns) + [(len(ts) - 1, None)]:
        sl = slice(a, j + 1)
        out += eng.append(ts[sl], keys[sl], tuple(x[sl] for x in args), valid[sl], ends[sl])
        a = j + 1
        if p is not None:
            rows, _ = eng.punctuate(p)
            out += rows
    rows, _ = eng.finish()
    out += rows
    table = combine_partials(op._to_arrow(out), op.schema)
    return finalize(qp, table), eng.counters, sum(len(c) for c in out)


def low_mask(low):
    from capture.schema import protocol_mask

    return protocol_mask(low.protocol)


def run_operator(qp, batch, step_ns):
    """The plan-driven operator over slices of the batch, punctuation between them."""
    op = LowLevelOperator(qp.low[0])
    out, a = [], 0
    for j, p in punctuation_cuts(batch["timestamp"], step_ns) + [(len(batch) - 1, None)]:
        out += op.process(batch.slice(a, j + 1))
        a = j + 1
        if p is not None:
            out += op.punctuate(p)[0]
    out += op.finish()[0]
    return finalize(qp, combine_partials(out, op.schema)), op.counters, out


@pytest.fixture(scope="session")
def reference(flow_batch):
    fp, qp = plan(idle_timeout="3s")
    return evaluate_file(fp, {"main": flow_batch})["netflow"]


def test_reference_sees_every_reason_and_several_flows_per_bucket(reference):
    reasons = set(reference["end_reason"].astype(int))
    assert reasons == {1, 2, 3, 4}
    per_key = reference.groupby(["tb"] + TUPLE).size()
    assert (per_key > 1).sum() > 100          # idle gaps and FIN/RST split 5-tuples
    assert reference["tb"].nunique() >= 4


@pytest.mark.parametrize("step_ns", [10_000_000, NS, None], ids=["10ms", "1s", "end"])
@pytest.mark.slow
def test_kernel_equals_reference(flow_batch, reference, step_ns):
    fp, qp = plan(idle_timeout="3s")
    got, counters, nrows = run_kernel(qp, flow_batch, step_ns)
    assert counters["flows_evicted"] == 0 and counters["late"] == 0
    assert nrows == len(reference)            # no two rows of one flow: combine is identity
    pd.testing.assert_frame_equal(sorted_frame(got), sorted_frame(reference))


@pytest.mark.parametrize("step_ns", [NS, None], ids=["1s", "end"])
def test_operator_equals_reference(flow_batch, reference, step_ns):
    fp, qp = plan(idle_timeout="3s")
    got, counters, batches = run_operator(qp, flow_batch, step_ns)
    assert counters["packets_in"] == len(flow_batch)
    assert counters["flows"] == len(reference)
    assert sum(b.num_rows for b in batches) == len(reference)
    pd.testing.assert_frame_equal(sorted_frame(got), sorted_frame(reference))
    for r, name in {1: "idle", 2: "active", 3: "end", 4: "forced"}.items():
        assert counters[f"flows_{name}"] == int((reference["end_reason"] == r).sum())


@pytest.mark.parametrize("step_ns", [10_000_000, None], ids=["10ms", "end"])
@pytest.mark.slow
def test_tiny_table_keeps_totals_and_counts_evictions(flow_batch, reference, step_ns):
    fp, qp = plan(idle_timeout="3s")
    got, counters, nrows = run_kernel(qp, flow_batch, step_ns, slots=64)
    evicted = int((got["end_reason"] == 5).sum())
    assert evicted == counters["flows_evicted"] > 0
    assert len(got) == nrows == counters["flows"]
    totals = ["packets", "bytes"]

    def per_tuple(df):
        df = sorted_frame(df)
        return df.groupby(["tb"] + TUPLE).agg(packets=("packets", "sum"), bytes=("bytes", "sum"),
                                              first_ns=("first_ns", "min"),
                                              last_ns=("last_ns", "max"))

    pd.testing.assert_frame_equal(per_tuple(got), per_tuple(reference))
    assert got[totals].sum().tolist() == reference[totals].sum().tolist()


@pytest.mark.slow
def test_flow_ids_keep_flows_apart_and_links_apart():
    """Two links, the same 5-tuple and bucket: flow ids differ per flow and per link."""
    from lowlevel.aggregates import AggSpec, StateLayout

    layout = StateLayout([AggSpec("cnt", "count", "uint64"), AggSpec("r", "max", "uint64")])
    ids = []
    for link in ("a", "b"):
        agg = FlowAggregator(layout, 1, 16, pane_ns=60 * NS, idle_ns=NS, reason_state="r",
                             link=link)
        ts = np.array([0, 10, 2 * NS, 3 * NS], np.int64)   # idle gap after the 2nd packet
        keys = np.full((4, 1), 7, np.uint64)
        ends = np.array([False, False, False, True])
        rows = agg.append(ts, keys, None, None, ends)
        rows += agg.finish()[0]
        states = [layout.state_columns(r.banks) for r in rows]
        got = sorted((int(r.keys[i, 1]), int(st["r"][i]), int(st["cnt"][i]))
                     for r, st in zip(rows, states) for i in range(len(r)))
        assert [(reason, n) for _, reason, n in got] == [(1, 2), (3, 2)]  # idle, then end
        ids += [fid for fid, _, _ in got]
    assert len(set(ids)) == 4
