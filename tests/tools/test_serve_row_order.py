"""DEFINE order_by in the appliance: a submitted query's part files hold each window's rows
in that order (the Spark stage orders what every display sink gets: `run`'s outputs and
`serve`'s parts and tails alike)."""

from __future__ import annotations

import ipaddress

import pytest

from tests.tools.serving import Server, read_output, wait_for

RANKED = """
DEFINE { query_name ranked; order_by 'bytes DESC, srcIP'; }
SELECT tb, srcIP, SUM(len) AS bytes, COUNT(*) AS packets
FROM main.IPV4
GROUP BY time AS tb, srcIP;
"""


@pytest.mark.slow
def test_a_submitted_querys_windows_are_ranked(ten_seconds_pcap, tmp_path):
    state = tmp_path / "state"
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"], state,
                    tmp_path / "serve.log").start()
    try:
        server.wait_spark()
        server.client.submit(text=RANKED, file="ranked.gsql", outputs={"ranked": "ranked"})
        wait_for(lambda: server.client.queries()[0]["rows_out"] >= 100, 90, "ranked rows")
        server.client.cancel("ranked")
    finally:
        code = server.stop()
    assert code == 0, server.log()
    table, files = read_output(state / "ranked")
    assert table is not None and files
    windows: dict[int, list[tuple[int, int]]] = {}
    for tb, ip, nbytes in zip(*(table.column(c).to_pylist() for c in ("tb", "srcIP", "bytes"))):
        windows.setdefault(tb, []).append((nbytes, int(ipaddress.ip_address(ip))))
    # bytes descending, ties by srcIP ascending (as numbers); the windows in order
    assert all(rows == sorted(rows, key=lambda r: (-r[0], r[1])) for rows in windows.values())
    assert list(windows) == sorted(windows)
    assert any(len(rows) > 1 and rows != sorted(rows) for rows in windows.values()), windows
