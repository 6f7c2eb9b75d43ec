"""Files a query names (getlpmid's prefix files, str_file_regex_match's regular expression):
which of them may be read, and reading one without blocking, without following it out of
where it may be, and without reading more than a cap.

`DataFiles` is the policy, a frozen value handed to the planner with the rest of a run's
options. `oopscope run` reads any file its user names (`DataFiles()`); the appliance reads
only files below its `--data-dir` directories (`DataFiles.under(dirs)`; none given: no file
at all), because whoever can submit a query is not whoever started the server. Every read,
either way, is of a regular file (a FIFO would block the planner, a device never ends) up to
`max_bytes`, and never below /proc, /sys or /dev.

A refusal is a `DataFileError`: the file as the query wrote it and the rule it broke, never
anything read from it. A path outside the data directories is refused before anything is
looked up, with one message whether it exists or not, so a refusal tells nothing about files
outside them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

from common.errors import OopscopeError, os_error_text

MIB = 1 << 20
#: the largest data file read: a prefix table of a full routing table is a few MiB
DEFAULT_MAX_BYTES = 16 * MIB
#: the kernel's pseudo file systems: what they hold is the machine's state, not data
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_NOFOLLOW", 0))
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class DataFileError(OopscopeError):
    """A file a query names that may not or cannot be read: `path` as the query wrote it,
    `rule` what is wrong (never the file's contents)."""

    def __init__(self, path: str, rule: str):
        super().__init__(f"{path}: {rule}")
        self.path = path
        self.rule = rule


def size_text(n: int) -> str:
    """A byte count as a person reads it: 16 MiB, 1.5 GiB, 512 B."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            value = n / (1 << shift)
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


class OpenDataFile:
    """A data file opened by `DataFiles.open` (a context manager: closed on leaving): its
    resolved path and status, and `read()` for its bytes, up to the cap. A cache of what
    was made of a file checks `version` first and reads only when it changed."""

    def __init__(self, files: DataFiles, written: str, path: str, fd: int,
                 st: os.stat_result):
        self._files, self._written, self._fd = files, written, fd
        self.path = path
        self.stat = st

    @property
    def version(self) -> tuple:
        """What changes when the file does (path, inode, modification time, size)."""
        st = self.stat
        return (self.path, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def read(self) -> bytes:
        """The file's bytes (DataFileError when there are more than the cap: the size fstat
        gave is not trusted, a file may grow and a pseudo file says 0, so at most one byte
        past the cap is read, which tells that it is larger)."""
        chunks, left = [], self._files.max_bytes + 1
        try:
            while left > 0:
                chunk = os.read(self._fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise DataFileError(self._written, f"cannot be read ({os_error_text(exc)})") \
                from None
        if left <= 0:
            raise self._files.too_large(self._written)
        return b"".join(chunks)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> OpenDataFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class DataFiles:
    """Which files a query may read (`dirs`: None for any, else only below one of these
    resolved directories, none at all when empty) and how much of one (`max_bytes`)."""

    dirs: tuple[str, ...] | None = None
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def under(cls, dirs: Iterable[str], max_bytes: int = DEFAULT_MAX_BYTES) -> DataFiles:
        """Only the files below `dirs` (resolved now: a symlinked directory is its target)."""
        return cls(tuple(os.path.realpath(d) for d in dirs), max_bytes)

    @property
    def restricted(self) -> bool:
        return self.dirs is not None

    def _base(self) -> str:
        return self.dirs[0] if self.dirs else os.getcwd()

    def _under(self, path: str) -> bool:
        assert self.dirs is not None
        return any(path == d or path.startswith(d.rstrip(os.sep) + os.sep) for d in self.dirs)

    def _outside(self, written: str) -> DataFileError:
        if not self.dirs:
            return DataFileError(written, "this server reads no files named in queries "
                                 "(start it with --data-dir DIR to let queries read the "
                                 "files below DIR)")
        return DataFileError(written, f"not under a --data-dir of this server "
                             f"({', '.join(self.dirs)})")

    def resolve(self, written: str) -> str:
        """The real path of a file a query names (relative: to the first data directory, or
        to the working directory when any file may be read), checked against the rules that
        need no opening (DataFileError)."""
        if not isinstance(written, str) or not written or "\0" in written:
            raise DataFileError(repr(written), "not a file name")
        lexical = os.path.normpath(os.path.join(self._base(), written))
        # outside before anything is looked up: nothing about other files can be learnt
        if self.restricted and not self._under(lexical):
            raise self._outside(written)
        real = os.path.realpath(lexical)
        if self.restricted and not self._under(real):
            raise self._outside(written)      # a symlink out of the data directories
        if any(real == r or real.startswith(r + os.sep) for r in PSEUDO_ROOTS):
            raise DataFileError(written, f"under {', '.join(PSEUDO_ROOTS)}: not a data file")
        return real

    def open(self, written: str) -> OpenDataFile:
        """The file a query names, opened (DataFileError naming `written` and the rule it
        broke: outside the data directories, not found, not a regular file, larger than the
        cap, cannot be read). Opened without blocking: a FIFO opens at once and is refused
        by its status."""
        real = self.resolve(written)
        try:
            fd = os.open(real, _OPEN_FLAGS)
        except OSError as exc:
            raise self._open_error(written, exc) from None
        try:
            st = os.fstat(fd)
            for is_kind, kind in _KINDS:
                if is_kind(st.st_mode):
                    raise DataFileError(written, f"not a regular file ({kind})")
            if not stat.S_ISREG(st.st_mode):
                raise DataFileError(written, "not a regular file")
            if st.st_size > self.max_bytes:
                raise self.too_large(written)
        except BaseException:
            os.close(fd)
            raise
        return OpenDataFile(self, written, real, fd, st)

    def read(self, written: str) -> bytes:
        """The bytes of the file a query names (`open`, then `OpenDataFile.read`)."""
        with self.open(written) as f:
            return f.read()

    def too_large(self, written: str) -> DataFileError:
        return DataFileError(written, f"larger than the {size_text(self.max_bytes)} cap of "
                             f"a file named in a query")

    def _open_error(self, written: str, exc: OSError) -> DataFileError:
        if exc.errno == errno.ENOENT:
            where = ("the first --data-dir" if self.restricted else "the working directory")
            return DataFileError(written, f"not found (relative paths are read from {where}, "
                                 f"{self._base()})")
        if exc.errno == errno.ELOOP:       # swapped for a symlink since it was resolved
            return DataFileError(written, "cannot be read (it changed while being opened)")
        return DataFileError(written, f"cannot be read ({os_error_text(exc)})")


#: the policy of `oopscope run` and the tools its user drives: any file its user names
ANY_FILE = DataFiles()
#: the policy of a server started without --data-dir: no file at all
NO_FILES = DataFiles(dirs=())
