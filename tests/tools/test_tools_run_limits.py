"""`oopscope run` on values at the edges (issue 25, item 7): a divisor that is 0 on some rows
only, in the Spark stage (aggregate outputs and HAVING) and in the low level (a selection), no
longer stops the run: every path gives 0 there, as the reference evaluator does; ullong
literals above 2^63 and the smallest llong reach Spark; unsigned comparisons stay unsigned; a
1000-term OR runs. The rows equal the reference evaluator's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows, run_cli

NS = 1_000_000_000
ORS = " OR ".join(f"ip_len = {n}" for n in range(20, 1020))
EDGES = f"""
DEFINE {{ query_name ratios; }}
SELECT tb, srcIP, destIP, srcPort, COUNT(*) AS packets,
       SUM(ip_len) / (COUNT(*) - 1) AS per_extra,
       SUM(ip_len) % (MAX(ttl) - MIN(ttl)) AS rest,
       FLOAT(SUM(ip_len)) / (COUNT(*) - COUNT(*)) AS zero_float,
       if_else(COUNT(*) < 18446744073709551615, 1, 0) AS below_top,
       if_else(COUNT(*) - 2 > 18446744073709551610, 1, 0) AS llong_vs_top,
       18446744073709551615 AS top, -9223372036854775808 AS bottom
FROM main.IP
WHERE {ORS}
GROUP BY time/60 AS tb, srcIP, destIP, srcPort
HAVING SUM(ip_len) / (COUNT(*) - 1) >= 0 AND COUNT(*) <= 18446744073709551615;

DEFINE {{ query_name per_packet; }}
SELECT time, ip_len / (ttl - ttl) AS zero, ip_len % (ttl - 64) AS rest
FROM main.IP
WHERE ip_len > 1000;
"""


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """Few packets per group and minute: many groups of one packet (COUNT(*) - 1 = 0)."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("edges") / "main.pcap"
    cfg = TrafficConfig(packets=6_000, duration_ns=180 * NS, groups=1_500, flows=4_000,
                        tcp=0.7, udp=0.3, icmp=0.0, seed=25)
    return generate(cfg.validate(), out)["l0"]


@pytest.mark.slow
def test_division_by_zero_on_some_rows_does_not_stop_the_run(capture, tmp_path, capsys):
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    gsql = tmp_path / "edges.gsql"
    gsql.write_text(EDGES)
    outs = {q: tmp_path / f"{q}.csv" for q in ("ratios", "per_packet")}
    # punctuation every 60 s of capture time, not every second: the low level evaluates the
    # 1000-term OR node by node per batch, 180 batches cost ~4 times the CPU of 4 (the rows
    # do not depend on the batches)
    code, _, err = run_cli(["run", str(gsql), "--link", f"main={capture}",
                            "--punctuate-every", "60s",
                            *[a for q, p in outs.items() for a in ("--output", f"{q}={p}")]],
                           capsys)
    assert code == 0, err
    assert "Traceback" not in err and "DIVIDE_BY_ZERO" not in err
    plan = plan_text(EDGES, ["main"])
    want = evaluate_file(plan, {"main": read_all(capture, "main")})
    ratios = want["ratios"]
    # the cases this test is about occur: single-packet groups, a constant ttl per group
    assert (ratios["packets"] == 1).sum() > 10 and (ratios["per_extra"] == 0).sum() > 10
    assert (ratios["rest"] == 0).sum() > 10 and set(ratios["below_top"]) == {1}
    assert set(ratios["llong_vs_top"]) == {0} and (want["per_packet"]["zero"] == 0).all()
    for name, path in outs.items():
        assert len(want[name]) > 0
        assert_same_rows(path, want[name], plan.query(name))


WRAPS = """
DEFINE { query_name wraps; }
SELECT tb, SUM(ip_len) * 9223372036854775807 AS big, LLONG(SUM(ip_len)) * -4611686018427387904 AS neg,
       MAX(ttl) + 18446744073709551615 AS around
FROM main.IP
GROUP BY time/60 AS tb;
"""


@pytest.mark.slow
def test_integer_overflow_wraps_as_in_gsql(capture, tmp_path, capsys):
    """64-bit integer arithmetic wraps in the Spark stage as in the low level and the
    reference (Spark's ANSI mode stopped the run with ARITHMETIC_OVERFLOW)."""
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    gsql = tmp_path / "wraps.gsql"
    gsql.write_text(WRAPS)
    out = tmp_path / "wraps.csv"
    code, _, err = run_cli(["run", str(gsql), "--link", f"main={capture}", "--output",
                            f"wraps={out}"], capsys)
    assert code == 0, err
    assert "Traceback" not in err and "OVERFLOW" not in err
    plan = plan_text(WRAPS, ["main"])
    want = evaluate_file(plan, {"main": read_all(capture, "main")})["wraps"]
    assert len(want) == 3
    assert_same_rows(out, want, plan.query("wraps"))


COUNTED = """
DEFINE { query_name zq; }
SELECT tb, srcIP, dk, COUNT(*) AS packets, SUM(ip_len) / (COUNT(*) - 1) AS per_extra,
       if_else(COUNT(*) = 1, 0, SUM(ip_len) % (COUNT(*) - 1)) AS guarded
FROM main.IP
WHERE ip_len / (ttl % 2) > 40
GROUP BY time/60 AS tb, srcIP, destIP, ip_len % (ttl % 3) AS dk;

DEFINE { query_name zsel; }
SELECT tb, srcIP, packets % (packets - 1) AS m, if_else(packets > 1, 1 / (packets - 1), 7) AS g
FROM zq;
"""


@pytest.mark.slow
def test_zero_divisors_are_counted(capture, tmp_path, capsys):
    """The run counts what met a zero divisor: packets in the low level (WHERE: every packet;
    a key: the packets WHERE kept), rows written in the Spark stage (outputs) and in a
    selection over a query's rows (Python workers); a guarded division (`if_else` whose branch
    the row does not take) does not count. Counts against a brute-force count."""
    import re

    import numpy as np

    from capture.reader import read_all
    from capture.schema import L_IP
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    gsql = tmp_path / "counted.gsql"
    gsql.write_text(COUNTED)
    outs = {q: tmp_path / f"{q}.csv" for q in ("zq", "zsel")}
    code, _, err = run_cli(["run", str(gsql), "--link", f"main={capture}",
                            *[a for q, p in outs.items() for a in ("--output", f"{q}={p}")]],
                           capsys)
    assert code == 0, err
    packets = read_all(capture, "main")
    plan = plan_text(COUNTED, ["main"])
    want = evaluate_file(plan, {"main": packets})
    for name, path in outs.items():
        assert_same_rows(path, want[name], plan.query(name))

    ip = (packets["layers"] & L_IP) != 0
    ttl = np.asarray(packets["ttl"], np.int64)[ip]
    ip_len = np.asarray(packets["ip_len"], np.int64)[ip]
    even = ttl % 2 == 0
    kept = ~even & (ip_len // np.where(even, 1, ttl % 2) > 40)
    want_packets = int(even.sum() + (kept & (ttl % 3 == 0)).sum())
    zq = want["zq"]
    want_rows = {"zq": int((zq["packets"] == 1).sum()), "zsel": int((zq["packets"] == 1).sum())}
    assert want_packets > 0 and want_rows["zq"] > 0 and (zq["packets"] > 1).any()

    found = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"query (\w+): .*?, (\d+) packets and (\d+) rows met a zero divisor", err)}
    assert found["zq"] == (want_packets, want_rows["zq"]), err
    assert found["zsel"] == (0, want_rows["zsel"]), err
