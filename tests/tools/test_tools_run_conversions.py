"""`oopscope run` with GS-lite's conversion functions (strtoi, strtoip, strtoi_c, strtoip_c,
get_int, get_bool, get_suffix, strid) and str_file_regex_match end to end, over a CSV record
link through the real command line: in a selection's SELECT and WHERE and in group keys and
aggregate arguments (the low level), in an aggregation's SELECT and HAVING over a string key
(Spark); the command runs in this process (`run_here`). Each is compared with the reference evaluator and with plain Python over the lines
written (`tests.queries.test_queries_conversion_functions`), and a few rows by hand."""

from __future__ import annotations

import ipaddress
import sys
from collections import Counter, defaultdict

from tests.queries.test_queries_conversion_functions import (
    py_get_int,
    py_get_suffix,
    py_strid,
    py_strtoi,
    py_strtoip,
)
from tests.tools.resuming import run_here
from tests.tools.test_tools_run_records import SCHEMA, read_rows, reference, run

#: strings of the records: addresses, numbers in text, none, wrapping, short, non-ASCII
WORDS = ["10.0.0.1", "ip=192.168.1.7/24", "port 8080", "GET /index.html", "abc", "",
         "300.1.1.1", "4294967297", "a1b2c3d4", "gr\u00fcn 7", "1.2.4.256", "x",
         "Host: x.org", "99999999999999999999999999999999999999999", "1.2.3", "abc def",
         "@x.org"]
REGEX = "^(GET|POST) |Host: "


def lines(n: int = 300) -> list[str]:
    return [f"{i % 7},{i},10.0.0.{i % 5},::1,{WORDS[(i * 5 + i // 11) % len(WORDS)]},TRUE,"
            f"{i % 3},{i},1.5" for i in range(n)]


def dotted(v: int) -> str:
    return str(ipaddress.IPv4Address(int(v) & 0xFFFF_FFFF))


def text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def queries(regex_file: str) -> str:
    return f"""
DEFINE {{ query_name sel; }}
SELECT uintInPosition1 AS u, llongInPosition8 AS k, strtoi(stringInPosition5) AS i,
       strtoip(stringInPosition5) AS ip, get_int(stringInPosition5, 2) AS gi,
       get_bool(stringInPosition5, 1) AS gb, get_suffix(stringInPosition5, 3) AS suf,
       strid(stringInPosition5) AS id, strtoi_c('port 42') AS c,
       strtoip_c('10.1.2.3') AS cip,
       str_file_regex_match(stringInPosition5, '{regex_file}', 60, 0) AS fm
FROM csv.CSV_EXAMPLE
WHERE strtoi(stringInPosition5) > 7 OR strtoip(stringInPosition5) = IP_VAL'10.0.0.1'
   OR str_file_regex_match(stringInPosition5, '{regex_file}', 60, 0) = 1
   OR get_int(stringInPosition5, 1) = strid('abc ') OR get_suffix(stringInPosition5, 2) = 'x.org';

DEFINE {{ query_name agg; }}
SELECT s, strtoi(s) AS i, strtoip(s) AS ip, get_int(s, 2) AS gi, get_bool(s, 1) AS gb,
       get_suffix(s, 3) AS suf, strid(s) AS id, strtoip_c('1.2.3.4') AS cip,
       str_file_regex_match(s, '{regex_file}', 1, 1) AS fm, COUNT(*) AS n,
       SUM(strtoi(stringInPosition5)) AS total, MAX(get_int(stringInPosition5, 1)) AS top
FROM csv.CSV_EXAMPLE
GROUP BY systemTime/1000000 AS tb, stringInPosition5 AS s
HAVING get_bool(s, 1) = TRUE OR strtoi(s) = 0;

DEFINE {{ query_name keys; }}
SELECT addr, tail, COUNT(*) AS n, SUM(strid(stringInPosition5)) AS ids
FROM csv.CSV_EXAMPLE
WHERE strtoi(stringInPosition5) >= 0
GROUP BY systemTime/1000000 AS tb, strtoip(stringInPosition5) AS addr,
         get_suffix(stringInPosition5, 2) AS tail
"""


def py_row(w: str, regex_hit) -> dict:
    b = w.encode()
    return {"i": py_strtoi(b), "ip": py_strtoip(b), "gi": py_get_int(b, 2),
            "gb": py_get_int(b, 1) != 0, "suf": text(py_get_suffix(b, 3)), "id": py_strid(b),
            "fm": int(bool(b) and regex_hit(w))}


