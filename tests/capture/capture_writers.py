"""Tiny pcap / pcapng writers for the capture tests: every byte order, resolution and block kind on demand.

Written from the format specifications independently of capture/ (struct only), so that the
reader is tested against files it did not produce.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

NS = 1_000_000_000


def pcap_bytes(records, link: int = 1, *, big: bool = False, nano: bool = False, snaplen: int = 65535) -> bytes:
    """A pcap file; records are (timestamp_ns, frame bytes) or (timestamp_ns, frame, wire_len)."""
    e = ">" if big else "<"
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, snaplen, link)]
    for rec in records:
        ts, frame = rec[0], bytes(rec[1])
        wire = rec[2] if len(rec) > 2 else len(frame)
        frac = ts % NS if nano else (ts % NS) // 1000
        out.append(struct.pack(e + "IIII", ts // NS, frac, len(frame), wire) + frame)
    return b"".join(out)


def _pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def _block(e: str, btype: int, body: bytes) -> bytes:
    body = _pad4(body)
    n = len(body) + 12
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def _option(e: str, code: int, value: bytes) -> bytes:
    return struct.pack(e + "HH", code, len(value)) + _pad4(value)


@dataclass
class Interface:
    link: int = 1
    tsresol: int | None = None     # the if_tsresol byte (None: default microseconds)
    snaplen: int = 0
    tsoffset: int = 0              # if_tsoffset, seconds


@dataclass
class Section:
    big: bool = False
    interfaces: list[Interface] = field(default_factory=list)
    # items: ("epb", ifid, ts_units, frame[, wire]) | ("spb", frame[, wire]) | ("opb", ifid, ts_units, frame)
    #        | ("raw", btype, body)  (any other block) | ("idb", Interface) (an interface declared late)
    items: list[tuple] = field(default_factory=list)


def ts_units(ts_ns: int, tsresol: int | None) -> int:
    """A timestamp in ns converted to the units of an if_tsresol byte."""
    if tsresol is None:
        return ts_ns // 1000
    if tsresol & 0x80:
        return (ts_ns << (tsresol & 0x7F)) // NS
    exp = tsresol
    return ts_ns * 10**exp // NS


def _idb(e: str, iface: Interface) -> bytes:
    opts = b""
    if iface.tsresol is not None:
        opts += _option(e, 9, bytes([iface.tsresol]))
    if iface.tsoffset:
        opts += _option(e, 14, struct.pack(e + "q", iface.tsoffset))
    if opts:
        opts += _option(e, 0, b"")
    return _block(e, 1, struct.pack(e + "HHI", iface.link, 0, iface.snaplen) + opts)


def pcapng_bytes(sections: list[Section]) -> bytes:
    out = []
    for sec in sections:
        e = ">" if sec.big else "<"
        out.append(_block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1)))
        for iface in sec.interfaces:
            out.append(_idb(e, iface))
        for item in sec.items:
            kind = item[0]
            if kind == "epb":
                _, ifid, ts, frame, *wire = item
                frame = bytes(frame)
                w = wire[0] if wire else len(frame)
                out.append(_block(e, 6, struct.pack(e + "IIIII", ifid, ts >> 32, ts & 0xFFFFFFFF, len(frame), w)
                                  + frame))
            elif kind == "opb":
                _, ifid, ts, frame = item
                frame = bytes(frame)
                out.append(_block(e, 2, struct.pack(e + "HHIIII", ifid, 0, ts >> 32, ts & 0xFFFFFFFF, len(frame),
                                                    len(frame)) + frame))
            elif kind == "spb":
                _, frame, *wire = item
                frame = bytes(frame)
                out.append(_block(e, 3, struct.pack(e + "I", wire[0] if wire else len(frame)) + frame))
            elif kind == "idb":
                out.append(_idb(e, item[1]))
            else:
                _, btype, body = item
                out.append(_block(e, btype, body))
    return b"".join(out)
