"""Which separator a line of CSV records is written with, for the hint a run gives when
every record of a link was malformed (a wrong `--csv-separator`, or space-separated text).

`separator_hint(line, layout, used)` tries the usual separators on a record file's first
line and names the one under which every field the protocol reads parses as its type. It
says which option to give, never what the line holds (errors about a file do not echo it).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from capture.recordsource import FieldReader

#: the separators tried, as `--csv-separator` names them
CANDIDATES = ((",", "','"), ("|", "'|'"), (";", "';'"), ("\t", "tab"), (" ", "space"))

_INT = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT = re.compile(r"(?i)^\s*[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|inf|infinity|nan)\s*$")
_INT_RANGE = {"ushort": (0, 2**16 - 1), "uint": (0, 2**32 - 1), "ullong": (0, 2**64 - 1),
              "int": (-2**31, 2**31 - 1), "llong": (-2**63, 2**63 - 1)}


def _value_fits(kind: str, text: str) -> bool:
    """Whether one field's text reads as a value of GS-lite access type `kind`."""
    if kind in _INT_RANGE:
        lo, hi = _INT_RANGE[kind]
        return bool(_INT.match(text)) and lo <= int(text) <= hi
    if kind == "float":
        return bool(_FLOAT.match(text))
    try:
        if kind == "ip":
            ipaddress.IPv4Address(text.strip())
        elif kind == "ipv6":
            ipaddress.IPv6Address(text.strip())
    except ValueError:
        return False
    return True        # strings and booleans: any text


def fits(fields: Sequence[str], layout: Sequence[FieldReader]) -> bool:
    """Whether a line cut into `fields` holds every CSV field of `layout`, each of its type."""
    csv = [r for r in layout if r.source == "csv"]
    return bool(csv) and all(r.position <= len(fields) and
                             _value_fits(r.kind, fields[r.position - 1]) for r in csv)


def separator_hint(line: bytes, layout: Sequence[FieldReader], used: str | None) -> str:
    """What to give so that `line` (a first record) reads as `layout`'s fields: a
    `--csv-separator` other than `used`, or squeezing runs of spaces; else a general hint."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    for sep, name in CANDIDATES:
        if sep != used and fits(text.split(sep), layout):
            return f"its first line reads as the protocol's fields with --csv-separator {name}"
    if fits(text.split(), layout):
        return ("its first line reads as the protocol's fields split at runs of spaces: "
                "squeeze them to one (tr -s ' ') and give --csv-separator space")
    return ("no separator makes its first line the protocol's fields: check the separator "
            "(--csv-separator) and the fields' positions (get_csv_<type>_pos<N>)")
