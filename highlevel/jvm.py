"""The driver JVM's launch: spark-submit's command, remembered, at our niceness.

pyspark starts the driver JVM through `bin/spark-submit`: two bash scripts, then Spark's
launcher (a JVM of its own) prints the real `java ...` command, which `spark-class` execs.
For the same arguments, environment and Spark installation that command is always the same,
so it is remembered: the first launch reads it back from the running JVM
(`/proc/<pid>/cmdline` and `environ`), and later launches exec `java` directly: a 5M-packet
netflow run starts measurably sooner (docs/performance.md). The
key covers the spark-submit arguments, the environment variables the scripts and
the launcher read, the Spark scripts and jars, the conf directory and the java binary; with
a `spark-env.sh` (a script that may read anything) nothing is remembered. A remembered
command that fails to start the JVM is forgotten and spark-submit runs instead. The entries
live in the private cache directory (`highlevel.jvmcache`): one that others could write to is
neither read nor written. OOPSCOPE_SPARK_LAUNCH_CACHE=0 always runs spark-submit.

The JVM is started here rather than by `pyspark.java_gateway.launch_gateway`, whose own
`preexec_fn` (ignoring SIGINT) replaces one given in its `popen_kwargs`: the niceness we
asked for was silently dropped. pyspark still makes the connection (ClientServer and the
imports), given the port and secret the JVM wrote.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from common import settings
from highlevel.sparkhome import spark_home

log = logging.getLogger(__name__)

#: environment variables the spark-submit scripts and Spark's launcher read (by prefix)
_ENV_PREFIXES = ("SPARK_", "PYSPARK_", "JAVA", "_JAVA", "JDK_", "HADOOP_", "YARN_",
                 "CLASSPATH", "PATH")
#: entries kept in the cache directory (a new key per Spark option set)
_KEEP = 32

#: how this process's driver JVM was launched ("remembered" or "spark-submit") and the key of
#: its launch (`oopscope warmup` reports them)
last_launch: tuple[str, str | None] | None = None

#: lines the JVM writes on stderr that say nothing to a user: Spark 4's launcher always adds
#: the incubating vector module, and the JVM warns about it at every start
_JVM_NOISE = ("WARNING: Using incubator modules",)


def _forward_jvm_stderr(fd: int) -> None:
    """Copy the driver JVM's stderr to ours, line by line, without the noise (until the JVM
    and every child holding the pipe have exited)."""
    import sys

    with os.fdopen(fd, "rb", buffering=0) as pipe:
        for line in iter(pipe.readline, b""):
            text = line.decode(errors="replace")
            if text.startswith(_JVM_NOISE):
                log.debug("JVM: %s", text.rstrip())
                continue
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass          # our stderr is gone (exit): keep draining so the JVM never blocks


def cache_dir(create: bool = True) -> Path | None:
    """The private cache directory (None: not to be used; `highlevel.jvmcache`)."""
    from highlevel.jvmcache import cache_dir as private_cache_dir

    return private_cache_dir(create)


def submit_command(home: str, conf: list[tuple[str, str]]) -> list[str]:
    """spark-submit's command line for the driver JVM, as pyspark builds it."""
    command = [os.path.join(home, "bin", "spark-submit")]
    for key, value in conf:
        command += ["--conf", f"{key}={value}"]
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell")
    if os.environ.get("SPARK_TESTING"):
        submit_args = "--conf spark.ui.enabled=false " + submit_args
    return command + shlex.split(submit_args)


def gateway_running() -> bool:
    """A driver JVM of this process is up already (or pyspark was told of one)."""
    import sys

    context = getattr(sys.modules.get("pyspark"), "SparkContext", None)
    return "PYSPARK_GATEWAY_PORT" in os.environ or (
        context is not None and context._gateway is not None)  # noqa: SLF001


def _stamp(path: Path) -> list:
    try:
        st = path.stat()
        return [str(path), st.st_mtime_ns, st.st_size]
    except OSError:
        return [str(path), None]


