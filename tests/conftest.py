"""Shared test fixtures: where the real captures are, and skips with a reason when they are not."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from highlevel.jvmcache import mapping_options
from highlevel.session import QUICK_JVM_OPTIONS

REPO = Path(__file__).resolve().parents[1]

# Every local Spark driver JVM the tests start (in-process sessions, and the runs, servers,
# agents and collectors started as processes, which inherit this) runs the C1 compiler only
# and the serial collector: a paced run's JVM took 11 CPU-seconds with the defaults and 6
# with this, and the suite on 2 cores is bound by the CPU of its ~hundreds of JVMs.
os.environ.setdefault("OOPSCOPE_SPARK_QUICK_JVM", "always")
# The servers the tests start do not warm their Spark up before the first window (~4-6
# CPU-seconds each, for latency the tests do not measure); test_serve_threads turns it on.
os.environ.setdefault("OOPSCOPE_SPARK_WARMUP", "0")
SHARED = Path(os.environ.get("OOPSCOPE_SHARED", REPO.parent / "shared"))
PCAPS = SHARED / "pcaps"


def shared_pcaps() -> list[Path]:
    """Every capture in ../shared/pcaps (empty when the folder is absent)."""
    if not PCAPS.is_dir():
        return []
    return sorted(p for p in PCAPS.iterdir() if p.suffix in {".pcap", ".pcapng", ".cap"})


@pytest.fixture(scope="session")
def pcaps_dir() -> Path:
    if not PCAPS.is_dir():
        pytest.skip(f"real captures not found at {PCAPS} (a checkout without ../shared)")
    return PCAPS


def require_tool(name: str) -> str:
    """Path of an external tool, or skip naming the missing Debian package's tool."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it)")
    return path


def free_udp_port() -> int:
    """A UDP port on loopback that nothing is bound to (for a collector)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def udp_port_bound(port: int) -> bool:
    """Something holds UDP `port` on loopback (our own bind fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def niceness(pid: int) -> int:
    """The niceness of process (or thread) `pid`."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def java_children(pid: int) -> list[int]:
    """The JVMs process `pid` started (its driver JVM)."""
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if "(java)" in stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(p))
    return out


def udp_receive_queue(port: int) -> int:
    """Bytes waiting in the receive queue of the loopback UDP socket bound to `port`
    (/proc/net/udp; 0 when none is bound)."""
    key = f"0100007F:{port:04X}"
    with open("/proc/net/udp") as f:
        for line in f:
            cols = line.split()
            if len(cols) > 4 and cols[1] == key:
                return int(cols[4].split(":")[1], 16)
    return 0


@contextmanager
def nfcapd(flowdir: Path):
    """A real nfcapd on a free loopback port, stopped (and drained) at the end. The port is
    free when chosen but may be taken before nfcapd binds it (tests run in parallel): an
    nfcapd that exits at start is started again on another port."""
    exe = require_tool("nfcapd")
    for _attempt in range(5):
        port = free_udp_port()
        proc = subprocess.Popen([exe, "-b", "127.0.0.1", "-p", str(port), "-w", str(flowdir)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while proc.poll() is None and not udp_port_bound(port) and time.monotonic() < deadline:
            time.sleep(0.05)                   # ready once it has bound its port
        if proc.poll() is None:
            break
        proc.communicate()
    try:
        yield port
        # nfcapd stops reading at SIGTERM: what its socket holds then is lost. A fixed wait
        # lost datagrams on a loaded machine (CI at load 6): wait for its queue to empty
        deadline = time.monotonic() + 30
        while udp_receive_queue(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)                        # the last datagram taken is written out
    finally:
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log.decode(errors="replace")



#: the quick-start JIT and collector of the suite's local drivers (OOPSCOPE_SPARK_QUICK_JVM
#: above), which that switch gives no other master
QUICK_JVM = QUICK_JVM_OPTIONS


def quick_spark_conf(directory: Path, *lines: str) -> Path:
    """`directory` as a SPARK_CONF_DIR whose spark-defaults.conf starts the drivers and
    executors of the applications run with it as the suite's local drivers start
    (QUICK_JVM in spark.driver/executor.defaultJavaOptions, which Spark puts before the
    extraJavaOptions a session sets), then `lines`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "spark-defaults.conf").write_text(
        "".join(f"{line}\n" for line in (f"spark.driver.defaultJavaOptions {QUICK_JVM}",
                                          f"spark.executor.defaultJavaOptions {QUICK_JVM} "
                                          f"{mapping_options()}",
                                          *lines)))
    return directory


class QuickCluster:
    """A Spark standalone master and worker on loopback (`highlevel.cluster.LocalCluster`, 1
    core, 1 GB) whose JVMs run QUICK_JVM, as the suite's local ones do: the daemons
    (SPARK_MASTER_OPTS, SPARK_WORKER_OPTS in their environment), and the drivers and
    executors of the commands given `env()` (its SPARK_CONF_DIR, `quick_spark_conf`). The
    daemons took 7 CPU-seconds instead of 12.5 to start, register and stop; a small
    application's executor 8 instead of 18, its driver 12.5 instead of 15. `with QuickCluster(workdir) as cluster:`,
    `cluster.url`."""

    def __init__(self, workdir: Path):
        from highlevel.cluster import LocalCluster

        self.workdir = Path(workdir)
        self.conf_dir = quick_spark_conf(self.workdir / "conf")
        self.cluster = LocalCluster(cores=1, memory="1g", workdir=str(self.workdir / "daemons"))
        self.url = self.cluster.url

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with the cluster's SPARK_CONF_DIR, then `extra`."""
        return {**os.environ, "SPARK_CONF_DIR": str(self.conf_dir), **extra}

    def __enter__(self) -> QuickCluster:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SPARK_MASTER_OPTS", f"{QUICK_JVM} {mapping_options()}")
            mp.setenv("SPARK_WORKER_OPTS", f"{QUICK_JVM} {mapping_options()}")
            self.cluster.start()
        return self

    def __exit__(self, *exc) -> None:
        self.cluster.stop()

#: the longest modules (measured: minutes each), handed out first; the rest follow
HEAVY = ("highlevel/test_highlevel_graph.py", "tools/test_tools_readme_tour.py",
         "tools/test_tools_run_udaf.py", "tools/test_tools_cluster.py",
         "tools/test_tools_run_closing.py", "tools/test_serve_netflow.py",
         "tools/test_tools_cluster_python.py", "highlevel/test_highlevel_jvmcache.py",
         "tools/test_tools_run_resume_variants.py", "lowlevel/test_lowlevel_specialize.py",
         "tools/test_serve_records.py", "tools/test_tools_run_paced.py",
         "tools/test_tools_run_sampling.py", "tools/test_tools_manual_examples.py",
         "tools/test_tools_run_resume.py", "tools/test_tools_run.py",
         "tools/test_tools_bench_iop_oop.py")


def pytest_collection_modifyitems(session, config, items):
    """Under pytest-xdist, the longest modules first, then those with slow tests: `--dist
    loadfile` hands out whole modules in collection order, so a long module picked up last
    would run alone at the end while the other workers sit idle. Within a module the order
    stays as written; a run without workers keeps the plain collection order."""
    if not hasattr(config, "workerinput"):
        return
    tests = Path(__file__).resolve().parent
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}

    def rank(item) -> tuple[int, int]:
        name = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        if name in HEAVY:
            return 0, HEAVY.index(name)
        return (1 if item.path in slow else 2), 0

    items.sort(key=rank)    # stable: each module stays whole and in order
