"""Paned-WID end to end (low level -> spool -> Spark stage) and the patent's late-data vector.

- Sliding windows (s not dividing r) over disordered packets: the stage's rows equal the
  reference evaluator's and the WID model's, whatever the punctuation frequency (every 10 ms,
  every second, only at the end), with the windows closing over several micro-batches.
- The patent's worked example (p[49]-p[52]; docs/semantics.md, "Late data") under `late 'drop'`: 10 of the 16
  packets reach the 15-minute rollup of the 5-minute counts; the 6 late ones are counted, by
  the low level (`counters['late']`) when it sees the punctuation, by the stage
  (`state.late_rows`) when late partial rows reach it.
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
from lowlevel.operator import LowLevelOperator
from lowlevel.testing import arrival_order, patent_segments
from queries.planner import plan_text
from tests.highlevel.conftest import in_write_order
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch
from tools.experiments.windowgrid import WidOperator, WindowGrid, source_punctuation

MS = 1_000_000
NS = 1_000_000_000
END_OF_INPUT = (1 << 63) - 1

SLIDING = """DEFINE {{ query_name sw; }}
SELECT srcPort, COUNT(*) [RANGE {r} ms, SLIDE {s} ms, WA timestamp] AS cnt, SUM(len) AS total,
       AVG(len) AS mean, MIN(len) AS lo, MAX(len) AS hi
FROM main.IP GROUP BY srcPort;"""
COLUMNS = ["window_end", "srcPort", "cnt", "total", "mean", "lo", "hi"]


def normal(df: pd.DataFrame) -> pd.DataFrame:
    df = df[COLUMNS].astype({"window_end": np.int64, "srcPort": np.int64, "cnt": np.int64,
                             "total": np.int64, "mean": np.float64, "lo": np.int64, "hi": np.int64})
    return df.sort_values(["window_end", "srcPort"]).reset_index(drop=True)


def spool_run(plan, batch: PacketBatch, punct, root) -> int:
    """The low level over the arrivals into a spool, as the offline pipeline feeds it: a file
    whenever the operator's punctuation advances, the rest at end of input. Returns files."""
    op = LowLevelOperator(plan)
    writer = SpoolWriter(root, plan.query, plan.link, fsync=False)
    at = {j + 1: p for j, p in punct}
    n = len(batch)
    rows, files, a0 = [], 0, 0
    for a1 in sorted(set(at) | {n}):
        rows += op.process(batch.slice(a0, a1))
        a0 = a1
        if a1 in at:
            more, p = op.punctuate(at[a1])
            rows += more
            if p is not None:
                writer.write(rows, p)
                rows, files = [], files + 1
    more, _ = op.finish()
    writer.write(rows + more, END_OF_INPUT)
    assert op.counters["late"] == 0
    return files + 1


def wid_rows(grid: WindowGrid, batch: PacketBatch, punct) -> pd.DataFrame:
    op = WidOperator(grid)
    ts = batch["timestamp"].astype(np.int64)
    keys, vals = batch["srcPort"].astype(np.int64), batch["len"].astype(np.int64)
    out, a0 = [], 0
    for j, p in punct:
        op.process(ts[a0:j + 1], keys[a0:j + 1], vals[a0:j + 1])
        a0 = j + 1
        out += op.punctuate(p)
    op.process(ts[a0:], keys[a0:], vals[a0:])
    out += op.finish()
    df = pd.DataFrame(out, columns=["wid", "srcPort", "cnt", "total", "lo", "hi"])
    df["window_end"] = grid.end(df["wid"].to_numpy())
    df["mean"] = df["total"] / df["cnt"]
    return normal(df)


