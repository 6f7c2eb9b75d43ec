"""The README's first command and its tour, as the README prints them, from a fresh clone.

The repository is cloned into a temporary directory (what a new user has: the committed
files, nothing generated), and each command line of the README's first code block (but the
install, `.ci/install`, which this machine has run) and of the tour is run there by bash,
`oopscope` being the checkout's interpreter on the clone's code. Only the sizes of the
generated captures are made smaller (`-n`), so the tour takes minutes, not ten. Each line must
exit 0 and write what it says; at the end the clone holds no file git would show (what the
tour writes is ignored).
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.jit import KERNEL_PACKAGES, sources_digest
from tests.conftest import REPO

#: smaller captures than the README's (its numbers are for a person, not a test run)
SIZES = {"-n 500k": "-n 250k", "-n 200k": "-n 20k"}


def readme_blocks() -> list[list[str]]:
    """The command lines of each ```bash block of the README, comments stripped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = []
    for body in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines = [re.sub(r"\s+#.*$", "", line).strip() for line in body.splitlines()]
        blocks.append([line for line in lines if line and not line.startswith("#")])
    return blocks


def tour_lines() -> list[str]:
    """The first command (without the install) and the tour's lines, as the README has them."""
    first, tour = readme_blocks()[:2]       # set up and run, run the tests; the tour
    setup = first[0]
    assert setup.startswith("bash .ci/install && "), setup
    return [setup.removeprefix("bash .ci/install && "), *tour]


def test_the_tour_is_what_this_test_runs():
    """The README still has the blocks this test reads: set-up and tests, then the tour."""
    lines = tour_lines()
    assert lines[0].startswith("oopscope gen demo/demo.pcap ")
    assert any(line.startswith("oopscope example demo && ") for line in lines)
    assert all(line.startswith("oopscope ") for line in lines), lines
    assert all(size in " ".join(lines) for size in SIZES), "the README's sizes changed"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh clone of this checkout's HEAD, and a bin folder whose `oopscope` runs it."""
    root = tmp_path_factory.mktemp("tour")
    subprocess.run(["git", "clone", "-q", str(REPO), str(root / "oopscope")], check=True,
                   timeout=300)
    repo = root / "oopscope"
    copy_compiled_kernels(REPO, repo)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "oopscope"
    script.write_text(f"#!/bin/sh\nPYTHONPATH={repo} exec {sys.executable} -m tools.cli "
                      f"\"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    return repo, env


def copy_compiled_kernels(checkout: Path, repo: Path) -> None:
    """Give the clone the checkout's Numba machine code where their sources are the same.

    What the tour checks is the README's commands and their output, not Numba's compiler:
    compiling every kernel again in the clone was ~40 CPU s of the suite's busiest test.
    Numba keys its cache on a source file's modification time and size, so the clone's
    sources take the checkout's times; a package whose sources differ (uncommitted work in
    the checkout) is left to compile, as a user's clone would."""
    for name in KERNEL_PACKAGES:
        ours, theirs = checkout / name, repo / name
        cache = ours / "__pycache__"
        if not cache.is_dir() or sources_digest(ours) != sources_digest(theirs):
            continue
        for src in ours.glob("*.py"):
            stat_ = src.stat()
            os.utime(theirs / src.name, ns=(stat_.st_atime_ns, stat_.st_mtime_ns))
        shutil.copytree(cache, theirs / "__pycache__", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.pyc"))


def run_line(line: str, repo: Path, env: dict) -> subprocess.CompletedProcess:
    for big, small in SIZES.items():
        line = line.replace(big, small)
    return subprocess.run(["bash", "-c", line], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=900)


def table_rows(stdout: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of an aligned table (columns apart by two spaces or more)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    split = [re.split(r"\s{2,}", line.strip()) for line in lines]
    return split[0], split[1:]


@pytest.mark.slow
def test_the_readme_tour_runs_from_a_fresh_clone(clone):
    repo, env = clone
    assert not (repo / "demo").exists() and not (repo / "demo.pcap").exists()
    lines = tour_lines()
    results = []
    for line in lines:
        res = run_line(line, repo, env)
        assert res.returncode == 0, f"{line}\n{res.stderr[-3000:]}"
        assert "Traceback" not in res.stderr, f"{line}\n{res.stderr[-3000:]}"
        results.append(res)
    setup, decode, explain, counts, iop, two, example = results

    # the first command: a capture in demo/, then the top talkers per minute, biggest first,
    # each minute's start shown in UTC
    assert (repo / "demo" / "demo.pcap").stat().st_size > 1_000_000
    header, rows = table_rows(setup.stdout)
    assert header == ["tb", "window start (UTC)", "srcIP", "bytes", "packets"], setup.stdout
    assert rows, setup.stdout
    by_window: dict[str, list[int]] = {}
    for tb, start, _ip, nbytes, _packets in rows:
        assert int(tb) * 60 == int(_epoch(start)), (tb, start)
        by_window.setdefault(tb, []).append(int(nbytes))
        assert int(nbytes) >= 2_000_000
    assert all(b == sorted(b, reverse=True) for b in by_window.values()), by_window
    assert any(len(b) > 1 for b in by_window.values()), "no window ranks two sources"

    # decode: a header and five packets; explain: the plan
    assert len([x for x in decode.stdout.splitlines() if x.strip()]) == 6, decode.stdout
    assert "query q8_1 (aggregate)" in explain.stdout
    # Q8-1 to CSV, and the same rows with the in-order flush and a tiny table
    with open(repo / "demo" / "counts.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert written and list(written[0]) == ["tb", "srcIP", "destIP", "Cnt"]
    header, rows = table_rows(iop.stdout)
    assert header == ["tb", "window start (UTC)", "srcIP", "destIP", "Cnt"]
    assert sorted((r[0], *r[2:]) for r in rows) == \
        sorted(tuple(r.values()) for r in written)
    # two skewed links melded
    assert (repo / "demo" / "two-l0.pcap").is_file() and (repo / "demo" / "two-l1.pcap").is_file()
    assert table_rows(two.stdout)[1], two.stdout
    # the GS-lite example: its records counted per minute and sensor, as the file says
    for name in ("example.gsql", "packet_schema.txt", "records.csv"):
        assert (repo / "demo" / name).is_file()
    header, rows = table_rows(example.stdout)
    assert header[:3] == ["tb", "sensor", "readings"], example.stdout
    want: dict[tuple[int, str], list[int]] = {}
    for line in (repo / "demo" / "records.csv").read_text().splitlines():
        ts, sensor, _, value, alarm = line.split(",")
        w = want.setdefault((int(ts) // 60, sensor), [0, 0, 0, 0])
        w[0] += 1
        w[1] += int(value)
        w[2] = max(w[2], int(value))
        w[3] += alarm == "TRUE"
    got = {(int(r[0]), r[1]): [int(x) for x in r[2:6]] for r in rows}
    assert got == want, example.stdout

    # nothing the tour wrote shows in git: the clone is as it was
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"],
                            cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout


def _epoch(utc: str) -> int:
    from datetime import UTC, datetime

    return int(datetime.strptime(utc, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp())
