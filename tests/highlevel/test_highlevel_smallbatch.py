"""Small aggregation batches combined on the driver (highlevel.smallbatch) give the rows the
Spark path gives, for every kind of sub-aggregate, with windows left open between batches."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from common.spool import list_spool
from highlevel import smallbatch
from highlevel.aggregate import AggregateStage
from highlevel.spec import from_high_level
from highlevel.testing import ListSink, feed_spool
from queries.planner import plan_text

NS = 1_000_000_000
QUERY = """
DEFINE { query_name kinds; aggregate_slots 64; }
SELECT tb, srcIP, count(*) AS n, sum(len) AS bytes, min(len) AS lo, max(destPort) AS hi,
       OR_AGGR(flags) AS fl, AND_AGGR(ttl) AS ta, XOR_AGGR(len) AS x, FIRST(destPort) AS f,
       LAST(len) AS l, COUNT_DISTINCT(destIP) AS d, AVG(len) AS a, max(destMAC) AS m,
       min(srcMAC) AS sm
FROM main.IPV4
GROUP BY time/5 AS tb, srcIP
HAVING count(*) > 2
"""


@pytest.fixture(scope="module")
def spooled(tmp_path_factory):
    from capture.reader import read_all
    from tools.gen.traffic import TrafficConfig, generate

    work = tmp_path_factory.mktemp("smallbatch")
    cfg = TrafficConfig(packets=6_000, duration_ns=60 * NS, groups=40, tcp=0.6, udp=0.4,
                        icmp=0.0, seed=5)
    batch = read_all(generate(cfg.validate(), work / "k.pcap")["l0"], "main")
    plan = plan_text(QUERY, ["main"])
    qp = plan.query("kinds")
    # a small table: evictions give several partial rows per (window, group) to combine
    feed_spool(qp.low, {"main": batch}, work / "spool", pieces=12, disorder_ns=2 * NS)
    files = [p for _, _, p in list_spool(work / "spool", "kinds")]
    return from_high_level(qp.high, qp.low), files


def _stream(spec, files, root, small: bool, per_trigger: int | None,
            open_on_driver: bool = False):
    spool = root / "spool"
    d = spool / "kinds" / "partials"
    d.mkdir(parents=True)
    for i, f in enumerate(files):
        shutil.copy(f, d / f.name)
        # Spark's file source takes files in mtime order, and copies made within one
        # millisecond would reach it in any order: the batches would differ between runs
        os.utime(d / f.name, ns=(0, (1_700_000_000 + i) * NS))
    sink = ListSink()
    stage = AggregateStage(spec, spool, root / "ck", [sink], max_files_per_trigger=per_trigger)
    stage.small_on_driver = small
    stage.open_on_driver = open_on_driver
    stage.run_available()
    return sink.table().to_pandas(), stage


@pytest.mark.slow
def test_small_batches_on_the_driver_equal_the_spark_path(spark, spooled, tmp_path):
    spec, files = spooled
    assert {s.kind for s in spec.states} >= {"count", "sum", "min", "max", "and", "or", "xor",
                                             "first", "last", "distinct"}
    driver, stage = _stream(spec, files, tmp_path / "driver", True, 2)
    # the oracle: the Spark path over every file at once (one micro-batch of ~1.5 CPU-s,
    # where 2 files a batch took 7), the rows the driver's batches must add up to
    ref, plain = _stream(spec, files, tmp_path / "spark", False, None)
    assert stage.driver_batches > 3 and plain.driver_batches == 0
    assert stage.state.open_dir is None and stage.state.late_rows == 0
    assert len(ref) > 20
    pd.testing.assert_frame_equal(driver, ref, check_exact=False, rtol=1e-12)


@pytest.mark.slow
def test_one_job_batches_equal_the_spark_path(spark, spooled, tmp_path, caplog):
    """The appliance's large batches (past the driver's limit) close their windows and
    collect the open rows in one Spark job (`AggregateStage.close_keeping`): the same rows
    as two jobs over all the files at once, HAVING and every kind of state included, with
    windows left open between batches."""
    import logging

    spec, files = spooled
    with caplog.at_level(logging.DEBUG, logger="highlevel.microbatch"):
        one, stage = _stream(spec, files, tmp_path / "one", False, 2, open_on_driver=True)
    assert sum("(one job)" in r.getMessage() for r in caplog.records) >= 3
    ref, plain = _stream(spec, files, tmp_path / "spark", False, None)
    assert stage.driver_batches == 0 and stage.state.open_dir is None
    assert len(ref) > 20
    pd.testing.assert_frame_equal(one, ref, check_exact=False, rtol=1e-12)


def test_combine_by_hand():
    """Three partial rows of one group and one of another, every kind's super-aggregate."""
    from queries.plan import SubAggregate

    states = (SubAggregate("c", "count", None, "int64"), SubAggregate("u", "max", None, "uint64"),
              SubAggregate("f", "first", None, "int64"), SubAggregate("b", "and", None, "int64"))
    big = np.array([1, 2**63 + 5, 7, 9], dtype=np.uint64).view(np.int64)
    table = pa.table({"window": [4, 4, 4, 5], "k": ["x", "x", "x", "y"],
                      "c": [2, 3, 4, 1], "u": big, "f": [10, 11, 12, 13],
                      "f__t": [30, 20, 20, 5], "b": [0b111, 0b110, 0b011, 1]})
    out = smallbatch.combine(table, ["window", "k"], states, 0).to_pylist()
    assert out == [
        {"window": 4, "k": "x", "c": 9, "u": int(big[1]), "f": 11, "f__t": 20, "b": 0b010},
        {"window": 5, "k": "y", "c": 1, "u": 9, "f": 13, "f__t": 5, "b": 1}]


