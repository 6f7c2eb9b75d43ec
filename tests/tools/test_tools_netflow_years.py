"""NetFlow export of a capture spanning years (issue 25, item 10).

A capture made of two captures 16 years apart (2004 and 2020) has flow records more than
2^32 ms (~49.7 days) apart in one table. NetFlow v5 and v9 carry times as 32-bit ms of uptime:
the exporter's clock must reboot wherever a datagram needs it, where it used to overflow the
header (`struct.error`) and stop the whole run. Checked against independent tools: the records
v5, v9 and IPFIX put on the wire, read back by a real nfcapd and nfdump, have per-5-tuple
packet and byte totals equal to those nfpcapd meters from the same capture, and each record's
first and last times are the capture times of the reference evaluator's records. And a fault
of the exporter never stops the query or its other outputs: counted, reported, the run goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from tests.conftest import nfcapd, require_tool
from tests.queries.test_queries_netflow_conformance import _ip128, read_nfdump, totals
from tools.netflow.exporter import Exporter
from tools.netflow.records import address_text, from_table

NS = 1_000_000_000
REPO = Path(__file__).resolve().parents[2]
NETFLOW = REPO / "queries" / "library" / "netflow.gsql"
STARTS_NS = (1_083_000_000 * NS, 1_590_000_000 * NS)     # April 2004, May 2020
VERSIONS = (5, 9, 10)


@pytest.fixture(scope="module")
def years(tmp_path_factory) -> Path:
    """Two generated captures (IPv4 and IPv6, TCP, UDP, ICMP), 16 years apart, as one file."""
    from tools.gen.traffic import TrafficConfig, generate

    work = tmp_path_factory.mktemp("years")
    parts = []
    for i, start in enumerate(STARTS_NS):
        cfg = TrafficConfig(packets=3_000, duration_ns=120 * NS, groups=200, flows=400, tcp=0.6,
                            udp=0.35, icmp=0.05, ipv6=0.1, start_ns=start, seed=25 + i)
        parts.append(generate(cfg.validate(), work / f"part{i}.pcap")["l0"].read_bytes())
    assert parts[0][:24] == parts[1][:24]          # the same pcap header: concatenate records
    path = work / "years.pcap"
    path.write_bytes(parts[0] + parts[1][24:])
    return path


@pytest.fixture(scope="module")
def reference(years) -> pd.DataFrame:
    """The shipped `netflow` query's records by the reference evaluator."""
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    plan = plan_text(NETFLOW.read_text(), ["main"])
    return evaluate_file(plan, {"main": read_all(years, link="main")})["netflow"]


@pytest.fixture(scope="module")
def flows(reference) -> pa.Table:
    """The reference records with addresses as text (as `oopscope run` writes them)."""
    frame = reference
    rec = from_table(frame)
    table = pa.table({**{c: frame[c].to_numpy() for c in frame.columns
                         if c not in ("srcIP", "destIP")},
                      "srcIP": address_text(rec.src_hi, rec.src_lo),
                      "destIP": address_text(rec.dst_hi, rec.dst_lo)})
    first = table.column("first_ns").to_numpy()
    assert first.max() - first.min() > 15 * 365 * 86_400 * NS     # the table spans years
    return table


@pytest.fixture(scope="module")
def nfpcapd_totals(years, tmp_path_factory) -> pd.DataFrame:
    require_tool("nfpcapd")
    require_tool("nfdump")
    d = tmp_path_factory.mktemp("nfpcapd")
    subprocess.run(["nfpcapd", "-r", str(years), "-w", str(d)], capture_output=True, timeout=60,
                   check=True)
    return read_nfdump(d)


