"""Capture agents and a collector (issue 23): two agents, each replaying one link of a generated
two-link capture into a shared spool, and `oopscope collect` melding them, on a Spark
standalone cluster and on local[*]. The rows equal the reference evaluator's (the generator's
truth) and those of `oopscope run` over both files in one process. An agent killed with
SIGKILL is declared silent: the other link's windows keep closing, the killed link's late
rows are counted, and the agent started again continues its spool."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import QuickCluster
from tests.tools.resuming import run_here
from tests.tools.test_tools_run import assert_same_rows, run_cli

NS = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]
QUERY = """
DEFINE { query_name per_window; }
SELECT tb, srcIP, COUNT(*) AS packets, SUM(len) AS bytes
FROM [l0, l1].IPV4
GROUP BY time/5 AS tb, srcIP;
"""


@pytest.fixture(scope="module")
def two_links(tmp_path_factory) -> dict[str, Path]:
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("cluster") / "site.pcap"
    cfg = TrafficConfig(packets=40_000, duration_ns=120 * NS, groups=60, links=2,
                        skew_ns=2 * NS, ipv6=0.0, seed=23)
    paths = generate(cfg.validate(), out)
    return {"l0": paths["l0"], "l1": paths["l1"]}


@pytest.fixture(scope="module")
def reference(two_links):
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    plan = plan_text(QUERY, ["l0", "l1"])
    batches = {n: read_all(p, n) for n, p in two_links.items()}
    return plan, evaluate_file(plan, batches)["per_window"], batches


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tools.cli", *args]


def _agent(query: Path, link: str, pcap: Path, spool: Path, host: str, log: Path,
           *extra: str) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(_cli("agent", str(query), "--link", f"{link}={pcap}",
                                     "--spool", str(spool), "--host-id", host, *extra),
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _finish(proc: subprocess.Popen, log: Path, timeout: float = 300) -> str:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"{proc.args} did not end:\n{log.read_text()[-3000:]}") from None
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text


@pytest.mark.slow
def test_two_agents_and_a_collector_on_a_standalone_cluster(two_links, reference, tmp_path,
                                                           capsys):
    plan, want, _ = reference
    query = tmp_path / "q.gsql"
    query.write_text(QUERY)
    spool = tmp_path / "spool"
    agents = [_agent(query, link, pcap, spool, f"host-{link}", tmp_path / f"{link}.log")
              for link, pcap in two_links.items()]
    lent = []
    for proc, link in zip(agents, two_links):
        text = _finish(proc, tmp_path / f"{link}.log")
        assert f"agent host-{link} ended: end of input" in text
        m = re.search(r"query per_window: (\d+) partial rows in \d+ spool files, .*; "
                      r"table ([\d,]+) slots", text)
        assert m, text[-2000:]
        lent.append((int(m[1]), int(m[2].replace(",", ""))))
    out = tmp_path / "cluster.csv"
    log = tmp_path / "collect.log"
    with QuickCluster(tmp_path / "cluster") as cluster:
        with open(log, "wb") as fh:
            proc = subprocess.Popen(_cli("collect", str(query), "--spool", str(spool),
                                         "--expect-agents", "2", "--master", cluster.url,
                                         "--output", f"per_window={out}"),
                                    cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=cluster.env())
        text = _finish(proc, log)
    assert "run ended: end of input" in text
    assert len(want) > 100
    assert_same_rows(out, want, plan.query("per_window"))
    # the collector shows the agents' tables and how much their low level reduced
    m = re.search(r"query per_window: (\d+) rows -> .*; (\d+) partial rows in \d+ spool "
                  r"files, .*; table ([\d,]+) slots \(\d+ resizes\), ([\d.]+) partial rows "
                  r"per result row", text)
    assert m, text[-2000:]
    rows, partials, slots = int(m[1]), int(m[2]), int(m[3].replace(",", ""))
    assert rows == len(pd.read_csv(out)) == len(want)
    assert partials == sum(p for p, _ in lent) and partials >= rows
    assert slots == sum(s for _, s in lent) > 0
    assert float(m[4]) == pytest.approx(partials / rows, abs=0.006)
    # the same rows as one process over both files
    single = tmp_path / "single.csv"
    code, _, err = run_cli(["run", str(query), "--link", f"l0={two_links['l0']}", "--link",
                            f"l1={two_links['l1']}", "--output", f"per_window={single}"],
                           capsys)
    assert code == 0, err
    assert pd.read_csv(out).sort_values(["tb", "srcIP"]).reset_index(drop=True).equals(
        pd.read_csv(single).sort_values(["tb", "srcIP"]).reset_index(drop=True))


def _rows(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (FileNotFoundError, pd.errors.EmptyDataError):
        return pd.DataFrame(columns=["tb", "srcIP", "packets", "bytes"])


@pytest.mark.slow
def test_a_killed_agent_goes_silent_and_resumes(two_links, reference, tmp_path):
    plan, want, batches = reference
    query = tmp_path / "q.gsql"
    query.write_text(QUERY)
    spool, out, log = tmp_path / "spool", tmp_path / "out.csv", tmp_path / "collect.log"
    with open(log, "wb") as fh:
        collector = subprocess.Popen(_cli("-v", "collect", str(query), "--spool", str(spool),
                                          "--links", "l0,l1", "--agent-timeout", "2s",
                                          "--output", f"per_window={out}"),
                                     cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)
    try:
        # the agents start once the collector's Spark session is up: on a loaded machine a
        # slow start would otherwise put the kill near the end of the traces
        deadline = time.monotonic() + 180
        while "session on" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert collector.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        # paced so that the killed agent is back (some 10-20 s later on a busy machine) long
        # before the other ends (60 s): the last windows then wait for it again and are whole
        pace = ("--speed", "2", "--punctuate-every", "500ms")
        logs = {link: tmp_path / f"{link}.log" for link in two_links}
        b = _agent(query, "l1", two_links["l1"], spool, "b", logs["l1"], *pace)
        a = _agent(query, "l0", two_links["l0"], spool, "a", logs["l0"], *pace)
        deadline = time.monotonic() + 120
        while _rows(out).empty:             # the collector is up and writing
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert collector.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        time.sleep(2)
        assert a.poll() is None and b.poll() is None, \
            "an agent ended before the kill: the machine is too slow for this test's pacing"
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        killed = time.monotonic()
        before = int(_rows(out)["tb"].max())
        # l1's windows keep closing without l0 once l0 is declared silent (2 s)
        while int(_rows(out)["tb"].max()) <= before + 1:
            assert time.monotonic() - killed < 15, log.read_text()[-3000:]
            time.sleep(0.2)
        silent_after = time.monotonic() - killed
        # a few windows closed without l0, past what its spool held at the kill (l0 leads
        # l1 by the skew): its rows for them, sent once it is back, are late
        while int(_rows(out)["tb"].max()) <= before + 3:
            assert time.monotonic() - killed < 40, log.read_text()[-3000:]
            time.sleep(0.2)
        a = _agent(query, "l0", two_links["l0"], spool, "a", logs["l0"], *pace)
        while "is back" not in log.read_text():
            assert a.poll() is None, logs["l0"].read_text()[-3000:]
            assert time.monotonic() - killed < 120, log.read_text()[-3000:]
            time.sleep(0.1)
        # the premise of the last windows' check: the killed link is back before the other
        # ends (else those windows rightly close without it, at the other's end of input)
        assert b.poll() is None, "the other agent ended before the killed one was back: " \
            "the machine is too slow for this test's pacing"
        for proc, link in ((a, "l0"), (b, "l1")):
            _finish(proc, logs[link])
        text = _finish(collector, log)
    finally:
        for proc in (collector,):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert "agent resumed from the spool" in logs["l0"].read_text()
    assert "link l0: agent a silent since" in text and "is back" in text
    late = int(re.search(r"query per_window: .*?, (\d+) late partials", text).group(1))
    assert late > 0, text[-3000:]
    assert silent_after < 10
    got = pd.read_csv(out, dtype=str, keep_default_na=False)
    # every window once: no (window, key) twice
    assert not got.duplicated(["tb", "srcIP"]).any()
    have = {(r.tb, r.srcIP): int(r.packets) for r in got.itertuples()}
    full = _packets(want, plan.query("per_window"))
    alone = _packets(*_l1_only(batches))
    # a window is exact, or misses some of l0's packets (those late after the kill); l1's
    # packets are always all there
    assert set(have) <= set(full)
    exact = {k for k, v in full.items() if have.get(k) == v}
    for k, v in full.items():
        assert alone.get(k, 0) <= have.get(k, 0) <= v, k
    assert len(exact) > 0.5 * len(full) and len(exact) < len(full)
    windows = sorted({int(t) for t, _ in full})
    for k in full:
        if int(k[0]) <= before - 2 or int(k[0]) >= windows[-1] - 2:
            # before the kill, and the last windows: whole
            assert k in exact, (k, have.get(k), full[k], before, windows[-1],
                                re.findall(r".*(?:silent since|is back).*", text))


def _packets(frame, qp) -> dict:
    from tests.tools.test_tools_run import expected_rows

    cols = list(frame.columns)
    return {(r[cols.index("tb")], r[cols.index("srcIP")]): int(r[cols.index("packets")])
            for r in expected_rows(frame, qp)}


def _l1_only(batches):
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    plan = plan_text(QUERY.replace("[l0, l1].IPV4", "l1.IPV4"), ["l1"])
    return evaluate_file(plan, {"l1": batches["l1"]})["per_window"], plan.query("per_window")


def _beat(host: str, links: list[str], age_s: float, state: str = "running"):
    from tools.pipeline.heartbeat import Beat

    return Beat(host, 1, time.time_ns() - int(age_s * NS), state, NS, ["q"],
                {link: {} for link in links})


def test_fanout_sublinks_are_melded_under_their_link():
    from tools.cluster.collector import _sublinks

    beats = {"a.0": _beat("a.0", ["main#0"], 0), "a.1": _beat("a.1", ["main#1"], 0),
             "b": _beat("b", ["edge"], 0)}
    assert _sublinks(["edge", "main#0", "main#1"], beats) == (["edge", "main"], {"main": 2})
    # --links names the link; its agent beat with sub-links
    assert _sublinks(["main", "edge"], beats) == (["main", "edge"], {"main": 2})
    assert _sublinks(["main"], {}) == (["main"], {})


def test_liveness_declares_a_silent_link_once_and_brings_it_back(caplog):
    from tools.pipeline.heartbeat import Liveness, links_of

    live = Liveness(timeout_s=2.0)
    beats = {"a": _beat("a", ["l0"], 0.5), "b": _beat("b", ["l1"], 5.0),
             "c": _beat("c", ["l2"], 9.0, state="ended")}
    assert live.update(beats) == {"l1"}          # an ended agent is not silent, it is done
    assert live.update(beats) == {"l1"}
    assert sum("link l1: agent b silent since" in r.message for r in caplog.records) == 1
    beats["b"] = _beat("b", ["l1"], 0.1)
    assert live.update(beats) == frozenset()
    assert any("link l1: agent b is back" in r.message for r in caplog.records)
    beats["d"] = _beat("d", ["l0"], 0)
    with pytest.raises(Exception, match="captured by two agents"):
        links_of(beats)


def test_an_agent_refuses_a_link_another_agent_captures(tmp_path):
    from tools.errors import RunConfigError
    from tools.pipeline.heartbeat import Heartbeat

    first = Heartbeat(tmp_path, "a", ["q"], NS, lambda: {"l0": {}})
    with pytest.raises(RunConfigError, match="link l0 is captured by agent a already"):
        Heartbeat(tmp_path, "b", ["q"], NS, lambda: {"l0": {}, "l1": {}})
    Heartbeat(tmp_path, "c", ["q"], NS, lambda: {"l1": {}})       # another link: fine
    first.finish("stopped")
    Heartbeat(tmp_path, "b", ["q"], NS, lambda: {"l0": {}})       # a stopped agent's link


@pytest.mark.slow
def test_an_agent_collecting_netflow_feeds_collect(pcaps_dir, tmp_path):
    """`oopscope agent QUERY --netflow-in r1=127.0.0.1:PORT`: softflowd's IPFIX datagrams
    received by the agent, its partial rows melded by `oopscope collect`: per 5-tuple sums of
    packets and bytes equal nfdump's over the same datagrams. The agent takes the operator's
    active timeout of the exporter (127.0.0.1=1h; with the 5 s given for every exporter,
    softflowd's end-of-capture dump would come late and be dropped), and its heartbeat says
    its collector's socket dropped nothing."""
    import json
    import socket

    from tests.capture.test_capture_flowdecode import KEY, nfdump_records, softflowd_datagrams
    from tests.conftest import free_udp_port, udp_port_bound
    from tools.pipeline.heartbeat import heartbeat_path

    datagrams = softflowd_datagrams(pcaps_dir / "skype.pcap", 10)
    query = tmp_path / "flows.gsql"
    query.write_text("DEFINE { query_name flows; }\n"
                     "SELECT tb, srcIP, destIP, srcPort, destPort, protocol, sum(packets) AS p, "
                     "sum(bytes) AS b FROM r1.NETFLOW GROUP BY first/60000000000 AS tb, srcIP, "
                     "destIP, srcPort, destPort, protocol\n")
    spool = tmp_path / "spool"
    port = free_udp_port()
    log = tmp_path / "agent.log"
    with open(log, "ab") as out:
        agent = subprocess.Popen(_cli("agent", str(query), "--netflow-in",
                                      f"r1=127.0.0.1:{port}", "--spool", str(spool),
                                      "--host-id", "nf", "--netflow-in-active-timeout", "5s",
                                      "--netflow-in-active-timeout", "127.0.0.1=1h"),
                                 cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    beat = heartbeat_path(spool, "nf")

    def received() -> int:
        try:
            return int(json.loads(beat.read_text())["links"]["r1"].get("datagrams", 0))
        except (OSError, ValueError, KeyError):
            return 0
    try:
        deadline = time.monotonic() + 120
        while not udp_port_bound(port):
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for d in datagrams:
                s.sendto(d, ("127.0.0.1", port))
                time.sleep(0.002)
        while received() < len(datagrams):
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        link = json.loads(beat.read_text())["links"]["r1"]
        assert link["kernel_drops"] == 0 and link["ring_drops"] == 0, link
    finally:
        agent.send_signal(signal.SIGTERM)         # the records held are released, then ended
    text = _finish(agent, log)
    assert f"link r1: {len(datagrams)} datagrams (v10: {len(datagrams)}), 0 sequence gaps, " \
        "0 late records, 0 datagrams dropped at the socket" in text, text
    out_csv = tmp_path / "flows.csv"
    # the collector in this process (its rows are the check): the test's Spark session
    done = run_here(_cli("collect", str(query), "--spool", str(spool), "--expect-agents", "1",
                         "--output", f"flows={out_csv}"))
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = pd.read_csv(out_csv).rename(columns={"srcIP": "src", "destIP": "dst",
                                                "srcPort": "sport", "destPort": "dport",
                                                "protocol": "proto"})
    ours = ours.groupby(KEY)[["p", "b"]].sum().sort_index()
    theirs = nfdump_records(datagrams, tmp_path).groupby(KEY).agg(
        p=("packets", "sum"), b=("bytes", "sum")).sort_index()
    assert len(theirs) > 50
    pd.testing.assert_frame_equal(ours, theirs, check_dtype=False)
    # the agent keeps its templates beside its heartbeat
    assert (spool / beat.parent.name / "nf.netflow" / "r1.json").is_file()
