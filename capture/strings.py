"""Interned strings of a record link: an append-only table, code -> text, that record batches
carry beside their uint64 code columns (`capture.records`), so that no string becomes a Python
object per record in the low level.

A link has one table for its whole life, shared by every string column of the link: a code
means the same text in every batch and every column of the link (so `a = b` over two string
fields is a comparison of codes). Codes are never reused; the table only grows. Python holds
one object per *distinct* string (the dictionary that finds a string's code), never one per
record: a batch's strings are dictionary-encoded by Arrow first, and only the batch's
distinct values are looked up.

The table is written by the link's reader and read by the low level (decoding codes into an
Arrow `string` array when partial rows are made); it is only appended to, and `decode` reads
the prefix that existed when it was called, so a reader thread may intern while the low level
decodes.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


class StringTable:
    """Append-only intern table of one link (see the module docstring)."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._values: list[str] = []
        self._arrow = pa.array([], pa.string())     # the first len(_arrow) values, as Arrow
        self._lock = threading.Lock()
        self._objects = np.empty(0, dtype=object)     # the values as an object array (cache)

    def __len__(self) -> int:
        return len(self._values)

    def intern(self, text: str) -> int:
        """The code of `text`, added if new."""
        code = self._codes.get(text)
        if code is None:
            with self._lock:
                code = self._codes.setdefault(text, len(self._values))
                if code == len(self._values):
                    self._values.append(text)
        return code

    def intern_array(self, values: pa.Array) -> np.ndarray:
        """uint64 codes of an Arrow binary or string array (no nulls), interning what is new.
        Bytes that are not UTF-8 are decoded with replacement characters (a record source
        is text; a stray byte must not lose the record)."""
        if len(values) == 0:
            return np.zeros(0, np.uint64)
        encoded = pc.dictionary_encode(values)
        distinct = encoded.dictionary.to_pylist()          # one object per distinct value
        if pa.types.is_binary(values.type):
            distinct = [b.decode("utf-8", "replace") for b in distinct]
        mapping = np.fromiter((self.intern(s) for s in distinct), np.uint64, len(distinct))
        return mapping[encoded.indices.to_numpy(zero_copy_only=False)]

    def code_of(self, text: str) -> int | None:
        """The code of `text`, or None when the link has not seen it (nothing is added)."""
        return self._codes.get(text)

    def text(self, code: int) -> str:
        return self._values[int(code)]

    def arrow(self) -> pa.Array:
        """Every value so far as an Arrow string array (index = code)."""
        n = len(self._values)
        if len(self._arrow) < n:
            with self._lock:
                have = len(self._arrow)
                if have < n:
                    fresh = pa.array(self._values[have:n], pa.string())
                    self._arrow = pa.concat_arrays([self._arrow, fresh])
        return self._arrow

    def decode(self, codes: np.ndarray) -> pa.Array:
        """An Arrow `string` array of the texts of `codes` (vectorised: one take)."""
        return self.arrow().take(pa.array(np.asarray(codes, np.uint64)))

    def objects(self, codes: np.ndarray) -> np.ndarray:
        """The texts of `codes` as an object array (the evaluator's string values, for the
        rare operations that need the text itself: ordering comparisons, display)."""
        n = len(self._values)
        table = self._objects
        if len(table) < n:
            table = np.empty(n, dtype=object)
            table[:] = self._values[:n]
            self._objects = table
        return table[np.asarray(codes, np.int64)]
