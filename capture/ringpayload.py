"""The packet ring's payload area (`capture.ring`): the kernels that place rows' TCP/UDP
payloads in it, and a pushed batch's payload buffers.

The rules are the ring's (its module docstring, "The payload area"): absolute byte positions
count every byte ever placed, skips included; a position's place in the area is `position %
size`. The producer writes the byte head, the consumer the byte tail, in the ring's control
block (C_BHEAD, C_BTAIL).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from capture.errors import RingError
from common.jit import ngjit

#: the control block's words of the payload area: the producer's byte head, on the
#: producer's cache line, and the consumer's byte tail, on the consumer's
C_BHEAD, C_BTAIL = 15, 19
#: the payload area's limit: Arrow binary offsets are int32
MAX_PAYLOAD_BYTES = (1 << 31) - 1


@ngjit
def place_payloads(ctrl, starts, sizes, size_area, offsets, src_start, pos, k):
    """Place the payloads of k reserved rows (source rows src_start.., their `offsets` as an
    Arrow binary array's; ring rows from pos, wrapping) in a payload area of size_area bytes,
    as far as they fit: (rows placed, split, first start). The caller copies the bytes of rows
    [0, split) to the area from `first start % size_area` and those of [split, placed) to its
    start (`copy_payloads`, or numpy in `PacketRing.push`), then commits the rows.

    Each payload starts at the byte head, or at the next lap when it would cross the end of
    the area; its absolute start and size are written and the byte head moved past it."""
    cap = starts.shape[0]
    head = ctrl[C_BHEAD]
    tail = ctrl[C_BTAIL]        # read once: it only grows, so this is conservative
    # every byte placed now ends by tail + size_area <= head + size_area < next_lap + size_area,
    # so only one row can be the first of the next lap (at next_lap exactly): two copies
    next_lap = (head // size_area + 1) * size_area
    first_at = head
    split = -1
    placed = k
    for j in range(k):
        n = offsets[src_start + j + 1] - offsets[src_start + j]
        at = head
        off = at % size_area
        if off + n > size_area:             # never wrap inside a payload: skip to the next lap
            at += size_area - off
        if at + n - tail > size_area:
            placed = j
            break
        if j == 0:
            first_at = at
        if split < 0 and at >= next_lap:
            split = j
        r = pos + j
        if r >= cap:
            r -= cap
        starts[r] = at
        sizes[r] = n
        head = at + n
    ctrl[C_BHEAD] = head
    return placed, placed if split < 0 else split, first_at


@ngjit
def copy_payloads(ctrl, starts, sizes, area, offsets, data, src_start, pos, k):
    """`place_payloads` and the copy of the bytes from `data`, for Numba producers: returns
    the rows placed, to be copied and committed."""
    size_area = area.shape[0]
    placed, split, first_at = place_payloads(ctrl, starts, sizes, size_area, offsets, src_start, pos, k)
    a0 = offsets[src_start]
    a_split = offsets[src_start + split]
    a1 = offsets[src_start + placed]
    off = first_at % size_area
    area[off:off + a_split - a0] = data[a0:a_split]
    area[:a1 - a_split] = data[a_split:a1]
    return placed


def payload_buffers(batch, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of a pushed batch's payloads, n rows: its Arrow binary array's own
    buffers (no copy), or n empty payloads when it has none."""
    arr = getattr(batch, "payload", None)
    if arr is None or n == 0:
        return np.zeros(n + 1, np.int32), np.zeros(0, np.uint8)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise RingError(f"pushed payload must be an Arrow binary array (found {type(arr).__name__})")
    kind = arr.type
    odtype: type[np.signedinteger]
    if pa.types.is_binary(kind) or pa.types.is_string(kind):
        odtype = np.int32
    elif pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        odtype = np.int64
    else:
        raise RingError(f"pushed payload must be an Arrow binary array (found {kind})")
    if len(arr) != n:
        raise RingError(f"pushed payload has {len(arr)} items for {n} rows")
    if arr.null_count:
        arr = arr.fill_null(b"")
    _, obuf, dbuf = arr.buffers()
    offsets = np.frombuffer(obuf, odtype, count=arr.offset + n + 1)[arr.offset:]
    data = np.frombuffer(dbuf, np.uint8) if dbuf is not None and dbuf.size else np.zeros(0, np.uint8)
    return offsets, data
