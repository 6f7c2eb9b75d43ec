"""`oopscope run` resumes after `kill -9` beyond one link, tumbling windows and CSV (issue 25,
item 6): two links, a sliding window, a query reading another, a Parquet output, a table on
stdout at full speed, and a replay at full speed killed in its low level and again in its
high level. Each resumed run's outputs must equal an uninterrupted run's, row for row, and
each kill must have come mid-run (some of the output or spool written, not all of it).

Few runs (Spark is slow to start): one query file holds every case; one uninterrupted run is
the reference, one paced run is killed and resumed, one full-speed run is killed twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.resuming import (
    csv_rows,
    csv_windows,
    kill_when,
    parquet_rows,
    run_command,
    run_here,
    table_rows,
)

NS = 1_000_000_000

QUERIES = """
DEFINE { query_name both; }
SELECT tb, srcIP, count(*) AS packets
FROM [link1, link2].IPV4
GROUP BY time/60 AS tb, srcIP;

DEFINE { query_name sliding; }
SELECT srcIP, COUNT(*) [RANGE 3 minutes, SLIDE 1 minute, WA time] AS Cnt
FROM link1.IPV4
GROUP BY srcIP;

DEFINE { query_name per_min; }
SELECT tb, destIP, count(*) AS Cnt, SUM(len) AS bytes
FROM link2.IPV4
GROUP BY time/60 AS tb, destIP;

DEFINE { query_name per_2min; }
SELECT tb2, destIP, SUM(Cnt) AS packets, MAX(bytes) AS peak_bytes
FROM per_min
GROUP BY tb/2 AS tb2, destIP;
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("resume_variants")


@pytest.fixture(scope="module")
def links(work) -> dict[str, Path]:
    """Two links of 10 minutes, 300k packets each, from one flow population."""
    from tools.gen.traffic import TrafficConfig, generate

    cfg = TrafficConfig(packets=300_000, duration_ns=600 * NS, groups=300, links=2, seed=7,
                        snaplen=64)
    paths = generate(cfg.validate(), work / "two.pcap")
    return {"link1": paths["l0"], "link2": paths["l1"]}


@pytest.fixture(scope="module")
def query(work) -> str:
    path = work / "resume.gsql"
    path.write_text(QUERIES)
    return str(path)


def _outputs(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)
    return {"both": d / "both.csv", "sliding": d / "sliding.csv",
            "per_min": d / "per_min.parquet", "per_2min": d / "per_2min.csv"}


def _read(path: Path) -> tuple[list[str], list[tuple[str, ...]]]:
    return parquet_rows(path) if path.suffix == ".parquet" else csv_rows(path)


def _same(got, want, what: str) -> None:
    (header, rows), (want_header, want_rows) = got, want
    assert header == want_header, what
    assert len(rows) == len(set(rows)), f"{what}: a row written twice"
    assert sorted(rows) == sorted(want_rows), f"{what}: not the uninterrupted run's rows"


@pytest.fixture(scope="module")
def reference(work, links, query) -> dict:
    """The uninterrupted run (no spool, no checkpoint kept): each query's header and rows."""
    outs = _outputs(work / "reference")
    run_here(run_command(query, links, outs, speed="max"))
    want = {q: _read(p) for q, p in outs.items()}
    for q, (_, rows) in want.items():
        assert len({r[0] for r in rows}) >= 5, f"{q}: too few windows to kill between"
    return want


def _part_rows(ck: Path, query: str) -> int:
    from tools.pipeline.resume import output_parts
    from tools.results.parts import PartFiles

    return PartFiles(output_parts(ck, query)).rows()


@pytest.fixture(scope="module")
def paced(work, links, query, reference) -> dict:
    """A paced resumable run killed while its outputs fill, then resumed: what each output
    held at the kill, the resumed run's stderr, and the final outputs. (Paced slowly
    enough that the stages, up some 20 s after the start on two cores, write windows one
    after the other; the query reading another starts writing last, maybe after the kill.)"""
    d = work / "paced"
    outs = _outputs(d / "out")
    spool, ck = d / "spool", d / "ck"
    cmd = run_command(query, links, outs, speed="12", spool=spool, checkpoint=ck)

    def ready() -> bool:
        return (all(csv_windows(outs[q]) >= 2 for q in ("both", "sliding"))
                and _part_rows(ck, "per_min") > 0)

    kill_when(cmd, ready, poll=0.05)
    at_kill = {q: csv_windows(outs[q]) for q in ("both", "sliding", "per_2min")}
    at_kill["per_min"] = _part_rows(ck, "per_min")
    # the Parquet output is written from its parts at the end: not yet
    assert not outs["per_min"].exists() or outs["per_min"].stat().st_size == 0
    resumed = run_here(cmd)
    return {"at_kill": at_kill, "stderr": resumed.stderr,
            "got": {q: _read(p) for q, p in outs.items()}}


def _killed_mid_run(paced, reference, query: str, some: bool = True) -> None:
    """The output held some (`some`) but not all of its windows (rows: Parquet) at the kill."""
    held, (_, rows) = paced["at_kill"][query], reference[query]
    total = len(rows) if query == "per_min" else len({r[0] for r in rows})
    assert (0 < held if some else 0 <= held) and held < total, \
        f"{query}: killed with {held} of {total} written: not mid-run"


