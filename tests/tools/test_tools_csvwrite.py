"""The Numba CSV writer (`tools.results.csvwrite`) writes the bytes of `pyarrow.csv.write_csv`.

Random tables of every integer width (extremes included), strings (empty, non-ASCII UTF-8,
lengths around the kernel's 8-byte copies) and nulls, over 0, 1 and many rows and chunks,
sliced and multi-chunk; and `QueryOutput` writing CSV through it or, for floats, booleans and
strings that need quoting, through pyarrow.
"""

from __future__ import annotations

import csv
import io
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tools.results import csvwrite
from tools.results.appended import QueryOutput

INTEGERS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(),
            pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
WORDS = ["", "a", "é", "日本語", "1.2.3.4", "2001:db8::1", "abcdefg", "abcdefgh", "abcdefghi",
         "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "x" * 100, "ünïcödé-ʃtrɪŋ"]


def pyarrow_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False, quoting_style="none"))
    return out.getvalue()


def kernel_bytes(table: pa.Table, chunk_rows: int = csvwrite.CHUNK_ROWS) -> bytes:
    out = io.BytesIO()
    csvwrite.write_csv_rows(table, out, chunk_rows)
    return out.getvalue()


def integers(t: pa.DataType, n: int, rng) -> pa.Array:
    """Random values of type t: extremes, powers of ten and their neighbours, anything between."""
    info = np.iinfo(t.to_pandas_dtype())
    special = [info.min, info.max, 0, 1, info.min + 1, info.max - 1]
    special += [s * 10**k + d for k in range(20) for s in (1, -1) for d in (-1, 0, 1)
                if info.min <= s * 10**k + d <= info.max]
    pick = rng.random(n)
    values = rng.integers(info.min, info.max, n, dtype=t.to_pandas_dtype(), endpoint=True)
    values = np.where(pick < 0.3, rng.choice(np.array(special, values.dtype), n), values)
    return pa.array(values, t, mask=rng.random(n) < 0.1)


def strings(n: int, rng) -> pa.Array:
    values = [WORDS[k] for k in rng.integers(0, len(WORDS), n)]
    return pa.array([None if m else v for v, m in zip(values, rng.random(n) < 0.1)], pa.string())


def random_table(types: list, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    columns = [strings(n, rng) if t == pa.string() else integers(t, n, rng) for t in types]
    return pa.table(columns, names=[f"c{k}" for k in range(len(types))])


COLUMN_TYPES = st.lists(st.sampled_from(INTEGERS + [pa.string()]), min_size=1, max_size=8)


@settings(max_examples=120, deadline=None)
@given(COLUMN_TYPES, st.sampled_from([0, 1, 2, 7, 50, 300]), st.sampled_from([1, 3, 64, 1 << 16]),
       st.integers(0, 2**32))
def test_random_tables_match_pyarrow(types, rows, chunk_rows, seed):
    table = random_table(types, rows, seed)
    assert csvwrite.writes(table.schema)
    assert kernel_bytes(table, chunk_rows) == pyarrow_bytes(table)


def test_every_type_with_its_extremes_over_several_chunks():
    table = random_table(INTEGERS + [pa.string()] * 2, 5000, seed=1)
    assert kernel_bytes(table, 999) == pyarrow_bytes(table)
    assert kernel_bytes(table) == pyarrow_bytes(table)


def test_sliced_and_multi_chunk_tables():
    table = random_table([pa.string(), pa.int64(), pa.uint64(), pa.string()], 400, seed=2)
    sliced = table.slice(37, 250)
    assert kernel_bytes(sliced, 16) == pyarrow_bytes(sliced)
    chunked = pa.concat_tables([table.slice(0, 100), table.slice(5, 3), table.slice(200)])
    assert chunked.column(0).num_chunks == 3
    assert kernel_bytes(chunked, 64) == pyarrow_bytes(chunked)


def test_nulls_and_empty_strings_write_nothing():
    table = pa.table({"a": pa.array([None, 5, None], pa.int64()),
                      "s": pa.array([None, "", "x"]),
                      "u": pa.array([None, None, 2**64 - 1], pa.uint64())})
    assert kernel_bytes(table) == b",,\n5,,\n,x,18446744073709551615\n" == pyarrow_bytes(table)


def test_writes_integers_and_strings_only():
    assert csvwrite.writes(pa.schema([("a", pa.int8()), ("b", pa.uint64()), ("c", pa.string())]))
    for t in (pa.float64(), pa.bool_(), pa.large_string(), pa.timestamp("ns"), pa.binary()):
        assert not csvwrite.writes(pa.schema([("a", pa.int64()), ("b", t)]))
    assert not csvwrite.writes(pa.schema([]))


def output_rows(tmp_path, table: pa.Table, name: str) -> bytes:
    outputs = [SimpleNamespace(name=f.name, type="int64") for f in table.schema]
    path = tmp_path / f"{name}.csv"
    out = QueryOutput("q", outputs, "csv", str(path), table.schema)
    out.write(0, table.slice(0, 3))
    out.write(1, table.slice(3))
    out.close()
    return path.read_bytes()


@pytest.mark.parametrize("extra", [
    None,                                                     # the Numba writer
    pa.array([0.5, 1.0, None, 2.25, -3.0, 1e300], pa.float64()),   # pyarrow: floats
    pa.array([True, False, None, True, True, False]),              # pyarrow: booleans
    pa.array(["a,b", "c", None, 'say "hi"', "x", "y"]),            # quoted where needed
])
def test_query_output_csv_is_pyarrow_csv(tmp_path, monkeypatch, extra):
    calls = []
    numba_writer = csvwrite.write_csv_rows
    monkeypatch.setattr(csvwrite, "write_csv_rows", lambda *a: calls.append(1) or numba_writer(*a))
    table = pa.table({"n": pa.array([1, -2, None, 4, 5, 6], pa.int64()),
                      "ip": pa.array(["1.2.3.4", "::1", None, "", "é", "2001:db8::1"])})
    if extra is not None:
        table = table.append_column("extra", extra)
    quoting = extra is not None and extra.type == pa.string()
    want = b"n,ip" + (b",extra" if extra is not None else b"") + b"\n"
    for part in (table.slice(0, 3), table.slice(3)):
        buf = io.BytesIO()
        if quoting:     # RFC 4180's minimal quoting, as Python's csv module writes it
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(
                ["" if v is None else v for v in row.values()] for row in part.to_pylist())
            buf.write(text.getvalue().encode())
        else:
            pacsv.write_csv(part, buf, pacsv.WriteOptions(include_header=False, quoting_style="none"))
        want += buf.getvalue()
    assert output_rows(tmp_path, table, "out") == want
    assert len(calls) == (0 if extra is not None and not quoting else 2)
