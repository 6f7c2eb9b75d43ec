"""Per-query kernels (lowlevel.specialize): the flow table's append kernel with its updates
written out gives the generic kernel's rows, for every op kind; no writable directory falls
back to the generic kernel."""

from __future__ import annotations

import numpy as np
import pytest

from lowlevel import kerneldir, specialize
from lowlevel.aggregates import AggSpec, StateLayout
from lowlevel.flowtable import FlowAggregator, flow_append

NS = 1_000_000_000
#: one sub-aggregate of every kind and bank the append kernel knows
SPECS = [AggSpec("n", "count", "int64"), AggSpec("nu", "count", "uint64"),
         AggSpec("si", "sum", "int64"), AggSpec("su", "sum", "uint64"),
         AggSpec("sf", "sum", "float64"), AggSpec("mini", "min", "int64"),
         AggSpec("minu", "min", "uint64"), AggSpec("minf", "min", "float64"),
         AggSpec("maxi", "max", "int64"), AggSpec("maxu", "max", "uint64"),
         AggSpec("maxf", "max", "float64"), AggSpec("andi", "and", "int64"),
         AggSpec("andu", "and", "uint64"), AggSpec("ori", "or", "int64"),
         AggSpec("oru", "or", "uint64"), AggSpec("xori", "xor", "int64"),
         AggSpec("xoru", "xor", "uint64"), AggSpec("fi", "first", "int64"),
         AggSpec("fu", "first", "uint64"), AggSpec("ff", "first", "float64"),
         AggSpec("li", "last", "int64"), AggSpec("lu", "last", "uint64"),
         AggSpec("lf", "last", "float64"), AggSpec("d", "distinct", "uint64", registers=16),
         AggSpec("r", "max", "uint64")]


def packets(n: int, seed: int):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, 180 * NS, n)).astype(np.int64)
    ts[rng.random(n) < 0.1] -= NS // 2           # some disorder, and equal times
    ts[1::7] = ts[::7][:len(ts[1::7])]
    keys = rng.integers(0, 300, (n, 2)).astype(np.uint64)
    layout = StateLayout(SPECS)
    ai, au, af, ad = layout.empty_args(n)
    ai[:] = rng.integers(-2**62, 2**62, ai.shape)
    au[:] = rng.integers(0, 2**63, au.shape).astype(np.uint64) * np.uint64(2) + \
        rng.integers(0, 2, au.shape).astype(np.uint64)
    af[:] = rng.normal(size=af.shape)
    ad[:] = rng.integers(0, 2**63, ad.shape).astype(np.uint64)
    ai[rng.random(n) < 0.3] = 5                  # ties of values at equal times
    ends = rng.random(n) < 0.05
    return ts, keys, (ai, au, af, ad), ends


def run(kernel, seed: int):
    layout = StateLayout(SPECS)
    agg = FlowAggregator(layout, 2, 256, pane_ns=60 * NS, idle_ns=10 * NS, reason_state="r",
                         link="x")
    if kernel is not None:
        agg._kernel = kernel
    ts, keys, args, ends = packets(20_000, seed)
    rows = []
    for lo in range(0, len(ts), 3000):
        sl = slice(lo, lo + 3000)
        rows += agg.append(ts[sl], keys[sl], tuple(a[sl] for a in args), None, ends[sl])
        rows += agg.punctuate(int(ts[sl].max()) - NS)[0]
    rows += agg.finish()[0]
    return rows, agg


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.slow
def test_specialized_flow_kernel_equals_the_generic_one(seed):
    generic, g = run(flow_append, seed)
    special, s = run(None, seed)
    assert s._kernel is not flow_append                 # it did specialize
    assert g.counters == s.counters
    assert g.counters["evictions"] > 0 and g.counters["flows_end"] > 0
    assert len(generic) == len(special)
    for a, b in zip(generic, special):
        np.testing.assert_array_equal(a.window, b.window)
        np.testing.assert_array_equal(a.keys, b.keys)
        for x, y in zip(a.banks, b.banks):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(a.cause, b.cause)


def test_module_text_writes_one_update_per_op():
    ops = StateLayout(SPECS[:3]).record_ops(2)[0]
    text = specialize.module_text(flow_append, ops, "kernel")
    assert "update_slot" not in text
    assert text.count("update_op(ri, ru, rf, th, match, i, ") == 3
    assert "def kernel(" in text


def test_no_writable_directory_keeps_the_generic_kernel(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setattr(kerneldir, "_kernel_dirs", lambda: [blocked / "kernels"])
    monkeypatch.setattr(specialize, "_KERNELS", {})
    ops = np.array([[99, 0, 1, 0]], np.int64)     # never specialized before
    assert specialize.specialized(flow_append, ops) is flow_append
