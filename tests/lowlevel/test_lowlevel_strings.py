"""Strings in the low level (`lowlevel.strings`): ordering comparisons of record strings
(byte-wise, as GS-lite's str_compare), GS-lite's string functions and predicates over record
strings (computed once per distinct string, gathered by code) and over Arrow binary arrays
(payloads), each checked against plain Python over the texts written."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from capture.records import read_all_records
from capture.strings import StringTable
from lowlevel import strings
from lowlevel.evaluate import evaluate
from lowlevel.operator import LowLevelOperator
from lowlevel.partials import combine_partials
from lowlevel.values import StringCodes
from queries.planner import plan_text
from queries.schemafile import schema_from_text

SCHEMA = """
PROTOCOL base { uint systemTime get_system_time (increasing); }
PROTOCOL PAIRS (base) {
    uint t get_csv_uint_pos1 (increasing);
    string a get_csv_string_pos2;
    string b get_csv_string_pos3;
    uint n get_csv_uint_pos4;
}
"""
WORDS = ["red", "green", "blue", "", "gr\u00fcn", "GET /index.html", "Host: x.org", "b", "ab"]


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    lines = []
    for i in range(700):
        a, b = WORDS[i % len(WORDS)], WORDS[(i * 5 + i // 9) % len(WORDS)]
        lines.append(f"{i // 7},{a},{b},{i}")
    path = tmp_path_factory.mktemp("rec") / "pairs.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, [line.split(",") for line in lines]


def run_plan(query: str, path, slots: int = 64) -> pa.Table:
    schema = schema_from_text(SCHEMA)
    plan = plan_text(query, ["l"], schema=schema, overrides={"aggregate_slots": str(slots)})
    lp = plan.queries[0].low[0]
    op = LowLevelOperator(lp)
    rows = []
    batch = read_all_records(path, lp.record, "l")
    for start in range(0, len(batch), 50):
        rows += op.process(batch.slice(start, start + 50))
    last, _ = op.finish()
    rows += last
    return combine_partials(rows, op.schema)


def counts(table: pa.Table) -> Counter:
    """COUNT(*) per t (the increasing `t` is the pane: the `window` column)."""
    state = next(c for c in table.column_names if c.startswith("cnt"))
    out: Counter = Counter()
    for r in table.to_pylist():
        out[r["window"]] += r[state]
    return out


def key(s: str) -> bytes:
    return s.encode()


@pytest.mark.parametrize("op", ["<", ">", "<=", ">="])
@pytest.mark.parametrize("slots", [4, 4096])
def test_order_comparisons_of_two_fields_and_a_literal(records, op, slots):
    path, rows = records
    q = (f"SELECT t, COUNT(*) AS cnt FROM l.PAIRS WHERE a {op} b AND b {op} 'blue' "
         f"GROUP BY t")
    fn = {"<": lambda x, y: x < y, ">": lambda x, y: x > y, "<=": lambda x, y: x <= y,
          ">=": lambda x, y: x >= y}[op]
    want: Counter = Counter()
    for t, a, b, _ in rows:
        if fn(key(a), key(b)) and fn(key(b), b"blue"):
            want[int(t)] += 1
    assert counts(run_plan(q, path, slots)) == want


def test_literal_on_the_left_flips(records):
    path, rows = records
    got = counts(run_plan("SELECT t, COUNT(*) AS cnt FROM l.PAIRS WHERE 'green' < a "
                          "GROUP BY t", path))
    want = Counter(int(t) for t, a, _, _ in rows if b"green" < key(a))
    assert got == want


GSLITE = [
    ("str_exists_substr[a, 'e']", lambda a, b: "e" in a),
    ("str_compare[a, b]", lambda a, b: a == b),
    ("str_match_start[a, 'gr']", lambda a, b: a.startswith("gr")),
    ("str_match_offset[1, 'ET', a]", lambda a, b: key(a)[1:3] == b"ET"),
    ("byte_match_offset[0, 98, a]", lambda a, b: key(a)[:1] == b"b"),
    ("byte_match_reverse_offset[1, 110, a]", lambda a, b: key(a)[-1:] == b"n"),
    ("str_regex_match(a, '^[a-z]+$') = 1", lambda a, b: re.search(r"^[a-z]+$", a) is not None),
    ("str_partial_regex_match(a, 'l', 2) = 1", lambda a, b: "l" in key(a)[:2].decode()),
    ("str_exists_substr(a, b) = 1", lambda a, b: b in a),
    ("str_truncate(a, 2) = 'gr'", lambda a, b: key(a)[:2] == b"gr"),
    ("str_truncate(a, 2) < str_truncate(b, 2)", lambda a, b: key(a)[:2] < key(b)[:2]),
    ("str_extract_regex_null(a, '[a-z]+') = 'ost'", lambda a, b: a.startswith("Host")),
]


@pytest.mark.parametrize("cond,check", GSLITE, ids=[c for c, _ in GSLITE])
def test_gslite_functions_over_record_strings(records, cond, check):
    path, rows = records
    q = f"SELECT t, COUNT(*) AS cnt FROM l.PAIRS WHERE {cond} GROUP BY t"
    want = Counter(int(t) for t, a, b, _ in rows if check(a, b))
    assert counts(run_plan(q, path)) == want


def test_each_distinct_string_is_evaluated_once(records, monkeypatch):
    path, rows = records
    seen = []
    real = strings._apply

    def spy(name, s, constants, n, args):
        seen.append(len(s))
        return real(name, s, constants, n, args)

    monkeypatch.setattr(strings, "_apply", spy)
    run_plan("SELECT t, COUNT(*) AS cnt FROM l.PAIRS WHERE str_regex_match[a, 'e'] "
             "GROUP BY t", path)
    assert seen and max(seen) <= len(WORDS)


PAYLOADS = [b"GET / HTTP/1.1\r\nHost: a.example\r\n\r\n", b"\xe3\x10\x00\x00\x00rest",
            b"", b"$MyNick bob|", b"\x13BitTorrent protocol", b"x" * 40, b"\x00\x00\x00\x07ab"]


@pytest.mark.parametrize("call,check", [
    (("str_regex_match", [None, None], [None, "^Host: [a-z.]+"]),
     lambda p: re.search(rb"(?m)^Host: [a-z.]+", p) is not None and len(p) > 0),
    (("str_match_offset", [None, None, None], [1, "BitTorrent protocol", None]),
     lambda p: p[1:20] == b"BitTorrent protocol"),
    (("byte_match_offset", [None, None, None], [0, 0xE3, None]), lambda p: p[:1] == b"\xe3"),
    (("byte_match_reverse_offset", [None, None, None], [1, 124, None]),
     lambda p: p[-1:] == b"|"),
    (("net_word_match_offset", [None, None, None], [0, 7, None]),
     lambda p: len(p) >= 4 and int.from_bytes(p[:4], "big") == 7),
    (("little_endian_word_match_offset", [None, None, None], [1, 16, None]),
     lambda p: len(p) >= 5 and int.from_bytes(p[1:5], "little") == 16),
    (("str_exists_substr", [None, None], [None, "protocol"]), lambda p: b"protocol" in p),
])
def test_payload_functions_over_a_binary_array(call, check):
    name, args, constants = call
    data = pa.array(PAYLOADS, pa.binary())
    pos = {"str_regex_match": 0, "str_exists_substr": 0}.get(name, 2)
    args = list(args)
    args[pos] = data
    got = strings.call(name, args, constants, len(PAYLOADS))
    assert got.tolist() == [int(check(p)) for p in PAYLOADS]


def test_word_match_with_a_value_per_row():
    data = pa.array(PAYLOADS, pa.binary())
    lengths = np.array([len(p) for p in PAYLOADS], np.uint64)
    got = strings.call("little_endian_word_match_offset",
                       [None, lengths.astype(np.int64) - 5 + 16 - 11, data], [1, None, None],
                       len(PAYLOADS))
    want = [int(len(p) >= 5 and int.from_bytes(p[1:5], "little") == len(p) - 5 + 16 - 11)
            for p in PAYLOADS]
    assert got.tolist() == want


def test_ranks_follow_the_growing_table():
    t = StringTable()
    first = t.intern_array(pa.array(["m", "c", "x"]))
    r1 = strings.ranks(t).copy()
    assert [r1[c] for c in first] == [1, 0, 2]
    t.intern_array(pa.array(["a", "n"]))
    r2 = strings.ranks(t)
    order = sorted(range(len(t)), key=lambda c: t.text(c).encode())
    assert [int(r2[c]) for c in order] == list(range(len(t)))


def test_codes_compare_with_an_object_array():
    t = StringTable()
    codes = StringCodes(t.intern_array(pa.array(["b", "a", "c"])), t)
    other = np.array(["a", "a", "d"], dtype=object)
    assert strings.compare("<", codes, other).tolist() == [False, False, True]


def test_evaluate_keeps_string_results_as_codes(records):
    path, rows = records
    schema = schema_from_text(SCHEMA)
    plan = plan_text("SELECT str_truncate(a, 3) AS p FROM l.PAIRS", ["l"], schema=schema)
    lp = plan.queries[0].low[0]
    batch = read_all_records(path, lp.record, "l")
    v = evaluate(lp.projections[0].expr, batch)
    assert isinstance(v, StringCodes)
    assert list(v.decode()) == [key(a)[:3].decode("utf-8", "replace") for _, a, _, _ in rows]


@pytest.mark.parametrize("slots", [2, 8, 4096])
@pytest.mark.parametrize("step", [7, 50, 700])
def test_min_max_over_strings_as_the_table_grows(tmp_path, slots, step):
    """New strings arrive batch after batch, many between old ones: the states move to the
    new ranks and the split (low level + combine) equals a direct min/max per group."""
    rng = np.random.default_rng(slots * 1000 + step)
    letters = list("abcxyzAB\u00e9")
    lines, want_min, want_max = [], {}, {}
    for i in range(700):
        word = "".join(rng.choice(letters, size=int(rng.integers(0, 5))))
        t, g = i // 100, int(rng.integers(0, 5))
        lines.append(f"{t},{word},g{g},{i}")
        k = (t, f"g{g}")
        want_min[k] = min(want_min.get(k, word), word, key=str.encode)
        want_max[k] = max(want_max.get(k, word), word, key=str.encode)
    path = tmp_path / "grow.csv"
    path.write_text("\n".join(lines) + "\n")
    schema = schema_from_text(SCHEMA)
    plan = plan_text("SELECT t, b, MIN(a) AS lo, MAX(a) AS hi FROM l.PAIRS GROUP BY t, b",
                     ["l"], schema=schema, overrides={"aggregate_slots": str(slots)})
    lp = plan.queries[0].low[0]
    assert [s.dtype for s in lp.subaggs] == ["string", "string"]
    op = LowLevelOperator(lp)
    batch = read_all_records(path, lp.record, "l")
    rows = []
    for start in range(0, len(batch), step):
        rows += op.process(batch.slice(start, start + step))
    rows += op.finish()[0]
    table = combine_partials(rows, op.schema)
    lo, hi = (s.name for s in lp.subaggs)
    got_min = {(r["window"], r["b"]): r[lo] for r in table.to_pylist()}
    got_max = {(r["window"], r["b"]): r[hi] for r in table.to_pylist()}
    assert got_min == want_min
    assert got_max == want_max


def test_a_literal_searched_in_a_column_of_needles():
    t = StringTable()
    needles = StringCodes(t.intern_array(pa.array(["b", "zz", "a", ""])), t)
    got = strings.call("str_exists_substr", [None, needles], ["abc", None], 4)
    assert got.tolist() == [1, 0, 1, 1]


def test_payload_equality_and_in_against_literals():
    from capture.batch import PacketBatch
    from queries import expressions as E

    payloads = [b"GET", b"", b"POST", b"\xff"]
    batch = PacketBatch.empty("l", len(payloads))
    batch.payload = pa.array(payloads, pa.binary())
    field = E.Field(name="TCP_data", type="string", columns=("payload",))
    eq = E.Binary(op="=", left=field, right=E.Literal(value="GET", kind="string"))
    lt = E.Binary(op="<", left=E.Literal(value="GET", kind="string"), right=field)
    within = E.In(this=field, items=[E.Literal(value="POST", kind="string"),
                                     E.Literal(value="", kind="string")])
    assert evaluate(eq, batch).tolist() == [True, False, False, False]
    assert evaluate(lt, batch).tolist() == [p > b"GET" for p in payloads]
    assert evaluate(within, batch).tolist() == [False, True, True, False]
