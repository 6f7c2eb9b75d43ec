"""Queries that used to pass `explain` and then crash `run` (issue 25, items 7, 8 and 11):
literals beyond GSQL's 64-bit types, constant divisors of 0, constant shift counts outside
0..63, windows and DEFINE values too large for 64-bit arithmetic, expression trees deeper than
the Python stack, names too long for a file name, and `GROUP BY time - 60`. Each is refused
(or warned about) by the planner with its line and column, through `explain` and `run` alike;
long AND/OR chains are accepted and evaluate as the reference evaluator says.
"""

from __future__ import annotations

import logging
import pickle
import re
import struct
import sys

import pytest

from queries import expressions as E
from queries.errors import QueryError
from queries.explain import explain_text
from queries.parser import parse
from queries.planner import plan_text
from queries.printer import to_gsql
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch
from tests.tools.resuming import run_here

AGG = "SELECT tb, COUNT(*) AS n{extra} FROM main.IP {where}GROUP BY time/60 AS tb{having}"


def agg(extra: str = "", where: str = "", having: str = "") -> str:
    return AGG.format(extra=extra, where=f"WHERE {where} " if where else "",
                      having=f" HAVING {having}" if having else "")


#: (query text, the text at the reported column, a fragment of the message)
REFUSED = [
    # literals beyond ullong / llong
    (agg(", 18446744073709551616 AS x"), "18446744073709551616", "does not fit in 64 bits"),
    (agg(having="COUNT(*) > 1208925819614629174706176"), "1208925819614629174706176",
     "does not fit in 64 bits"),
    (agg(", -9223372036854775809 AS x"), "-9223372036854775809", "smallest llong"),
    # past the digits Python converts to an int (the probe's ValueError traceback)
    (agg(", " + "9" * 5000 + " AS x"), "9" * 40, "integer of 5000 digits does not fit"),
    ("PARAM { n ullong = 1208925819614629174706176; }\n" + agg(having="COUNT(*) > $n"),
     "1208925819614629174706176", "does not fit in a ullong"),
    ("PARAM { n llong = 9223372036854775808; }\n" + agg(having="COUNT(*) > $n"),
     "9223372036854775808", "does not fit in a llong"),
    # DEFINE values and windows beyond what 64-bit arithmetic (or memory) can hold
    ("DEFINE { aggregate_slots 1208925819614629174706176; }\n" + agg(),
     "1208925819614629174706176", "aggregate_slots: 1208925819614629174706176 is too large"),
    ("DEFINE { slow_flush 99999999999999999999; flush oop_slow; }\n" + agg(),
     "99999999999999999999", "slow_flush"),
    ("DEFINE { idle_timeout 99999999999999999999s; }\n"
     "SELECT tb, srcIP, COUNT(*) FROM main.IP GROUP BY time/60 AS tb, srcIP",
     "99999999999999999999s", "too long"),
    ("SELECT srcIP, COUNT(*) [ROWS 1208925819614629174706176] FROM main.IP GROUP BY srcIP",
     "[ROWS", "does not fit in 64 bits"),
    ("SELECT srcIP, COUNT(*) [RANGE 18446744073709551616 seconds] FROM main.IP GROUP BY srcIP",
     "18446744073709551616 seconds", "too long"),
    ("SELECT srcIP, COUNT(*) [RANGE 1e300 hours] FROM main.IP GROUP BY srcIP",
     "1e300 hours", "too long"),
    ("SELECT tb, COUNT(*) FROM main.IP GROUP BY time/18446744073709551615 AS tb",
     "time/18446744073709551615", "years"),
    ("SELECT tb, COUNT(*) FROM main.IP GROUP BY timestamp * 4 AS tb", "timestamp * 4",
     "does not fit in 64 bits"),
    # constant divisors of 0 and shift counts a 64-bit value cannot take
    (agg(", SUM(len) / 0 AS x"), "/ 0", "division by zero"),
    (agg(", SUM(len) % (3 - 3) AS x"), "% (3 - 3)", "modulo by zero: the divisor 3 - 3 is 0"),
    (agg(where="len / (2 * 3 - 6) > 1"), "/ (2 * 3 - 6)", "division by zero"),
    (agg(having="COUNT(*) / if_else(1 > 2, 5, 0) > 1"), "/ if_else", "division by zero"),
    ("PARAM { z uint = 0; }\n" + agg(where="len % $z = 1"), "% $z", "divisor $z is 0"),
    (agg(", SUM(len) << 64 AS x"), "<< 64", "shift count 64 is outside 0..63"),
    (agg(where="len >> (0 - 1) = 0"), ">> (0 - 1)", "outside 0..63"),
    # names too long for a directory name
    ("DEFINE { query_name " + "q" * 10_000 + "; }\n" + agg(), "q" * 20, "too long"),
    ("DEFINE { query_name '" + "q" * 10_000 + "'; }\n" + agg(), "query_name", "too long"),
    ("SELECT a.tb FROM main.IP " + "a" * 300 + " GROUP BY time AS tb", "a" * 20, "too long"),
    # an expression deeper than the walks of the tree can take
    ("SELECT " + " + ".join(["len"] * 150) + " AS x FROM main.IP", "+ len", "too deep"),
    # a temporal group item in no form that makes a window
    ("SELECT tb, COUNT(*) FROM main.IP GROUP BY time % 60 AS tb", "time % 60",
     "makes no window"),
    ("SELECT tb, COUNT(*) FROM main.IP GROUP BY time / -60 AS tb", "time / -60",
     "makes no window"),
]


