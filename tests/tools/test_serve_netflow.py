"""`oopscope serve --netflow-in`: a NETFLOW link of the appliance, as real processes. softflowd's
datagrams sent to a served UDP collector while a submitted query runs: per 5-tuple sums of
packets and bytes equal nfdump's over the same datagrams sent to a real nfcapd; the link's
counters in `status` and /metrics; a submission reading the link as packets (and a packet
link as NETFLOW) refused in one line; a restarted server decodes at once the data sets of
templates its previous life received."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.capture.test_capture_flowdecode import KEY, nfdump_records, softflowd_datagrams
from tests.conftest import free_udp_port, java_children, niceness, udp_port_bound
from tests.tools.serving import Server, cli_here, metric_samples, read_output, wait_for

QUERY = """
DEFINE { query_name 'flows'; }
SELECT tb, srcIP, destIP, srcPort, destPort, protocol, sum(packets) AS p, sum(bytes) AS b
FROM r1.NETFLOW
GROUP BY first/60000000000 AS tb, srcIP, destIP, srcPort, destPort, protocol
"""



def _send(port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))
            time.sleep(0.002)


def _link(server: Server) -> dict:
    (link,) = [s for s in server.client.status()["links"] if s["name"] == "r1"]
    return link


def _netflow(server: Server) -> dict:
    return _link(server)["netflow"]


def _start(args: list[str], state: Path, log: Path, port: int) -> Server:
    server = Server(args, state, log).start()
    wait_for(lambda: udp_port_bound(port), 60, "the collector's socket")
    return server


@pytest.mark.slow
def test_served_collector_of_softflowd_equals_nfdump(pcaps_dir, tmp_path):
    from capture.flowdecode import FlowDecoder

    datagrams = softflowd_datagrams(pcaps_dir / "skype.pcap", 9)
    port = free_udp_port()
    state = tmp_path / "state"
    query = tmp_path / "flows.gsql"
    query.write_text(QUERY)
    server = _start(["--netflow-in", f"r1=127.0.0.1:{port}",
                     "--link", f"main={pcaps_dir / 'NTPv4.pcap'}"],
                    state, tmp_path / "serve.log", port)
    try:
        server.wait_spark()
        # a collector's socket is a live link: the driver JVM below the low level's priority
        assert server.proc is not None
        jvms = java_children(server.proc.pid)
        assert len(jvms) == 1 and niceness(jvms[0]) == 5 and niceness(server.proc.pid) == 0
        reply = cli_here(server, "submit", str(query))
        assert "runs on r1" in reply.stdout
        # the NETFLOW link read as packets, a packet link read as NETFLOW: one line each
        (tmp_path / "bad.gsql").write_text("SELECT time, count(*) AS n FROM r1.IP "
                                           "GROUP BY time\n")
        bad = cli_here(server, "submit", str(tmp_path / "bad.gsql"), check=False)
        assert bad.returncode != 0
        assert bad.stderr.strip().count("\n") == 0, bad.stderr
        assert "carries NetFlow/IPFIX flow records" in bad.stderr and "r1.NETFLOW" in bad.stderr
        (tmp_path / "bad2.gsql").write_text("SELECT tb, count(*) AS n FROM main.NETFLOW "
                                            "GROUP BY first/60000000000 AS tb\n")
        bad2 = cli_here(server, "submit", str(tmp_path / "bad2.gsql"), check=False)
        assert bad2.returncode != 0 and bad2.stderr.strip().count("\n") == 0, bad2.stderr
        assert "carries packets" in bad2.stderr and "--netflow-in" in bad2.stderr
        conn, resp = server.client._open("POST", "/api/queries", {
            "text": (tmp_path / "bad.gsql").read_text(), "file": "bad.gsql"})
        try:
            assert resp.status == 400
            assert "r1.NETFLOW" in json.loads(resp.read())["error"]
        finally:
            conn.close()

        _send(port, datagrams)
        decoded = len(FlowDecoder().decode(datagrams, ["127.0.0.1"] * len(datagrams),
                                           [0] * len(datagrams))["bytes"])
        assert decoded > 100
        # a datagram is counted when it arrives and its records once decoded: wait for both
        nf = wait_for(lambda: (n := _netflow(server))["datagrams"] == len(datagrams)
                      and n["records"] >= decoded and n, 60, "every datagram decoded")
        assert nf["versions"] == {"9": len(datagrams)}
        assert nf["malformed"] == {} and nf["sequence_gaps"] == 0
        assert nf["records"] == decoded
        metrics = metric_samples(server.client)
        assert metrics[("oopscope_link_netflow_records_total", (("link", "r1"),))] \
            == nf["records"]
        assert metrics[("oopscope_link_netflow_malformed_total",
                        (("link", "r1"), ("reason", "no_template")))] == 0
        status = cli_here(server, "status").stdout
        assert f"link r1 (NETFLOW): {len(datagrams)} datagrams (v9: {len(datagrams)}), " \
            f"{nf['records']} records, 0 sequence gaps" in status
    finally:
        # the records the collector still holds are released at the stop, and every window
        # is closed and written
        assert server.stop() == 0, server.log()
    table, _ = read_output(state / "flows")
    assert table is not None, server.log()
    ours = table.to_pandas().rename(columns={"srcIP": "src", "destIP": "dst", "srcPort": "sport",
                                             "destPort": "dport", "protocol": "proto"})
    ours = ours.groupby(KEY)[["p", "b"]].sum().sort_index()
    theirs = nfdump_records(datagrams, tmp_path).groupby(KEY).agg(
        p=("packets", "sum"), b=("bytes", "sum")).sort_index()
    assert len(theirs) > 50
    assert int(ours["p"].sum()) == int(theirs["p"].sum())
    pd.testing.assert_frame_equal(ours, theirs, check_dtype=False)


@pytest.mark.slow
def test_restarted_server_knows_the_templates(pcaps_dir, tmp_path):
    """The collector keeps its templates in the state directory: the data sets sent to the
    restarted server, whose templates only the first life received, decode at once; the
    query submitted in the first life resumes and counts no record of a window written."""
    from capture.flowdecode import FlowDecoder

    datagrams = softflowd_datagrams(pcaps_dir / "skype.pcap", 9)
    rest = datagrams[1:]
    assert len(FlowDecoder().decode(rest, ["x"] * len(rest), [0] * len(rest))["bytes"]) == 0
    port = free_udp_port()
    state = tmp_path / "state"
    args = ["--netflow-in", f"r1=127.0.0.1:{port}"]
    query = tmp_path / "flows.gsql"
    query.write_text(QUERY)
    server = _start(args, state, tmp_path / "serve.log", port)
    try:
        server.wait_spark()
        cli_here(server, "submit", str(query))
        _send(port, datagrams[:1])
        wait_for(lambda: _netflow(server)["records"] > 0, 60, "the first records")
    finally:
        assert server.stop() == 0, server.log()
    assert (state / "run" / ".netflow" / "r1.json").is_file()
    before, _ = read_output(state / "flows")
    assert before is not None and len(before) > 0, server.log()
    server = _start(args, state, tmp_path / "serve.log", port)
    try:
        server.wait_spark()
        (info,) = server.client.queries()
        assert info["state"] == "running", info
        _send(port, rest)
        expected = len(FlowDecoder().decode(datagrams, ["127.0.0.1"] * len(datagrams),
                                            [0] * len(datagrams))["bytes"])
        first = len(FlowDecoder().decode(datagrams[:1], ["127.0.0.1"], [0])["bytes"])
        # a datagram is counted when it arrives and its records once decoded: wait for both
        nf = wait_for(lambda: (n := _netflow(server))["datagrams"] == len(rest)
                      and n["records"] >= expected - first and n,
                      60, "every datagram counted and decoded")
        assert nf["malformed"] == {}, nf
        assert nf["records"] == expected - first
    finally:
        assert server.stop() == 0, server.log()
    # the resumed query counts the records of the windows after those its first life wrote
    # (each of them closed at the shutdown), and none of theirs twice
    after, _ = read_output(state / "flows")
    rows = after.to_pandas()
    assert not rows.duplicated(["tb", "srcIP", "destIP", "srcPort", "destPort",
                                "protocol"]).any(), "a window's group was written twice"
    last = max(before.column("tb").to_pylist())
    cols = FlowDecoder().decode(datagrams, ["127.0.0.1"] * len(datagrams),
                                [0] * len(datagrams))
    tb = cols["first"][first:] // 60_000_000_000
    want = int(cols["packets"][first:][tb > last].sum())
    assert want > 0
    assert int(rows[rows.tb > last]["p"].sum()) == want
    assert len(rows[rows.tb <= last]) == len(before)


@pytest.mark.slow
def test_served_file_of_datagrams_replayed_by_capture_time(pcaps_dir, tmp_path):
    """oopscope's own exporter's IPFIX datagrams in a capture, 19 s of capture time replayed
    at --speed 0.5: the query submitted meanwhile counts every record of its windows (from
    the first after the records read before it; all of them when it came first), and those
    windows, closed when the file ends, sum to nfdump's per 5-tuple."""
    from capture.flowsource import read_datagrams
    from tests.capture.test_capture_flowdecode import _flow_table, _skype_flows
    from tools.netflow.exporter import Exporter

    pcap = tmp_path / "datagrams.pcap"
    ex = Exporter(None, 10, pcap=str(pcap), template_every_messages=8)
    ex.export(_flow_table(_skype_flows(pcaps_dir)))
    ex.close()
    dg = read_datagrams(pcap)
    span_s = (dg.arrivals[-1] - dg.arrivals[0]) / 1e9
    assert span_s > 10
    records = nfdump_records(dg.payloads, tmp_path, with_first=True)
    query = tmp_path / "flows.gsql"
    # 10-s windows: a submission that comes after the first records still has windows to count
    query.write_text(QUERY.replace("first/60000000000", "first/10000000000"))
    state = tmp_path / "state"
    # half speed: 38 s, still far longer than a submission takes and than Spark's start (a
    # query running costs CPU each second it runs: a quarter speed's 76 s checked no more)
    server = Server(["--netflow-in", f"r1={pcap}", "--speed", "0.5"], state,
                    tmp_path / "serve.log").start()
    started = time.monotonic()
    try:
        reply = cli_here(server, "submit", str(query))
        # a file of datagrams is no live link: the driver JVM at the usual priority
        assert server.proc is not None
        server.wait_spark()
        assert [niceness(j) for j in java_children(server.proc.pid)] == [0]
        (info,) = server.client.queries()
        if "counts the records from the first one read" in reply.stdout:
            counted = records
        else:
            # records were read before the submission (a busy machine): its windows start
            # after them, and each of those must be whole
            assert "its first window starts at record time" in reply.stdout, reply.stdout
            counted = records[records.first_ms * 10**6 >= info["first_window_ns"]]
        theirs = counted.groupby(KEY).agg(p=("packets", "sum"), b=("bytes", "sum")).sort_index()
        assert len(theirs) > 0, "every record was read before the submission"

        def written():
            table, _ = read_output(state / "flows")
            return table is not None and sum(table.column("p").to_pylist()) \
                == int(theirs["p"].sum()) and table
        table = wait_for(written, 240, "every window written")
        # windows close on the exporter's punctuation or the file's end, due by capture time
        # at half of real time (a lower bound: a busy machine only makes it later)
        assert time.monotonic() - started >= 2 * span_s * 0.9
        nf = _netflow(server)
        assert nf["datagrams"] == len(dg.payloads) and nf["versions"] == {"10": len(dg.payloads)}
    finally:
        assert server.stop() == 0, server.log()
    ours = table.to_pandas().rename(columns={"srcIP": "src", "destIP": "dst", "srcPort": "sport",
                                             "destPort": "dport", "protocol": "proto"})
    ours = ours.groupby(KEY)[["p", "b"]].sum().sort_index()
    pd.testing.assert_frame_equal(ours, theirs, check_dtype=False)


