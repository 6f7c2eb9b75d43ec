"""The Python of a Spark cluster's executors, checked when a session starts on it
(`highlevel.workerpython`): on a standalone cluster on loopback whose workers run this
interpreter the check passes and a stage that runs Python on the executors (a string
predicate over CSV records) gives the right rows; a worker Python without oopscope (named by
`spark.pyspark.python` in spark-defaults.conf, or by PYSPARK_PYTHON) stops `collect` with
one line saying what to do, not a stack trace, and `serve` reports the same line as its
Spark's state."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO, QuickCluster, quick_spark_conf
from tests.tools.test_tools_venv_install import QUERY, SCHEMA, records

pytestmark = pytest.mark.slow

PACKET_QUERY = """
DEFINE { query_name per_window; }
SELECT tb, srcIP, COUNT(*) AS packets FROM [l0].IPV4 GROUP BY time/5 AS tb, srcIP;
"""


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    with QuickCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cluster(quick) -> str:
    return quick.url


@pytest.fixture(scope="module")
def python_without_oopscope(tmp_path_factory) -> str:
    """A virtualenv's interpreter with no package at all: this Python's version (so Spark
    starts its workers), no oopscope, no numpy."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True,
                   timeout=120)
    return str(env / "bin" / "python")


def _environment(quick, **extra: str) -> dict[str, str]:
    """This process's environment without the PYSPARK_* a session started here may have
    set, with the quick cluster's SPARK_CONF_DIR, plus `extra`."""
    env = {k: v for k, v in quick.env().items() if not k.startswith("PYSPARK_")}
    return {**env, **extra}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=600, env=env)


def _assert_one_line(stderr: str, python: str, url: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr[-3000:]
    line = lines[0]
    assert line.startswith(f"oopscope: error: the executors of {url} cannot import oopscope: "
                           f"Python {python} on "), line
    assert "ModuleNotFoundError" in line and "docs/deployment.md" in line, line
    assert "spark.archives" in line


def test_the_check_passes_and_python_stages_run_on_the_cluster(cluster, quick, tmp_path):
    (tmp_path / "schema.txt").write_text(SCHEMA)
    (tmp_path / "q.gsql").write_text(QUERY.split("DEFINE { query_name odd")[0])
    rows = records()
    (tmp_path / "records.csv").write_text("".join(f"{t},{a},{b},{v}\n" for t, a, b, v in rows))
    res = _cli("-v", "run", str(tmp_path / "q.gsql"), "--schema", str(tmp_path / "schema.txt"),
               "--link", f"csv={tmp_path / 'records.csv'}", "--master", cluster,
               "--output", f"same={tmp_path / 'same.csv'}", env=_environment(quick))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "executors import oopscope (" in res.stderr, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    with open(tmp_path / "same.csv", newline="") as f:
        got = sorted((int(r["tick"]), r["left"], int(r["v"])) for r in csv.DictReader(f))
    assert got == sorted((t, a, v) for t, a, b, v in rows if a == b) and got


def test_a_worker_python_without_oopscope_stops_collect_in_one_line(
        cluster, quick, python_without_oopscope, tmp_path):
    # spark.pyspark.python in spark-defaults.conf wins over PYSPARK_PYTHON, as for
    # spark-submit (the environment names this interpreter, which has oopscope)
    conf = quick_spark_conf(tmp_path / "conf", f"spark.pyspark.python {python_without_oopscope}")
    (tmp_path / "q.gsql").write_text(PACKET_QUERY)
    spool = tmp_path / "spool"
    res = _cli("collect", str(tmp_path / "q.gsql"), "--spool", str(spool), "--links", "l0",
               "--master", cluster, "--output", f"per_window={tmp_path / 'out.csv'}",
               env=_environment(quick, SPARK_CONF_DIR=str(conf), PYSPARK_PYTHON=sys.executable))
    assert res.returncode == 1, res.stderr[-3000:]
    _assert_one_line(res.stderr, python_without_oopscope, cluster)
    assert not (tmp_path / "out.csv").exists() or (tmp_path / "out.csv").stat().st_size == 0


def test_serve_reports_the_check_as_its_sparks_state(cluster, quick, python_without_oopscope,
                                                      ten_seconds_pcap, tmp_path, monkeypatch):
    from tools.serve.testing import Server, wait_for

    monkeypatch.setenv("PYSPARK_PYTHON", python_without_oopscope)
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(quick.conf_dir))
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--master", cluster],
                    tmp_path / "state", tmp_path / "serve.log").start()
    try:
        spark = wait_for(lambda: (s := server.client.status()["spark"])["state"] == "failed"
                         and s, 300, "Spark's state: failed")
        assert spark["error"].startswith(
            f"the executors of {cluster} cannot import oopscope: Python "
            f"{python_without_oopscope} on "), json.dumps(spark)
        # the server stays up and says why in one log line (whole), without a stack trace
        assert server.proc is not None and server.proc.poll() is None
        log = server.log()
        assert "Traceback" not in log and "at org.apache" not in log, log
        said = [line for line in log.splitlines() if "cannot import oopscope" in line]
        assert len(said) == 1 and "docs/deployment.md" in said[0], log
    finally:
        server.stop()
