"""Fuzzing the query front end (issue 25, the query half): hostile edits of the shipped queries
through the parser and the planner, as `oopscope explain` runs them.

A bounded run (a fixed seed, a few seconds): every edited file either plans, and then its plan
prints and runs on the reference evaluator, or raises the one QueryError of the project's
hierarchy whose every message has a line and a column inside the file. Nothing else is raised
and no case hangs (an alarm turns a hang into a failure). Besides the token edits of
`test_queries_mutation.py`, the edits here aim at what used to pass `explain` and crash `run`:
literals at and beyond the 64-bit edges, constant divisors of 0, shift counts, DEFINE values,
window lengths and parameter defaults of 2^80, long AND/OR/+ chains, deep nesting, very long
names and temporal group items in every form.
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import pytest

from queries.errors import QueryError
from queries.explain import format_plan, mentioned_links
from queries.parser import parse
from queries.planner import plan_file
from tests.oracles.reference import evaluate_file
from tests.oracles.samples import random_batch
from tests.queries.test_queries_mutation import check_error, mutate

LIBRARY = Path(__file__).resolve().parents[2] / "queries" / "library"
SEED = 25
CASES = 400
#: wall-clock budget of the whole run; the cases stop early when it is spent
BUDGET_S = 6.0
#: one case that takes this long is a hang
CASE_LIMIT_S = 30

NUMBERS = ["0", "1", "63", "64", "4294967296", "9223372036854775807", "9223372036854775808",
           "18446744073709551615", "18446744073709551616", "1208925819614629174706176",
           "-9223372036854775808", "-9223372036854775809", "0x" + "f" * 20, "1e308", "1e400",
           "0.0", "3 - 3", "(1 - 1)", "$p"]
OPERATORS = [" / 0", " % 0", " / (2 - 2)", " % (1 * 0)", " << 64", " >> 4294967296", " << 63",
             " / 18446744073709551615", " * 18446744073709551615", " - 60", " + 60", " % 60"]
TIME_FORMS = ["time - 60", "time % 60", "time / 0", "time / -60", "time / 60.0", "time * 0",
              "time / 18446744073709551615", "timestamp * 4", "time - 9223372036854775808",
              "time + 18446744073709551615", "(time + 30) / 60 * 60 - 5", "60 - time",
              "time / $p", "timestamp_ms / 1000 - 1", "time >> 6"]
DEFINES = ["aggregate_slots", "slow_flush", "max_lfta_disorder", "idle_timeout", "query_name"]


def _chain(op: str, n: int, term: str) -> str:
    return "(" + f" {op} ".join([term] * n) + ")"


def hostile(text: str, rng: random.Random) -> str:
    """One edit aimed at the limits of the planner."""
    kind = rng.randrange(9)
    numbers = list(re.finditer(r"(?<![\w$.])\d+(?![\w.])", text))
    names = list(re.finditer(r"\b(?!SELECT|FROM|WHERE|GROUP|BY|HAVING|AS|DEFINE|PARAM)"
                             r"[A-Za-z_]\w*\b", text))
    if kind == 0 and numbers:                     # a number at or beyond an edge
        m = rng.choice(numbers)
        return text[:m.start()] + rng.choice(NUMBERS) + text[m.end():]
    if kind == 1 and names:                       # an operator with a constant operand
        m = rng.choice(names)
        return text[:m.end()] + rng.choice(OPERATORS) + text[m.end():]
    if kind == 2:                                 # the window in another form
        found = list(re.finditer(r"time\s*/\s*\d+", text))
        if found:
            m = rng.choice(found)
            return text[:m.start()] + rng.choice(TIME_FORMS) + text[m.end():]
    if kind == 3:                                 # a DEFINE value of 2^80 (or a huge name)
        key = rng.choice(DEFINES)
        value = "q" * rng.choice([64, 65, 300, 10_000]) if key == "query_name" else \
            rng.choice(["1208925819614629174706176", "99999999999999999999s", "1e300"])
        head = f"DEFINE {{ {key} {value}; }}\n"
        return head + text if "DEFINE" not in text else text.replace("DEFINE {", head[:-3], 1)
    if kind == 4:                                 # a long chain in WHERE or HAVING
        op, term = rng.choice([("OR", "len = 7"), ("AND", "len > 1"), ("+", "len"),
                               ("*", "2"), ("-", "1"), ("|", "ttl")])
        n = rng.choice([2, 50, 99, 101, 1000])
        cond = _chain(op, n, term) + ("" if op in ("OR", "AND") else " > 0")
        for clause in ("WHERE ", "HAVING "):
            if clause in text:
                return text.replace(clause, f"{clause}{cond} AND ", 1)
        return text.replace("GROUP BY", f"WHERE {cond} GROUP BY", 1)
    if kind == 5:                                 # deep nesting
        depth = rng.choice([30, 63, 64, 65, 200])
        opener = rng.choice(["(", "-", "NOT ", "uint(", "~"])
        closer = ")" if opener.endswith("(") else ""
        inner = opener * depth + "1" + closer * depth
        return re.sub(r"\bSELECT\b", f"SELECT {inner} AS deep,", text, count=1)
    if kind == 6 and names:                       # a very long name
        m = rng.choice(names)
        return text[:m.start()] + "n" * rng.choice([64, 65, 4096]) + text[m.end():]
    if kind == 7:                                 # a window spec at the edges
        spec = rng.choice(["[RANGE 18446744073709551616 seconds]", "[ROWS 1208925819614629174706176]",
                           "[RANGE 1e300 hours]", "[ROWS 0]", "[RANGE 146 hours, SLIDE 0 ms]",
                           "[RANGE 0.0000000001 seconds]"])
        return re.sub(r"(?i)count\(\*\)", f"COUNT(*) {spec}", text, count=1)
    if kind == 8:                                 # a parameter default at the edges
        value = rng.choice(NUMBERS[:14])
        return f"PARAM {{ p {rng.choice(['uint', 'ullong', 'llong', 'int', 'float'])} = " \
               f"{value}; }}\n" + text if "PARAM" not in text else text
    return mutate(text, rng)


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


@pytest.fixture
def alarm():
    previous = signal.signal(signal.SIGALRM, _alarm)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_hostile_edits_plan_or_fail_with_one_located_query_error(alarm):
    rng = random.Random(SEED)
    sources = sorted(LIBRARY.glob("*.gsql"))
    texts = {p.name: p.read_text() for p in sources}
    batch = random_batch(200, seed=SEED)
    start = time.monotonic()
    seen = {"planned": 0, "refused": 0}
    messages: set[str] = set()
    cases = 0
    while cases < CASES and time.monotonic() - start < BUDGET_S:
        cases += 1
        name = rng.choice(sorted(texts))
        text = texts[name]
        for _ in range(rng.randint(1, 2)):
            text = hostile(text, rng) if rng.random() < 0.8 else mutate(text, rng)
        signal.alarm(CASE_LIMIT_S)
        try:
            tree = parse(text, path=name)
            links = mentioned_links(tree) or ["main"]
            plan = plan_file(tree, links, source=text)
            format_plan(plan)
            evaluate_file(plan, {link: batch for link in links})
        except QueryError as err:
            check_error(err, text)
            assert str(err).startswith((f"{name}:", f"{len(err.all)} errors:")), str(err)
            seen["refused"] += 1
            messages.update(e.message for e in err.all)
        except Hang:
            pytest.fail(f"no answer within {CASE_LIMIT_S} s for:\n{text}")
        except Exception as exc:   # anything else is the bug this test looks for
            pytest.fail(f"{type(exc).__name__}: {exc}\nfor the query file:\n{text}")
        else:
            seen["planned"] += 1
        finally:
            signal.alarm(0)
    assert cases >= 50, f"only {cases} cases in {BUDGET_S} s"
    # the edits reach both outcomes, and the refusals this test is about
    assert seen["planned"] > 0 and seen["refused"] > 0, seen
    hits = " | ".join(sorted(messages))
    for wanted in ("does not fit in 64 bits", "division by zero", "too long"):
        assert wanted in hits, hits
