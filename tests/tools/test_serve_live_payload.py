"""`oopscope serve` on a veth pair with a submitted query that reads payloads: the interface's
capture copies payloads only while such a query is attached, and the rows equal what the
test sent (the frames of `test_tools_run_live_payload`, replayed into the namespace)."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from tests.conftest import require_tool
from tests.tools.conftest import veth_pair
from tests.tools.serving import Server, read_output, wait_for
from tests.tools.test_tools_run_live_payload import QUERY, payload_traffic

pytestmark = [pytest.mark.needs_root, pytest.mark.slow]

#: the run test's queries, with 1-second windows (the first one starts within a second)
PAYLOAD_QUERIES = QUERY.replace("GROUP BY time/60 AS tb", "GROUP BY time AS tb")
COUNT = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets FROM main.IPV4 GROUP BY time AS tb;
"""


@pytest.fixture(scope="module")
def pair():
    yield from veth_pair("oopsvp")


def _query(server, name: str) -> dict:
    return next(q for q in server.client.queries() if q["name"] == name)


def _rows(directory) -> list[dict]:
    table = read_output(directory)[0]
    return [] if table is None else table.to_pylist()


def test_served_interface_captures_payloads_while_a_query_reads_them(pair, tmp_path):
    require_tool("tcpreplay")
    from scapy.all import IP, UDP, Ether, Raw, wrpcap

    pcap = tmp_path / "sent.pcap"
    hellos, gets, get_bytes, _ = payload_traffic(pcap)
    # payloads longer than the headers-only snap length: whole frames are kept while the
    # query runs
    long = tmp_path / "long.pcap"
    texts = [f"hello long {i} " + "y" * (300 + 200 * i) for i in range(5)]
    wrpcap(str(long), [Ether(src="02:00:5e:00:53:01", dst="02:00:5e:00:53:02") /
                       IP(src="198.51.100.1", dst="203.0.113.9") /
                       UDP(sport=40100, dport=5100) / Raw(t.encode()) for t in texts])
    hellos.update((40100, 5100, t) for t in texts)
    log = tmp_path / "serve.log"
    server = Server(["--interface", f"main={pair.outer}"], tmp_path / "state", log).start()
    try:
        server.wait_spark()
        server.client.submit(text=COUNT, file="persec.gsql")
        text = log.read_text()
        assert "payloads captured" not in text              # nobody reads them yet
        assert f"capture on {pair.outer} keeps 256 bytes of each frame" in text
        assert PAYLOAD_QUERIES != QUERY
        reply = server.client.submit(text=PAYLOAD_QUERIES, file="payloads.gsql", name="pl")
        text = log.read_text()
        assert "payloads captured (a query reads them)" in text
        assert f"capture on {pair.outer} keeps 262144 bytes of each frame" in text
        wait_for(lambda: time.time_ns() > reply["first_window_ns"], 15, "the first window")
        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, "--pps=500", str(pcap)])
        pair.run_inside(["tcpreplay", "-q", "-i", pair.inner, "--pps=500", str(long)])
        # every row written while it runs (a cancel would close the windows with the
        # packets routed so far: the first batch waits for the payload kernels' compilation).
        # `gets` has a row per (second, destPort): the replay may straddle a second, so its
        # row count is not known in advance; its sums per destPort are
        # (generous: on a loaded machine the payload kernels' first compilation is slow; the
        # wait ends as soon as the rows are there, and says how far it got if they are not)
        def written() -> tuple[Counter, Counter]:
            h = Counter((r["srcPort"], r["destPort"], r["UDP_data"]) for r in
                        _rows(tmp_path / "state" / "pl.hellos"))
            g: Counter = Counter()
            for r in _rows(tmp_path / "state" / "pl.gets"):
                g[r["destPort"]] += r["n"]
            return h, g

        try:
            wait_for(lambda: written() == (hellos, gets), 240, "the rows of every packet sent")
        except AssertionError:
            h, g = written()
            raise AssertionError(f"{h.total()} of {hellos.total()} hellos and {g.total()} of "
                                 f"{gets.total()} gets written in 240 s:\n"
                                 f"{log.read_text()[-4000:]}") from None
        # the query's row count is the rows its files hold (counted as each batch ends)
        files_rows = sum(len(_rows(tmp_path / "state" / f"pl.{q}")) for q in ("hellos", "gets"))
        wait_for(lambda: _query(server, "pl")["rows_out"] == files_rows, 30,
                 f"the query's row count to reach the {files_rows} rows of its files")
        server.cli("cancel", "pl")
        wait_for(lambda: "payloads no longer captured" in log.read_text(), 15,
                 "the capture to stop copying payloads")
        assert log.read_text().count(f"capture on {pair.outer} keeps 256 bytes") == 2
    finally:
        assert server.stop() == 0, server.log()
    hellos_rows = read_output(tmp_path / "state" / "pl.hellos")[0].to_pylist()
    got_h = Counter((r["srcPort"], r["destPort"], r["UDP_data"]) for r in hellos_rows)
    assert got_h == hellos
    got_g: Counter = Counter()
    got_bytes: Counter = Counter()
    for r in read_output(tmp_path / "state" / "pl.gets")[0].to_pylist():
        got_g[r["destPort"]] += r["n"]
        got_bytes[r["destPort"]] += r["bytes"]
    assert got_g == gets and got_bytes == get_bytes
    status_drops = [line for line in log.read_text().splitlines() if "link main:" in line]
    assert status_drops and " 0 ring drops" in status_drops[-1]
