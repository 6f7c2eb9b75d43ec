"""The page's history of a stream (`GET /api/queries/NAME/rows`) after a restart: the hub's
latest rows are read back from the part files the stream's output directory already holds
(`tools.serve.tail.written_rows`), in every output format, as the rows the hub handed out;
and the window each stream tells the page (`window_info`), which places a row on a time axis.

Real part files written by the appliance's own `StreamOutput`; no server (the browser test
in test_serve_page.py restarts a real one)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from tools.pipeline.config import plan_text
from tools.results.formats import arrow_schema
from tools.serve.tail import Hub, StreamOutput, written_rows

TEN_SECONDS = """
DEFINE { query_name persrc; }
SELECT tb, srcIP, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/10 AS tb, srcIP;
"""
SLIDING = """
DEFINE { query_name sliding; }
SELECT srcIP, count(*) [RANGE 10 minutes, SLIDE 1 minute, WA time] AS n
FROM main.IPV4 GROUP BY srcIP;
"""
ONE_MINUTE = """
DEFINE { query_name minutes; }
SELECT tb, count(*) AS packets FROM main.IPV4 GROUP BY time/60*60 AS tb;
"""
SELECTION = """
DEFINE { query_name sel; }
SELECT time, len FROM main.IPV4;
"""


def _plan(text: str):
    return plan_text(text, "q.gsql", ["main"], {}, {}, subset=True).queries[0]


def _output(qp, directory, fmt, prefix, hub, first_generation=1) -> StreamOutput:
    out = StreamOutput(qp.name, qp.high.outputs, arrow_schema(qp.name, qp.high.outputs),
                       directory, fmt, prefix, hub, lambda links, p: None, ["main"])
    out.set_window(qp.high.window)
    out.recall(first_generation)
    return out


def _batch(qp, tb: int, n: int) -> pa.Table:
    """One window's rows as the stages hand them over (addresses as integers)."""
    return pa.Table.from_pylist(
        [{"tb": tb, "srcIP": 0x0A000001 + i, "packets": 1000 + i, "bytes": 64000 + i}
         for i in range(n)], schema=arrow_schema(qp.name, qp.high.outputs))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_restart_remembers_the_rows_written_before_it(tmp_path, fmt):
    qp = _plan(TEN_SECONDS)
    out_dir = tmp_path / "out"
    before = Hub()
    first = _output(qp, out_dir, fmt, "g0001-", before)
    assert list(before.recent[qp.name]) == []          # a new directory: nothing before
    for batch in range(4):
        assert first.write(batch, _batch(qp, 179579942 + batch, 3))
        first.end_batch(batch, None)
    handed_out = list(before.recent[qp.name])
    assert len(handed_out) == 12 and handed_out[0] == [179579942, "10.0.0.1", 1000, 64000]

    # the server killed and started again: a new hub, the same generation's output resumed
    after = Hub()
    _output(qp, out_dir, fmt, "g0001-", after)
    assert list(after.recent[qp.name]) == handed_out

    # and a later generation (a clean stop and restart) goes on after them, in order
    later = Hub()
    second = _output(qp, out_dir, fmt, "g0002-", later)
    assert list(later.recent[qp.name]) == handed_out
    assert second.write(0, _batch(qp, 179579950, 2))
    second.end_batch(0, None)
    assert list(later.recent[qp.name])[-2:] == [[179579950, "10.0.0.1", 1000, 64000],
                                                [179579950, "10.0.0.2", 1001, 64001]]
    again = Hub()
    _output(qp, out_dir, fmt, "g0002-", again)
    assert list(again.recent[qp.name]) == list(later.recent[qp.name])
    # a query submitted again under the name at generation 2: the first one's rows are not
    # its own
    anew = Hub()
    _output(qp, out_dir, fmt, "g0002-", anew, first_generation=2)
    assert list(anew.recent[qp.name]) == list(later.recent[qp.name])[-2:]


def test_the_latest_rows_only_and_never_another_querys(tmp_path):
    qp = _plan(TEN_SECONDS)
    out_dir = tmp_path / "out"
    hub = Hub()
    first = _output(qp, out_dir, "csv", "g0001-", hub)
    for batch in range(5):
        first.write(batch, _batch(qp, 100 + batch, 10))
    schema = pa.schema([("tb", pa.int64()), ("srcIP", pa.string()), ("packets", pa.int64()),
                        ("bytes", pa.int64())])
    # the last 25 rows: the newest two parts whole and half of the third, in order
    rows = written_rows(out_dir, "csv", schema, 25)
    assert len(rows) == 25 and rows[0] == [102, "10.0.0.6", 1005, 64005]
    assert rows[-1] == [104, "10.0.0.10", 1009, 64009]
    # parts of another format, and files not the appliance's, are not read
    (out_dir / "notes.csv").write_text("a,b\n1,2\n")
    assert written_rows(out_dir, "jsonl", schema, 25) == []
    assert written_rows(out_dir, "csv", schema, 25) == rows

    # an earlier query of the name wrote other columns: its rows are not taken as these
    other = pa.schema([("tb", pa.int64()), ("flows", pa.int64())])
    assert written_rows(out_dir, "csv", other, 25) == []
    # a damaged part ends the search, quietly: the rows after it still come
    (out_dir / "part-g0001-0000000002.csv").write_bytes(b"tb,srcIP,packets,bytes\nx,\"\n")
    assert written_rows(out_dir, "csv", schema, 25) == rows[-20:]
    assert written_rows(tmp_path / "missing", "csv", schema, 25) == []


def test_each_stream_tells_the_page_its_window(tmp_path):
    hub = Hub()
    ten = _output(_plan(TEN_SECONDS), tmp_path / "a", "csv", "g0001-", hub).info()["window"]
    # tb of `time/10 AS tb` is 10-s window number tb: it starts at tb * 10 s
    assert ten == {"column": "tb", "scale": 1, "shift": 0, "range_ns": 10 * 10**9,
                   "slide_ns": 10 * 10**9, "offset_ns": 0, "landmark": None}
    tb = 179579942
    start_s = ((tb - ten["shift"]) / ten["scale"] + 1) * ten["slide_ns"] / 1e9 \
        - ten["offset_ns"] / 1e9 - ten["range_ns"] / 1e9
    assert start_s == 1795799420          # 2026-11-27 17:10:20 UTC

    minutes = _output(_plan(ONE_MINUTE), tmp_path / "b", "csv", "g0001-", hub).info()["window"]
    assert (minutes["scale"], minutes["slide_ns"]) == (60, 60 * 10**9)   # tb counts seconds
    sliding = _output(_plan(SLIDING), tmp_path / "c", "csv", "g0001-", hub).info()["window"]
    assert sliding["column"] == "window_end" and sliding["range_ns"] == 600 * 10**9
    # no window: the page draws a plain numeric axis of the first column
    assert _output(_plan(SELECTION), tmp_path / "d", "csv", "g0001-", hub).info()["window"] \
        is None
