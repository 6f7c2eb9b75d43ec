"""Text forms of addresses: IPv4 dotted, IPv6 RFC 5952 (as tshark prints), MACs aa:bb:cc:dd:ee:ff.

Addresses are stored as in `capture.schema`: IPs as two uint64 halves (IPv4 IPv4-mapped), MACs
as 48-bit integers. Two ways to get text, both per batch:
- numpy helpers (`ipv4_text`, `mac_text`, `ip_text`) give string arrays; each distinct value
  is formatted once and spread back with numpy indexing;
- `format_rows`, a Numba kernel, writes whole delimited lines (CSV, JSON lines) into one byte
  buffer: numbers, addresses, MACs and table strings, the text `oopscope decode` prints.
"""

from __future__ import annotations

import ipaddress
import socket

import numpy as np
from numpy.dtypes import StringDType

from common.jit import ngjit

TEXT = StringDType()
_MAPPED_HI_MASK = np.uint64(0xFFFF_FFFF_0000_0000)
_MAPPED = np.uint64(0x0000_FFFF_0000_0000)
_DEC = np.array([str(i) for i in range(256)], dtype=TEXT)
_HEX = np.array([f"{i:02x}" for i in range(256)], dtype=TEXT)


def _octets_text(values: np.ndarray, table: np.ndarray, nbytes: int, sep: str) -> np.ndarray:
    """Join the `nbytes` big-endian bytes of each value, each looked up in `table`, with `sep`."""
    v = values.astype(np.uint64, copy=False)
    out = table[((v >> np.uint64(8 * (nbytes - 1))) & np.uint64(0xFF)).astype(np.intp)]
    for k in range(nbytes - 2, -1, -1):
        part = table[((v >> np.uint64(8 * k)) & np.uint64(0xFF)).astype(np.intp)]
        out = np.strings.add(np.strings.add(out, sep), part)
    return out


def _by_unique(values: np.ndarray, fmt) -> np.ndarray:
    """Format each distinct value once (`fmt` maps a unique array to text) and spread back."""
    if len(values) == 0:
        return np.zeros(0, TEXT)
    uniq, inverse = np.unique(values, return_inverse=True)
    return fmt(uniq)[inverse]


def ipv4_text(addr: np.ndarray) -> np.ndarray:
    """Dotted-quad text of 32-bit IPv4 values (the low 32 bits of each value are used)."""
    return _by_unique(np.asarray(addr, np.uint64) & np.uint64(0xFFFF_FFFF),
                      lambda u: _octets_text(u, _DEC, 4, "."))


def mac_text(mac: np.ndarray) -> np.ndarray:
    """aa:bb:cc:dd:ee:ff text of 48-bit MAC values."""
    return _by_unique(np.asarray(mac, np.uint64), lambda u: _octets_text(u, _HEX, 6, ":"))


