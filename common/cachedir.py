"""The private cache directory, `~/.cache/oopscope` (or `$XDG_CACHE_HOME/oopscope`): created
with mode 0700, and used only while it is ours and nobody else can write to it.

Later runs execute what it holds: the `java` command Spark's launcher printed
(`highlevel.jvm`), the class-data archive the JVM maps (`highlevel.jvmcache`), the generated
kernel modules Python imports (`lowlevel.specialize`, in `kernels/`). A directory another user
owns or can write to could have been filled by them, so it is refused: `cache_dir` warns once
per process why, and its callers go without their caches (the results are the same).
`private_subdir` applies the same rule to a directory inside it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from common import settings

log = logging.getLogger(__name__)


def cache_root() -> Path:
    return settings.cache_dir()


def problem(path: Path) -> str | None:
    """Why `path` must not hold the caches (None: it may)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others than its owner (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def owned(path: Path) -> bool:
    """`path` is a directory of ours (whatever its mode)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


_WARNED: set[tuple[str, str]] = set()


def _open_private(path: Path) -> str | None:
    """Create `path` with mode 0700 if missing; why it must not be used (None: it may)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        return f"cannot be created ({exc.strerror})"
    why = problem(path)
    if why is None:
        with contextlib.suppress(OSError):
            if stat.S_IMODE(os.stat(path).st_mode) & 0o077:
                os.chmod(path, 0o700)     # ours, and readable by others: nothing of theirs
    return why


def open_cache_dir() -> tuple[Path, str | None]:
    """The cache directory, created with mode 0700 if missing, and why it must not be used
    (None: it may)."""
    path = cache_root()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return path, f"cannot be created ({exc.strerror})"
    return path, _open_private(path)


def _refused(path: Path, why: str) -> None:
    if (str(path), why) not in _WARNED:
        _WARNED.add((str(path), why))
        trust = " (later runs execute what it holds)" if os.path.lexists(path) else ""
        log.warning("cache directory %s %s: not used%s; runs go without its caches (Spark's "
                    "start-up, specialized kernels)", path, why, trust)


def cache_dir(create: bool = True) -> Path | None:
    """The cache directory (`open_cache_dir`); None, and one warning per process, when it
    must not be used. `create=False`: None when it does not exist (a look-up)."""
    if not create and not os.path.lexists(cache_root()):
        return None
    path, why = open_cache_dir()
    if why is not None:
        _refused(path, why)
        return None
    return path


def private_subdir(name: str) -> Path | None:
    """`cache_dir() / name`, created 0700, under the same rule as the cache directory (None,
    and one warning, when it must not be used)."""
    root = cache_dir()
    if root is None:
        return None
    path = root / name
    why = _open_private(path)
    if why is not None:
        _refused(path, why)
        return None
    return path


def write_private(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file of ours, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.{os.getpid()}.",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
