"""The Python interpreter Spark's Python workers run, and a cluster's check at start that its
executors can import oopscope.

pyspark starts its Python workers with `PYSPARK_PYTHON`, else `python3` from the PATH: for an
oopscope installed in a virtualenv and run as `venv/bin/oopscope` (pipx, a systemd unit) that
is another interpreter, without the package, and every stage that runs Python on the
executors (string predicates, outer joins, user functions) died with `No module named
'queries'`. So the workers run the interpreter oopscope runs in, unless the operator said
otherwise, in Spark's own order: `spark.pyspark.python` (the caller's settings or
`spark-defaults.conf`) first, then `PYSPARK_PYTHON`, then `sys.executable`.

On a cluster that interpreter is a path on the worker hosts, which may lack it or the package;
`check_executors` runs a tiny job there at start and says in one line what to do
(docs/deployment.md).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
import uuid
from contextlib import contextmanager

from common import settings
from highlevel.errors import WorkerPythonError

log = logging.getLogger(__name__)

#: the modules the executors' Python must import: those of the functions the stages ship to
#: it (string and user functions, joins, selections), which import the rest of oopscope and
#: numpy, pyarrow and Numba; half a second
MODULES = ("highlevel.udfcolumns", "highlevel.strings", "highlevel.join", "highlevel.select")
#: where the error sends the operator
ADVICE = ("install oopscope on the workers or ship its environment (spark.archives, "
          "spark.pyspark.python: docs/deployment.md)")


def default_interpreter() -> None:
    """Before the driver JVM starts: the workers and the driver's own Python processes run
    this interpreter unless `PYSPARK_PYTHON` / `PYSPARK_DRIVER_PYTHON` say otherwise (pyspark
    reads the first when it makes its context, the JVM reads both at launch)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def apply_conf(context) -> str:
    """After the context is made: `spark.pyspark.python`, where set (the caller's settings,
    `spark-defaults.conf`), wins over the environment, as it does for spark-submit; pyspark
    itself reads only the environment. Returns the interpreter the workers run."""
    explicit = context.getConf().get("spark.pyspark.python", None)
    if explicit:
        context.pythonExec = explicit
    log.debug("Python workers run %s", context.pythonExec)
    return context.pythonExec


def _probe(modules):
    """The task every executor runs: which interpreter, and whether it imports `modules`.
    Made inside `check_executors` so that cloudpickle ships it by value: pickled by
    reference it would need `highlevel` on the executor to be unpickled at all."""
    def probe(_rows):
        import importlib
        import socket
        import sys as worker_sys

        missing = ""
        path = ""
        for name in modules:
            try:
                module = importlib.import_module(name)
                path = path or str(getattr(module, "__file__", "") or "")
            except Exception as exc:  # noqa: BLE001 - reported, whatever it is
                missing = f"{type(exc).__name__}: {exc}"
                break
        try:
            from importlib.metadata import version
            release = version("oopscope")
        except Exception:  # noqa: BLE001 - a source tree on the path: no metadata
            release = ""
        yield (socket.gethostname(), worker_sys.executable, missing, path, release)
    return probe


def check_executors(session, master: str, timeout_s: float | None = None) -> None:
    """Run a tiny job on the cluster's executors: each imports oopscope's packages with the
    workers' interpreter. Raises WorkerPythonError, one line, when one cannot, when the
    workers cannot start Python at all, or when no executor answers within `timeout_s`
    (default OOPSCOPE_EXECUTOR_CHECK_TIMEOUT; 0 checks nothing)."""
    timeout_s = settings.executor_check_timeout() if timeout_s is None else timeout_s
    if timeout_s <= 0:
        return
    context = session.sparkContext
    python = context.pythonExec
    tag = f"oopscope-executor-check-{uuid.uuid4().hex[:8]}"
    expired = threading.Event()

    def cancel() -> None:
        expired.set()
        context.cancelJobsWithTag(tag)

    parts = max(2, context.defaultParallelism)
    timer = threading.Timer(timeout_s, cancel)
    started = time.monotonic()
    context.addJobTag(tag)
    timer.start()
    try:
        with _quiet(context, _TASK_LOGGERS):
            rows = context.parallelize(range(parts), parts).mapPartitions(
                _probe(MODULES)).collect()
    except Exception as exc:  # noqa: BLE001 - py4j's error of the failed job, made one line
        if expired.is_set():
            raise WorkerPythonError(
                f"the executors of {master} did not run the start check within "
                f"{timeout_s:.0f} s: does the cluster have a live worker with free cores? "
                f"(OOPSCOPE_EXECUTOR_CHECK_TIMEOUT sets the wait)") from None
        raise WorkerPythonError(
            f"the executors of {master} cannot run Python {python}: {root_cause(exc)}; "
            f"{ADVICE}") from None
    finally:
        timer.cancel()
        context.removeJobTag(tag)
    bad = [r for r in rows if r[2]]
    if bad:
        host, executable, missing, _, _ = bad[0]
        raise WorkerPythonError(
            f"the executors of {master} cannot import oopscope: Python {executable} on "
            f"{host}: {missing}; {ADVICE}")
    mine = _release()
    hosts = sorted({r[0] for r in rows})
    for host, _, _, _, release in rows:
        if mine and release and release != mine:
            log.warning("executor %s runs oopscope %s, the driver %s: install the same "
                        "release everywhere", host, release, mine)
            break
    log.info("executors import oopscope (%s, %s on %s) in %.1f s", rows[0][4] or "source",
             rows[0][3], ", ".join(hosts), time.monotonic() - started)


#: the driver's loggers that print a failed task's stack trace, on every attempt
_TASK_LOGGERS = ("org.apache.spark.scheduler.TaskSetManager",
                 "org.apache.spark.scheduler.TaskSchedulerImpl")


@contextmanager
def _quiet(context, names):
    """The driver JVM's loggers `names` off meanwhile: the check's error says it in a line."""
    jvm = context._jvm  # noqa: SLF001 - pyspark's gateway view
    try:
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        manager = jvm.org.apache.logging.log4j.LogManager
        levels = {n: manager.getLogger(n).getLevel() for n in names}
        for name in names:
            configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
    except Exception as exc:  # noqa: BLE001 - another logging backend: the usual output
        log.debug("task failure logs kept: %s", exc)
        yield
        return
    try:
        yield
    finally:
        for name, level in levels.items():
            configurator.setLevel(name, level)


def _release() -> str:
    try:
        from importlib.metadata import version
        return version("oopscope")
    except Exception:  # noqa: BLE001 - running from a source tree
        return ""


#: the lines of a Java or Python stack trace that say what went wrong
_CAUSE = re.compile(r"^(?:Caused by: )?([\w.$]+(?:Error|Exception)): (.+)$")


def root_cause(exc: BaseException) -> str:
    """The innermost `SomeError: message` line of a failed job's text (py4j's error holds
    the driver's and every executor's stack trace), shortened."""
    found = ""
    for line in str(exc).splitlines():
        m = _CAUSE.match(line.strip())
        if m and "Py4JJavaError" not in m.group(1) and "SparkException" not in m.group(1):
            found = f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2)}"
    if not found:
        found = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return found[:300]
