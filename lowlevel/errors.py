"""Errors of the low level: a plan the low level cannot run, or input it cannot take."""

from __future__ import annotations

from common.errors import OopscopeError


class LowLevelError(OopscopeError):
    """A low-level plan cannot be run as given (says which query, link and part)."""
