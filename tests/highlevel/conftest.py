"""Fixtures of the high-level tests: one SparkSession for the whole test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from highlevel.session import get_session

    # the session is process-wide and reused by every test (start-up costs seconds)
    return get_session()


def in_write_order(spool) -> None:
    """Give a spool's files modification times 10 ms apart, in the order they were written
    (their names): Spark's file source takes files in order of modification time, in
    milliseconds, and a tie falls back to directory order. A test that reads one file per
    micro-batch (`max_files_per_trigger=1`) and counts late rows needs that order; files
    written within the same millisecond would otherwise come in any order."""
    import os
    from pathlib import Path

    files = sorted(Path(spool).rglob("*.parquet"))
    base = max(p.stat().st_mtime_ns for p in files) if files else 0
    for i, path in enumerate(files):
        t = base + (i + 1) * 10_000_000
        os.utime(path, ns=(t, t))
