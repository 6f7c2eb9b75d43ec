"""`late 'correct'` through the Spark stage (docs/semantics.md, "Late data"): late partial rows of closed windows
become correction rows (the delta, `correction` = 1), and regular + correction rows merged by
the aggregates' own super-aggregates equal the reference evaluator over every packet.

The patent's worked example (p[49]-p[52]) both ways the late rows reach the stage: from the
low level's late partition, and as partial rows of a link that punctuated too early (a slow
link's old rows); and a sliding window whose late pane is in closed and open windows at once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from capture.batch import PacketBatch
from common.spool import SpoolWriter
from highlevel.aggregate import AggregateStage
from highlevel.spec import from_high_level
from highlevel.testing import ListSink
from lowlevel.operator import LATE_MARKER, LowLevelOperator
from lowlevel.testing import PATENT_MINUTES, patent_segments
from queries.planner import plan_text
from tests.highlevel.conftest import in_write_order
from tests.oracles.reference import evaluate_file

NS = 1_000_000_000
END_OF_INPUT = (1 << 63) - 1

PATENT = """DEFINE {{ query_name rollup5; {late} }}
SELECT tb, COUNT(*) AS cnt FROM main.PACKET GROUP BY time/300 AS tb;"""


def packets(minutes) -> PacketBatch:
    b = PacketBatch.empty("main", len(minutes))
    b.columns["timestamp"][:] = np.asarray(minutes, np.int64) * 60 * NS + 30 * NS
    b.columns["len"][:] = 60 + 10 * np.asarray(minutes, np.int64)
    return b


def merged(df: pd.DataFrame, keys: list[str], how: dict) -> pd.DataFrame:
    """Regular and correction rows merged per (window, keys) by each column's own combine."""
    out = df.drop(columns="correction").groupby(keys, as_index=False).agg(how)
    return out.sort_values(keys).reset_index(drop=True)


def reference(qp, plan, keys: list[str]) -> pd.DataFrame:
    ref = evaluate_file(plan, {"main": packets(PATENT_MINUTES)})[qp.name]
    assert (ref["correction"] == 0).all()
    return ref.drop(columns="correction").sort_values(keys).reset_index(drop=True)


def run_stage(spark, qp, root) -> tuple[pd.DataFrame, AggregateStage]:
    in_write_order(root / "spool")
    sink = ListSink()
    stage = AggregateStage(from_high_level(qp.high), root / "spool", root / "ck", [sink], spark=spark,
                  max_files_per_trigger=1)
    stage.run_available()
    return sink.table().to_pandas(), stage


def early_link_spool(qp, root) -> None:
    """Each arrival segment's rows written with the punctuation that follows it, as a link
    that does not hold its old rows back: rows of windows the stage closed become late."""
    writer = SpoolWriter(root / "spool", qp.name, "main", fsync=False)
    for minutes, punct in patent_segments():
        op = LowLevelOperator(qp.low[0])
        op.process(packets(minutes))
        writer.write(op.finish()[0], punct)
    writer.write(None, END_OF_INPUT)


@pytest.mark.slow
def test_patent_vector_corrections_at_the_stage(spark, tmp_path):
    plan = plan_text(PATENT.format(late="late 'correct';"), ["main"])
    qp = plan.queries[0]
    assert qp.high.correction == "correction" and qp.output_names[-1] == "correction"
    early_link_spool(qp, tmp_path)
    got, stage = run_stage(spark, qp, tmp_path)
    regular = got[got["correction"] == 0]
    fixes = got[got["correction"] == 1]
    # the regular rows are what dropping gives (10 of 16) ...
    assert dict(zip(regular["tb"].astype(int), regular["cnt"].astype(int))) == {0: 6, 1: 2, 2: 2}
    assert int(regular["cnt"].sum()) == 10
    # ... the correction rows carry the 6 late packets, for windows already closed
    assert int(fixes["cnt"].sum()) == 6 and set(fixes["tb"].astype(int)) <= {0, 1}
    assert stage.state.corrected_rows == len(fixes) > 0
    assert stage.state.late_rows == 3          # late partial rows: (0), (0, 1) per segment
    total = merged(got, ["tb"], {"cnt": "sum"})
    pd.testing.assert_frame_equal(total, reference(qp, plan, ["tb"]), check_dtype=False)
    assert int(total["cnt"].sum()) == 16       # the 15-minute rollup: the patent's 16


@pytest.mark.slow
def test_patent_vector_late_partition_end_to_end(spark, tmp_path):
    """The low level's late partition (flush iop_slow: its punctuation follows the input's,
    so the windows close at the stage before the late rows come)."""
    plan = plan_text(PATENT.format(late="late 'correct'; flush iop_slow;"), ["main"])
    qp = plan.queries[0]
    op = LowLevelOperator(qp.low[0])
    writer = SpoolWriter(tmp_path / "spool", qp.name, "main", fsync=False)
    marked = 0
    for minutes, punct in patent_segments():
        rows = op.process(packets(minutes))
        more, p = op.punctuate(punct)
        marked += sum(int(np.asarray(b.column(LATE_MARKER)).sum()) for b in rows + more)
        writer.write(rows + more, p)
    more, _ = op.finish()
    writer.write(more, END_OF_INPUT)
    assert op.counters["late_corrected"] == 6 and op.counters["late"] == 0
    assert marked == op.counters["late_rows_out"] > 0
    got, stage = run_stage(spark, qp, tmp_path)
    total = merged(got, ["tb"], {"cnt": "sum"})
    pd.testing.assert_frame_equal(total, reference(qp, plan, ["tb"]), check_dtype=False)
    assert int(total["cnt"].sum()) == 16
    assert int(got.loc[got["correction"] == 1, "cnt"].sum()) > 0   # corrections did happen


SLIDING = """DEFINE { query_name sw; late 'correct'; }
SELECT COUNT(*) [RANGE 10 minutes, SLIDE 5 minutes, WA timestamp] AS cnt, SUM(len) AS total,
       MIN(len) AS lo, MAX(len) AS hi
FROM main.PACKET;"""


@pytest.mark.slow
def test_sliding_late_pane_corrects_closed_windows_only(spark, tmp_path):
    """A late 5-minute pane belongs to a closed 10-minute window (corrected) and to an open
    one (combined as usual): merged rows equal the reference; nothing is counted twice."""
    plan = plan_text(SLIDING, ["main"])
    qp = plan.queries[0]
    early_link_spool(qp, tmp_path)
    got, stage = run_stage(spark, qp, tmp_path)
    temporal = [c for c in got.columns if c not in ("cnt", "total", "lo", "hi", "correction")]
    how = {"cnt": "sum", "total": "sum", "lo": "min", "hi": "max"}
    total = merged(got, temporal, how)
    want = reference(qp, plan, temporal)
    pd.testing.assert_frame_equal(total, want[total.columns], check_dtype=False)
    assert (got["correction"] == 1).any() and stage.state.corrected_rows > 0
