"""Flow records as numpy columns: an Arrow table of `netflow` rows (text or integer addresses) in.

The `netflow` query's contract: tb, srcIP, destIP, srcPort, destPort, protocol, packets, bytes,
first_ns, last_ns, tcp_flags, tos, vlan, ipversion, end_reason (plus an optional `input`
ingress ifindex). Only the 5-tuple, the counters and the two times are required; a missing
optional column takes its default. Addresses come as text (dotted quad for IPv4 and
IPv4-mapped IPv6, RFC 5952 for IPv6: what `oopscope run` writes and CSV/JSONL/Parquet read
back) or as 32-bit integers (IPV4 columns before display). Text is parsed once per distinct
address (dictionary encoding), IPv4 strings vectorised, so a table of millions of rows costs
no Python per row. Times become ms since the epoch, floored (NetFlow's resolution).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tools.errors import NetflowInputError

REQUIRED = ("srcIP", "destIP", "srcPort", "destPort", "protocol", "packets", "bytes",
            "first_ns", "last_ns")
#: IPFIX flowEndReason when the rows carry none: a bucket's end is NetFlow's active timeout
DEFAULT_END_REASON = 2
_MAPPED = np.uint64(0xFFFF_0000_0000)
_IPV4_TEXT = r"^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$"


@dataclass
class FlowRecords:
    """One row per flow record; addresses as 128-bit (hi, lo) halves, IPv4 IPv4-mapped."""

    src_hi: np.ndarray     # uint64
    src_lo: np.ndarray     # uint64
    dst_hi: np.ndarray
    dst_lo: np.ndarray
    is_v6: np.ndarray      # bool
    src_port: np.ndarray   # uint16
    dst_port: np.ndarray   # uint16
    protocol: np.ndarray   # uint8
    packets: np.ndarray    # uint64
    bytes: np.ndarray      # uint64
    first_ms: np.ndarray   # int64, ms since the epoch
    last_ms: np.ndarray    # int64
    tcp_flags: np.ndarray  # uint8
    tos: np.ndarray        # uint8
    vlan: np.ndarray       # uint16
    input: np.ndarray      # uint32 ingress ifindex
    end_reason: np.ndarray  # uint8, IPFIX flowEndReason

    def __len__(self) -> int:
        return len(self.packets)

    def take(self, index) -> FlowRecords:
        return FlowRecords(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    @property
    def src_v4(self) -> np.ndarray:
        return (self.src_lo & np.uint64(0xFFFF_FFFF)).astype(np.uint32)

    @property
    def dst_v4(self) -> np.ndarray:
        return (self.dst_lo & np.uint64(0xFFFF_FFFF)).astype(np.uint32)

    @classmethod
    def empty(cls) -> FlowRecords:
        return from_table(pa.table({k: pa.array([], pa.int64()) for k in REQUIRED}))


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _ints(table: pa.Table, name: str, dtype, default: int = 0, where: str = "") -> np.ndarray:
    """A numeric column as `dtype` (nulls -> default); a missing optional column -> default."""
    n = table.num_rows
    if name not in table.column_names:
        return np.full(n, default, dtype=dtype)
    col = _column(table, name)
    if pa.types.is_null(col.type):
        return np.full(n, default, dtype=dtype)
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.timestamp("ns")).cast(pa.int64())
    elif pa.types.is_boolean(col.type):
        col = col.cast(pa.int64())
    elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        try:
            col = col.cast(pa.int64())
        except pa.ArrowInvalid as exc:
            raise NetflowInputError(f"{where}column {name!r} is not numeric: {exc}") from None
    elif not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise NetflowInputError(f"{where}column {name!r} has type {col.type}, not a number")
    values = np.asarray(col.fill_null(default).to_numpy(zero_copy_only=False))
    if values.dtype.kind == "f":
        values = np.floor(values)
    if values.dtype.kind in "iuf" and len(values) and values.min() < 0:
        row = int(np.argmax(values < 0))
        raise NetflowInputError(f"{where}column {name!r} row {row}: negative value {values[row]}")
    return values.astype(dtype)


def _parse_text(texts: list, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) of distinct address strings: IPv4 vectorised, others through ipaddress."""
    arr = pa.array(texts, pa.string())
    n = len(arr)
    hi = np.zeros(n, np.uint64)
    lo = np.zeros(n, np.uint64)
    v4 = np.asarray(pc.match_substring_regex(arr, _IPV4_TEXT).fill_null(False))
    if v4.any():
        parts = pc.split_pattern(arr.filter(pa.array(v4)), ".")
        octets = np.asarray(pc.list_flatten(parts).cast(pa.int64())).reshape(-1, 4)
        if (octets > 255).any():
            bad = texts[int(np.flatnonzero(v4)[np.argmax((octets > 255).any(axis=1))])]
            raise NetflowInputError(f"{where}column {name!r}: {bad!r} is not an IP address")
        value = (octets[:, 0] << 24) | (octets[:, 1] << 16) | (octets[:, 2] << 8) | octets[:, 3]
        lo[v4] = _MAPPED | value.astype(np.uint64)
    for i in np.flatnonzero(~v4):  # one Python call per distinct IPv6 address, not per row
        try:
            value = int(ipaddress.IPv6Address(str(texts[i]).strip()))
        except ValueError:
            raise NetflowInputError(f"{where}column {name!r}: {texts[i]!r} is not an "
                                    f"IP address") from None
        hi[i] = np.uint64(value >> 64)
        lo[i] = np.uint64(value & 0xFFFF_FFFF_FFFF_FFFF)
    return hi, lo


