"""What a query carries across the appliance's restarts (`tools.serve.carryover`), without a
server: the rows of real part files counted and read back, the counters a record keeps."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tools.results.parts import part_sink
from tools.serve.carryover import CARRIED, Tally, last_rows, output_rows
from tools.serve.submission import Record, RecordError

# a string with a comma, a quote and a line break: quoted in CSV, so a line is not a row
AWKWARD = 'a,b "c"\nd'


def _table(start: int, n: int) -> pa.Table:
    return pa.table({"tb": list(range(start, start + n)),
                     "note": [AWKWARD if i % 2 else "plain" for i in range(n)]})


def _write(directory, fmt: str, generation: int, batch: int, table: pa.Table) -> None:
    sink = part_sink(fmt, directory, f"g{generation:04d}-")
    assert sink.write(batch, table)


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_rows_in_part_files_are_counted_and_read_back(tmp_path, fmt):
    d = tmp_path / "out.csv"                      # a directory, whatever its name says
    _write(d, fmt, 1, 0, _table(0, 3))           # an earlier submission of the name
    _write(d, fmt, 2, 0, _table(10, 4))
    _write(d, fmt, 2, 3, _table(15, 1))          # no quoted field in it
    _write(d, fmt, 2, 7, _table(20, 5))
    _write(d, fmt, 3, 1, _table(30, 2))          # the next generation (a clean restart)
    (d / f".part-g0003-0000000002.{fmt}.99.tmp").write_text("a part cut short\n1\n2\n")
    (d / "notes.txt").write_text("not a part\n")
    assert output_rows(d, fmt, first_generation=2) == 4 + 1 + 5 + 2
    assert output_rows(d, fmt, first_generation=1) == 3 + 4 + 1 + 5 + 2
    assert output_rows(tmp_path / "none", fmt) == 0
    columns, rows = last_rows(d, fmt, 2, limit=4)
    assert columns == ["tb", "note"]
    # the newest rows, oldest first, across files (generation 3's after generation 2's)
    assert [int(r[0]) for r in rows] == [23, 24, 30, 31]
    assert rows[-1][1] == AWKWARD and rows[-2][1] == "plain"
    assert [int(r[0]) for r in last_rows(d, fmt, 3, limit=10)[1]] == [30, 31]


def _record(**fields) -> Record:
    return Record(name="persec", file="persec.gsql", text="SELECT 1", **fields)


def test_counters_carried_over_a_crash_and_a_clean_restart():
    live = {k: 10 for k in CARRIED}
    first = _record(generation=1)
    tally = Tally(first)
    assert tally.totals(live) == live             # a new submission: nothing carried
    tally.keep(first, live)
    saved = Record.parse("persec", json.dumps(first.__dict__).encode())
    assert saved.counted["totals"] == live
    # after a crash (the same generation) the process counters start again from zero,
    # while the checkpoint gives back the stage's zero-divisor rows: not counted twice
    crashed = Tally(saved)
    again = {k: 0 for k in CARRIED} | {"zero_divisor_rows": 10, "partial_rows": 3}
    totals = crashed.totals(again)
    assert totals["partial_rows"] == 13 and totals["evictions"] == 10
    assert totals["zero_divisor_rows"] == 10
    # after a clean stop the next generation starts every counter, checkpoint too, at zero
    saved.generation = 2
    fresh = Tally(saved).totals({k: 1 for k in CARRIED})
    assert fresh == {k: 11 for k in CARRIED}


@pytest.mark.parametrize("counted", [{"totals": {"rows": "7"}}, {"totals": [1]}, [1],
                                     {"generation": True}, {"rows": {"persec": [1, 2]}},
                                     {"rows": {"persec": [1, 2, "3"]}}])
def test_a_record_with_unsound_counters_is_refused(counted):
    body = {"name": "persec", "file": "persec.gsql", "text": "SELECT 1", "counted": counted}
    with pytest.raises(RecordError, match="counted"):
        Record.parse("persec", json.dumps(body).encode())
    body["counted"], body["first_generation"] = {}, 0
    with pytest.raises(RecordError, match="first_generation"):
        Record.parse("persec", json.dumps(body).encode())


def test_a_start_reads_only_the_part_files_after_the_mark(tmp_path):
    d = tmp_path / "persec"
    for batch, n in ((0, 3), (1, 4), (2, 5)):
        _write(d, "csv", 1, batch, _table(batch * 10, n))
    record = _record(generation=1)
    stream = "persec"
    # a crash left batches 0-2 written: the checkpoint replays 0-2, finding their files;
    # the mark moves only once the replay has passed the files found at the start
    tally = Tally(record)
    assert tally.rows_at_start(stream, d, "csv", 1) == 12
    for batch in (0, 1):
        tally.batch_ended(stream, batch, 12)
        tally.keep(record, {})
        assert record.counted["rows"] == {}
    tally.batch_ended(stream, 2, 12)
    _write(d, "csv", 1, 3, _table(30, 2))
    tally.batch_ended(stream, 3, 14)
    tally.keep(record, {})
    assert record.counted["rows"] == {stream: [1, 3, 14]}
    # batch 4 written, then a crash before its end: the next start adds its file only
    _write(d, "csv", 1, 4, _table(40, 6))
    (d / "part-g0001-0000000000.csv").unlink()       # files up to the mark are not read
    saved = Record.parse("persec", json.dumps(record.__dict__).encode())
    assert Tally(saved).rows_at_start(stream, d, "csv", 1) == 14 + 6
    # a clean restart: the next generation's files are added after the mark too
    saved.generation = 2
    _write(d, "csv", 2, 0, _table(50, 1))
    assert Tally(saved).rows_at_start(stream, d, "csv", 1) == 14 + 6 + 1
