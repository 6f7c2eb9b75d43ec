"""Flow records in the Spark stage: unique rows skip the combine and give what combining gives."""

from __future__ import annotations

import ipaddress
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from highlevel.spec import from_high_level
from highlevel.spool import list_spool
from highlevel.stage import Stage
from highlevel.testing import ListSink, batch_frame, feed_spool
from queries.library import __file__ as library_init
from queries.planner import plan_text

NS = 1_000_000_000


@pytest.fixture(scope="module")
def flows(tmp_path_factory):
    """netflow.gsql over a generated link (3 minutes, many short flows), spooled in 6 pieces."""
    from capture.reader import read_all
    from queries.reference import evaluate_file
    from tools.traffic import TrafficConfig, generate

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
    stage = Stage(spec, ck.parent / "unused-spool", ck, [sink], spark=spark)
    for batch_id, chunk in enumerate(np.split(np.array(files, dtype=object), cuts)):
        if restart_after is not None and batch_id == restart_after:
            # a new process on the same checkpoint: resumes from the committed open state
            stage = Stage(spec, ck.parent / "unused-spool", ck, [sink], spark=spark)
        stage.process_batch(batch_frame(spark, spec, list(chunk)), batch_id)
    return sink.table().to_pandas(), stage, sink


def test_flow_rows_are_unique_and_pass_the_combine_by(spark, flows, tmp_path):
    qp, files, want, _ = flows
    spec = from_high_level(qp.high, qp.low)
    assert spec.extras["unique_rows"]
    # without the low plans (or over a plain aggregate) nothing is assumed unique
    assert not from_high_level(qp.high).extras["unique_rows"]
    cuts = [2, 4]                     # 3 micro-batches: windows close in each, some stay open
    got, stage, sink = _run(spark, spec, files, tmp_path / "ck-unique", cuts, restart_after=2)
    combined, _, _ = _run(spark, replace(spec, extras={"unique_rows": False}), files,
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
