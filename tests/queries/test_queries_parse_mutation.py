"""Parse-level mutation test: thousands of random edits of the shipped queries never crash the parser.

Every edited text either parses or raises QueryError whose every sub-error has a line and a
column inside the text; nothing else is raised and nothing hangs.
"""

from __future__ import annotations

import random
import signal
from importlib import resources

import pytest

from queries.errors import QueryError
from queries.parser import parse
from queries.tokens import Kind, tokenize

EDITS = 3000
GARBAGE = list("()[]{};,.:$'\"!@#%^&*-+/\\<>=~|`?\t") + [
    "--", "//", "0x", "1e", "1.", "''", "SELECT", "FROM", "WHERE", "GROUP BY", "HAVING", "UNION",
    " AS ", "[RANGE", "IP_VAL", "\n", "NOT", " IN ", "é", "\x00", "\r\n", "$", "[", "COUNT(*)"]
WORDS = ["SELECT", "FROM", "WHERE", "GROUP", "BY", "HAVING", "AS", "AND", "OR", "NOT", "IN",
         "UNION", "DEFINE", "PARAM", "MERGE", "INNER_JOIN", "RANGE", "SLIDE", "WA", "ROWS", "ALL",
         "PARTITION", "COUNT", "IP_VAL", "IPV6_VAL", "DISTINCT", "TRUE", ";", "(", ")", "[", "]",
         "{", "}", ",", ".", ":", "*", "IPV4", "minutes"]


def library_texts() -> list[str]:
    lib = resources.files("queries.library")
    return [p.read_text() for p in sorted(lib.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".gsql")]


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    return starts


def mutate(text: str, rng: random.Random) -> str:
    tokens = [t for t in tokenize(text) if t.kind is not Kind.EOF]
    starts = _offsets(text)

    def span(t):
        o = starts[t.line - 1] + t.col - 1
        return o, o + t.length

    kind = rng.randrange(5)
    if kind == 0 and tokens:                                  # delete a token
        a, b = span(rng.choice(tokens))
        return text[:a] + text[b:]
    if kind == 1 and tokens:                                  # replace a token by a keyword
        a, b = span(rng.choice(tokens))
        return text[:a] + rng.choice(WORDS) + text[b:]
    if kind == 2:                                             # insert garbage
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(GARBAGE) + text[at:]
    if kind == 3:                                             # truncate
        return text[:rng.randrange(len(text) + 1)]
    if len(tokens) < 2:
        return text
    x, y = sorted(rng.sample(tokens, 2), key=span)            # swap two tokens
    (a0, a1), (b0, b1) = span(x), span(y)
    return text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]


@pytest.fixture
def watchdog():
    """Turn a hang (an endless parser loop) into a failure instead of a stuck CI job."""
    def on_alarm(signum, frame):
        raise AssertionError("the parser did not finish within 120 s: an endless loop?")
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_random_edits_raise_only_located_query_errors(watchdog):
    rng = random.Random(20261122)
    texts = library_texts()
    failures = 0
    for _ in range(EDITS):
        text = rng.choice(texts)
        for _ in range(rng.randrange(1, 4)):
            text = mutate(text, rng)
        try:
            parse(text, path="mutant.gsql")
        except QueryError as e:
            failures += 1
            lines = text.split("\n")
            rendered = str(e)
            assert rendered.startswith(("mutant.gsql:", f"{len(e.all)} errors:"))
            for sub in e.all:
                assert sub.line is not None and 1 <= sub.line <= len(lines), (sub, text)
                assert sub.column is not None
                assert 1 <= sub.column <= len(lines[sub.line - 1].rstrip("\r")) + 1, (sub, text)
                assert f"mutant.gsql:{sub.line}:{sub.column}: " in rendered
    # the edits do break most texts (the test exercises the error paths, not just parses)
    assert failures > EDITS // 2