def test_combine_ip_min_max_by_hand():
    """MIN/MAX over addresses on the driver: the halves as one 128-bit unsigned number
    (only the low half differs; halves at and above 2^63), a group of one row."""
    from queries.plan import SubAggregate

    states = (SubAggregate("m", "min", None, "ip"), SubAggregate("x", "max", None, "ip"))
    hi = np.array([5, 5, 2**63, 2**64 - 1, 7], dtype=np.uint64).view(np.int64)
    lo = np.array([2**63 + 1, 2**63, 0, 3, 2**64 - 1], dtype=np.uint64).view(np.int64)
    table = pa.table({"window": [4, 4, 4, 4, 5], "k": ["a", "a", "a", "a", "b"],
                      "m__hi": hi, "m__lo": lo, "x__hi": hi, "x__lo": lo})
    out = smallbatch.combine(table, ["window", "k"], states, 0).to_pylist()
    unsigned = [{c: int(np.int64(v).view(np.uint64)) if c[0] in "mx" else v
                 for c, v in row.items()} for row in out]
    assert unsigned == [
        {"window": 4, "k": "a", "m__hi": 5, "m__lo": 2**63, "x__hi": 2**64 - 1, "x__lo": 3},
        {"window": 5, "k": "b", "m__hi": 7, "m__lo": 2**64 - 1, "x__hi": 7,
         "x__lo": 2**64 - 1}]


def test_the_warm_up_runs_the_appliance_paths(spark, tmp_path, caplog):
    """`serve`'s warm-up (`highlevel.warmup`) goes through the paths its stages take: a
    batch past the driver's limit closed in one Spark job, then a small one on the driver."""
    import logging

    from highlevel.warmup import warm_up

    with caplog.at_level(logging.DEBUG, logger="highlevel"):
        warm_up(spark, tmp_path)
    lines = [r.getMessage() for r in caplog.records if "query warmup: batch" in r.getMessage()]
    assert any("batch 0 timings" in m and "(one job)" in m for m in lines), lines
    assert any("batch 1 timings" in m and "(small, on the driver)" in m for m in lines), lines
