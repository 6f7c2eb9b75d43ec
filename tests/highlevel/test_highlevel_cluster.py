"""The same stage on a Spark standalone cluster (master + worker on loopback) and on local[*]."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from common.spool import SpoolWriter
from highlevel.aggregate import AggregateStage
from highlevel.testing import demo_spec, random_partials
from tests.conftest import QuickCluster
from tools.results.parts import ParquetSink

SECOND = 10**9


@pytest.mark.slow
def test_standalone_cluster_gives_the_rows_of_local_mode(spark, tmp_path):
    rng = np.random.default_rng(99)
    spec = demo_spec(query="demo", links=("a", "b"))
    for link in spec.links:
        w = SpoolWriter(tmp_path / "spool", "demo", link)
        for t in range(30, 34):
            w.write([random_partials(rng, [t, t + 1], 30)], (t + 1) * SECOND)
    local = ParquetSink(tmp_path / "local")
    AggregateStage(spec, tmp_path / "spool", tmp_path / "ck-local", [local], spark=spark).run_available()
    with QuickCluster(tmp_path / "cluster") as cluster:
        url = cluster.url
        done = subprocess.run(
            [sys.executable, "-m", "highlevel.testing", "run-stage", "--spool",
             str(tmp_path / "spool"), "--checkpoint", str(tmp_path / "ck-cluster"), "--out",
             str(tmp_path / "cluster-out"), "--master", url, "--available-now"],
            capture_output=True, text=True, timeout=300, env=cluster.env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"master={url} executors=1" in done.stdout
    want = local.read().sort_by([("tb", "ascending"), ("srcIP", "ascending"),
                                 ("port", "ascending")])
    got = ParquetSink(tmp_path / "cluster-out").read().sort_by(
        [("tb", "ascending"), ("srcIP", "ascending"), ("port", "ascending")])
    assert want.num_rows > 0 and sorted(set(want.column("tb").to_pylist())) == [30, 31, 32, 33]
    assert got.equals(want)
