"""`oopscope run` end to end: pcap -> low level -> spool -> Spark -> CSV, against the reference evaluator."""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import PCAPS

NS = 1_000_000_000


# --- fixtures -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def capture(tmp_path_factory) -> Path:
    """One generated link: 120k packets over 4 minutes, IPv4 and IPv6, TCP/UDP (DNS)/ICMP."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("run") / "main.pcap"
    cfg = TrafficConfig(packets=120_000, duration_ns=240 * NS, groups=3_000, flows=6_000,
                        tcp=0.6, udp=0.35, icmp=0.05, ipv6=0.1, snaplen=96, seed=11)
    return generate(cfg.validate(), out)["l0"]


@pytest.fixture(scope="session")
def two_links(tmp_path_factory) -> dict[str, Path]:
    """Two links of the same flows, link 1 lagging link 0 by 20 s (the Q8-2 arrival skew)."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("run2") / "q82.pcap"
    cfg = TrafficConfig(packets=50_000, duration_ns=150 * NS, groups=1_500, links=2,
                        skew_ns=20 * NS, seed=12)
    paths = generate(cfg.validate(), out)
    return {"link1": paths["l0"], "link2": paths["l1"]}


@pytest.fixture(scope="session")
def batches(capture):
    from capture.reader import read_all

    return {"main": read_all(capture, "main")}


def reference(query: str, batches: dict, params: dict | None = None) -> dict[str, pd.DataFrame]:
    from queries.explain import find_query_file
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    path = find_query_file(query)
    plan = plan_text(path.read_text(), list(batches), params, path=str(path))
    return plan, evaluate_file(plan, batches, params)


# --- comparison ---------------------------------------------------------------------------------

def _text(value, gsql_type: str) -> str:
    """How `oopscope run` writes one reference value in CSV (a null: an empty field)."""
    if value is None or (isinstance(value, float) and value != value) or value is pd.NA:
        return ""
    t = gsql_type.lower()
    if t == "ipv4":
        return str(ipaddress.IPv4Address(int(value)))
    if t == "ip":
        v = int(value)
        if v >> 32 == 0xFFFF:      # IPv4-mapped: dotted quad
            return str(ipaddress.IPv4Address(v & 0xFFFFFFFF))
        return str(ipaddress.IPv6Address(v))
    if t in ("float", "double"):
        return repr(float(value))
    if t == "string":
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return str(int(value))


def expected_rows(frame: pd.DataFrame, qp) -> list[tuple]:
    types = {o.name: o.type for o in qp.high.outputs}
    return [tuple(_text(v, types[c]) for c, v in zip(frame.columns, row))
            for row in frame.itertuples(index=False)]


def assert_same_rows(csv_path: Path, frame: pd.DataFrame, qp) -> None:
    got = pd.read_csv(csv_path, dtype=str, keep_default_na=False)
    assert list(got.columns) == list(frame.columns) == qp.output_names
    with open(csv_path) as fh:
        assert fh.readline().rstrip("\n") == ",".join(qp.output_names)
    floats = [i for i, o in enumerate(qp.high.outputs) if o.type.lower() in ("float", "double")]
    exact = [i for i in range(len(got.columns)) if i not in floats]

    def split(rows):
        rows = sorted(rows, key=lambda r: tuple(r[i] for i in exact))
        return ([tuple(r[i] for i in exact) for r in rows],
                np.array([[float(r[i]) for i in floats] for r in rows],
                         dtype=float).reshape(len(rows), len(floats)))

    got_exact, got_float = split([tuple(r) for r in got.itertuples(index=False)])
    want_exact, want_float = split(expected_rows(frame, qp))
    assert len(got_exact) == len(want_exact)
    assert got_exact == want_exact
    np.testing.assert_allclose(got_float, want_float, rtol=1e-9)


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from tools.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# --- the shipped aggregation queries ------------------------------------------------------------

CASES = [
    ("q8_1", "q8_1", [], {}),
    ("top_talkers", "top_talkers", ["--param", "min_bytes=200000"], {"min_bytes": "200000"}),
    ("dns_volume", "dns_volume", [], {}),
    # a flow evicted on a collision ends there (reason 5), which the reference does not
    # model: a table with room for every flow
    ("netflow", "netflow", ["--set", "aggregate_slots=4194304"], {}),
    ("sliding_count", "sliding_count", [], {}),
    ("port_scan", "port_scan", ["--param", "min_ports=2"], {"min_ports": "2"}),
]


