"""`oopscope bench disorder --case netflow`: on a small router export, the punctuation
policy's rows equal the batch answer computed from the exported flows themselves; a slack
below the disorder's bound loses records."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from tools.experiments.nfdisorder import RouterConfig, router_flows, run_case, write_datagrams

SMALL = RouterConfig(flows=3000, duration_s=300, sources=50, seed=5)


def _expected(table) -> pd.DataFrame:
    """The query's answer over the flow table the exporter was given (not the datagrams)."""
    df = table.to_pandas()
    _, src = np.unique(df.srcIP.to_numpy(), return_inverse=True)
    df = pd.DataFrame({"tb": df.first_ns // (60 * 10**9), "src": src.reshape(-1),
                       "bytes": df.bytes})
    return df.groupby(["tb", "src"]).agg(bytes=("bytes", "sum"), records=("bytes", "size"))


@pytest.mark.parametrize("version", [9, 10], ids=lambda v: f"v{v}")
def test_punctuation_rows_equal_the_batch_answer(tmp_path, version):
    table = router_flows(SMALL)
    pcap = tmp_path / "router.pcap"
    write_datagrams(table, pcap, version)
    report = run_case(pcap, keep_rows=True)
    want = _expected(table)
    assert report["records"] == table.num_rows and len(want) > 100
    got = report["answers"]["punctuation 60 s"]
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    # the disorder is real: records come behind the largest flow start seen
    assert report["records_behind_max_start"] > table.num_rows // 2


def test_bench_command_netflow_case(tmp_path):
    from tools.commands.bench import bench

    table = router_flows(SMALL)
    pcap = tmp_path / "router.pcap"
    write_datagrams(table, pcap, 9)
    out = tmp_path / "report.json"
    result = CliRunner().invoke(bench, ["disorder", "--case", "netflow", "--netflow-in",
                                        str(pcap), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "punctuation 60 s" in result.output and "slack 0 s" in result.output
    report = json.loads(out.read_text())
    assert report["workloads"] == []
    rows = len(_expected(table))
    policies = {p["policy"]: p for p in report["netflow"]["policies"]}
    exact = policies["punctuation 60 s"]
    assert exact["rows"] == exact["rows_equal"] == rows and exact["late"] == 0
    # the default timeout (30 min) is exact too, but holds every record to the end
    assert policies["punctuation 1800 s"]["rows_equal"] == rows
    assert policies["punctuation 1800 s"]["held_peak"] == table.num_rows
    # a slack of the same bound is exact; none at all loses records and rows
    assert policies["slack 60 s"]["rows_equal"] == rows
    assert policies["slack 0 s"]["late"] > 0 and policies["slack 0 s"]["rows_equal"] < rows
