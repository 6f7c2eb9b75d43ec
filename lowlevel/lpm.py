"""Longest-prefix match for GS-lite's `getlpmid(ip, 'prefix_file')`: the lookup kernel.

`getlpmid` returns the id of the longest prefix of a prefix file holding the address, -1 when
none does. The file is read into a table of sorted disjoint address intervals by
`queries.prefixfile` (cached per version of the file); `lookup` is a binary search per
address in a Numba kernel.
"""

from __future__ import annotations

import numpy as np

from common.jit import ngjit
from queries.prefixfile import MAPPED, PrefixTable, load_table

U64 = np.uint64


@ngjit
def lookup_kernel(starts_hi, starts_lo, ids, hi, lo, out):
    """out[i] = the id of the interval holding (hi[i], lo[i]): the last start not above it
    (interval 0 starts at address 0, so there always is one)."""
    m = len(ids)
    for i in range(len(hi)):
        h = hi[i]
        l = lo[i]
        a = 0
        b = m
        while b - a > 1:
            mid = (a + b) >> 1
            sh = starts_hi[mid]
            if sh < h or (sh == h and starts_lo[mid] <= l):
                a = mid
            else:
                b = mid
        out[i] = ids[a]


def lookup(table: PrefixTable, addr) -> np.ndarray:
    """The id of each address (int64, -1 where no prefix holds it): `addr` is a uint64 array
    of IPv4 addresses (the `ipv4` type) or a (hi, lo) pair of uint64 arrays (the `ip` type)."""
    if isinstance(addr, tuple):
        hi = np.asarray(addr[0], U64)
        lo = np.asarray(addr[1], U64)
    else:
        lo = (np.asarray(addr, U64) & U64(0xFFFF_FFFF)) | U64(MAPPED)
        hi = np.zeros(len(lo), U64)
    out = np.empty(len(lo), np.int64)
    lookup_kernel(table.starts_hi, table.starts_lo, table.ids, hi, lo, out)
    return out


def getlpmid(addr, path: str) -> np.ndarray:
    """`getlpmid(addr, 'path')` over an evaluated address column."""
    return lookup(load_table(path), addr)