def test_a_netflow_link_that_cannot_open_stops_the_start(tmp_path):
    """A file that is no capture, and a collector's port another socket holds: the server
    does not start, and says why in one line naming the option."""

    from tests.conftest import REPO

    bad = tmp_path / "not.pcap"
    bad.write_text("hello\n")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        for source, why in ((str(bad), "not a pcap or pcapng file"),
                            (f"127.0.0.1:{port}", "cannot receive NetFlow there")):
            proc = subprocess.run([sys.executable, "-m", "tools.cli", "serve", "--netflow-in",
                                   f"r1={source}", "--state", str(tmp_path / "state")],
                                  cwd=REPO, capture_output=True, text=True, timeout=120)
            assert proc.returncode != 0
            line = proc.stderr.strip()
            assert "\n" not in line and f"--netflow-in r1={source}: " in line, line
            assert why in line, line


def test_socket_drops_of_a_paused_collector_shown(pcaps_dir, tmp_path, monkeypatch):
    """The server is stopped (SIGSTOP) while 20000 real v9 datagrams flood its collector:
    the socket's buffer holds a few thousand, the kernel drops the rest. Continued, the
    server reads the drops from /proc/net/udp; `status`, its line of `oopscope status` and
    /metrics show them, and every datagram sent is accounted for: decoded, or dropped at
    the socket or by the collector's queue.

    The server takes the operator's active timeout of the exporter (127.0.0.1=7s, beside
    the 30 min of the rest): the link's punctuation is its export time less 7 s, not 30 min.
    """
    # a small socket buffer, as the test's flood means to overflow it (the default holds it)
    monkeypatch.setenv("OOPSCOPE_NETFLOW_RCVBUF", str(1 << 21))
    import os
    import signal
    import struct

    from capture.flowsource import read_datagrams

    real = read_datagrams(pcaps_dir / "netflowv9.pcap").payloads
    (export_s,) = {struct.unpack_from(">I", d, 8)[0] for d in real}
    port = free_udp_port()
    server = _start(["--netflow-in", f"r1=127.0.0.1:{port}", "--netflow-in-active-timeout",
                     "127.0.0.1=7s"], tmp_path / "state", tmp_path / "serve.log", port)
    assert server.proc is not None
    sent = 20000
    try:
        nf = _netflow(server)
        assert nf["socket_drops"] == 0 and nf["queue_drops"] == 0
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                for i in range(sent):
                    s.sendto(real[i % len(real)], ("127.0.0.1", port))
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        nf = wait_for(lambda: (n := _netflow(server))["datagrams"] + n["socket_drops"]
                      + n["queue_drops"] == sent and n, 60, "every datagram accounted for")
        assert nf["socket_drops"] > 1000 and nf["datagrams"] > 1000, nf
        (link,) = [s for s in server.client.status()["links"] if s["name"] == "r1"]
        assert link["kernel_drops"] == nf["socket_drops"]
        punctuation = wait_for(lambda: _link(server)["punctuation_ns"], 30, "a punctuation")
        assert (export_s - 7) * 10**9 <= punctuation < (export_s + 60) * 10**9
        metrics = metric_samples(server.client)
        r1 = (("link", "r1"),)
        assert metrics[("oopscope_link_netflow_socket_drops_total", r1)] == nf["socket_drops"]
        assert metrics[("oopscope_link_netflow_queue_drops_total", r1)] == nf["queue_drops"]
        assert metrics[("oopscope_link_kernel_drops_total", r1)] == nf["socket_drops"]
        status = cli_here(server, "status").stdout
        assert f"{nf['socket_drops']} datagrams dropped at the socket, {nf['queue_drops']} " \
            "by the collector's queue" in status, status
    finally:
        assert server.stop() == 0, server.log()