def _at(text: str, line: int, col: int) -> str:
    return text.split("\n")[line - 1][col - 1:]


@pytest.mark.parametrize("text,where,message", REFUSED,
                         ids=[f"{i}-{m[:24]}" for i, (_, _, m) in enumerate(REFUSED)])
def test_refused_at_its_line_and_column(text, where, message):
    with pytest.raises(QueryError) as info:
        explain_text(text, path="q.gsql")
    err = info.value
    assert err.errors == [] and err.line is not None and err.column is not None
    assert message in err.message, err
    assert _at(text, err.line, err.column).startswith(where), (str(err), where)
    assert str(err).startswith(f"q.gsql:{err.line}:{err.column}: ")


def test_parameter_given_at_run_time_is_checked_like_a_default():
    text = "PARAM { z uint; }\n" + agg(where="len / $z > 1")
    assert "query" in explain_text(text)         # no value yet: nothing to fold
    assert "$z" in explain_text(text)
    with pytest.raises(QueryError, match=r"division by zero: the divisor \$z is 0"):
        explain_text(text, params={"z": "0"})
    assert "len / 7 > 1" in explain_text(text, params={"z": "7"})


def test_set_overrides_are_bounded_too():
    from common.errors import ConfigError

    with pytest.raises(ConfigError, match="aggregate_slots: 1099511627776 is too large"):
        explain_text(agg(), overrides={"aggregate_slots": str(2**40)})
    with pytest.raises(ConfigError, match=r"^--set query_name: a name of 5,000 characters"):
        explain_text(agg(), overrides={"query_name": "x" * 5000})
    assert "aggregate_slots=1073741824" in explain_text(
        agg(), overrides={"aggregate_slots": str(2**30)})


def test_the_file_name_cannot_make_a_name_too_long():
    with pytest.raises(QueryError, match="name has 70 characters") as info:
        explain_text(agg(), path="x" * 70 + ".gsql")
    assert (info.value.line, info.value.column) == (1, 1)


def test_values_at_the_edges_of_the_types_still_plan():
    text = agg(", 18446744073709551615 AS top, -9223372036854775808 AS bottom, "
               "SUM(len) << 63 AS high, SUM(len) / (COUNT(*) - 1) AS runtime_div",
               having="COUNT(*) < 18446744073709551615")
    plan = plan_text(text, ["main"])
    frame = evaluate_file(plan, {"main": random_batch(500, seed=5)})["query"]
    assert set(frame["top"]) == {2**64 - 1} and set(frame["bottom"]) == {-2**63}
    # a divisor that is 0 only on some rows is defined as 0 there (docs/gsql.md), not refused
    plan = plan_text("PARAM { w uint = 60; }\nSELECT tb, COUNT(*) FROM main.IP "
                     "GROUP BY time/$w AS tb", ["main"])
    assert plan.queries[0].high.window.pane_ns == 60 * 10**9


# --- long chains and deep trees -----------------------------------------------------------------

def _or_chain(n: int) -> str:
    return " OR ".join(f"len = {40 + i}" for i in range(n))


def test_a_thousand_or_terms_plan_and_evaluate_like_an_in_list():
    """A flat chain of 1000 ORs was a RecursionError; now a balanced tree (depth ~10) whose
    rows are those of the same test written as an IN list (an independent form)."""
    chained = plan_text(agg(where=f"({_or_chain(1000)}) AND ttl > 0"), ["main"])
    listed = plan_text(agg(where=f"len IN [{', '.join(str(40 + i) for i in range(1000))}] "
                               f"AND ttl > 0"), ["main"])
    batch = {"main": random_batch(3000, seed=9)}
    a, b = (evaluate_file(p, batch)["query"] for p in (chained, listed))
    assert len(a) > 0 and a.equals(b)
    where = chained.queries[0].low[0].predicate
    depth = _depth(where)
    assert depth <= 14, depth
    # plans cross process boundaries pickled; explain prints the chain flat
    assert pickle.loads(pickle.dumps(chained)).queries[0].low[0].predicate == where
    assert "len = 40 OR len = 41 OR len = 42" in explain_text(agg(where=_or_chain(1000)))


