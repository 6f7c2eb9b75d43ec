"""MIN and MAX over IPv6 values through `oopscope run` (low level, spool, Spark high level,
CSV sink) over a CSV record link with a schema: tumbling, sliding and landmark windows and a
query over a query's MIN/MAX, in one run. Expected rows are computed here with Python's
`ipaddress` over the values written; the values include addresses differing only in their
low half, halves at and above 2^63 (unsigned order) and a group of one row.
"""

from __future__ import annotations

import csv
import ipaddress
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.lowlevel.test_lowlevel_ip_min_max import SCHEMA
from tests.tools.resuming import run_here

QUERIES = """
DEFINE { query_name tumble; aggregate_slots 4; }
SELECT tb, k, count(*) AS n, min(v) AS lo, max(v) AS hi FROM [csv].V6 GROUP BY t/10 AS tb, k;

DEFINE { query_name slide; }
SELECT k, count(*) [RANGE 20 seconds, SLIDE 10 seconds, WA t] AS n, min(v) AS lo, max(v) AS hi
FROM [csv].V6 GROUP BY k;

DEFINE { query_name landmark; }
SELECT k, count(*) [RANGE ALL, SLIDE 10 seconds, WA t] AS n, min(v) AS lo, max(v) AS hi
FROM [csv].V6 GROUP BY k;

DEFINE { query_name fine; }
SELECT tb, k, min(v) AS lo, max(v) AS hi FROM [csv].V6 GROUP BY t/5 AS tb, k;

DEFINE { query_name coarse; }
SELECT tc, count(*) AS n, min(lo) AS lo, max(hi) AS hi FROM fine GROUP BY tb/2 AS tc
"""
NAMES = ("tumble", "slide", "landmark", "coarse")
KEYS = ["::1", "::2", "2001:db8::7", "ffff::1"]


def _rows() -> list[tuple[int, int, int]]:
    """(t, key, value) as ints, t increasing."""
    rows = [
        (0, KEYS[0], "2001:db8::8000:0:0:0"), (1, KEYS[0], "2001:db8::1"),
        (2, KEYS[0], "2001:db8::ffff:ffff:ffff:ffff"), (3, KEYS[1], "8000::"),
        (3, KEYS[1], "7fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), (4, KEYS[1], "ffff::1"),
        (4, KEYS[1], "::"), (5, "fe80::1", "fe80::dead:beef"),       # a group of one row
    ]
    out = [(t, int(ipaddress.IPv6Address(k)), int(ipaddress.IPv6Address(v)))
           for t, k, v in rows]
    rng = np.random.default_rng(12)
    halves = [0, 1, 2**63 - 1, 2**63, 2**63 + 1, 2**64 - 1, 0xFFFF_0A00_0001]
    for i in range(300):
        hi = halves[int(rng.integers(0, 6))] if i % 3 else int(rng.integers(0, 2**62)) * 4
        lo = halves[int(rng.integers(0, 7))] if i % 2 else int(rng.integers(0, 2**62)) * 4 + 3
        out.append((10 + i // 10, int(ipaddress.IPv6Address(KEYS[i % 4])), hi << 64 | lo))
    return out


def _agg(values: list[int]) -> tuple[int, int, int]:
    return len(values), min(values), max(values)


def _expected(rows) -> dict[str, dict]:
    by: dict[str, dict] = {n: defaultdict(list) for n in ("tumble", "slide", "fine")}
    for t, k, v in rows:
        by["tumble"][(t // 10, k)].append(v)
        by["fine"][(t // 5, k)].append(v)
        for end in (t // 10 * 10 + 10, t // 10 * 10 + 20):
            by["slide"][(end, k)].append(v)
    last_end = max(t for t, _, _ in rows) // 10 * 10 + 10
    landmark = {}
    for k in {k for _, k, _ in rows}:
        mine = [(t, v) for t, kk, v in rows if kk == k]
        for end in range(min(t for t, _ in mine) // 10 * 10 + 10, last_end + 1, 10):
            landmark[(end, k)] = _agg([v for t, v in mine if t < end])
    coarse: dict = defaultdict(list)
    for (tb, _), vs in by["fine"].items():
        coarse[tb // 2].append((min(vs), max(vs)))
    return {"tumble": {g: _agg(v) for g, v in by["tumble"].items()},
            "slide": {g: _agg(v) for g, v in by["slide"].items()},
            "landmark": landmark,
            "coarse": {(tc,): (len(p), min(a for a, _ in p), max(b for _, b in p))
                       for tc, p in coarse.items()}}


def _address(text: str) -> int:
    """An address as the CSV sink prints it (IPv4-mapped ones as IPv4) -> its 128-bit value."""
    if ":" in text:
        return int(ipaddress.IPv6Address(text))
    return 0xFFFF_0000_0000 | int(ipaddress.IPv4Address(text))


def _read(path: Path, name: str) -> tuple[dict, list[dict]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    first = {"tumble": "tb", "slide": "window_end", "landmark": "window_end", "coarse": "tc"}
    got = {}
    for r in rows:
        group = (int(r[first[name]]),) + ((_address(r["k"]),) if name != "coarse" else ())
        got[group] = (int(r["n"]), _address(r["lo"]), _address(r["hi"]))
    return got, rows


@pytest.mark.slow
def test_min_max_over_ipv6_in_every_window_kind(tmp_path):
    rows = _rows()
    data = tmp_path / "v6.csv"
    data.write_text("".join(f"{t},{ipaddress.IPv6Address(k)},{ipaddress.IPv6Address(v)}\n"
                            for t, k, v in rows))
    schema = tmp_path / "schema.txt"
    schema.write_text(SCHEMA)
    query = tmp_path / "q.gsql"
    query.write_text(QUERIES)
    outs = {n: tmp_path / f"{n}.csv" for n in NAMES}
    cmd = [sys.executable, "-m", "tools.cli", "run", str(query), "--schema", str(schema),
           "--link", f"csv={data}", "--format", "csv", "--no-progress",
           *[a for n in NAMES for a in ("--output", f"{n}={outs[n]}")]]
    run_here(cmd)
    want = _expected(rows)
    for name in NAMES:
        got, text_rows = _read(outs[name], name)
        assert got == want[name], name
    # formatted as IPv6 text, RFC 5952, like any IPv6 column
    _, text_rows = _read(outs["tumble"], "tumble")
    one = [r for r in text_rows if r["k"] == "::2" and r["tb"] == "0"]
    assert [(r["lo"], r["hi"]) for r in one] == [("::", "ffff::1")]
    single = [r for r in text_rows if r["k"] == "fe80::1"]
    assert [(r["n"], r["lo"], r["hi"]) for r in single] == [("1", "fe80::dead:beef",
                                                             "fe80::dead:beef")]
