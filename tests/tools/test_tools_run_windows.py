"""`oopscope run` with landmark and tuple-count windows over a real capture, against the reference.

The shipped `landmark_bytes` ([RANGE ALL, SLIDE 1 minute]: running totals per protocol) and
`packet_runs` ([PARTITION BY srcIP ROWS 100]: statistics per run of 100 packets of a source),
both in one run of the CLI over `synscan.pcap`, write the rows the reference evaluator gives.
"""

from __future__ import annotations

from tests.conftest import PCAPS
from tests.tools.test_tools_run import assert_same_rows, reference, run_cli


def test_landmark_and_rows_queries_on_a_real_capture(spark_session, tmp_path, capsys):
    from capture.reader import read_all

    pcap = PCAPS / "synscan.pcap"
    batches = {"main": read_all(pcap, "main")}
    for name in ("landmark_bytes", "packet_runs"):
        out = tmp_path / f"{name}.csv"
        code, _, err = run_cli(["run", name, "--link", f"main={pcap}", "--output",
                                f"{name}={out}", "--punctuate-every", "1s"], capsys)
        assert code == 0, err
        plan, want = reference(name, batches)
        assert len(want[name]) > 0
        assert_same_rows(out, want[name], plan.query(name))
        if name == "packet_runs":
            # full runs of 100 and one shorter last run per source
            counts = want[name].groupby("srcIP")["packets"]
            assert (want[name]["packets"] <= 100).all() and (counts.max() == 100).any()
        else:
            # running totals never decrease within a protocol
            for _, g in want[name].sort_values("window_end").groupby("protocol"):
                assert g["packets"].is_monotonic_increasing