@pytest.mark.parametrize("query,name,extra,params", CASES, ids=[c[1] for c in CASES])
@pytest.mark.slow
def test_run_equals_reference(query, name, extra, params, capture, batches, spark_session,
                              tmp_path, capsys):
    out = tmp_path / f"{name}.csv"
    code, _, err = run_cli(["run", query, "--link", f"main={capture}", "--output",
                            f"{name}={out}", *extra], capsys)
    assert code == 0, err
    plan, want = reference(query, batches, params)
    assert len(want[name]) > 0
    assert_same_rows(out, want[name], plan.query(name))
    # the summary names the link and the query with their counts
    assert "link main: 120000 packets" in err
    assert f"query {name}: {len(want[name])} rows" in err


AVG_QUERY = """
DEFINE { query_name avg_len; }
SELECT tb, srcIP, AVG(ip_len) AS mean_len, COUNT(*) AS packets, MAX(ttl) AS max_ttl
FROM main.IP
WHERE protocol = 6 OR protocol = 17
GROUP BY time/60 AS tb, srcIP
HAVING COUNT(*) >= 2;
"""


def test_query_file_with_avg_and_tiny_table(capture, batches, spark_session, tmp_path,
                                            capsys):
    """A query file by path; AVG = SUM/COUNT combined over many evicted partial rows."""
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    gsql = tmp_path / "avg.gsql"
    gsql.write_text(AVG_QUERY)
    out = tmp_path / "avg.csv"
    code, _, err = run_cli(["run", str(gsql), "--link", f"main={capture}", "--set",
                            "aggregate_slots=4", "--output", f"avg_len={out}"], capsys)
    assert code == 0, err
    plan = plan_text(AVG_QUERY, ["main"])
    want = evaluate_file(plan, batches)["avg_len"]
    assert len(want) > 0
    assert_same_rows(out, want, plan.query("avg_len"))
    # the summary shows the table (fixed: never re-sized) and how much it reduced, counted
    # over the rows written
    m = re.search(r"query avg_len: (\d+) rows -> .*?; (\d+) partial rows in .*; table 4 "
                  r"slots \(0 resizes\), ([\d.]+) partial rows per result row", err)
    assert m, err
    rows, partials = int(m[1]), int(m[2])
    assert rows == len(want) == len(pd.read_csv(out))
    assert partials > 2 * rows        # 4 slots: most groups leave many times per window
    assert float(m[3]) == pytest.approx(partials / rows, abs=0.006)


PAIRS_QUERY = """
DEFINE { query_name pairs; expected_groups 4000; }
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/20 AS tb, srcIP, destIP
"""


def test_final_rows_written_without_a_combine(capture, batches, spark_session, tmp_path,
                                              capsys, monkeypatch, caplog):
    """A table that fits its groups: the run's summary says most partial rows are final,
    and the rows written (final ones straight through, the rest combined) are the
    reference's and those of the run with every row combined (OOPSCOPE_DRIVER_ROWS=0)."""
    import logging

    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    gsql = tmp_path / "pairs.gsql"
    gsql.write_text(PAIRS_QUERY)
    outs = {}
    for direct in (True, False):
        monkeypatch.setenv("OOPSCOPE_DRIVER_ROWS", "1" if direct else "0")
        out = outs[direct] = tmp_path / f"pairs-{direct}.csv"
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="highlevel.finalrows"):
            code, _, err = run_cli(["run", str(gsql), "--link", f"main={capture}",
                                    "--output", f"pairs={out}"], capsys)
        assert code == 0, err
        took = any("final rows written directly" in r.getMessage() for r in caplog.records)
        assert took == direct, caplog.text
        m = re.search(r"query pairs: (\d+) rows .* partial rows per result row, (\d+)% of "
                      r"them final", err)
        assert m, err
        assert int(m[2]) > 80
    plan = plan_text(PAIRS_QUERY, ["main"])
    want = evaluate_file(plan, batches)["pairs"]
    assert len(want) > 1000
    assert_same_rows(outs[True], want, plan.query("pairs"))
    pd.testing.assert_frame_equal(pd.read_csv(outs[True]), pd.read_csv(outs[False]))


