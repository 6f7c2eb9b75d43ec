"""Helpers of the appliance's tests: the server process (`tools.serve.testing`) and what its
outputs and the traffic sender say."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from tools.serve.testing import Server, free_port, wait_for

__all__ = ["Server", "free_port", "wait_for", "read_output", "per_window", "burst_truth"]


def read_output(directory: Path) -> tuple[pa.Table | None, list[Path]]:
    """Every part file of an output directory (CSV), in name order, and the files."""
    files = sorted(Path(directory).glob("part-*.csv"))
    tables = [pacsv.read_csv(f) for f in files]
    return (pa.concat_tables(tables) if tables else None), files


def per_window(table: pa.Table | None, key: str = "tb", value: str = "packets") -> dict:
    """{window: value} of an output table, asserting no window appears twice."""
    if table is None:
        return {}
    keys = table.column(key).to_pylist()
    dup = sorted({k for k in keys if keys.count(k) > 1})
    assert not dup, f"windows written twice: {dup}"
    return dict(zip(keys, table.column(value).to_pylist()))


def burst_truth(lines: list[str]) -> dict:
    """{second: packets} of the sender's JSON lines."""
    out = {}
    for line in lines:
        if line.strip():
            rec = json.loads(line)
            out[rec["second"]] = rec["packets"]
    return out
