"""`oopscope serve --netflow-in`: one served NETFLOW link windowed on flow start and on flow
end at once, as real processes. softflowd's v9 datagrams of skype.pcap, and one more that
moves the exporter's clock an hour on (its records again, with a later export time: the
punctuation on both clocks passes every window), sent to a served UDP collector after two
queries were submitted, one windowed on `first`, one on `last` (and a third file holding one
query on each): each writes its windows before the server stops (closed by the link's
punctuation on its own clock), and their rows equal `oopscope run`'s for the same queries
over a capture of the same datagrams."""

from __future__ import annotations

import struct
import sys

import pandas as pd
import pytest

from tests.capture.test_capture_flowdecode import softflowd_datagrams
from tests.conftest import free_udp_port
from tests.tools.resuming import run_here
from tests.tools.serving import metric_samples, read_output, wait_for
from tests.tools.test_serve_netflow import _netflow, _send, _start

#: (query, clock): 10-s bins per source address
QUERIES = {"on_first": "first", "on_last": "last"}


def _query(name: str, clock: str) -> str:
    return (f"DEFINE {{ query_name {name}; }}\nSELECT tb, srcIP, sum(bytes) AS b, "
            f"sum(packets) AS p, count(*) AS n FROM r1.NETFLOW "
            f"GROUP BY {clock}/10000000000 AS tb, srcIP;\n")


def _an_hour_on(datagram: bytes) -> bytes:
    """A v9 datagram exported an hour later by the same exporter, next in sequence: its
    uptime and export time both move on, so its records' flow times stay what they were."""
    version, count, uptime, secs, seq = struct.unpack_from("!HHIII", datagram)
    assert version == 9
    return struct.pack("!HHIII", version, count, uptime + 3_600_000, secs + 3600,
                       seq + 1) + datagram[16:]


def _frame(table) -> pd.DataFrame:
    df = table.to_pandas() if hasattr(table, "to_pandas") else table
    df = df.astype({"tb": int, "b": int, "p": int, "n": int})
    assert not df.duplicated(["tb", "srcIP"]).any()
    return df.set_index(["tb", "srcIP"]).sort_index()[["b", "p", "n"]]


@pytest.mark.slow
def test_one_served_link_windowed_on_first_and_last(pcaps_dir, tmp_path):
    from tools.netflow.sender import PcapWriter

    datagrams = softflowd_datagrams(pcaps_dir / "skype.pcap", 9)
    datagrams.append(_an_hour_on(datagrams[-1]))

    # `run`'s rows: the same datagrams in a capture, both queries in one file each
    pcap = tmp_path / "dg.pcap"
    writer = PcapWriter(str(pcap))
    writer.send([(d, None, 1_431_969_808_000 + 1000 * i) for i, d in enumerate(datagrams)])
    writer.close()
    want = {}
    for name, clock in QUERIES.items():
        (tmp_path / f"{name}.gsql").write_text(_query(name, clock))
        out = tmp_path / f"run_{name}.csv"
        # the oracle: in this process (the server below is the process under test)
        proc = run_here([sys.executable, "-m", "tools.cli", "run",
                         str(tmp_path / f"{name}.gsql"), "--netflow-in", f"r1={pcap}",
                         "--output", f"{name}={out}"])
        assert " 0 late records" in proc.stderr, proc.stderr
        want[name] = _frame(pd.read_csv(out))
    # flow end differs from flow start: the two queries' windows are not the same
    assert not want["on_first"].index.equals(want["on_last"].index)
    assert len(want["on_last"]) > 20

    port = free_udp_port()
    state = tmp_path / "state"
    server = _start(["--netflow-in", f"r1=127.0.0.1:{port}"], state,
                    tmp_path / "serve.log", port)
    try:
        server.wait_spark()
        # the link punctuates `last` too from the first query windowed on it on
        for name, lanes in (("on_first", ["first"]), ("on_last", ["first", "last"])):
            reply = server.cli("submit", str(tmp_path / f"{name}.gsql"))
            assert "runs on r1" in reply.stdout and "from the first one read" in reply.stdout, \
                reply.stdout
            assert list(_netflow(server)["late_by_clock"]) == lanes
        # one submission whose two queries window the link on either clock
        both = tmp_path / "both.gsql"
        both.write_text("".join(_query(f"both_{n}", c) for n, c in QUERIES.items()))
        assert "runs on r1" in server.cli("submit", str(both), "--name", "both").stdout
        _send(port, datagrams)
        nf = wait_for(lambda: (n := _netflow(server))["datagrams"] == len(datagrams) and n,
                      60, "every datagram counted")
        assert nf["malformed"] == {} and nf["sequence_gaps"] == 0, nf
        assert nf["late_by_clock"] == {"first": 0, "last": 0} and nf["late"] == 0, nf

        # every window closes by the punctuation on its query's clock, the server running
        def written_as(stream: str, name: str):
            table, _ = read_output(state / stream)
            return table is not None and len(table) == len(want[name]) and table

        def written(name: str):
            return written_as(name, name)
        got = {name: wait_for(lambda n=name: written(n), 120, f"{name}'s windows")
               for name in QUERIES}
        got_both = {name: wait_for(lambda n=name: written_as(f"both.both_{n}", n), 120,
                                   f"both_{name}'s windows") for name in QUERIES}
        (link,) = [s for s in server.client.status()["links"] if s["name"] == "r1"]
        # the records as decoded by now (every window written): `nf` was read once every
        # datagram had arrived, when a busy machine may still be decoding them
        records = _netflow(server)["records"]
        assert records >= nf["records"]
        assert link["packets"] == records and link["ring_drops"] == 0, (link, records)
        metrics = metric_samples(server.client)
        for clock in ("first", "last"):
            assert metrics[("oopscope_link_netflow_clock_late_records_total",
                            (("clock", clock), ("link", "r1")))] == 0
        assert "late records (first: 0, last: 0)" in server.cli("status").stdout
    finally:
        assert server.stop() == 0, server.log()
    for name in QUERIES:
        pd.testing.assert_frame_equal(_frame(got[name]), want[name], check_dtype=False)
        pd.testing.assert_frame_equal(_frame(got_both[name]), want[name], check_dtype=False)
