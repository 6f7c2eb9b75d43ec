"""`oopscope run` in a process of its own, as users start it: what the driver JVM prints.

The JVM's stderr passes through oopscope (`highlevel.session`): its start-up noise is dropped,
everything else shown; a JVM that cannot start is one clear error line, not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

NS = 1_000_000_000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory) -> Path:
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("jvm") / "main.pcap"
    cfg = TrafficConfig(packets=5_000, duration_ns=130 * NS, groups=50, seed=3)
    return generate(cfg.validate(), out)["l0"]


def _run(argv: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *argv], cwd=REPO,
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_run_prints_rows_and_summary_without_jvm_noise(small_capture, tmp_path):
    out = tmp_path / "q.csv"
    res = _run(["run", "q8_1", "--link", f"main={small_capture}", "--output", f"q8_1={out}"])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Using incubator modules" not in res.stderr
    assert "query q8_1:" in res.stderr and "run ended: end of input" in res.stderr
    rows = out.read_text().splitlines()
    assert rows[0].startswith("tb,") and len(rows) > 1


@pytest.mark.slow
def test_a_jvm_that_cannot_start_is_one_clear_error(small_capture, tmp_path):
    res = _run(["run", "q8_1", "--link", f"main={small_capture}", "--output",
                f"q8_1={tmp_path / 'q.csv'}"], JAVA_HOME=str(tmp_path / "no-java"))
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert "oopscope: error: Spark's JVM did not start" in res.stderr
    assert f"{tmp_path / 'no-java'}/bin/java (JAVA_HOME)" in res.stderr
    # the JVM's own words (the launcher's) are shown too, before ours
    assert "no-java/bin/java" in res.stderr.split("oopscope: error:")[0]
    # no output was started: no empty result file, nothing on stdout
    assert not (tmp_path / "q.csv").exists()
    res = _run(["run", "q8_1", "--link", f"main={small_capture}"],
               JAVA_HOME=str(tmp_path / "no-java"))
    assert res.returncode == 1 and res.stdout == ""
