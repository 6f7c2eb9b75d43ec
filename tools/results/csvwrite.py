"""CSV rows of integer and string columns written by a Numba kernel, the bytes pyarrow writes.

`pyarrow.csv.write_csv` (no header, quoting style "none") is several times slower on flow
records. For tables of integer and string columns only, it formats the
same bytes with `format_csv_rows`: decimal integers (the full int64 and uint64 ranges), strings
copied from the Arrow buffers, "," between values, "\\n" after each row, nothing for a null.
Rows go out in chunks, so memory stays bounded by a chunk whatever the table's size. Strings
are written as they are: the caller checks that none needs quoting (`outputs._csv_quoting`).
"""

from __future__ import annotations

import queue

import numpy as np
import pyarrow as pa

from common.jit import ngjit, ngjit_inline

KIND_INT, KIND_UINT, KIND_STRING = 0, 1, 2
#: rows formatted per kernel call (a chunk of 15 columns is a few MB of text)
CHUNK_ROWS = 1 << 16
#: the longest decimal integer: "-9223372036854775808", "18446744073709551615"
INT_WIDTH = 20


def writes(schema: pa.Schema) -> bool:
    """True when `write_csv_rows` can write every column (integers and strings only)."""
    return len(schema) > 0 and all(_kind(f.type) is not None for f in schema)


def _kind(t: pa.DataType) -> int | None:
    if pa.types.is_string(t):
        return KIND_STRING
    if pa.types.is_unsigned_integer(t):
        return KIND_UINT
    if pa.types.is_signed_integer(t):
        return KIND_INT
    return None


def write_csv_rows(table: pa.Table, fh, chunk_rows: int = CHUNK_ROWS) -> None:
    """Write the rows of `table` (no header) to the binary file `fh`, `chunk_rows` at a time,
    the chunks formatted side by side (`highlevel.parallel`) and written in order. Output
    buffers are reused once written (a fresh one per chunk cost its page faults)."""
    from highlevel.parallel import map_ordered

    kinds = np.array([_kind(f.type) for f in table.schema], np.int64)
    free: queue.SimpleQueue = queue.SimpleQueue()

    def fmt(batch: pa.RecordBatch) -> tuple[np.ndarray, int]:
        arrays = kernel_arrays(batch, kinds)
        size = output_bound(batch.num_rows, kinds, arrays[-1])
        try:
            out = free.get_nowait()
        except queue.Empty:
            out = np.empty(size, np.uint8)
        if len(out) < size:
            out = np.empty(size, np.uint8)
        return out, format_csv_rows(batch.num_rows, kinds, *arrays, out)

    batches = (b for b in table.to_batches(max_chunksize=chunk_rows) if b.num_rows)
    for out, end in map_ordered(fmt, batches):
        fh.write(out[:end].data)
        free.put(out)


def output_bound(n: int, kinds: np.ndarray, str_data: np.ndarray) -> int:
    """Bytes the kernel may write for n rows: separators, the widest integers, the strings, and
    the 8 bytes past the end that its string copy may overrun."""
    return n * len(kinds) + n * INT_WIDTH * int(np.sum(kinds != KIND_STRING)) + len(str_data) + 8


def kernel_arrays(batch: pa.RecordBatch, kinds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                      np.ndarray, np.ndarray, np.ndarray]:
    """(slots, null_slots, ints, str_offsets, valid, str_data) of `format_csv_rows` for one
    record batch: integers as int64 bit patterns one row per column, the strings' bytes in one
    buffer (8 spare bytes at its end) with their offsets into it, the validity of the columns
    that hold nulls."""
    n, ncols = batch.num_rows, batch.num_columns
    slots = np.zeros(ncols, np.int64)          # column k's row in ints or in str_offsets
    null_slots = np.full(ncols, -1, np.int64)  # column k's row in valid (-1: no nulls)
    ints = np.empty((int(np.sum(kinds != KIND_STRING)), n), np.int64)
    str_offsets = np.empty((int(np.sum(kinds == KIND_STRING)), n + 1), np.int64)
    pieces: list[np.ndarray] = []
    valid_rows: list[np.ndarray] = []
    base = 0
    for k, col in enumerate(batch.columns):
        if col.null_count:
            null_slots[k] = len(valid_rows)
            valid_rows.append(np.asarray(col.is_valid()))
        if kinds[k] == KIND_STRING:
            slots[k] = len(pieces)
            offsets, data = _string_buffers(col)
            str_offsets[len(pieces)] = offsets - offsets[0] + base
            pieces.append(data[offsets[0]:offsets[-1]])
            base += int(offsets[-1] - offsets[0])
        else:
            slots[k] = k - len(pieces)
            values = np.asarray(col.fill_null(0) if col.null_count else col)   # no copy
            ints[slots[k]] = values.view(np.int64) if values.dtype == np.uint64 else values
    valid = np.stack(valid_rows) if valid_rows else np.ones((0, n), np.bool_)
    str_data = np.concatenate(pieces + [np.zeros(8, np.uint8)])
    return slots, null_slots, ints, str_offsets, valid, str_data


