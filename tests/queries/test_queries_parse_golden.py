"""Golden parse fixtures: each `golden/parse/<group>.gsql` parses to the outline in `<group>.tree`.

Regenerate the expected outlines after an intended change with
`OOPSCOPE_REGEN_GOLDEN=1 python -m pytest tests/queries/test_queries_parse_golden.py`
and review the diff before committing it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from queries.parser import parse
from queries.printer import dump_tree, to_gsql

GOLDEN = Path(__file__).parent / "golden" / "parse"
REGEN = os.environ.get("OOPSCOPE_REGEN_GOLDEN") == "1"
CASES = sorted(GOLDEN.glob("*.gsql"))


def test_every_construct_group_has_a_fixture():
    names = {p.stem for p in CASES}
    assert {"select_basic", "expressions", "literals", "aggregates", "windows", "sources",
            "joins", "define_param", "multi_query"} <= names


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden_parse(case: Path):
    tree = parse(case.read_text(), path=case.name)
    got = dump_tree(tree)
    expected_file = case.with_suffix(".tree")
    if REGEN:
        expected_file.write_text(got)
    assert expected_file.exists(), f"missing {expected_file.name}: run with OOPSCOPE_REGEN_GOLDEN=1"
    assert got == expected_file.read_text()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden_fixture_round_trips(case: Path):
    tree = parse(case.read_text(), path=case.name)
    assert parse(to_gsql(tree), path=case.name) == tree
