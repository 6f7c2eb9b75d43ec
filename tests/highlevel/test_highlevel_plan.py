"""The Spark stage built from the planner's HighLevelPlan (q8_2: count over a union of links)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from common.spool import SpoolWriter, list_spool
from highlevel.aggregate import AggregateStage
from highlevel.errors import StageConfigError
from highlevel.spec import OutputColumn, from_high_level
from highlevel.testing import ListSink, batch_frame, col, demo_spec
from highlevel.windows import SlidingWindow
from queries.library import __file__ as library_init
from queries.planner import plan_text


def _plan(name: str, links):
    text = (Path(library_init).parent / f"{name}.gsql").read_text()
    return plan_text(text, list(links))


def test_q8_2_plan_runs_on_spark_and_sums_partial_counts(spark, tmp_path):
    links = ("link1", "link2")
    high = _plan("q8_2", links).query("q8_2").high
    spec = from_high_level(high)
    assert spec.links == links and spec.union == "meld"
    assert [(s.name, s.kind) for s in spec.states] == [("cnt", "count")]
    pane = spec.window.pane_ns
    rng = np.random.default_rng(8)
    fed = []
    for link in links:
        writer = SpoolWriter(tmp_path / "spool", spec.query, link)
        n = 300
        batch = pa.RecordBatch.from_pydict({
            "window": pa.array(rng.integers(5, 8, n), pa.int64()),
            "srcIP": pa.array(rng.integers(0, 6, n).astype(np.uint64) + 0x0A000000, pa.uint64()),
            "destIP": pa.array(rng.integers(0, 3, n).astype(np.uint64) + 0xC0A80000,
                               pa.uint64()),
            "cnt": pa.array(rng.integers(1, 9, n).astype(np.uint64), pa.uint64()),
        })
        fed.append(batch.to_pandas())
        writer.write([batch], 7 * pane)            # windows 5 and 6 may close, 7 not
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    files = [p for _, _, p in list_spool(tmp_path / "spool", spec.query)]
    stage.process_batch(batch_frame(spark, spec, files), 0)
    got = sink.table().to_pandas()
    want = pd.concat(fed)
    want = want[want.window < 7].groupby(["window", "srcIP", "destIP"]).cnt.sum()
    names = [o.name for o in spec.outputs]
    assert list(got.columns) == names
    tb, cnt = names[0], names[-1]
    assert len(got) == len(want)
    # the temporal column is window * scale + shift; counts are exact per group
    assert got.groupby(tb)[cnt].sum().tolist() == want.groupby(level=0).sum().tolist()
    assert sorted(got[cnt].tolist()) == sorted(want.tolist())


def test_configuration_errors_say_what_is_allowed(spark, tmp_path):
    spec = demo_spec()
    bad = replace(spec, outputs=spec.outputs + (OutputColumn("x", col("nope"), "int64"),))
    with pytest.raises(StageConfigError, match="unknown name `nope`.*known: bytes, cnt"):
        AggregateStage(bad, tmp_path / "spool", tmp_path / "ck", [], spark=spark)
    with pytest.raises(StageConfigError, match=r"window `slide` \(90\) can't exceed `range` "
                                               r"\(60\)"):
        SlidingWindow(60, 90).build()
    with pytest.raises(StageConfigError, match="allowed: ip, int64"):
        replace(spec, keys=(spec.keys[0].__class__("k", "mac48"),))
    with pytest.raises(StageConfigError, match="needs the list of links"):
        replace(spec, links=())
