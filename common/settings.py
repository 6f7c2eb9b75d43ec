"""Every OOPSCOPE_* environment switch, read in this one place.

Each is read when it is asked for (not at import), so a test or a long-running process sees
the environment as it is then. A switch that is off reads as "0", "false", "no" or "" (any
case); an unusable value is logged once and its default used.

| variable | default | what it does |
|---|---|---|
| OOPSCOPE_SPARK_MASTER | local[*] | the Spark master when `--master` is not given |
| OOPSCOPE_SPARK_CDS | on | the driver JVM maps a class-data sharing archive of Spark's classes |
| OOPSCOPE_SPARK_QUICK_JVM | on | a full-speed replay's local driver JVM runs C1 only, serial GC (`always`: every local driver JVM, paced, live and served too) |
| OOPSCOPE_SPARK_LAUNCH_CACHE | on | the driver JVM is launched with the remembered java command |
| OOPSCOPE_SPARK_WARMUP | on | the appliance and a collector run a stage through their fresh Spark before the first window |
| OOPSCOPE_EXECUTOR_CHECK_TIMEOUT | 120 | seconds a cluster's executors have to import oopscope at start (0: no check) |
| OOPSCOPE_JVM_NICE | 0 | niceness of the driver JVM in a full-speed replay (0-19) |
| OOPSCOPE_LIVE_JVM_NICE | 5 | niceness of the driver JVM of a run or server with a live link (an interface, a NETFLOW collector socket) |
| OOPSCOPE_BACKGROUND_NICE | 10 | niceness of the stages' batch thread while the low level reads |
| OOPSCOPE_SPECIALIZE | on | per-query flow-table kernels with their updates written out |
| OOPSCOPE_DRIVER_ROWS | on | flow-record batches close on the driver, without a Spark job, and a single link's final rows skip the combine |
| OOPSCOPE_SERVER | http://127.0.0.1:7405/ | the server the control commands talk to without `--server` |
| OOPSCOPE_SHARED | ../shared | the benchmarks' shared data folder (real captures in `pcaps/`) |
| XDG_CACHE_HOME | ~/.cache | the private cache folder is `$XDG_CACHE_HOME/oopscope` |
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

_OFF = ("0", "false", "no", "off", "")
_warned: set[str] = set()


def _flag(name: str, default: bool = True) -> bool:
    text = os.environ.get(name)
    if text is None:
        return default
    return text.strip().lower() not in _OFF


def _niceness(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return max(0, min(19, int(text)))
    except ValueError:
        if name not in _warned:
            _warned.add(name)
            log.warning("%s=%r is not a niceness (0-19); %d is used", name, text, default)
        return default


def spark_master() -> str | None:
    """The Spark master a run uses when none is given (None: `local[*]`)."""
    return os.environ.get("OOPSCOPE_SPARK_MASTER") or None


def spark_cds() -> bool:
    return _flag("OOPSCOPE_SPARK_CDS")


def spark_quick_jvm() -> bool:
    return _flag("OOPSCOPE_SPARK_QUICK_JVM")


def spark_quick_jvm_always() -> bool:
    """Whether every local driver JVM runs quick, not only a full-speed replay's (for many
    short-lived ones on few cores, as a test suite starts; a lasting one loses C2's code)."""
    return os.environ.get("OOPSCOPE_SPARK_QUICK_JVM", "").strip().lower() == "always"


def spark_launch_cache() -> bool:
    return _flag("OOPSCOPE_SPARK_LAUNCH_CACHE")


def spark_warmup() -> bool:
    """Whether `serve` warms its fresh Spark session's code paths before the first window
    (off: the first windows pay it, seconds of lag; a server that starts often and briefly,
    as a test suite's do, saves the CPU)."""
    return _flag("OOPSCOPE_SPARK_WARMUP")


def netflow_receive_buffer() -> int:
    """Bytes of receive buffer a NETFLOW collector's socket asks for
    (`OOPSCOPE_NETFLOW_RCVBUF`; default 64 MiB, ~1.5 s of datagrams at a million records a
    second: as root forced past net.core.rmem_max, else capped by it)."""
    text = os.environ.get("OOPSCOPE_NETFLOW_RCVBUF", "").strip()
    default = 64 << 20
    if not text:
        return default
    try:
        return max(4096, int(text))
    except ValueError:
        if "OOPSCOPE_NETFLOW_RCVBUF" not in _warned:
            _warned.add("OOPSCOPE_NETFLOW_RCVBUF")
            log.warning("OOPSCOPE_NETFLOW_RCVBUF=%r is not a number of bytes; %d is used",
                        text, default)
        return default


def executor_check_timeout() -> float:
    """Seconds a cluster's executors have to answer the start check (0: none is made)."""
    text = os.environ.get("OOPSCOPE_EXECUTOR_CHECK_TIMEOUT", "").strip()
    if not text:
        return 120.0
    try:
        return max(0.0, float(text))
    except ValueError:
        if "OOPSCOPE_EXECUTOR_CHECK_TIMEOUT" not in _warned:
            _warned.add("OOPSCOPE_EXECUTOR_CHECK_TIMEOUT")
            log.warning("OOPSCOPE_EXECUTOR_CHECK_TIMEOUT=%r is not a number of seconds; 120 "
                        "is used", text)
        return 120.0


def jvm_nice() -> int:
    return _niceness("OOPSCOPE_JVM_NICE", 0)


def live_jvm_nice() -> int:
    return _niceness("OOPSCOPE_LIVE_JVM_NICE", 5)


def background_nice() -> int:
    return _niceness("OOPSCOPE_BACKGROUND_NICE", 10)


def specialize() -> bool:
    return _flag("OOPSCOPE_SPECIALIZE")


def driver_rows() -> bool:
    return _flag("OOPSCOPE_DRIVER_ROWS")


def server() -> str | None:
    """The control API's server when `--server` is not given (None: the client's default)."""
    return os.environ.get("OOPSCOPE_SERVER") or None


def shared_dir() -> Path | None:
    """The benchmarks' shared data folder (None: `shared` beside the checkout)."""
    text = os.environ.get("OOPSCOPE_SHARED")
    return Path(text) if text else None


def cache_dir() -> Path:
    """The private cache folder (launch cache, class-data archive)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oopscope"
