"""Outer joins as GS-lite defines them (issue 36), through `oopscope run` over CSV records:
an unmatched row of a preserved side is output once, the absent side's columns empty except
those the join's equalities equate with a column of the present side (its key columns, the
temporal attribute), which take the present side's value. Expected rows are computed here
from the records written, by a plain nested-loop join."""

from __future__ import annotations

import csv
import sys
from collections import Counter

from tests.tools.resuming import run_here

SCHEMA = """
PROTOCOL base {
    uint systemTime get_system_time (low_cardinality, required, increasing, snap_len 0);
}
PROTOCOL CSV_COMPLEX (base) {
    string strField1 get_csv_string_pos1;
    string strField2 get_csv_string_pos2;
    uint intField get_csv_uint_pos3;
}
"""
RECORDS = [("ABC", "CSV", 17), ("ABC", "VSC", 21), ("ABC", "xyz", 18), ("ZYX", "DEF", 21),
           ("XYZ", "DEF", 11), ("abc", "DEF", 19), ("abc", "def", 15), ("CSV", "abc", 16),
           ("ABC", "DEF", 21)]
SIDES = """
DEFINE { query_name 'side_a'; }
SELECT systemTime, strField1, strField2, intField FROM [csv].CSV_COMPLEX
WHERE strField1 = 'ABC';
DEFINE { query_name 'side_b'; }
SELECT systemTime, strField1, strField2, intField FROM [csv].CSV_COMPLEX
WHERE strField2 = 'DEF';
"""
JOIN = """
DEFINE {{ query_name '{name}'; }}
SELECT A.systemTime AS ta, A.strField1 AS a1, A.strField2 AS a2, A.intField AS ai,
       B.systemTime AS tb, B.strField1 AS b1, B.strField2 AS b2, B.intField AS bi
{join} FROM side_a A, side_b B
WHERE A.intField = B.intField AND A.systemTime = B.systemTime;
"""
KINDS = {"inner": "INNER_JOIN", "left": "LEFT_OUTER_JOIN", "right": "RIGHT_OUTER_JOIN",
         "full": "OUTER_JOIN"}


def expected(kind: str) -> Counter:
    """(a1, a2, ai, b1, b2, bi) rows of the join, GS-lite's way (module docstring)."""
    a = [r for r in RECORDS if r[0] == "ABC"]
    b = [r for r in RECORDS if r[1] == "DEF"]
    out = Counter()
    for ra in a:
        for rb in b:
            if ra[2] == rb[2]:
                out[(ra[0], ra[1], str(ra[2]), rb[0], rb[1], str(rb[2]))] += 1
    if kind in ("left", "full"):
        for ra in a:
            if not any(ra[2] == rb[2] for rb in b):
                out[(ra[0], ra[1], str(ra[2]), "", "", str(ra[2]))] += 1
    if kind in ("right", "full"):
        for rb in b:
            if not any(ra[2] == rb[2] for ra in a):
                out[("", "", str(rb[2]), rb[0], rb[1], str(rb[2]))] += 1
    return out


def test_outer_joins_fill_the_absent_sides_keys_from_the_present_side(tmp_path):
    (tmp_path / "schema.txt").write_text(SCHEMA)
    (tmp_path / "records.csv").write_text("".join(f"{x}|{y}|{n}\n" for x, y, n in RECORDS))
    query = tmp_path / "joins.gsql"
    query.write_text(SIDES + "".join(JOIN.format(name=k, join=j) for k, j in KINDS.items()))
    outputs = []
    for kind in KINDS:
        outputs += ["--output", f"{kind}={tmp_path / (kind + '.csv')}"]
    cmd = [sys.executable, "-m", "tools.cli", "run", str(query), "--schema",
           str(tmp_path / "schema.txt"), "--link", f"csv={tmp_path / 'records.csv'}",
           "--csv-separator", "pipe", "--format", "csv", "--no-progress", *outputs]
    run_here(cmd)
    for kind in KINDS:
        with open(tmp_path / f"{kind}.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        got = Counter((r["a1"], r["a2"], r["ai"], r["b1"], r["b2"], r["bi"]) for r in rows)
        assert got == expected(kind), kind
        # the temporal attribute is an equality of the join too: both sides carry it
        assert all(r["ta"] and r["ta"] == r["tb"] for r in rows), kind
    # the test data exercises both preserved sides
    assert sum(expected("full").values()) > sum(expected("inner").values()) + 1
