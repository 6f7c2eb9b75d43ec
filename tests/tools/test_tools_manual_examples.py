"""The Tigon SQL manuals' query examples, as printed, run by `oopscope run` over a generated
capture and compared with the reference evaluator (tests/queries/fixtures/manual/).

An example that reads a stream the manual does not show (`FROM SourceCount`, `FROM
PacketSum1 P1, PacketSum2 P2`) runs with a companion file of ours that defines it, in the
same invocation: several query files are one query set, as in GS-lite. The example file
itself is never edited. Every other example must stop with a located error (file:line:col),
never a traceback: `test_the_rest_fail_with_a_located_error`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import PCAPS
from tests.tools.test_tools_run import assert_same_rows, run_cli

MANUAL = Path(__file__).resolve().parents[1] / "queries" / "fixtures" / "manual"
COMPANIONS = Path(__file__).resolve().parent / "fixtures" / "manual_companions"
NS = 1_000_000_000

#: example file stem -> (companion files, link -> generated link it reads)
RUNS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "01_intro_ipv4_filter": ((), {"main": "to1234"}),
    "03_intro_pipelined_groupby": ((), {"main": "to1234"}),
    "04_intro_sourcecount_rollup": (("source_count.gsql",), {"main": "l0"}),
    "12_selection_ipv4_icmp": ((), {"main": "l0"}),
    "13_selection_imputed_tablevar": ((), {"main": "l0"}),
    "14_comments": ((), {"main": "l0"}),
    "15_selection_eth0_tablevar": ((), {"eth0": "l0"}),
    "16_outer_join_in_out": (("in_out_packets.gsql",), {"inlink": "l0", "outlink": "l1"}),
    "19_groupby_having": ((), {"eth0": "l0"}),
    "20_groupby_cube": ((), {"eth0": "l0"}),
    "21_groupby_having_recalled": ((), {"eth0": "l0"}),
    "23_merge_packetsum": (("packet_sums.gsql",), {"l1": "l0", "l2": "l1"}),
    "24_queryset_count_tcp": ((), {"main": "l0"}),
    "26_filter_tcp_udp": ((), {"main": "l0"}),
    "27_udf_getlpmid_local": ((), {"i2": "l0"}),
    "28_aggr_src_bytes": ((), {"main": "l0"}),
    "29_aggr_http_hostheader": ((), {"main": "http"}),
    "32_p2p_signatures": ((), {"main": "bittorrent"}),
    "34_static_subset_sum_nssample": ((), {"main": "l0"}),
}

#: files an example reads from the working directory (27's `./localprefix.tbl`: the prefix
#: file format of the manual's section 12.3, covering part of the generated addresses)
CWD_FILES = {"27_udf_getlpmid_local": {"localprefix.tbl": "10.0.0.0/9|1\n10.128.0.0/9|2\n"
                                                          "172.16.0.0/12|3\n"},
             # 32 keeps the packets of site 18: here every address
             "32_p2p_signatures": {"mesaprefix.tbl": "0.0.0.0/0|18\n"}}


@pytest.fixture(scope="module")
def links(tmp_path_factory) -> dict[str, Path]:
    """Two links of 4 minutes: IPv4 and IPv6, TCP, UDP and ICMP (the examples filter on
    protocol 1 and 6), the second lagging by 5 s."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("manual") / "m.pcap"
    cfg = TrafficConfig(packets=30_000, duration_ns=240 * NS, groups=400, flows=1_500,
                        links=2, skew_ns=5 * NS, tcp=0.6, udp=0.3, icmp=0.1, ipv6=0.1,
                        seed=24)
    paths = generate(cfg.validate(), out)
    # GET requests with Host headers (example 29 reads them from TCP payloads)
    paths["http"] = PCAPS / "aimini-http.pcap"
    # BitTorrent handshakes (example 32 classifies peer-to-peer payloads)
    paths["bittorrent"] = PCAPS / "bittorrent.pcap"
    # example 01 keeps the packets sent to 1.2.3.4: some are, among others
    paths["to1234"] = _to_1234(out.parent / "to1234.pcap")
    return paths


