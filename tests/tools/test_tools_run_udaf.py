"""`oopscope run` of a user-defined aggregate (docs/gsql.md "User-defined aggregates"): the
low level's specialised kernel runs `update`, the Spark high level combines a (window,
group)'s partial states with `combine` (the state words collected and folded by a pandas UDF)
and computes `output` (a pandas UDF over the words); against the reference evaluator, which
folds each group directly with `init`, `update` and `output` in plain Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.test_tools_run import assert_same_rows

NS = 1_000_000_000

DECLARATIONS = """\
float UDAF [LFTA_LEGAL] posavg(float);
ullong UDAF poscount(llong);
"""

#: POSAVG (Tigon SQL user manual, chapter 13): the average of the positive values (a float64
#: state of 2 words); poscount: how many values are positive (a uint64 state of 1 word)
MODULE = """\
class posavg:
    state = ("float64", 2)          # sum, count

    def init(state):
        state[0] = 0.0
        state[1] = 0.0

    def update(state, value):
        if value > 0:
            state[0] += value
            state[1] += 1.0

    def combine(state, other):
        state[0] += other[0]
        state[1] += other[1]

    def output(state):
        return state[0] / state[1] if state[1] > 0 else 0.0


class poscount:
    state = ("uint64", 1)

    def init(state):
        state[0] = 0

    def update(state, value):
        if value > 0:
            state[0] += 1

    def combine(state, other):
        state[0] += other[0]

    def output(state):
        return state[0]
"""

QUERIES = """\
DEFINE { query_name by_src; }
SELECT tb, srcIP, posavg(float(len) - 200.0) AS pa, posavg(float(len) - 200.0) * 2.0 AS pa2,
       poscount(len - 300) AS pc, count(*) AS n
FROM main.TCP
GROUP BY time/20 AS tb, srcIP;

DEFINE { query_name big_ports; }
SELECT tb, destPort, posavg(float(len) - 100.0) AS pa, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/10 AS tb, destPort
HAVING posavg(float(len) - 100.0) > 50.0 AND count(*) > 1;
"""

NAMES = ("by_src", "big_ports")


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    from tools.gen.traffic import TrafficConfig, generate

    d = tmp_path_factory.mktemp("udaf-run")
    cfg = TrafficConfig(packets=20_000, duration_ns=60 * NS, groups=400, flows=800,
                        tcp=0.6, udp=0.35, icmp=0.05, ipv6=0.1, snaplen=96, seed=23)
    pcap = generate(cfg.validate(), d / "main.pcap")["l0"]
    (d / "udafs.def").write_text(DECLARATIONS)
    (d / "udafs.py").write_text(MODULE)
    (d / "q.gsql").write_text(QUERIES)
    return {"dir": d, "pcap": pcap}


@pytest.fixture(scope="module")
def reference(setup):
    from capture.reader import read_all
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary
    from tests.oracles.reference import evaluate_file

    d = setup["dir"]
    library = FunctionLibrary.load((str(d / "udafs.def"),), str(d / "udafs.py"))
    plan = plan_text(QUERIES, ["main"], path=str(d / "q.gsql"), functions=library)
    return plan, evaluate_file(plan, {"main": read_all(setup["pcap"], "main")})


@pytest.mark.parametrize("slots", [16, 1 << 20])
@pytest.mark.slow
def test_udaf_run_equals_reference(setup, reference, slots, spark_session, tmp_path):
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    d = setup["dir"]
    outputs = tuple((name, str(tmp_path / f"{name}.csv")) for name in NAMES)
    summary = run(RunConfig(query_file=str(d / "q.gsql"), links=(("main", str(setup["pcap"])),),
                            outputs=outputs, overrides=(("aggregate_slots", str(slots)),),
                            function_files=(str(d / "udafs.def"),),
                            udf_module=str(d / "udafs.py"), progress=False))
    plan, want = reference
    for name, out in outputs:
        q = summary.queries[name]
        if slots == 16:
            # a tiny table: the groups of a window are evicted and spooled in pieces, so the
            # high level really combines several partial states per (window, group)
            assert q.evictions > 0 and q.partial_rows > len(want[name]), name
        assert len(want[name]) > 0, name
        assert q.rows == len(want[name]), name
        assert_same_rows(Path(out), want[name], plan.query(name))
    pa = want["by_src"]["pa"]
    assert (pa > 0).any() and (pa == 0).any()      # both branches of `output`
    assert (want["by_src"]["pc"] > 0).any()


def test_small_batch_combines_udaf_states(tmp_path):
    """The driver's small-batch combine (`highlevel.smallbatch`, the served path) folds the
    state words of each (window, group) with `combine`, as the Spark path does."""
    import pyarrow as pa

    from highlevel import smallbatch
    from queries.plan import SubAggregate
    from queries.udf import ExternalAggregate

    (tmp_path / "u.py").write_text(MODULE)
    udaf = ExternalAggregate("posavg", str(tmp_path / "u.py"), "float", "float", "float64", 2,
                             (0.0, 0.0), True, "u.def:1")
    states = [SubAggregate("pa", "udaf", None, "float64", udaf),
              SubAggregate("cnt", "count", None, "int64")]
    table = pa.table({"window": pa.array([1, 1, 2, 1], pa.int64()),
                      "k": pa.array([5, 5, 5, 6], pa.int64()),
                      "pa": pa.array([3.0, 4.0, 1.0, 0.0]),
                      "pa__w1": pa.array([1.0, 2.0, 1.0, 0.0]),
                      "cnt": pa.array([2, 3, 1, 4], pa.int64())})
    assert "udaf" in smallbatch.KINDS
    out = smallbatch.combine(table, ["window", "k"], states, 64)
    assert out.column_names == table.column_names
    d = out.to_pydict()
    rows = sorted(zip(d["window"], d["k"], d["pa"], d["pa__w1"], d["cnt"]))
    assert rows == [(1, 5, 7.0, 3.0, 5), (1, 6, 0.0, 0.0, 4), (2, 5, 1.0, 1.0, 1)]


#: UDAFs under every window kind and in a query reading another query's rows
WINDOW_QUERIES = """\
DEFINE { query_name sliding; }
SELECT srcIP, count(*) [RANGE 20 seconds, SLIDE 10 seconds, WA time] AS n,
       posavg(float(len) - 200.0) AS pa
