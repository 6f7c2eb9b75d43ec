"""getlpmid's prefix tables and kernel (queries.prefixfile, lowlevel.lpm) against a brute-force longest match."""

from __future__ import annotations

import numpy as np
import pytest

from lowlevel import lpm
from queries import prefixfile
from tests.oracles.functions import addresses, longest_match, read_prefixes

MAPPED = 0xFFFF << 32


def _v4(rng, n: int, nets: list[int]) -> np.ndarray:
    """n IPv4 addresses, most inside one of `nets` (so that long prefixes match)."""
    out = rng.integers(0, 2**32, n, dtype=np.uint64)
    near = rng.random(n) < 0.8
    base = np.array(nets, np.uint64)[rng.integers(0, len(nets), n)]
    jitter = rng.integers(0, 2**12, n, dtype=np.uint64)
    return np.where(near, base ^ jitter, out)


def _prefix_file(tmp_path, rng, count: int, v6: bool) -> tuple[str, list[int], list[int]]:
    """A file of overlapping prefixes: nested chains around a few bases, and random ones."""
    lines = []
    v4_bases = [int(x) for x in rng.integers(0, 2**32, 8, dtype=np.uint64)]
    v6_bases = [(0x2001_0db8 << 96) | int(rng.integers(0, 2**62)) for _ in range(4)]
    seen = set()
    ident = 0
    for k in range(count):
        if v6 and k % 3 == 0:
            base = v6_bases[k % len(v6_bases)] ^ int(rng.integers(0, 2**20))
            length = int(rng.integers(0, 129))
            net = base >> (128 - length) << (128 - length) if length else 0
            text = f"{_v6_text(net)}/{length}"
            key = (6, net, length)
        else:
            base = v4_bases[k % len(v4_bases)] ^ int(rng.integers(0, 2**12))
            length = int(rng.integers(0, 33))
            net = base >> (32 - length) << (32 - length) if length else 0
            text = f"{_v4_text(net)}/{length}"
            key = (4, net, length)
        if key in seen:
            continue
        seen.add(key)
        ident += 1
        lines.append(f"{text}|{ident}")
    path = tmp_path / "prefixes.tbl"
    path.write_text("# generated\n\n" + "\n".join(lines) + "\n")
    return str(path), v4_bases, v6_bases


def _v4_text(v: int) -> str:
    return ".".join(str((v >> s) & 255) for s in (24, 16, 8, 0))


def _v6_text(v: int) -> str:
    import ipaddress

    return str(ipaddress.IPv6Address(v))


@pytest.mark.parametrize("count,v6,seed", [(1, False, 0), (40, False, 1), (300, False, 2),
                                           (300, True, 3), (2000, True, 4)])
def test_kernel_equals_brute_force(tmp_path, count, v6, seed):
    rng = np.random.default_rng(seed)
    path, v4_bases, v6_bases = _prefix_file(tmp_path, rng, count, v6)
    table = prefixfile.load_table(path)
    prefixes = read_prefixes(path)
    v4 = _v4(rng, 3000, v4_bases)
    got = lpm.lookup(table, v4)
    assert got.tolist() == [longest_match(prefixes, a) for a in addresses(v4)]
    # the same addresses as 128-bit `ip` values (IPv4-mapped), and IPv6 ones
    hi = np.zeros(len(v4), np.uint64)
    lo = np.uint64(MAPPED) | v4
    assert lpm.lookup(table, (hi, lo)).tolist() == got.tolist()
    if v6:
        n = 3000
        base = np.array(v6_bases, dtype=object)[rng.integers(0, len(v6_bases), n)]
        full = [int(b) ^ int(j) for b, j in zip(base, rng.integers(0, 2**24, n))]
        full[::7] = [int(x) << 64 for x in rng.integers(0, 2**63, len(full[::7]))]
        h = np.array([a >> 64 for a in full], np.uint64)
        l = np.array([a & (2**64 - 1) for a in full], np.uint64)
        assert lpm.lookup(table, (h, l)).tolist() == [longest_match(prefixes, a) for a in full]


def test_manual_table_and_edges(tmp_path):
    """The manual's table (12.3.2: host bits set in 1.2.3.4/29), no match, the extremes."""
    path = tmp_path / "manual.tbl"
    path.write_text("1.2.3.4/29|5\n2.3.4.5/29|6\n5.6.7.8/27|6\n9.10.10.11/29|7\n"
                    "11.11.11.11/27|7\n255.255.255.255/32|9\n::/0|3\n")
    table = prefixfile.load_table(str(path))
    ips = ["1.2.3.0", "1.2.3.7", "1.2.3.8", "5.6.7.31", "5.6.7.32", "0.0.0.0",
           "255.255.255.255", "255.255.255.254"]
    values = np.array([sum(int(p) << s for p, s in zip(ip.split("."), (24, 16, 8, 0)))
                       for ip in ips], np.uint64)
    assert lpm.lookup(table, values).tolist() == [5, 5, 3, 6, 3, 3, 9, 3]
    empty = tmp_path / "empty.tbl"
    empty.write_text("// nothing\n")
    assert lpm.lookup(prefixfile.load_table(str(empty)), values).tolist() == [-1] * len(ips)
    top = np.array([2**64 - 1], np.uint64)
    assert lpm.lookup(table, (top, top)).tolist() == [3]


@pytest.mark.parametrize("text,line,what", [
    ("10.0.0.0/8|1\n10.0.0.0|2\n", 2, "has no prefix length"),
    ("10.0.0.0/8|1\n\n10.0.0.0/33|2\n", 3, "is not an IPv4 or IPv6 prefix"),
    ("10.0.0.0/8 1\n", 1, "is not a prefix line"),
    ("10.0.0.0/8|x\n", 1, "is not a uint"),
    ("10.0.0.0/8|4294967296\n", 1, "is not a uint"),
    ("10.0.0.0/8|1\n10.1.0.0/8|2\n", 2, "given again with another id"),
])
def test_malformed_lines_name_file_and_line(tmp_path, text, line, what):
    path = tmp_path / "bad.tbl"
    path.write_text(text)
    with pytest.raises(prefixfile.PrefixFileError) as info:
        prefixfile.load_table(str(path))
    assert f"{path}:{line}:" in str(info.value)
    assert what in str(info.value)
    # the line is named, never shown: the file may hold what its reader must not see
    bad = text.splitlines()[line - 1]
    assert bad not in str(info.value)


def test_missing_file_and_reload(tmp_path):
    path = tmp_path / "t.tbl"
    with pytest.raises(prefixfile.PrefixFileError, match="not found"):
        prefixfile.load_table(str(path))
    path.write_text("10.0.0.0/8|1\n")
    v = np.array([10 << 24], np.uint64)
    assert lpm.getlpmid(v, str(path)).tolist() == [1]
    assert prefixfile.load_table(str(path)) is prefixfile.load_table(str(path))   # cached
    path.write_text("10.0.0.0/8|22\n")          # a new version is read again
    assert lpm.getlpmid(v, str(path)).tolist() == [22]
