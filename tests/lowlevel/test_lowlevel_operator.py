"""The plan-driven operator: real GSQL text planned by queries.planner, packets from a generated
capture, partial rows combined and finalised, compared with the reference evaluator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from capture.batch import PacketBatch
from capture.reader import read_all
from capture.schema import L_ETH, REASON_CODES
from lowlevel.errors import LowLevelError
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.parser import parse
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file
from tools.gen.traffic import NS, TrafficConfig, generate

Q8_1 = ("SELECT tb, srcIP, destIP, count(*) FROM main.IPV4 "
        "GROUP BY time/60 AS tb, srcIP, destIP")
RICH = ("SELECT tb, srcIP, destIP, count(*) AS n, sum(len) AS bytes, min(ttl) AS lo_ttl, "
        "max(len) AS hi_len, OR_AGGR(flags) AS fl, XOR_AGGR(seq) AS xs, FIRST(ttl) AS ft, "
        "LAST(len) AS ll, COUNT_DISTINCT(srcPort) AS ports, AVG(len) AS al "
        "FROM main.TCP WHERE ttl > 10 GROUP BY time/60 AS tb, srcIP, destIP")
BY_PORT = ("SELECT tb, destPort, count(*), COUNT_DISTINCT(srcIP) AS srcs, MIN(timestamp) AS t0 "
           "FROM main.UDP GROUP BY time/20 AS tb, destPort")


@pytest.fixture(scope="session")
def capture_batch(tmp_path_factory) -> PacketBatch:
    """A generated capture (IPv4 and IPv6, TCP/UDP/ICMP, band disorder, same-time ties) with
    a few rows made malformed and a few non-IP rows."""
    out = tmp_path_factory.mktemp("lowlevel") / "main.pcap"
    cfg = TrafficConfig(packets=30_000, duration_ns=300 * NS, groups=400, ipv6=0.2,
                        disorder="band", max_delay_ns=15 * NS, disorder_share=0.3, seed=5)
    batch = read_all(generate(cfg, out)["l0"], link="main").copy()
    rng = np.random.default_rng(0)
    bad = rng.choice(len(batch), 300, replace=False)
    batch.columns["layers"][bad[:200]] = L_ETH
    batch.columns["reason"][bad[:200]] = REASON_CODES["truncated_ip_header"]
    batch.columns["layers"][bad[200:]] = L_ETH
    batch.columns["reason"][bad[200:]] = REASON_CODES["non_ip_ethertype"]
    return batch


def _plan(text):
    fp = plan_file(parse(text), ["main"])
    return fp, fp.queries[0]


def _run(low, batch: PacketBatch, step: int = 2500, hold_rows: int = 0):
    """Feed the operator in slices with grammatical punctuation after each slice."""
    op = LowLevelOperator(low, hold_rows=hold_rows)
    ts = batch["timestamp"]
    suffix_min = np.minimum.accumulate(ts[::-1])[::-1]
    out, puncts = [], []
    for a in range(0, len(batch), step):
        b = min(len(batch), a + step)
        got = op.process(batch.slice(a, b))
        out += got
        if b < len(batch):
            rows, p = op.punctuate(int(suffix_min[b]))
            out += rows
            if p is not None:
                puncts.append((len(out), p))
    rows, final = op.finish()
    out += rows
    puncts.append((len(out), final))
    return op, out, puncts


def _compare(got: pd.DataFrame, want: pd.DataFrame, keys: list[str]):
    assert list(got.columns) == list(want.columns)
    got = got.sort_values(keys).reset_index(drop=True)
    want = want.sort_values(keys).reset_index(drop=True)
    assert len(got) == len(want)
    for c in got.columns:
        g, w = got[c].to_numpy(), want[c].to_numpy()
        if g.dtype.kind == "f" or w.dtype.kind == "f":
            np.testing.assert_allclose(g.astype(float), w.astype(float), rtol=1e-12, err_msg=c)
        else:
            assert [int(x) for x in g] == [int(x) for x in w], c


@pytest.mark.parametrize("flush", ["oop_lazy", "oop_slow", "iop_slow"])
@pytest.mark.parametrize("text,keys", [(Q8_1, ["tb", "srcIP", "destIP"]),
                                       (RICH, ["tb", "srcIP", "destIP"]),
                                       (BY_PORT, ["tb", "destPort"])])
@pytest.mark.parametrize("slots", [64, 4096])
@pytest.mark.parametrize("hold_rows", [0, 700])
def test_planned_query_equals_reference(capture_batch, text, keys, flush, slots, hold_rows):
    """hold_rows 700: rows leave in batches of at least 700 (or at a punctuation), and none
    comes after a punctuation that covers it (checked below)."""
    fp, qp = _plan(text)
    low = qp.low[0].__class__(**{**qp.low[0].__dict__, "flush": flush, "slots": slots})
    op, batches, puncts = _run(low, capture_batch, hold_rows=hold_rows)
    table = combine_partials(batches, op.schema)
    got = finalize(qp, table)
    want = evaluate_file(fp, {"main": capture_batch})[qp.name]
    _compare(got, want, keys)
    c = op.counters
    assert c["packets_in"] == len(capture_batch)
    assert c["malformed"] == 200               # the truncated rows; non-IP rows are benign
    assert c["late"] == 0
    assert c["rows_out"] == sum(b.num_rows for b in batches)
    if slots == 64 and text != BY_PORT:          # 400 (srcIP, destIP) groups in 64 slots
        assert c["evictions"] > 0
    # punctuation: strictly increasing, never violated by a later partial row
    ps = [p for _, p in puncts]
    assert all(a < b for a, b in zip(ps, ps[1:]))
    pane = low.window.pane_ns
    for i, b in enumerate(batches):
        end = (b.column("window").to_numpy() + 1) * pane - low.window.offset_ns
        for upto, p in puncts:
            if upto <= i:
                assert np.all(end > p)


def test_held_rows_leave_in_large_batches(capture_batch):
    """With hold_rows, `process` hands out nothing or one batch of at least hold_rows rows
    (small packet batches off a ring convert to Arrow rarely); `punctuate` hands out the rest."""
    fp, qp = _plan(Q8_1)
    low = qp.low[0].__class__(**{**qp.low[0].__dict__, "slots": 64})     # evicts often
    now, held = LowLevelOperator(low), LowLevelOperator(low, hold_rows=500)
    sizes, direct = [], 0
    for a in range(0, 9_900, 100):
        got = held.process(capture_batch.slice(a, a + 100))
        assert len(got) <= 1
        sizes += [b.num_rows for b in got]
        direct += sum(b.num_rows for b in now.process(capture_batch.slice(a, a + 100)))
    assert sizes and min(sizes) >= 500
    assert direct > sum(sizes)                  # some rows are still held
    p = int(capture_batch["timestamp"][9_900:].min())
    rows, _ = held.punctuate(p)
    rest, _ = now.punctuate(p)
    assert sum(sizes) + sum(b.num_rows for b in rows) == \
        direct + sum(b.num_rows for b in rest)


def test_partial_schema_layout(capture_batch):
    _, qp = _plan(RICH)
    op, batches, _ = _run(qp.low[0], capture_batch.slice(0, 5000))
    schema = op.schema.schema
    assert schema.names[:5] == ["window", "srcIP__hi", "srcIP__lo", "destIP__hi", "destIP__lo"]
    assert schema.field("window").type == pa.int64()
    assert schema.field("cnt").type == pa.uint64()
    assert schema.field("first_ttl__t").type == pa.int64()
    assert schema.field("distinct_srcPort").type == pa.binary(qp.low[0].distinct_registers)
    assert schema.field("or_flags").metadata[b"oopscope.kind"] == b"or"
    assert schema.metadata[b"oopscope.query"] == qp.name.encode()
    assert schema.metadata[b"oopscope.link"] == b"main"
    assert schema.names[-1] == "__final" and schema.field("__final").type == pa.bool_()
    assert all(b.schema.equals(schema) for b in batches)
    # IPv4 rows are IPv4-mapped in the two-column layout
    t = pa.Table.from_batches(batches)
    hi = t.column("srcIP__hi").to_numpy()
    lo = t.column("srcIP__lo").to_numpy()
    v4 = hi == 0
    assert v4.any() and (~v4).any()
    assert np.all(lo[v4] >> np.uint64(32) == 0xFFFF)


def test_late_packets_are_counted_not_emitted(capture_batch):
    _, qp = _plan(Q8_1)
    op = LowLevelOperator(qp.low[0])
    ts = capture_batch["timestamp"]
    first = capture_batch.slice(0, 10_000)
    op.process(first)
    p = int(np.median(ts[10_000:20_000]))
    _, out_p = op.punctuate(p)
    rest = capture_batch.slice(10_000, 20_000)
    is_v4 = (rest["layers"] & 4) != 0
    late = int(np.count_nonzero(is_v4 & (rest["timestamp"] < p)))
    assert late > 0
    rows = op.process(rest)
    rows += op.finish()[0]
    assert op.counters["late"] == late
    pane = qp.low[0].window.pane_ns
    for b in rows:
        assert np.all((b.column("window").to_numpy() + 1) * pane > out_p)


def test_bad_plans_give_clear_errors():
    _, qp = _plan(Q8_1)
    low = qp.low[0]
    with pytest.raises(LowLevelError, match="flush policy 'fast'"):
        LowLevelOperator(low.__class__(**{**low.__dict__, "flush": "fast"}))
    with pytest.raises(LowLevelError, match="registers must be a power of two"):
        _, q2 = _plan(BY_PORT)
        LowLevelOperator(q2.low[0].__class__(**{**q2.low[0].__dict__, "distinct_registers": 48}))


def test_empty_batch_and_finish_without_data():
    _, qp = _plan(Q8_1)
    op = LowLevelOperator(qp.low[0])
    assert op.process(PacketBatch.empty("main")) == []
    rows, p = op.punctuate(120 * NS)
    assert rows == [] and p == 120 * NS
    rows, final = op.finish()
    assert rows == [] and final >= 120 * NS