def _addresses(table: pa.Table, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) uint64 halves of an address column (text, or 32-bit IPv4 integers)."""
    col = _column(table, name)
    if len(col) == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    if col.null_count:
        row = int(np.argmax(np.asarray(col.is_null())))
        raise NetflowInputError(f"{where}column {name!r} row {row}: no address (null)")
    if pa.types.is_integer(col.type):
        v = np.asarray(col.cast(pa.uint64()))
        v = np.where((v >> np.uint64(32)) == np.uint64(0xFFFF), v & np.uint64(0xFFFF_FFFF), v)
        if len(v) and v.max() > 0xFFFF_FFFF:
            row = int(np.argmax(v > 0xFFFF_FFFF))
            raise NetflowInputError(f"{where}column {name!r} row {row}: integer {v[row]} is not "
                                    f"an IPv4 address (write IPv6 addresses as text)")
        return np.zeros(len(v), np.uint64), _MAPPED | v
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise NetflowInputError(f"{where}column {name!r} has type {col.type}, not an address")
    encoded = pc.dictionary_encode(col)
    hi, lo = _parse_text(encoded.dictionary.to_pylist(), name, where)
    idx = np.asarray(encoded.indices)
    return hi[idx], lo[idx]


def _from_frame(df) -> pa.Table:
    """A DataFrame (e.g. the reference evaluator's) as Arrow; 128-bit Python-int addresses
    become text, converted once per distinct value."""
    import pandas as pd

    df = df.copy()
    for name in ("srcIP", "destIP"):
        if name in df.columns and df[name].dtype == object and len(df) \
                and isinstance(df[name].iloc[0], int):
            codes, uniques = pd.factorize(df[name])
            values = [int(u) for u in uniques]
            text = address_text(np.array([u >> 64 for u in values], np.uint64),
                                np.array([u & 0xFFFF_FFFF_FFFF_FFFF for u in values], np.uint64))
            df[name] = np.asarray(text, dtype=object)[codes]
    return pa.Table.from_pandas(df, preserve_index=False)


def from_table(table, where: str = "") -> FlowRecords:
    """Flow records of an Arrow table (or a pandas DataFrame) of `netflow` rows.

    `where` prefixes error messages (e.g. the file name)."""
    if not isinstance(table, pa.Table):
        table = _from_frame(table)
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise NetflowInputError(f"{where}flow records lack the column(s) {', '.join(missing)} "
                                f"(a table of the netflow query's rows has "
                                f"{', '.join(REQUIRED)}, ...)")
    src_hi, src_lo = _addresses(table, "srcIP", where)
    dst_hi, dst_lo = _addresses(table, "destIP", where)
    mapped = ((src_hi == 0) & ((src_lo >> np.uint64(32)) == np.uint64(0xFFFF))
              & (dst_hi == 0) & ((dst_lo >> np.uint64(32)) == np.uint64(0xFFFF)))
    if "ipversion" in table.column_names:
        version = _ints(table, "ipversion", np.uint8, 0, where)
        # an IPv6 flow between IPv4-mapped addresses stays IPv6; unknown (0) follows the form
        is_v6 = np.where(version == 0, ~mapped, version == 6) | ~mapped
    else:
        is_v6 = ~mapped
    first_ns = _ints(table, "first_ns", np.int64, 0, where)
    last_ns = _ints(table, "last_ns", np.int64, 0, where)
    return FlowRecords(
        src_hi=src_hi, src_lo=src_lo, dst_hi=dst_hi, dst_lo=dst_lo, is_v6=is_v6,
        src_port=_ints(table, "srcPort", np.uint16, 0, where),
        dst_port=_ints(table, "destPort", np.uint16, 0, where),
        protocol=_ints(table, "protocol", np.uint8, 0, where),
        packets=_ints(table, "packets", np.uint64, 0, where),
        bytes=_ints(table, "bytes", np.uint64, 0, where),
        first_ms=first_ns // 1_000_000, last_ms=last_ns // 1_000_000,
        tcp_flags=_ints(table, "tcp_flags", np.uint8, 0, where),
        tos=_ints(table, "tos", np.uint8, 0, where),
        vlan=_ints(table, "vlan", np.uint16, 0, where),
        input=_ints(table, "input", np.uint32, 0, where),
        end_reason=_ints(table, "end_reason", np.uint8, DEFAULT_END_REASON, where),
    )


def address_text(hi: np.ndarray, lo: np.ndarray) -> list[str]:
    """Addresses as text (dotted quad for IPv4-mapped, RFC 5952 otherwise), for tests and logs."""
    out = []
    for h, l in zip(hi.tolist(), lo.tolist()):
        if h == 0 and (l >> 32) == 0xFFFF:
            out.append(str(ipaddress.IPv4Address(l & 0xFFFF_FFFF)))
        else:
            out.append(str(ipaddress.IPv6Address((h << 64) | l)))
    return out
