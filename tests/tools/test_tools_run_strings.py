"""`oopscope run` with strings end to end, over a CSV record link through the real command
line: ordering comparisons of strings, MIN/MAX over strings (low level ranks, Spark combine),
GS-lite's string functions and predicates in WHERE, as group keys and in the SELECT list;
each compared with the reference evaluator and with plain Python over the lines written."""

from __future__ import annotations

import re
from collections import defaultdict

from tests.tools.test_tools_run_records import SCHEMA, read_rows, reference, run

WORDS = ["GET /a", "HTTP/1.1 200", "post", "", "gr\u00fcn", "Host: x.org", "zeta", "alpha",
         "GET /b"]


def lines(n: int = 400) -> list[str]:
    out = []
    for i in range(n):
        w = WORDS[(i * 7 + i // 13) % len(WORDS)]
        out.append(f"{i % 17},{i},10.0.0.{i % 5},::1,{w},TRUE,{i % 3},{i},1.5")
    return out


QUERY = """
DEFINE { query_name strs; }
SELECT uintInPosition1 AS u, MIN(stringInPosition5) AS lo, MAX(stringInPosition5) AS hi,
       COUNT(*) AS n
FROM csv.CSV_EXAMPLE
WHERE stringInPosition5 >= 'HTTP' AND str_exists_substr[stringInPosition5, 'T']
   OR str_regex_match(stringInPosition5, '^[a-z]+$') = 1
GROUP BY systemTime/1000000 AS tb, uintInPosition1;

DEFINE { query_name funcs; }
SELECT str_truncate(stringInPosition5, 3) AS head, COUNT(*) AS n,
       MAX(str_match_offset(0, 'GET', stringInPosition5)) AS gets
FROM csv.CSV_EXAMPLE
WHERE stringInPosition5 < 'zeta'
GROUP BY systemTime/1000000 AS tb, str_truncate(stringInPosition5, 3) AS head
HAVING str_compare(head, 'GET') = 1 OR head > 'g';

DEFINE { query_name spark; }
SELECT word, byte_match_offset(0, 71, word) AS b0,
       byte_match_reverse_offset(1, 97, word) AS blast,
       net_word_match_offset(0, 1195725856, word) AS wnet,
       little_endian_word_match_offset(1, 980710255, word) AS wle,
       str_match_offset(1, 'ET', word) AS m1, str_exists_substr(word, 'o') AS sub,
       str_match_start(word, 'HT') AS st, str_partial_regex_match(word, 'P', 2) AS pre,
       str_extract_regex_null(word, '[a-z]+') AS ext, str_truncate(word, 2) AS tr,
       COUNT(*) AS n
FROM csv.CSV_EXAMPLE
GROUP BY systemTime/1000000 AS tb, stringInPosition5 AS word
HAVING str_regex_match(word, '^[A-Za-z]') = 1
"""


def spark_expected(text: list[str]) -> dict:
    """The `spark` query's rows, computed here: the functions run in Spark on group keys."""
    out: dict = {}
    for line in text:
        w = line.split(",")[4]
        b = w.encode()
        if not re.search(r"^[A-Za-z]", w):
            continue
        m = re.search(r"[a-z]+", w)
        row = (int(b[:1] == b"G"), int(b[-1:] == b"a"), int(b[:4] == b"GET "),
               int(len(b) >= 5 and int.from_bytes(b[1:5], "little") == 980710255),
               int(b[1:3] == b"ET"), int("o" in w), int(w.startswith("HT")),
               int("P" in b[:2].decode("utf-8", "replace")), m.group(0) if m else "",
               b[:2].decode("utf-8", "replace"))
        n = out.get(w, (row, 0))[1] + 1
        out[w] = (row, n)
    return out


def test_strings_end_to_end(tmp_path):
    data = tmp_path / "words.csv"
    text = lines()
    data.write_text("\n".join(text) + "\n")
    query = tmp_path / "q.gsql"
    query.write_text(QUERY)
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--output", f"strs={tmp_path / 's.csv'}", "--output",
               f"funcs={tmp_path / 'f.csv'}", "--output", f"spark={tmp_path / 'k.csv'}"])
    assert res.returncode == 0, res.stderr

    # independent: plain Python over the lines, byte-wise order
    groups: dict = defaultdict(list)
    heads: dict = defaultdict(list)
    for line in text:
        f = line.split(",")
        w, b = f[4], f[4].encode()
        if (b >= b"HTTP" and "T" in w) or re.search(r"^[a-z]+$", w):
            groups[int(f[0])].append(w)
        if b < b"zeta":
            heads[b[:3].decode("utf-8", "replace")].append(w)
    want = {u: (min(ws, key=str.encode), max(ws, key=str.encode), len(ws))
            for u, ws in groups.items()}
    got = {int(r["u"]): (r["lo"], r["hi"], int(r["n"])) for r in read_rows(tmp_path / "s.csv")}
    assert got == want
    ref = {int(r["u"]): (r["lo"], r["hi"], int(r["n"]))
           for r in reference(QUERY.split("DEFINE { query_name funcs")[0], data, "CSV_EXAMPLE")}
    assert ref == want

    want_f = {h: (len(ws), int(any(w.startswith("GET") for w in ws)))
              for h, ws in heads.items() if h == "GET" or h.encode() > b"g"}
    got_f = {r["head"]: (int(r["n"]), int(r["gets"])) for r in read_rows(tmp_path / "f.csv")}
    assert got_f == want_f

    cols = ["b0", "blast", "wnet", "wle", "m1", "sub", "st", "pre", "ext", "tr"]
    got_k = {r["word"]: (tuple(int(r[c]) if c not in ("ext", "tr") else r[c] for c in cols),
                         int(r["n"])) for r in read_rows(tmp_path / "k.csv")}
    assert got_k == spark_expected(text)
