"""The one SparkSession of a process: local[*] by default, quiet logs, no UI, Arrow on, Python
workers on this interpreter."""

from __future__ import annotations

import logging
import os
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.settings import spark_master, spark_quick_jvm, spark_quick_jvm_always

# the class-data archive's options live with the cache directory that holds it
from highlevel.jvmcache import class_data_options, config_file

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_SESSION: Any = None
_MASTER: str | None = None
_PENDING = None         # ((settings, nice), highlevel.jvm.Launch) started by launch_jvm
_LOG4J2_PATH: Path | None = None
#: a quick-starting driver JVM (`quick_jvm_options`): C1 only, one compiler thread, serial GC
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC"

# Spark's default log4j2 profile prints INFO lines (and a banner about the default level) on
# the console before any setLogLevel call can run; a config file given to the driver JVM at
# launch is the only way to keep start-up quiet.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.spark.name = org.apache.spark
logger.spark.level = warn
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
logger.parquet.name = org.apache.parquet
logger.parquet.level = error
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeio.level = error
logger.shutdown.name = org.apache.spark.util.ShutdownHookManager
logger.shutdown.level = error
logger.checkpoint.name = org.apache.spark.sql.execution.streaming.checkpointing
logger.checkpoint.level = error
logger.trigger.name = org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor
logger.trigger.level = error
logger.dag.name = org.apache.spark.scheduler.DAGScheduler
logger.dag.level = error
# a standalone cluster's executors leaving as the session stops: not news to the user
logger.standalone.name = org.apache.spark.scheduler.cluster.StandaloneSchedulerBackend$StandaloneDriverEndpoint
logger.standalone.level = error
"""

DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # GSQL's 64-bit integer arithmetic wraps, as the low level, numpy and the reference
    # evaluator do; Spark 4's ANSI mode would stop the stage on an overflow instead
    "spark.sql.ansi.enabled": "false",
    # small state and partial files: adaptive re-planning only costs time per micro-batch
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.streaming.metricsEnabled": "false",
    "spark.sql.debug.maxToStringFields": "1000",   # wide partial rows: no truncation warning
    "spark.sql.parquet.compression.codec": "snappy",
    # Closed rows reach the driver as Arrow, one task result per input split held in the
    # driver heap: smaller splits bound that memory (4M flow records in 2 splits of 128 MB
    # ran a 1 GB heap out of memory)
    "spark.sql.files.maxPartitionBytes": "32m",
    # The file stream source keeps its own compacted log; keep few to bound start-up.
    "spark.sql.streaming.minBatchesToRetain": "20",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
}


def log4j2_config() -> Path:
    """Path of the quiet log4j2 profile: in the private cache directory (the same path every
    run, so the JVM's launch stays remembered), else a file of this process's own
    (`highlevel.jvmcache.config_file`). One path per process: the launch and the session
    compare their settings."""
    global _LOG4J2_PATH
    if _LOG4J2_PATH is None:
        _LOG4J2_PATH = config_file("log4j2", ".properties", _LOG4J2)
    return _LOG4J2_PATH


def quick_jvm_options(master: str) -> str:
    """Driver JVM options for a local master: the C1 compiler only, on one thread, and the
    serial collector.
    With local[*] the driver runs the executors' tasks too, on the cores the low level uses;
    tiered compilation's C2 threads and the parallel collector took ~5 CPU-seconds more of
    them during start-up and the first jobs (12.7 against 7.9 on 2 cores), and a 5M-packet
    netflow run took 17.9 s instead of 12.6 s; a 50M-packet run is no slower (62.5 s against
    64.9 s; tools/bench_netflow.py). One compiler thread instead of the default's several:
    the session started in 2.2 s instead of 2.45 s with 0.2 s less CPU, and a 5M-packet
    netflow run took 4.65 s instead of 4.8 s. Paced and live runs, which last, keep the
    defaults (C2 compiles the hot paths of a steady state); so does
    OOPSCOPE_SPARK_QUICK_JVM=0; with OOPSCOPE_SPARK_QUICK_JVM=always they run quick too
    (`_settings`)."""
    if not spark_quick_jvm():
        return ""
    if not master.startswith("local"):
        return ""
    return QUICK_JVM_OPTIONS


def lower_priority(nice: int) -> None:
    """Raise the calling thread's niceness to `nice` (Linux schedules threads one by one, and
    a thread's children inherit it); never lowers it."""
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except OSError as exc:          # not permitted, or no per-thread priorities here
        log.debug("thread priority unchanged: %s", exc)


def _settings(master: str, app_name: str, driver_memory: str, shuffle_partitions: int | None,
              conf: dict[str, str] | None, quick_jvm: bool) -> dict[str, str]:
    """The session's Spark settings (the driver JVM reads them at launch)."""
    if shuffle_partitions is None:
        # micro-batches of partial rows are small: one shuffle partition per core (at most 4)
        # measured ~25% less time per batch than 4 partitions on 2 cores
        shuffle_partitions = max(1, min(4, os.cpu_count() or 1))
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j2_config()}"
    quick = quick_jvm or spark_quick_jvm_always()
    driver_opts = f"{java_opts} {class_data_options()} {quick_jvm_options(master) if quick else ''}".strip()
    settings = {"spark.master": master, "spark.app.name": app_name,
                "spark.driver.memory": driver_memory,
                "spark.driver.extraJavaOptions": driver_opts,
                "spark.executor.extraJavaOptions": java_opts, **DEFAULTS,
                "spark.sql.shuffle.partitions": str(shuffle_partitions),
                "spark.default.parallelism": str(shuffle_partitions)}
    if not master.startswith("local"):
        # executors on other hosts must reach the driver; loopback only suits local mode
        # and the loopback test cluster, so keep it only when the master is on loopback.
        if "127.0.0.1" not in master and "localhost" not in master:
            settings.pop("spark.driver.bindAddress")
            settings.pop("spark.driver.host")
    settings.update(conf or {})
    return settings