def launch_key(command: list[str], env: dict[str, str], home: str) -> str | None:
    """The key of a remembered launch, or None when it must not be remembered."""
    if not settings.spark_launch_cache():
        return None
    if any("ArchiveClassesAtExit" in arg for arg in command):
        return None                   # names this process's own dump: never seen again
    spark = Path(home)
    conf_dir = Path(env.get("SPARK_CONF_DIR") or spark / "conf")
    if (conf_dir / "spark-env.sh").exists():
        return None
    java = (Path(env["JAVA_HOME"]) / "bin" / "java") if env.get("JAVA_HOME") else \
        shutil.which("java", path=env.get("PATH"))
    material = {
        "command": command,
        "env": sorted((k, v) for k, v in env.items() if k.startswith(_ENV_PREFIXES)),
        "scripts": [_stamp(spark / "bin" / n) for n in
                    ("spark-submit", "spark-class", "load-spark-env.sh", "find-spark-home")],
        "jars": _stamp(spark / "jars"),
        "conf": sorted(_stamp(p) for p in conf_dir.iterdir()) if conf_dir.is_dir() else [],
        "java": _stamp(Path(os.path.realpath(java))) if java else None,
    }
    return hashlib.sha1(json.dumps(material, default=str).encode()).hexdigest()[:16]


def _entry(key: str) -> Path | None:
    folder = cache_dir(create=False)            # a look-up makes no directory
    return None if folder is None else folder / f"jvm-launch-{key}.json"


def remembered(key: str | None) -> dict | None:
    path = None if key is None else _entry(key)
    if path is None:
        return None
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not entry.get("argv"):
        return None
    return entry


def forget(key: str | None) -> None:
    path = None if key is None else _entry(key)
    if path is not None:
        path.unlink(missing_ok=True)


def remember(key: str | None, pid: int, env: dict[str, str]) -> None:
    """Store the JVM's own command and what the scripts added to its environment."""
    if key is None:
        return
    try:
        raw_argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")[:-1]
    except OSError as exc:                     # not Linux, or the JVM is gone already
        log.debug("launch not remembered: %s", exc)
        return
    argv = [a.decode() for a in raw_argv]
    if not argv or os.path.basename(argv[0]) != "java" or \
            "org.apache.spark.deploy.SparkSubmit" not in argv:
        log.debug("launch not remembered: pid %d runs %s", pid, argv[:1])
        return
    jvm_env = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    added = {k: v for k, v in jvm_env.items() if env.get(k) != v}
    removed = sorted(k for k in env if k not in jvm_env)
    from highlevel.jvmcache import write_private

    folder = cache_dir()
    if folder is None:
        return
    try:
        write_private(folder / f"jvm-launch-{key}.json",
                      json.dumps({"argv": argv, "env": added, "unset": removed}))
        entries = sorted(folder.glob("jvm-launch-*.json"), key=lambda p: p.stat().st_mtime)
        for old in entries[:-_KEEP]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("launch not remembered: %s", exc)


def _start(argv: list[str], env: dict[str, str], stderr_fd: int, nice: int,
           keep_fds: tuple[int, ...] = ()):
    def child() -> None:                 # in the child, before exec
        signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is ours to handle
        if nice > 0:
            os.nice(nice)                # every thread of the JVM inherits it

    # the JVM exits when its stdin closes: the pipe lives as long as the Popen object. Its
    # stdout goes to the stderr pipe too: the JVM outlives us by its shutdown (~0.4 s, seconds
    # when it writes a class-data archive), and holding our stdout it kept a reader of it
    # (`oopscope run ... | cmd`, a caller's capture) waiting for that exit
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stderr_fd, stderr=stderr_fd,
                            env=env, preexec_fn=child, pass_fds=keep_fds)


def _await_conn_info(proc, path: str) -> tuple[int, str] | None:
    """The gateway's port and secret once the JVM has written them; None if it exited."""
    from pyspark.serializers import UTF8Deserializer, read_int

    while proc.poll() is None and not os.path.isfile(path):
        time.sleep(0.01)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as info:
        return read_int(info), UTF8Deserializer().loads(info)


