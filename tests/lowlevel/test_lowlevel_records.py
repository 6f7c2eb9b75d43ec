"""The low-level operator over record batches (`capture.records`): mask 0, string keys as
codes decoded to Arrow strings in the partial rows, string comparisons with literals and
between two fields of one link, float keys; checked against sums computed here in Python
over the text written, with table sizes from tiny (evictions) to large."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from capture.records import read_all_records
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from queries.planner import plan_text
from queries.schemafile import schema_from_text

SCHEMA = """
PROTOCOL base { uint systemTime get_system_time (increasing); }
PROTOCOL PAIRS (base) {
    uint t get_csv_uint_pos1 (increasing);
    string a get_csv_string_pos2;
    string b get_csv_string_pos3;
    float x get_csv_float_pos4;
    uint n get_csv_uint_pos5;
}
"""
WORDS = ["red", "green", "blue", "", "gr\u00fcn"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    lines = []
    for i in range(600):
        a, b = WORDS[i % 5], WORDS[(i * 3) % 5]
        lines.append(f"{i // 7},{a},{b},{(i % 4) * 0.5},{i}")
    path = tmp_path_factory.mktemp("rec") / "pairs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, [line.split(",") for line in lines]


def run_plan(query: str, path, slots: int) -> tuple[pa.Table, list[str]]:
    schema = schema_from_text(SCHEMA)
    plan = plan_text(query, ["l"], schema=schema, overrides={"aggregate_slots": str(slots)})
    lp = plan.queries[0].low[0]
    assert lp.record is not None
    op = LowLevelOperator(lp)
    rows = []
    batch = read_all_records(path, lp.record, "l")
    for start in range(0, len(batch), 50):
        rows += op.process(batch.slice(start, start + 50))
    last, _ = op.finish()
    rows += last
    states = [s.name for s in lp.subaggs]
    if lp.window is None:
        return pa.Table.from_batches(rows, schema=op.schema.schema), states
    return combine_partials(rows, op.schema), states


@pytest.mark.parametrize("slots", [1, 4, 1 << 12])
def test_string_and_float_keys(records, slots):
    path, fields = records
    table, (total,) = run_plan("select tb, a, x, sum(n) as s from [l].PAIRS "
                               "where a <> 'blue' group by t/10 as tb, a, x", path, slots)
    assert table.schema.field("a").type == pa.string()
    got = Counter()
    for row in table.to_pylist():
        got[(row["window"], row["a"], row["x"])] += row[total]
    want = Counter()
    for t, a, _, x, n in fields:
        if a != "blue":
            want[(int(t) // 10, a, float(x))] += int(n)
    assert got == want


def test_string_fields_compared_with_each_other_and_selected(records):
    path, fields = records
    table, _ = run_plan("select a, b, n from [l].PAIRS where a = b or b = 'gr\u00fcn'", path, 16)
    got = sorted((r["a"], r["b"], r["n"]) for r in table.to_pylist())
    want = sorted((a, b, int(n)) for _, a, b, _, n in fields if a == b or b == "gr\u00fcn")
    assert got == want and got