def test_conversions_end_to_end(tmp_path):
    import re

    data = tmp_path / "words.csv"
    written = lines()
    data.write_text("\n".join(written) + "\n")
    regex_file = tmp_path / "requests.re"
    regex_file.write_text(REGEX + "\n")
    text_q = queries(str(regex_file))
    query = tmp_path / "q.gsql"
    query.write_text(text_q)
    res = run([str(query), "--schema", str(SCHEMA), "--link", f"csv={data}",
               "--output", f"sel={tmp_path / 'sel.csv'}", "--output",
               f"agg={tmp_path / 'agg.csv'}", "--output", f"keys={tmp_path / 'keys.csv'}"])
    assert res.returncode == 0, res.stderr

    def hit(w: str) -> bool:
        return re.search(REGEX, w, flags=re.M) is not None

    records = [(int(f[0]), int(f[7]), f[4]) for f in (line.split(",") for line in written)]
    parts = ["DEFINE {" + q for q in text_q.split("DEFINE {")[1:]]
    ref = {name: reference(q, data, "CSV_EXAMPLE") for name, q in zip(("sel", "agg", "keys"),
                                                                        parts)}

    # the selection: low level, SELECT and WHERE
    def sel_expected(u: int, k: int, w: str) -> dict | None:
        b = w.encode()
        row = py_row(w, hit)
        keep = row["i"] > 7 or row["ip"] == 0x0A000001 or row["fm"] == 1 or \
            py_get_int(b, 1) == int.from_bytes(b"abc ", "big") or b[1:] == b"x.org"
        return {"u": u, "k": k, **row, "c": 42, "cip": 0x0A010203} if keep else None

    want = [r for r in (sel_expected(u, k, w) for u, k, w in records) if r is not None]
    got = [{"u": int(r["u"]), "k": int(r["k"]), "i": int(r["i"]),
            "ip": int(ipaddress.IPv4Address(r["ip"])), "gi": int(r["gi"]),
            "gb": r["gb"].lower() == "true", "suf": r["suf"], "id": int(r["id"]),
            "c": int(r["c"]), "cip": int(ipaddress.IPv4Address(r["cip"])), "fm": int(r["fm"])}
           for r in read_rows(tmp_path / "sel.csv")]
    assert sorted(got, key=lambda r: r["k"]) == want
    from_ref = [{"u": int(r["u"]), "k": int(r["k"]), "i": int(r["i"]), "ip": int(r["ip"]),
                 "gi": int(r["gi"]), "gb": bool(r["gb"]), "suf": r["suf"], "id": int(r["id"]),
                 "c": int(r["c"]), "cip": int(r["cip"]), "fm": int(r["fm"])}
                for r in ref["sel"]]
    assert sorted(from_ref, key=lambda r: r["k"]) == want
    words = {k: w for _, k, w in records}
    by_word = {words[r["k"]]: r for r in got}
    # a few rows by hand
    assert {k: by_word["10.0.0.1"][k] for k in ("i", "ip", "gi", "gb", "suf", "id", "fm")} == \
        {"i": 10, "ip": 0x0A000001, "gi": int.from_bytes(b"0.0.", "big"), "gb": True,
         "suf": ".0.0.1", "id": int.from_bytes(b"10.0", "big"), "fm": 0}
    assert by_word["GET /index.html"]["fm"] == 1 and by_word["port 8080"]["i"] == 8080
    assert by_word["abc def"]["i"] == 0 and by_word["@x.org"]["suf"] == ".org"
    assert "abc" not in by_word and "" not in by_word and "x" not in by_word

    # the aggregation: Spark computes SELECT and HAVING over the key, the low level the sums
    groups: dict = defaultdict(list)
    for _, _, w in records:
        groups[w].append(w.encode())
    want_a = {}
    for w, bs in groups.items():
        row = py_row(w, hit)
        if row["gb"] or row["i"] == 0:
            want_a[w] = (row["i"], row["ip"], row["gi"], row["gb"], row["suf"], row["id"],
                         0x01020304, row["fm"], len(bs), sum(py_strtoi(b) for b in bs),
                         max(py_get_int(b, 1) for b in bs))
    got_a: dict = {}
    for r in read_rows(tmp_path / "agg.csv"):
        row = (int(r["i"]), int(ipaddress.IPv4Address(r["ip"])), int(r["gi"]),
               r["gb"].lower() == "true", r["suf"], int(r["id"]),
               int(ipaddress.IPv4Address(r["cip"])), int(r["fm"]))
        have = got_a.get(r["s"])
        n, total, top = int(r["n"]), int(r["total"]), int(r["top"])
        if have is not None:        # a run across a second boundary splits a group
            n, total, top = n + have[8], total + have[9], max(top, have[10])
        got_a[r["s"]] = (*row, n, total, top)
    assert got_a == want_a
    ref_a = {r["s"]: (int(r["i"]), int(r["ip"]), int(r["gi"]), bool(r["gb"]), r["suf"],
                      int(r["id"]), int(r["cip"]), int(r["fm"]), int(r["n"]), int(r["total"]),
                      int(r["top"])) for r in ref["agg"]}
    assert ref_a == want_a
    assert got_a[""][:6] == (0, 0, 0, False, "", 0)
    assert got_a["port 8080"][:2] == (8080, 0) and got_a["4294967297"][0] == 1
    assert (got_a["300.1.1.1"][1], got_a["1.2.4.256"][1]) == (0x2C010101, 0x01020500)
    assert got_a["gr\u00fcn 7"][4:6] == ("\u00fcn 7", int.from_bytes(b"gr\xc3\xbc", "big"))

    # group keys: an address and a string computed in the low level
    want_k: Counter = Counter()
    want_ids: Counter = Counter()
    for _, _, w in records:
        b = w.encode()
        key = (dotted(py_strtoip(b)), text(py_get_suffix(b, 2)))
        want_k[key] += 1
        want_ids[key] += py_strid(b)
    got_k: Counter = Counter()
    got_ids: Counter = Counter()
    for r in read_rows(tmp_path / "keys.csv"):
        got_k[(r["addr"], r["tail"])] += int(r["n"])
        got_ids[(r["addr"], r["tail"])] += int(r["ids"])
    assert got_k == want_k and got_ids == want_ids
    ref_k = Counter({(dotted(r["addr"]), r["tail"]): int(r["n"]) for r in ref["keys"]})
    assert ref_k == want_k


