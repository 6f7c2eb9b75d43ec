"""The root of oopscope's one error hierarchy: every user-facing error says what went wrong and
where. Each package adds its own kinds (capture/errors.py, lowlevel/errors.py, ...)."""

from __future__ import annotations

import errno
import os


class OopscopeError(Exception):
    """Base of every error oopscope reports to a user (the CLI prints it as one line, exit 1)."""


class LinkError(OopscopeError):
    """A query names a link the run was not given, or a link is given twice."""


class ConfigError(OopscopeError):
    """A run option or DEFINE override is not valid (says what is allowed)."""


class SpoolError(OopscopeError):
    """A spool file or a write to the spool is not valid (names query, link and the problem)."""


def os_error_text(exc: OSError) -> str:
    """An OS error as a user reads it, without the path Python repeats: "No space left on
    device (ENOSPC)". pyarrow's IO errors carry the errno too, in a longer text."""
    if exc.errno:
        return f"{os.strerror(exc.errno)} ({errno.errorcode.get(exc.errno, exc.errno)})"
    return str(exc)
