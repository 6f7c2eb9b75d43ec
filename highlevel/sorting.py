"""The order of a stage's result rows: (window, keys) ascending, by an LSD radix sort of int64 keys.

`Stage._emit` sorts every closed batch by the window and the group keys. Arrow's multi-key
table sort compares rows one key after another: 1.1 s for 3.4M flow records of 10 keys. Flow
records' keys are int64 columns (the window, address halves, ports, protocol, flow id) whose
bytes are mostly constant within a batch (the high halves of IPv4-mapped addresses, the top
bytes of windows and ports), so a least-significant-digit radix sort that skips every byte
position holding one value in all rows does a handful of passes. It is stable, so it equals
Arrow's order (ties keep input order). Keys of other types, or with nulls, go to Arrow's sort.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lowlevel.jit import ngjit

_SIGN = np.uint64(1 << 63)


def sort_indices(table: pa.Table, keys: list[str]) -> np.ndarray:
    """Row indices of `table` sorted ascending by `keys` (first key most significant), ties
    in input order."""
    columns = [table.column(k) for k in keys]
    if table.num_rows < 2 or any(not pa.types.is_int64(c.type) or c.null_count
                                 for c in columns):
        return np.asarray(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
    # a key with one value in every row orders nothing (the window of a batch closing one
    # window, the high halves of IPv4-mapped addresses): left out
    values = [np.asarray(c.combine_chunks()) for c in columns]
    values = [v for v in values if v.min() != v.max()]
    if not values:
        return np.arange(table.num_rows)
    # signed order as unsigned: flip the sign bit; most significant key first
    words = np.empty((len(values), table.num_rows), np.uint64)
    for row, v in zip(words, values):
        np.bitwise_xor(v.view(np.uint64), _SIGN, out=row)
    return radix_argsort(words)


@ngjit
def radix_argsort(words):
    """Stable argsort of the rows of `words` ([keys, n] uint64, key 0 most significant): LSD
    radix by bytes over (key, index) pairs, skipping byte positions constant in every row."""
    nk, n = words.shape
    idx = np.arange(n)
    tmp_idx = np.empty(n, np.int64)
    cur = np.empty(n, np.uint64)
    tmp = np.empty(n, np.uint64)
    counts = np.zeros((8, 256), np.int64)
    for key in range(nk - 1, -1, -1):
        col = words[key]
        for i in range(n):                 # this key's values in the current order
            cur[i] = col[idx[i]]
        counts[:, :] = 0
        for i in range(n):
            v = cur[i]
            for b in range(8):
                counts[b, (v >> np.uint64(8 * b)) & np.uint64(255)] += 1
        for b in range(8):
            if counts[b].max() == n:
                continue                   # one value at this byte in every row: no pass
            start = 0
            for d in range(256):
                c = counts[b, d]
                counts[b, d] = start
                start += c
            shift = np.uint64(8 * b)
            for i in range(n):
                d = (cur[i] >> shift) & np.uint64(255)
                j = counts[b, d]
                counts[b, d] = j + 1
                tmp[j] = cur[i]
                tmp_idx[j] = idx[i]
            cur, tmp = tmp, cur
            idx, tmp_idx = tmp_idx, idx
    return idx
