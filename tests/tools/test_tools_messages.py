"""Errors of the command line that name the likely fix: a keyword typo, ORDER BY, a schema
file beside the query, a record link's name, a query's link on a server, a wrong CSV
separator. The CLI ones run `oopscope`'s command line as a user would (in this process,
`run_here`: exit code, standard output and error as the command gives them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools.resuming import run_here
from tools.errors import RunLinkError
from tools.pipeline.config import RunConfig, load_plan, plan_text

READINGS = """PROTOCOL READINGS {
    uint ts get_csv_uint_pos1 (increasing);
    string sensor get_csv_string_pos2;
    uint value get_csv_uint_pos3;
}
"""
PER_MINUTE = "SELECT tb, sensor, sum(value) AS total FROM csv.READINGS GROUP BY ts/60 AS tb, sensor\n"
TOP_TALKERS = (REPO / "queries" / "library" / "top_talkers.gsql").read_text()


def oopscope(*args: str) -> subprocess.CompletedProcess:
    return run_here([sys.executable, "-m", "tools.cli", *args], check=False)


@pytest.fixture
def readings(tmp_path) -> Path:
    """A query over READINGS records, its schema beside it (GS-lite's layout)."""
    (tmp_path / "packet_schema.txt").write_text(READINGS)
    query = tmp_path / "q.gsql"
    query.write_text(PER_MINUTE)
    return query


def test_explain_names_a_keyword_typo_and_order_by(tmp_path):
    typo = tmp_path / "typo.gsql"
    typo.write_text("SELECT tb, count(*) FROM main.IPV4 GRUOP BY time/60 AS tb\n")
    res = oopscope("explain", str(typo))
    assert res.returncode != 0
    assert "did you mean GROUP BY?" in res.stderr
    lines = res.stderr.splitlines()
    marker = next(line for line in lines if "^" in line)
    assert marker.index("^") == lines[lines.index(marker) - 1].index("GRUOP")
    order = tmp_path / "order.gsql"
    order.write_text("SELECT tb, count(*) AS n FROM main.IPV4 GROUP BY time/60 AS tb "
                     "ORDER BY n\n")
    res = oopscope("explain", str(order))
    assert res.returncode != 0
    assert "GSQL has no ORDER BY" in res.stderr and "sort the output" in res.stderr
    assert "Traceback" not in res.stderr


def test_an_explicit_schema_wins_over_the_one_beside_the_query(readings, tmp_path):
    # the file beside the query declares READINGS too: it used to be "declared twice"
    mine = tmp_path / "mine.txt"
    mine.write_text(READINGS.replace("uint value", "float value").replace(
        "get_csv_uint_pos3", "get_csv_float_pos3"))
    res = oopscope("explain", str(readings), "--schema", str(mine))
    assert res.returncode == 0, res.stderr
    assert "declared twice" not in res.stderr
    assert str(mine) in res.stdout


def test_a_wrong_records_link_name_shows_how_records_are_given(readings, tmp_path):
    config = RunConfig(query_file=str(readings), links=(("cvs", str(tmp_path / "r.csv")),))
    with pytest.raises(RunLinkError) as info:
        load_plan(config)
    message = str(info.value)
    assert "--link csv=RECORDS.csv" in message and "READINGS records" in message
    assert "PCAP" not in message


def test_a_server_link_of_another_name_suggests_link_map():
    with pytest.raises(RunLinkError, match=r"submit --link-map main=L\b"):
        plan_text(TOP_TALKERS, "top_talkers.gsql", ["L"], {}, {}, subset=True)
    plan = plan_text(TOP_TALKERS, "top_talkers.gsql", ["L"], {}, {}, subset=True,
                     link_map={"main": "L"})
    assert plan.links == ("L",)
    with pytest.raises(RunLinkError, match="reads no link mian; its links are main"):
        plan_text(TOP_TALKERS, "top_talkers.gsql", ["L"], {}, {}, subset=True,
                  link_map={"mian": "L"})


@pytest.mark.slow
def test_every_record_malformed_fails_the_run_naming_the_separator(readings, tmp_path):
    data = tmp_path / "r.csv"
    data.write_text("1;a;10\n2;b;20\n61;a;5\n")
    res = oopscope("run", str(readings), "--link", f"csv={data}", "--csv-separator", ",")
    assert res.returncode != 0, res.stderr
    line = next(ln for ln in res.stderr.splitlines() if "records were malformed" in ln)
    assert "link csv" in line and "all 3 records" in line
    assert "--csv-separator ';'" in line
    assert "1;a;10" not in res.stderr          # the file's contents are not echoed
    # space-separated records are read as such
    spaced = tmp_path / "s.csv"
    spaced.write_text("1 a 10\n2 b 20\n61 a 5\n")
    res = oopscope("run", str(readings), "--link", f"csv={spaced}", "--format", "csv")
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()[1:]) == ["0,a,10", "0,b,20", "1,a,5"]
