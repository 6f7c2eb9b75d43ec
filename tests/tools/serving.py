"""Helpers of the appliance's tests: the server process (`tools.serve.testing`) and what its
outputs and the traffic sender say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from tests.conftest import REPO
from tools.serve.testing import Server, free_port, wait_for

__all__ = ["Server", "Sender", "free_port", "wait_for", "read_output", "per_window",
           "burst_truth", "cli_here"]


def cli_here(server: Server, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`server.cli`, the client command run in this process (`tests.tools.resuming.run_here`):
    its exit code and output as a process's, without a Python start (~0.4 CPU s) per
    command. For commands whose process is not what the test checks."""
    from tests.tools.resuming import run_here

    res = run_here([sys.executable, "-m", "tools.cli", *args, "--server", server.client.server],
                   check=False)
    if check and res.returncode != 0:
        raise AssertionError(f"oopscope {' '.join(args)} -> {res.returncode}:\n{res.stdout}\n"
                             f"{res.stderr}\nserver log:\n{server.log()}")
    return res


def metric_samples(client) -> dict:
    """`/metrics` as {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    conn, resp = client._open("GET", "/metrics")
    try:
        assert resp.status == 200
        text = resp.read().decode()
    finally:
        conn.close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


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


class Sender:
    """`tools.gen.bursts` inside the namespace; `lines` are the bursts sent so far."""

    def __init__(self, pair, seconds: int, per_burst: int = 150):
        self.proc = subprocess.Popen(pair.inside([sys.executable, "-m", "tools.gen.bursts",
                                                  pair.inner, "--per-burst", str(per_burst),
                                                  "--seconds", str(seconds)]),
                                     cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []

    def read(self, n: int = 1) -> list[str]:
        """Wait for the next `n` bursts."""
        assert self.proc.stdout is not None
        for _ in range(n):
            line = self.proc.stdout.readline()
            assert line, f"the sender stopped: {self.proc.stderr.read() if self.proc.stderr else ''}"
            self.lines.append(line)
        return self.lines

    def stop_between_bursts(self) -> None:
        """Read one more burst line, then stop the sender before the next burst begins."""
        self.read(1)
        self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        # through the same buffered reader as `read` (communicate() would bypass its buffer)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.lines += [line for line in self.proc.stdout.read().splitlines() if line.strip()]
        assert self.proc.wait(timeout=120) == 0, self.proc.stderr.read()

    @property
    def truth(self) -> dict:
        return burst_truth(self.lines)
