"""What a capture path names: a regular file, a stream (a FIFO or standard input), or
something that cannot hold a capture (a directory, a device, a socket).

Only `os.stat`: no file is opened (opening a FIFO waits for its writer), and nothing heavy is
imported, so `oopscope run` checks its paths before it starts anything.

- a regular file is read as usual (large ones mapped);
- `-` (standard input, unless it is a terminal) and a FIFO are *streams*: read front to back
  as the bytes arrive, never mapped, never sought;
- everything else is refused with a message that says what the path is.
"""

from __future__ import annotations

import fcntl
import os
import stat

#: the path that names standard input
STDIN = "-"
STDIN_FD = 0

FILE = "file"
STREAM = "stream"


def _kind_of_mode(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def classify(path: str | os.PathLike) -> tuple[str | None, str]:
    """(FILE or STREAM, "") for a path a capture can be read from, else (None, why not):
    the problem as a phrase ("capture file not found", "is a directory, not a capture file")."""
    if str(path) == STDIN:
        # descriptor 0 itself, whatever sys.stdin has been replaced with
        try:
            os.fstat(STDIN_FD)
        except OSError:
            return None, "there is no standard input to read"
        if os.isatty(STDIN_FD):
            return None, "standard input is a terminal, not a capture (pipe one in: tcpdump -w - | ...)"
        return STREAM, ""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, "capture file not found"
    except NotADirectoryError:
        return None, "capture file not found (a part of its path is not a directory)"
    except PermissionError:
        return None, "permission denied"
    except OSError as exc:
        return None, f"cannot look at it: {exc.strerror or exc}"
    if stat.S_ISREG(st.st_mode):
        return FILE, ""
    if stat.S_ISFIFO(st.st_mode):
        return STREAM, ""
    return None, f"is {_kind_of_mode(st.st_mode)}, not a capture file"


def display_name(path: str | os.PathLike) -> str:
    """The name messages use for a path (`-` is standard input)."""
    return "<stdin>" if str(path) == STDIN else str(path)


#: the pipe size a stream asks for (`open_input`)
PIPE_BYTES = 1 << 20


def open_input(path: str | os.PathLike, stream: bool, what: str, error: type[Exception]):
    """`path` opened unbuffered for reading (the readers have their own buffers): standard
    input, a stream (a FIFO), or a file. Opening a FIFO for reading waits for a writer,
    silently and beyond a stop: it is opened at once, and the reader waits for its bytes where
    it can be stopped and say that it waits. A stream asks for a 1 MiB pipe (the default
    64 KiB makes a fast writer wait on every 64 KiB). Errors are `error` naming the path and
    `what` it should be ("capture file", "record file")."""
    name = display_name(path)
    try:
        if str(path) == STDIN:
            raw = open(STDIN_FD, "rb", buffering=0, closefd=False)
            _grow_pipe(raw.fileno())
            return raw
        if stream:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.set_blocking(fd, True)
            _grow_pipe(fd)
            return open(fd, "rb", buffering=0)
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise error(f"{name}: {what} not found") from None
    except IsADirectoryError:
        raise error(f"{name}: is a directory, not a {what}") from None
    except OSError as exc:
        raise error(f"{name}: cannot read {what}: {exc.strerror or exc}") from None


def _grow_pipe(fd: int) -> None:
    """Ask for a larger pipe; what an unprivileged process may not have it goes without."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    try:
        fcntl.fcntl(fd, setsize, PIPE_BYTES)
    except OSError:
        pass                        # not a pipe (a regular file on stdin), or over the limit
