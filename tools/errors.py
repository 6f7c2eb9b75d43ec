"""Errors of the tools (runs, NetFlow export): subclasses of the one hierarchy rooted in `common.errors`."""

from __future__ import annotations

from common.errors import ConfigError, LinkError, OopscopeError


class RunError(OopscopeError):
    """A run cannot start or finish: says which query, link or option and why."""


class UnsupportedQueryError(RunError):
    """A query of a kind the offline run does not execute yet (joins, query-on-query ...)."""


class RunLinkError(RunError, LinkError):
    """`--link` names do not match the links the query file reads."""


class RunConfigError(RunError, ConfigError):
    """An option of `oopscope run` is not valid (an unknown --output query, a bad format)."""


class NetflowError(OopscopeError):
    """The NetFlow exporter cannot run: a bad collector address, results file or record column."""


class NetflowTargetError(NetflowError, ConfigError):
    """A collector address is not HOST:PORT (or [IPv6]:PORT), or does not resolve."""


class NetflowInputError(NetflowError):
    """Flow records cannot be read or lack a required column (names the file and the column)."""
