"""Each format writer under each commit model (`tools.results`): one file appended with a
resume log, cut back to its last logged batch when resumed; part files written once; the same
bytes for the same rows whichever model wrote them."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from highlevel.errors import SinkError
from tools.errors import RunConfigError
from tools.results.appended import QueryOutput
from tools.results.formats import make_writer
from tools.results.parts import PartFiles, make_sink, part_sink

#: the part formats and the appended ones (a table is appended only: see tools.results.parts)
PART_FORMATS = ("csv", "jsonl", "parquet", "netflow")
APPENDED_FORMATS = ("csv", "jsonl", "table", "netflow")


def _batches() -> list[pa.Table]:
    """Three batches of two windows each: strings needing no quotes, one batch with a comma
    (quoted), floats with long shortest forms, a null."""
    def batch(tb, labels, floats):
        return pa.table({"tb": pa.array([tb, tb, tb + 1], pa.int64()),
                         "label": pa.array(labels, pa.string()),
                         "top": pa.array(floats, pa.float64()),
                         "cnt": pa.array([1, None, 3], pa.uint64())})
    return [batch(0, ["a", "b", "c"], [0.1 + 0.2, 3761.423, 1e17]),
            batch(2, ["a", "x,y", None], [1.0, -0.5, 2.5]),
            batch(4, ["é", "b", "c"], [5e-7, 2.0, 1.0])]


def _netflow_batches() -> list[pa.Table]:
    import numpy as np

    from tests.tools.test_tools_netflow_encoders import T0, table

    return [table(3, tb=np.full(3, T0 // 60_000_000_000 + k)) for k in range(3)]


def _rows(fmt: str) -> list[pa.Table]:
    return _netflow_batches() if fmt == "netflow" else _batches()


def _output(fmt, path, tables, *, resume_log=None, parts=None, writer=None):
    outputs = [SimpleNamespace(name=f.name, type="int64") for f in tables[0].schema]
    return QueryOutput("q", outputs, fmt, str(path), tables[0].schema, window="tb",
                       resume_log=resume_log, parts=parts, writer=writer)


def _writer(fmt):
    return make_writer(fmt, pace=0) if fmt == "netflow" else make_writer(fmt)


def _whole(fmt, path, tables) -> bytes:
    """The bytes of an output written in one run, batch after batch."""
    out = _output(fmt, path, tables, writer=_writer(fmt))
    out.open()
    for b, t in enumerate(tables):
        assert out.write(b, t)
    out.close()
    return path.read_bytes()


@pytest.mark.parametrize("fmt", APPENDED_FORMATS)
def test_appended_file_is_cut_back_to_its_last_logged_batch(tmp_path, fmt):
    tables = _rows(fmt)
    want = _whole(fmt, tmp_path / f"whole.{fmt}", tables)
    path, log = tmp_path / f"out.{fmt}", tmp_path / "out.json"
    first = _output(fmt, path, tables, resume_log=log, writer=_writer(fmt))
    first.open()
    assert first.write(0, tables[0]) and first.write(1, tables[1])
    logged = path.stat().st_size
    # a crash: half of batch 2's bytes reached the file, its log line did not
    with open(path, "ab") as fh:
        fh.write(b"torn half of a batch")
    assert path.stat().st_size > logged

    again = _output(fmt, path, tables, resume_log=log, writer=_writer(fmt))
    again.open()
    assert path.stat().st_size == logged                   # cut back to batch 1
    assert again.done_batch == 1
    assert again.write(1, tables[1]) is False               # the checkpoint's replay
    assert again.write(2, tables[2]) is True
    again.close()
    if fmt == "netflow":    # the resumed encoder starts its sequence numbers again
        assert path.read_bytes()[:logged] == want[:logged] and len(path.read_bytes()) > logged
    else:
        assert path.read_bytes() == want


def test_parquet_appended_resumes_from_its_parts(tmp_path):
    """Parquet has no footer until closed: a resumable output keeps its batches as part files
    and writes the file from them at the end."""
    tables = _batches()
    _whole("parquet", tmp_path / "whole.parquet", tables)
    want = pq.read_table(tmp_path / "whole.parquet")
    parts = PartFiles(tmp_path / "parts")
    first = _output("parquet", tmp_path / "out.parquet", tables, parts=parts)
    first.open()
    assert first.write(0, tables[0]) and first.write(1, tables[1])
    first.close(complete=False)                              # the run stopped: parts wait
    assert parts.batch_ids() == [0, 1] and not (tmp_path / "out.parquet").exists()

    again = _output("parquet", tmp_path / "out.parquet", tables, parts=PartFiles(parts.dir))
    again.open()
    assert again.write(1, tables[1]) is False
    assert again.write(2, tables[2]) is True
    again.close()
    assert pq.read_table(tmp_path / "out.parquet").equals(want)
    with pytest.raises(RunConfigError, match="cannot be cut back"):
        _output("parquet", tmp_path / "log.parquet", tables, resume_log=tmp_path / "log.json")


@pytest.mark.parametrize("fmt", PART_FORMATS)
def test_part_files_are_written_once_through_a_rename(tmp_path, fmt):
    tables = _rows(fmt)
    options = {"pace": 0} if fmt == "netflow" else {}
    sink = part_sink(fmt, tmp_path / "out", "g0001-", **options)
    assert sink.write(7, tables[0]) is True
    assert sink.write(7, tables[1]) is False                # a batch replayed after a crash
    assert sink.write(8, tables[1].slice(0, 0)) is True      # no rows: no file
    assert [p.name for p in sink.files()] == [f"part-g0001-0000000007.{sink.ext}"]
    assert not list(sink.dir.glob(".*"))                    # no temporaries left
    again = part_sink(fmt, tmp_path / "out", "g0001-", **options)   # a restarted server
    assert again.write(7, tables[0]) is False
    if fmt != "netflow":
        got = again.read(tables[0].schema)
        assert got.to_pylist() == tables[0].to_pylist()


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "netflow"])
def test_a_part_holds_the_bytes_of_the_appended_file(tmp_path, fmt):
    """One batch: its part file and the appended output are the same bytes (header, quoting,
    floats), so `serve` and `run` agree."""
    (table,) = _rows(fmt)[1:2]
    options = {"pace": 0} if fmt == "netflow" else {}
    sink = part_sink(fmt, tmp_path / "parts", **options)
    sink.write(0, table)
    (part,) = sink.files()
    assert part.read_bytes() == _whole(fmt, tmp_path / f"out.{fmt}", [table])
    if fmt == "csv":
        assert part.read_text().splitlines() == [
            "tb,label,top,cnt", "2,a,1,1", '2,"x,y",-0.5,', "3,,2.5,3"]


def test_floats_print_shortest_exact(tmp_path):
    path = tmp_path / "out.csv"
    _whole("csv", path, _batches()[:1])
    assert path.read_text().splitlines() == [
        "tb,label,top,cnt", "0,a,0.30000000000000004,1", "0,b,3761.423,", "1,c,1e+17,3"]


@pytest.mark.parametrize("split", [1, 2])
def test_a_rows_csv_bytes_do_not_depend_on_its_batch(tmp_path, split):
    """A string is quoted only when it needs quotes, so the rows of a batch with a comma and
    one without write the same bytes as the two in one batch (`run` and `serve` cut their
    batches differently)."""
    together = pa.concat_tables(_batches()[:2])
    apart = [together.slice(0, 3 * split), together.slice(3 * split)]
    one = _whole("csv", tmp_path / "one.csv", [together])
    two = _whole("csv", tmp_path / "two.csv", apart)
    assert one == two
    lines = one.decode().splitlines()
    assert '2,"x,y",-0.5,' in lines and "2,a,1,1" in lines and "0,a,0.30000000000000004,1" in lines


def test_a_table_is_never_part_files(tmp_path):
    with pytest.raises(SinkError, match="never as part files"):
        make_sink("table", tmp_path)
    with pytest.raises(SinkError, match="allowed: console, csv, parquet, jsonl"):
        make_sink("xml", tmp_path)


def test_display_table_writes_ipv4_outputs_as_dotted_quads():
    """An `ipv4` output column (an integer) is written as the dotted quad `ipaddress` gives,
    nulls stay null, every chunk is converted, other columns are left as they are."""
    import ipaddress

    from tools.results.formats import display_table

    values = [0, 1, 0x0A000001, 0xC0A80101, 0x7F000001, 0xFFFFFFFF, 0x01020304, None]
    table = pa.Table.from_batches([
        pa.record_batch({"src": pa.array(values[:3], pa.int64()),
                         "n": pa.array([1, 2, 3], pa.int64())}),
        pa.record_batch({"src": pa.array(values[3:6], pa.int64()),
                         "n": pa.array([4, 5, 6], pa.int64())}),
        pa.record_batch({"src": pa.array(values[6:], pa.int64()),
                         "n": pa.array([7, 8], pa.int64())})])
    outputs = [SimpleNamespace(name="src", type="IPV4"), SimpleNamespace(name="n", type="int")]
    shown = display_table(table, outputs)
    assert shown.column("src").type == pa.string()
    assert shown.column("src").to_pylist() == \
        [None if v is None else str(ipaddress.IPv4Address(v)) for v in values]
    assert shown.column("n").to_pylist() == list(range(1, 9))
