"""The radix order of result rows (highlevel.sorting) equals Arrow's stable multi-key sort."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from highlevel.sorting import sort_indices


def _arrow(table, keys):
    return np.asarray(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000), nkeys=st.integers(1, 5),
       spread=st.sampled_from([1, 3, 300, 1 << 40, 1 << 62]))
def test_radix_order_equals_arrow_s(seed, n, nkeys, spread):
    rng = np.random.default_rng(seed)
    cols = {}
    for k in range(nkeys):
        kind = rng.integers(0, 4)
        if kind == 0:        # constant (an IPv4-mapped address's high half)
            v = np.full(n, rng.integers(-5, 5), np.int64)
        elif kind == 1:      # few values: ties for the next keys to break
            v = rng.integers(-spread, spread, n, dtype=np.int64) % 4 - 2
        elif kind == 2:      # the int64 extremes
            v = rng.choice(np.array([-(1 << 63), -1, 0, 1, (1 << 63) - 1], np.int64), n)
        else:
            v = rng.integers(-spread, spread, n, dtype=np.int64)
        cols[f"k{k}"] = pa.array(v, pa.int64())
    cols["payload"] = pa.array(np.arange(n))
    table = pa.table(cols)
    keys = [f"k{k}" for k in range(nkeys)]
    got = sort_indices(table, keys)
    assert got.tolist() == _arrow(table, keys).tolist()


def test_chunked_columns_and_other_types_fall_back_equal():
    a = pa.chunked_array([pa.array([3, 1, 2], pa.int64()), pa.array([1, 3], pa.int64())])
    b = pa.chunked_array([pa.array([0, 0, 0], pa.int64()), pa.array([1, -1], pa.int64())])
    t = pa.table({"a": a, "b": b})
    assert sort_indices(t, ["a", "b"]).tolist() == _arrow(t, ["a", "b"]).tolist() == \
        [1, 3, 2, 4, 0]
    # strings, floats and nulls: Arrow's sort (nulls last)
    t = pa.table({"s": ["b", "a", None, "a"], "x": pa.array([1, None, 3, 0], pa.int64())})
    for keys in (["s", "x"], ["x", "s"]):
        assert sort_indices(t, keys).tolist() == _arrow(t, keys).tolist()


@pytest.mark.parametrize("n", [0, 1, 2])
def test_tiny_tables(n):
    t = pa.table({"a": pa.array(np.arange(n)[::-1].copy(), pa.int64())})
    assert sort_indices(t, ["a"]).tolist() == list(range(n))[::-1]
