"""The one error hierarchy of oopscope: every user-facing error says what went wrong and where."""

from __future__ import annotations


class OopscopeError(Exception):
    """Base of every error oopscope reports to a user (the CLI prints it as one line, exit 1)."""


class CaptureError(OopscopeError):
    """A packet source cannot be read: bad file, unsupported link type, missing interface."""


class CaptureFormatError(CaptureError):
    """A capture file is malformed at a known place.

    Carries the file, the byte offset and the value found so the message can say all three.
    """

    def __init__(self, path: str, offset: int, problem: str, found: object = None):
        self.path = str(path)
        self.offset = int(offset)
        self.problem = problem
        self.found = found
        where = f"{self.path}: byte {self.offset}"
        what = problem if found is None else f"{problem} (found {found!r})"
        super().__init__(f"{where}: {what}")


class TruncatedCaptureError(CaptureFormatError):
    """The capture ends inside a record; every earlier packet has been delivered."""


class RingError(OopscopeError):
    """Misuse of a packet ring (wrong schema, capacity too small)."""


class LinkError(OopscopeError):
    """A query names a link the run was not given, or a link is given twice."""


class ConfigError(OopscopeError):
    """A run option or DEFINE override is not valid (says what is allowed)."""


class InterfaceError(LinkError, CaptureError):
    """A live interface cannot be captured: it does not exist, is of a kind we cannot decode,
    or the process lacks the right (root / CAP_NET_RAW)."""
