"""`oopscope run` of running aggregations (GS-lite's CLOSING_WHEN, docs/semantics.md "Running
aggregation") against the reference evaluator's brute force: per group, window after window,
empty aggregates in the windows it is carried through, closed once CLOSING_WHEN holds.

The capture is sparse on purpose (few packets per group over many short windows, flows that
start and end, two links), so groups skip windows, get carried through silent
ones, close and reopen; the second link lags the first by 3 s (Meld orders nothing, the
windows wait for both); a tiny hash table evicts, so the high level combines several partial
rows per (window, group) before it steps through the windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows

NS = 1_000_000_000

QUERIES = """\
DEFINE { query_name gone; }
SELECT tb, srcIP, srcPort, count(*) AS n, sum(len) AS bytes, min(len) AS small,
       max(len) AS big, avg(len) AS mean
FROM IPV4
GROUP BY time/2 AS tb, srcIP, srcPort
CLOSING_WHEN count(*) = 0;

DEFINE { query_name quiet; }
SELECT tb, srcIP, srcPort, count(*) AS n
FROM IPV4
GROUP BY time/2 AS tb, srcIP, srcPort
HAVING count(*) = 0
CLOSING_WHEN count(*) = 0;

DEFINE { query_name heavy; }
SELECT tb, protocol, destPort, count(*) AS n, sum(len) AS bytes
FROM IPV4
WHERE protocol = 6
GROUP BY time/3 AS tb, protocol, destPort
HAVING count(*) > 0 OR tb % 2 = 0
CLOSING_WHEN sum(len) > 3000 OR (count(*) = 0 AND destPort % 3 = 0);

DEFINE { query_name never; }
SELECT tb, protocol, count(*) AS n, max(len) AS big
FROM IPV4
GROUP BY time/4 AS tb, protocol
CLOSING_WHEN 1 = 0;

DEFINE { query_name pkts; }
SELECT time, srcPort, len FROM IPV4 WHERE len > 100;

