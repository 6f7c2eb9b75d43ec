"""`ip_text_arrow` (a Numba kernel writing the Arrow string buffers) = the text `ipaddress` writes.

Addresses come as int64 bit patterns of their uint64 halves; IPv4-mapped ones are dotted quads,
the others RFC 5952 (the first longest run of two or more zero groups as `::`); a row is null
where either half is.
"""

from __future__ import annotations

import ipaddress

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from highlevel import finalize
from highlevel.finalize import ip_text_arrow

MAPPED = 0xFFFF << 32


def expected(value: int | None) -> str | None:
    if value is None:
        return None
    address = ipaddress.IPv6Address(value)
    return str(address.ipv4_mapped or address)


def halves(values: list, null_side: list | None = None) -> tuple[pa.Array, pa.Array]:
    """(hi, lo) int64 arrays of 128-bit values; a None value is null in the half `null_side`
    names ("hi", "lo" or "both")."""
    def signed(v: int) -> int:
        return v - (1 << 64) if v >= 1 << 63 else v

    sides = null_side or ["both"] * len(values)
    hi = [None if v is None and s != "lo" else signed((v or 0) >> 64)
          for v, s in zip(values, sides)]
    lo = [None if v is None and s != "hi" else signed((v or 0) & ((1 << 64) - 1))
          for v, s in zip(values, sides)]
    return pa.array(hi, pa.int64()), pa.array(lo, pa.int64())


def groups(*gs: int) -> int:
    return int("".join(f"{g:04x}" for g in gs), 16)


def check(values: list, null_side: list | None = None) -> None:
    got = ip_text_arrow(*halves(values, null_side))
    got.validate(full=True)
    assert got.type == pa.string()
    assert got.to_pylist() == [expected(v) for v in values]
    assert got.null_count == sum(v is None for v in values)


def test_edge_cases():
    cases = {
        0: "::", 1: "::1", 1 << 112: "1::", (1 << 128) - 1: ":".join(["ffff"] * 8),
        groups(0x2001, 0xDB8, 0, 0, 1, 0, 0, 1): "2001:db8::1:0:0:1",   # equal runs: leftmost
        groups(1, 0, 1, 0, 0, 1, 0, 1): "1:0:1::1:0:1",                 # a lone 0 stays
        groups(1, 0, 0, 1, 0, 0, 0, 1): "1:0:0:1::1",                   # the longest run wins
        groups(1, 0, 1, 1, 1, 1, 1, 1): "1:0:1:1:1:1:1:1",
        groups(0, 0, 1, 1, 1, 1, 0, 0): "::1:1:1:1:0:0",
        groups(0xABCD, 0x10, 0x100, 0x1000, 0xF, 0, 0, 0): "abcd:10:100:1000:f::",
        MAPPED | 0x01020304: "1.2.3.4", MAPPED: "0.0.0.0", MAPPED | 0xFFFFFFFF: "255.255.255.255",
        MAPPED | 0x0A00FF09: "10.0.255.9",
        0x01020304: "::102:304",                                        # IPv4-compatible
        (0xFFFE << 32) | 0x01020304: "::fffe:102:304",
        (1 << 64) | MAPPED | 0x01020304: "::1:0:ffff:102:304",          # hi != 0: not mapped
    }
    assert [expected(v) for v in cases] == list(cases.values())
    check(list(cases))


def test_nulls_from_either_half():
    check([None, 1, None, MAPPED | 7, None], ["hi", "both", "lo", "both", "both"])
    check([None] * 3)
    check([])


def test_sliced_input_and_pieces(monkeypatch):
    values = [groups(*np.random.default_rng(s).integers(0, 3, 8)) for s in range(40)]
    values += [MAPPED | s * 0x01010101 for s in range(20)] + [None] * 5
    hi, lo = halves(values)
    got = ip_text_arrow(hi.slice(7), lo.slice(7))
    assert got.to_pylist() == [expected(v) for v in values[7:]]
    monkeypatch.setattr(finalize, "_IP_TEXT_ROWS", 6)   # columns beyond int32 offsets: pieces
    got = ip_text_arrow(hi, lo)
    got.validate(full=True)
    assert got.to_pylist() == [expected(v) for v in values]


GROUP = st.one_of(st.just(0), st.integers(1, 0xF), st.integers(0, 0xFFFF))
ADDRESS = st.one_of(
    st.lists(GROUP, min_size=8, max_size=8).map(lambda gs: groups(*gs)),   # runs of zeros
    st.integers(0, (1 << 32) - 1).map(lambda v: MAPPED | v),               # IPv4-mapped
    st.integers(0, (1 << 128) - 1))
ROW = st.one_of(st.tuples(ADDRESS, st.just("both")),
                st.tuples(st.none(), st.sampled_from(["hi", "lo", "both"])))


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, max_size=60))
def test_matches_ipaddress(rows):
    check([v for v, _ in rows], [s for _, s in rows])