def _depth(node: E.Node) -> int:
    deepest, stack = 0, [(node, 1)]
    while stack:
        n, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in n.children())
    return deepest


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 33, 1000])
def test_chains_print_and_parse_back_to_the_same_tree(n):
    text = f"SELECT a FROM IP WHERE ({_or_chain(n)}) AND (b OR c) AND NOT (d OR e OR f)"
    tree = parse(text)
    printed = to_gsql(tree)
    assert parse(printed) == tree
    assert to_gsql(parse(printed)) == printed
    where = tree.queries[0].statement.where
    terms = E.chain_terms(where, "AND")
    assert len(terms) == 3 and len(E.chain_terms(terms[0], "OR")) == n


def test_two_and_three_terms_keep_the_left_deep_shape():
    (a, b, c) = (E.Column(name=x) for x in "abc")
    assert E.chain("OR", [a, b]) == E.Binary(op="OR", left=a, right=b)
    assert E.chain("OR", [a, b, c]) == E.Binary(op="OR", left=E.Binary(op="OR", left=a, right=b),
                                                right=c)
    # a chain written with explicit parentheses stays as written
    tree = parse("SELECT x FROM IP WHERE a OR (b OR c)").queries[0].statement.where
    assert tree == E.Binary(op="OR", left=a, right=E.Binary(op="OR", left=b, right=c))
    assert to_gsql(tree) == "a OR (b OR c)"


def test_the_depth_limit_is_at_the_operator_that_crosses_it():
    ok = "SELECT " + " + ".join(["len"] * 100) + " AS x FROM main.IP"
    assert "output: x uint" in explain_text(ok)
    deep = "SELECT " + " + ".join(["len"] * 101) + " AS x FROM main.IP"
    with pytest.raises(QueryError, match="more than 100 levels") as info:
        explain_text(deep)
    # the 100th `+` joins the 101st term: the tree's 101st level
    plus = [m.start() for m in re.finditer(r"\+", deep)]
    assert (info.value.line, info.value.column) == (1, plus[99] + 1)


# --- GROUP BY time - 60 -------------------------------------------------------------------------

def test_time_minus_a_constant_warns_which_windows_it_makes(caplog):
    text = "SELECT tb, COUNT(*) FROM main.IP GROUP BY time - 60 AS tb"
    with caplog.at_level(logging.WARNING, logger="queries.analysis"):
        plan = plan_text(text, ["main"], path="w.gsql")
    (warning,) = plan.queries[0].analysed.warnings
    assert warning.startswith("w.gsql:1:43: GROUP BY time - 60 AS tb makes windows of 1 second")
    assert "time/60 AS tb for windows of 1 minute" in warning
    assert warning in caplog.text
    # the windows it makes: one second, the value shifted by -60
    window = plan.queries[0].high.window
    assert (window.pane_ns, window.shift) == (10**9, -60)
    # the documented forms do not warn, nor a shift after a division
    for form in ("time/60", "time*60", "time+60", "(time + 30)/60*60 - 5", "time/60 + -1"):
        caplog.clear()
        plan = plan_text(f"SELECT tb, COUNT(*) FROM main.IP GROUP BY {form} AS tb", ["main"])
        assert plan.queries[0].analysed.warnings == [] and "makes windows" not in caplog.text


# --- through the command line (in this process: `run_here`) ----------------------------------

@pytest.mark.parametrize("text,where,message", [REFUSED[0], REFUSED[5], REFUSED[14],
                                                REFUSED[20], REFUSED[23]],
                         ids=["literal", "slots", "modulo", "name", "depth"])
def test_explain_and_run_refuse_with_one_line_and_no_traceback(text, where, message, tmp_path):
    query = tmp_path / "bad.gsql"
    query.write_text(text)
    capture = tmp_path / "empty.pcap"     # a pcap header without packets: never read
    capture.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
    for argv in (["explain", str(query)], ["run", str(query), "--link", f"main={capture}"]):
        proc = run_here([sys.executable, "-m", "tools.cli", *argv], check=False)
        assert proc.returncode == 1, (argv, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        first = proc.stderr.splitlines()[0]
        assert re.match(rf"oopscope: error: {re.escape(str(query))}:\d+:\d+: ", first), first
        assert message in first


def test_explain_warns_on_stderr_and_still_plans(tmp_path):
    query = tmp_path / "minus.gsql"
    query.write_text("SELECT tb, COUNT(*) FROM main.IP GROUP BY time - 60 AS tb\n")
    proc = run_here([sys.executable, "-m", "tools.cli", "explain", str(query)])
    assert proc.returncode == 0, proc.stderr
    assert f"oopscope: WARNING: {query}:1:43: GROUP BY time - 60 AS tb makes windows of " \
           f"1 second" in proc.stderr
    assert "window: tumbling 1s;" in proc.stdout and "tb = pane * 1 + -60" in proc.stdout
