"""The fast read path of the low level: a reader decoding only the plan's columns, ahead in a thread, gives the same partial rows.

Oracle: the same operator over the same capture read the default way (every column decoded
by the general path, no thread); partial rows are compared after `combine_partials` (the
split of a group into rows may differ only if the batches differ, and they must not).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from capture.reader import open_capture
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from queries.parser import parse
from queries.planner import plan_file
from tools.gen.traffic import NS, TrafficConfig, generate

NETFLOW = Path(__file__).resolve().parents[2] / "queries" / "library" / "netflow.gsql"
Q8_1 = ("SELECT tb, srcIP, destIP, count(*) FROM main.IPV4 "
        "GROUP BY time/60 AS tb, srcIP, destIP")
PORTS = ("SELECT tb, srcIP, destPort, count(*), sum(len) AS bytes, max(ttl) AS t FROM main.TCP "
         "WHERE destPort > 1000 GROUP BY time/20 AS tb, srcIP, destPort")
V6 = ("SELECT tb, srcIP, destIP, count(*) FROM main.IP GROUP BY time/30 AS tb, srcIP, destIP")


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    out = tmp_path_factory.mktemp("readpath") / "main.pcap"
    cfg = TrafficConfig(packets=40_000, duration_ns=240 * NS, groups=3000, ipv6=0.2, seed=11)
    return generate(cfg, out)["l0"]


def _low(text, flush="oop_lazy", slots=1024):
    from dataclasses import replace

    low = plan_file(parse(text), ["main"]).queries[0].low[0]
    return replace(low, slots=slots, flush=flush)


def _run(path, low, **reader):
    op = LowLevelOperator(low)
    cols = op.read_columns if reader.pop("plan_columns", False) else None
    out = []
    with open_capture(path, link="main", batch_size=4096, columns=cols, **reader) as r:
        for batch in r:
            out += op.process(batch)
            rows, _ = op.punctuate(int(batch["timestamp"][-1]))
            out += rows
    rows, _ = op.finish()
    out += rows
    return op, pa.Table.from_batches(out, schema=op.schema.schema)


@pytest.mark.parametrize("text", [Q8_1, PORTS, V6])
@pytest.mark.parametrize("flush", ["iop_slow", "oop_slow"])
def test_plan_columns_and_prefetch_give_the_same_rows(capture, text, flush):
    low = _low(text, flush)
    op0, want = _run(capture, low)
    op1, got = _run(capture, low, plan_columns=True, prefetch=2)
    assert want.num_rows > 0
    # same batches in the same order: the very same partial rows
    assert got.equals(want)
    assert op1.counters == op0.counters
    # and the combined result (what the high level sees) is not empty
    assert 0 < combine_partials(want, op0.schema).num_rows <= want.num_rows


def test_read_columns_name_what_the_plan_reads():
    cols = LowLevelOperator(_low(Q8_1)).read_columns
    assert set(cols) == {"timestamp", "layers", "reason", "srcIP_lo", "destIP_lo"}
    cols = set(LowLevelOperator(_low(PORTS)).read_columns)
    assert {"destPort", "len", "ttl", "srcIP_lo"} <= cols and "seq" not in cols
    cols = set(LowLevelOperator(_low(V6)).read_columns)
    assert {"srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo"} <= cols


def test_direct_keys_match_the_evaluator(capture):
    """Plain-field keys go straight into the key matrix; the evaluator path must agree."""
    from capture.reader import read_all

    batch = read_all(capture, link="main")
    for text in (Q8_1, V6, PORTS):
        op = LowLevelOperator(_low(text))
        assert all(d is not None for d in op._direct)
        fast = op._stack_keys(batch)
        op._direct = [None] * len(op._direct)
        slow = op._stack_keys(batch)
        np.testing.assert_array_equal(fast, slow)


def test_direct_keys_beside_expressions(capture):
    """A key list mixing plain fields and expressions (netflow.gsql's destPort): the plain
    ones go straight in, the rest through the evaluator, the same matrix."""
    from capture.reader import read_all

    batch = read_all(capture, link="main")
    text = NETFLOW.read_text()
    plan = plan_file(parse(text), ["main"]).query("netflow").low[0]
    op = LowLevelOperator(plan)
    assert None in op._direct and any(d is not None for d in op._direct)
    mixed = op._stack_keys(batch).copy()
    op._direct = [None] * len(op._direct)
    np.testing.assert_array_equal(mixed, op._stack_keys(batch))


TIMES = ("SELECT tb, srcIP, count(*), min(time) AS first_s, max(timestamp) AS last_ns, "
         "sum(destPort) AS p FROM main.TCP GROUP BY time/20 AS tb, srcIP")


@pytest.mark.parametrize("query", ["netflow", "ports", "times"])
def test_direct_arguments_match_the_evaluator(capture, query):
    """Plain-field sub-aggregate arguments (len, timestamp, flags, tos, ...) go straight into
    their banks; the evaluator path must fill the banks with the same values (time, derived
    from the timestamp, is not one of them)."""
    from capture.reader import read_all

    batch = read_all(capture, link="main")
    if query == "netflow":
        low = plan_file(parse(NETFLOW.read_text()), ["main"]).query("netflow").low[0]
    else:
        low = _low(PORTS if query == "ports" else TIMES)
    op = LowLevelOperator(low)
    assert op._direct_arg, "no argument took the direct path"
    if query == "times":
        assert "timestamp" in op._direct_arg.values() and "destPort" in op._direct_arg.values()
        assert len(op._direct_arg) == 2         # min(time) goes through the evaluator
    fast = [b.copy() for b in op._args(batch)]
    op._direct_arg = {}
    slow = op._args(batch)
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert f.dtype == s.dtype
        np.testing.assert_array_equal(f, s)
