"""`oopscope run` with `late 'correct'` (docs/semantics.md "Late data") over two links, the
second one late.

Captures crafted with scapy: link `a` in time order; link `b` in order except for a block of
old packets written after newer ones (a collector that caught up). With `late 'drop'` the run
loses exactly those packets (counted); with `late 'correct'` the regular rows plus the
correction rows, merged by each aggregate's own combine, equal the reference evaluator over
every packet, and the reference itself has no correction rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.tools.test_tools_run import run_cli

QUERY = """
DEFINE {{ query_name per10s; {late} }}
SELECT tb, srcPort, COUNT(*) AS packets, SUM(len) AS bytes, MIN(len) AS small, MAX(len) AS big
FROM [a, b].UDP
GROUP BY time/10 AS tb, srcPort;
"""


@pytest.fixture(scope="session")
def late_links(tmp_path_factory):
    from scapy.all import IP, UDP, Ether, Raw, wrpcap

    root = tmp_path_factory.mktemp("late")
    rng = np.random.default_rng(5)

    def pkt(t: float, port: int):
        p = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=port, dport=53) / \
            Raw(b"x" * int(rng.integers(0, 200)))
        p.time = 1_700_000_000 + t
        return p

    a = [pkt(t, int(rng.choice([1000, 2000]))) for t in np.arange(0.0, 60.0, 0.25)]
    times_b = np.arange(0.1, 60.0, 0.5)
    on_time = [t for t in times_b if not (5.0 <= t < 22.0)]
    late = [t for t in times_b if 5.0 <= t < 22.0]
    b_order = [t for t in on_time if t < 40.0] + late + [t for t in on_time if t >= 40.0]
    b = [pkt(t, int(rng.choice([1000, 3000]))) for t in b_order]
    wrpcap(str(root / "a.pcap"), a)
    wrpcap(str(root / "b.pcap"), b)
    return {"a": root / "a.pcap", "b": root / "b.pcap", "late": len(late), "root": root}


def run_query(late_links, late: str, tmp_path, capsys):
    gsql = tmp_path / f"q_{late or 'drop'}.gsql"
    gsql.write_text(QUERY.format(late=late))
    out = tmp_path / f"out_{late or 'drop'}.csv"
    code, _, err = run_cli(["run", str(gsql), "--link", f"a={late_links['a']}", "--link",
                            f"b={late_links['b']}", "--output", f"per10s={out}"], capsys)
    assert code == 0, err
    return gsql, pd.read_csv(out), err


def reference(gsql, late_links) -> pd.DataFrame:
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    batches = {n: read_all(late_links[n], n) for n in ("a", "b")}
    plan = plan_text(gsql.read_text(), ["a", "b"])
    return evaluate_file(plan, batches)["per10s"]


def test_run_late_correct_equals_reference(late_links, tmp_path, capsys):
    from highlevel.session import get_session

    get_session()
    gsql, dropped, err = run_query(late_links, "", tmp_path, capsys)
    assert f"{late_links['late']} late packets" in err              # counted, never silent
    assert "correction" not in dropped.columns
    gsql, got, err = run_query(late_links, "late 'correct';", tmp_path, capsys)
    assert "0 late packets" in err                                   # none dropped
    # the late packets were aggregated apart; whether their rows became correction rows
    # depends on whether the Spark stage had closed their windows when they came
    corrections = int((got["correction"] == 1).sum())
    assert (f"{late_links['late']} late packets corrected in {corrections} correction rows"
            in err)
    assert set(got["correction"]) <= {0, 1}
    keys = ["tb", "srcPort"]
    merged = (got.drop(columns="correction").groupby(keys, as_index=False)
              .agg({"packets": "sum", "bytes": "sum", "small": "min", "big": "max"})
              .sort_values(keys).reset_index(drop=True))
    want = reference(gsql, late_links)
    assert (want["correction"] == 0).all()
    want = want.drop(columns="correction").sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(merged, want[merged.columns], check_dtype=False)
    assert int(merged["packets"].sum()) == int(dropped["packets"].sum()) + late_links["late"]
