"""`oopscope warmup`: make the first `oopscope run` as quick as the next ones (`.ci/install`).

A first run pays three things once: the low level's Numba kernels are compiled (seconds to
tens of seconds per query; cached on disk after), the driver JVM is launched through
spark-submit (its `java` command is remembered after, `highlevel.jvm`), and the JVM has no
class-data archive of Spark's classes yet (`highlevel.jvmcache`). The warm-up pays them on a
tiny generated capture, in three processes that run queries as `oopscope run` does:

1. every QUERY over the capture, in one process: its kernels are compiled and cached, and
   the driver JVM, holding the archive's lock, writes the archive as it exits (the process
   waits for that and renames it into place);
2. the first QUERY again, in a new process: its JVM is launched with the options later runs
   give it (the archive mapped), so that launch is remembered under the key they look up;
   the JVM's memory map tells whether the archive is really mapped;
3. the first QUERY paced, in a new process: paced and live runs and `serve` launch their
   JVM with other options (they last: the optimising compiler is kept), so their launch is
   remembered under a key of its own.

Each process is `main` below (`python -c` with this package first on sys.path, in the
temporary directory of the capture).
"""

from __future__ import annotations

import click

#: the README's queries on one link: the quick start's, the thesis' Q8-1 and the flow records
DEFAULT_QUERIES = ("top_talkers", "q8_1", "netflow")
#: packets of the tiny capture (every code path of a run, in well under a second of data work)
TINY_PACKETS = 3000
#: the paced run's speed: the tiny capture's 150 s in a fraction of a second
PACED_SPEED = 1000.0


@click.command()
@click.option("--query", "queries", multiple=True, default=DEFAULT_QUERIES, show_default=True,
              metavar="QUERY", help="A query to compile and run once (repeatable; a path or a "
                                    "shipped query name).")
def warmup(queries: tuple[str, ...]) -> None:
    """Prepare the caches that make the first `oopscope run` as quick as the next ones.

    Runs each QUERY over a tiny generated capture (its low-level kernels are compiled and
    cached), lets the driver JVM write the class-data archive of Spark's classes as it exits,
    then starts the JVM once more as `oopscope run` does: that launch is remembered and the
    archive checked. `.ci/install` runs it; the caches are under ~/.cache/oopscope
    (`oopscope cache info`).
    """
    import os
    import tempfile
    import time
    from pathlib import Path

    from highlevel import jvmcache
    from highlevel.errors import CacheError, HighLevelError

    if jvmcache.java_command() is None:
        where = f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java" \
            if os.environ.get("JAVA_HOME") else "no java on the PATH (JAVA_HOME is not set)"
        raise HighLevelError(f"{where}: Spark 4 needs Java 17 or later; nothing was warmed up")
    from queries.explain import find_query_file

    for query in queries:
        if not find_query_file(query).is_file():
            raise click.BadParameter(f"{query!r}: no such query file (nor a shipped query of "
                                     f"that name)", param_hint="--query")
    cache, why = jvmcache.open_cache_dir()
    if why is not None:
        raise CacheError(f"cache directory {cache} {why}: nothing was warmed up (runs go "
                         f"without the caches; `chmod 700 {cache}` or remove it)")
    steps = Steps(len(queries) + 3)
    with tempfile.TemporaryDirectory(prefix="oopscope-warmup-") as work:
        from tools.gen.traffic import TrafficConfig, generate

        pcap = Path(work) / "tiny.pcap"
        with steps.step(f"a tiny capture of {TINY_PACKETS:,} packets"):
            generate(TrafficConfig(packets=TINY_PACKETS, duration_ns=150 * 10**9, groups=64),
                     pcap)
        started = time.perf_counter()
        first = _child(Path(work), pcap, queries, steps)
        ran = [q for q in queries if q not in first["errors"]]
        dumped = "the driver JVM wrote the class-data archive" \
            if first["options"].startswith("-XX:ArchiveClassesAtExit") else \
            "the class-data archive was there" if first["options"] else \
            "no class-data archive"
        click.echo(f"oopscope warmup: {', '.join(ran) or 'no query'} compiled and run in "
                   f"{time.perf_counter() - started:.1f} s; {dumped}")
        failed = next(iter(first["errors"].items()), None)
        if not ran:
            assert failed is not None             # a query that did not run left its error
            raise HighLevelError(f"the warm-up could not run {failed[0]}: {failed[1]}")
        # another process may be writing the archive (a concurrent warm-up or first run)
        if not jvmcache.wait_unlocked(cache):
            click.echo("oopscope warmup: another process is still writing the class-data "
                       "archive", err=True)
        started = time.perf_counter()
        steps.number = 1 + len(queries)
        check = _child(Path(work), pcap, ran[:1], steps, check=True)
        if check["errors"]:
            raise HighLevelError(f"the warm-up's check run failed: {check['errors'][ran[0]]}")
        click.echo(f"oopscope warmup: check run in {time.perf_counter() - started:.1f} s; "
                   f"{_archive_state(check)}; {_launch_state(check)}")
        # paced and live runs and `serve` start their JVM with other options (the optimising
        # compiler kept: they last): their launch is remembered too, or their first start
        # pays spark-submit's (seconds more before any window can be written)
        started = time.perf_counter()
        paced = _child(Path(work), pcap, ran[:1], steps, paced=True)
        if paced["errors"]:
            raise HighLevelError(f"the warm-up's paced run failed: {paced['errors'][ran[0]]}")
    click.echo(f"oopscope warmup: paced run in {time.perf_counter() - started:.1f} s; "
               f"{_archive_state(paced)}; {_launch_state(paced)}")
    if failed is not None:
        more = len(first["errors"]) - 1
        raise HighLevelError(f"the warm-up could not run {failed[0]}: {failed[1]}"
                             + (f" (and {more} more queries)" if more else ""))


