"""A reader grouping an inner join's rows by both sides' times (highlevel.joint).

The reader's spool is written here as the join writes it (`SpoolSink(joint=True)`: raw rows
and the four punctuation values per file), so each group's closing batch is chosen exactly:
one closes on the joint box alone, one on the first time's slab, one on the second's, the
last at end of input; a row for a group already closed is late. Analysis: two temporal
items only over an inner join, one on each side's time, and the second is no time column
for later readers.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from highlevel.graph import StageGraph
from highlevel.joint import JointStage
from highlevel.sinks import SpoolSink
from highlevel.testing import ListSink
from queries.errors import QueryError
from queries.planner import plan_text

HERE = Path(__file__).parent / "queries"
S = 10**9
BASE = 1_700_000_000          # seconds; 10 s windows: pane (BASE + t) // 10
END = (1 << 63) - 1


def _rows(pairs) -> pa.Table:
    """Raw rows of `iband` (x.time, y.time in seconds after BASE, len, ylen)."""
    xs = [BASE + x for x, _ in pairs]
    return pa.table({"window": pa.array([x * S for x in xs], pa.int64()),
                     "time": pa.array(xs, pa.int64()),
                     "ytime": pa.array([BASE + y for _, y in pairs], pa.int64()),
                     "len": pa.array([100] * len(pairs), pa.int64()),
                     "ylen": pa.array([7] * len(pairs), pa.int64())})


def _ns(*secs):
    return tuple(None if s is None else END if s == END else (BASE + s) * S for s in secs)


def _reader(spark, tmp_path, late: str = "drop"):
    text = (HERE / "flow_join.gsql").read_text().replace(
        "query_name iband_boxes;", f"query_name iband_boxes; late '{late}';")
    fp = plan_text(text, ["main", "other"])
    out = ListSink()
    graph = StageGraph(fp, ["iband_boxes"], tmp_path / "spool", tmp_path / "ck",
                       sinks={q: [out] if q == "iband_boxes" else [] for q in fp.names},
                       spark=spark)
    stage = graph.stage("iband_boxes")
    assert isinstance(stage, JointStage)
    stage.max_files_per_trigger = 1
    feed = SpoolSink(tmp_path / "spool", "iband_boxes", "iband", side=0, joint=True)
    return stage, feed, out


def _in_writing_order(feed: SpoolSink) -> None:
    """Give the spool files modification times one second apart, in sequence order: Spark's
    file source takes the oldest first (one file per micro-batch here), and files written
    within the same millisecond would come in listing order."""
    for i, path in enumerate(sorted(feed.writer.dir.glob("*.parquet"))):
        os.utime(path, ns=(10**18 + i * 10**9, 10**18 + i * 10**9))


def _groups(out: ListSink, batch: int, correction: bool = False) -> list[tuple]:
    t = out.tables.get(batch)
    if t is None:
        return []
    names = ("tb", "yb", "pairs") + (("correction",) if correction else ())
    return sorted((tb - BASE // 10, yb - BASE // 10, *rest) for tb, yb, *rest in
                  zip(*(t.column(c).to_pylist() for c in names)))


@pytest.mark.parametrize("late", ["drop", "correct"])
@pytest.mark.slow
def test_groups_close_on_the_box_either_slab_or_the_end(spark, tmp_path, late):
    stage, feed, out = _reader(spark, tmp_path, late)
    files = [
        # no group covered: (0, 0) ends at 10 s on both times
        ([(3, 4), (8, 11), (14, 12), (15, 25)], _ns(5, 6, None, None)),
        # the box (11, 10) covers (0, 0) while i1 = 8 and i2 = 9 do not: it closes now
        ([(9, 9)], _ns(8, 9, 11, 10)),
        # (2, 4) is late: (0, 0) closed; i1 = 10 closes (0, 1) (x.time window ended)
        ([(2, 4), (9, 15)], _ns(10, 10, 12, 12)),
        # i2 = 20 closes (1, 1) (y.time window ended) while i1 = 12 and the box do not
        ([(16, 19)], _ns(12, 20, 12, 12)),
        # end of input: the rest
        ([], _ns(END, END, END, END)),
    ]
    for batch, (pairs, punct) in enumerate(files):
        if pairs:
            feed.write(batch, _rows(pairs))
        feed.end_batch(batch, punct)
    _in_writing_order(feed)
    stage.run_available()
    assert stage.state.batch == 4
    assert stage.state.late_rows == 1
    assert stage.state.punctuation == END
    if late == "correct":
        # the late row's group, closed in batch 1, gets a correction row (its delta)
        assert _groups(out, 2, correction=True) == [(0, 0, 1, 1), (0, 1, 2, 0)]
        assert stage.state.corrected_rows == 1
        return
    assert _groups(out, 0) == []
    assert _groups(out, 1) == [(0, 0, 2)]            # the box alone
    assert _groups(out, 2) == [(0, 1, 2)]            # the x.time slab
    assert _groups(out, 3) == [(1, 1, 2)]            # the y.time slab
    assert _groups(out, 4) == [(1, 2, 1)]            # end of input


@pytest.mark.slow
def test_a_file_after_a_gap_waits_for_its_predecessor(spark, tmp_path):
    """Files apply in sequence order: file 1's box is used only once file 0 has come."""
    stage, feed, out = _reader(spark, tmp_path)
    feed.write(1, _rows([(9, 9)]))
    feed.end_batch(1, _ns(8, 9, 11, 10))
    stage.run_available()
    assert stage.bounds() == [None] * 4 and not any(t.num_rows for t in out.tables.values())
    feed.write(0, _rows([(3, 4)]))
    feed.end_batch(0, _ns(5, 6, None, None))
    stage.run_available()
    assert stage.bounds() == list(_ns(8, 9, 11, 10))
    assert [g for b in sorted(out.tables) for g in _groups(out, b)] == [(0, 0, 2)]


JOIN = """
DEFINE { query_name j; }
SELECT x.time, y.time AS ytime, x.len FROM main.UDP [RANGE 3 seconds, WA time] x {kind}
    other.UDP [RANGE 2 seconds, WA time] y WHERE x.srcIP = y.destIP;
"""


def _plan(kind: str, reader: str):
    text = JOIN.replace("{kind}", ",").replace("FROM", f"{kind} FROM") + reader
    return plan_text(text, ["main", "other"])


def test_two_temporal_items_need_an_inner_join_one_per_side():
    both = "DEFINE { query_name r; } SELECT tb, yb, COUNT(*) FROM j " \
           "GROUP BY time/10 AS tb, ytime/10 AS yb;"
    fp = _plan("INNER_JOIN", both)
    assert fp.query("r").high.window2.column == "yb"
    # the second item's output is no time column: a reader cannot window on it
    with pytest.raises(QueryError, match="temporal group item"):
        _plan("INNER_JOIN", both + " DEFINE { query_name z; } SELECT yb, COUNT(*) FROM r "
              "GROUP BY yb;")
    with pytest.raises(QueryError, match="inner join.*LEFT_OUTER_JOIN of query 'j'"):
        _plan("LEFT_OUTER_JOIN", both)
    with pytest.raises(QueryError, match="at most one temporal group item"):
        _plan("INNER_JOIN", "DEFINE { query_name r; } SELECT tb, tc, COUNT(*) FROM j "
              "GROUP BY time/10 AS tb, time/20 AS tc;")
    with pytest.raises(QueryError, match="at most one temporal group item"):
        plan_text("DEFINE { query_name r; } SELECT tb, tc, COUNT(*) FROM main.IP "
                  "GROUP BY time/10 AS tb, time/20 AS tc;", ["main"])
