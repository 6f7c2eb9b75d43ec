"""Click parameter types shared by the oopscope commands: durations (`10s`, `1min`, `2h`), counts
(`5M`) and memory sizes (`512MiB`, `4GiB`).

They parse with plain functions (`parse_duration`, `parse_count`) that library code and tests can
call directly; the click types only turn their `ValueError` into a usage error naming the option.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import click

from common.units import NS_PER_S as _NS
from queries.expressions import Duration as GsqlDuration

#: duration units -> nanoseconds: the GSQL window units, plus the sub-second and day units and
#: the short `m` that command lines use (GSQL keeps `m` out: `RANGE 5 m` reads as a typo)
DURATION_UNITS: dict[str, int] = {
    **GsqlDuration.UNIT_NS,
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "m": 60 * _NS,
    "d": 86400 * _NS,
    "day": 86400 * _NS,
    "days": 86400 * _NS,
}

#: count suffixes (decimal, as traffic people write rates: 110k pkts/s, 5M packets)
COUNT_SUFFIXES: dict[str, int] = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zµ]*)\s*$", re.IGNORECASE)
#: memory size suffixes (binary, as memory is counted: 4G is 4 GiB)
SIZE_SUFFIXES: dict[str, int] = {"": 1, "b": 1, **{f"{p}{s}": 1 << (10 * (i + 1))
                                                 for i, p in enumerate("kmgt")
                                                 for s in ("", "b", "ib")}}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_COUNT_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmg]?)\s*$", re.IGNORECASE)


def parse_duration(text: str | int | float) -> int:
    """A duration in nanoseconds from `10s`, `1min`, `2h`, `250ms`, `1.5s` or a bare number of seconds."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        if text < 0:
            raise ValueError(f"a duration cannot be negative: {text!r}")
        return int(round(text * _NS))
    m = _DURATION_RE.match(text)
    if m is None:
        raise ValueError(
            f"not a duration: {text!r} (write a number and a unit: 10s, 1min, 2h, 250ms)")
    number, unit = m.group(1), m.group(2).lower()
    scale = _NS if unit == "" else DURATION_UNITS.get(unit)
    if scale is None:
        allowed = ", ".join(sorted(set(DURATION_UNITS) - {"µs"}))
        raise ValueError(f"unknown duration unit {m.group(2)!r} in {text!r} (allowed: {allowed})")
    # exact for integers; fractions are rounded to the nanosecond
    if "." in number:
        return int(round(float(number) * scale))
    return int(number) * scale


