"""DEFINE keys and PARAM values: what is allowed, checked the same way for files and `--set`."""

from __future__ import annotations

import ipaddress
import re

from common.errors import ConfigError
from queries.expressions import Duration
from queries.plan import FLUSH_POLICIES

LATE_POLICIES = ("drop", "correct")
FLOW_ENDS = ("fin_rst", "none")
#: DEFINE keys that switch a query into flow mode (the low level's flow table)
FLOW_KEYS = ("idle_timeout", "flow_end")
#: DEFINE key -> what its value must be
DEFINE_KEYS = {
    "query_name": "a name",
    "aggregate_slots": "a positive integer",
    "flush": " | ".join(FLUSH_POLICIES),
    "slow_flush": "a positive integer",
    "max_lfta_disorder": "a positive integer",
    "late": " | ".join(LATE_POLICIES),
    "idle_timeout": "a positive duration (15s, 500ms, 2min; a bare number is seconds)",
    "flow_end": " | ".join(FLOW_ENDS),
    "comment": "text",
    "title": "text",
}


def _positive(key: str, value) -> int:
    try:
        n = int(str(value).strip(), 0) if not isinstance(value, int) else value
    except ValueError:
        n = None
    if n is None or isinstance(value, (bool, float)) or n <= 0:
        raise ConfigError(f"DEFINE {key}: {value!r} is not a positive integer")
    return n


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS = {**Duration.UNIT_NS, "ns": 1, "us": 1_000}


def duration_ns(key: str, value) -> int:
    """A positive duration in ns from `15s`, `500ms`, `2min`, `1.5s` or a number of seconds."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, (int, float)):
        ns = int(round(value * 10**9))
    else:
        m = _DURATION.match(str(value))
        unit = m.group(2).lower() if m else ""
        if m is None or (unit and unit not in _UNITS):
            raise ConfigError(f"DEFINE {key}: {value!r} is not a duration (write a number and "
                              f"a unit: 15s, 500ms, 2min; units {', '.join(_UNITS)})")
        ns = int(round(float(m.group(1)) * (_UNITS[unit] if unit else 10**9)))
    if ns <= 0:
        raise ConfigError(f"DEFINE {key}: {value!r} is not a positive duration")
    return ns


def check_define(key: str, value) -> tuple[str, object]:
    """The normalised (key, value) of a DEFINE entry or `--set key=value`; ConfigError if wrong."""
    k = str(key).lower()
    if k not in DEFINE_KEYS:
        raise ConfigError(f"unknown DEFINE key {key!r} (allowed: {', '.join(DEFINE_KEYS)})")
    if k in ("aggregate_slots", "slow_flush", "max_lfta_disorder"):
        return k, _positive(k, value)
    if k == "flush":
        v = str(value).lower()
        if v not in FLUSH_POLICIES:
            raise ConfigError(f"DEFINE flush: {value!r} is not one of {', '.join(FLUSH_POLICIES)}")
        return k, v
    if k == "idle_timeout":
        return k, duration_ns(k, value)
    if k == "flow_end":
        v = str(value).lower()
        if v not in FLOW_ENDS:
            raise ConfigError(f"DEFINE flow_end: {value!r} is not one of {', '.join(FLOW_ENDS)}")
        return k, v
    if k == "late":
        v = str(value).lower()
        if v not in LATE_POLICIES:
            raise ConfigError(f"DEFINE late: {value!r} is not one of {', '.join(LATE_POLICIES)}")
        return k, v
    if k == "query_name":
        v = str(value)
        if not v.replace("_", "a").isalnum() or v[0].isdigit():
            raise ConfigError(f"DEFINE query_name: {value!r} is not a name (letters, digits, _)")
        return k, v
    return k, str(value)


def parse_param_value(name: str, type_: str, text: str):
    """A run-time parameter's value (given as a string) converted to its declared PARAM type."""
    if not isinstance(text, str):
        text = str(text)
    s = text.strip()
    try:
        if type_ in ("uint", "ullong", "mac"):
            v = int(s, 0)
            if v < 0 or v >= 2**64:
                raise ValueError
            return v
        if type_ in ("int", "llong"):
            v = int(s, 0)
            if not -2**63 <= v < 2**63:
                raise ValueError
            return v
        if type_ == "float":
            return float(s)
        if type_ == "bool":
            if s.lower() in ("true", "1", "yes"):
                return True
            if s.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if type_ == "ipv4":
            return int(ipaddress.IPv4Address(s))
        if type_ == "ip":
            addr = ipaddress.ip_address(s)
            if addr.version == 4:
                return 0xFFFF_0000_0000 | int(addr)
            return int(addr)
        return s
    except ValueError:
        raise ConfigError(f"parameter {name}: {text!r} is not a {type_}") from None