DEFINE { query_name derived; }
SELECT tb, srcPort, count(*) AS n, sum(len) AS bytes
FROM pkts
GROUP BY time/2 AS tb, srcPort
CLOSING_WHEN count(*) = 0;
"""

NAMES = ("gone", "quiet", "heavy", "never", "derived")


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> dict:
    from tools.gen.traffic import TrafficConfig, generate

    d = tmp_path_factory.mktemp("closing")
    cfg = TrafficConfig(packets=1_000, duration_ns=30 * NS, groups=150, flows=300, tcp=0.7,
                        udp=0.25, icmp=0.05, links=2, skew_ns=3 * NS, flow_duration_ns=6 * NS,
                        seed=41)
    paths = generate(cfg.validate(), d / "c.pcap")
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


def test_reference_carries_groups_through_silent_windows(reference):
    """The oracle itself: `quiet` lists exactly the windows a group was carried through
    without a row, and `never` gives every protocol a row in every window from its first."""
    _, want = reference
    quiet = want["quiet"]
    assert len(quiet) > 0 and (quiet["n"] == 0).all()
    gone = want["gone"]
    assert (gone["n"] == 0).sum() == len(quiet)
    never = want["never"]
    last = never["tb"].max()
    for _, rows in never.groupby("protocol"):
        assert sorted(rows["tb"]) == list(range(rows["tb"].min(), last + 1))


@pytest.mark.parametrize("slots", [16, 1 << 16])
@pytest.mark.slow
def test_running_aggregation_equals_reference(capture, reference, slots, spark_session,
                                              tmp_path):
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    outputs = tuple((name, str(tmp_path / f"{name}.csv")) for name in NAMES)
    summary = run(RunConfig(query_file=str(capture["dir"] / "q.gsql"), links=capture["links"],
                            outputs=outputs, overrides=(("aggregate_slots", str(slots)),),
                            progress=False))
    plan, want = reference
    for name, out in outputs:
        assert len(want[name]) > 0, name
        assert summary.queries[name].rows == len(want[name]), name
        assert_same_rows(Path(out), want[name], plan.query(name))
    if slots == 16:
        q = summary.queries["gone"]
        # more partial rows than (window, group)s with a row: several per group were combined
        assert q.evictions > 0 and q.partial_rows > int((want["gone"]["n"] > 0).sum())


RESUMED = """\
DEFINE { query_name carried; }
SELECT tb, srcIP, srcPort, count(*) AS n, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/10 AS tb, srcIP, srcPort
CLOSING_WHEN count(*) = 0;
"""


@pytest.mark.slow
def test_kill_9_and_resume_keeps_the_carried_groups(tmp_path):
    """Killed with SIGKILL while it writes windows and run again with the same spool and
    checkpoint, a running aggregation carries on from its committed state (the carried
    groups' keys and the last window stepped through): the output equals an uninterrupted
    run's, no row lost or written twice."""
    from tests.tools.resuming import csv_rows, csv_windows, kill_when, run_command, run_here
    from tools.gen.traffic import TrafficConfig, generate

    cfg = TrafficConfig(packets=60_000, duration_ns=300 * NS, groups=400, flows=800,
                        flow_duration_ns=40 * NS, seed=8)
    pcap = generate(cfg.validate(), tmp_path / "main.pcap")["l0"]
    query = tmp_path / "carried.gsql"
    query.write_text(RESUMED)
    want = tmp_path / "want.csv"
    run_here(run_command(str(query), {"main": pcap}, {"carried": want}, speed="max"))
    want_header, want_rows = csv_rows(want)
    windows = len({r[0] for r in want_rows})
    assert windows >= 25 and any(r[3] == "0" for r in want_rows)

    out = tmp_path / "out.csv"
    cmd = run_command(str(query), {"main": pcap}, {"carried": out}, speed="20",
                      spool=tmp_path / "spool", checkpoint=tmp_path / "ck")
    kill_when(cmd, lambda: csv_windows(out) >= 4, poll=0.05)
    assert csv_windows(out) < windows, "killed too late to tell"
    run_here(cmd)
    header, rows = csv_rows(out)
    assert header == want_header
    assert len(rows) == len(set(rows)), "a row written twice"
    assert sorted(rows) == sorted(want_rows)


#: GS-lite's running aggregate of the manual's 6.2.12, declared as it is there
RUNNING_DECLARATIONS = "float UDAF [RUNNING] moving_avg(uint, uint HANDLE);\n"

#: moving_avg(len, n): the mean of len over the group's last n windows (n <= 5), a ring of
#: per-window sums and counts; `window_change` moves to the next slot (GS-lite's REINIT)
RUNNING_MODULE = """\
class moving_avg:
    state = ("float64", 12)          # n, current slot, 5 sums, 5 counts

    def init(state, n):
        if not 1 <= n <= 5:
            raise ValueError("moving_avg keeps at most 5 windows")
        state[:] = 0.0
        state[0] = n

    def update(state, value):
        slot = int(state[1])
        state[2 + slot] += value
        state[7 + slot] += 1.0

    def combine(state, other):
        # align the rings on their current slots (a partial's is 0)
        n = int(state[0])
        for back in range(n):
            dst = (int(state[1]) - back) % n
            src = (int(other[1]) - back) % n
            state[2 + dst] += other[2 + src]
            state[7 + dst] += other[7 + src]

    def window_change(state):
        n = int(state[0])
        slot = (int(state[1]) + 1) % n
        state[1] = slot
        state[2 + slot] = 0.0
        state[7 + slot] = 0.0

    def output(state):
        n = int(state[0])
        total = 0.0
        count = 0.0
        for k in range(n):
            total += state[2 + k]
            count += state[7 + k]
        return total / count if count > 0 else 0.0
"""

RUNNING_QUERIES = """\
DEFINE { query_name ports_avg; }
SELECT tb, srcIP, srcPort, moving_avg(len, 3) AS avg3, moving_avg(len, 5) AS avg5,
       count(*) AS n
FROM IPV4
GROUP BY time/2 AS tb, srcIP, srcPort
HAVING moving_avg(len, 3) > 0
CLOSING_WHEN count(*) = 0 AND moving_avg(len, 3) < 300.0;
"""


@pytest.mark.slow
def test_running_aggregate_equals_reference(capture, spark_session, tmp_path):
    """A RUNNING user-defined aggregate (the manual's moving_avg) keeps its state from a
    group's first window to its closing: the split run (partial states per window, combined
    with the carried state after window_change) equals the reference's one fold per group;
    and the manual's example 22 runs unchanged with these declarations."""
    from capture.reader import read_all
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    (tmp_path / "udafs.def").write_text(RUNNING_DECLARATIONS)
    (tmp_path / "udafs.py").write_text(RUNNING_MODULE)
    example = Path(__file__).resolve().parents[1] / "queries" / "fixtures" / "manual" / \
        "22_running_aggr_moving_avg.gsql"
    links = [name for name, _ in capture["links"]]
    batches = {name: read_all(path, name) for name, path in capture["links"]}
    library = FunctionLibrary.load((str(tmp_path / "udafs.def"),), str(tmp_path / "udafs.py"))
    for path, text in ((tmp_path / "r.gsql", RUNNING_QUERIES),
                       (example, example.read_text())):
        if path != example:
            path.write_text(text)
        plan = plan_text(text, links, path=str(path), functions=library)
        want = evaluate_file(plan, batches)
        if path != example:
            running = want
        (qp,) = plan.queries
        out = tmp_path / f"{qp.name}.csv"
        summary = run(RunConfig(query_file=str(path), links=capture["links"],
                                outputs=((qp.name, str(out)),),
                                function_files=(str(tmp_path / "udafs.def"),),
                                udf_module=str(tmp_path / "udafs.py"), progress=False))
        assert len(want[qp.name]) > 0
        assert summary.queries[qp.name].rows == len(want[qp.name])
        assert_same_rows(out, want[qp.name], qp)
    rows = running["ports_avg"]
    # carried windows without a row still report the running mean
    assert ((rows["n"] == 0) & (rows["avg3"] > 0)).any()


def test_running_aggregate_errors_are_located(tmp_path):
    """A RUNNING aggregate outside a running aggregation, without `window_change`, or with a
    HANDLE that is not a literal: each named at its call."""
    from queries.errors import QueryError
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary

    (tmp_path / "udafs.def").write_text(RUNNING_DECLARATIONS)
    (tmp_path / "udafs.py").write_text(RUNNING_MODULE)
    library = FunctionLibrary.load((str(tmp_path / "udafs.def"),), str(tmp_path / "udafs.py"))
    cases = [
        ("SELECT tb, moving_avg(len, 5) FROM TCP GROUP BY time/10 AS tb",
         "1:12: moving_avg is a RUNNING aggregate", "it needs a running aggregation"),
        ("SELECT tb, moving_avg(len, len) FROM TCP GROUP BY time/10 AS tb CLOSING_WHEN 1 = 1",
         "1:28: argument 2 of moving_avg is a HANDLE parameter", "must be a number literal"),
        ("SELECT tb, moving_avg(len, 9) FROM TCP GROUP BY time/10 AS tb CLOSING_WHEN 1 = 1",
         "1:12: moving_avg's init(state, 9) failed", "at most 5 windows"),
    ]
    for text, where, what in cases:
        with pytest.raises(QueryError) as info:
            plan_text(text, ["main"], functions=library)
        assert where in str(info.value) and what in str(info.value), str(info.value)
    (tmp_path / "bare.py").write_text(RUNNING_MODULE.replace("def window_change", "def nope"))
    bare = FunctionLibrary.load((str(tmp_path / "udafs.def"),), str(tmp_path / "bare.py"))
    with pytest.raises(QueryError, match="must give it `window_change"):
        plan_text("SELECT tb, moving_avg(len, 5) FROM TCP GROUP BY time/10 AS tb "
                  "CLOSING_WHEN 1 = 1", ["main"], functions=bare)
