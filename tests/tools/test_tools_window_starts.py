"""Showing results to people: a table shows when each window starts (UTC), and DEFINE
order_by orders each window's rows (GSQL has no ORDER BY). The rows themselves are checked
through real runs in tests/tools/test_tools_run.py (`top_talkers`)."""

from __future__ import annotations

import io

import pyarrow as pa
import pytest

from common.errors import ConfigError
from highlevel.stage import ordered
from queries.definitions import check_define, row_order
from queries.errors import QueryError
from tests.conftest import REPO
from tools.pipeline.config import RunConfig, load_plan
from tools.pipeline.windows import window_starts
from tools.results.formats import TableWriter

SCHEMA = REPO / "tests" / "queries" / "fixtures" / "gslite" / "packet_schema.txt"


def plan_of(tmp_path, text: str, links=("main",), schema=()):
    path = tmp_path / "q.gsql"
    path.write_text(text)
    return load_plan(RunConfig(query_file=str(path), links=tuple((n, "x") for n in links),
                               schema_files=tuple(str(s) for s in schema)))


def test_a_minute_number_is_shown_as_its_start():
    plan = load_plan(RunConfig(query_file="top_talkers", links=(("main", "x.pcap"),)))
    starts = window_starts(plan, plan.query("top_talkers"))
    assert starts is not None
    # 2026-01-01T00:00:00Z is minute 29453760 (1767225600 s / 60)
    assert starts([29453760, 29453761, None]) == ["2026-01-01 00:00:00",
                                                 "2026-01-01 00:01:00", None]


def test_sliding_and_ten_second_windows_start_where_they_begin(tmp_path):
    # RANGE 5 minutes, SLIDE 1 minute: its window_end column is the end in seconds; the
    # window ending at 00:05 began at 00:00
    plan = load_plan(RunConfig(query_file="sliding_count", links=(("main", "x.pcap"),)))
    starts = window_starts(plan, plan.query("sliding_count"))
    assert starts([1767225600 + 300, 1767225600 + 360]) == ["2026-01-01 00:00:00",
                                                           "2026-01-01 00:01:00"]
    assert starts([1767225600 + 301]) == [None]        # no window ends there
    plan = plan_of(tmp_path, "DEFINE { query_name q; }\nSELECT tb, COUNT(*) AS n FROM main.IP "
                             "GROUP BY time/10 AS tb;")
    assert window_starts(plan, plan.query("q"))([176722560, 176722561]) == \
        ["2026-01-01 00:00:00", "2026-01-01 00:00:10"]


def test_windows_that_are_not_times_show_no_start(tmp_path):
    # a record protocol's own increasing field (CSV_TCPEXAMPLE's ivalue) counts anything
    plan = plan_of(tmp_path, "DEFINE { query_name q; }\nSELECT tb, SUM(value) AS s "
                             "FROM csv.CSV_TCPEXAMPLE GROUP BY ivalue/10 AS tb;",
                   links=("csv",), schema=(SCHEMA,))
    assert window_starts(plan, plan.query("q")) is None
    # records timed by the wall clock when read are times
    plan = plan_of(tmp_path, "DEFINE { query_name q; }\nSELECT systemTime, COUNT(*) AS n "
                             "FROM csv.CSV_EXAMPLE GROUP BY systemTime;",
                   links=("csv",), schema=(SCHEMA,))
    assert window_starts(plan, plan.query("q"))([1767225600]) == ["2026-01-01 00:00:00"]
    # a landmark window has no start of its own; a selection no window
    plan = load_plan(RunConfig(query_file="landmark_bytes", links=(("main", "x.pcap"),)))
    assert window_starts(plan, plan.queries[0]) is None
    plan = plan_of(tmp_path, "DEFINE { query_name q; }\nSELECT time, srcIP FROM main.IP;")
    assert window_starts(plan, plan.query("q")) is None


def test_the_table_shows_the_start_after_the_window_column():
    def starts(values):
        return [f"start of {v}" for v in values]

    out = io.BytesIO()
    writer = TableWriter("tb", starts)
    writer.rows(out, pa.table({"tb": [7, 8], "srcIP": ["10.0.0.1", "10.0.0.2"]}))
    lines = out.getvalue().decode().splitlines()
    assert lines[0].split() == ["tb", "window", "start", "(UTC)", "srcIP"]
    assert lines[1].split() == ["7", "start", "of", "7", "10.0.0.1"]
    # without a window, or another format: the query's columns only
    out = io.BytesIO()
    TableWriter().rows(out, pa.table({"tb": [7]}))
    assert out.getvalue().decode().split() == ["tb", "7"]


def test_order_by_is_checked_and_normalised():
    assert check_define("ORDER_BY", "bytes desc ,  srcIP asc") == ("order_by", "bytes DESC, srcIP")
    assert row_order("bytes DESC, srcIP") == [("bytes", True), ("srcIP", False)]
    for bad in ("", "bytes DOWN", "bytes,", "1bytes", "bytes DESC DESC"):
        with pytest.raises(ConfigError, match="DEFINE order_by"):
            check_define("order_by", bad)


def test_order_by_names_an_output_column(tmp_path):
    with pytest.raises(QueryError, match=r"'byts' is not an output column \(the query's are "
                                         r"tb, srcIP, bytes\)"):
        plan_of(tmp_path, "DEFINE { query_name q; order_by 'byts DESC'; }\n"
                          "SELECT tb, srcIP, SUM(len) AS bytes FROM main.IP "
                          "GROUP BY time/60 AS tb, srcIP;")


def test_rows_are_ordered_by_window_then_the_order_given():
    table = pa.table({"tb": [1, 1, 1, 2, 2], "srcIP": ["a", "b", "c", "a", "b"],
                      "bytes": [5, 9, 5, 1, 3]})
    got = ordered(table, (("tb", False), ("bytes", True)))
    assert list(zip(*(got.column(c).to_pylist() for c in ("tb", "srcIP", "bytes")))) == [
        (1, "b", 9), (1, "a", 5), (1, "c", 5), (2, "b", 3), (2, "a", 1)]   # ties as they came
    assert ordered(table, (("missing", True),)).equals(table)
