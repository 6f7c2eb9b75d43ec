"""What a wrong query probably meant: keyword typos, SQL words GSQL lacks, column synonyms.

The parser and the analyser ask these functions when they are about to report an error; a
hint, when there is one, is put in the message (`did you mean GROUP BY?`). Nothing here
decides whether a query is right: a hint only ever rewords an error that is raised anyway.
"""

from __future__ import annotations

import difflib
import ipaddress
import re

#: keywords a typo is checked against, with how the hint spells each (GROUP is GROUP BY)
TYPO_KEYWORDS = {
    "SELECT": "SELECT", "FROM": "FROM", "WHERE": "WHERE", "GROUP": "GROUP BY",
    "HAVING": "HAVING", "DEFINE": "DEFINE", "PARAM": "PARAM", "MERGE": "MERGE",
    "UNION": "UNION", "SUPERGROUP": "SUPERGROUP", "CLEANING_WHEN": "CLEANING_WHEN",
    "CLEANING_BY": "CLEANING_BY", "CLOSING_WHEN": "CLOSING_WHEN", "INNER_JOIN": "INNER_JOIN",
    "LEFT_OUTER_JOIN": "LEFT_OUTER_JOIN", "RIGHT_OUTER_JOIN": "RIGHT_OUTER_JOIN",
    "OUTER_JOIN": "OUTER_JOIN", "FILTER_JOIN": "FILTER_JOIN",
}
#: shorter words are too easily one edit away from an ordinary name
_MIN_TYPO_LENGTH = 4

_JOIN = ("GSQL states a join's type before FROM and its condition in WHERE: SELECT ... "
         "INNER_JOIN FROM a, b WHERE a.time = b.time AND a.x = b.x (or LEFT_OUTER_JOIN, "
         "RIGHT_OUTER_JOIN, OUTER_JOIN)")
#: SQL words users try that GSQL does not have -> what to write instead
SQL_ONLY = {
    "ORDER": "GSQL has no ORDER BY: a query's rows come out window by window as the windows "
             "close (in no set order within a window); sort the output instead (e.g. write "
             "--output q=out.csv and sort it, or read it into a tool that sorts)",
    "LIMIT": "GSQL has no LIMIT: a query runs over an unbounded stream; keep fewer rows "
             "with WHERE or HAVING (e.g. HAVING count(*) > 100), or cut the output (head)",
    "OFFSET": "GSQL has no OFFSET: a query runs over an unbounded stream; keep fewer rows "
              "with WHERE or HAVING, or cut the output",
    "TOP": "GSQL has no TOP: keep fewer rows with HAVING (e.g. HAVING sum(len) > 1000000) "
           "and sort the output",
    "JOIN": _JOIN, "ON": _JOIN, "INNER": _JOIN, "LEFT": _JOIN, "RIGHT": _JOIN, "FULL": _JOIN,
    "CROSS": _JOIN, "OUTER": _JOIN, "USING": _JOIN,
    "WITH": "GSQL has no WITH: name a query (DEFINE { query_name q; }) and read it from "
            "another query of the file (FROM q)",
    "LIKE": "GSQL has no LIKE: match with str_regex_match(s, 're') or str_match_start(s, "
            "'prefix')",
    "BETWEEN": "GSQL has no BETWEEN: write x >= lo AND x <= hi",
    "IS": "GSQL has no IS [NOT] NULL: its values are never null",
    "CASE": "GSQL has no CASE: write if_else(condition, a, b)",
    "DISTINCT": "GSQL has no SELECT DISTINCT: group by the columns instead (SELECT tb, a "
                "FROM ... GROUP BY time/60 AS tb, a); COUNT(DISTINCT x) counts distinct "
                "values",
}

#: words of column names and what a schema may call them instead (addr -> IP ...)
_SYNONYMS: dict[str, tuple[str, ...]] = {
    "addr": ("ip",), "address": ("ip",), "ipaddr": ("ip",), "host": ("ip",),
    "source": ("src",), "sender": ("src",), "src": ("source",),
    "dest": ("dst",), "destination": ("dest", "dst"), "dst": ("dest",), "target": ("dest",),
    "proto": ("protocol",), "protocol": ("proto",), "length": ("len",), "size": ("len",),
    "bytes": ("len",), "ts": ("time",), "timestamp": ("time",), "sport": ("srcport",),
    "dport": ("destport",), "flag": ("flags",), "window": ("win",), "ipver": ("ipversion",),
}
#: how many respellings of a name are tried at most (each word multiplies them)
_MAX_SPELLINGS = 256


def distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from `a` to `b`."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def keyword_typo(word: str) -> str | None:
    """The keyword `word` is probably a typo of (as a hint spells it: GROUP BY), or None."""
    upper = word.upper()
    if len(upper) < _MIN_TYPO_LENGTH or upper in TYPO_KEYWORDS:
        return None
    best = None
    for kw, shown in TYPO_KEYWORDS.items():
        d = distance(upper, kw)
        if d <= (1 if len(kw) <= 5 else 2) and (best is None or d < best[0]):
            best = (d, shown)
    return None if best is None else best[1]


def sql_only(word: str) -> str | None:
    """What to write instead of an SQL word GSQL lacks (ORDER, LIMIT, JOIN ...), or None."""
    return SQL_ONLY.get(word.upper())


def _words(name: str) -> list[str]:
    """`srcAddr` -> ['src', 'addr']; `dest_port` -> ['dest', 'port']."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+",
                                          name.replace("_", " "))]


def _respelled(name: str) -> list[str]:
    """`name` with its words in each of their spellings, lower case and joined (srcAddr ->
    srcaddr, srcip, sourceaddr, sourceip)."""
    spellings = [""]
    for w in _words(name):
        spellings = [s + alt for s in spellings for alt in (w, *_SYNONYMS.get(w, ()))]
        spellings = spellings[:_MAX_SPELLINGS]
    return spellings


def likely_column(name: str, known: list[str]) -> str | None:
    """The known column `name` most likely stands for: the same name in another spelling
    (srcAddr -> srcIP, dest_port -> destPort, source_ip -> srcIP), else the closest name
    sharing its first word, else the closest name."""
    flat = {k.lower().replace("_", ""): k for k in known}
    for spelling in _respelled(name):
        if spelling in flat:
            return flat[spelling]
    first = (_words(name) or [""])[0]
    starts = {first, *_SYNONYMS.get(first, ())}
    same_start = [k for k in known if _words(k) and _words(k)[0] in starts]
    for pool in (same_start, known):
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in pool], n=1,
                                          cutoff=0.5 if pool is same_start else 0.6)
        if close:
            return next(k for k in pool if k.lower() == close[0])
    return None


def closest(name: str, candidates) -> str | None:
    """The candidate `name` most likely misspells (case aside): the nearest within one edit
    (two for names of six letters or more), else difflib's closest above 0.75; None."""
    pool = {str(c).lower(): str(c) for c in candidates}
    low = name.lower()
    if not pool or low in pool:
        return None
    allowed = 1 if len(low) < 6 else 2
    best = min(pool, key=lambda c: (distance(low, c), c))
    if distance(low, best) <= allowed:
        return pool[best]
    close = difflib.get_close_matches(low, list(pool), n=1, cutoff=0.75)
    return pool[close[0]] if close else None


def did_you_mean(name: str, candidates, spell=str) -> str:
    """`; did you mean X?` for the candidate `name` most likely misspells (`spell` shows
    it), else an empty string."""
    hit = closest(name, candidates)
    return "" if hit is None else f"; did you mean {spell(hit)}?"


#: IP protocol names a query may compare `protocol` with, as their numbers
_IP_PROTOCOLS = {"icmp": 1, "tcp": 6, "udp": 17, "icmpv6": 58, "gre": 47, "esp": 50,
                 "sctp": 132}


def operand_hint(left_type: str, right, column_name: str | None) -> str:
    """What a comparison of a `left_type` value with the string literal `right` meant:
    an address written as IP_VAL, a number without quotes, a protocol by its number."""
    text = str(right)
    if left_type in ("ipv4", "ip"):
        try:
            ipaddress.ip_address(text)
        except ValueError:
            return ""
        word = "IP_VAL" if ":" not in text else "IPV6_VAL"
        return f": write the address as {word} '{text}'"
    if (column_name or "").lower() == "protocol" and text.lower() in _IP_PROTOCOLS:
        return f": protocol is the IP protocol number ({text} is {_IP_PROTOCOLS[text.lower()]})"
    if text.strip().lstrip("+-").isdigit():
        return f": write the number without quotes ({text.strip()})"
    return ""


def clock_example(sources) -> str:
    """`GROUP BY time/60 AS tb` spelled with the sources' own clock (analysed sources,
    `queries.analysed.SourceInfo`): a record protocol's clock field (`ts/60`), a query's
    temporal column, else the packets' `time`."""
    from queries.types import duration_text

    for s in sources:
        clock = s.record.clock if s.record is not None else None
        timed = [c for c in s.columns.values() if c.form is not None]
        column = s.columns.get(clock) if clock is not None else (timed[0] if timed else None)
        if column is None:
            continue
        name = column.name if len(sources) == 1 else f"{s.alias}.{column.name}"
        example = f"GROUP BY {name}/60 AS tb"
        if column.form is not None and column.form.scale == 1 and not column.form.shift:
            example += f" for windows of {duration_text(column.form.pane_ns * 60)}"
        return example
    return "GROUP BY time/60 AS tb"
