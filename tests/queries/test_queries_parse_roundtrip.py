"""Round trips: parse -> to_gsql -> parse gives the same tree, and precedence matches Python's."""

from __future__ import annotations

import operator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from queries.expressions import Binary, Column, Literal, Unary
from queries.parser import parse
from queries.printer import to_gsql

ROUNDTRIP = Path(__file__).parent / "golden" / "roundtrip.gsql"


def test_roundtrip_file_is_identity():
    text = ROUNDTRIP.read_text()
    tree = parse(text, path="roundtrip.gsql")
    assert len(tree.queries) == 13
    printed = to_gsql(tree)
    again = parse(printed, path="roundtrip.gsql")
    assert again == tree
    # printing is a fixed point after one round
    assert to_gsql(again) == printed


def test_roundtrip_each_query_and_expression_alone():
    tree = parse(ROUNDTRIP.read_text(), path="roundtrip.gsql")
    for query in tree.queries:
        one = parse(to_gsql(query), name=query.name)
        assert one.queries[0] == query
        for item in getattr(query.statement, "items", []):
            expr_text = to_gsql(item.this)
            back = parse(f"SELECT {expr_text} FROM IP").queries[0].statement.items[0].this
            assert back == item.this, expr_text


# --- random trees: printer and parser agree --------------------------------------------------

_names = st.sampled_from(["a", "b", "srcIP", "len", "x1"])
_leaves = st.one_of(
    st.builds(lambda n: Column(name=n), _names),
    st.builds(lambda n, t: Column(name=n, table=t), _names, st.sampled_from(["s", "t"])),
    st.builds(lambda v: Literal(value=v, kind="int"), st.integers(0, 2**70)),
    st.builds(lambda v: Literal(value=v, kind="float"),
              st.floats(0, 1e30, allow_nan=False, allow_infinity=False)),
    # a GSQL string cannot hold a line break (the lexer ends it there)
    st.builds(lambda v: Literal(value=v, kind="string"),
              st.text(st.characters(blacklist_characters="\n"), max_size=5)),
    st.builds(lambda v: Literal(value=v, kind="bool"), st.booleans()),
    st.builds(lambda v: Literal(value=v, kind="ip"), st.integers(0, 2**32 - 1)),
    st.builds(lambda v: Literal(value=v, kind="ipv6"), st.integers(0, 2**128 - 1)),
)
_BINOPS = ["+", "-", "*", "/", "%", "&", "|", "^", "<<", ">>", "=", "<>", "<", ">", "<=", ">=",
           "AND", "OR"]
_trees = st.recursive(
    _leaves,
    lambda sub: st.one_of(
        st.builds(lambda op, l, r: Binary(op=op, left=l, right=r), st.sampled_from(_BINOPS),
                  sub, sub),
        st.builds(lambda op, e: Unary(op=op, this=e), st.sampled_from(["-", "~", "NOT"]), sub),
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_trees)
def test_random_expression_trees_round_trip(tree):
    text = to_gsql(tree)
    back = parse(f"SELECT {text} FROM IP").queries[0].statement.items[0].this
    assert back == tree, text


# --- an independent oracle for precedence: Python evaluates the same integer text ----------

_PY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "&": operator.and_,
       "|": operator.or_, "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift}


def _eval(node):
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Unary):
        v = _eval(node.this)
        return -v if node.op == "-" else ~v
    return _PY[node.op](_eval(node.left), _eval(node.right))


_int_text = st.recursive(
    st.integers(0, 9).map(str),
    lambda sub: st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-", "*", "&", "|", "^"]), sub).map(" ".join),
        st.tuples(sub, st.sampled_from(["<<", ">>"]), st.integers(0, 3).map(str)).map(" ".join),
        sub.map(lambda s: f"({s})"),
        sub.map(lambda s: f"-{s}" if not s.startswith("-") else f"-({s})"),
        sub.map(lambda s: f"~{s}"),
    ),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(_int_text)
def test_arithmetic_precedence_matches_python(text):
    try:
        expected = eval(text)  # noqa: S307  (digits and operators only)
    except ValueError:           # negative shift count: not an interesting case
        return
    tree = parse(f"SELECT {text} FROM IP").queries[0].statement.items[0].this
    assert _eval(tree) == expected, text
