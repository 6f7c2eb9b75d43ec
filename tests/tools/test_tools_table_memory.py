"""Remembered table sizes (`tools.pipeline.tablesizes`): a query that runs again starts its
adaptive tables at the size they had. The precedence (a fixed size, the remembered one, the
declared count), the cap and the budget; the record and the checkpoint file refused when of
the wrong shape; and a resumable `run` killed with SIGKILL resumes with its grown table,
without the resizes a fresh run needs, with the rows of a fixed table."""

from __future__ import annotations

import json
import logging
import re

import pytest

from lowlevel.operator import LowLevelOperator
from lowlevel.sizing import first_slots
from queries.planner import plan_text
from tests.tools.resuming import csv_rows, kill_when, run_command, run_here
from tools.pipeline.tablesizes import TableLog
from tools.serve.submission import Record, RecordError

QUERY = ("DEFINE { query_name pairs; } SELECT tb, srcIP, destIP, count(*) AS n, sum(len) AS b "
         "FROM main.IPV4 GROUP BY time/10 AS tb, srcIP, destIP")


def _low(**sets):
    return plan_text(QUERY, ["main"], overrides={k: str(v) for k, v in sets.items()}) \
        .queries[0].low[0]


def test_remembered_size_comes_after_a_fixed_one_and_before_the_declared_count():
    declared = _low(expected_groups=100)
    assert declared.slots == 256 and declared.max_slots == 1 << 20
    # remembered beats declared, either way
    assert LowLevelOperator(declared, start_slots=8192).adaptive_slots == 8192
    assert LowLevelOperator(declared, start_slots=64).adaptive_slots == 64
    assert LowLevelOperator(declared).adaptive_slots == 256
    # capped by max_aggregate_slots
    capped = _low(expected_groups=100, max_aggregate_slots=4096)
    assert LowLevelOperator(capped, start_slots=1 << 20).adaptive_slots == 4096
    # a fixed table keeps its size, and is not adaptive
    fixed = _low(aggregate_slots=1024)
    op = LowLevelOperator(fixed, start_slots=1 << 16)
    assert op.adaptive_slots is None and op.counters["slots"] == 1024
    # the budget: a growth it refuses is halved until it fits
    granted: list[int] = []

    def allow(slots: int) -> bool:
        granted.append(slots)
        return slots <= 2048

    assert first_slots(256, 1 << 20, 1 << 14, allow) == 2048
    assert granted == [1 << 14, 1 << 13, 1 << 12, 2048]
    assert first_slots(256, 1 << 20, None, allow) == 256


def test_the_record_and_the_checkpoint_file_are_checked(tmp_path, caplog):
    good = {"name": "q", "file": "q.gsql", "text": QUERY, "tables": {"pairs": {"main": 4096}}}
    assert Record.parse("q", json.dumps(good).encode()).tables == {"pairs": {"main": 4096}}
    for bad in ({"pairs": {"main": "4096"}}, {"pairs": 4096}, {"pairs": {"main": 0}},
                {"pairs": {"main": 1 << 40}}, ["pairs"]):
        with pytest.raises(RecordError, match="tables: not"):
            Record.parse("q", json.dumps({**good, "tables": bad}).encode())
    # the checkpoint's file: written on news only, read back when resumed
    path = tmp_path / "tables.json"
    log = TableLog(path, resumed=True)
    assert log.slots("pairs", "main") is None
    log.note("pairs", "main", 4096)
    assert TableLog(path, resumed=True).slots("pairs", "main") == 4096
    assert TableLog(path, resumed=False).slots("pairs", "main") is None
    path.write_text('{"pairs": {"main": true}}')
    with caplog.at_level(logging.WARNING):
        assert TableLog(path, resumed=True).sizes == {}
    assert "not a record of table sizes" in caplog.text


def _table(summary: str) -> tuple[int, int]:
    """The slots and resizes of the run summary's `table N slots (K resizes)`."""
    m = re.search(r"table ([\d,]+) slots \((\d+) resizes\)", summary)
    assert m, summary
    return int(m.group(1).replace(",", "")), int(m.group(2))


