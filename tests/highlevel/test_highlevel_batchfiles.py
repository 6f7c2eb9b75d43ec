"""Markers from the driver (highlevel.batchfiles): the files of each micro-batch from the
stream's source log, each file's punctuation and rows from its footer, equal to what the
files hold (read back with pyarrow); a batch that may hold late rows, or a file without the
footer keys, goes to the Spark job, which counts the late rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.spool import LINK, PUNCT, SEQ, SpoolWriter, list_spool
from highlevel.aggregate import AggregateStage
from highlevel.batchfiles import batch_files, batch_markers, file_markers
from highlevel.testing import ListSink, demo_spec, random_partials
from tests.highlevel.conftest import in_write_order

SECOND = 10**9


def _written(path) -> dict:
    """The markers of a spool file, from its rows (the oracle)."""
    t = pq.read_table(path)
    is_row = np.asarray(t.column("window").is_valid())
    punct = [p for p, r in zip(t.column(PUNCT).to_pylist(), is_row) if not r]
    return {LINK: t.column(LINK)[0].as_py(), SEQ: t.column(SEQ)[0].as_py(),
            "p": max([p for p in punct if p is not None], default=None),
            "rows": int(is_row.sum())}


@pytest.mark.slow
def test_batch_files_and_footers_match_the_spool(spark, tmp_path):
    rng = np.random.default_rng(11)
    spec = demo_spec(query="bf", links=("a", "b"), registers=4)
    writers = {link: SpoolWriter(tmp_path / "spool", "bf", link) for link in spec.links}
    for i in range(7):
        link = "ab"[i % 2]
        rows = random_partials(rng, [10 + i, 11 + i], 20, registers=4, query="bf")
        writers[link].write([rows], None if i == 3 else (10 + i) * SECOND)
    writers["a"].write([], None)                 # no rows, no punctuation
    for w in writers.values():
        w.write([], (1 << 63) - 1)
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [ListSink()], spark=spark,
                  max_files_per_trigger=3)
    stage.run_available()
    stream = tmp_path / "ck" / "stream"
    listed = []
    for b in range(stage.state.batch + 1):
        paths = batch_files(stream, b)
        assert paths is not None and 0 < len(paths) <= 3
        listed += paths
        markers = [file_markers(p) for p in paths]
        assert [{LINK: m.link, SEQ: m.seq, "p": m.punctuation, "rows": m.rows}
                for m in markers] == [_written(p) for p in paths]
    assert sorted(listed) == sorted(p for _, _, p in list_spool(tmp_path / "spool", "bf"))
    assert batch_files(stream, stage.state.batch + 1) is None        # no such batch
    # markers from the footers: nothing was late, every row kept
    assert stage.state.late_rows == 0
    got = batch_markers(stream, 0, lambda pane: (pane + 1) * SECOND, None)
    assert [(f.rows, f.late, f.kept) for f in got] == [(f.rows, 0, f.rows) for f in got]


@pytest.mark.slow
def test_possible_late_rows_and_foreign_files_go_to_the_spark_job(spark, tmp_path):
    rng = np.random.default_rng(12)
    spec = demo_spec(query="late", links=("a",), registers=4)
    w = SpoolWriter(tmp_path / "spool", "late", "a")
    w.write([random_partials(rng, [20, 21], 10, registers=4, query="late")], 30 * SECOND)
    # panes 5 and 45: pane 5 ended long before P = 30 s, so its rows are late
    late = random_partials(rng, [5, 45], 40, registers=4, query="late")
    n_late = int((np.asarray(late.column("window")) == 5).sum())
    w.write([late], (1 << 63) - 1)
    in_write_order(tmp_path / "spool")
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [ListSink()], spark=spark,
                  max_files_per_trigger=1)
    stage.run_available()
    assert stage.state.batch == 1 and n_late > 0
    assert stage.state.late_rows == n_late
    stream = tmp_path / "ck" / "stream"
    pane_end = lambda pane: (pane + 1) * SECOND          # noqa: E731
    assert batch_markers(stream, 1, pane_end, 30 * SECOND) is None
    assert batch_markers(stream, 1, pane_end, None) is not None      # before any punctuation
    # a Parquet file without the footer keys (another writer): no markers from it
    plain = tmp_path / "plain-000000000000.parquet"
    pq.write_table(pa.table({"window": pa.array([1], pa.int64())}), plain)
    assert file_markers(plain) is None


def test_rows_kept_in_memory_stay_for_a_look_ahead_and_go_with_their_reader(tmp_path):
    """`cached_rows(path, keep=True)` (a batch computed ahead) leaves the rows for the batch
    itself; the batch's own read takes them, and they are gone after."""
    from common.spool import cached_rows

    rng = np.random.default_rng(3)
    rows = random_partials(rng, [1, 2], 30, registers=4, query="kept")
    path = SpoolWriter(tmp_path / "spool", "kept", "a", keep_in_memory=True).write([rows], 5)
    ahead = cached_rows(path, keep=True)
    assert ahead is not None and ahead.num_rows == rows.num_rows
    assert cached_rows(path, keep=True).equals(ahead)
    assert cached_rows(path).equals(ahead)
    assert cached_rows(path) is None and cached_rows(path, keep=True) is None


@pytest.mark.slow
def test_spark_path_reads_the_batch_files_as_parquet(spark, tmp_path):
    """With markers from the footers, the Spark path's frame is the batch's spool files read
    as Parquet (a file scan, not foreachBatch's RDD of rows), holding exactly their rows."""
    rng = np.random.default_rng(13)
    spec = demo_spec(query="pq", links=("a", "b"), registers=4)
    writers = {link: SpoolWriter(tmp_path / "spool", "pq", link) for link in spec.links}
    for i in range(4):
        rows = random_partials(rng, [10 + i, 11 + i], 30, registers=4, query="pq")
        writers["ab"[i % 2]].write([rows], (10 + i) * SECOND)
    for w in writers.values():
        w.write([], (1 << 63) - 1)
    sink = ListSink()
    stage = AggregateStage(spec, tmp_path / "spool", tmp_path / "ck", [sink], spark=spark)
    stage.run_available()
    assert sum(t.num_rows for t in sink.tables.values()) > 0
    files = batch_markers(tmp_path / "ck" / "stream", 0, lambda pane: (pane + 1) * SECOND, None)
    assert files is not None and all(f.path is not None for f in files)
    frame = stage.spool_frame(files)
    assert frame is not None
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "ExistingRDD" not in plan
    columns = [f.name for f in spec.partial_schema().fields]
    got = frame.where("window IS NOT NULL").select(*columns).toArrow()
    want = pa.concat_tables([pq.read_table(f.path, columns=columns) for f in files if f.rows])
    want = want.filter(want.column("window").is_valid())
    key = [(c, "ascending") for c in columns]
    assert got.sort_by(key).to_pylist() == want.cast(got.schema).sort_by(key).to_pylist()
