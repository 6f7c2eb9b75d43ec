"""Kill the stage with SIGKILL mid-run, start it again: every window written once, none lost."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from common.spool import SpoolWriter
from highlevel import testing
from highlevel.testing import random_partials
from tools.results.parts import ParquetSink

SECOND = 10**9


def _stage_cmd(tmp_path, *extra):
    return [sys.executable, "-m", "highlevel.testing", "run-stage", "--spool",
            str(tmp_path / "spool"), "--checkpoint", str(tmp_path / "ck"), "--out",
            str(tmp_path / "out"), "--links", "a", "--max-files", "2", *extra]


@pytest.mark.slow
def test_sigkill_and_restart_writes_every_window_exactly_once(spark, tmp_path):
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
    # the restart in this process, on the worker's Spark session (a JVM start less): the
    # process boundary that matters is the first run's, killed above
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = testing.main(_stage_cmd(tmp_path, "--available-now")[3:])
    assert code == 0 and out.getvalue().endswith("done\n"), out.getvalue()
    got = sink.read().to_pandas()
    assert len(sink.files()) > killed_after        # the restart wrote the rest
    assert not got.duplicated(["tb", "srcIP", "port"]).any()
    want = pd.concat(fed).groupby("window").cnt.sum()
    assert got.groupby("tb").cnt.sum().to_dict() == want.to_dict()