def parse_count(text: str | int) -> int:
    """A non-negative count from `5000000`, `5M`, `260k`, `1.5M` (decimal suffixes)."""
    if isinstance(text, bool):
        raise ValueError(f"not a count: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"a count cannot be negative: {text!r}")
        return text
    m = _COUNT_RE.match(str(text))
    if m is None:
        raise ValueError(f"not a count: {text!r} (write an integer, optionally with k, M or G: 260k, 5M)")
    scale = COUNT_SUFFIXES[m.group(2).lower()]
    value = float(m.group(1)) * scale if "." in m.group(1) else int(m.group(1)) * scale
    if value != int(value):
        raise ValueError(f"not a whole count: {text!r}")
    return int(value)


def parse_size(text: str | int) -> int:
    """A positive number of bytes from `512MiB`, `4GiB`, `4G`, `1.5GiB` or a bare number of
    bytes (binary suffixes: K, M, G, T, with or without B or iB)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        scale = SIZE_SUFFIXES.get(m.group(2).lower()) if m else None
        if m is None or scale is None:
            raise ValueError(f"not a size: {text!r} (write a number and a unit: 512MiB, "
                             f"4GiB, 2G)")
        value = int(float(m.group(1)) * scale) if "." in m.group(1) else int(m.group(1)) * scale
    if value <= 0:
        raise ValueError(f"a size must be positive: {text!r}")
    return value


def format_duration(ns: int) -> str:
    """The shortest exact spelling of a duration (for messages and manifests)."""
    for unit, scale in (("h", 3600 * _NS), ("min", 60 * _NS), ("s", _NS), ("ms", 1_000_000), ("us", 1_000)):
        if ns and ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"


class Duration(click.ParamType):
    """A click option value like `10s`, `1min`, `2h`: converted to integer nanoseconds."""

    name = "duration"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Count(click.ParamType):
    """A click option value like `5M`, `260k`, `1000`: converted to an int."""

    name = "count"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return parse_count(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Size(click.ParamType):
    """A click option value like `512MiB`, `4GiB`: converted to a number of bytes."""

    name = "size"

    def convert(self, value, param, ctx):
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class ActiveTimeouts(NamedTuple):
    """`--netflow-in-active-timeout`, repeated: the active timeout of every exporter
    (`default_ns`) and the operator's own for some of them ((address, ns) pairs)."""

    default_ns: int
    exporters: tuple[tuple[str, int], ...] = ()


#: the active timeout of exporters given none (softflowd's and Cisco's default)
DEFAULT_ACTIVE_TIMEOUT = "30min"


def parse_active_timeout(text: str) -> tuple[str | None, int]:
    """(exporter address or None for every exporter, ns) from `30min` or `192.0.2.1=60s`
    (`[2001:db8::1]=60s`); ValueError saying what is wrong."""
    from capture.flowreader import exporter_key

    exporter, sep, duration = text.rpartition("=")
    if not sep:
        return None, parse_duration(text)
    try:
        key = exporter_key(exporter)
    except ValueError:
        raise ValueError(f"{exporter!r} in {text!r} is not an exporter's IP address (write "
                         f"DURATION for every exporter, or EXPORTER=DURATION: "
                         f"192.0.2.1=60s)") from None
    return key, parse_duration(duration)


def active_timeouts(values) -> ActiveTimeouts:
    """The `ActiveTimeouts` of the option's values (each `D` or `EXPORTER=D`); ValueError
    when one is malformed or an exporter (or every exporter) is given two."""
    default: int | None = None
    exporters: dict[str, int] = {}
    for text in values:
        exporter, ns = parse_active_timeout(str(text))
        if exporter is None:
            if default is not None and default != ns:
                raise ValueError(f"two active timeouts for every exporter "
                                 f"({format_duration(default)} and {text}); give one, and "
                                 f"EXPORTER=DURATION for the exporters that differ")
            default = ns
        elif exporters.setdefault(exporter, ns) != ns:
            raise ValueError(f"two active timeouts for exporter {exporter} "
                             f"({format_duration(exporters[exporter])} and "
                             f"{format_duration(ns)})")
    if default is None:
        default = parse_duration(DEFAULT_ACTIVE_TIMEOUT)
    return ActiveTimeouts(default, tuple(sorted(exporters.items())))


def _active_timeouts(ctx, param, values) -> ActiveTimeouts:
    try:
        return active_timeouts(values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def active_timeout_option(help_text: str):
    """`--netflow-in-active-timeout [EXPORTER=]DURATION` (repeatable) as the
    `netflow_in_timeout` argument, an `ActiveTimeouts`."""
    return click.option(
        "--netflow-in-active-timeout", "netflow_in_timeout", multiple=True,
        metavar="[EXPORTER=]DURATION", callback=_active_timeouts,
        help=f"{help_text} Repeatable: DURATION for every exporter (default "
             f"{DEFAULT_ACTIVE_TIMEOUT}), EXPORTER=DURATION for one (its IP address), which "
             f"goes before the timeout the exporter sends.")


DURATION = Duration()
COUNT = Count()


def schema_option(fn):
    """`--schema FILE` (repeatable) as the `schema_files` argument: GS-lite schema files
    declaring record protocols (queries.schemafile). Commands build the schema with
    `queries.schemafile.schema_for(query_paths, schema_files)`, which reads the
    packet_schema.txt beside each query file when no --schema is given."""
    return click.option(
        "--schema", "schema_files", multiple=True, metavar="FILE",
        type=click.Path(exists=True, dir_okay=False),
        help="A schema file (GS-lite's packet_schema.txt format) declaring record protocols "
             "(repeatable). Without --schema, the packet_schema.txt beside the query file is "
             "read (as in GS-lite); with it, only the files named.")(fn)


def functions_option(fn):
    """`--functions FILE` (repeatable) and `--udf MODULE.py` as the `function_files` and
    `udf_module` arguments: user-defined functions declared in GS-lite's external_fcns.def
    syntax and the Python module implementing them (queries.udf). Commands build the library
    with `tools.pipeline.config.functions_of(function_files, udf_module)`."""
    fn = click.option(
        "--udf", "udf_module", metavar="MODULE.py", default=None,
        type=click.Path(exists=True, dir_okay=False),
        help="The Python module implementing the declared functions: one callable per "
             "name, called with numpy arrays (docs/gsql.md, user-defined functions).")(fn)
    return click.option(
        "--functions", "function_files", multiple=True, metavar="FILE",
        type=click.Path(exists=True, dir_okay=False),
        help="A declarations file in GS-lite's external_fcns.def syntax "
             "(`float FUN [LFTA_LEGAL] f(uint, float HANDLE);`), repeatable.")(fn)
