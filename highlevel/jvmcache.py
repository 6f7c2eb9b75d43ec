"""The private cache directory of the driver JVM's start-up, and Spark's class-data archive in it.

`~/.cache/oopscope` (or `$XDG_CACHE_HOME/oopscope`) holds what makes a JVM start quickly: the
`java` command Spark's launcher printed (`highlevel.jvm`, run as is by later launches), the
quiet log4j2 profile, and a class-data sharing (CDS) archive of Spark's classes. A later run
executes what it finds there, so the directory is created with mode 0700 and used only while
it is ours and nobody else can write to it; otherwise a warning says why and runs go without
these caches (`common.cachedir.cache_dir`).

The archive (`spark-<key>.jsa`, ~165 MB; the key names the Spark jars and the JVM, so another
installation never maps a stale one) halves the JVM's start-up: the classes come mapped and
verified instead of parsed from the jars. Java 17 writes a dynamic archive when a JVM given
`-XX:ArchiveClassesAtExit` exits. Only one process writes it: the one that holds the lock
`cds.lock` (`fcntl.flock`), which its JVM inherits, so the lock stays taken until that JVM is
gone; others run without the archive meanwhile. The dump goes to a private temporary name
(`tempfile.mkstemp` in the directory); the process that started the JVM waits for it at exit
(`finish_dump`) and renames the finished archive into place, so the next run maps it. A
temporary file found while holding the lock was left by a writer that is gone (killed): it
is removed. `oopscope warmup` (`tools/commands/warmup.py`) writes the archive at install.
OOPSCOPE_SPARK_CDS=0 turns the archive off.

The directory is bounded: the archives of the newest KEEP_ARCHIVES keys, at most MAX_BYTES
together, and the newest launch entries (`highlevel.jvm`). `oopscope cache info|clear` shows
and empties it (`entries`, `clear`).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from common import settings

# the cache directory's rule (0700, ours, nobody else may write it) is common/cachedir.py's;
# its names stay importable from here (tools/commands/cache.py, warmup.py)
from common.cachedir import cache_dir
from common.cachedir import cache_root as cache_root
from common.cachedir import open_cache_dir as open_cache_dir
from common.cachedir import owned as owned
from common.cachedir import problem as problem
from common.cachedir import write_private as write_private
from common.processes import pid_alive
from highlevel.sparkhome import spark_home

log = logging.getLogger(__name__)

#: archives kept: this installation's and the newest other one's (a second virtual
#: environment, another Java); ~165 MB each
KEEP_ARCHIVES = 2
#: what the archives may take together
MAX_BYTES = 1 << 30
#: how long a process that dumps waits at exit for its JVM to write the archive (seconds
#: on an idle machine, a minute on two busy cores)
DUMP_TIMEOUT_S = 300.0
LOCK_NAME = "cds.lock"
#: JVM logging off: the archive's dump and a mismatch print warnings on stdout, which carries
#: data
_QUIET = "-Xlog:disable -Xlog:all=error:stderr"


def _tmp_pid(name: str) -> int | None:
    """The pid a temporary file's name carries (`<stem>.<pid>.<random>[.jsa].tmp`)."""
    for part in name.split(".")[1:]:
        if part.isdigit():
            return int(part)
    return None


def config_file(stem: str, suffix: str, text: str) -> Path:
    """A file holding `text` for the JVM to read: in the cache directory under a name from its
    digest (the same path every run, so the launch stays remembered), else a new file of
    ours in the temp directory (`mkstemp`: no name another user could predict and plant),
    removed at exit."""
    cache = cache_dir()
    if cache is not None:
        path = cache / f"{stem}-{hashlib.sha1(text.encode()).hexdigest()[:12]}{suffix}"
        try:
            if not path.is_file() or path.read_text() != text:
                write_private(path, text)
            return path
        except OSError as exc:
            log.debug("%s not written to %s: %s", stem, cache, exc)
    fd, name = tempfile.mkstemp(prefix=f"oopscope-{stem}-", suffix=suffix)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    atexit.register(_unlink, Path(name))
    return Path(name)


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


# --- the class-data archive ----------------------------------------------------------------------

def archive_key() -> str:
    """Names the Spark jars and the JVM that map an archive (their paths and mtimes)."""
    jars = Path(spark_home()) / "jars"
    ident = f"{jars} {jars.stat().st_mtime_ns} {os.environ.get('JAVA_HOME', '')}"
    java = java_command()
    if java:
        real = os.path.realpath(java)
        ident += f" {real} {os.stat(real).st_mtime_ns}"
    return hashlib.sha1(ident.encode()).hexdigest()[:12]


def java_command() -> str | None:
    """The `java` Spark's scripts run: JAVA_HOME's, else the PATH's (None: none found)."""
    if os.environ.get("JAVA_HOME"):
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
        return java if os.access(java, os.X_OK) else None
    return shutil.which("java")


def archive_path(cache: Path, key: str) -> Path:
    return cache / f"spark-{key}.jsa"


