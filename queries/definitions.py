"""DEFINE keys and PARAM values: what is allowed, checked the same way for files and `--set`.

Also GS-lite's DEFINE keys (accepted with a warning: they change nothing here) and its `#name`
references to a DEFINE value, which `substitute_refs` replaces by the value.
"""

from __future__ import annotations

import ipaddress
import re

from common.errors import ConfigError
from queries import expressions as E
from queries.expressions import Duration
from queries.hints import did_you_mean
from queries.plan import FLUSH_POLICIES
from queries.tokens import MAX_NAME_LENGTH
from queries.types import MAX_WINDOW_NS, NS_PER_DAY

LATE_POLICIES = ("drop", "correct")
FLOW_ENDS = ("fin_rst", "none")
#: DEFINE keys that switch a query into flow mode (the low level's flow table)
FLOW_KEYS = ("idle_timeout", "flow_end")
#: DEFINE key -> what its value must be
DEFINE_KEYS = {
    "query_name": "a name",
    "aggregate_slots": "a positive integer",
    "expected_groups": "a positive integer",
    "max_aggregate_slots": "a positive integer",
    "flush": " | ".join(FLUSH_POLICIES),
    "slow_flush": "a positive integer",
    "max_lfta_disorder": "a positive integer",
    "late": " | ".join(LATE_POLICIES),
    "idle_timeout": "a positive duration (15s, 500ms, 2min; a bare number is seconds)",
    "flow_end": " | ".join(FLOW_ENDS),
    "comment": "text",
    "title": "text",
    "order_by": "output columns, each with ASC or DESC if wanted ('bytes DESC, srcIP')",
}


#: DEFINE keys GS-lite knows that oopscope has no use for: accepted with a warning. From the
#: Tigon SQL manual (6.3.2 "Options (DEFINE Block)": real_time, lfta_aggregation, select_lfta,
#: algorithm, num_bloom, bloom_size, namespace, print_warnings; 13.8: visibility) and GS-lite's
#: translate_fta.cc / stream_query.cc (reusable, liveness_timeout); _referenced_ifaces is one
#: GS-lite's compiler writes into the queries of its GDAT stream headers (contributor manual 6.1)
GSLITE_DEFINE_KEYS = frozenset({
    "real_time", "lfta_aggregation", "select_lfta", "algorithm", "num_bloom", "bloom_size",
    "namespace", "print_warnings", "visibility", "reusable", "liveness_timeout",
    "_referenced_ifaces",
})


#: the largest value of each integer DEFINE key: the table's slots are allocated at once
#: (2^30 slots take tens of GB already); the others are counts the kernels keep in int64
DEFINE_MAX = {"aggregate_slots": 1 << 30, "max_aggregate_slots": 1 << 30,
              "expected_groups": 1 << 29, "slow_flush": 2**31 - 1,
              "max_lfta_disorder": 2**31 - 1}


def _positive(key: str, value) -> int:
    try:
        n = int(str(value).strip(), 0) if not isinstance(value, int) else value
    except ValueError:
        n = None
    if n is None or isinstance(value, (bool, float)) or n <= 0:
        raise ConfigError(f"DEFINE {key}: {value!r} is not a positive integer")
    if n > DEFINE_MAX[key]:
        raise ConfigError(f"DEFINE {key}: {n} is too large (at most {DEFINE_MAX[key]:,})")
    return n


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)
_UNITS = {**Duration.UNIT_NS, "ns": 1, "us": 1_000}
#: the longest DEFINE duration (idle_timeout), as the longest window
MAX_DURATION_NS = MAX_WINDOW_NS


