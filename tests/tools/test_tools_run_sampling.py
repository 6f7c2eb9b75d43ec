"""`oopscope run` of sampling queries (GS-lite's SUPERGROUP, CLEANING_WHEN/BY, super-aggregates
and stateful functions; docs/gsql.md "Sampling queries") against the reference evaluator: the
compiled sequential kernel (`highlevel.sampling_kernel`) against a plain-Python simulation row
by row (`tests/oracles/sampling.py`) whose stateful functions are an independent port
(`tests/oracles/stateful.py`).

The queries are the manual's: dynamic subset-sum sampling (chapter 14) and flow sampling
(chapter 15), with sample sizes small enough that cleaning passes run many times per window;
plus supergroups with super-aggregates and the static subset-sum `nssample`. Two links with
a lag, so rows of a window arrive out of order and in several batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows

NS = 1_000_000_000

QUERIES = """\
DEFINE { query_name subset_sum; }
SELECT tb, srcIP, destIP, UMAX(sum(len), ssthreshold()) AS est, count(*) AS n,
       count$(*) AS seen
FROM IPV4
WHERE ssample(len, 30) = TRUE
GROUP BY time/10 AS tb, srcIP, destIP
HAVING ssfinal_clean(sum(len)) = TRUE
CLEANING WHEN ssdo_clean() = TRUE
CLEANING BY ssclean_with(sum(len)) = TRUE;

DEFINE { query_name flows; }
SELECT tb, srcIP, destIP, srcPort, COUNT(*) AS n, UMAX(sum(len), ssthreshold()) AS est
FROM TCP
WHERE flow_ssample(25) = TRUE
GROUP BY time/20 AS tb, srcIP, destIP, srcPort
HAVING flow_ssfinal_clean(Or_Aggr(flags & 1) | Or_Aggr((flags / 4) & 1), 2, max(time),
                          sum(len)) = TRUE
CLEANING_WHEN flow_ssdo_clean(max$(time)) = TRUE
CLEANING_BY flow_ssclean_with(Or_Aggr(flags & 1) | Or_Aggr((flags / 4) & 1), 2, max(time),
                              sum(len)) = TRUE;

DEFINE { query_name per_source; }
SELECT tb, srcIP, destPort, count(*) AS n, sum(len) AS bytes, count$(*) AS rows,
       sum$(len) AS total, max$(len) AS biggest, count_distinct$(*) AS groups,
       packet_count() AS seen
FROM IPV4
WHERE ssample(len, 5) = TRUE
GROUP BY time/10 AS tb, srcIP, destPort
SUPERGROUP srcIP
HAVING count(*) >= 1 AND ssfinal_clean(sum(len)) = TRUE
CLEANING_WHEN ssdo_clean() = TRUE AND count_distinct$(*) > 3
CLEANING_BY ssclean_with(sum(len)) = TRUE;

DEFINE { query_name static; }
SELECT tb, protocol, count(*) AS n, sum(len) AS bytes
FROM IPV4
WHERE nssample(len, 2000) = TRUE
GROUP BY time/10 AS tb, protocol;

DEFINE { query_name static_rows; }
SELECT time, srcIP, destIP, len, ip_str(srcIP) AS source
FROM TCP
WHERE nssample(len, 3000) = TRUE AND destPort <> 22;

DEFINE { query_name pkts; }
SELECT time, srcIP, destIP, len FROM IPV4 WHERE len > 60;

DEFINE { query_name over_rows; }
SELECT tb, srcIP, destIP, UMAX(sum(len), ssthreshold()) AS est, count(*) AS n
FROM pkts
WHERE ssample(len, 15) = TRUE AND len < 1400
GROUP BY time/10 AS tb, srcIP, destIP
HAVING ssfinal_clean(sum(len)) = TRUE
CLEANING WHEN ssdo_clean() = TRUE
CLEANING BY ssclean_with(sum(len)) = TRUE;

