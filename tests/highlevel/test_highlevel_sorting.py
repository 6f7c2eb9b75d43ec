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


_EXTREMES = np.array([-(1 << 63), -(1 << 63) + 1, -1, 0, 1, (1 << 63) - 2, (1 << 63) - 1],
                     np.int64)


def _key_column(rng, kind, n):
    """An int64 key column of one of several shapes: packed widths from 1 to 64 bits (so the
    packed keys cross word boundaries), ties, constants, the int64 extremes."""
    if kind == "constant":
        return np.full(n, rng.choice(_EXTREMES), np.int64)
    if kind == "extremes":
        return rng.choice(_EXTREMES, n)
    if kind == "ties":                   # few values anywhere in the int64 range
        return rng.choice(rng.integers(-(1 << 63), (1 << 63) - 1, 3, endpoint=True), n)
    if kind == "boundary":               # 7 and 8: subtracting the minimum saves bits
        return rng.choice(np.array([7, 8, 15, 16], np.int64), n)
    bits = int(rng.integers(1, 65))      # kind "bits": a random base plus `bits` random bits
    base = int(rng.integers(-(1 << 63), (1 << 63) - 1, endpoint=True))
    low = max(-(1 << 63), min(base, (1 << 63) - (1 << bits)))
    span = rng.integers(0, 1 << 62, n, dtype=np.uint64) * np.uint64(4) + \
        rng.integers(0, 4, n, dtype=np.uint64)
    if bits < 64:
        span &= np.uint64((1 << bits) - 1)
    return (np.uint64(low & ((1 << 64) - 1)) + span).view(np.int64)


_KINDS = ["constant", "extremes", "ties", "boundary", "bits", "bits", "bits"]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([0, 1, 2, 3, 25, 200, 3000]),
       kinds=st.lists(st.sampled_from(_KINDS), min_size=1, max_size=9))
def test_packed_keys_of_every_width_order_equals_arrow_s(seed, n, kinds):
    rng = np.random.default_rng(seed)
    table = pa.table({f"k{i}": pa.array(_key_column(rng, kind, n), pa.int64())
                      for i, kind in enumerate(kinds)})
    keys = list(table.column_names)
    assert sort_indices(table, keys).tolist() == _arrow(table, keys).tolist()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.sampled_from([5000, 40000]),
       distinct=st.sampled_from([1, 2, 30, 1000]))
def test_large_tables_with_ties_in_later_words(seed, n, distinct):
    """Tied rows reach the later key words in big segments (gathered) and in small ones
    (compared pair by pair); whole duplicate rows keep input order."""
    rng = np.random.default_rng(seed)
    cols = {}
    for i in range(int(rng.integers(2, 7))):
        values = rng.integers(-(1 << 63), (1 << 63) - 1, distinct, endpoint=True)
        cols[f"k{i}"] = pa.array(rng.choice(values, n), pa.int64())
    table = pa.table(cols)
    keys = list(table.column_names)
    assert sort_indices(table, keys).tolist() == _arrow(table, keys).tolist()


@pytest.mark.parametrize("v6_share", [0.0, 0.1])
def test_flow_records_order_equals_arrow(v6_share):
    """Keys like a NetFlow stage's: window, address halves (IPv4-mapped or IPv6), ports,
    protocol, flow id."""
    rng = np.random.default_rng(7)
    n = 60000

    def address():
        hi = np.zeros(n, np.int64)
        lo = np.int64(0x0000FFFF00000000) | rng.integers(0, 1 << 32, n)
        v6 = rng.random(n) < v6_share
        hi[v6] = rng.integers(-(1 << 63), (1 << 63) - 1, v6.sum(), endpoint=True)
        lo[v6] = rng.integers(-(1 << 63), (1 << 63) - 1, v6.sum(), endpoint=True)
        lo[rng.random(n) < 0.3] = lo[0]          # a busy host: ties for the next keys
        return hi, lo

    src_hi, src_lo = address()
    dst_hi, dst_lo = address()
    table = pa.table({
        "tb": 28_000_000 + rng.integers(0, 10, n), "src_hi": src_hi, "src_lo": src_lo,
        "dst_hi": dst_hi, "dst_lo": dst_lo, "sport": rng.integers(0, 1 << 16, n),
        "dport": rng.choice(np.array([53, 80, 443]), n), "proto": rng.choice([1, 6, 17], n),
        "flow": (np.int64(3) << 40) | rng.permutation(n)})
    keys = table.column_names
    assert sort_indices(table, keys).tolist() == _arrow(table, keys).tolist()
    # a slice of one chunk (offset buffers) and many chunks
    part = table.slice(1000, 20000)
    assert sort_indices(part, keys).tolist() == _arrow(part, keys).tolist()
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=7000))
    assert sort_indices(chunked, keys).tolist() == _arrow(chunked, keys).tolist()