@pytest.fixture(scope="module")
def many_groups(tmp_path_factory):
    """600 s of capture time, 500 packets/s over 1300 (srcIP, destIP) pairs: about 1270
    groups per 10-s window, far more than the 256 slots declared below, and well inside
    the 4096 slots they grow to (an estimate near 2048, the next step's threshold, would
    let a table that evicts a little grow once more at any window). Headers only (64-byte
    snap length): the query reads no payload, and at 24 MB instead of 112 MB (under the
    64 MB of `OverlappedStages`) a full-speed run's stages run once at the end instead of
    streaming beside the read (half the CPU)."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("tables") / "main.pcap"
    cfg = TrafficConfig(packets=300_000, duration_ns=600 * 10**9, groups=1300, seed=35,
                        snaplen=64)
    return generate(cfg.validate(), out)["l0"]


@pytest.mark.slow
def test_a_resumed_run_starts_at_its_grown_size(many_groups, tmp_path):
    query = tmp_path / "pairs.gsql"
    query.write_text(QUERY)
    spool, ck, out = tmp_path / "spool", tmp_path / "ck", tmp_path / "out.csv"
    grow = ("--set", "expected_groups=100")
    # paced at 50 x with a tick every 0.4 s: a spool file per 20 s of capture time, as at
    # 20 x with the default 1 s, in 40% of the wall time (a paced run's Spark stream polls
    # the spool all along, ~1 CPU-second per wall second); the table settles ~130 s into
    # the capture, leaving ~9 s of wall time to kill it before its end on a busy machine
    cmd = run_command(str(query), {"main": many_groups}, {"pairs": out}, speed="50",
                      spool=spool, checkpoint=ck,
                      extra=(*grow, "--punctuate-every", "0.4s"))
    tables = ck / "tables.json"
    seen: dict = {}

    def settled() -> bool:
        # the size it grew to has held for two more spool files (punctuations): grown to
        # its groups (a table still evicting estimates high, so it may grow once more)
        try:
            size = json.loads(tables.read_text())["pairs"]["main"]
        except (OSError, ValueError, KeyError):
            return False
        files = len(list((spool / "pairs" / "partials").glob("main-*.parquet")))
        if seen.get("size") != size:
            seen.update(size=size, files=files)
        return size >= 4096 and files >= seen["files"] + 2

    kill_when(cmd, settled, poll=0.02)
    had = json.loads(tables.read_text())["pairs"]["main"]
    resumed = run_here(cmd)
    assert "run resumed from its spool and checkpoint" in resumed.stderr, resumed.stderr
    # it started at the grown size: a run from the declared count needs two resizes to
    # get there (256 -> 1024 -> 4096); the resumed one none
    assert _table(resumed.stderr) == (had, 0), resumed.stderr
    fresh = run_here(run_command(str(query), {"main": many_groups},
                               {"pairs": tmp_path / "fresh.csv"}, speed="max", extra=grow))
    assert _table(fresh.stderr)[1] >= 2, fresh.stderr
    # a fixed table's rows are the resumed run's
    fixed = run_here(run_command(str(query), {"main": many_groups},
                               {"pairs": tmp_path / "fixed.csv"}, speed="max",
                               extra=("--set", "aggregate_slots=4096")))
    assert "table 4,096 slots (0 resizes)" in fixed.stderr, fixed.stderr
    header, rows = csv_rows(out)
    want_header, want = csv_rows(tmp_path / "fixed.csv")
    assert header == want_header and len(want) > 50000, len(want)
    assert sorted(rows) == sorted(want)


def test_the_progress_line_shows_each_querys_table():
    import io

    from tools.pipeline.progress import Progress

    progress = Progress(lambda: (1000, 20, 0, "12:00:01", "",
                                 [("pairs", 4096, 1.07), ("other", 1024, None)]),
                        stream=io.StringIO())
    line = progress.line()
    assert line.startswith("oopscope: 1,000 packets (")
    assert line.endswith(", 20 result rows, 0 drops, clock 12:00:01; pairs 4,096 slots, "
                         "1.07 partials/row; other 1,024 slots, - partials/row")