def test_two_links_resume(paced, reference):
    _killed_mid_run(paced, reference, "both")
    # both links continued from the spool: the packets it held were read past
    assert "read past: link link1" in paced["stderr"], paced["stderr"][-2000:]
    assert "link link2" in paced["stderr"].split("read past:", 1)[1]
    _same(paced["got"]["both"], reference["both"], "both (two links)")


def test_sliding_window_resume(paced, reference):
    _killed_mid_run(paced, reference, "sliding")
    _same(paced["got"]["sliding"], reference["sliding"], "sliding")


def test_query_on_query_resume(paced, reference):
    """Killed while the query read had written part of its rows (see also the full-speed
    test, killed between the two queries' batches)."""
    _killed_mid_run(paced, reference, "per_min")
    _killed_mid_run(paced, reference, "per_2min", some=False)
    _same(paced["got"]["per_2min"], reference["per_2min"], "per_2min (reads per_min)")


def test_parquet_output_resume(paced, reference):
    _killed_mid_run(paced, reference, "per_min")
    _same(paced["got"]["per_min"], reference["per_min"], "per_min (Parquet)")


def test_full_speed_resume_killed_in_each_level(work, links, query, reference):
    """`--speed max`: killed while the low level reads (the spool holds some windows' rows),
    resumed and killed again while the Spark stages write, between the batch of `per_min`
    and that of `per_2min` which reads it (a table on stdout, written at the end, has its
    batch kept by then), then resumed to the end."""
    from common.spool import END_OF_INPUT, last_punctuations

    def punctuated(spool: Path) -> dict:
        return {link: p for link, (_, p) in last_punctuations(spool, "both").items()
                if p is not None}

    def killed_twice(d: Path) -> tuple[list[str], dict, str | None]:
        """Both kills; the command, the outputs and, if a kill missed its moment on a busy
        machine (the low level may end between a poll and the kill), why."""
        outs: dict = _outputs(d / "out")
        outs["both"] = "-"              # an aligned table on stdout: written at the end
        spool, ck = d / "spool", d / "ck"
        cmd = run_command(query, links, outs, speed="max", spool=spool, checkpoint=ck)
        kill_when(cmd, lambda: len(punctuated(spool)) == 2, poll=0.005)
        low = punctuated(spool)
        if not low or any(p == END_OF_INPUT for p in low.values()):
            return cmd, outs, f"killed after the low level had ended: {low}"
        if any(Path(ck, "outputs").glob("*.parts/part-*")):
            return cmd, outs, "killed after a stage wrote"
        kill_when(cmd, lambda: _part_rows(ck, "per_min") > 0)
        assert _part_rows(ck, "both") > 0           # the stages run in file order
        if csv_windows(outs["per_2min"]) != 0:
            return cmd, outs, "killed too late: per_2min was written"
        return cmd, outs, None

    missed = []
    for attempt in range(3):
        cmd, outs, why = killed_twice(work / f"max{attempt}")
        if why is None:
            break
        missed.append(why)
    else:
        raise AssertionError(f"no attempt was killed at its moment: {missed}")

    final = run_here(cmd)
    assert "read past: link link1" in final.stderr, final.stderr[-2000:]
    _same(table_rows(final.stdout), reference["both"], "both (table at full speed)")
    for q in ("sliding", "per_min", "per_2min"):
        _same(_read(outs[q]), reference[q], q)


def test_a_flow_query_resumes(work, links):
    """Flow records (the shipped `netflow`): a flow never outlives its bucket, so its record
    waits in the resumable spool for the punctuation that closes the bucket, as a pane's rows
    do; killed while the low level reads, resumed, the records equal an uninterrupted
    run's. (A table with room for every flow: which flow a full table ends early depends on
    what it held before the resumed pane.)"""
    import pyarrow.parquet as pq

    from common.spool import END_OF_INPUT, last_punctuations, list_spool

    d = work / "flows"
    spool, ck = d / "spool", d / "ck"
    wide = ("--set", "aggregate_slots=4194304")
    want = d / "want.csv"
    d.mkdir()
    run_here(run_command("netflow", {"main": links["link1"]}, {"netflow": want},
                         speed="max", extra=wide))
    got = d / "got.csv"
    cmd = run_command("netflow", {"main": links["link1"]}, {"netflow": got}, speed="max",
                      spool=spool, checkpoint=ck, extra=wide)

    def punctuation():
        return last_punctuations(spool, "netflow").get("main", (None, None))[1]

    # mid-capture, a few buckets in (a file per bucket at full speed): flows of the open
    # bucket have ended idle meanwhile
    kill_when(cmd, lambda: len(list_spool(spool, "netflow")) >= 4, poll=0.002)
    assert punctuation() != END_OF_INPUT, "killed after the low level had ended"
    # what the resume relies on: a file holds only records of buckets its punctuation closed
    records = 0
    for _, _, path in list_spool(spool, "netflow"):
        table = pq.read_table(path, columns=["window", "__punct"])
        punct = table.column("__punct").drop_null()
        bucket = table.column("window").drop_null().to_numpy()
        assert len(punct) == 1, path
        assert ((bucket + 1) * 60 * NS <= punct[0].as_py()).all(), path
        records += len(bucket)
    assert records > 0
    final = run_here(cmd)
    assert "read past: link main" in final.stderr, final.stderr[-2000:]
    assert "cannot resume" not in final.stderr
    _same(csv_rows(got), csv_rows(want), "netflow (flow records)")