DEFINE { query_name rows_sampled; }
SELECT time, srcIP, len FROM pkts WHERE nssample(len, 2500) = TRUE;
"""

#: GS-lite's sampling operator reads another query's rows (the manual's PKTS is one): the
#: last two read the selection `pkts`
NAMES = ("subset_sum", "flows", "per_source", "static", "static_rows", "over_rows",
         "rows_sampled")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> dict:
    from tools.gen.traffic import TrafficConfig, generate

    d = tmp_path_factory.mktemp("sampling")
    cfg = TrafficConfig(packets=6_000, duration_ns=60 * NS, groups=200, flows=600, tcp=0.75,
                        udp=0.2, icmp=0.05, links=2, skew_ns=2 * NS, flow_duration_ns=8 * NS,
                        zipf=1.1, seed=29)
    paths = generate(cfg.validate(), d / "s.pcap")
    (d / "q.gsql").write_text(QUERIES)
    return {"dir": d, "links": tuple(sorted(paths.items()))}


@pytest.fixture(scope="module")
def reference(capture):
    from capture.reader import read_all
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    links = [name for name, _ in capture["links"]]
    plan = plan_text(QUERIES, links, path=str(capture["dir"] / "q.gsql"))
    batches = {name: read_all(path, name) for name, path in capture["links"]}
    return plan, evaluate_file(plan, batches)


def test_the_samples_are_samples(reference):
    """The oracle's samples are smaller than the traffic and the cleaning ran: a window keeps
    about the sample size of groups, where it saw many more."""
    _, want = reference
    s = want["subset_sum"]
    per_window = s.groupby("tb").size()
    assert len(per_window) >= 5 and (per_window <= 3 * 30).all()
    assert s["seen"].max() > 3 * per_window.max()     # admitted rows, before cleaning
    assert len(want["flows"]) > 0 and len(want["static"]) > 0
    assert 0 < len(want["static_rows"]) < 6_000 // 2
    ps = want["per_source"]
    assert (ps["groups"] <= ps.groupby(["tb", "srcIP"])["n"].transform("size") + 3).all()


@pytest.mark.slow
def test_sampling_run_equals_reference(capture, reference, spark_session, tmp_path):
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    outputs = tuple((name, str(tmp_path / f"{name}.csv")) for name in NAMES)
    summary = run(RunConfig(query_file=str(capture["dir"] / "q.gsql"), links=capture["links"],
                            outputs=outputs, progress=False))
    plan, want = reference
    for name, out in outputs:
        assert len(want[name]) > 0, name
        assert summary.queries[name].rows == len(want[name]), name
        assert_same_rows(Path(out), want[name], plan.query(name))


RESUMED = """\
DEFINE { query_name sampled; }
SELECT tb, srcIP, destIP, UMAX(sum(len), ssthreshold()) AS est, count(*) AS n
FROM main.IPV4
WHERE ssample(len, 20) = TRUE
GROUP BY time/10 AS tb, srcIP, destIP
HAVING ssfinal_clean(sum(len)) = TRUE
CLEANING_WHEN ssdo_clean() = TRUE
CLEANING_BY ssclean_with(sum(len)) = TRUE;
"""


@pytest.mark.slow
def test_kill_9_and_resume_keeps_the_sampling_state(tmp_path):
    """Killed with SIGKILL while it writes windows and run again with the same spool and
    checkpoint, a sampling query carries on from its committed state (the rows waiting for
    their window, each supergroup's sampling state, the last window sampled): the output
    equals an uninterrupted run's, no row lost or written twice."""
    from tests.tools.resuming import csv_rows, csv_windows, kill_when, run_command, run_here
    from tools.gen.traffic import TrafficConfig, generate

    cfg = TrafficConfig(packets=60_000, duration_ns=300 * NS, groups=300, zipf=1.0, seed=12)
    pcap = generate(cfg.validate(), tmp_path / "main.pcap")["l0"]
    query = tmp_path / "sampled.gsql"
    query.write_text(RESUMED)
    want = tmp_path / "want.csv"
    run_here(run_command(str(query), {"main": pcap}, {"sampled": want}, speed="max"))
    want_header, want_rows = csv_rows(want)
    windows = len({r[0] for r in want_rows})
    assert windows >= 25

    out = tmp_path / "out.csv"
    cmd = run_command(str(query), {"main": pcap}, {"sampled": out}, speed="20",
                      spool=tmp_path / "spool", checkpoint=tmp_path / "ck")
    kill_when(cmd, lambda: csv_windows(out) >= 4, poll=0.05)
    assert csv_windows(out) < windows, "killed too late to tell"
    run_here(cmd)
    header, rows = csv_rows(out)
    assert header == want_header
    assert len(rows) == len(set(rows)), "a row written twice"
    assert sorted(rows) == sorted(want_rows)