def _string_buffers(col: pa.StringArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a string array as numpy views of its Arrow buffers (its n + 1
    offsets into data; a slice's offsets need not start at 0)."""
    _, offsets, data = col.buffers()
    offsets = np.frombuffer(offsets, np.int32, col.offset + len(col) + 1)[col.offset:]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets, data


# --- the kernel ---------------------------------------------------------------------------------
# Two habits keep it fast:
# - indices are cast to unsigned (`_U(o)`), so Numba skips its negative-index wraparound;
# - the row loop writes `out` itself: helpers taking arrays, even inlined, left reference-count
#   calls in the loop; scalar helpers are fine.
_U = np.uint64
_DIGIT_PAIRS = np.frombuffer(b"".join(b"%02d" % k for k in range(100)), np.uint8)
_POW10 = np.array([10**k for k in range(20)], np.uint64)
_E2 = np.uint64(100)


@ngjit
def format_csv_rows(n, kinds, slots, null_slots, ints, str_offsets, valid, str_data, out):
    """Write rows 0..n-1 of the columns into `out` (room for `output_bound` bytes); returns the
    bytes written. Column k is of kind kinds[k], row slots[k] of `ints` (int64 bit patterns) or
    of `str_offsets` (into `str_data`); a column with nulls has its validity in row
    null_slots[k] of `valid`, and a null writes nothing."""
    o = 0
    for i in range(n):
        for k in range(len(kinds)):
            if k:
                out[_U(o)] = 44   # ','
                o += 1
            if null_slots[k] >= 0 and not valid[_U(null_slots[k]), i]:
                continue
            s = _U(slots[k])
            if kinds[k] == KIND_STRING:
                # 8 bytes a time, all loaded before any is stored so LLVM moves them as one
                # word (much faster than a byte loop); what runs past the end is overwritten
                # by the bytes that follow, or lies past the end of the text
                start = str_offsets[s, i]
                size = str_offsets[s, i + 1] - start
                for j in range(0, size, 8):
                    b = _U(start + j)
                    word = (str_data[b], str_data[b + _U(1)], str_data[b + _U(2)],
                            str_data[b + _U(3)], str_data[b + _U(4)], str_data[b + _U(5)],
                            str_data[b + _U(6)], str_data[b + _U(7)])
                    for t in range(8):
                        out[_U(o + j + t)] = word[t]
                o += size
                continue
            v = _U(ints[s, i])
            if kinds[k] == KIND_INT and ints[s, i] < 0:
                out[_U(o)] = 45   # '-'
                o += 1
                v = _U(0) - v     # also right for the smallest int64
            o += _decimal_length(v)
            p = o                 # digits from the end, two per division
            while v >= _E2:
                top = v // _E2
                pair = _U(2 * np.int64(v - top * _E2))
                p -= 2
                out[_U(p)] = _DIGIT_PAIRS[pair]
                out[_U(p + 1)] = _DIGIT_PAIRS[pair + _U(1)]
                v = top
            if v >= _U(10):
                out[_U(p - 2)] = _DIGIT_PAIRS[_U(2) * v]
                out[_U(p - 1)] = _DIGIT_PAIRS[_U(2) * v + _U(1)]
            else:
                out[_U(p - 1)] = 48 + np.int64(v)
        out[_U(o)] = 10   # '\n'
        o += 1
    return o


@ngjit_inline
def _decimal_length(v):
    """Decimal digits of the uint64 `v`."""
    n = 1
    while n < 20 and v >= _POW10[_U(n)]:
        n += 1
    return n
