"""User-defined functions (queries.udf), GS-lite's function library and getlpmid in the analyser."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from common.errors import ConfigError
from queries.errors import QueryError
from queries.planner import plan_text
from queries.udf import DeclarationError, FunctionLibrary, parse_declarations

MANUAL = Path(__file__).parent / "fixtures" / "manual"

DECLARATIONS = """\
// user functions
float FUN [LFTA_LEGAL, COST LOW] scaled(uint, float HANDLE);
uint FUN is_web(uint);
string FUN [PARTIAL] cut(string, uint);
uint FUN [LFTA_LEGAL] UMAX (uint,uint);      -- a built-in: ours runs
PRED [LFTA_LEGAL] is_http_port[uint];
ullong UDAF [RUNNING] my_sum fstring12 (uint);
uint FUN [LFTA_LEGAL] weird(fstring12);
"""

MODULE = """\
import numpy as np

def scaled(x, factor):
    return x * factor

def is_web(port):
    return ((port == 80) | (port == 443)).astype(np.uint64)
"""


@pytest.fixture
def library(tmp_path) -> FunctionLibrary:
    decls = tmp_path / "funcs.def"
    decls.write_text(DECLARATIONS)
    module = tmp_path / "udfs.py"
    module.write_text(MODULE)
    return FunctionLibrary.load((str(decls),), str(module))


def plan(text: str, library=None):
    return plan_text(text, ["main"], path="q.gsql", functions=library)


def error(text: str, library=None) -> str:
    with pytest.raises(QueryError) as info:
        plan(text, library)
    return str(info.value)


# --- declarations -------------------------------------------------------------------------------

def test_parse_every_kind():
    decls = parse_declarations(DECLARATIONS, "f.def")
    kinds = [(d.kind, d.name) for d in decls]
    assert kinds == [("FUN", "scaled"), ("FUN", "is_web"), ("FUN", "cut"), ("FUN", "umax"),
                     ("PRED", "is_http_port"), ("UDAF", "my_sum"), ("FUN", "weird")]
    scaled = decls[0]
    assert scaled.returns == "float" and scaled.line == 2
    assert [p.type for p in scaled.params] == ["uint", "float"]
    assert [p.handle for p in scaled.params] == [False, True]
    assert {"LFTA_LEGAL", "COST"} <= scaled.modifiers


def test_parse_the_manuals_declarations():
    decls = parse_declarations((MANUAL / "external_fcns_user_manual.txt").read_text(),
                               "um.txt")
    assert {d.kind for d in decls} == {"FUN", "PRED", "UDAF", "EXTR", "STATE", "SFUN"}
    lpm = [d for d in decls if d.name == "getlpmid"]
    assert lpm and lpm[0].params[1].handle
    # the contributor manual prints one declaration without its ';'
    with pytest.raises(DeclarationError, match=r"cm.txt:25: expected ';' after the parameter "
                                               r"list of strtoi"):
        parse_declarations((MANUAL / "external_fcns_contributor_manual.txt").read_text(),
                           "cm.txt")


@pytest.mark.parametrize("text,message", [
    ("uint FUN f(uint)", "f.def:1: declaration without its closing ';'"),
    ("uint f(uint);", "expected a return type then FUN"),
    ("uint FUN f(uint,,uint);", "an empty parameter"),
    ("\n\nuint FUN [LFTA_LEGAL f(uint);", "f.def:3: modifiers without their closing ']'"),
    ("uint FUN f uint;", "expected the parameter list in parentheses"),
    ("uint FUN f(uint) # x;", "f.def:1: unexpected '#'"),
])
def test_declaration_errors_are_located(text, message):
    with pytest.raises(DeclarationError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_declarations(text, "f.def")


# --- calls --------------------------------------------------------------------------------------

def test_udf_plans_with_types(library):
    p = plan("SELECT scaled(len, 0.5) AS s, time FROM TCP WHERE scaled(len, 2.0) > 10.0",
             library)
    qp = p.queries[0]
    low = qp.low[0]
    call = low.predicate.left
    assert call.name == "scaled" and call.external.lfta_legal
    assert call.external.params == ("uint", "float") and call.external.returns == "float"
    assert [o.type for o in qp.high.outputs] == ["float", "uint"]


def test_non_lfta_function_only_in_the_high_level(library):
    msg = error("SELECT len FROM TCP WHERE is_web(destPort) = 1", library)
    assert "1:27: is_web is not LFTA_LEGAL (declared at" in msg and "not in WHERE" in msg
    msg = error("SELECT tb, COUNT(*) FROM TCP GROUP BY time/60 AS tb, is_web(destPort) AS w",
                library)
    assert "is_web is not LFTA_LEGAL" in msg and "not in GROUP BY" in msg
    # in SELECT of a selection its argument is projected by the low level
    qp = plan("SELECT time, is_web(destPort) + 1 AS w FROM TCP", library).queries[0]
    assert [k.name for k in qp.low[0].projections] == ["time", "_p0"]
    out = qp.high.outputs[1].expr
    assert out.left.name == "is_web" and out.left.arguments[0].name == "_p0"
    # in SELECT of an aggregation, over an aggregate
    plan("SELECT tb, is_web(MAX(destPort)) AS w FROM TCP GROUP BY time/60 AS tb", library)


@pytest.mark.parametrize("query,message", [
    ("SELECT scaled(len, len) FROM TCP", "1:20: argument 2 of scaled is a HANDLE parameter "
                                         "(declared at"),
    ("SELECT scaled(srcIP, 1.0) FROM TCP", "1:8: scaled does not take (ip, float): "
                                           "declared float scaled(uint, float HANDLE) at"),
    ("SELECT scaled(len) FROM TCP", "1:8: scaled takes 2 argument(s), not 1"),
    ("SELECT cut('a', 1) FROM TCP", "1:8: cut is PARTIAL"),
    ("SELECT weird(len) FROM TCP", "type fstring12 has no oopscope counterpart"),
    ("SELECT nosuch(len) FROM TCP", "1:8: unknown function 'nosuch'"),
    ("SELECT len FROM TCP WHERE is_http_port[destPort]", "1:27: predicate is_http_port[...] "
                                                         "(declared at"),
    ("SELECT tb, my_sum(len) FROM TCP GROUP BY time/60 AS tb",
     "1:12: my_sum is declared at"),
])
def test_call_errors_are_located(library, query, message):
    assert message in error(query, library)


def test_declared_but_not_implemented(tmp_path):
    decls = tmp_path / "f.def"
    decls.write_text("uint FUN [LFTA_LEGAL] double_it(uint);\n")
    msg = error("SELECT double_it(len) FROM TCP", FunctionLibrary.load((str(decls),)))
    assert f"double_it is declared at {decls}:1 but no Python module implements it" in msg
    module = tmp_path / "m.py"
    module.write_text("x = 1\n")
    msg = error("SELECT double_it(len) FROM TCP", FunctionLibrary.load((str(decls),),
                                                                       str(module)))
    assert "defines no function double_it" in msg
    broken = tmp_path / "broken.py"
    broken.write_text("import nosuchmodule_zz\n")
    with pytest.raises(ConfigError, match="failed to import: ModuleNotFoundError"):
        FunctionLibrary.load((str(decls),), str(broken))


def test_udf_evaluates_per_batch(library):
    from capture.batch import PacketBatch
    from lowlevel.evaluate import evaluate

    qp = plan("SELECT scaled(len, 0.5) AS s FROM TCP", library).queries[0]
    expr = qp.low[0].projections[0].expr
    batch = PacketBatch.empty("main")
    assert len(evaluate(expr, batch)) == 0


# --- the library ----------------------------------------------------------------------------------

@pytest.mark.parametrize("expr,type_", [
    ("UMAX(len, 10)", "uint"), ("umin(len, -1)", "llong"), ("LLMAX(len, 3)", "ullong"),
    ("UMAX(len, 1.5)", "float"), ("UMIN(srcIP, destIP)", "ip"), ("IF(len > 3, 1, 2)", "uint"),
    ("EQ(len, 3)", "uint"), ("GEQ(len, 3)", "uint"), ("LEQ(len, 3)", "uint"),
    ("non_temporal(time)", "uint"), ("sqrt(len)", "float"), ("UINT(srcIP)", "uint"),
    ("ULLONG(len)", "ullong"), ("INT(len)", "int"), ("FLOAT(len)", "float"),
])
def test_library_types(expr, type_):
    qp = plan(f"SELECT {expr} AS v FROM TCP").queries[0]
    assert qp.high.outputs[0].type == type_


def test_library_values():
    """MIN/MAX compare signed and unsigned values exactly, as `<` does."""
    from lowlevel.evaluate import evaluate_columns
    from queries import expressions as E

    cols = {"a": np.array([1, 5, 2**63], np.uint64), "b": np.array([-3, 7, 1], np.int64)}
    a = E.Field(name="a", type="ullong")
    b = E.Field(name="b", type="llong")
    umax = E.Func(name="umax", args=[a, b])
    umin = E.Func(name="umin", args=[a, b])
    assert evaluate_columns(umax, cols).tolist() == [1, 7, 2**63 - 2**64]
    assert evaluate_columns(umin, cols).tolist() == [-3, 5, 1]
    geq = E.Func(name="geq", args=[a, b])
    assert evaluate_columns(geq, cols).tolist() == [1, 0, 1]


def test_getlpmid_file_errors(tmp_path):
    good = tmp_path / "p.tbl"
    good.write_text("10.0.0.0/8|1\n")
    qp = plan(f"SELECT time FROM IPV4 WHERE getlpmid(srcIP, '{good}') > 0").queries[0]
    assert qp.low[0].predicate.left.arguments[1].value == str(good)
    bad = tmp_path / "bad.tbl"
    bad.write_text("10.0.0.0/8|1\n10.0.0.0/40|2\n")
    msg = error(f"SELECT time FROM IPV4\nWHERE getlpmid(srcIP, '{bad}') > 0")
    assert f"2:23: prefix file {bad}:2: the address is not an IPv4 or IPv6 prefix" in msg
    assert "10.0.0.0/40" not in msg
    msg = error("SELECT time FROM IPV4 WHERE getlpmid(srcIP, './nosuch.tbl') > 0")
    assert "1:45: prefix file ./nosuch.tbl: not found" in msg
    msg = error("SELECT time FROM IPV4 WHERE getlpmid(srcIP, srcIP) > 0")
    assert "getlpmid does not take (ipv4, ipv4)" in msg


def _plan_manual(text: str, name: str):
    from queries.explain import format_plan, mentioned_links
    from queries.parser import parse
    from queries.planner import plan_file

    tree = parse(text, path=name)
    return format_plan(plan_file(tree, mentioned_links(tree) or ["main"], source=text))


def test_manual_lpm_examples_explain(tmp_path, monkeypatch):
    """The manual's examples name their prefix files relative to where the query runs
    (`./localprefix.tbl`): run there, they plan unchanged. Example 33 selects packet fields
    oopscope's TCP schema lacks (id): its WHERE plans as written."""
    for name in ("localprefix.tbl", "filter.tbl"):
        (tmp_path / name).write_text("0.0.0.0/0|0\n1.2.3.4/29|5\n10.0.0.0/8|1\n")
    monkeypatch.chdir(tmp_path)
    assert os.getcwd() == str(tmp_path)
    text = (MANUAL / "27_udf_getlpmid_local.gsql").read_text()
    assert f"getlpmid(srcIP, '{tmp_path}/localprefix.tbl') > 0" in _plan_manual(text, "27")
    text = (MANUAL / "33_lpm_filter_tbl.gsql").read_text()
    with pytest.raises(QueryError, match="id is not supported yet: the IPv4 identification"):
        _plan_manual(text, "33")
    where = text[text.index("WHERE"):]
    assert "getlpmid(destIP" in _plan_manual(f"SELECT time, srcIP FROM TCP {where}", "33")
