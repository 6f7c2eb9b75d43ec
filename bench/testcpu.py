"""Where the test suite's CPU goes: each test's CPU time, its subprocesses and JVMs included.

    python3 -m pytest -q -n 4 -p bench.testcpu          # as root: records ~/.cache/oopscope/testcpu
    python -m bench.testcpu [--dir DIR] [--top 30]   # the report

The suite on 2 cores is bound by CPU, not by its waits (the machine is busy the whole run),
so its wall time is its CPU time over the cores: that is what to cut, test by test. Most of
it is spent outside the test's own process (an `oopscope run` or `serve` subprocess and its
Spark JVM, a JVM that outlives the process that started it), where neither pytest's
durations nor `getrusage` see it. As a pytest plugin, this module moves each pytest-xdist
worker into a cgroup (v1 `cpuacct`, under /sys/fs/cgroup/cpuacct/oopscope-testcpu/; root
only), which every process the worker starts inherits, and writes each test's CPU seconds
(the cgroup's usage before and after it, its fixtures' setup included) and wall seconds to
one file per worker. The report sums them per test module and lists the costliest tests,
with the bands of the distribution. Not a test; without the cgroup it records nothing and
says so once.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from pathlib import Path

import click
import pytest

log = logging.getLogger(__name__)

CGROUP = Path("/sys/fs/cgroup/cpuacct/oopscope-testcpu")
# private to the user (root), never a fixed name in the shared /tmp
DEFAULT_DIR = Path.home() / ".cache" / "oopscope" / "testcpu"
BANDS = (1, 5, 15, 30)

_group: Path | None = None


def _usage() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


def pytest_configure(config) -> None:
    """In a worker: its own cgroup, which its subprocesses inherit."""
    global _group
    if not hasattr(config, "workerinput"):
        # the controller, before its workers start: a report is of this run only
        for old in DEFAULT_DIR.glob("*.tsv"):
            old.unlink()
        return
    group = CGROUP / f"w{os.getpid()}"
    try:
        group.mkdir(parents=True, exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        log.warning("bench.testcpu: no cgroup at %s (%s): nothing recorded", group,
                    exc.strerror or exc)
        return
    _group = group
    DEFAULT_DIR.mkdir(parents=True, exist_ok=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _group is None:
        yield
        return
    cpu, wall = _usage(), time.monotonic()
    yield
    line = f"{item.nodeid}\t{_usage() - cpu:.2f}\t{time.monotonic() - wall:.2f}\n"
    with open(DEFAULT_DIR / f"{os.getpid()}.tsv", "a", encoding="utf-8") as f:
        f.write(line)


def read(directory: Path) -> list[tuple[str, float, float]]:
    """(test id, CPU s, wall s) of every test recorded in `directory`."""
    rows = []
    for path in sorted(directory.glob("*.tsv")):
        for line in path.read_text(encoding="utf-8").splitlines():
            name, cpu, wall = line.split("\t")
            rows.append((name, float(cpu), float(wall)))
    return rows


@click.command()
@click.option("--dir", "directory", type=click.Path(path_type=Path), default=DEFAULT_DIR,
              show_default=True)
@click.option("--top", type=int, default=30, show_default=True)
def main(directory: Path, top: int) -> None:
    """The report of a recorded run: per module and per test, CPU and wall seconds."""
    rows = read(directory)
    if not rows:
        raise click.ClickException(f"no test recorded in {directory}")
    cpu = sum(c for _, c, _ in rows)
    click.echo(f"{len(rows)} tests, {cpu:.0f} CPU s ({cpu / 60:.1f} CPU min; on 2 cores at "
               f"least {cpu / 120:.1f} min of wall time)")
    edges = (0, *BANDS, float("inf"))
    for lo, hi in zip(edges, edges[1:]):
        band = [c for _, c, _ in rows if lo <= c < hi]
        click.echo(f"  tests of {lo}-{hi} CPU s: {len(band):5d}, {sum(band):7.0f} CPU s "
                   f"({sum(band) / cpu:.0%})")
    modules: dict[str, float] = collections.defaultdict(float)
    walls: dict[str, float] = collections.defaultdict(float)
    for name, c, w in rows:
        modules[name.split("::")[0]] += c
        walls[name.split("::")[0]] += w
    click.echo("\nCPU s   wall s  module")
    for name, c in sorted(modules.items(), key=lambda kv: -kv[1])[:top]:
        click.echo(f"{c:7.1f} {walls[name]:7.1f}  {name}")
    click.echo("\nCPU s   wall s  test")
    for name, c, w in sorted(rows, key=lambda r: -r[1])[:top]:
        click.echo(f"{c:7.1f} {w:7.1f}  {name}")


if __name__ == "__main__":
    main()
