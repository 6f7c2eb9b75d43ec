"""Several query files as one query set on the command line (`oopscope run a.gsql b.gsql`),
as GS-lite's translate_fta takes them: a query reads a query of another file, names are
unique across the files, and every command that takes query files passes them all on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.resuming import run_here

UP = """DEFINE { query_name tcp_pkts; }
SELECT time/60 as tb, srcIP
FROM TCP
WHERE protocol = 6 and offset = 0
"""
DOWN = """SELECT tb, srcIP, count(*)
FROM tcp_pkts
GROUP BY tb, srcIP
"""


@pytest.fixture
def query_set(tmp_path) -> tuple[Path, Path]:
    down, up = tmp_path / "count_tcp.gsql", tmp_path / "tcp_pkts.gsql"
    down.write_text(DOWN)
    up.write_text(UP)
    return down, up


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """The command line's exit code and output, run in this process (`run_here`)."""
    return run_here([sys.executable, "-m", "tools.cli", *argv], check=False)


def test_explain_plans_a_query_reading_another_file(query_set):
    down, up = query_set
    proc = _cli("explain", str(down), str(up))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"file {down} + {up}; links: main")
    # the upstream query comes first (dependency order), read by the one of the other file
    assert proc.stdout.index("query tcp_pkts (select)") < \
        proc.stdout.index("query count_tcp (aggregate)")
    assert "read by: count_tcp" in proc.stdout


def test_one_file_alone_does_not_know_the_other(query_set):
    down, _ = query_set
    proc = _cli("explain", str(down))
    assert proc.returncode == 1
    assert f"{down}:2:6: unknown query or protocol 'tcp_pkts'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_name_in_two_files_is_an_error_naming_both(query_set, tmp_path):
    down, up = query_set
    twin = tmp_path / "twin.gsql"
    twin.write_text(UP)
    proc = _cli("explain", str(down), str(up), str(twin))
    assert proc.returncode == 1
    assert f"{twin}:1:21: query name 'tcp_pkts' is already used at {up}:1:21" \
        in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_fanout_members_get_every_file_and_schema(query_set, tmp_path):
    """A fanout member agent is started with the whole query set and the schema files."""
    from tools.pipeline.config import RunConfig
    from tools.pipeline.fanout import Member, member_argv

    down, up = query_set
    schema = tmp_path / "extra_schema.txt"
    schema.write_text("PROTOCOL R (base) { uint a get_csv_uint_pos1; }\n")
    config = RunConfig(query_file=str(down), more_query_files=(str(up),),
                       interfaces=(("main", "eth0"),), schema_files=(str(schema),))
    argv = member_argv(config, str(tmp_path / "spool"), "h", Member(0, 2, 7))
    assert argv[3:6] == ["agent", str(down), str(up)]
    assert argv[argv.index("--schema") + 1] == str(schema)


def test_resume_state_depends_on_every_file(query_set):
    """A resumable run's state is refused when any file of the set changed."""
    from tools.pipeline.config import RunConfig
    from tools.pipeline.resume import differences, manifest

    down, up = query_set
    config = RunConfig(query_file=str(down), more_query_files=(str(up),))
    before = manifest(config, [], {})
    up.write_text(UP.replace("offset = 0", "offset = 8"))
    after = manifest(config, [], {})
    assert before["query_file"] == f"{down} + {up}"
    assert any("the query differs" in why for why in differences(before, after))