def _to_1234(path: Path) -> Path:
    # Ethernet/IPv4/UDP frames built and written by the generator's own helpers, not scapy:
    # the same packets (addresses, ports, times), without scapy's ~1 CPU-s import
    import numpy as np

    from tools.gen.bursts import udp_frame
    from tools.gen.pcapwrite import write_pcap

    frames = [udp_frame(f"192.0.2.{k}", "1.2.3.4" if k % 3 == 0 else f"10.0.0.{k}",
                        1000 + k, 53, 0) for k in range(40)]
    times = [1_700_000_000 * NS + k * NS // 2 for k in range(40)]
    write_pcap(path, times, np.frombuffer(b"".join(frames), np.uint8).reshape(40, -1),
               [len(f) for f in frames])
    return path


@pytest.fixture(scope="module")
def batches(links):
    from capture.reader import read_all
    from capture.schema import COLUMNS

    # with the payloads, for the examples that read TCP_data
    columns = [c.name for c in COLUMNS] + ["payload"]
    return {name: read_all(path, name, columns=columns) for name, path in links.items()}


def _files(stem: str) -> list[Path]:
    companions, _ = RUNS[stem]
    return [MANUAL / f"{stem}.gsql", *(COMPANIONS / c for c in companions)]


@pytest.mark.parametrize("stem", sorted(RUNS))
@pytest.mark.slow
def test_example_runs_and_equals_the_reference(stem, links, batches, spark_session,
                                               tmp_path, capsys, monkeypatch):
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import plan_tree, read_query_set, schema_of

    for name, content in CWD_FILES.get(stem, {}).items():
        (tmp_path / name).write_text(content)
    monkeypatch.chdir(tmp_path)
    files = _files(stem)
    _, link_of = RUNS[stem]
    tree, text, paths = read_query_set([str(f) for f in files])
    names = list(link_of)
    plan = plan_tree(tree, text, str(files[0]), names, {}, {}, schema=schema_of(paths, ()))
    # the example's own queries that no other query reads are its results
    own = {q.name for q in tree.queries if q.path in (None, str(files[0]))}
    results = [qp for qp in plan.queries if qp.name in own and not qp.read_by]
    assert results, f"{stem}: no result query"
    argv = ["run", *map(str, files)]
    for name, generated in link_of.items():
        argv += ["--link", f"{name}={links[generated]}"]
    outs = {qp.name: tmp_path / f"{qp.name}.csv" for qp in results}
    for name, out in outs.items():
        argv += ["--output", f"{name}={out}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 0, err
    want = evaluate_file(plan, {n: batches[g].copy() for n, g in link_of.items()})
    for qp in results:
        assert len(want[qp.name]) > 0, f"{stem}: query {qp.name} has no rows to compare"
        assert_same_rows(outs[qp.name], want[qp.name], qp)


def test_the_rest_fail_with_a_located_error():
    """Each example that does not run stops at planning with a message naming the file,
    line and column of what it lacks, or at the reference evaluator's door; none crashes."""
    from common.errors import OopscopeError
    from queries.errors import QueryError
    from tools.pipeline.config import plan_tree, read_query_set, schema_of

    located = re.compile(r"\.gsql:\d+:\d+: ")
    runs = {*RUNS, *CSV_RUNS, *PKTS_RUNS}
    rest = sorted(p for p in MANUAL.glob("*.gsql") if p.stem not in runs)
    assert len(rest) + len(runs) == 47
    for path in rest:
        try:
            tree, text, paths = read_query_set([str(path)])
            plan_tree(tree, text, str(path), ["main", "eth0"], {}, {}, subset=True,
                      schema=schema_of(paths, ()))
            raise AssertionError(f"{path.name} plans now: run it (add it to RUNS)")
        except QueryError as exc:
            assert located.search(str(exc)), f"{path.name}: {exc}"
        except OopscopeError as exc:    # a user error of another kind (a link, a config)
            assert "Traceback" not in str(exc), f"{path.name}: {exc!r}"


#: the CSV_EXAMPLE examples (section 4.1.5) that run with the manual's own schema (section 5)
CSV_RUNS = {"05_iface_csv0": "CSV0", "06_ifaceset_exl": "exl"}


@pytest.mark.parametrize("stem", sorted(CSV_RUNS))
def test_csv_example_runs_with_the_manuals_schema(stem, tmp_path, capsys):
    """The manual's record examples over a CSV file of CSV_EXAMPLE records, with the manual's
    PROTOCOL declarations as --schema; rows computed here from the values written."""
    import csv
    import random
    import time

    rng = random.Random(stem)
    records = []
    for _ in range(300):
        records.append([rng.randrange(2**32), rng.choice([6, 6, 7, 2**40]),
                        f"10.0.{rng.randrange(256)}.{rng.randrange(256)}", "2001:db8::7",
                        rng.choice(["a", "bb", "c d"]), rng.choice(["TRUE", "FALSE"]),
                        rng.randrange(-2**31, 2**31), rng.randrange(-2**63, 2**63),
                        rng.random() * 1e3])
    data = tmp_path / "records.csv"
    with open(data, "w", newline="") as f:
        csv.writer(f).writerows(records)
    before = int(time.time())
    code, out, err = run_cli(["run", str(MANUAL / f"{stem}.gsql"), "--schema",
                              str(MANUAL / "schema_protocols_sec5.txt"), "--link",
                              f"{CSV_RUNS[stem]}={data}", "--format", "csv"], capsys)
    after = int(time.time())
    assert code == 0, err
    rows = list(csv.DictReader(out.splitlines()))
    assert sorted(int(r["uintInPosition1"]) for r in rows) == \
        sorted(r[0] for r in records if r[1] == 6)
    assert all(before <= int(r["systemTime"]) <= after for r in rows)


#: the subset-sum sampling examples over PKTS, which the manuals do not define: a companion
#: schema makes it CSV records (uts, srcIP, destIP, len, time)
PKTS_RUNS = ("36_dynamic_subset_sum", "46_c_stateful_ssample")


@pytest.mark.parametrize("stem", PKTS_RUNS)
@pytest.mark.slow
def test_subset_sum_example_runs_over_records(stem, tmp_path, capsys):
    """The manual's dynamic subset-sum sampling, unchanged, over 3 000 records of 60 sources
    and destinations in 20-second windows: the run's sample equals the reference
    evaluator's, and each window keeps about the sample size of 100 groups out of more."""
    import random

    from capture.records import read_all_records
    from queries.planner import plan_text
    from queries.schemafile import load_schema
    from tests.oracles.reference import evaluate_file

    rng = random.Random(stem)
    lines, t = [], 1_700_000_000
    for uts in range(3000):
        t += rng.random() < 0.027            # about 80 seconds: four windows
        lines.append(f"{uts},10.0.0.{rng.randrange(60)},10.1.0.{rng.randrange(60)},"
                     f"{rng.choice([40, 60, 576, 1500, 9000])},{t}")
    data = tmp_path / "pkts.csv"
    data.write_text("\n".join(lines) + "\n")
    schema_file = COMPANIONS / "pkts_schema.txt"
    query = MANUAL / f"{stem}.gsql"
    out = tmp_path / "out.csv"
    code, _, err = run_cli(["run", str(query), "--schema", str(schema_file), "--link",
                            f"pkts={data}", "--output", f"{query.stem}={out}"], capsys)
    assert code == 0, err
    schema = load_schema([str(schema_file)])
    plan = plan_text(query.read_text(), ["pkts"], path=str(query), schema=schema)
    batch = read_all_records(data, schema.record_format("PKTS"), "pkts")
    (want,) = evaluate_file(plan, {"pkts": batch}).values()
    assert 100 <= len(want) <= 3 * 100 * 4        # four windows, each about the sample size
    assert_same_rows(out, want, plan.queries[0])
