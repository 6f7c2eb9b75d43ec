"""Thousands of random edits of the shipped queries: parse + analyse + plan raise only QueryError, located
inside the file; what still plans also runs on the reference evaluator without crashing."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from queries.errors import QueryError
from queries.explain import mentioned_links
from queries.parser import parse
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch

LIBRARY = Path(__file__).resolve().parents[2] / "queries" / "library"
TOKEN = re.compile(r"\$?\w+|'[^']*'|<>|!=|<=|>=|<<|>>|[^\w\s]")
KEYWORDS = ["SELECT", "FROM", "WHERE", "GROUP", "BY", "HAVING", "AS", "AND", "OR", "NOT", "IN",
            "DEFINE", "PARAM", "MERGE", "INNER_JOIN", "OUTER_JOIN", "UNION", "RANGE", "SLIDE",
            "count", "SUM", "AVG", "MAX", "time", "srcIP", "len", "IPV4", "TCP", "main", "tb",
            "prefix", "ip_str", "if_else", "UINT", "IP_VAL", "query_name", "flush", "oop_slow"]
GARBAGE = ["(", ")", ",", ";", "[", "]", "{", "}", ".", "*", "/", "0", "-1", "99999999999999999999",
           "'x'", "$p", "@", "#", "\\", "'unterminated", "--", "1.5e3", "0x", "IPV6_VAL '::1'",
           "time/0", "[RANGE 0 seconds]", "AS", "\n", "\t"]


def mutate(text: str, rng: random.Random) -> str:
    spans = [m.span() for m in TOKEN.finditer(text)]
    for _ in range(rng.randint(1, 3)):
        if not spans:
            break
        a, b = spans[rng.randrange(len(spans))]
        op = rng.randrange(6)
        if op == 0:                      # delete a token
            text = text[:a] + text[b:]
        elif op == 1:                    # replace it by a keyword or name
            text = text[:a] + rng.choice(KEYWORDS) + text[b:]
        elif op == 2:                    # insert garbage
            text = text[:a] + rng.choice(GARBAGE) + " " + text[a:]
        elif op == 3:                    # duplicate it
            text = text[:b] + " " + text[a:b] + text[b:]
        elif op == 4:                    # swap with the next token
            nxt = [s for s in spans if s[0] >= b]
            if nxt:
                c, d = nxt[0]
                text = text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
        else:                            # cut the file short
            text = text[:a]
        spans = [m.span() for m in TOKEN.finditer(text)]
    return text


def check_error(err: QueryError, text: str) -> None:
    lines = text.splitlines() or [""]
    for e in err.all:
        assert e.line is not None and e.column is not None, str(e)
        assert 1 <= e.line <= len(lines) + 1, str(e)
        width = len(lines[e.line - 1]) if e.line <= len(lines) else 0
        assert 1 <= e.column <= width + 1, str(e)
        assert e.message


SOURCES = sorted(LIBRARY.glob("*.gsql"))
BATCH = random_batch(300, seed=3)


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_random_edits_raise_only_located_query_errors(path):
    original = path.read_text()
    rng = random.Random(path.stem)
    planned = 0
    for _ in range(400):
        text = mutate(original, rng)
        try:
            tree = parse(text, path=path.name)
            links = mentioned_links(tree) or ["main"]
            fp = plan_file(tree, links, source=text)
        except QueryError as err:
            check_error(err, text)
            continue
        planned += 1
        try:
            evaluate_file(fp, {link: BATCH for link in links})
        except QueryError as err:
            check_error(err, text)
    # the edits are not all fatal: some still plan and run
    assert planned > 0


def test_explain_on_broken_files_exits_1_without_traceback(tmp_path):
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    rng = random.Random(42)
    broken = []
    for path in SOURCES:
        while True:
            text = mutate(path.read_text(), rng)
            try:
                tree = parse(text, path=path.name)
                plan_file(tree, mentioned_links(tree) or ["main"], source=text)
            except QueryError:
                broken.append((path.name, text))
                break
        if len(broken) == 3:
            break
    for name, text in broken:
        f = tmp_path / name
        f.write_text(text)
        proc = subprocess.run([sys.executable, "-m", "tools.cli", "explain", str(f)], cwd=repo,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stdout
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("oopscope: error: ")
        assert re.search(rf"{re.escape(name)}:\d+:\d+: ", proc.stderr), proc.stderr
