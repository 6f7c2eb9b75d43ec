"""One `--netflow-in` collector link fed by three real exporters at once (oopscope's own,
each from its own address): two with different clocks and versions, and a third that sends
its options (its active timeout: 18 h) and then stays silent. The operator's timeout for
the silent one (`--netflow-in-active-timeout EXPORTER=D`) goes before the 18 h it claims,
so it holds no window back: every window closes while the run still runs, and every
record is counted once (the sums per window equal nfdump's over the same datagrams, with a
real nfcapd as the oracle)."""

from __future__ import annotations

import re
import socket
import struct
import time
from pathlib import Path

import pandas as pd
import pytest

from capture.flowsource import read_datagrams
from tests.capture.test_capture_flowdecode import _flow_table, nfdump_records
from tests.capture.test_capture_flowreader import ipfix_active_timeout
from tests.conftest import free_udp_port
from tests.tools.test_tools_run_netflow_collector import start, stop, wait_for, written

#: the exporters' addresses (every 127/8 address is the loopback on Linux)
A, B, SILENT = "127.0.0.2", "127.0.0.3", "127.0.0.4"
#: B's clock runs this far ahead of A's (ns): at the moment A exports T, B exports T + this
B_AHEAD_NS = 45 * 10**9


def _flows(pcap: Path, shift_ns: int = 0) -> pd.DataFrame:
    """A capture's IPv4 flows per 5-tuple in order of flow end (as an exporter's cache
    expires them), their times moved by `shift_ns`."""
    from capture.reader import read_all

    c = read_all(pcap).columns
    ip = c["ipversion"] == 4
    df = pd.DataFrame({k: c[k][ip] for k in ("timestamp", "srcIP_hi", "srcIP_lo", "destIP_hi",
                                             "destIP_lo", "srcPort", "destPort", "protocol",
                                             "ip_len", "ipversion")})
    g = df.groupby(["srcIP_hi", "srcIP_lo", "destIP_hi", "destIP_lo", "srcPort", "destPort",
                    "protocol", "ipversion"]).agg(
        packets=("timestamp", "size"), bytes=("ip_len", "sum"), first_ns=("timestamp", "min"),
        last_ns=("timestamp", "max")).reset_index()
    g[["first_ns", "last_ns"]] += shift_ns
    return g.sort_values("last_ns", kind="stable")


def _exported(flows: pd.DataFrame, version: int, pcap: Path) -> tuple[list[bytes], list[int]]:
    """Our exporter's datagrams of `flows` (small: a few records each, templates first) and
    their export times (ns, the capture time it gives them)."""
    from tools.netflow.exporter import Exporter

    ex = Exporter(None, version, pcap=str(pcap), mtu=400, template_every_messages=1 << 30,
                  template_every_s=1e9)
    ex.export(_flow_table(flows))
    ex.close()
    dg = read_datagrams(pcap)
    return dg.payloads, [int(t) for t in dg.arrivals]


@pytest.fixture(scope="module")
def exporters(pcaps_dir, tmp_path_factory):
    """(A's datagrams, B's, the order both are sent in: (exporter, datagram) by the time of
    A's clock), and nfdump's records of A's and B's datagrams."""
    tmp = tmp_path_factory.mktemp("exp")
    a_flows = _flows(pcaps_dir / "skype.pcap")
    # B: another capture's flows, at the times of A's (so that both fill the same windows),
    # exported by a router whose clock is ahead
    b_flows = _flows(pcaps_dir / "KakaoTalk_talk.pcap")
    b_flows = _flows(pcaps_dir / "KakaoTalk_talk.pcap",
                     int(a_flows.last_ns.min()) - int(b_flows.last_ns.min()) + 20 * 10**9)
    a, a_t = _exported(a_flows, 9, tmp / "a.pcap")
    b, b_t = _exported(b_flows, 10, tmp / "b.pcap")
    # each exporter's datagrams in its own order (sequence numbers), merged by A's clock
    sent = sorted([(t, 0, i, A, d) for i, (t, d) in enumerate(zip(a_t, a))] +
                  [(t - B_AHEAD_NS, 1, i, B, d) for i, (t, d) in enumerate(zip(b_t, b))])
    return a, b, [(e, d) for *_, e, d in sent], nfdump_records(a + b, tmp, with_first=True)


def _send_from(address: str, port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        for d in datagrams:
            s.sendto(d, ("127.0.0.1", port))


@pytest.mark.slow
def test_two_clocks_and_a_silent_exporter(exporters, pcaps_dir, tmp_path):
    a, b, order, theirs = exporters
    assert len(a) > 50 and len(b) > 5 and len(theirs) > 400
    want = theirs.assign(tb=theirs.last_ms // 10_000).groupby(["tb", "src"]).agg(
        b=("bytes", "sum"), p=("packets", "sum"))
    want.index.names = ["tb", "srcIP"]
    want = want.sort_index()
    out = tmp_path / "q.csv"
    port = free_udp_port()
    # the exporters replay minutes of their clocks in a moment: a pause of the sender (a
    # loaded machine) would look like seconds of their clocks going on; the lull slack
    # keeps such a pause from making the records after it late
    proc = start(tmp_path, port, "--output", f"q={out}", "--lull-slack", "5s",
                 "--netflow-in-active-timeout", "10s",
                 "--netflow-in-active-timeout", f"{SILENT}=2s")
    try:
        # the silent exporter: its options (an active timeout of 18 h, IE 36's largest, its
        # clock as far behind A's: it would hold every window back for 18 h), then nothing
        (a_export_s,) = struct.unpack_from(">I", a[0], 8)
        _send_from(SILENT, port, [ipfix_active_timeout(65535, a_export_s - 65535)])
        sockets = {e: socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for e in (A, B)}
        try:
            for e, s in sockets.items():
                s.bind((e, 0))
            for e, d in order:           # 64 datagrams: the collector's buffer holds them
                sockets[e].sendto(d, ("127.0.0.1", port))
        finally:
            for s in sockets.values():
                s.close()
        sent = time.monotonic()
        # every window closes while the run runs: the punctuation passes B's last records
        # once A is silent for its timeout, and the silent exporter holds nothing back
        wait_for(lambda: len(written(out)) >= len(want), proc, tmp_path / "err")
        closed_s = time.monotonic() - sent
        assert proc.poll() is None
        err = stop(proc, tmp_path / "err")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    n = len(a) + len(b) + 1
    # each exporter's datagrams in its sequence, none lost: every record decoded, none late
    assert f"{n} datagrams (v9: {len(a)}, v10: {len(b) + 1}), 0 sequence gaps, 0 late " \
        "records, 0 datagrams dropped at the socket (its buffer full), 0 by the collector's " \
        "queue" in err, err
    assert re.search(rf"link r1: {len(theirs)} records", err), err
    got = written(out)
    assert not got.index.duplicated().any()
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    # A silent for its 10 s (B's last windows wait for it) and the lull slack (5 s)
    assert closed_s < 60
    print(f"every window closed {closed_s:.1f} s after the last datagram")
