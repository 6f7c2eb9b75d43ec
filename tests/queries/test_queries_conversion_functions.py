"""GS-lite's conversion functions (manual 12.2: strtoi, strtoip, their _c forms, get_int,
get_bool, get_suffix, strid) and str_file_regex_match (12.1): the low-level kernels
(`lowlevel.strings`) on hand-made inputs and on random bytes against plain Python written
from GS-lite's C (`nextint`, `strtoip`), over payload-like binary arrays, record-string codes
and literals; the regular expression file; the located errors of the planner."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from capture.strings import StringTable
from lowlevel import strings
from lowlevel.values import StringCodes
from queries import expressions as E
from queries import types as T
from queries.analysis import analyse_file
from queries.errors import QueryError
from queries.inference import type_of
from queries.parser import parse
from queries.string_functions import (
    STRING_FUNCTIONS,
    RegexFileError,
    check_call,
    regex_from_file,
)

U32 = 2**32


# --- plain Python, from GS-lite's C ---------------------------------------------------------------

def py_numbers(b: bytes, want: int) -> list[int] | None:
    """GS-lite's nextint `want` times: skip non-digits, read digits into a wrapping uint32."""
    out, p = [], 0
    while len(out) < want:
        while p < len(b) and not 48 <= b[p] <= 57:
            p += 1
        if p == len(b):
            return None
        v = 0
        while p < len(b) and 48 <= b[p] <= 57:
            v = (v * 10 + b[p] - 48) % U32
            p += 1
        out.append(v)
    return out


def py_strtoi(b: bytes) -> int:
    found = py_numbers(b, 1)
    return found[0] if found else 0


def py_strtoip(b: bytes) -> int:
    found = py_numbers(b, 4)
    if not found:
        return 0
    a, b2, c, d = found
    return ((a << 24) % U32) | ((b2 << 16) % U32) | ((c << 8) % U32) | d


def py_get_int(b: bytes, n: int) -> int:
    if n < 1 or n - 1 + 4 > len(b):
        return 0
    return int.from_bytes(b[n - 1:n + 3], "big")


def py_strid(b: bytes) -> int:
    return int.from_bytes((b + b"\0\0\0\0")[:4], "big")


def py_get_suffix(b: bytes, n: int) -> bytes:
    return b[max(n - 1, 0):]


def binary(values: list[bytes]) -> pa.Array:
    return pa.array(values, pa.binary())


def call(name: str, s, *rest, n: int | None = None):
    """`name(s, rest...)` through `strings.call`; a Python scalar in `rest` is a literal."""
    args = [s] + [None if not isinstance(r, np.ndarray) else r for r in rest]
    constants = [None] + [None if isinstance(r, np.ndarray) else r for r in rest]
    out = strings.call(name, args, constants, n if n is not None else len(s))
    return out.to_pylist() if isinstance(out, pa.Array) else out.tolist()


# --- hand-made inputs --------------------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    (b"", 0), (b"abc", 0), (b"42", 42), (b"  42 apples", 42), (b"x12y34", 12),
    (b"-5", 5), (b"+7", 7), (b"4294967295", 4294967295), (b"4294967296", 0),
    (b"4294967297", 1), (b"99999999999999999999", 99999999999999999999 % U32),
    (b"007", 7), (b"1.5", 1), (b"\xff\xfe9", 9), (b"12\n34", 12), (b"0", 0),
])
def test_strtoi_reads_the_first_run_of_digits(text, value):
    assert call("strtoi", binary([text])) == [value]
    assert py_strtoi(text) == value