FROM main.TCP GROUP BY srcIP;

DEFINE { query_name landmark; }
SELECT protocol, count(*) [RANGE ALL, SLIDE 10 seconds, WA time] AS n,
       posavg(float(len) - 200.0) AS pa, poscount(len - 300) AS pc
FROM main.IPV4 GROUP BY protocol;

DEFINE { query_name counted; }
SELECT protocol, count(*) [ROWS 500] AS n, posavg(float(len) - 200.0) AS pa
FROM main.IPV4 GROUP BY protocol;

DEFINE { query_name pkts; }
SELECT time/10 AS tb, srcIP, len FROM main.TCP;

DEFINE { query_name derived; }
SELECT tb, srcIP, posavg(float(len) - 200.0) AS pa, poscount(len - 300) AS pc
FROM pkts GROUP BY tb, srcIP;
"""

WINDOW_NAMES = ("sliding", "landmark", "counted", "derived")


@pytest.mark.slow
def test_udaf_in_every_window_kind_equals_reference(setup, spark_session, tmp_path):
    from capture.reader import read_all
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    # the module's UDAF files, the ones the other runs loaded: the same module path, whose
    # jitted update, combine and output the driver (and Spark's still-running Python
    # workers) compiled once, where a copy elsewhere is another module, compiled anew
    d = setup["dir"]
    (tmp_path / "w.gsql").write_text(WINDOW_QUERIES)
    library = FunctionLibrary.load((str(d / "udafs.def"),), str(d / "udafs.py"))
    plan = plan_text(WINDOW_QUERIES, ["main"], path=str(tmp_path / "w.gsql"), functions=library)
    want = evaluate_file(plan, {"main": read_all(setup["pcap"], "main")})
    outputs = tuple((name, str(tmp_path / f"{name}.csv")) for name in WINDOW_NAMES)
    summary = run(RunConfig(query_file=str(tmp_path / "w.gsql"),
                            links=(("main", str(setup["pcap"])),),
                            outputs=outputs, function_files=(str(d / "udafs.def"),),
                            udf_module=str(d / "udafs.py"), progress=False))
    for name, out in outputs:
        assert len(want[name]) > 0, name
        assert summary.queries[name].rows == len(want[name]), name
        assert_same_rows(Path(out), want[name], plan.query(name))


#: an extractor with a constant: the count of lengths in one of four buckets
HIST_DECLARATIONS = """\
uint EXTR bucket hist_udaf hist_extract (uint, uint);
string UDAF hist_udaf fstring32 (uint);
"""

HIST_MODULE = """\
class hist_udaf:
    state = ("uint64", 4)

    def init(state):
        state[:] = 0

    def update(state, value):
        k = 0 if value < 100 else 1 if value < 500 else 2 if value < 1000 else 3
        state[k] += 1

    def combine(state, other):
        state += other

    def output(state):
        return state.sum()


def hist_extract(state, k):
    return state[k]
"""

HIST_QUERY = """\
DEFINE { query_name buckets; }
SELECT tb, protocol, bucket(len, 0) AS small, bucket(len, 3) AS big, count(*) AS n
FROM main.IPV4
GROUP BY time/10 AS tb, protocol;
"""


@pytest.mark.slow
def test_extractors_equal_reference(setup, spark_session, tmp_path):
    """GS-lite's EXTR: the manual's extr_avg (example 45, its declarations as printed) and an
    extractor with a constant argument. The extraction function gets the UDAF's combined
    state; extr_avg equals the query's own sum/count."""
    from capture.reader import read_all
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary
    from tests.oracles.reference import evaluate_file
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    companions = Path(__file__).resolve().parent / "fixtures" / "manual_companions"
    example = Path(__file__).resolve().parents[1] / "queries" / "fixtures" / "manual" / \
        "45_c_udaf_extr_avg.gsql"
    (tmp_path / "hist.def").write_text(HIST_DECLARATIONS)
    (tmp_path / "hist.py").write_text(HIST_MODULE)
    (tmp_path / "hist.gsql").write_text(HIST_QUERY)
    batches = {"main": read_all(setup["pcap"], "main")}
    cases = [(example, companions / "extr_avg.def", companions / "extr_avg.py"),
             (tmp_path / "hist.gsql", tmp_path / "hist.def", tmp_path / "hist.py")]
    for query, decls, module in cases:
        library = FunctionLibrary.load((str(decls),), str(module))
        plan = plan_text(query.read_text(), ["main"], path=str(query), functions=library)
        (qp,) = plan.queries
        want = evaluate_file(plan, batches)[qp.name]
        out = tmp_path / f"{qp.name}.csv"
        summary = run(RunConfig(query_file=str(query), links=(("main", str(setup["pcap"])),),
                                outputs=((qp.name, str(out)),), function_files=(str(decls),),
                                udf_module=str(module), progress=False))
        assert len(want) > 0 and summary.queries[qp.name].rows == len(want)
        assert_same_rows(out, want, qp)
        if query == example:
            import numpy as np

            np.testing.assert_allclose(want.iloc[:, 3], want.iloc[:, 2], rtol=1e-12)
        else:
            assert (want["small"] + want["big"] <= want["n"]).all() and (want["big"] > 0).any()
