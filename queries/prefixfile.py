"""GS-lite prefix files, getlpmid's HANDLE argument: read, checked, and turned into the table
of address intervals that the lookup kernel (`lowlevel.lpm`) searches.

A prefix file (Tigon SQL user manual 12.3) holds one prefix per line, `address/length|id`:

    0.0.0.0/0|0
    1.2.3.4/29|5
    2001:db8::/32|9

IPv4 and IPv6 prefixes may share a file; blank lines and lines starting with `#` or `//` are
skipped; bits of the address beyond the length are ignored (the manual's `1.2.3.4/29` is
`1.2.3.0/29`); the id is a uint.

The table is the sorted disjoint intervals of the 128-bit address space (IPv4 as IPv4-mapped
addresses, `::ffff:a.b.c.d`, the form of the `ip` type), each with the id of the longest
prefix covering it. The file is read as the run's `common.datafiles.DataFiles` allows (the
appliance: only below its --data-dir directories; always a regular file up to a size cap).
Tables are kept per version of the file (path, inode, modification time, size): the analyser
reads a query's file (an error at the call), the evaluators find its table made, and a
changed file is parsed again by the next query that asks.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from common.datafiles import ANY_FILE, DataFileError, DataFiles

log = logging.getLogger(__name__)

U64 = np.uint64
_MASK64 = (1 << 64) - 1
MAPPED = 0xFFFF << 32             # ::ffff:0:0/96, where IPv4 addresses sit
_TOP = (1 << 128) - 1
UINT_MAX = 2**32 - 1
#: the id of an address no prefix holds (the manual, 9.1.1)
NO_MATCH = -1


class PrefixFileError(ValueError):
    """A prefix file that cannot be read, or one of its lines that is not a prefix."""

    def __init__(self, path: str, message: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"prefix file {where}: {message}")
        self.path = path
        self.line = line


class Prefix(NamedTuple):
    """One line of a prefix file: the first address (128-bit, IPv4-mapped for IPv4), the
    length in the 128-bit space, the id and the line it came from."""

    start: int
    length: int
    ident: int
    line: int


class PrefixTable(NamedTuple):
    """Disjoint intervals covering the whole address space, sorted: interval k runs from
    (starts_hi[k], starts_lo[k]) to the next start, and its id is ids[k] (-1: no prefix)."""

    starts_hi: np.ndarray
    starts_lo: np.ndarray
    ids: np.ndarray
    prefixes: int


def parse_prefix_line(text: str, path: str, line: int) -> Prefix | None:
    """A prefix of one line of a prefix file (None for a blank line or a comment). An error
    names the line and what is wrong, never its text: the file may not be a prefix file at
    all, and whoever named it may not be allowed to read it."""
    body = text.strip()
    if not body or body.startswith("#") or body.startswith("//"):
        return None
    example = "write address/length|id, e.g. 10.0.0.0/8|1"
    if body.count("|") != 1:
        raise PrefixFileError(path, f"the line is not a prefix line ({example})", line)
    prefix, ident_text = (part.strip() for part in body.split("|"))
    if "/" not in prefix:
        raise PrefixFileError(path, f"the address has no prefix length ({example})", line)
    try:
        net = ipaddress.ip_network(prefix, strict=False)
    except ValueError:
        raise PrefixFileError(path, f"the address is not an IPv4 or IPv6 prefix ({example})",
                              line) from None
    if not ident_text.isdigit() or int(ident_text) > UINT_MAX:
        raise PrefixFileError(path, f"the id is not a uint (0 to {UINT_MAX})", line)
    if net.version == 4:
        return Prefix(MAPPED | int(net.network_address), 96 + net.prefixlen,
                      int(ident_text), line)
    return Prefix(int(net.network_address), net.prefixlen, int(ident_text), line)


def parse_prefix_text(data: bytes, path: str) -> list[Prefix]:
    """Every prefix of a prefix file's bytes (PrefixFileError naming the file and line of a
    bad one, or of a prefix given twice with different ids)."""
    seen: dict[tuple[int, int], Prefix] = {}
    out = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PrefixFileError(path, "not UTF-8 text", number) from None
        p = parse_prefix_line(text, path, number)
        if p is None:
            continue
        other = seen.get((p.start, p.length))
        if other is not None:
            if other.ident != p.ident:
                raise PrefixFileError(path, f"the prefix of line {other.line} is given again "
                                      f"with another id ({other.ident}, then {p.ident})", number)
            continue
        seen[(p.start, p.length)] = p
        out.append(p)
    return out


def parse_prefix_file(path: str, files: DataFiles = ANY_FILE) -> list[Prefix]:
    """Every prefix of the file `path` names, read as `files` allows (PrefixFileError)."""
    try:
        return parse_prefix_text(files.read(path), path)
    except DataFileError as exc:
        raise PrefixFileError(path, exc.rule) from None


def build_table(prefixes: list[Prefix]) -> PrefixTable:
    """The intervals of a set of prefixes. Prefixes are nested or disjoint, so a sweep in
    address order with a stack of the prefixes holding the current address finds, for each
    interval, the innermost (longest) one."""
    starts: list[int] = [0]
    ids: list[int] = [NO_MATCH]

    def begin(pos: int, ident: int) -> None:
        if pos > _TOP:
            return
        if starts[-1] == pos:      # a prefix starting where another starts or ends
            ids[-1] = ident
        else:
            starts.append(pos)
            ids.append(ident)

    stack: list[tuple[int, int]] = []     # (last address, id) of the open prefixes
    for p in sorted(prefixes, key=lambda p: (p.start, p.length)):
        while stack and stack[-1][0] < p.start:
            end, _ = stack.pop()
            begin(end + 1, stack[-1][1] if stack else NO_MATCH)
        begin(p.start, p.ident)
        stack.append((p.start | (_TOP >> p.length), p.ident))
    while stack:
        end, _ = stack.pop()
        begin(end + 1, stack[-1][1] if stack else NO_MATCH)
    keep = [0] + [k for k in range(1, len(ids)) if ids[k] != ids[k - 1]]
    return PrefixTable(np.array([starts[k] >> 64 for k in keep], U64),
                       np.array([starts[k] & _MASK64 for k in keep], U64),
                       np.array([ids[k] for k in keep], np.int64), len(prefixes))


#: tables of the prefix files read lately, by the version of the file (`OpenDataFile.version`)
_TABLES: OrderedDict[tuple, PrefixTable] = OrderedDict()
_TABLES_LOCK = threading.Lock()
_KEPT = 32


def load_table(path: str, files: DataFiles = ANY_FILE) -> PrefixTable:
    """The table of the prefix file `path` names, read as `files` allows (its directories, a
    regular file, its size cap) and parsed once per version of the file (PrefixFileError).
    The evaluators call it per batch: an unchanged file is opened and its status read, not
    its bytes."""
    try:
        with files.open(path) as f:
            with _TABLES_LOCK:
                table = _TABLES.get(f.version)
                if table is not None:
                    _TABLES.move_to_end(f.version)
                    return table
            data = f.read()
    except DataFileError as exc:
        raise PrefixFileError(path, exc.rule) from None
    table = build_table(parse_prefix_text(data, path))
    log.info("prefix file %s: %d prefixes, %d intervals", f.path, table.prefixes,
             len(table.ids))
    with _TABLES_LOCK:
        _TABLES[f.version] = table
        while len(_TABLES) > _KEPT:
            _TABLES.popitem(last=False)
    return table
