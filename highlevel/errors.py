"""Errors of the high level (Spark stage, sinks), derived from the one oopscope hierarchy."""

from __future__ import annotations

from common.errors import ConfigError, OopscopeError


class HighLevelError(OopscopeError):
    """The Spark stage cannot run a query: says which query and what is wrong."""


class StageConfigError(HighLevelError, ConfigError):
    """A high-level configuration value is not allowed (says what is allowed)."""


class SinkError(HighLevelError):
    """A result sink cannot be written (names the sink and the path)."""


class CacheError(HighLevelError):
    """The cache directory of the JVM's start-up cannot be used (names it and says why)."""


class WorkerPythonError(HighLevelError):
    """A cluster's executors cannot run oopscope's Python (names the interpreter, the host and
    what to do)."""
