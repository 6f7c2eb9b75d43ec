"""The appliance's state directory: one server's at a time, private to its user, and kept
apart from the outputs of its queries.

What the server remembers (`queries/`, `run/`, `shared/`, its heartbeat) is read back at a
restart and acted on: a record says which directories to write to and which to remove. So
the directory must be one nobody else could have written to: owned by the server's user and
writable by nobody else (created 0700 when the server makes it), and one server at a time
(an exclusive `flock` on `serve.lock`, held for the process's life and released by the
kernel when it ends, however it ends; the descriptor is close-on-exec, so the processes the
server starts, its JVM and fanout members, never hold it). The output root obeys the same
ownership rule: a directory another user can write to could have its subdirectories swapped
for links between the server's check and its write.

Outputs are directories below the output root (which is the state directory itself by
default): never the root or anything holding the state directory, and never one of the
state directory's own entries (`RESERVED`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from common.cachedir import problem
from tools.errors import RunConfigError
from tools.serve.config import ServeError

log = logging.getLogger(__name__)

LOCK_NAME = "serve.lock"
#: the entries of the state directory the server itself writes (no output may be one)
RESERVED = frozenset({"queries", "run", "shared", LOCK_NAME, "server.json", "gaps.json",
                      "oopscope.sock"})


class StateDir:
    """`StateDir(state, output_root).claim()` makes both directories if missing, refuses
    them unless they are private to the server's user, and locks the state directory for
    this process; `output_dir` checks an output directory a query names."""

    def __init__(self, path: Path, output_root: Path):
        self.path = path
        self.output_root = output_root
        self._lock_fd: int | None = None

    def claim(self) -> None:
        """Create, check and lock (RunConfigError in one line when refused); once."""
        if self._lock_fd is not None:
            return
        for option, d in (("--state", self.path), ("--output-root", self.output_root)):
            _make_private(option, d)
        why = self._reserved(self.output_root)
        if why is not None:
            raise RunConfigError(f"--output-root {self.output_root}: {why}")
        self._lock()

    def _lock(self) -> None:
        path = self.path / LOCK_NAME
        try:
            # O_CLOEXEC: a child process holding it would keep the lock after a crash
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise RunConfigError(f"--state {self.path}: cannot open its lock file "
                                 f"{LOCK_NAME}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RunConfigError(f"--state {self.path}: another server uses it"
                                     f"{f' (pid {holder})' if holder else ''}; stop it "
                                     f"first or give another --state") from None
            raise RunConfigError(f"--state {self.path}: cannot lock it: "
                                 f"{exc.strerror}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd           # held until the process ends

    # --- outputs -------------------------------------------------------------------------------
    def output_dir(self, path: str) -> Path:
        """The output directory `path` names (relative: to the output root), resolved;
        ServeError when the server must not write there."""
        p = Path(path)
        if not p.is_absolute():
            p = self.output_root / p
        real = Path(os.path.normpath(p)).resolve()
        if not (real == self.output_root or self.output_root in real.parents):
            raise ServeError(f"output {path}: outside the output root {self.output_root} "
                             f"(the server writes only below it; start it with "
                             f"--output-root to choose another)", status=403)
        why = self.output_problem(real)
        if why is not None:
            raise ServeError(f"output {path}: {why}; name a directory of its own below "
                             f"the output root {self.output_root}")
        return real

    def output_problem(self, real: Path) -> str | None:
        """Why the resolved directory `real` must not hold outputs (None: it may)."""
        if not (self.output_root in real.parents or real == self.output_root):
            return f"outside the output root {self.output_root}"
        if real == self.path or real in self.path.parents:
            return "it is or holds the server's state directory"
        return self._reserved(real)

    def _reserved(self, real: Path) -> str | None:
        """Why `real` is part of the state directory's own entries (None: it is not)."""
        if self.path in real.parents:
            top = real.relative_to(self.path).parts[0]
            if top in RESERVED or top.startswith("."):
                return f"{top} is the server's own, in its state directory"
        return None


def _make_private(option: str, d: Path) -> None:
    """`d` created 0700 if missing; refused unless ours and writable by nobody else."""
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise RunConfigError(f"{option} {d}: cannot create it: {exc.strerror}") from None
    why = problem(d)
    if why is not None:
        raise RunConfigError(f"{option} {d}: {why}; the server acts on what it finds there "
                             f"(chown it to this user and chmod go-w it, or give another)")


def _read_pid(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""