def _nfdump(*args: str) -> str:
    proc = subprocess.run([require_tool("nfdump"), *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "TZ": "UTC"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _ms(text: str) -> int:
    return int(pd.Timestamp(text, tz="UTC").value // 10**6)


def _check_collected(flowdir: Path, flows: pa.Table, nfpcapd: pd.DataFrame, version: int):
    """nfdump's view of what nfcapd received: totals equal nfpcapd's, times equal ours."""
    ours = read_nfdump(flowdir)
    want = nfpcapd
    if version == 5:       # v5 carries IPv4 only
        want = want[want["sa"] < 2**64]
    assert len(ours) > 0
    a, b = totals(ours), totals(want)
    assert set(a.index) == set(b.index)
    pd.testing.assert_frame_equal(a.sort_index(), b.loc[a.index].sort_index(), check_dtype=False)
    # every record's times survive the reboots to the ms
    rows = json.loads(_nfdump("-R", str(flowdir), "-o", "json"))
    got = sorted((_ip128(r.get("src4_addr") or r["src6_addr"]), r["in_packets"], _ms(r["first"]),
                  _ms(r["last"])) for r in rows if r["type"] == "FLOW")
    d = flows.to_pydict()
    expected = sorted((_ip128(d["srcIP"][i]), int(d["packets"][i]), d["first_ns"][i] // 10**6,
                       d["last_ns"][i] // 10**6) for i in range(flows.num_rows)
                      if version != 5 or d["ipversion"][i] == 4)
    assert got == expected
    assert "Sequence failures: 0" in _nfdump("-R", str(flowdir), "-I")


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"v{v}")
def test_one_table_spanning_years_reaches_nfcapd_intact(version, flows, nfpcapd_totals,
                                                        tmp_path):
    flowdir = tmp_path / "flows"
    flowdir.mkdir()
    with nfcapd(flowdir) as port:
        ex = Exporter(f"127.0.0.1:{port}", version)
        ex.export(flows)                  # one table: the records of both years at once
        ex.close()
    stats = ex.stats()
    assert stats["sent"]["failed_datagrams"] == 0 and stats["clamped_times"] == 0
    if version in (5, 9):
        assert stats["clock_reboots"] >= 1           # the uptime had to start again
    _check_collected(flowdir, flows, nfpcapd_totals, version)


@pytest.mark.slow
@pytest.mark.parametrize("version", (5, 9), ids=lambda v: f"v{v}")
def test_run_exports_a_capture_spanning_years(version, years, reference, flows, nfpcapd_totals,
                                              tmp_path, capsys):
    """The whole pipeline (`oopscope run --netflow`): the run ends normally, its CSV holds
    every record, and the collector received every record."""
    from tests.tools.test_tools_run import assert_same_rows, run_cli

    flowdir = tmp_path / "flows"
    flowdir.mkdir()
    out = tmp_path / "flows.csv"
    with nfcapd(flowdir) as port:
        code, _, err = run_cli(["run", "netflow", "--link", f"main={years}", "--output",
                                f"netflow={out}", "--netflow", f"127.0.0.1:{port}",
                                "--netflow-version", str(version)], capsys)
    assert code == 0, err
    assert "Traceback" not in err and "not exported" not in err
    from queries.planner import plan_text

    plan = plan_text(NETFLOW.read_text(), ["main"])
    assert_same_rows(out, reference, plan.query("netflow"))
    _check_collected(flowdir, flows, nfpcapd_totals, version)


def test_an_exporter_fault_is_counted_and_the_query_goes_on(flows, caplog):
    """Any exception of the exporter: the batch's records are counted as not exported, the
    fault is named once in the log and in the summary, and later batches still go out."""
    from tools.results.netflow import NetflowSink

    sink = NetflowSink("127.0.0.1:9", 9, pace=0)      # discard port: nothing listens
    broken = flows.set_column(flows.schema.get_field_index("srcIP"), "srcIP",
                              pa.array(["not an address"] * flows.num_rows))
    assert sink.write(0, broken) is True
    assert sink.write(1, broken) is True
    assert sink.write(2, flows) is True
    sink.close()
    stats = sink.stats()
    assert (stats["fault_batches"], stats["fault_records"]) == (2, 2 * flows.num_rows)
    assert stats["records_in"] == flows.num_rows            # batch 2 was encoded and sent
    assert caplog.text.count("not exported") == 1           # once per kind of fault
    assert f"{2 * flows.num_rows} records of 2 micro-batch(es) not exported" in sink.summary()
    assert sink.failed() >= 2


def test_the_clock_reboots_only_where_a_datagram_needs_it():
    """Records in time order within 49 days: one boot; a jump of years: one reboot, and
    the datagram after it carries uptimes from the new boot."""
    import numpy as np

    from tools.netflow.clock import U32_MAX, ExportClock

    clock = ExportClock()
    t0 = STARTS_NS[0] // 10**6
    day = 86_400_000
    stamps = [clock.stamp(t0 + k * day, t0 + k * day + 5000) for k in range(40)]
    assert clock.reboots == 0 and all(0 < up <= U32_MAX for _, up in stamps)
    t1 = STARTS_NS[1] // 10**6
    export, up = clock.stamp(t1, t1 + 5000)
    assert clock.reboots == 1 and export == t1 + 5000 and up == 5000 + 3_600_000
    assert clock.uptime(np.array([t1])).tolist() == [3_600_000]
    # back in time again: the export time follows the records after the reboot
    export, up = clock.stamp(t0, t0 + 1)
    assert clock.reboots == 2 and export == t0 + 1000 and 0 < up <= U32_MAX
    # a datagram cannot hold records further apart than the clock's span
    first = np.array([t0, t0 + 10, t1], np.int64)
    assert clock.fitting(first, first + 5) == 2 and clock.fitting(first[2:], first[2:]) == 1
