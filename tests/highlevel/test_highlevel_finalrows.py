"""A single link's final partial rows written without a combine (highlevel.finalrows): the
rows of the Spark path, for every state with a plain output, with windows left open between
batches, whether the other rows combine on the driver or in Spark."""

from __future__ import annotations

import logging
import os
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest

from common.spool import FINAL_ROWS_KEY, list_spool
from highlevel import smallbatch
from highlevel.aggregate import AggregateStage
from highlevel.spec import from_high_level
from highlevel.testing import ListSink, feed_spool
from queries.planner import plan_text

NS = 1_000_000_000
QUERY = """
DEFINE { query_name plain; aggregate_slots 1024; }
SELECT tb, srcIP, destIP, count(*) AS n, sum(len) AS bytes, min(len) AS lo,
       max(destPort) AS hi, OR_AGGR(flags) AS fl, FIRST(destPort) AS f, LAST(len) AS l
FROM main.IPV4
GROUP BY time/5 AS tb, srcIP, destIP
"""


@pytest.fixture(scope="module")
def spooled(tmp_path_factory):
    from capture.reader import read_all
    from tools.gen.traffic import TrafficConfig, generate

    work = tmp_path_factory.mktemp("finalrows")
    cfg = TrafficConfig(packets=20_000, duration_ns=60 * NS, groups=300, tcp=0.6, udp=0.4,
                        icmp=0.0, seed=11)
    batch = read_all(generate(cfg.validate(), work / "k.pcap")["l0"], "main")
    qp = plan_text(QUERY, ["main"]).query("plain")
    # a table a little small for its groups: most rows final, some evicted while open
    feed_spool(qp.low, {"main": batch}, work / "spool", pieces=24, disorder_ns=NS)
    files = [p for _, _, p in list_spool(work / "spool", "plain")]
    return from_high_level(qp.high, qp.low), files


def _stream(spec, files, root, direct: bool, open_on_driver: bool = True):
    d = root / "spool" / "plain" / "partials"
    d.mkdir(parents=True)
    for i, f in enumerate(files):
        shutil.copy(f, d / f.name)
        # Spark's file source takes files in mtime order: the same batches in every run
        os.utime(d / f.name, ns=(0, (1_700_000_000 + i) * NS))
    sink = ListSink()
    stage = AggregateStage(spec, root / "spool", root / "ck", [sink], max_files_per_trigger=3)
    stage.open_on_driver = open_on_driver
    if not direct:
        stage.final_outputs = None
    stage.run_available()
    return sink.table().to_pandas(), stage


@pytest.mark.slow
def test_final_rows_skip_the_combine(spark, spooled, tmp_path, monkeypatch, caplog):
    spec, files = spooled
    final = sum(int(pq.read_schema(f).metadata.get(FINAL_ROWS_KEY, b"0")) for f in files)
    rows = sum(pq.read_metadata(f).num_rows - 1 for f in files)
    # the case this path is for, with rows to combine too
    assert 0.5 * rows < final < rows, (final, rows)
    ref, plain = _stream(spec, files, tmp_path / "spark", False)
    assert plain.final_batches == 0 and len(ref) > 300
    driver, stage = _stream(spec, files, tmp_path / "driver", True)
    assert stage.final_batches >= 3
    pd.testing.assert_frame_equal(driver, ref)
    # the other rows past the driver's limit: Spark combines them, with the open rows
    # collected in the same job (the appliance) or written by Spark (a bounded run)
    monkeypatch.setattr(smallbatch, "MAX_ROWS", 10)
    for open_on_driver in (True, False):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="highlevel.finalrows"):
            spark_rest, stage = _stream(spec, files, tmp_path / f"rest{open_on_driver}", True,
                                        open_on_driver)
        assert stage.final_batches >= 3
        assert any("combined by Spark" in r.getMessage() for r in caplog.records)
        pd.testing.assert_frame_equal(spark_rest, ref)


def test_many_links_or_an_expression_take_the_other_paths():
    """A row is final only for its own link, and the driver writes plain outputs only."""
    from highlevel.finalrows import outputs_of
    from highlevel.windows import window_config

    def spec_of(text, links):
        qp = plan_text(text, links).query("q")
        spec = from_high_level(qp.high, qp.low)
        return spec, window_config(spec.window).build()

    one = "DEFINE { query_name q; } SELECT tb, srcIP, count(*) AS n FROM main.IPV4 " \
          "GROUP BY time/5 AS tb, srcIP"
    assert outputs_of(*spec_of(one, ["main"])) is not None
    merged = one.replace("FROM main.IPV4", "FROM [main, other].IPV4")
    assert outputs_of(*spec_of(merged, ["main", "other"])) is None
    having = one + " HAVING count(*) > 2"
    assert outputs_of(*spec_of(having, ["main"])) is None
    expression = one.replace("count(*) AS n", "count(*) * 2 AS n")
    assert outputs_of(*spec_of(expression, ["main"])) is None


def test_a_fanout_link_is_several_tables(spark, spooled, tmp_path):
    """A link captured by several fanout sockets has a table per socket: a group's row is
    final in its own socket's table only, so its stage combines every row."""
    spec, _ = spooled
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [ListSink()])
    assert stage.writes_final_rows and stage.computes_ahead
    stage.sublinks = {"main": ("main#0", "main#1")}
    assert not stage.writes_final_rows and not stage.computes_ahead