class Launch:
    """A driver JVM being started (remembered command, else spark-submit). The constructor
    returns once the process is started; `connect` waits for its gateway and makes it the
    gateway of the next SparkContext. `conf`: the Spark settings; `nice`: the JVM's
    niceness (every thread of it inherits it from the launch). Its stdout and stderr go
    through a pipe of ours (`_forward_jvm_stderr`), read from before the JVM starts, so
    start-up errors (no Java, a bad option) still show. `keep_fds`: descriptors the JVM
    inherits (the class-data archive's lock, held until the JVM is gone)."""

    def __init__(self, conf: list[tuple[str, str]], nice: int = 0,
                 keep_fds: tuple[int, ...] = ()):
        self.nice, self.keep_fds = nice, keep_fds
        home = spark_home()
        self.command = submit_command(home, conf)
        self.base = dict(os.environ, SPARK_CONNECT_MODE="0")
        self.key = launch_key(self.command, self.base, home)
        entry = remembered(self.key)
        self.attempts = ([("remembered", entry)] if entry else []) + [("spark-submit", None)]
        self.folder = tempfile.mkdtemp(prefix="oopscope-gw-")
        read_fd, self.write_fd = os.pipe()
        self.forward = threading.Thread(target=_forward_jvm_stderr, args=(read_fd,),
                                        name="oopscope-jvm-stderr", daemon=True)
        self.forward.start()
        self.proc: subprocess.Popen | None = None
        try:
            self._next()
        except BaseException:
            self.cancel()
            raise

    def _next(self) -> None:
        """Start the next attempt's process (self.proc, self.attempt, self.conn_info)."""
        from highlevel.errors import HighLevelError

        while self.attempts:
            self.attempt, entry = self.attempts.pop(0)
            fd, self.conn_info = tempfile.mkstemp(dir=self.folder)
            os.close(fd)
            os.unlink(self.conn_info)
            env = dict(self.base, _PYSPARK_DRIVER_CONN_INFO_PATH=self.conn_info)
            argv = self.command
            if entry is not None:
                env.update(entry["env"])
                for name in entry.get("unset", ()):
                    env.pop(name, None)
                argv = entry["argv"]
            self.env = env
            try:
                self.proc = _start(argv, env, self.write_fd, self.nice, self.keep_fds)
                return
            except OSError as exc:
                if entry is None:
                    raise HighLevelError(f"Spark's launcher {argv[0]} did not start: {exc}") \
                        from None
                log.debug("remembered JVM launch failed (%s): spark-submit", exc)
                forget(self.key)

    def _gateway_address(self) -> tuple[int, str] | None:
        """Wait for the gateway's port and secret (the next attempt when the remembered
        command's JVM exits first); None when spark-submit's exits too."""
        global last_launch
        while True:
            assert self.proc is not None          # `_next` started a JVM
            got = _await_conn_info(self.proc, self.conn_info)
            if got is not None:
                last_launch = (self.attempt, self.key)
                if self.attempt == "spark-submit":
                    remember(self.key, self.proc.pid, self.env)
                log.debug("driver JVM pid %d up (%s)", self.proc.pid, self.attempt)
                return got
            if self.attempt == "spark-submit" or not self.attempts:
                return None
            log.debug("remembered JVM launch exited with %s: spark-submit",
                      self.proc.returncode)
            forget(self.key)
            self._next()

    def connect(self) -> None:
        """Wait for the gateway, then make it the next SparkContext's (HighLevelError when
        no JVM came up)."""
        import pyspark.sql  # noqa: F401 - what the session needs next, while the JVM starts

        from highlevel.errors import HighLevelError
        try:
            got = self._gateway_address()
        finally:
            self._close()
        if got is None:
            self.forward.join(2)             # the JVM's own words (above) come before ours
            java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") \
                if os.environ.get("JAVA_HOME") else shutil.which("java")
            raise HighLevelError(f"Spark's JVM did not start; java: "
                                 f"{java or 'not found on PATH'}"
                                 f"{' (JAVA_HOME)' if os.environ.get('JAVA_HOME') else ''}. "
                                 f"Spark 4 needs Java 17 or later: `bash .ci/install` "
                                 f"installs it, or set JAVA_HOME")
        from pyspark import SparkContext
        from pyspark.java_gateway import launch_gateway as pyspark_connect

        port, secret = got
        # pyspark connects to a running gateway named by these two variables (its
        # ClientServer and the imports pyspark's own modules expect); ours only for the call
        os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
        os.environ["PYSPARK_GATEWAY_SECRET"] = secret
        try:
            gateway = pyspark_connect()
        finally:
            os.environ.pop("PYSPARK_GATEWAY_PORT", None)
            os.environ.pop("PYSPARK_GATEWAY_SECRET", None)
        gateway.proc = self.proc              # keeps the JVM's stdin open
        SparkContext._gateway = gateway       # noqa: SLF001 - what _ensure_initialized sets
        SparkContext._jvm = gateway.jvm       # noqa: SLF001

    def cancel(self) -> None:
        """Stop a launch that will not be connected."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)          # the JVM holds its own copy
            self.write_fd = -1
        shutil.rmtree(self.folder, ignore_errors=True)