def is_ipv4_mapped(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """True where (hi, lo) is an IPv4 address stored IPv4-mapped."""
    return (hi == 0) & ((lo & _MAPPED_HI_MASK) == _MAPPED)


def ipv6_text_scalar(hi: int, lo: int) -> str:
    """RFC 5952 text of one 128-bit address (inet_ntop: '::', lower case, no lone ':0:' folding)."""
    return socket.inet_ntop(socket.AF_INET6, int(hi).to_bytes(8, "big") + int(lo).to_bytes(8, "big"))


def ip_text(hi: np.ndarray, lo: np.ndarray, ipversion: np.ndarray | None = None) -> np.ndarray:
    """Text of 128-bit addresses: IPv4-mapped ones dotted, the others as IPv6 (RFC 5952).

    With `ipversion`, rows of IPv6 packets print as IPv6 even when their address is an
    IPv4-mapped one (``::ffff:1.2.3.4``, as tshark shows it).
    """
    hi = np.asarray(hi, np.uint64)
    lo = np.asarray(lo, np.uint64)
    out = np.zeros(len(lo), TEXT)
    v4 = is_ipv4_mapped(hi, lo)
    if ipversion is not None:
        v4 &= np.asarray(ipversion) != 6
    if v4.any():
        out[v4] = ipv4_text(lo[v4])
    v6 = ~v4
    if v6.any():
        pairs = np.stack([hi[v6], lo[v6]], axis=1)
        uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        text = np.array([ipv6_text_scalar(h, l) for h, l in uniq], dtype=TEXT)
        out[v6] = text[inverse.reshape(-1)]
    return out


def ip_to_halves(text: str) -> tuple[int, int]:
    """(hi, lo) of an IPv4 or IPv6 address text as stored in the packet schema."""
    addr = ipaddress.ip_address(text)
    if addr.version == 4:
        return 0, int(_MAPPED) | int(addr)
    value = int(addr)
    return value >> 64, value & 0xFFFF_FFFF_FFFF_FFFF


def halves_to_text(hi: int, lo: int) -> str:
    """Text of one stored address (dotted for IPv4-mapped)."""
    if hi == 0 and (lo & int(_MAPPED_HI_MASK)) == int(_MAPPED):
        return str(ipaddress.IPv4Address(lo & 0xFFFF_FFFF))
    return ipv6_text_scalar(hi, lo)


def mac_to_int(text: str) -> int:
    """48-bit integer of an aa:bb:cc:dd:ee:ff (or aa-bb-...) MAC text."""
    parts = text.replace("-", ":").split(":")
    if len(parts) != 6:
        raise ValueError(f"not a MAC address: {text!r}")
    return int("".join(f"{int(p, 16):02x}" for p in parts), 16)


# --- rows of text in one Numba pass (the `oopscope decode` output and text sinks) ---------------
# A field is formatted by kind; `format_rows` writes whole lines into one byte buffer, so a batch
# costs one kernel call whatever its number of fields.
KIND_UINT = 0     # unsigned decimal (values as uint64)
KIND_INT = 1      # signed decimal (values are int64 bit patterns)
KIND_IP = 2       # address from (hi, lo) and the row's IP version: dotted IPv4 or RFC 5952 IPv6
KIND_MAC = 3      # aa:bb:cc:dd:ee:ff
KIND_TABLE = 4    # the value indexes a table of byte strings (reason names, link name)
#: widest text of each kind (the table kind adds its longest entry)
KIND_WIDTH = {KIND_UINT: 20, KIND_INT: 20, KIND_IP: 45, KIND_MAC: 17, KIND_TABLE: 0}

_HEXDIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


@ngjit
def _put_uint(out, o, v):
    """Decimal text of the unsigned 64-bit v at out[o]; the new end."""
    if v == 0:
        out[o] = 48
        return o + 1
    n = 0
    t = v
    while t > 0:
        t //= np.uint64(10)
        n += 1
    k = o + n
    while v > 0:
        k -= 1
        out[k] = np.uint8(48 + v % np.uint64(10))
        v //= np.uint64(10)
    return o + n


@ngjit
def _put_hex16(out, o, w):
    """Lower-case hex of a 16-bit word without leading zeros."""
    started = False
    for shift in (12, 8, 4, 0):
        d = (w >> shift) & 0xF
        if d != 0 or started or shift == 0:
            out[o] = _HEXDIGITS[d]
            o += 1
            started = True
    return o


@ngjit
def _put_ipv4(out, o, a):
    for k in range(4):
        o = _put_uint(out, o, np.uint64((a >> (24 - 8 * k)) & 0xFF))
        if k < 3:
            out[o] = 46  # '.'
            o += 1
    return o


@ngjit
def _put_ipv6(out, o, hi, lo):
    """RFC 5952 text, as glibc inet_ntop writes it (::ffff:a.b.c.d and ::a.b.c.d embedded)."""
    words = np.empty(8, np.int64)
    for k in range(4):
        words[k] = np.int64((hi >> np.uint64(48 - 16 * k)) & np.uint64(0xFFFF))
        words[4 + k] = np.int64((lo >> np.uint64(48 - 16 * k)) & np.uint64(0xFFFF))
    best, best_len, cur, cur_len = -1, 0, -1, 0
    for k in range(8):
        if words[k] == 0:
            if cur < 0:
                cur, cur_len = k, 1
            else:
                cur_len += 1
            if cur_len > best_len:
                best, best_len = cur, cur_len
        else:
            cur = -1
    if best_len < 2:
        best = -1
    k = 0
    while k < 8:
        if k == best:
            out[o] = 58  # ':'
            o += 1
            if best + best_len == 8:
                out[o] = 58
                o += 1
            k += best_len
            continue
        if k > 0:
            out[o] = 58
            o += 1
        if k == 6 and best == 0 and (best_len == 6 or (best_len == 5 and words[5] == 0xFFFF)):
            return _put_ipv4(out, o, (words[6] << 16) | words[7])
        o = _put_hex16(out, o, words[k])
        k += 1
    return o


@ngjit
def _put_bytes(out, o, src, start, stop):
    for j in range(start, stop):
        out[o] = src[j]
        o += 1
    return o


@ngjit
def format_rows(kinds, vals, his, present, ipver, quote, prefix, prefix_off, absent, absent_off,
                table, table_off, line_end, out):
    """Write one line per row: for field k its prefix, then its text (quoted if quote[k]) or
    its absent text; then `line_end`. Returns the number of bytes written to `out`."""
    nfields, n = vals.shape
    o = 0
    for i in range(n):
        for k in range(nfields):
            o = _put_bytes(out, o, prefix, prefix_off[k], prefix_off[k + 1])
            if not present[k, i]:
                o = _put_bytes(out, o, absent, absent_off[k], absent_off[k + 1])
                continue
            if quote[k]:
                out[o] = 34
                o += 1
            v = vals[k, i]
            kind = kinds[k]
            if kind == KIND_UINT:
                o = _put_uint(out, o, v)
            elif kind == KIND_INT:
                s = np.int64(v)
                if s < 0:
                    out[o] = 45
                    o += 1
                    o = _put_uint(out, o, np.uint64(-s))
                else:
                    o = _put_uint(out, o, v)
            elif kind == KIND_IP:
                h = his[k, i]
                if ipver[i] != 6 and h == 0 and (v >> np.uint64(32)) == np.uint64(0xFFFF):
                    o = _put_ipv4(out, o, np.int64(v & np.uint64(0xFFFFFFFF)))
                else:
                    o = _put_ipv6(out, o, h, v)
            elif kind == KIND_MAC:
                for b in range(6):
                    byte = np.int64((v >> np.uint64(40 - 8 * b)) & np.uint64(0xFF))
                    out[o] = _HEXDIGITS[byte >> 4]
                    out[o + 1] = _HEXDIGITS[byte & 0xF]
                    o += 2
                    if b < 5:
                        out[o] = 58
                        o += 1
            else:
                t = np.int64(v)
                o = _put_bytes(out, o, table, table_off[t], table_off[t + 1])
            if quote[k]:
                out[o] = 34
                o += 1
        o = _put_bytes(out, o, line_end, 0, len(line_end))
    return o
