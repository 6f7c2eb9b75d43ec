"""Kill the stage with SIGKILL mid-run, start it again: every window written once, none lost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from common.spool import SpoolWriter
from highlevel.testing import random_partials
from tools.results.parts import ParquetSink

SECOND = 10**9


def _stage_cmd(tmp_path, *extra):
    return [sys.executable, "-m", "highlevel.testing", "run-stage", "--spool",
            str(tmp_path / "spool"), "--checkpoint", str(tmp_path / "ck"), "--out",
            str(tmp_path / "out"), "--links", "a", "--max-files", "2", *extra]


@pytest.mark.slow
def test_sigkill_and_restart_writes_every_window_exactly_once(tmp_path):
    rng = np.random.default_rng(4)
    writer = SpoolWriter(tmp_path / "spool", "demo", "a")
    fed = []
    for t in range(50, 58):                       # 8 files, each closing one window
        rows = random_partials(rng, [t, t + 1], 20)
        fed.append(rows.to_pandas())
        writer.write([rows], (t + 1) * SECOND)
    writer.write([], 10**4 * SECOND)
    sink = ParquetSink(tmp_path / "out")
    first = subprocess.Popen(_stage_cmd(tmp_path, "--timeout", "300"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while len(sink.files()) < 1 and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert len(sink.files()) >= 1, "the first run wrote no windows"
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, mid-batch or not
        first.wait()
    killed_after = len(sink.files())
    second = subprocess.run(_stage_cmd(tmp_path, "--available-now"), capture_output=True,
                            text=True, timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    got = sink.read().to_pandas()
    assert len(sink.files()) > killed_after        # the restart wrote the rest
    assert not got.duplicated(["tb", "srcIP", "port"]).any()
    want = pd.concat(fed).groupby("window").cnt.sum()
    assert got.groupby("tb").cnt.sum().to_dict() == want.to_dict()
