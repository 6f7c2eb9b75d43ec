"""The payload column: TCP and UDP payload bytes, captured only for the queries that read them.

GS-lite's packet schema has `TCP_data` and `UDP_data`, the transport payload as a string. Here
a payload is not one of the fixed-width columns of a packet batch: a reader asked for the
column `payload` (`PAYLOAD`, in an operator's `read_columns` when a query names `TCP_data` or
`UDP_data`) copies each packet's captured payload bytes out of its read buffer while the
frames are still there, into one bytes buffer and an offsets array per batch, wrapped
zero-copy as an Arrow `binary` array (`PacketBatch.payload`). A reader not asked does none of
this, and its decoding is unchanged. A live capture (`capture.live`, `payload=True`) gathers
them the same way from its TPACKET ring's frames before giving their blocks back, and a packet
ring with a payload area (`capture.ring`) carries them from the capture thread to the low level.

The bytes are those captured: a packet cut by the capture's snap length carries its payload
only up to the cut (GS-lite's `snap_len`, likewise, bounds how much of a packet an attribute
may be read from), while `payload_len` (`data_length`) stays the length from the IP header.
A packet without a TCP/UDP payload, a malformed one, or one that is not TCP or UDP has an
empty payload.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from capture.decode import ETH_IPV4, ETH_IPV6, LINK_ETHERNET, R_OK, be16, decode_frame
from capture.schema import L_TCP, L_UDP
from common.jit import ngjit

#: the name of the payload column in `read_columns` / `open_capture(columns=...)`
PAYLOAD = "payload"


@ngjit
def payload_spans(buf, out, start, stop, begin, size):
    """Where each row's captured payload lies in `buf` (begin) and its captured bytes (size),
    for rows [start, stop) of `out` (the decoded columns); returns the total bytes.

    The common frame (Ethernet straight to IP) is located from its columns: the payload ends
    where the IP packet does, `payload_len` before; any other frame asks `decode_frame`."""
    total = 0
    for i in range(start, stop):
        j = i - start
        begin[j] = 0
        size[j] = 0
        plen = np.int64(out.payload_len[i])
        if plen <= 0 or out.reason[i] != R_OK or (out.layers[i] & (L_TCP | L_UDP)) == 0:
            continue
        off = out.data_offset[i]
        cap = np.int64(out.caplen[i])
        wire = np.int64(out.len[i])
        if out.link_type[i] == LINK_ETHERNET and cap >= 14 and \
                (be16(buf, off + 12) == ETH_IPV4 or be16(buf, off + 12) == ETH_IPV6):
            at = 14 + min(np.int64(out.ip_len[i]), wire - 14) - plen
        else:
            at = decode_frame(buf, off, cap, wire, out.link_type[i])[26]
        if at <= 0 or at >= cap:
            continue
        n = min(plen, cap - at)
        begin[j] = off + at
        size[j] = n
        total += n
    return total


@ngjit
def copy_spans(buf, begin, size, offsets, data):
    """The spans' bytes end to end into `data`, `offsets` [n + 1] marking each row's."""
    # unsigned indices: no negative-index check per byte, so the copy is vectorised
    p = np.uint64(0)
    offsets[0] = 0
    for j in range(len(begin)):
        n = np.uint64(size[j])
        b = np.uint64(begin[j])
        for k in range(n):
            data[p + k] = buf[b + k]
        p += n
        offsets[j + 1] = p


def gather(buf, out, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int32 [n + 1], bytes) of the payloads of rows [start, stop): copied out of the
    read buffer now, before it is refilled."""
    n = stop - start
    begin = np.empty(n, np.int64)
    size = np.empty(n, np.int64)
    total = payload_spans(buf, out, start, stop, begin, size)
    offsets = np.empty(n + 1, np.int32)
    data = np.empty(total, np.uint8)
    copy_spans(buf, begin, size, offsets, data)
    return offsets, data


def binary_array(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """An Arrow binary array over the offsets and bytes (no copy)."""
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def concat(parts: list[tuple[np.ndarray, np.ndarray]]) -> pa.Array:
    """One binary array of the payloads of consecutive row ranges."""
    if len(parts) == 1:
        return binary_array(*parts[0])
    arrays = [binary_array(o, d) for o, d in parts]
    return pa.concat_arrays(arrays) if arrays else pa.array([], pa.binary())


def empty(n: int) -> pa.Array:
    """n empty payloads."""
    return binary_array(np.zeros(n + 1, np.int32), np.zeros(0, np.uint8))
