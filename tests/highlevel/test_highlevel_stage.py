"""Window closing in the Spark stage: exactly once, only when the Meld of every link allows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from common.spool import SpoolWriter, list_spool
from highlevel.aggregate import AggregateStage
from highlevel.testing import ListSink, batch_frame, demo_spec, random_partials

SECOND = 10**9


@pytest.mark.slow
def test_windows_close_exactly_once_under_random_punctuation(spark, tmp_path):
    rng = np.random.default_rng(2024)
    spec = demo_spec(query="rand", links=("a", "b"), registers=16)
    writers = {l: SpoolWriter(tmp_path / "spool", "rand", l) for l in spec.links}
    punct = {"a": 100, "b": 100}          # seconds; a link may only send panes >= its punct
    fed = []
    for _ in range(10):
        link = str(rng.choice(["a", "b"]))
        panes = np.arange(punct[link], punct[link] + 3)
        rows = random_partials(rng, panes, int(rng.integers(1, 25)), groups=4, query="rand")
        fed.append(rows)
        step = int(rng.integers(0, 3))
        punct[link] += step
        writers[link].write([rows], punct[link] * SECOND if step or rng.random() < .5 else None)
    for link in spec.links:
        writers[link].write([], 10**4 * SECOND)       # end of input
    files = [p for _, _, p in list_spool(tmp_path / "spool", "rand")]
    rng.shuffle(files)                                # the listing may see a link's files late
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    closes = []
    cuts = sorted(rng.choice(np.arange(1, len(files)), 3, replace=False).tolist())
    for batch_id, chunk in enumerate(np.split(np.array(files, dtype=object), cuts)):
        before = stage.state.punctuation
        stage.process_batch(batch_frame(spark, spec, list(chunk)), batch_id)
        closes.append((before, stage.state.punctuation))
    got = sink.table().to_pandas()
    keys = ["tb", "srcIP", "port"]
    assert not got.duplicated(keys).any()            # each (window, group) once
    for batch_id, table in sink.tables.items():
        before, after = closes[batch_id]
        ends = (np.array(table.column("tb").to_pylist()) + 1) * SECOND
        assert (ends <= after).all() and (before is None or (ends > before).all())
    # and all of it: the same totals as the partial rows fed
    fed_df = pd.concat([r.to_pandas() for r in fed])
    want = fed_df.groupby("window").cnt.sum().sort_index()
    assert got.groupby("tb").cnt.sum().sort_index().tolist() == want.tolist()
    assert stage.state.late_rows == 0


def test_silent_link_holds_windows_until_its_timer_punctuation(spark, tmp_path):
    rng = np.random.default_rng(5)
    spec = demo_spec(query="silent", links=("busy", "quiet"), registers=16)
    busy = SpoolWriter(tmp_path / "spool", "silent", "busy")
    quiet = SpoolWriter(tmp_path / "spool", "silent", "quiet")
    first = [busy.write([random_partials(rng, [t], 10, query="silent")], (t + 1) * SECOND)
             for t in range(20, 26)]
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    stage.process_batch(batch_frame(spark, spec, first), 0)
    assert sink.table() is None and stage.state.punctuation is None   # quiet never punctuated
    timer = quiet.write([], 23 * SECOND)                   # the quiet link's timer punctuation
    stage.process_batch(batch_frame(spark, spec, [timer]), 1)
    assert sorted(set(sink.table().column("tb").to_pylist())) == [20, 21, 22]
    assert stage.state.punctuation == 23 * SECOND
    # a re-run of a committed batch id writes nothing twice
    rows = sink.table().num_rows
    stage.process_batch(batch_frame(spark, spec, [timer]), 1)
    assert sink.table().num_rows == rows


def test_a_log_file_a_kill_interrupted_does_not_stop_the_next_start(spark, tmp_path):
    """A run killed while Spark wrote its first offsets file leaves the hidden temporary
    file behind; Spark 4 refuses a checkpoint with a file in `offsets` and no batch logged.
    The stage removes such leftovers when it starts, and runs."""
    rng = np.random.default_rng(7)
    spec = demo_spec(query="killed", links=("a",), registers=16)
    writer = SpoolWriter(tmp_path / "spool", "killed", "a")
    writer.write([random_partials(rng, [30, 31], 10, query="killed")], 32 * SECOND)
    writer.write([], 10**4 * SECOND)
    offsets = tmp_path / "ck" / "stream" / "offsets"
    offsets.mkdir(parents=True)
    (offsets / ".0.0d5e8c1a-tmp-left-by-a-kill.tmp").write_text("v1\n")
    (offsets / "..0.0d5e8c1a-tmp-left-by-a-kill.tmp.crc").write_bytes(b"crc")
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    stage.run_available()
    assert sorted(set(sink.table().column("tb").to_pylist())) == [30, 31]
    assert not [p for p in offsets.iterdir() if ".tmp" in p.name]