@pytest.mark.parametrize("text,dotted", [
    (b"10.0.0.1", "10.0.0.1"), (b"ip=192.168.1.7/24", "192.168.1.7"),
    (b"1 2 3 4", "1.2.3.4"), (b"1.2.3.4.5", "1.2.3.4"), (b"255.255.255.255", "255.255.255.255"),
    (b"300.1.1.1", "44.1.1.1"),           # 300 << 24 loses its high bit, as in GS-lite's C
    (b"1.2.4.256", "1.2.5.0"),            # 256 spills into the byte above (OR, not +)
    (b"1.2.3", "0.0.0.0"), (b"", "0.0.0.0"), (b"not an ip", "0.0.0.0"), (b"1..2..3", "0.0.0.0"),
    (b"a1b2c3d4", "1.2.3.4"), (b"0.0.0.0", "0.0.0.0"), (b"::ffff:1.2.3.4", "1.2.3.4"),
])
def test_strtoip_reads_four_numbers(text, dotted):
    a, b, c, d = (int(x) for x in dotted.split("."))
    want = a << 24 | b << 16 | c << 8 | d
    assert call("strtoip", binary([text])) == [want]
    assert py_strtoip(text) == want


def test_get_int_is_big_endian_and_zero_past_the_end():
    s = binary([b"\x01\x02\x03\x04\x05", b"abc", b"", b"GET /"])
    assert call("get_int", s, 1) == [0x01020304, 0, 0, 0x47455420]
    assert call("get_int", s, 2) == [0x02030405, 0, 0, 0x4554202F]
    assert call("get_int", s, 3) == [0, 0, 0, 0]            # bytes 2..5: one past the end
    assert call("get_int", s, 0) == [0, 0, 0, 0]            # n counts from 1
    assert call("get_bool", s, 1) == [True, False, False, True]
    assert call("get_bool", binary([b"\0\0\0\0x", b"\0\0\0\1"]), 1) == [False, True]
    # a per-row position
    assert call("get_int", s, np.array([2, 1, 1, 2])) == [0x02030405, 0, 0, 0x4554202F]


def test_strid_pads_short_strings():
    s = binary([b"abcd", b"abcdef", b"ab", b"", b"\xff"])
    assert call("strid", s) == [0x61626364, 0x61626364, 0x61620000, 0, 0xFF000000]


def test_get_suffix_starts_at_byte_n_minus_1():
    s = binary([b"hello", b"hi", b"", b"\xc3\xbcber"])
    assert call("get_suffix", s, 1) == [b"hello", b"hi", b"", b"\xc3\xbcber"]
    assert call("get_suffix", s, 0) == [b"hello", b"hi", b"", b"\xc3\xbcber"]
    assert call("get_suffix", s, 3) == [b"llo", b"", b"", b"ber"]
    assert call("get_suffix", s, 99) == [b"", b"", b"", b""]
    assert call("get_suffix", s, np.array([2, 3, 1, 2])) == [b"ello", b"", b"", b"\xbcber"]


def test_literal_arguments_are_converted_once_and_repeated():
    assert strings.call("strtoip_c", [None], ["10.1.2.3"], 3).tolist() == [0x0A010203] * 3
    assert strings.call("strtoi_c", [None], ["port 80"], 2).tolist() == [80, 80]
    assert strings.call("strtoi_c", [None], ["none"], 2).tolist() == [0, 0]
    assert strings.call("get_suffix", [None, None], ["hello", 4], 2).to_pylist() == \
        [b"lo", b"lo"]
    assert strings.call("strtoi", [None], ["12"], 0).tolist() == []


@pytest.mark.parametrize("name", ["strtoi", "strtoip", "strid", "get_int", "get_bool",
                                  "get_suffix"])
def test_empty_batches(name):
    rest = [] if name in ("strtoi", "strtoip", "strid") else [1]
    assert call(name, binary([]), *rest) == []
    assert call(name, binary([]), *[np.zeros(0, np.int64) for _ in rest]) == []


# --- random bytes against plain Python ----------------------------------------------------------

