"""User-defined aggregates split between the levels (docs/gsql.md "User-defined aggregates"):
the low level's specialised kernel runs `update`, the numpy combine runs `combine`, the
finals `output`; against the reference evaluator's direct fold (init, update, output)."""

from __future__ import annotations

import pytest

from capture.reader import read_all
from lowlevel.partials import combine_partials
from lowlevel.testing import finalize
from queries.planner import plan_text
from queries.udf import FunctionLibrary
from tests.lowlevel.test_lowlevel_operator import _compare, _run
from tests.oracles.reference import evaluate_file
from tools.gen.traffic import TrafficConfig, generate

NS = 1_000_000_000

DECLARATIONS = """\
float UDAF [LFTA_LEGAL] posavg(float);
ullong UDAF nonzero(ullong);
"""

#: POSAVG (Tigon SQL user manual, chapter 13): the average of the positive values; nonzero
#: counts the non-zero values with an int state and an update Numba cannot compile (it
#: reads a Python object)
MODULE = """\
import fractions

ZERO = fractions.Fraction(0)


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


class nonzero:
    state = ("uint64", 1)

    def init(state):
        state[0] = 0

    def update(state, value):
        if value != ZERO:
            state[0] += 1

    def combine(state, other):
        state[0] += other[0]

    def output(state):
        return state[0]
"""

QUERY = """SELECT tb, srcIP, posavg(float(len) - 200.0) AS pa, count(*) AS n
           FROM main.TCP GROUP BY time/20 AS tb, srcIP"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("udaf")
    cfg = TrafficConfig(packets=12_000, duration_ns=120 * NS, groups=300, ipv6=0.1, seed=9)
    batch = read_all(generate(cfg, d / "main.pcap")["l0"], link="main").copy()
    (d / "udafs.def").write_text(DECLARATIONS)
    (d / "udafs.py").write_text(MODULE)
    library = FunctionLibrary.load((str(d / "udafs.def"),), str(d / "udafs.py"))
    return batch, library


def test_plan_splits_a_udaf(setup):
    _, library = setup
    qp = plan_text(QUERY, ["main"], functions=library).queries[0]
    sub = next(s for s in qp.low[0].subaggs if s.kind == "udaf")
    assert (sub.udaf.name, sub.udaf.dtype, sub.udaf.size, sub.udaf.lfta) == \
        ("posavg", "float64", 2, True)
    assert sub.udaf.identity == (0.0, 0.0)
    assert [s.kind for s in qp.high.superaggs] == ["udaf", "sum"]
    assert qp.high.finals[0].expr.name == "udaf_output"


def test_update_numba_cannot_compile_is_refused_for_now(setup):
    from queries.errors import QueryError

    _, library = setup
    with pytest.raises(QueryError, match="Numba cannot compile its update"):
        plan_text("SELECT tb, nonzero(len) FROM main.TCP GROUP BY time/20 AS tb", ["main"],
                  functions=library)


def test_udaf_arity_is_checked(setup):
    from queries.errors import QueryError

    _, library = setup
    with pytest.raises(QueryError, match=r"posavg does not take \(uint, ...\)"):
        plan_text("SELECT tb, posavg(len, 2) FROM main.TCP GROUP BY time/20 AS tb", ["main"],
                  functions=library)


@pytest.mark.parametrize("slots", [16, 4096])
def test_udaf_split_equals_reference(setup, slots):
    batch, library = setup
    fp = plan_text(QUERY, ["main"], functions=library)
    qp = fp.queries[0]
    low = qp.low[0].__class__(**{**qp.low[0].__dict__, "slots": slots})
    op, batches, _ = _run(low, batch)
    if slots == 16:
        assert op.counters["evictions"] > 0      # partial states to combine
    got = finalize(qp, combine_partials(batches, op.schema))
    want = evaluate_file(fp, {"main": batch})[qp.name]
    assert len(want) > 0 and (want["pa"] > 0).any() and (want["pa"] == 0).any()
    _compare(got, want, ["tb", "srcIP"])
