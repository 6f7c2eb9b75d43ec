"""The shipped query library (queries/library/*.gsql) parses, round-trips and documents itself."""

from __future__ import annotations

from importlib import resources

import pytest

from queries.expressions import Aggregate, Select, Source
from queries.parser import parse, parse_file
from queries.printer import to_gsql

LIBRARY = resources.files("queries.library")
FILES = sorted(p.name for p in LIBRARY.iterdir() if p.name.endswith(".gsql"))
REQUIRED = {"netflow.gsql", "top_talkers.gsql", "q8_1.gsql", "q8_2.gsql", "syn_flood.gsql",
            "port_scan.gsql", "dns_volume.gsql", "sliding_count.gsql"}


def load(name: str):
    with resources.as_file(LIBRARY / name) as path:
        return parse_file(path), path.read_text(), str(path)


def test_required_queries_are_shipped():
    assert REQUIRED <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_shipped_query_parses_round_trips_and_is_documented(name):
    tree, text, path = load(name)
    assert tree.queries
    assert parse(to_gsql(tree), path=path) == tree
    # documented at the top: a comment naming the file, then a "Run:" line
    first = text.lstrip().splitlines()[0]
    assert first.startswith("-- " + name)
    assert "Run:" in text and "Columns" in text
    # every query is named explicitly, so --output names do not depend on the file name
    for q in tree.queries:
        assert "query_name" in q.defines and q.name == q.defines["query_name"].value
    # sources read the documented default links only
    for source in (s for q in tree.queries for s in q.find_all(Source)):
        assert source.query is not None or set(source.links or []) <= {"main", "link1", "link2"}


def test_query_names_and_shapes():
    names = {name: [q.name for q in load(name)[0].queries] for name in FILES}
    assert names["netflow.gsql"] == ["netflow"]
    assert names["syn_flood.gsql"] == ["syns", "synacks", "syn_flood"]
    q81 = load("q8_1.gsql")[0].queries[0].statement
    q82 = load("q8_2.gsql")[0].queries[0].statement
    assert isinstance(q81, Select) and q81.sources[0].links == ["main"]
    assert q82.sources[0].links == ["link1", "link2"] and q82.sources[0].union == "list"
    # apart from the source, Q8-2 is Q8-1
    assert q81.replace(sources=[]) == q82.replace(sources=[])
    join = load("syn_flood.gsql")[0].queries[2].statement
    assert join.join == "LEFT_OUTER_JOIN" and [s.query for s in join.sources] == ["syns",
                                                                                 "synacks"]
    sliding = load("sliding_count.gsql")[0].queries[0].statement
    window = next(sliding.find_all(Aggregate)).window
    assert (window.range.ns, window.slide.ns, window.wa) == (300 * 10**9, 60 * 10**9, "time")
    scan = load("port_scan.gsql")[0].queries[0]
    assert {a.name for a in scan.find_all(Aggregate)} == {"COUNT_DISTINCT", "COUNT"}
    assert scan.params == {"min_ports": "uint"} and scan.param_defaults["min_ports"].value == 100
