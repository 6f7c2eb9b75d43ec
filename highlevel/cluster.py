"""A Spark standalone master and worker on loopback, started from the pyspark installation.

The pip package ships no `sbin/start-master.sh`, but it ships `bin/spark-class`, which runs
the standalone daemons directly. `LocalCluster` starts one master and one worker as child
processes in their own process groups, waits until the worker is registered (the master's
JSON status page), and stops both by process-group id, always, even when the body fails.
Its executors' Python workers import the oopscope of the process that started them.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from highlevel.errors import HighLevelError
from highlevel.session import log4j2_config

log = logging.getLogger(__name__)


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux), so daemons never
    outlive a test process that was killed before it could stop them."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class LocalCluster:
    """`with LocalCluster() as url:` -> `spark://127.0.0.1:<port>` with one live worker."""

    def __init__(self, cores: int = 1, memory: str = "1g", workdir: str | None = None,
                 timeout: float = 120.0):
        self.cores, self.memory, self.timeout = cores, memory, timeout
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="oopscope-cluster-"))
        self.port, self.ui_port, self.worker_ui = free_port(), free_port(), free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        # the executors' Python workers import the oopscope this process runs, as they would
        # on a cluster it is installed on (from a source tree: not installed at all)
        source = str(Path(__file__).resolve().parents[1])
        python_path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_NO_DAEMONIZE="1", PYTHONPATH=python_path,
                   SPARK_DAEMON_JAVA_OPTS=f"-Dlog4j2.configurationFile=file:{log4j2_config()}")
        out = open(self.workdir / f"{name}.log", "wb")
        cmd = [str(spark_home() / "bin" / "spark-class"), *args]
        # own process group: stopping it stops the JVM and anything it launched
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        self.procs.append(proc)
        return proc

    def start(self) -> str:
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                               "--cores", str(self.cores), "--memory", self.memory,
                               "--webui-port", str(self.worker_ui),
                               "--work-dir", str(self.workdir / "work"), self.url])
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    self.stop()
                    raise HighLevelError(f"Spark standalone daemon exited with {p.returncode}; "
                                         f"see {self.workdir}")
            if self.alive_workers() >= 1:
                log.info("standalone cluster up at %s", self.url)
                return self.url
            time.sleep(0.5)
        self.stop()
        raise HighLevelError(f"no Spark worker registered with {self.url} within "
                             f"{self.timeout:.0f} s; logs in {self.workdir}")

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                status = json.load(r)
        except (OSError, ValueError):
            return 0
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                except ProcessLookupError:
                    pass
        self.procs.clear()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