def _archive_state(check: dict) -> str:
    import os

    from highlevel import jvmcache

    if not jvmcache.cds_enabled():
        return "class-data sharing is off (OOPSCOPE_SPARK_CDS=0)"
    if check["mapped"]:
        try:
            size = f" ({os.stat(check['mapped']).st_size / 1e6:.0f} MB)"
        except OSError:
            size = ""
        return f"the driver JVM maps {check['mapped']}{size}"
    return f"the driver JVM maps no class-data archive (its options: " \
           f"{check['options'] or 'none'})"


def _launch_state(check: dict) -> str:
    if check["launch"] == "remembered":
        return "launched from the remembered java command"
    if check["remembered"]:
        return "its java command is remembered for the next runs"
    return "its launch is not remembered (OOPSCOPE_SPARK_LAUNCH_CACHE=0 or a spark-env.sh)"


class Steps:
    """The warm-up's progress on stderr: a line as each step starts and one with its time as
    it ends (a step takes seconds to a minute: kernels compiled, a JVM started), numbered
    out of `total`. The child process's steps print their lines themselves (`main`)."""

    def __init__(self, total: int, number: int = 0):
        self.total, self.number = total, number

    def start(self, what: str) -> str:
        self.number += 1
        label = f"oopscope warmup: step {self.number}/{self.total}: {what}"
        _err(f"{label} ...")
        return label

    def step(self, what: str):
        """`with steps.step(what):` the step's two lines around the block."""
        import contextlib
        import time

        @contextlib.contextmanager
        def timed():
            label = self.start(what)
            started = time.perf_counter()
            yield
            _err(f"{label}: done in {time.perf_counter() - started:.1f} s")

        return timed()


