"""`oopscope run --functions --udf` end to end: getlpmid and Python user functions in WHERE,
GROUP BY and SELECT, against the reference evaluator (which has its own row-by-row getlpmid
and calls user functions one row at a time, tests/oracles/functions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows, run_cli

NS = 1_000_000_000

PREFIXES = """\
# networks of the generated traffic (tools/gen: 10.x.y.z clients, others servers)
0.0.0.0/0|1
10.0.0.0/8|2
10.128.0.0/9|3
10.200.0.0/16|4
10.200.84.0/24|5
84.0.0.0/6|6
2001:db8::/32|7
"""

DECLARATIONS = """\
float FUN [LFTA_LEGAL, COST LOW] scaled(uint, float HANDLE);
uint FUN is_web(uint);
"""

MODULE = """\
import numba
import numpy as np


def scaled(x, factor):
    return x * factor


@numba.vectorize(["uint64(uint64)"])
def is_web(port):
    return 1 if port == 80 or port == 443 else 0
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    from tools.gen.traffic import TrafficConfig, generate

    d = tmp_path_factory.mktemp("functions")
    cfg = TrafficConfig(packets=20_000, duration_ns=60 * NS, groups=500, flows=1_000,
                        tcp=0.6, udp=0.35, icmp=0.05, ipv6=0.1, snaplen=96, seed=21)
    pcap = generate(cfg.validate(), d / "main.pcap")["l0"]
    (d / "nets.tbl").write_text(PREFIXES)
    (d / "funcs.def").write_text(DECLARATIONS)
    (d / "udfs.py").write_text(MODULE)
    return {"dir": d, "pcap": pcap}


QUERIES = {
    # getlpmid in WHERE and as a group key (low level), a LFTA_LEGAL UDF in WHERE, a
    # high-level-only UDF and UMAX in SELECT over aggregates (Spark: Arrow UDFs)
    "by_net": """
        SELECT tb, net, COUNT(*) AS n, UMAX(SUM(len), 10000) AS m, is_web(MAX(destPort)) AS w,
               getlpmid(dst, 'nets.tbl') AS dnet
        FROM TCP
        WHERE scaled(len, 0.5) > 30.0 AND getlpmid(destIP, 'nets.tbl') >= 1
        GROUP BY time/10 AS tb, getlpmid(srcIP, 'nets.tbl') AS net, prefix(destIP, 104) AS dst
    """,
    # a selection: the high-level-only UDF's argument projected by the low level
    "web": """
        SELECT time, srcIP, getlpmid(srcIP, 'nets.tbl') AS net, is_web(destPort) AS w,
               IF(len > 100, 1, 0) AS big
        FROM IPV4
        WHERE getlpmid(srcIP, 'nets.tbl') = 3 OR getlpmid(destIP, 'nets.tbl') = 4
    """,
}


@pytest.mark.parametrize("name", sorted(QUERIES))
@pytest.mark.slow
def test_functions_equal_reference(setup, name, spark_session, tmp_path, capsys,
                                   monkeypatch):
    from capture.reader import read_all
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary
    from tests.oracles.reference import evaluate_file

    d = setup["dir"]
    monkeypatch.chdir(d)                  # the prefix file is named relative to the run
    query = tmp_path / f"{name}.gsql"
    query.write_text(f"DEFINE {{ query_name '{name}'; }}\n" + QUERIES[name])
    out = tmp_path / f"{name}.csv"
    code, _, err = run_cli(["run", str(query), "--link", f"main={setup['pcap']}",
                            "--functions", str(d / "funcs.def"), "--udf", str(d / "udfs.py"),
                            "--output", f"{name}={out}"], capsys)
    assert code == 0, err
    library = FunctionLibrary.load((str(d / "funcs.def"),), str(d / "udfs.py"))
    plan = plan_text(query.read_text(), ["main"], path=str(query), functions=library)
    want = evaluate_file(plan, {"main": read_all(setup["pcap"], "main")})
    assert len(want[name]) > 0
    assert_same_rows(out, want[name], plan.query(name))