def try_lock(cache: Path) -> int | None:
    """The archive writer's lock, taken (its fd), or None when another process holds it."""
    fd = os.open(cache / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def wait_unlocked(cache: Path, timeout: float = DUMP_TIMEOUT_S) -> bool:
    """Wait until no process writes an archive (False: still one after `timeout` s)."""
    deadline = time.monotonic() + timeout
    while True:
        fd = try_lock(cache)
        if fd is not None:
            os.close(fd)
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def tidy(cache: Path, locked: bool) -> list[Path]:
    """Remove the temporary files their writers left: an archive's only while holding the
    lock (every writer holds it until its JVM is gone), the others' when their pid is gone.
    Returns what was removed."""
    removed = []
    for path in cache.glob("*.tmp"):
        pid = _tmp_pid(path.name)
        stale = locked if path.name.endswith(".jsa.tmp") else \
            pid is not None and pid != os.getpid() and not pid_alive(pid)
        if stale:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    if removed:
        log.debug("removed temporary files left behind: %s", [p.name for p in removed])
    return removed


def prune(cache: Path, keep: str | None = None) -> list[Path]:
    """Keep the archives of the newest KEEP_ARCHIVES keys (`keep`'s first), MAX_BYTES at most
    together; returns the ones removed."""
    def newest_first(path: Path) -> tuple:
        with contextlib.suppress(OSError):
            return (path.name != f"spark-{keep}.jsa", -path.stat().st_mtime)
        return (True, 0.0)

    kept = total = 0
    removed = []
    for path in sorted(cache.glob("spark-*.jsa"), key=newest_first):
        try:
            size = path.stat().st_size
            if path.name == f"spark-{keep}.jsa" or (kept < KEEP_ARCHIVES and
                                                    total + size <= MAX_BYTES):
                kept, total = kept + 1, total + size
                continue
            path.unlink()
            removed.append(path)
        except OSError as exc:
            log.debug("archive %s not pruned: %s", path, exc)
    return removed


@dataclass
class _Dump:
    """This process's JVM writes the archive: the lock taken, the temporary and final names,
    and the launch whose JVM writes it (`dump_launched`)."""

    lock: int
    tmp: Path
    archive: Path
    launch: object = None


_STATE = threading.Lock()
_OPTIONS: str | None = None          # this process's decision, the same for every launch
_DUMP: _Dump | None = None


def cds_enabled() -> bool:
    return settings.spark_cds()


def class_data_options() -> str:
    """JVM options for Spark's class-data archive: map it when it exists; else write it at
    exit when this process gets the lock; else nothing. Decided once per process (the driver
    JVM of a process is one, and its settings are compared between launch and session)."""
    global _OPTIONS
    if not cds_enabled():
        return ""
    with _STATE:
        if _OPTIONS is None:
            _OPTIONS = _decide()
        return _OPTIONS


def _decide() -> str:
    global _DUMP
    cache = cache_dir()
    if cache is None:
        return ""
    try:
        key = archive_key()
        archive = archive_path(cache, key)
        if archive.is_file():
            fd = try_lock(cache)
            if fd is not None:                  # no writer: what is left is stale
                tidy(cache, locked=True)
                os.close(fd)
            return f"-XX:SharedArchiveFile={archive} {_QUIET}"
        fd = try_lock(cache)
    except (OSError, ValueError) as exc:
        log.debug("no class-data sharing archive: %s", exc)
        return ""
    if fd is None:
        log.debug("another process writes the class-data archive: this JVM goes without")
        return ""
    try:
        if archive.is_file():                   # its writer finished meanwhile
            os.close(fd)
            return f"-XX:SharedArchiveFile={archive} {_QUIET}"
        tidy(cache, locked=True)
        prune(cache, keep=key)
        tmp_fd, tmp = tempfile.mkstemp(dir=cache, prefix=f"spark-{key}.{os.getpid()}.",
                                       suffix=".jsa.tmp")
        os.close(tmp_fd)
    except OSError as exc:
        os.close(fd)
        log.debug("no class-data sharing archive: %s", exc)
        return ""
    _DUMP = _Dump(fd, Path(tmp), archive)
    atexit.register(finish_dump)
    log.debug("the driver JVM writes the class-data archive at exit: %s", tmp)
    return f"-XX:ArchiveClassesAtExit={tmp} {_QUIET}"


def existing_archive() -> Path | None:
    """This user's archive for the current Spark and JVM, if it has been written."""
    cache = cache_dir(create=False)
    try:
        archive = cache and archive_path(cache, archive_key())
    except (OSError, ValueError):
        return None
    return archive if archive and archive.is_file() else None


def mapping_options() -> str:
    """Options that map the archive if it exists, else nothing: never a dump. For JVMs of
    Spark's own on this host (a standalone master, worker or executor run on the drivers'
    class path), which start on ~3.5 CPU s less with it."""
    archive = existing_archive() if cds_enabled() else None
    return f"-XX:SharedArchiveFile={archive} {_QUIET}" if archive else ""


def dump_fds() -> tuple[int, ...]:
    """Descriptors a new driver JVM must inherit: the archive's lock while it writes one."""
    dump = _DUMP
    return (dump.lock,) if dump is not None else ()


def dump_launched(launch) -> None:
    """`launch` (a `highlevel.jvm.Launch`) started the JVM that writes the archive."""
    if _DUMP is not None:
        _DUMP.launch = launch


def finish_dump(timeout: float = DUMP_TIMEOUT_S) -> Path | None:
    """At exit of the process whose JVM writes the archive: close the JVM's stdin (it exits,
    writing the archive), wait for it, and rename the archive into place if the JVM exited
    normally; else remove the temporary file. Releases the lock. Returns the archive made."""
    global _DUMP
    with _STATE:
        dump, _DUMP = _DUMP, None
    if dump is None:
        return None
    made = None
    proc = getattr(dump.launch, "proc", None)
    try:
        if proc is not None:
            if proc.poll() is None:
                started = time.perf_counter()
                log.info("writing the class-data archive of Spark's classes (once)")
                # the gateway goes away under pyspark's threads: no noise from them
                logging.getLogger("py4j").setLevel(logging.CRITICAL)
                _stop_accumulator_server()
                with contextlib.suppress(OSError):
                    proc.stdin.close()
                proc.wait(timeout)
                log.debug("driver JVM exited in %.1f s", time.perf_counter() - started)
            if proc.returncode == 0 and dump.tmp.stat().st_size > 0:
                os.replace(dump.tmp, dump.archive)
                made = dump.archive
                prune(dump.archive.parent, keep=dump.archive.name[6:-4])
                log.info("class-data archive %s written", made)
            else:
                log.debug("no class-data archive: the driver JVM exited with %s",
                          proc.returncode)
    except subprocess.TimeoutExpired:
        log.warning("the driver JVM was still writing the class-data archive after %.0f s: "
                    "not kept (a later run writes it)", timeout)
    except (OSError, KeyboardInterrupt) as exc:
        log.debug("no class-data archive: %r", exc)
    finally:
        if made is None:
            _unlink(dump.tmp)
        os.close(dump.lock)
    return made


def _stop_accumulator_server() -> None:
    """Stop pyspark's accumulator server before the JVM goes away under it: its handler,
    connected to the JVM, would read the end of the connection as an error and print a
    traceback (it ends within a second once told to stop)."""
    import sys

    context = getattr(sys.modules.get("pyspark"), "SparkContext", None)
    active = getattr(context, "_active_spark_context", None)
    server = getattr(active, "_accumulatorServer", None)
    if active is not None and server is not None:
        try:
            server.shutdown()
            active._accumulatorServer = None
        except Exception as exc:  # noqa: BLE001 - at exit: the archive matters, not this
            log.debug("accumulator server not stopped: %r", exc)


def mapped_archive(pid: int) -> str | None:
    """The class-data archive of ours that process `pid` maps (None: none, or unreadable)."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                if line.rstrip().endswith(".jsa") and "/spark-" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


# --- oopscope cache info | clear --------------------------------------------------------------------

@dataclass(frozen=True)
class Entry:
    path: Path
    kind: str
    size: int
    mtime: float


def _size(path: Path) -> int:
    if path.is_dir() and not path.is_symlink():
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    return path.lstat().st_size


def _kind(name: str, current: str | None) -> str:
    if name.endswith(".jsa"):
        return "class-data archive" + (" (this installation)"
                                       if name == f"spark-{current}.jsa" else "")
    if name.endswith(".jsa.tmp"):
        return "class-data archive being written, or left behind"
    if name.startswith("jvm-launch-"):
        return "remembered JVM launch"
    if name.startswith("log4j2-"):
        return "Spark's log profile"
    if name == "kernels":
        return "specialized low-level kernels"
    if name == LOCK_NAME:
        return "lock of the archive's writer"
    return "temporary file" if name.endswith(".tmp") else "other"


def entries(cache: Path) -> list[Entry]:
    """What the cache directory holds, by name."""
    try:
        current = archive_key()
    except (OSError, ValueError, ImportError):
        current = None
    out = []
    for path in sorted(cache.iterdir()):
        with contextlib.suppress(OSError):
            out.append(Entry(path, _kind(path.name, current), _size(path),
                             path.lstat().st_mtime))
    return out


def clear(cache: Path) -> tuple[list[Entry], list[Entry]]:
    """Remove everything in `cache` and the directory itself; while another process writes
    an archive, its lock and temporary file stay. Returns (removed, kept)."""
    fd = try_lock(cache)
    removed, kept = [], []
    try:
        for entry in entries(cache):
            writing = entry.path.name.endswith(".jsa.tmp") or entry.path.name == LOCK_NAME
            if fd is None and writing:
                kept.append(entry)
                continue
            if entry.path.is_dir() and not entry.path.is_symlink():
                shutil.rmtree(entry.path)
            else:
                entry.path.unlink(missing_ok=True)
            removed.append(entry)
    finally:
        if fd is not None:
            os.close(fd)
    if not kept:
        with contextlib.suppress(OSError):
            cache.rmdir()
    return removed, kept