def duration_ns(key: str, value) -> int:
    """A positive duration in ns from `15s`, `500ms`, `2min`, `1.5s` or a number of seconds."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, (int, float)):
        ns_float = value * 10**9
    else:
        m = _DURATION.match(str(value))
        unit = m.group(2).lower() if m else ""
        if m is None or (unit and unit not in _UNITS):
            raise ConfigError(f"DEFINE {key}: {value!r} is not a duration (write a number and "
                              f"a unit: 15s, 500ms, 2min; units {', '.join(_UNITS)})")
        ns_float = float(m.group(1)) * (_UNITS[unit] if unit else 10**9)
    # times are int64 nanoseconds: a longer duration cannot be compared with them
    if not ns_float <= MAX_DURATION_NS:
        raise ConfigError(f"DEFINE {key}: {value!r} is too long (at most "
                          f"{MAX_DURATION_NS // NS_PER_DAY // 365} years)")
    ns = int(round(ns_float))
    if ns <= 0:
        raise ConfigError(f"DEFINE {key}: {value!r} is not a positive duration")
    return ns


def check_define(key: str, value) -> tuple[str, object]:
    """The normalised (key, value) of a DEFINE entry or `--set key=value`; ConfigError if wrong."""
    k = str(key).lower()
    if k not in DEFINE_KEYS:
        raise ConfigError(f"unknown DEFINE key {key!r}{did_you_mean(k, DEFINE_KEYS)} (allowed: "
                          f"{', '.join(DEFINE_KEYS)}; GS-lite's own keys are accepted with a "
                          f"warning, and any key the query reads as #{k} holds a literal)")
    if k in ("aggregate_slots", "expected_groups", "max_aggregate_slots", "slow_flush",
             "max_lfta_disorder"):
        return k, _positive(k, value)
    if k == "flush":
        v = str(value).lower()
        if v not in FLUSH_POLICIES:
            raise ConfigError(f"DEFINE flush: {value!r} is not one of {', '.join(FLUSH_POLICIES)}"
                              f"{did_you_mean(v, FLUSH_POLICIES)}")
        return k, v
    if k == "idle_timeout":
        return k, duration_ns(k, value)
    if k == "flow_end":
        v = str(value).lower()
        if v not in FLOW_ENDS:
            raise ConfigError(f"DEFINE flow_end: {value!r} is not one of {', '.join(FLOW_ENDS)}"
                              f"{did_you_mean(v, FLOW_ENDS)}")
        return k, v
    if k == "late":
        v = str(value).lower()
        if v not in LATE_POLICIES:
            raise ConfigError(f"DEFINE late: {value!r} is not one of {', '.join(LATE_POLICIES)}"
                              f"{did_you_mean(v, LATE_POLICIES)}")
        return k, v
    if k == "order_by":
        order = row_order(value)
        return k, ", ".join(f"{name} DESC" if desc else name for name, desc in order)
    if k == "query_name":
        v = str(value)
        if len(v) > MAX_NAME_LENGTH:
            raise ConfigError(f"DEFINE query_name: a name of {len(v):,} characters is too long "
                              f"(at most {MAX_NAME_LENGTH}: it names files and directories)")
        if not v.replace("_", "a").isalnum() or v[0].isdigit():
            raise ConfigError(f"DEFINE query_name: {value!r} is not a name (letters, digits, _)")
        return k, v
    return k, str(value)


_ORDER_ITEM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)(?:\s+(ASC|DESC))?\s*$", re.IGNORECASE)


def row_order(value) -> list[tuple[str, bool]]:
    """DEFINE order_by's (column, descending) pairs from `bytes DESC, srcIP` (our extension:
    GSQL has no ORDER BY; the rows of each window are written in this order)."""
    items = str(value).split(",")
    order = []
    for item in items:
        m = _ORDER_ITEM.match(item)
        if m is None:
            raise ConfigError(f"DEFINE order_by: {value!r} is not a list of output columns, "
                              f"each with ASC or DESC if wanted ('bytes DESC, srcIP')")
        order.append((m.group(1), (m.group(2) or "").upper() == "DESC"))
    return order


def is_gslite_key(key: str) -> bool:
    """Whether a DEFINE key is one of GS-lite's that oopscope ignores (with a warning)."""
    return str(key).lower() in GSLITE_DEFINE_KEYS and str(key).lower() not in DEFINE_KEYS


def define_refs(node: E.Node) -> set[str]:
    """The DEFINE keys a statement reads through GS-lite's `#name` (lower case)."""
    return {ref.name for ref in node.find_all(E.DefineRef)}


def substitute_refs(node: E.Node) -> E.Node:
    """`node` with every `#name` replaced by its DEFINE value (a Literal at the reference's
    own position, so later errors point at the reference)."""
    if not any(True for _ in node.find_all(E.DefineRef)):
        return node

    def swap(n: E.Node) -> E.Node:
        if isinstance(n, E.DefineRef):
            return E.Literal(pos=n.pos, **n.value.args)
        return n

    return node.transform(swap)


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
