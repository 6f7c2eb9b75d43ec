"""The query-language reference (docs/gsql.md) stays true: its examples parse and its tables match the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capture.schema import PROTOCOLS, protocol_fields
from queries.parser import parse
from queries.tokens import RESERVED

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "gsql.md"
LIBRARY = REPO / "queries" / "library"


def doc_text() -> str:
    if not DOC.exists():
        pytest.fail(f"{DOC} is missing")
    return DOC.read_text()


def test_every_sql_example_parses():
    blocks = re.findall(r"```sql\n(.*?)```", doc_text(), flags=re.DOTALL)
    assert len(blocks) >= 5
    for block in blocks:
        text = block if re.search(r"\b(SELECT|MERGE)\b", block) else block + "\nSELECT len FROM IP"
        assert parse(text).queries


def test_every_schema_field_and_protocol_is_documented():
    text = doc_text()
    for name in PROTOCOLS:
        assert f"`{name}`" in text
        for field in protocol_fields(name):
            assert re.search(rf"`{field}`", text), field


def test_reserved_words_are_listed():
    text = doc_text()
    found = re.search(r"These words are reserved.*?:\n(.*?)\. Window", text, flags=re.DOTALL)
    assert found, "the reserved-word list is missing"
    assert set(re.sub(r"[`\n]", " ", found.group(1)).split()) == set(RESERVED)


def test_every_shipped_query_is_listed():
    text = doc_text()
    shipped = sorted(p.name for p in LIBRARY.glob("*.gsql"))
    assert shipped
    for name in shipped:
        assert f"| `{name}` |" in text, f"{name} is missing from the shipped queries table"