def _master(master: str | None) -> str:
    master = master or spark_master() or "local[*]"
    if master.startswith("local") or "127.0.0.1" in master or "localhost" in master:
        # otherwise Spark warns that the host name resolves to loopback and picks eth0
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return master


def _launch(settings: dict[str, str], nice: int):
    """Start the driver JVM; one that writes the class-data archive holds its lock until it
    has exited (`highlevel.jvmcache`)."""
    from highlevel import jvmcache
    from highlevel.jvm import Launch
    from highlevel.workerpython import default_interpreter

    default_interpreter()           # the JVM reads PYSPARK_* at launch

    launch = Launch(list(settings.items()), nice, keep_fds=jvmcache.dump_fds())
    jvmcache.dump_launched(launch)
    return launch


def launch_jvm(master: str | None = None, *, app_name: str = "oopscope",
               driver_memory: str = "3g", shuffle_partitions: int | None = None,
               conf: dict[str, str] | None = None, quick_jvm: bool = True,
               nice: int = 0) -> None:
    """Start the driver JVM of a later `get_session` with the same arguments now, in the
    calling thread, and return at once (a few milliseconds: `tools.pipeline.runner` calls it before
    the run's heavy imports, which would otherwise delay a starting thread). Nothing when a
    session or a JVM is up already."""
    from highlevel.jvm import gateway_running

    global _PENDING
    with _LOCK:
        if _SESSION is not None or _PENDING is not None or gateway_running():
            return
        master = _master(master)
        settings = _settings(master, app_name, driver_memory, shuffle_partitions, conf,
                             quick_jvm)
        nice = nice if master.startswith("local") else 0
        _PENDING = ((settings, nice), _launch(settings, nice))


def get_session(master: str | None = None, *, app_name: str = "oopscope",
                driver_memory: str = "3g", shuffle_partitions: int | None = None,
                conf: dict[str, str] | None = None, quick_jvm: bool = True, nice: int = 0):
    """The process-wide SparkSession, created on first call and reused afterwards.

    `master` is `local[*]` by default, or any Spark master URL (`spark://host:7077`). Asking
    for a different master than the running session's stops it and starts a new one.
    `quick_jvm`: a new local driver JVM starts with `quick_jvm_options` (bounded runs);
    False keeps the JVM's tiered compilation (paced and live runs, which last).
    `nice`: a new local driver JVM runs at this niceness (`tools.pipeline.runner`: bounded replays,
    where the low level's threads come first while both run).
    Spark's Python workers run this interpreter unless `spark.pyspark.python` or
    `PYSPARK_PYTHON` name another (`highlevel.workerpython`); on a cluster, the executors
    are checked to import oopscope first (WorkerPythonError, one line, if not).
    """
    global _SESSION, _MASTER, _PENDING
    from highlevel.jvm import gateway_running

    master = _master(master)
    with _LOCK:
        if _SESSION is not None and _MASTER == master and not _stopped(_SESSION):
            return _SESSION
        if _SESSION is not None:
            stop_session()
        # pyspark warns about pandas >= 3 on first Arrow use; we only use Arrow tables
        warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
        settings = _settings(master, app_name, driver_memory, shuffle_partitions, conf,
                             quick_jvm)
        nice = nice if master.startswith("local") else 0
        pending, _PENDING = _PENDING, None
        if pending is not None and pending[0] != (settings, nice):
            pending[1].cancel()              # started for other settings
            pending = None
        if not gateway_running():
            # the JVM reads its options at launch: the builder's settings, as getOrCreate
            # would pass them; it starts before pyspark is imported
            launch = pending[1] if pending is not None else _launch(settings, nice)
            launch.connect()
        from pyspark import SparkConf, SparkContext
        from pyspark.sql import SparkSession

        from highlevel.workerpython import apply_conf, check_executors, default_interpreter

        default_interpreter()       # pyspark's context reads PYSPARK_PYTHON when made

        builder = SparkSession.builder
        for key, value in settings.items():
            builder = builder.config(key, value)
        # the context first, as the builder makes it; then the session, which reuses it
        context = SparkContext.getOrCreate(SparkConf().setAll(list(settings.items())))
        with _no_extension_providers(context, settings):
            session = builder.getOrCreate()
        _restore_logging(session)
        session.sparkContext.setLogLevel("WARN")
        apply_conf(session.sparkContext)
        log.info("Spark %s session on %s", session.version, master)
        if not master.startswith("local"):
            try:
                check_executors(session, master)
            except BaseException:
                _quiet_stop(session)        # gives the cluster's cores back
                raise
        _SESSION, _MASTER = session, master
        return session


