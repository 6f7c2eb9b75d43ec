"""Helpers of the tests that kill `oopscope run` with SIGKILL and resume it: start the
command, kill it when a condition holds (its whole process group: Spark's JVM too), and read
its outputs as rows to compare with an uninterrupted run's."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import REPO

__all__ = ["run_command", "run_ok", "run_here", "kill_when", "csv_rows", "csv_windows",
           "parquet_rows", "table_rows"]


def run_command(query: str, links: dict[str, Path], outputs: dict[str, Path | str], *,
                speed: str, spool: Path | None = None, checkpoint: Path | None = None,
                extra: tuple[str, ...] = ()) -> list[str]:
    """The `oopscope run` command line; resumable when given both directories."""
    cmd = [sys.executable, "-m", "tools.cli", "run", query, "--speed", speed]
    for name, path in links.items():
        cmd += ["--link", f"{name}={path}"]
    for name, out in outputs.items():
        cmd += ["--output", f"{name}={out}"]
    if spool is not None and checkpoint is not None:
        cmd += ["--spool", str(spool), "--checkpoint", str(checkpoint)]
    return cmd + list(extra)


def run_ok(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a command to its end; it must succeed."""
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def run_here(cmd: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """`run_ok` (or, with check=False, `subprocess.run`) of an `oopscope` command line, in
    this process: `tools.cli.main` on the same arguments, its standard streams and its
    warnings (as the command prints them) captured. A run here shares the test process's
    Spark session (`highlevel.session`), where a process of its own starts a JVM (~6 of the
    ~8 CPU-seconds a small run costs). For a command that is not killed or signalled, and
    whose check is on what it writes: the process boundary is tested by the tests that
    kill it. Not for a `-` link: it reads descriptor 0, which no `sys.stdin` stands in for."""
    import contextlib
    import io
    import logging

    from tools.cli import LevelFormatter, main

    prefix = [sys.executable, "-m", "tools.cli"]
    assert cmd[:3] == prefix, cmd
    argv = cmd[3:]
    # stdout with a binary buffer under it: an output to `-` writes its bytes there
    raw = io.BytesIO()
    out, err = io.TextIOWrapper(raw, encoding="utf-8", write_through=True), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(LevelFormatter())
    verbose = sum(a.count("v") for a in argv if re.fullmatch(r"-v+", a))
    handler.setLevel(logging.WARNING if verbose == 0 else logging.INFO if verbose == 1
                     else logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(min(level, handler.level) if level else handler.level)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    out.flush()
    done = subprocess.CompletedProcess(cmd, code, raw.getvalue().decode(), err.getvalue())
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def kill_when(cmd: list[str], ready: Callable[[], bool], *, timeout: float = 300,
              poll: float = 0.02) -> str:
    """Start `cmd`, SIGKILL its process group as soon as `ready()` holds, and return what it
    wrote to stderr. Fails if it ends first or `ready` does not hold in time."""
    with tempfile.TemporaryFile("w+") as err:
        # stderr to a file: a pipe nobody reads could fill and stall the run
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while not ready():
                if proc.poll() is not None:
                    err.seek(0)
                    raise AssertionError(f"the run ended before it could be killed "
                                         f"(exit {proc.returncode}): {err.read()[-4000:]}")
                assert time.monotonic() < deadline, "the run did not get there in time"
                time.sleep(poll)
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
            err.seek(0)
            text = err.read()
    assert proc.returncode == -signal.SIGKILL, text[-4000:]
    return text


def csv_rows(path: Path) -> tuple[list[str], list[tuple[str, ...]]]:
    """A CSV output's header and rows."""
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        return header, [tuple(r) for r in reader]


def csv_windows(path: Path) -> int:
    """Distinct windows (first column) in a CSV output being written (its last line may be
    cut, so it is not counted)."""
    try:
        lines = path.read_text().splitlines()[1:]
    except (OSError, UnicodeDecodeError):
        return 0
    return len({ln.split(",", 1)[0] for ln in lines[:-1]})


def parquet_rows(path: Path) -> tuple[list[str], list[tuple[str, ...]]]:
    """A Parquet output's column names and rows (values as text, as a CSV reads)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return table.column_names, [tuple(str(v) for v in r.values()) for r in table.to_pylist()]


def table_rows(text: str) -> tuple[list[str], list[tuple[str, ...]]]:
    """An aligned text table's header and rows (columns two spaces or more apart), without
    the `window start (UTC)` column the table format adds for people (not a query column)."""
    lines = [re.split(r"\s{2,}", ln.strip()) for ln in text.splitlines() if ln.strip()]
    keep = [i for i, name in enumerate(lines[0]) if name != "window start (UTC)"]
    return [lines[0][i] for i in keep], [tuple(ln[i] for i in keep) for ln in lines[1:]]
