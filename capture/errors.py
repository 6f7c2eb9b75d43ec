"""Errors of packet sources: captures, rings, interfaces (the root classes are in common/errors.py)."""

from __future__ import annotations

from common.errors import LinkError, OopscopeError


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




class InterfaceError(LinkError, CaptureError):
    """A live interface cannot be captured: it does not exist, is of a kind we cannot decode,
    or the process lacks the right (root / CAP_NET_RAW)."""