def _err(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def _child(work, pcap, queries, steps: Steps | None = None, check: bool = False,
           paced: bool = False) -> dict:
    """Run `queries` over `pcap` in a new process (`main`); returns what it reported.
    `steps`: the child prints a step line per query, numbered on from there; `check`: the
    run is the check run of the JVM's launch; `paced`: the runs are paced (`PACED_SPEED`),
    their JVM launched as paced runs and `serve` launch theirs."""
    import json
    import logging
    import os
    import subprocess
    import sys
    from pathlib import Path

    import tools
    from highlevel.errors import HighLevelError

    root = Path(tools.__file__).resolve().parents[1]
    result = Path(work) / "result.json"
    result.unlink(missing_ok=True)
    # this package first, as the parent imports it (a source tree or the installed one);
    # the temporary directory as the working directory, as nothing of Spark's belongs in
    # the caller's
    code = (f"import sys; sys.path.insert(0, {str(root)!r}); "
            f"from tools.commands.warmup import main; main()")
    level = logging.getLogger().getEffectiveLevel()
    progress = [] if steps is None else ["--steps", f"{steps.number}/{steps.total}"]
    proc = subprocess.run([sys.executable, "-c", code, str(pcap), str(result), *queries,
                           "--log-level", str(level), *progress,
                           *(["--check"] if check else []), *(["--paced"] if paced else [])],
                          cwd=work, stdout=subprocess.DEVNULL, env=dict(os.environ),
                          check=False)
    if steps is not None:
        steps.number += len(queries)
    if proc.returncode != 0 or not result.is_file():
        raise HighLevelError(f"the warm-up's run of {', '.join(queries)} failed (exit "
                             f"{proc.returncode}; see above)")
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> None:
    """One warm-up process: PCAP RESULT QUERY...: run each query over PCAP (its rows to our
    stdout), write what happened to RESULT (JSON). At exit a JVM that writes the class-data
    archive is waited for (`highlevel.jvmcache.finish_dump`)."""
    import argparse
    import json
    import logging
    import os
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="tools.commands.warmup")
    parser.add_argument("pcap")
    parser.add_argument("result")
    parser.add_argument("queries", nargs="+")
    parser.add_argument("--log-level", type=int, default=logging.WARNING)
    parser.add_argument("--steps", default=None, help="N/TOTAL: the steps done before ours")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--paced", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="oopscope: %(levelname)s: %(message)s",
                        stream=sys.stderr)
    # what `tools.cli.main` does before a run, so the process imports what a run imports
    sys.modules.setdefault("scipy.linalg", None)  # type: ignore[arg-type]  # None: never imported
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    steps = None
    if args.steps is not None:
        done, total = (int(n) for n in args.steps.split("/"))
        steps = Steps(total, done)
    out = _tiny_runs(args.pcap, args.queries, steps, args.check, args.paced)
    Path(args.result).write_text(json.dumps(out))
    if steps is not None and str(out["options"]).startswith("-XX:ArchiveClassesAtExit"):
        # the JVM's exit takes seconds more: say why the step is not over yet
        _err("oopscope warmup: the driver JVM writes its class-data archive as it exits ...")


def _tiny_runs(pcap: str, queries: list[str], steps: Steps | None = None,
               check: bool = False, paced: bool = False) -> dict:
    import time

    from common.errors import OopscopeError
    from highlevel import jvm, jvmcache
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    times, errors = {}, {}
    for i, query in enumerate(queries):
        what = (f"{query} paced, in a new process: the JVM launched as paced runs and "
                f"`serve` launch it" if paced else
                f"{query} again in a new process: the JVM launched as `oopscope run` launches "
                f"it, the class-data archive mapped" if check else
                f"{query} over it: its kernels compiled and cached"
                + ("; Spark started, its class-data archive written at exit" if i == 0 else ""))
        label = steps.start(what) if steps is not None else None
        started = time.perf_counter()
        try:
            links = tuple((name, pcap) for name in _links_of(query))
            run(RunConfig(query_file=query, links=links, progress=False, keep_results=False,
                          speed=PACED_SPEED if paced else None))
        except OopscopeError as exc:
            errors[query] = str(exc)
            if label is not None:
                _err(f"{label}: failed after {time.perf_counter() - started:.1f} s")
            continue
        times[query] = round(time.perf_counter() - started, 2)
        if label is not None:
            _err(f"{label}: done in {times[query]:.1f} s")
    out = {"times": times, "errors": errors, "options": jvmcache.class_data_options(),
           "mapped": None, "launch": None, "remembered": False}
    from pyspark import SparkContext

    gateway = SparkContext._gateway          # the running JVM's process
    if gateway is not None and getattr(gateway, "proc", None) is not None:
        out["mapped"] = jvmcache.mapped_archive(gateway.proc.pid)
    if jvm.last_launch is not None:
        out["launch"] = jvm.last_launch[0]
        out["remembered"] = jvm.remembered(jvm.last_launch[1]) is not None
    return out


def _links_of(query: str) -> list[str]:
    """The links a query file reads (`main` when it names none)."""
    from queries.explain import find_query_file, mentioned_links
    from queries.parser import parse

    path = find_query_file(query)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ["main"]             # the run says what is wrong with it
    return mentioned_links(parse(text, path=str(path))) or ["main"]