@contextmanager
def _no_extension_providers(context, settings: dict[str, str]):
    """While this thread makes the SparkSession: Spark finds no session extension providers.

    A new session loads every `SparkSessionExtensionsProvider` on the classpath
    (`java.util.ServiceLoader` through the thread's context class loader). pyspark's jars
    hold one, Spark ML's function registration, which starts Scala's runtime reflection:
    0.55 of the 0.6 s the session's constructor took, on the critical path of every run
    (the session was up in 1.5 s instead of 2.1 s; the first streaming batch then came
    ~0.05 s later, as part of that start moved there). oopscope's session is its own and
    never calls Spark ML. So the JVM thread that serves this Python thread (py4j pins one to
    each) gets the platform class loader as its context loader, which sees no Spark jar,
    and py4j finds classes through its own loader meanwhile; both are set back after. A
    session asked for explicit extensions (`spark.sql.extensions`), or a gateway not
    pinned to threads, is made as usual."""
    from py4j.clientserver import ClientServer

    jvm = context._jvm  # noqa: SLF001 - pyspark's gateway view
    if "spark.sql.extensions" in settings or not isinstance(context._gateway, ClientServer):
        yield
        return
    try:
        thread = jvm.java.lang.Thread.currentThread()
        loader = thread.getContextClassLoader()
        util = jvm.py4j.reflection.ReflectionUtil
        strategy = util.getClassLoadingStrategy()
        util.setClassLoadingStrategy(jvm.py4j.reflection.RootClassLoadingStrategy())
    except Exception as exc:  # noqa: BLE001 - an older py4j: the usual session
        log.debug("session extension providers kept: %s", exc)
        yield
        return
    try:
        thread.setContextClassLoader(jvm.java.lang.ClassLoader.getPlatformClassLoader())
        yield
    finally:
        thread.setContextClassLoader(loader)
        util.setClassLoadingStrategy(strategy)


def _stopped(session) -> bool:
    sc = session.sparkContext
    return sc._jsc is None  # noqa: SLF001 - pyspark has no public "is stopped" probe


def _quiet_stop(session) -> None:
    """Stop `session` with its JVM's log off first: executors still registering or
    reporting while the context stops make Spark log errors and dropped messages (with
    stack traces) that say nothing to the user, and would follow the one line that says
    why the run stopped."""
    try:
        jvm = session.sparkContext._jvm
        log4j = jvm.org.apache.logging.log4j
        log4j.core.config.Configurator.setAllLevels(log4j.LogManager.ROOT_LOGGER_NAME,
                                                    log4j.Level.OFF)
    except Exception as exc:                  # a JVM already gone: stop says so itself
        log.debug("log level not set before stop: %s", exc)
    session.stop()


def _restore_logging(session) -> None:
    """The quiet profile's levels again, in a JVM a stopped session (`_quiet_stop`) left
    with every logger off."""
    session.sparkContext._jvm.org.apache.logging.log4j.LogManager.getContext(False) \
        .reconfigure()


def stop_session() -> None:
    """Stop the process-wide session (tests and the CLI call this at exit)."""
    global _SESSION, _MASTER, _PENDING
    if _SESSION is not None:
        _quiet_stop(_SESSION)
    if _PENDING is not None:
        _PENDING[1].cancel()
    _SESSION, _MASTER, _PENDING = None, None, None
