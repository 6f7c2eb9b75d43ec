"""Disk faults under `oopscope run` (issue 25, item 5): a full or read-only file system for an
output or the spool ends the run with one line naming the path and the OS error, no
traceback, no torn row and no temporary left behind.

The file systems are small tmpfs mounts made by the test (root only; skipped otherwise).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from tests.conftest import REPO
from tests.tools.resuming import run_here

QUERY = """
DEFINE { query_name flows; }
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time AS tb, srcIP, destIP;
"""
FIELDS = 5          # the query's columns: every CSV line has as many fields


def _mount_tmpfs(path: Path, size: str = "256k", ro: bool = False):
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if ro else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.strip()}")


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "256k", ro: bool = False):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    _mount_tmpfs(path, size, ro)
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


def _remount_ro(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", "run", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def _one_line(proc: subprocess.CompletedProcess, path: Path, os_error: str) -> str:
    """The run failed with exactly one line naming `path` and `os_error`, no traceback."""
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "py4j" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("oopscope: error: ")
    assert str(path) in lines[0] and os_error in lines[0], lines[0]
    return lines[0]


# --- end to end ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def flows(tmp_path_factory) -> SimpleNamespace:
    """A 2-minute capture, its query (45k rows in 120 one-second windows, 2.2 MB of CSV) and
    the CSV of an undisturbed run."""
    d = tmp_path_factory.mktemp("disk-faults")
    pcap = d / "cap.pcap"
    # the set-up's commands in this process (run_here): neither fails, nor is checked by its
    # stderr
    run_here([sys.executable, "-m", "tools.cli", "gen", str(pcap), "-n", "50k",
              "--duration", "120s", "--groups", "2000"])
    query = d / "flows.gsql"
    query.write_text(QUERY)
    whole = d / "whole.csv"
    run_here([sys.executable, "-m", "tools.cli", "run", str(query), "--link", f"main={pcap}",
              "--output", f"flows={whole}"])
    return SimpleNamespace(dir=d, pcap=pcap, query=query,
                           lines=whole.read_text().splitlines())


def test_full_disk_output_keeps_whole_windows(flows):
    with tmpfs(flows.dir / "full") as full:
        out = full / "out.csv"
        proc = _run(str(flows.query), "--link", f"main={flows.pcap}",
                    "--output", f"flows={out}")
        line = _one_line(proc, out, "No space left on device")
        assert "holds the windows tb" in line
        lines = out.read_text().splitlines()
        assert os.listdir(full) == ["out.csv"]
    # no torn row: every line whole, the file a prefix of the undisturbed run's ending at a
    # window's last row, the windows the message names
    assert 1 < len(lines) < len(flows.lines)
    assert all(len(x.split(",")) == FIELDS for x in lines)
    assert lines == flows.lines[:len(lines)]
    last = lines[-1].split(",")[0]
    assert flows.lines[len(lines)].split(",")[0] != last
    assert f"tb {flows.lines[1].split(',')[0]} to {last} ({len(lines) - 1:,} rows)" in line


def test_read_only_output_fails_before_reading(flows):
    ro = flows.dir / "ro"
    with tmpfs(ro):
        # an earlier result there: a run that cannot write leaves it as it was
        (ro / "old.csv").write_text("old,rows\n")
        _remount_ro(ro)
        for out in (ro / "new.csv", ro / "old.csv"):
            proc = _run(str(flows.query), "--link", f"main={flows.pcap}",
                        "--output", f"flows={out}")
            _one_line(proc, out, "Read-only file system")
        assert sorted(os.listdir(ro)) == ["old.csv"]
        assert (ro / "old.csv").read_text() == "old,rows\n"


def test_full_spool(flows, tmp_path):
    with tmpfs(tmp_path / "spool") as spool:
        out = tmp_path / "out.csv"
        proc = _run(str(flows.query), "--link", f"main={flows.pcap}",
                    "--output", f"flows={out}", "--spool", str(spool / "s"))
        _one_line(proc, spool / "s" / "flows" / "partials", "No space left on device")
        left = [p.name for p in (spool / "s").rglob("*")]
    assert not [n for n in left if n.endswith(".tmp") or n.startswith(".")], left
    assert not out.exists()          # no row reached it: no empty file either


# --- the pieces ---------------------------------------------------------------------------------

def _output(path: Path, fmt: str = "csv"):
    from tools.results.appended import QueryOutput

    outputs = [SimpleNamespace(name="tb", type="uint"), SimpleNamespace(name="n", type="uint")]
    schema = pa.schema([("tb", pa.int64()), ("n", pa.int64())])
    return QueryOutput("q", outputs, fmt, str(path), schema, window="tb")


def _batch(first_window: int, windows: int, rows_per_window: int) -> pa.Table:
    tb = [first_window + w for w in range(windows) for _ in range(rows_per_window)]
    return pa.table({"tb": pa.array(tb, pa.int64()),
                     "n": pa.array(range(10**12, 10**12 + len(tb)), pa.int64())})


def test_output_on_full_file_system_keeps_whole_parts(tmp_path):
    from tools.errors import RunError

    with tmpfs(tmp_path / "fs", size="256k") as fs:
        out = _output(fs / "o.csv")
        out.open()
        faults = []
        out.on_fault = lambda: faults.append(1)
        out.write(0, _batch(0, 2, 10))                 # ~0.4 KB: fits
        # 40 windows of 5000 rows (80 KB each): some parts of whole windows fit, not all
        out.write(1, _batch(2, 40, 5000))
        assert out.fault is not None and faults == [1]
        out.write(2, _batch(42, 1, 10))                # after a fault: nothing more
        with pytest.raises(RunError) as err:
            out.close(complete=False)
        text = (fs / "o.csv").read_text()
    lines = text.splitlines()
    assert text.endswith("\n") and lines[0] == "tb,n"
    assert all(len(x.split(",")) == 2 for x in lines)
    windows = [int(x.split(",")[0]) for x in lines[1:]]
    assert windows[:20] == [0] * 10 + [1] * 10 and len(windows) > 20
    # whole windows only (a part holds at least PART_ROWS rows)
    assert windows.count(windows[-1]) == 5000 and max(windows) < 41
    assert out.held == len(windows) == out.rows
    assert str(fs / "o.csv") in str(err.value) and "No space left on device" in str(err.value)
    assert f"windows tb 0 to {windows[-1]} ({len(windows):,} rows)" in str(err.value)


def test_output_open_refuses_a_full_file_system(tmp_path):
    from tools.errors import RunError

    with tmpfs(tmp_path / "fs", size="64k") as fs:
        with contextlib.suppress(OSError), open(fs / "filler", "wb") as fh:
            fh.write(b"x" * (1 << 20))                 # fills it
        out = _output(fs / "o.csv")
        with pytest.raises(RunError, match="No space left on device"):
            out.open()
        assert sorted(os.listdir(fs)) == ["filler"]


def test_parquet_output_fault_removes_the_unreadable_file(tmp_path):
    from tools.errors import RunError

    with tmpfs(tmp_path / "fs", size="64k") as fs:
        out = _output(fs / "o.parquet", "parquet")
        out.open()
        out.write(0, _batch(0, 1, 10))
        out.write(1, _batch(1, 20, 5000))
        assert out.fault is not None
        with pytest.raises(RunError, match="Parquet file is removed"):
            out.close()
        assert os.listdir(fs) == []


def test_failed_run_leaves_an_existing_output_as_it_was(tmp_path):
    path = tmp_path / "o.csv"
    path.write_text("earlier\n")
    out = _output(path)
    out.open()
    out.close(complete=False)           # the run failed before any row
    assert path.read_text() == "earlier\n"
    new = _output(tmp_path / "new.csv")
    new.open()
    assert (tmp_path / "new.csv").exists()
    new.close(complete=False)
    assert not (tmp_path / "new.csv").exists()


def test_spool_writer_on_full_disk_removes_its_temporary(tmp_path):
    from common.errors import SpoolError
    from common.spool import SpoolWriter

    with tmpfs(tmp_path / "fs", size="64k") as fs:
        writer = SpoolWriter(fs, "q", "main", fsync=False, compression="none")
        rows = pa.table({"window": pa.array(range(20_000), pa.int64()),
                         "n": pa.array(range(20_000), pa.int64())})
        with pytest.raises(SpoolError) as err:
            writer.write(rows, 10)
        partials = fs / "q" / "partials"
        assert os.listdir(partials) == []
    assert "No space left on device" in str(err.value)
    assert str(partials / "main-000000000000.parquet") in str(err.value)
    assert writer.seq == 0                 # the next write retries the same file
