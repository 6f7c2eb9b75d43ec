"""The query-language reference stays true: its examples parse and its tables match the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from capture.schema import PROTOCOLS, protocol_fields
from queries.parser import parse
from queries.tokens import RESERVED

DOC = Path(__file__).resolve().parents[2] / "README.md"


def doc_text() -> str:
    if not DOC.exists():
        pytest.fail(f"{DOC} is missing")
    return DOC.read_text()


def test_every_sql_example_parses():
    blocks = re.findall(r"```sql\n(.*?)```", doc_text(), flags=re.S)
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
    listed = re.search(r"These words are reserved.*?:\n(.*?)\. Window", text, flags=re.S).group(1)
    assert set(re.sub(r"[`\n]", " ", listed).split()) == set(RESERVED)