def random_bytes(rng, count: int) -> list[bytes]:
    alphabet = np.frombuffer(b"0123456789....  ab-/:\n\xff\x00", np.uint8)
    out = []
    for _ in range(count):
        size = int(rng.integers(0, 24))
        out.append(bytes(rng.choice(alphabet, size=size)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kernels_equal_plain_python_on_random_bytes(seed):
    rng = np.random.default_rng(seed)
    values = random_bytes(rng, 600) + [b"9" * 40, b"1." * 40]
    s = binary(values)
    n = rng.integers(0, 30, size=len(values))
    assert call("strtoi", s) == [py_strtoi(v) for v in values]
    assert call("strtoip", s) == [py_strtoip(v) for v in values]
    assert call("strid", s) == [py_strid(v) for v in values]
    assert call("get_int", s, n) == [py_get_int(v, int(k)) for v, k in zip(values, n)]
    assert call("get_bool", s, n) == [py_get_int(v, int(k)) != 0 for v, k in zip(values, n)]
    assert call("get_suffix", s, n) == [py_get_suffix(v, int(k)) for v, k in zip(values, n)]
    for k in (0, 1, 5):
        assert call("get_int", s, k) == [py_get_int(v, k) for v in values]
        assert call("get_suffix", s, k) == [py_get_suffix(v, k) for v in values]


def test_a_sliced_array_is_read_from_its_offset():
    s = binary([b"1.1.1.1", b"x 7", b"2.2.2.2", b"abcd"]).slice(1, 3)
    assert call("strtoi", s) == [7, 2, 0]
    assert call("strtoip", s) == [0, 0x02020202, 0]
    assert call("strid", s) == [py_strid(b"x 7"), py_strid(b"2.2.2.2"), 0x61626364]


# --- record strings: once per distinct string, gathered by code -----------------------------------

def test_record_strings_are_converted_per_distinct_string():
    t = StringTable()
    texts = ["10.0.0.1", "port 8080", "", "gr\u00fcn", "10.0.0.1", "abc"]
    codes = StringCodes(t.intern_array(pa.array(texts)), t)
    raw = [x.encode() for x in texts]
    assert strings.call("strtoi", [codes], [None], 6).tolist() == [py_strtoi(b) for b in raw]
    assert strings.call("strtoip", [codes], [None], 6).tolist() == \
        [py_strtoip(b) for b in raw]
    assert strings.call("get_int", [codes, None], [None, 2], 6).tolist() == \
        [py_get_int(b, 2) for b in raw]
    suffix = strings.call("get_suffix", [codes, None], [None, 3], 6)
    assert isinstance(suffix, StringCodes) and suffix.table is t      # interned, still codes
    assert list(suffix.decode()) == [b[2:].decode("utf-8", "replace") for b in raw]
    per_row = strings.call("get_suffix", [codes, np.arange(6)], [None, None], 6)
    assert per_row.to_pylist() == [py_get_suffix(b, k) for k, b in enumerate(raw)]


def test_payloads_through_the_evaluator():
    from capture.batch import PacketBatch
    from lowlevel.evaluate import evaluate

    payloads = [b"GET /x HTTP/1.1", b"", b"\x00\x00\x01\xbb10.0.0.7", b"ip 8.8.4.4"]
    batch = PacketBatch.empty("l", len(payloads))
    batch.payload = pa.array(payloads, pa.binary())
    data = E.Field(name="TCP_data", type="string", columns=("payload",))

    def f(name, *args):
        return evaluate(E.Func(name=name, args=[data, *args]), batch)

    two = E.Literal(value=2, kind="int")
    assert f("strtoi").tolist() == [1, 0, 10, 8]
    assert f("strtoip").tolist() == [0, 0, 0x0A000007, 0x08080404]
    assert f("get_int", E.Literal(value=1, kind="int")).tolist() == \
        [0x47455420, 0, 0x000001BB, 0x69702038]
    assert f("get_bool", two).tolist() == [True, False, True, True]
    assert f("get_suffix", two).to_pylist() == [p[1:] for p in payloads]
    assert f("strid").tolist() == [py_strid(p) for p in payloads]
    cond = E.Binary(op="=", left=E.Func(name="strtoip", args=[data]),
                    right=E.Literal(value=0x08080404, kind="ip"))
    assert evaluate(cond, batch).tolist() == [False, False, False, True]


# --- the regular expression file --------------------------------------------------------------

def test_str_file_regex_match_reads_its_file(tmp_path):
    path = tmp_path / "re.txt"
    path.write_text("^GET |Host: [a-z]+\n")
    s = binary([b"GET /a", b"POST /", b"x\nHost: abc", b"", b"get /"])
    got = strings.call("str_file_regex_match", [s, None, None, None], [None, str(path), 5, 0],
                       len(s))
    want = strings.call("str_regex_match", [s, None], [None, "^GET |Host: [a-z]+"], len(s))
    assert got.tolist() == want.tolist() == [1, 0, 1, 0, 0]


def test_regex_file_is_read_when_planned_and_kept(tmp_path):
    path = tmp_path / "kept.txt"
    path.write_text("abc\r\n")
    assert regex_from_file(str(path), reread=True) == "abc"
    path.write_text("xyz")
    assert regex_from_file(str(path)) == "abc"          # evaluators: what planning read
    assert regex_from_file(str(path), reread=True) == "xyz"     # the next query planned


@pytest.mark.parametrize("content,message", [
    (None, "not found (relative paths are read from the working directory"),
    ("", "is empty"),
    ("\n", "is empty"),
    ("a\nb\n", "holds more than one line"),
    ("(unclosed", "is not a regular expression (missing ))"),
])
def test_regex_file_errors(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RegexFileError) as info:
        regex_from_file(str(path), reread=True)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "unclosed" not in str(info.value)      # what the file holds is never shown


def test_regex_file_not_utf8(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes(b"caf\xe9")
    with pytest.raises(RegexFileError, match="is not UTF-8 text"):
        regex_from_file(str(path), reread=True)


def test_a_missing_file_stops_the_evaluation_with_its_name(tmp_path):
    s = binary([b"x"])
    with pytest.raises(QueryError, match="nosuch.txt: not found"):
        strings.call("str_file_regex_match", [s, None, None, None],
                     [None, str(tmp_path / "nosuch.txt"), 1, 1], 1)


# --- types and the planner's located errors ------------------------------------------------------

@pytest.mark.parametrize("name,args,result", [
    ("strtoi", ["string"], "uint"), ("strtoip", ["string"], "ipv4"),
    ("strtoi_c", ["string"], "uint"), ("strtoip_c", ["string"], "ipv4"),
    ("get_int", ["string", "uint"], "uint"), ("get_bool", ["string", "ullong"], "bool"),
    ("get_suffix", ["string", "int"], "string"), ("strid", ["string"], "uint"),
    ("str_file_regex_match", ["string", "string", "uint", "uint"], "uint"),
    ("strtoi", ["uint"], None), ("get_int", ["uint", "uint"], None),
    ("get_suffix", ["string", "string"], None), ("strtoip", ["ipv4"], None),
    ("str_file_regex_match", ["string", "uint", "uint", "uint"], None),
])
def test_result_types(name, args, result):
    assert T.function_type(name, args) == result


def analyse(text: str):
    return analyse_file(parse(text, path="q.gsql"), ["main"], source=text)


def locate(marked: str) -> tuple[str, int, int]:
    i = marked.index("§")
    return marked[:i] + marked[i + 1:], 1, i + 1


@pytest.mark.parametrize("marked,message", [
    ("SELECT §strtoi(len) FROM main.IP", "strtoi does not take (uint)"),
    ("SELECT §strtoip(srcIP) FROM main.IPV4", "strtoip does not take (ipv4)"),
    ("SELECT §get_int(link, link) FROM main.IP", "get_int does not take (string, string)"),
    ("SELECT §get_suffix(link) FROM main.IP", "get_suffix takes 2 argument(s)"),
    ("SELECT §str_file_regex_match(link, 'f', 1) FROM main.IP",
     "str_file_regex_match takes 4 argument(s)"),
    ("SELECT §strid(link, 1) FROM main.IP", "strid takes 1 argument(s)"),
])
def test_wrong_arguments_are_located(marked, message):
    text, line, col = locate(marked)
    with pytest.raises(QueryError) as info:
        analyse(text)
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (line, col)


def test_conversions_analyse_with_their_types():
    (aq,) = analyse("SELECT strtoi(link) AS a, strtoip(link) AS b, strtoip_c('1.2.3.4') AS c, "
                    "get_int(link, len) AS d, get_bool(link, 1) AS e, get_suffix(link, 2) AS f, "
                    "strid(link) AS g FROM main.IP WHERE strtoi_c('5') < len")
    assert [type_of(i.expr) for i in aq.items] == \
        ["uint", "ipv4", "ipv4", "uint", "bool", "string", "uint"]


def checked(marked: str) -> list:
    """check_call over the first SELECT item of a one-line query, a call (its written
    arguments standing for the resolved ones: literals and columns), errors located in the
    text at the `§` marker's place."""
    text = marked.replace("§", "")
    node = parse(text, path="q.gsql").queries[0].statement.items[0].this
    args = list(node.args["args"])

    def error(at, message):
        return QueryError.at(at, message, source=text, path="q.gsql")

    return check_call(node.name.lower(), args, args, error)


@pytest.mark.parametrize("marked,message", [
    ("SELECT strtoi_c(§link) FROM main.IP",
     "the argument of strtoi_c must be a string literal (a GS-lite HANDLE, converted once; "
     "strtoi(s) converts any string)"),
    ("SELECT strtoip_c(§link) FROM main.IP", "strtoip(s) converts any string"),
    ("SELECT str_file_regex_match(link, §link, 1, 2) FROM main.IP",
     "the regular expression file of str_file_regex_match must be a string literal"),
    ("SELECT str_file_regex_match(link, §'nosuch_regex_file.txt', 1, 2) FROM main.IP",
     "regular expression file nosuch_regex_file.txt: not found"),
    ("SELECT str_regex_match(link, §link) FROM main.IP",
     "the regular expression of str_regex_match must be a string literal"),
    ("SELECT str_truncate(link, §len) FROM main.IP",
     "the length of str_truncate must be an integer literal"),
])
def test_check_call_locates_constant_arguments(marked, message):
    _, line, col = locate(marked)
    with pytest.raises(QueryError) as info:
        checked(marked)
    assert message in info.value.message, info.value.message
    assert (info.value.line, info.value.column) == (line, col)


def test_check_call_names_the_regex_file_by_its_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "r.txt").write_text("GET\n")
    monkeypatch.chdir(tmp_path)         # relative to the working directory, as getlpmid's
    args = checked("SELECT str_file_regex_match(link, 'r.txt', 1, 2) FROM main.IP")
    assert isinstance(args[1], E.Literal) and args[1].value == str(tmp_path / "r.txt")
    assert regex_from_file(args[1].value) == "GET"


def test_check_call_refuses_a_bad_regex_file_at_its_name(tmp_path):
    (tmp_path / "two.txt").write_text("a\nb\n")
    path = str(tmp_path / "two.txt")
    with pytest.raises(QueryError) as info:
        checked(f"SELECT str_file_regex_match(link, §'{path}', 1, 2) FROM main.IP")
    assert "holds more than one line" in info.value.message
    assert info.value.column == len("SELECT str_file_regex_match(link, ") + 1


@pytest.mark.parametrize("marked,message", [
    ("SELECT strtoi_c(§link) FROM main.IP", "the argument of strtoi_c must be a string literal"),
    ("SELECT len FROM main.IP WHERE str_file_regex_match(link, §link, 1, 2) = 1",
     "the regular expression file of str_file_regex_match must be a string literal"),
    ("SELECT len FROM main.IP WHERE str_file_regex_match(link, §'nosuch_regex_file.txt', 1, "
     "2) = 1", "regular expression file nosuch_regex_file.txt: not found"),
])
def test_the_planner_locates_constant_argument_errors(marked, message):
    text, line, col = locate(marked)
    with pytest.raises(QueryError) as info:
        analyse(text)
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (line, col)


def test_every_conversion_is_declared():
    for name in ("strtoi", "strtoip", "strtoi_c", "strtoip_c", "get_int", "get_bool",
                 "get_suffix", "strid", "str_file_regex_match"):
        assert name in STRING_FUNCTIONS and name in T.FUNCTIONS
    assert "str_between_substrings" not in T.FUNCTIONS