def run_in(monkeypatch, cwd, args: list[str]):
    """`oopscope run` of this checkout from another working directory (in this process, its
    working directory changed for the run)."""
    with monkeypatch.context() as m:
        m.chdir(cwd)
        return run_here([sys.executable, "-m", "tools.cli", "run", *args], check=False)


def test_regex_file_relative_to_the_working_directory(tmp_path, monkeypatch):
    data = tmp_path / "w.csv"
    data.write_text("\n".join(f"{i},{i},10.0.0.1,::1,{w},TRUE,0,{i},1"
                              for i, w in enumerate(["GET /", "post", "", "Host: a"])) + "\n")
    (tmp_path / "re.txt").write_text("GET|Host\n")
    query = tmp_path / "q.gsql"
    query.write_text("DEFINE { query_name m; }\nSELECT llongInPosition8 AS k FROM "
                     "csv.CSV_EXAMPLE WHERE str_file_regex_match(stringInPosition5, 're.txt', "
                     "0, 0) = 1")
    res = run_in(monkeypatch, tmp_path, ["q.gsql", "--schema", str(SCHEMA), "--link", "csv=w.csv",
                            "--output", "m=m.csv"])
    assert res.returncode == 0, res.stderr
    assert sorted(int(r["k"]) for r in read_rows(tmp_path / "m.csv")) == [0, 3]


def test_a_missing_regex_file_is_an_error_naming_it(tmp_path, monkeypatch):
    data = tmp_path / "w.csv"
    data.write_text("1,1,10.0.0.1,::1,GET /,TRUE,0,1,1\n")
    query = tmp_path / "q.gsql"
    query.write_text("DEFINE { query_name m; }\nSELECT llongInPosition8 AS k FROM "
                     "csv.CSV_EXAMPLE WHERE str_file_regex_match(stringInPosition5, "
                     "'nosuch.re', 0, 0) = 1")
    res = run_in(monkeypatch, tmp_path, ["q.gsql", "--schema", str(SCHEMA), "--link", "csv=w.csv",
                            "--output", "m=m.csv"])
    assert res.returncode != 0
    assert "nosuch.re: not found" in res.stderr
