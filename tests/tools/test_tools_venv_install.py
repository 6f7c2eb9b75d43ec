"""oopscope installed into a fresh virtualenv (not in editable mode) and run as
`VENV/bin/oopscope`, without activating it, from a PATH that does not hold the venv: as a pipx
install or a systemd unit runs it. Spark's Python workers must then run the venv's
interpreter: before they did, they ran `python3` from the PATH (Debian's, or here one
without any package) and every stage that runs Python on the executors died with
`No module named 'queries'`. A string predicate over CSV records and an outer join run that
way, their rows compared with plain Python over the input; and the installed package holds
every file of the source packages (queries, the appliance's page), as a missing
package-data declaration in pyproject.toml would show."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("common", "capture", "lowlevel", "highlevel", "queries", "tools")

SCHEMA = """\
PROTOCOL base {
    uint systemTime get_system_time (low_cardinality,required,increasing, snap_len 0);
}
PROTOCOL PAIRS (base) {
    uint tick get_csv_uint_pos1 (increasing);
    string left get_csv_string_pos2;
    string right get_csv_string_pos3;
    uint v get_csv_uint_pos4;
}
"""

QUERY = """\
DEFINE { query_name same; }
SELECT tick, left, v FROM csv.PAIRS WHERE left = right;

DEFINE { query_name odd; }
SELECT tb, left, COUNT(*) AS c FROM csv.PAIRS WHERE v % 2 = 1
GROUP BY tick/10 AS tb, left;

DEFINE { query_name total; }
SELECT tb, left, SUM(v) AS s FROM csv.PAIRS GROUP BY tick/10 AS tb, left;

DEFINE { query_name joined; }
SELECT a.tb, a.left, a.s, b.c
LEFT_OUTER_JOIN FROM total a, odd b
WHERE a.tb = b.tb AND a.left = b.left
"""

WORDS = ["a", "b", "ab", "", "gr\u00fcn"]


def records(n: int = 80) -> list[tuple[int, str, str, int]]:
    """(tick, left, right, v): every word equal to itself on every third record."""
    return [(i, WORDS[i % 5], WORDS[(i + (i % 3 > 0)) % 5], (i * 3) % 7) for i in range(n)]


def _build_isolation() -> list[str]:
    """pip's flags to build the package: without build isolation (nothing downloaded) when
    this interpreter's setuptools is new enough for pyproject.toml and builds wheels itself;
    else pip fetches setuptools into an isolated build environment."""
    try:
        import setuptools
        from setuptools.command import bdist_wheel  # noqa: F401 - setuptools >= 70.1
    except ImportError:
        return []
    major = int(setuptools.__version__.split(".")[0])
    return ["--no-build-isolation"] if major >= 68 else []


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with oopscope installed from a copy of the source (the build
    writes `build/` and `*.egg-info` beside the sources). Its dependencies are this
    interpreter's (`--system-site-packages`): nothing is downloaded for them."""
    root = tmp_path_factory.mktemp("venv")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = root / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(env)], check=True, timeout=120)
    res = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "-q",
                          "--no-deps", "--disable-pip-version-check", *_build_isolation(),
                          str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    print(f"venv made and oopscope installed in {time.monotonic() - started:.1f} s")
    return env


def _site_packages(env: Path) -> Path:
    out = subprocess.run([str(env / "bin" / "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def bare_environment(tmp: Path, path: str = "/usr/bin:/bin") -> dict[str, str]:
    """What a systemd unit gives a service: no venv on the PATH, no Python or Spark
    variables (this process's own, which a session started here may have set, are left
    out)."""
    env = {"PATH": path, "HOME": os.environ.get("HOME", str(tmp))}
    for name in ("JAVA_HOME", "XDG_CACHE_HOME", "TMPDIR"):
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


def test_the_installed_package_holds_every_source_file(venv):
    site = _site_packages(venv)
    missing = []
    for package in PACKAGES:
        for path in (REPO / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                rel = path.relative_to(REPO)
                if not (site / rel).is_file():
                    missing.append(str(rel))
    assert not missing, f"not installed (pyproject.toml's packages or package-data): {missing}"
    # the venv's interpreter imports the installed copy, not a checkout
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import queries.explain, tools.serve.api as a; "
                          "print(queries.explain.LIBRARY); print(a.STATIC)"],
                         capture_output=True, text=True, cwd=venv, env=bare_environment(venv))
    assert out.returncode == 0, out.stderr
    library, static = (Path(p) for p in out.stdout.split())
    assert library.is_relative_to(site) and (library / "q8_1.gsql").is_file()
    assert static.is_relative_to(site) and (static / "index.html").is_file()
    # the README tour's GS-lite example comes with the package: the installed command writes it
    res = subprocess.run([str(venv / "bin" / "oopscope"), "example", "ex"], capture_output=True,
                         text=True, cwd=venv.parent, env=bare_environment(venv))
    assert res.returncode == 0, res.stderr
    for name in ("example.gsql", "packet_schema.txt", "records.csv"):
        assert (venv.parent / "ex" / name).read_bytes() == \
            (REPO / "tools" / "gen" / "gslite" / name).read_bytes()


@pytest.mark.slow
def test_string_predicate_and_outer_join_through_the_venvs_script(venv, tmp_path):
    work = tmp_path / "work"        # not the checkout: a worker must not find `queries` in
    work.mkdir()                    # its working directory
    (work / "schema.txt").write_text(SCHEMA)
    (work / "q.gsql").write_text(QUERY)
    rows = records()
    with open(work / "records.csv", "w", encoding="utf-8") as f:
        f.writelines(f"{t},{a},{b},{v}\n" for t, a, b, v in rows)
    # first on the PATH, a `python3` without oopscope (a virtualenv of its own without
    # packages): Debian's /usr/bin/python3 is such a one, but a machine's may not be
    other = tmp_path / "other"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True,
                   timeout=120)
    env = bare_environment(tmp_path, f"{other / 'bin'}:/usr/bin:/bin")
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 == str(other / "bin" / "python3")
    probe = subprocess.run([python3, "-c", "import queries"], capture_output=True, cwd=work,
                           env=env)
    assert probe.returncode != 0, probe.stdout

    started = time.monotonic()
    res = subprocess.run([str(venv / "bin" / "oopscope"), "run", "q.gsql", "--schema",
                          "schema.txt", "--link", "csv=records.csv",
                          "--output", "same=same.csv", "--output", "joined=joined.csv"],
                         capture_output=True, text=True, cwd=work, env=env, timeout=600)
    print(f"oopscope run through the venv's script: {time.monotonic() - started:.1f} s")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "ModuleNotFoundError" not in res.stderr

    with open(work / "same.csv", newline="", encoding="utf-8") as f:
        got = sorted((int(r["tick"]), r["left"], int(r["v"])) for r in csv.DictReader(f))
    assert got == sorted((t, a, v) for t, a, b, v in rows if a == b)
    assert any(a == "" for _, a, _ in got) and any(a == "gr\u00fcn" for _, a, _ in got)

    sums: dict = defaultdict(int)
    odds: dict = defaultdict(int)
    for t, a, _, v in rows:
        sums[t // 10, a] += v
        odds[t // 10, a] += v % 2
    want = sorted((tb, a, s, str(odds[tb, a]) if odds[tb, a] else "")
                  for (tb, a), s in sums.items())
    with open(work / "joined.csv", newline="", encoding="utf-8") as f:
        got_j = sorted((int(r["tb"]), r["left"], int(r["s"]), r["c"])
                       for r in csv.DictReader(f))
    assert got_j == want
    assert any(c == "" for *_, c in got_j) and any(c != "" for *_, c in got_j)
