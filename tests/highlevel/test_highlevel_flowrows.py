"""Flow records in the Spark stage: unique rows skip the combine and give what combining gives."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.spool import list_spool
from highlevel.aggregate import AggregateStage
from highlevel.spec import StageExtras, from_high_level
from highlevel.testing import ListSink, batch_frame, feed_spool
from queries.library import __file__ as library_init
from queries.planner import plan_text

NS = 1_000_000_000


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    """netflow.gsql over a generated link (3 minutes, many short flows), spooled in 6 pieces."""
    from capture.reader import read_all
    from tests.oracles.reference import evaluate_file
    from tools.gen.traffic import TrafficConfig, generate

    work = tmp_path_factory.mktemp("flowrows")
    cfg = TrafficConfig(packets=20_000, duration_ns=180 * NS, groups=800, flows=2_000,
                        tcp=0.6, udp=0.35, icmp=0.05, ipv6=0.2, snaplen=96, seed=21)
    batch = read_all(generate(cfg.validate(), work / "f.pcap")["l0"], "main")
    text = (Path(library_init).parent / "netflow.gsql").read_text()
    # a table with room for every flow: an eviction (reason 5) is not in the reference
    plan = plan_text(text.replace("aggregate_slots 262144", "aggregate_slots 1048576"),
                     ["main"])
    qp = plan.query("netflow")
    feed_spool(qp.low, {"main": batch}, work / "spool", pieces=6)
    files = [p for _, _, p in list_spool(work / "spool", "netflow")]
    want = evaluate_file(plan, {"main": batch})["netflow"]
    return qp, files, want, work


def _run(spark, spec, files, ck, cuts, restart_after=None):
    sink = ListSink()
    stage = AggregateStage(spec, ck.parent / "unused-spool", ck, [sink], spark=spark)
    for batch_id, chunk in enumerate(np.split(np.array(files, dtype=object), cuts)):
        if restart_after is not None and batch_id == restart_after:
            # a new process on the same checkpoint: resumes from the committed open state
            stage = AggregateStage(spec, ck.parent / "unused-spool", ck, [sink], spark=spark)
        stage.process_batch(batch_frame(spark, spec, list(chunk)), batch_id)
    return sink.table().to_pandas(), stage, sink


@pytest.mark.slow
def test_flow_rows_are_unique_and_pass_the_combine_by(spark, flows, tmp_path):
    qp, files, want, _ = flows
    spec = from_high_level(qp.high, qp.low)
    assert spec.extras.unique_rows
    # without the low plans (or over a plain aggregate) nothing is assumed unique
    assert not from_high_level(qp.high).extras.unique_rows
    cuts = [2, 4]                     # 3 micro-batches: windows close in each, some stay open
    got, stage, sink = _run(spark, spec, files, tmp_path / "ck-unique", cuts, restart_after=2)
    combined, _, _ = _run(spark, replace(spec, extras=StageExtras(unique_rows=False)), files,
                       tmp_path / "ck-combine", cuts)
    assert len([t for t in sink.tables.values() if t.num_rows]) > 1   # several closes
    assert stage.state.late_rows == 0 and stage.state.open_dir is None   # all closed at the end
    keys = ["tb", "srcIP", "destIP", "srcPort", "destPort", "protocol", "first_ns"]
    assert len(got) == len(want) > 1000
    # identical to the combining path, row for row and in the same order
    pd.testing.assert_frame_equal(got.reset_index(drop=True), combined.reset_index(drop=True))
    # and to the reference evaluator (which knows nothing of flow ids)
    cols = list(want.columns)
    assert list(got.columns) == cols
    ref = want.copy()
    for c in ("srcIP", "destIP"):       # the reference's 128-bit values as `ipaddress` text
        ref[c] = [str(ipaddress.IPv4Address(int(v) & 0xFFFF_FFFF) if int(v) >> 32 == 0xFFFF
                      else ipaddress.IPv6Address(int(v))) for v in ref[c]]
    ours = got.sort_values(keys).reset_index(drop=True)
    ref = ref.sort_values(keys).reset_index(drop=True)
    for c in cols:
        assert ours[c].astype(str).tolist() == ref[c].astype(str).tolist(), c
    # the stage's order: by window, then the group keys
    order = got[["tb", "srcIP", "destIP"]]
    assert (np.diff(order["tb"].to_numpy().astype(np.int64)) >= 0).all()


def _stream(spec, spool, ck, sink, monkeypatch, on_driver: bool) -> AggregateStage:
    monkeypatch.setenv("OOPSCOPE_DRIVER_ROWS", "1" if on_driver else "0")
    stage = AggregateStage(spec, spool, ck, [sink], max_files_per_trigger=2)
    stage.run_available()
    return stage


@pytest.mark.slow
def test_flow_batches_closed_on_the_driver_equal_spark_s(spark, flows, tmp_path, monkeypatch):
    """Streamed flow records: batches closed on the driver (highlevel.flowrecords) give the
    rows the Spark job gives, in the same order; halfway through, the driver's open state is
    handed to a stage that closes through Spark (and the reverse), with the same result."""
    import shutil

    qp, files, want, _ = flows
    spec = from_high_level(qp.high, qp.low)

    def spool_of(name, parts):
        d = tmp_path / name / "netflow" / "partials"
        d.mkdir(parents=True)
        for f in parts:
            shutil.copy(f, d / f.name)
        return tmp_path / name

    results = {}
    for name, order in {"driver": (True, True), "spark": (False, False),
                        "driver-then-spark": (True, False),
                        "spark-then-driver": (False, True)}.items():
        spool, sink = spool_of(name, files[:3]), ListSink()
        first = _stream(spec, spool, tmp_path / f"ck-{name}", sink, monkeypatch, order[0])
        assert first.state.open_dir is not None          # rows left open for the next stage
        for f in files[3:]:
            shutil.copy(f, spool / "netflow" / "partials" / f.name)
        second = _stream(spec, spool, tmp_path / f"ck-{name}", sink, monkeypatch, order[1])
        assert second.state.open_dir is None and second.state.late_rows == 0
        assert (first.driver_batches > 0) == order[0] and (second.driver_batches > 0) == order[1]
        results[name] = sink.table().to_pandas()
    assert len(results["spark"]) == len(want) > 1000
    for name in ("driver", "driver-then-spark", "spark-then-driver"):
        pd.testing.assert_frame_equal(results[name], results["spark"], obj=name)


@pytest.mark.slow
def test_a_batch_computed_ahead_is_used_for_its_own_inputs_only(spark, flows, tmp_path):
    """`AggregateStage.speculate` (a run's low level ended before Spark's stream started): the
    next batch finds its closed and open rows computed, and writes what it would have
    computed; a batch over other files (one came after) computes its own."""
    import shutil

    qp, files, _, _ = flows
    spec = from_high_level(qp.high, qp.low)

    def run(name, speculate: bool, late_files=()):
        spool, sink = tmp_path / name, ListSink()
        d = spool / "netflow" / "partials"
        d.mkdir(parents=True)
        for f in files[:3]:
            shutil.copy(f, d / f.name)
        stage = AggregateStage(spec, spool, tmp_path / f"ck-{name}", [sink])
        stage.prune_spool = True          # as in a run: the next batch's files are the spool
        if speculate:
            assert stage.speculate()
        for f in late_files:
            shutil.copy(f, d / f.name)
        stage.run_available()
        first = (stage.ahead_batches, stage.state.open_dir is not None)
        for f in files[3 + len(late_files):]:
            shutil.copy(f, d / f.name)
        again = AggregateStage(spec, spool, tmp_path / f"ck-{name}", [sink])
        again.prune_spool = True
        assert again.speculate()          # the rest, over the open rows the first one left
        again.run_available()
        assert again.ahead_batches == 1 and again.state.open_dir is None
        return sink.table().to_pandas(), first

    plain, (ahead, left_open) = run("plain", False)
    assert ahead == 0 and left_open
    used, (ahead, left_open) = run("ahead", True)
    assert ahead == 1 and left_open
    pd.testing.assert_frame_equal(used, plain)
    other, (ahead, _) = run("other", True, late_files=files[3:4])
    assert ahead == 0                     # its files are not the ones computed with
    pd.testing.assert_frame_equal(other, plain)


def test_the_driver_path_is_only_taken_where_it_is_exact(spark, flows, tmp_path, monkeypatch):
    """Outputs that need an expression, HAVING, or a combine keep Spark's job."""
    from highlevel.flowrecords import FlowRecords
    from queries import expressions as E

    qp, _, _, _ = flows
    spec = from_high_level(qp.high, qp.low)
    make = lambda s: AggregateStage(s, tmp_path / "sp", tmp_path / "ck", [], spark=spark)  # noqa: E731
    assert make(spec).flow_records is not None
    monkeypatch.setenv("OOPSCOPE_DRIVER_ROWS", "0")
    assert make(spec).flow_records is None
    monkeypatch.delenv("OOPSCOPE_DRIVER_ROWS")
    assert make(replace(spec, extras=StageExtras(unique_rows=False))).flow_records is None
    first = spec.outputs[-1]
    doubled = replace(first, expr=E.Binary(op="*", left=first.expr,
                                           right=E.Literal(value=2, kind="int")))
    assert make(replace(spec, outputs=spec.outputs[:-1] + (doubled,))).flow_records is None
    assert make(replace(spec, having=E.Binary(op=">", left=first.expr,
                                              right=E.Literal(value=2, kind="int")))).flow_records \
        is None
    assert FlowRecords.of(spec, make(spec).window).layout[0][0] == "tb"
