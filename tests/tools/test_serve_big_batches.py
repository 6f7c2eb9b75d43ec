"""A batch larger than a tail's queue (a window with more groups than 10,000): its file holds
every row, the tail gets its last 10,000 rows and is told how many it did not get (turning
every row into JSON for a queue that would drop them cost each window a second)."""

from __future__ import annotations

import sys

import pyarrow.csv as pacsv
import pytest

from tests.tools.resuming import run_here
from tests.tools.serving import Server
from tools.serve.tail import TAIL_ROWS

pytestmark = pytest.mark.slow

QUERY = """
DEFINE { query_name pairs; }
SELECT tb, srcIP, destIP, count(*) AS packets
FROM main.IPV4
GROUP BY time/5 AS tb, srcIP, destIP;
"""


def test_a_batch_larger_than_a_tail_reaches_it_cut_and_counted(tmp_path):
    pcap = tmp_path / "many.pcap"
    # 60K packets of 30K (srcIP, destIP) pairs in 10 s: some 19K pairs per 5-s window
    run_here([sys.executable, "-m", "tools.cli", "gen", str(pcap), "-n", "60k",
              "--duration", "10s", "--groups", "30000"])
    server = Server(["--link", f"main={pcap}", "--loop"], tmp_path / "state",
                    tmp_path / "serve.log").start()
    try:
        server.wait_spark()
        server.client.submit(text=QUERY, file="pairs.gsql")
        seen, missed = [], 0
        for event in server.client.tail("pairs"):
            if event["event"] == "missed":
                missed += event["rows"]
            elif event["event"] == "rows":
                assert len(event["rows"]) <= TAIL_ROWS
                seen.append(event)
                if len(event["rows"]) == TAIL_ROWS:
                    break
    finally:
        assert server.stop() == 0, server.log()
    big = seen[-1]
    parts = [p for p in (tmp_path / "state" / "pairs").glob("part-g*-*.csv")
             if int(p.stem.rsplit("-", 1)[1]) == big["batch"]]
    assert len(parts) == 1, sorted(p.name for p in (tmp_path / "state" / "pairs").iterdir())
    written = pacsv.read_csv(parts[0], convert_options=pacsv.ConvertOptions(
        column_types={"srcIP": "string", "destIP": "string"})).to_pylist()
    assert len(written) > TAIL_ROWS
    # its last rows, in the file's order; the others counted as not shown
    cols = big["columns"]
    tail = [dict(zip(cols, row)) for row in big["rows"]]
    assert [(r["srcIP"], r["destIP"], r["packets"]) for r in tail] == \
        [(r["srcIP"], r["destIP"], r["packets"]) for r in written[-TAIL_ROWS:]]
    assert missed >= len(written) - TAIL_ROWS
