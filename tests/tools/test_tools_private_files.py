"""No name another user can predict in a shared temporary directory (issue 25, item 1).

A fixed name under /tmp (`/tmp/oopscope-bench`) can be made first by another local user, or
hold their symlinks, and a run would then write through them. The benchmarks and the thesis
experiments now keep their captures in a directory from `tempfile.mkdtemp` (private, a random
name, removed at the end) unless `--dir` names one; the code is scanned for any other fixed
name in a shared temporary directory. (The cache directory's rule and the kernel directories:
tests/lowlevel/test_lowlevel_kernel_dirs.py and tests/highlevel/test_highlevel_jvmcache.py.)
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CODE = ("bench", "capture", "common", "highlevel", "lowlevel", "queries", "tools")


def _bench_decode(tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "bench.decode", "--packets", "1000",
                           "--repeat", "1", "--dpkt-packets", "1000", "--json",
                           str(tmp.parent / "bench.json"), *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_a_benchmark_writes_to_a_fresh_private_directory(tmp_path):
    shared = tmp_path / "tmp"            # stands for /tmp: TMPDIR points here
    shared.mkdir()
    made = []
    for _ in range(2):
        err = _bench_decode(shared).stderr
        (where,) = re.findall(r"generating (\S+)/decode_1000\.pcap", err)
        made.append(Path(where))
    for where in made:
        assert where.parent == shared and where.name.startswith("oopscope-bench-decode-")
        assert not where.exists()          # removed at the end
    assert made[0] != made[1]              # a new random name each time
    assert list(shared.iterdir()) == []


def test_a_benchmark_keeps_its_captures_in_dir(tmp_path):
    keep = tmp_path / "captures"
    err = _bench_decode(tmp_path, "--dir", str(keep)).stderr
    assert f"generating {keep}/decode_1000.pcap" in err
    assert (keep / "decode_1000.pcap").is_file()
    assert "generating" not in _bench_decode(tmp_path, "--dir", str(keep)).stderr   # reused


def test_the_experiments_capture_directory_is_private(tmp_path, monkeypatch):
    from tools.experiments import iop_oop

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(iop_oop, "_WORK", [])
    cfg = replace(iop_oop.QUICK, per_group=1, lap_windows=1)
    assert cfg.directory is None
    path = iop_oop.make_capture(cfg, 50)
    work = path.parent
    assert work.parent == tmp_path and work.name.startswith("oopscope-bench-iop-oop-")
    assert work.name != "oopscope-bench-iop-oop-" and work.stat().st_mode & 0o777 == 0o700
    assert iop_oop.make_capture(cfg, 50) == path          # reused within the process
    given = iop_oop.make_capture(replace(cfg, directory=str(tmp_path / "given")), 50)
    assert given.parent == tmp_path / "given"


def _findings(path: Path) -> list[str]:
    """Fixed names in a shared temporary directory that `path`'s code would create or use:
    string constants starting with /tmp/ (not docstrings or help texts), and gettempdir() or
    $TMPDIR joined with a name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))            # a docstring
        if isinstance(node, ast.keyword) and node.arg in ("help", "metavar"):
            skip.update(id(n) for n in ast.walk(node.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip and re.match(r"/(var/)?tmp(/|$)", node.value):
            out.append(f"{path}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            text = ast.unparse(node.left)
            if "gettempdir" in text or "TMPDIR" in text:
                out.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_code_names_a_fixed_path_in_a_shared_temporary_directory():
    files = [p for d in CODE for p in (REPO / d).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 100
    findings = [f for p in files for f in _findings(p)]
    assert findings == []


@pytest.mark.parametrize("code", ['x = "/tmp/oopscope-bench"',
                                  'd = Path(tempfile.gettempdir()) / "oopscope-bench-nf"',
                                  'd = Path(os.environ.get("TMPDIR", "/tmp")) / "fixed"'])
def test_the_scan_finds_what_it_looks_for(code, tmp_path):
    f = tmp_path / "sample.py"
    f.write_text(f'"""A docstring naming /tmp/whatever is fine."""\n{code}\n')
    assert len(_findings(f)) >= 1
