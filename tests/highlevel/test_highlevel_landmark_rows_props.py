"""Landmark and tuple-count windows end to end (low level -> spool -> Spark stage) = reference.

For random streams in a disordered arrival order with grammatical punctuation, at two
punctuation frequencies (every 10 ms over several micro-batches, only at the end of input), the stage's rows equal the reference evaluator's (`tests.oracles.reference`, brute force
from the definition) for
- a landmark window `[RANGE ALL, SLIDE s]` (running totals per group; rows up to the window of
  the last packet, whatever punctuation passed beyond it) and `[RANGE ALL]`;
- tuple-count windows `[ROWS n]` and `[PARTITION BY a ROWS n]` (ties on timestamp across
  links broken by link, then by values), over one link and over the union of two links.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from common.spool import SpoolWriter
from highlevel.graph import StageGraph
from highlevel.testing import ListSink
from lowlevel.operator import LowLevelOperator
from lowlevel.testing import arrival_order
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch
from tools.experiments.windowgrid import source_punctuation

MS = 1_000_000
END_OF_INPUT = (1 << 63) - 1

LANDMARK = """DEFINE {{ query_name lm; }}
SELECT srcPort, COUNT(*) [RANGE ALL{slide}, WA timestamp_ms] AS cnt, SUM(len) AS total,
       MIN(len) AS lo, MAX(ttl) AS hi, FIRST(len) AS f
FROM {src} GROUP BY srcPort;"""
ROWS = """DEFINE {{ query_name cw; }}
SELECT srcPort, COUNT(*) [{part}ROWS {n}] AS cnt, SUM(len) AS total, AVG(len) AS mean,
       MAX(ttl) AS hi, LAST(len) AS l
FROM {src} WHERE len > 100 GROUP BY srcPort;"""


def normal(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in df.columns:
        df[c] = df[c].astype(np.float64 if c == "mean" else np.int64)
    return df.sort_values(list(df.columns)).reset_index(drop=True)


def feed(plan, batch, punct, root) -> None:
    """One link's low level over its arrivals into the spool: a file per punctuation."""
    op = LowLevelOperator(plan)
    writer = SpoolWriter(root, plan.query, plan.link, fsync=False)
    at = {j + 1: p for j, p in punct}
    rows, a0 = [], 0
    for a1 in sorted(set(at) | {len(batch)}):
        rows += op.process(batch.slice(a0, a1))
        a0 = a1
        if a1 in at:
            more, p = op.punctuate(at[a1])
            rows += more
            if p is not None:
                writer.write(rows, p)
                rows = []
    more, _ = op.finish()
    writer.write(rows + more, END_OF_INPUT)
    assert op.counters["late"] == 0


def run_stage(spark, fp, arrivals: dict, every, root, batches: int) -> pd.DataFrame:
    """The query's stage over the spool in about `batches` micro-batches (windows then close
    across batches; each micro-batch costs about a second)."""
    qp = fp.queries[0]
    sink = ListSink()
    graph = StageGraph(fp, [qp.name], root / "spool", root / "ck", sinks={qp.name: [sink]},
                       spark=spark)
    for lp in graph.low_plans():
        batch = arrivals[lp.link]
        punct = [] if every is None else source_punctuation(batch["timestamp"], every)
        feed(lp, batch, punct, root / "spool")
    files = sum(1 for _ in (root / "spool").rglob("*.parquet"))
    for _, stage in graph.stages:
        stage.max_files_per_trigger = max(1, -(-files // batches))
    graph.run_available()
    assert graph.late_rows(qp.name) == 0
    table = sink.table()
    return table.to_pandas() if table is not None else None


def check(spark, text: str, links: list[str], seed: int, tmp_path) -> None:
    fp = plan_text(text, links)
    name = fp.queries[0].name
    rng = np.random.default_rng(seed)
    ordered = {}
    for i, link in enumerate(links):
        # few ports and millisecond times: many ties inside and across links
        b = random_batch(int(rng.integers(40, 160)), seed + i, link=link, span_s=6, hosts=3)
        b.columns["timestamp"][:] = b.columns["timestamp"] // MS * MS
        ordered[link] = b
    want = normal(evaluate_file(fp, ordered)[name])
    arrivals = {link: b.take(arrival_order(b["timestamp"], "band", rng, band=700 * MS))
                for link, b in ordered.items()}
    # every 1 s gives the same rows too (checked while writing this; left out for time)
    for label, every, batches in (("10ms", 10 * MS, 3), ("end", None, 1)):
        # a directory per run: hypothesis replays a failing example in the same tmp_path
        root = Path(tempfile.mkdtemp(dir=tmp_path, prefix=f"{seed}-{label}-"))
        got = run_stage(spark, fp, arrivals, every, root, batches)
        got = normal(got[want.columns]) if got is not None else want.iloc[:0]
        pd.testing.assert_frame_equal(got, want, check_exact=False, rtol=1e-12,
                                      obj=f"{name}, punctuation {label}")


_SETTINGS = settings(max_examples=2, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(st.integers(0, 10_000), st.sampled_from([", SLIDE 700 ms", ", SLIDE 2 sec", ""]),
       st.booleans())
# its first micro-batch holds punctuation only (no pane yet): a None pane once broke the next
@example(seed=1, slide=", SLIDE 2 sec", two=False)
@pytest.mark.slow
def test_landmark_equals_reference(spark, tmp_path, seed, slide, two):
    links = ["a", "b"] if two else ["main"]
    src = "[a, b].IP" if two else "main.IP"
    check(spark, LANDMARK.format(slide=slide, src=src), links, seed, tmp_path)


@_SETTINGS
@given(st.integers(0, 10_000), st.integers(1, 9), st.sampled_from(["", "PARTITION BY protocol "]),
       st.booleans())
@pytest.mark.slow
def test_rows_equals_reference(spark, tmp_path, seed, n, part, two):
    links = ["a", "b"] if two else ["main"]
    src = "[a, b].IP" if two else "main.IP"
    check(spark, ROWS.format(part=part, n=n, src=src), links, seed, tmp_path)
