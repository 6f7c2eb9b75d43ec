"""The command line: every command answers --help without importing the heavy machinery."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tools.cli import COMMANDS

HEAVY = ("numba", "pyspark", "pyarrow", "numpy", "pandas")

PROBE = """
import sys
from tools.cli import main
try:
    main({argv!r})
except SystemExit as exc:
    code = exc.code
else:
    code = 0
heavy = sorted(m for m in {heavy!r} if m in sys.modules)
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
sys.exit(code or 0)
"""


def _help(argv: list[str]) -> subprocess.CompletedProcess:
    code = PROBE.format(argv=argv, heavy=HEAVY)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("argv", [[], *([name] for name in sorted(COMMANDS)),
                                  ["cache", "info"], ["cache", "clear"]],
                         ids=lambda a: " ".join(a) or "root")
def test_help_is_light(argv):
    proc = _help([*argv, "--help"])
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    assert "HEAVY=\n" in proc.stderr, f"--help imported heavy modules: {proc.stderr}"


def test_root_help_lists_every_command():
    proc = _help(["--help"])
    for name in COMMANDS:
        assert f"  {name} " in proc.stdout


def test_unknown_command_is_a_usage_error():
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "frobnicate"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "No such command" in proc.stderr
    assert "Traceback" not in proc.stderr