@pytest.mark.slow
def test_stage_sliding_windows_independent_of_punctuation(spark, tmp_path):
    # one case: Spark micro-batches are slow; tests/lowlevel/test_lowlevel_windows_props.py
    # checks many more windows and orders through the low level and the same window rule
    r, s, order, seed = 2500, 750, "block", 11
    fp = plan_text(SLIDING.format(r=r, s=s), ["main"])
    qp = fp.queries[0]
    plan = qp.low[0]
    sorted_batch = random_batch(300, seed, span_s=15, hosts=3)
    want = normal(evaluate_file(fp, {"main": sorted_batch})["sw"])
    rng = np.random.default_rng(seed)
    batch = sorted_batch.take(arrival_order(sorted_batch["timestamp"], order, rng,
                                            band=2000 * MS, block=60))
    grid = WindowGrid(r * MS, s * MS)
    for name, every in (("10ms", 10 * MS), ("1s", NS), ("end", None)):
        punct = [] if every is None else source_punctuation(batch["timestamp"], every)
        pd.testing.assert_frame_equal(wid_rows(grid, batch, punct), want, check_exact=False,
                                      rtol=1e-12)
        spool = tmp_path / name / "spool"
        files = spool_run(plan, batch, punct, spool)
        sink = ListSink()
        # the 10 ms run in two micro-batches, so windows close across batches (each batch
        # costs about a second: the others run in one)
        split = -(-files // 2) if name == "10ms" else None
        stage = AggregateStage(from_high_level(qp.high), spool, tmp_path / name / "ck", [sink],
                      spark=spark, max_files_per_trigger=split)
        stage.run_available()
        got = normal(sink.table().to_pandas())
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12,
                                      obj=f"stage rows, punctuation {name}")
        assert stage.state.late_rows == 0


# --- the patent's test vector ---------------------------------------------------------------------

PATENT = """DEFINE { query_name rollup5; }
SELECT tb, COUNT(*) AS cnt FROM main.PACKET GROUP BY time/300 AS tb;"""
#: arrivals in minutes, "P" = punctuation at that minute (patent p[49]-p[52])


def packets(minutes) -> PacketBatch:
    b = PacketBatch.empty("main", len(minutes))
    b.columns["timestamp"][:] = np.asarray(minutes, np.int64) * 60 * NS + 30 * NS
    b.columns["len"][:] = 100
    return b


def expected_drop():
    """Each packet is late iff its time is below the punctuation already given."""
    p, kept, late = None, {}, 0
    for minutes, punct in patent_segments():
        for m in minutes:
            if p is not None and m * 60 * NS + 30 * NS < p:
                late += 1
            else:
                kept[m // 5] = kept.get(m // 5, 0) + 1
        p = punct
    return kept, late


def test_patent_vector_drop_at_the_low_level(spark, tmp_path):
    kept, late = expected_drop()
    assert (sum(kept.values()), late) == (10, 6)            # the patent's own figures
    qp = plan_text(PATENT, ["main"]).queries[0]
    assert qp.low[0].late == "drop"                          # the default policy
    op = LowLevelOperator(qp.low[0])
    writer = SpoolWriter(tmp_path / "spool", qp.name, "main", fsync=False)
    for minutes, punct in patent_segments():
        rows = op.process(packets(minutes))
        more, p = op.punctuate(punct)
        writer.write(rows + more, p)
    more, _ = op.finish()
    writer.write(more, END_OF_INPUT)
    assert op.counters["late"] == late
    assert op.counters["packets_in"] == 16
    sink = ListSink()
    stage = AggregateStage(from_high_level(qp.high), tmp_path / "spool", tmp_path / "ck", [sink],
                  spark=spark)
    stage.run_available()
    got = sink.table().to_pandas()
    assert dict(zip(got["tb"].astype(int), got["cnt"].astype(int))) == kept
    assert int(got["cnt"].sum()) == 10                      # the 15-minute rollup
    assert stage.state.late_rows == 0                       # the low level dropped them


def test_patent_vector_drop_at_the_stage(spark, tmp_path):
    """Partial rows reach the stage after its punctuation (the low level was not told): the
    stage drops the late rows, counts them, and the rollup still holds the 10 on-time packets."""
    kept, late = expected_drop()
    qp = plan_text(PATENT, ["main"]).queries[0]
    writer = SpoolWriter(tmp_path / "spool", qp.name, "main", fsync=False)
    p_before, late_rows = None, 0
    for minutes, punct in patent_segments():
        # one operator per segment, flushed at once: one partial row per (pane) of the segment
        op = LowLevelOperator(qp.low[0])
        op.process(packets(minutes))
        rows, _ = op.finish()
        panes = np.concatenate([b.column("window").to_numpy() for b in rows])
        if p_before is not None:
            late_rows += int(np.count_nonzero((panes + 1) * 300 * NS <= p_before))
        writer.write(rows, punct)
        p_before = punct
    in_write_order(tmp_path / "spool")
    sink = ListSink()
    stage = AggregateStage(from_high_level(qp.high), tmp_path / "spool", tmp_path / "ck", [sink],
                  spark=spark, max_files_per_trigger=1)
    stage.run_available()
    got = sink.table().to_pandas()
    assert dict(zip(got["tb"].astype(int), got["cnt"].astype(int))) == kept
    assert int(got["cnt"].sum()) == 10
    assert stage.state.late_rows == late_rows > 0
