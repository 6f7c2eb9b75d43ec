"""Errors of the high level (spool, Spark stage, sinks), derived from the one oopscope hierarchy."""

from __future__ import annotations

from capture.errors import ConfigError, OopscopeError


class HighLevelError(OopscopeError):
    """The Spark stage cannot run a query: says which query and what is wrong."""


class SpoolError(HighLevelError):
    """A spool file or a write to the spool is not valid (names query, link and the problem)."""


class StageConfigError(HighLevelError, ConfigError):
    """A high-level configuration value is not allowed (says what is allowed)."""


class SinkError(HighLevelError):
    """A result sink cannot be written (names the sink and the path)."""
