"""`oopscope explain`: readable plans for good files, one clear line (exit 1, no traceback) for bad ones."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tools.commands.explain import explain

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "queries" / "library"


def oopscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("path", sorted(LIBRARY.glob("*.gsql")), ids=lambda p: p.stem)
def test_every_shipped_query_explains(path):
    result = CliRunner().invoke(explain, [str(path)])
    assert result.exit_code == 0, result.output
    assert "high level:" in result.output
    for name in [line.split()[1] for line in result.output.splitlines() if line.startswith("query ")]:
        assert name


def test_shipped_query_by_name_with_overrides():
    result = CliRunner().invoke(explain, ["q8_1", "--set", "flush=iop_slow", "--set",
                                          "aggregate_slots=100"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "query q8_1 (aggregate)" in out
    assert "hash table: 128 slots; flush iop_slow (i = 1, m = 2)" in out
    assert "protocol: IPV4" in out and "sub-aggregates: cnt = count(*)" in out
    assert "window: tumbling 1min" in out


def test_links_and_params():
    result = CliRunner().invoke(explain, ["top_talkers", "--param", "min_bytes=777",
                                          "--link", "main", "--link", "eth1=x.pcap"])
    assert result.exit_code == 0, result.output
    assert "having: _agg0 >= 777" in result.output
    assert "links: main, eth1" in result.output
    # a link the run does not have is an error at the FROM item
    result = CliRunner().invoke(explain, ["top_talkers", "--link", "eth0"])
    assert result.exit_code == 1
    assert "top_talkers.gsql:20:6: unknown link 'main': this run has eth0" in str(result.exception)
    # q8_2 names its links: they are the default
    result = CliRunner().invoke(explain, ["q8_2"])
    assert "low level, link link1:" in result.output and "low level, link link2:" in result.output
    assert "union: meld" in result.output


BAD = [
    ("SELECT tb, count(*) FROM main.IP GROUP BY time/60 AS tb, nope\n", ":1:58: unknown column 'nope'"),
    ("DEFINE { flush fast; }\nSELECT len FROM main.IP\n", ":1:16: DEFINE flush: 'fast'"),
    ("SELECT len FROM main.IP WHERE len >\n", ":1:36: expected an expression"),
    ("SELECT srcIP, count(*) FROM main.IP GROUP BY srcIP\n", "needs a temporal group item"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m for _, m in BAD])
def test_bad_query_file_is_one_clear_error(tmp_path, text, message):
    f = tmp_path / "bad.gsql"
    f.write_text(text)
    proc = oopscope("explain", str(f))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("oopscope: error: ")
    assert message in proc.stderr and "bad.gsql" in proc.stderr
    assert proc.stdout == ""


def test_bad_options_are_reported_without_traceback():
    proc = oopscope("explain", "q8_1", "--set", "nosuch=1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "unknown DEFINE key 'nosuch'" in proc.stderr
    proc = oopscope("explain", "top_talkers", "--param", "min_bytes=lots")
    assert proc.returncode == 1 and "'lots' is not a ullong" in proc.stderr
    proc = oopscope("explain", "no_such_query_anywhere")
    assert proc.returncode == 1 and "no such query file" in proc.stderr
    proc = oopscope("explain", "q8_1", "--set", "flush")
    assert proc.returncode == 2 and "key=value" in proc.stderr


def test_help():
    result = CliRunner().invoke(explain, ["--help"])
    assert result.exit_code == 0 and "--set" in result.output and "q8_1" in result.output


def test_expressions_print_as_the_gsql_printer_prints_them():
    # one printer (queries.printer.to_gsql): explain shows GSQL that parses back to the same tree
    from queries.explain import explain_text
    from queries.parser import parse
    from queries.printer import to_gsql

    text = "SELECT -(-len) AS a, ~(~len) AS b FROM main.IP WHERE NOT (len > 5) AND len IN [1, 2]\n"
    out = explain_text(text)
    assert "where: NOT (len > 5) AND len IN [1, 2]" in out
    assert "project: a llong = -(-len), b uint = ~(~len)" in out
    where = parse(text).queries[0].statement.where
    assert to_gsql(where) in out
    # a count window prints in the thesis form, without a comma before ROWS
    result = CliRunner().invoke(explain, ["packet_runs"])
    assert result.exit_code == 0, result.output
    assert "[COUNT(*) [PARTITION BY srcIP ROWS 100]]" in result.output