TWO_QUERIES = """
DEFINE { query_name tcp_flows; }
SELECT tb, srcIP, destIP, srcPort, destPort, COUNT(*) AS packets, SUM(ip_len) AS bytes,
       OR_AGGR(flags) AS tcp_flags
FROM main.TCP
GROUP BY time/60 AS tb, srcIP, destIP, srcPort, destPort;

DEFINE { query_name udp_flows; }
SELECT tb, srcIP, destIP, srcPort, destPort, COUNT(*) AS packets, SUM(ip_len) AS bytes
FROM main.UDP
GROUP BY time/60 AS tb, srcIP, destIP, srcPort, destPort;
"""


@pytest.fixture(scope="session")
def two_queries(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("twoq") / "flows.gsql"
    path.write_text(TWO_QUERIES)
    return path


def test_every_query_of_a_file_in_one_run(two_queries, capture, batches, spark_session,
                                          tmp_path, capsys):
    """Two queries, their Spark stages side by side, one CSV each."""
    names = ["tcp_flows", "udp_flows"]
    outputs = [x for n in names for x in ("--output", f"{n}={tmp_path / n}.csv")]
    code, _, err = run_cli(["run", str(two_queries), "--link", f"main={capture}", *outputs],
                           capsys)
    assert code == 0, err
    plan, want = reference(str(two_queries), batches)
    for n in names:
        assert len(want[n]) > 0
        assert_same_rows(tmp_path / f"{n}.csv", want[n], plan.query(n))


FLUSH_CASES = [["--set", "flush=oop_lazy"], ["--set", "flush=oop_slow"],
               ["--set", "flush=iop_slow"], ["--set", "aggregate_slots=4"],
               ["--set", "aggregate_slots=262144"]]


@pytest.mark.parametrize("settings", FLUSH_CASES, ids=[s[1] for s in FLUSH_CASES])
def test_flush_policy_and_table_size_do_not_change_results(settings, two_queries, capture,
                                                            batches, spark_session, tmp_path,
                                                            capsys):
    out = tmp_path / "tcp_flows.csv"
    code, _, err = run_cli(["run", str(two_queries), "--link", f"main={capture}", *settings,
                            "--output", f"tcp_flows={out}", "--format", "csv"], capsys)
    assert code == 0, err
    plan, want = reference(str(two_queries), batches)
    assert_same_rows(out, want["tcp_flows"], plan.query("tcp_flows"))
    line = next(x for x in err.splitlines() if x.startswith("query tcp_flows:"))
    evictions = int(line.split(" evictions")[0].rsplit(" ", 1)[1])
    tcp_packets = int(want["tcp_flows"]["packets"].sum())
    if settings[1] == "aggregate_slots=4":
        # thousands of flows in 4 slots: nearly every packet evicts a resident group
        assert evictions > tcp_packets // 2
    if settings[1] == "aggregate_slots=262144":
        assert evictions < tcp_packets // 100


@pytest.mark.parametrize("settings", [[], ["--set", "flush=iop_slow"]], ids=["meld", "merge"])
def test_q8_2_two_links_with_skew(settings, two_links, spark_session, tmp_path, capsys):
    from capture.reader import read_all

    out = tmp_path / "q8_2.csv"
    links = [f"--link={name}={path}" for name, path in two_links.items()]
    code, _, err = run_cli(["run", "q8_2", *links, "--output", f"q8_2={out}", *settings],
                           capsys)
    assert code == 0, err
    plan, want = reference("q8_2", {n: read_all(p, n) for n, p in two_links.items()})
    assert len(want["q8_2"]) > 0
    assert_same_rows(out, want["q8_2"], plan.query("q8_2"))
    assert "link link1: 50000 packets" in err and "link link2: 50000 packets" in err


def test_punctuation_period_changes_nothing(capture, batches, spark_session, tmp_path):
    """Punctuation changes when results appear, never what they are (docs/semantics.md):
    punctuation every 10 ms of data (small batches) or only at the end give the same rows; the
    library entry point returns the result tables."""
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    tables = []
    counts = []
    for every, batch_size in ((10_000_000, 2048), (3600 * NS, 65536)):
        config = RunConfig("q8_1", (("main", str(capture)),),
                           outputs=(("q8_1", str(tmp_path / f"{every}.csv")),),
                           punctuate_every_ns=every, batch_size=batch_size)
        summary = run(config)
        tables.append(summary.results["q8_1"].to_pandas())
        counts.append(summary.links["main"].punctuations)
    # aligned down to the 1-minute slide: one punctuation per minute boundary of the 4 min
    assert counts[0] >= 3 and counts[1] == 0
    a, b = (t.sort_values(list(t.columns)).reset_index(drop=True) for t in tables)
    pd.testing.assert_frame_equal(a, b)
    plan, want = reference("q8_1", batches)
    assert_same_rows(tmp_path / "10000000.csv", want["q8_1"], plan.query("q8_1"))


def test_late_packets_are_dropped_and_counted(spark_session, tmp_path):
    """Band disorder: packets behind the punctuation are late; every one is counted, so the
    output counts plus the late packets equal the reference counts (docs/semantics.md "Late
    data", drop)."""
    from capture.reader import read_all
    from tools.gen.traffic import TrafficConfig, generate
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    cfg = TrafficConfig(packets=40_000, duration_ns=150 * NS, groups=500, tcp=1.0, udp=0.0,
                        icmp=0.0, disorder="band", max_delay_ns=3 * NS, disorder_share=0.3,
                        seed=13)
    pcap = generate(cfg.validate(), tmp_path / "late.pcap")["l0"]
    config = RunConfig("q8_1", (("main", str(pcap)),),
                       outputs=(("q8_1", str(tmp_path / "q.csv")),),
                       punctuate_every_ns=NS // 10, batch_size=1024)
    summary = run(config)
    late = summary.queries["q8_1"].late_packets
    got = summary.results["q8_1"].to_pandas()
    _, want = reference("q8_1", {"main": read_all(pcap, "main")})
    assert late > 0
    assert int(got["Cnt"].sum()) + late == int(want["q8_1"]["Cnt"].sum()) == 40_000
    assert f"{late} late packets" in summary.format()


def test_table_format_on_stdout_and_bare_link(capture, spark_session, tmp_path, capsys):
    code, out, err = run_cli(["run", "top_talkers", "--link", str(capture),
                              "--set", "query_name=tt", "--param", "min_bytes=20000"], capsys)
    # a bare PCAP is named after its stem: the capture is main.pcap
    assert code == 0, err
    lines = out.splitlines()
    # a table shows each window's start in UTC after the window column
    assert lines[0].split() == ["tb", "window", "start", "(UTC)", "srcIP", "bytes", "packets"]
    assert "link main:" in err
    assert len(lines) - 1 == int(err.split("query tt: ")[1].split(" rows")[0])
    # top_talkers ranks each minute's sources, the most bytes first (DEFINE order_by)
    rows = [line.split() for line in lines[1:]]
    windows: dict[int, list[int]] = {}
    for tb, day, hms, _ip, nbytes, _packets in rows:
        start = datetime.strptime(f"{day} {hms}", "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
        assert int(start.timestamp()) == int(tb) * 60
        windows.setdefault(int(tb), []).append(int(nbytes))
    assert list(windows) == sorted(windows)
    assert all(b == sorted(b, reverse=True) for b in windows.values()), windows
    assert any(b != sorted(b) for b in windows.values()), "no window to rank"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_jsonl_and_parquet_outputs(fmt, capture, batches, spark_session, tmp_path, capsys):
    import json

    import pyarrow.parquet as pq

    out = tmp_path / f"dns.{fmt}"
    # the format comes from the file suffix
    code, _, err = run_cli(["run", "dns_volume", "--link", f"main={capture}", "--output",
                            f"dns_volume={out}"], capsys)
    assert code == 0, err
    if fmt == "jsonl":
        got = pd.DataFrame([json.loads(x) for x in out.read_text().splitlines()])
    else:
        got = pq.read_table(out).to_pandas()
    csv = tmp_path / "dns.csv"
    got.astype(str).to_csv(csv, index=False)
    plan, want = reference("dns_volume", batches)
    assert_same_rows(csv, want["dns_volume"], plan.query("dns_volume"))


def test_kept_spool_must_start_empty(capture, spark_session, tmp_path, capsys):
    spool = tmp_path / "spool"
    argv = ["run", "q8_1", "--link", f"main={capture}", "--spool", str(spool),
            "--output", f"q8_1={tmp_path / 'a.csv'}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    # the spool is kept: partial files of the query, each with its punctuation marker
    assert list((spool / "q8_1" / "partials").glob("main-*.parquet"))
    code, _, err = run_cli(argv, capsys)
    msg = _one_line_error(code, err, 1)
    assert "not empty" in msg


@pytest.mark.skipif(not (PCAPS / "skype.pcap").is_file(),
                    reason=f"shared capture {PCAPS / 'skype.pcap'} not present")
def test_real_capture_q8_1(spark_session, tmp_path, capsys):
    from capture.reader import read_all

    pcap = PCAPS / "skype.pcap"
    out = tmp_path / "q8_1.csv"
    code, _, err = run_cli(["run", "q8_1", "--link", f"main={pcap}", "--output",
                            f"q8_1={out}"], capsys)
    assert code == 0, err
    plan, want = reference("q8_1", {"main": read_all(pcap, "main")})
    assert len(want["q8_1"]) > 0
    assert_same_rows(out, want["q8_1"], plan.query("q8_1"))


# --- user errors: one line, no traceback --------------------------------------------------------

def _one_line_error(code: int, err: str, *codes: int) -> str:
    assert code in codes, err
    lines = [x for x in err.splitlines() if x.strip() and "incubator" not in x]
    assert "Traceback" not in err
    return "\n".join(lines)


def test_unknown_link_lists_the_query_links(capture, capsys):
    code, _, err = run_cli(["run", "q8_2", "--link", f"main={capture}"], capsys)
    msg = _one_line_error(code, err, 1)
    assert msg.count("\n") == 0
    assert "main" in msg and "link1, link2" in msg


@pytest.mark.slow
def test_join_and_its_inputs_in_one_run(capture, batches, spark_session, tmp_path, capsys):
    """syn_flood.gsql: two aggregations and the OA-Join reading both, every result to CSV."""
    outs = {n: tmp_path / f"{n}.csv" for n in ("syns", "synacks", "syn_flood")}
    argv = [x for n, p in outs.items() for x in ("--output", f"{n}={p}")]
    code, _, err = run_cli(["run", "syn_flood", "--link", f"main={capture}", *argv], capsys)
    assert code == 0, err
    plan, want = reference("syn_flood", batches)
    assert len(want["syn_flood"]) > 0
    for n, p in outs.items():
        assert_same_rows(p, want[n], plan.query(n))


@pytest.mark.parametrize("asked,reads", [("syn_flood", "syns"), ("syns", None)])
@pytest.mark.slow
def test_only_the_asked_query_and_what_it_reads_run(asked, reads, capture, batches,
                                                    spark_session, tmp_path, capsys):
    """--output names one query of a file: it runs, with the queries it reads (reported as
    read by it), and nothing else."""
    out = tmp_path / f"{asked}.csv"
    code, _, err = run_cli(["run", "syn_flood", "--link", f"main={capture}",
                            "--output", f"{asked}={out}"], capsys)
    assert code == 0, err
    plan, want = reference("syn_flood", batches)
    assert_same_rows(out, want[asked], plan.query(asked))
    if reads:
        assert f"query {reads}: " in err and f"(read by {asked})" in err
    else:
        assert "query synacks:" not in err and "query syn_flood:" not in err


@pytest.mark.parametrize("argv,codes,words", [
    (["--set", "flush=fastest"], (1,), ["flush", "oop_lazy"]),
    (["--set", "aggregate_slots"], (2,), ["key=value"]),
    (["--output", "nope=-"], (1,), ["nope", "q8_1"]),
    (["--punctuate-every", "soon"], (2,), ["duration"]),
], ids=["bad-flush", "no-value", "unknown-output", "bad-duration"])
def test_bad_options_exit_with_one_clear_line(argv, codes, words, capture, capsys):
    code, _, err = run_cli(["run", "q8_1", "--link", f"main={capture}", *argv], capsys)
    msg = _one_line_error(code, err, *codes)
    for w in words:
        assert w in msg


def test_missing_capture_file(tmp_path, capsys):
    code, _, err = run_cli(["run", "q8_1", "--link", f"main={tmp_path / 'no.pcap'}"], capsys)
    msg = _one_line_error(code, err, 1)
    assert msg.count("\n") == 0 and "no.pcap" in msg
