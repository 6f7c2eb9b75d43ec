"""Sinks write the output columns with their types, once per batch id; the spool writer's files."""

from __future__ import annotations

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.errors import SpoolError
from common.spool import LINK, PUNCT, SEQ, SpoolWriter, list_spool, read_spool
from highlevel.errors import SinkError
from highlevel.testing import demo_spec, random_partials
from tools.results.parts import ConsoleSink, CsvSink, JsonLinesSink, ParquetSink, make_sink


def _result_table():
    schema = demo_spec().output_arrow_schema()
    rows = {"tb": [7, 7], "srcIP": ["10.0.0.1", "2001:db8::1"], "port": [80, 443],
            "cnt": [3, 4], "bytes": [100, 200], "avg_len": [33.5, 50.0], "lo": [-1, 2],
            "hi": [2**64 - 1, 5], "flags": [18, 2], "ttl_first": [64, 128],
            "ttl_last": [60, 127], "dests": [2, 3]}
    return pa.table(rows, schema=schema)


@pytest.mark.parametrize("cls", [CsvSink, ParquetSink, JsonLinesSink])
def test_file_sinks_keep_types_and_write_each_batch_once(tmp_path, cls):
    table = _result_table()
    sink = cls(tmp_path / cls.ext)
    assert sink.write(3, table) is True
    assert sink.write(3, table.slice(0, 1)) is False      # replay of a committed batch
    assert len(sink.files()) == 1
    got = sink.read() if cls is ParquetSink else sink.read(table.schema)
    if cls is JsonLinesSink:
        assert got.to_pylist() == table.to_pylist()        # JSON numbers: exact values
        line = json.loads(sink.files()[0].read_text().splitlines()[0])
        assert line["hi"] == 2**64 - 1 and isinstance(line["avg_len"], float)
    else:
        assert got.equals(table.replace_schema_metadata(None)) or got.cast(table.schema)\
            .equals(table)
        if cls is ParquetSink:
            assert pq.read_schema(sink.files()[0]).field("hi").type == pa.uint64()
    assert not list(sink.dir.glob(".*"))                  # no temporaries left


def test_console_sink_prints_aligned_rows():
    out = io.StringIO()
    ConsoleSink(out).write(0, _result_table())
    lines = out.getvalue().splitlines()
    assert lines[0].split() == _result_table().column_names
    assert lines[2].split()[1] == "2001:db8::1" and len({len(l) for l in lines}) == 1


def test_make_sink_names_what_is_allowed(tmp_path):
    with pytest.raises(SinkError, match="allowed: console, csv, parquet, jsonl"):
        make_sink("xml", tmp_path)


def test_spool_writer_files_are_atomic_sequenced_and_normalised(tmp_path):
    rng = np.random.default_rng(0)
    batch = random_partials(rng, [1, 2], 5, registers=16)
    w = SpoolWriter(tmp_path, "demo", "eth0/1")
    w.write([batch], 2_000)
    w.write([], None)
    again = SpoolWriter(tmp_path, "demo", "eth0/1")          # a restarted writer continues
    assert again.seq == 2
    again.write(batch, 3_000)
    files = list_spool(tmp_path, "demo")
    assert [(l, s) for l, s, _ in files] == [("eth0/1", 0), ("eth0/1", 1), ("eth0/1", 2)]
    t = read_spool(tmp_path, "demo")
    markers = t.filter(pa.compute.is_null(t.column("window")))
    assert markers.column(SEQ).to_pylist() == [0, 1, 2]
    assert markers.column(PUNCT).to_pylist() == [2_000, None, 3_000]
    assert set(t.column(LINK).to_pylist()) == {"eth0/1"}
    rows = t.filter(pa.compute.is_valid(t.column("window")))
    # uint64 travels as int64 with the same bits; registers as one int32 column each
    assert rows.schema.field("hi").type == pa.int64()
    assert np.array_equal(rows.column("hi").to_numpy()[:5].view(np.uint64),
                          batch.column("hi").to_numpy())
    regs = np.frombuffer(batch.column("dests").buffers()[1], np.uint8).reshape(5, 16)
    assert rows.column("dests__r3").to_pylist()[:5] == regs[:, 3].tolist()
    assert not [p for p in (tmp_path / "demo" / "partials").iterdir() if p.name.startswith(".")]


def test_spool_writer_rejects_rows_of_another_query(tmp_path):
    batch = random_partials(np.random.default_rng(0), [1], 3, query="other")
    with pytest.raises(SpoolError, match="query 'other' written to the spool of query 'demo'"):
        SpoolWriter(tmp_path, "demo", "a").write([batch], 1)
