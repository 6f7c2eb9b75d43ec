"""The order of a stage's result rows: (window, keys) ascending, by an MSD radix sort of packed int64 keys.

`highlevel.output` sorts every closed batch by the window and the group keys. Arrow's
multi-key table sort compares rows one key after another, slow for millions of flow records of
10 keys (docs/performance.md has the figures). Here the int64 keys become one bit string per
row, sorted by a most-significant-digit radix sort:

1. packing: a key whose min and max agree above bit b needs only its bits below b (as they
   are, sign flipped, so IPv4 addresses stay aligned to the digits), or bit_length(max -
   min) bits after subtracting the minimum when that is fewer; a key with one value (the
   high halves of IPv4-mapped addresses) needs none. The keys' bits, first key first, fill
   as few uint64 words as they need: the words' unsigned order, word by word, is the keys'
   lexicographic order.
2. MSD radix over (key word, row number) pairs, the word of the first key bits at first: a
   segment of rows equal in all higher bits is split by the digit that starts at its
   highest differing bit (OR of each key XOR the first), so bits equal in a segment cost a
   read and never a pass; when a segment's current word is equal in all its rows, the
   next word is gathered by row number. The digit is up to 12 bits (4096 counts, in L1)
   and narrower for smaller segments; segments of `_SMALL` or fewer rows are ranked by
   comparing all pairs, branch-free. Scatters are stable and ranks count tied rows before
   a row, so ties keep input order: the result equals Arrow's stable sort. Keys of other
   types, or with nulls, go to Arrow's sort.

Flow records split by window, then by the address bits that vary, and are done after 3-4
scatters of 12 bytes a row; each pass is bound by memory bandwidth. It replaced an LSD sort by
bytes (a gather and up to 8 passes per key), which took several times as long and more
memory. Memory: the packed words, two (word, row) buffers and the result.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.jit import ngjit

#: segments of at most this many rows are ranked by comparing all pairs
_SMALL = 24
#: widest radix digit, in bits (for segments of a million rows or more)
_MAX_DIGIT = 12
#: rows packed at a time: a block of words stays in cache while every key is added
_PACK_BLOCK = 1024
_ALL = (1 << 64) - 1


def sort_indices(table: pa.Table, keys: list[str]) -> np.ndarray:
    """Row indices of `table` sorted ascending by `keys` (first key most significant), ties
    in input order."""
    columns = [table.column(k) for k in keys]
    n = table.num_rows
    if n < 2 or any(not pa.types.is_int64(c.type) or c.null_count for c in columns):
        return np.asarray(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
    kept: list[np.ndarray] = []
    lows: list[int] = []
    masks: list[int] = []
    fields: list[tuple[int, int, int]] = []
    end = 0
    for c in columns:
        # (combine_chunks copies a single chunk too)
        v = np.asarray(c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()).view()
        v.flags.writeable = False          # one array type for the kernel's tuple of keys
        low, high = _min_max(v)
        if low == high:                    # a key with one value in every row orders nothing
            continue
        # the bits below the highest one where min and max differ (sign flipped), as they
        # are: IPv4 addresses stay aligned to the radix digits; unless subtracting the
        # minimum needs fewer bits (min 7, max 8)
        flipped, sub = ((low ^ high) & _ALL).bit_length(), (high - low).bit_length()
        width = min(sub, flipped)
        lows.append(low if sub < flipped else -(1 << 63))
        masks.append((1 << width) - 1)
        # the key's fields: (word, key, left shift into the word, or minus the right shift
        # of a key continuing into the next word)
        end += width
        for w in range((end - width) // 64, (end - 1) // 64 + 1):
            fields.append((w, len(kept), 64 * w + 64 - end))
        kept.append(v)
    if not kept:
        return np.arange(n)
    words = np.empty(((end + 63) // 64, n), np.uint64)
    _pack(tuple(kept), np.array(lows, np.int64).view(np.uint64), np.array(masks, np.uint64),
          np.array(fields), words)
    return radix_argsort(words, np.empty((2, n), np.int32 if n < 2**31 else np.int64))


@ngjit
def _min_max(v):
    """(min, max) of v in one pass (numpy's min and max: two)."""
    low = high = v[0]
    for i in range(len(v)):
        x = v[i]
        if x < low:
            low = x
        if x > high:
            high = x
    return int(low), int(high)


@ngjit
def _pack(keys, lows, masks, fields, words):
    """words[:, i] = the keys of row i minus lows (mod 2**64, masked), as one bit string:
    field (w, k, shift) puts key k's bits into word w shifted left (or right if negative)."""
    nwords, n = words.shape
    for start in range(0, n, _PACK_BLOCK):
        stop = min(start + _PACK_BLOCK, n)
        words[:, start:stop] = 0
        for f in range(len(fields)):
            w, k, shift = fields[f, 0], fields[f, 1], fields[f, 2]
            low, mask = lows[k], masks[k]
            # slices: their indices are known not negative, so the loops are vectorized
            key, word = keys[k][start:stop], words[w, start:stop]
            if shift >= 0:
                left = np.uint64(shift)
                for i in range(len(word)):
                    word[i] |= ((np.uint64(key[i]) - low) & mask) << left
            else:
                right = np.uint64(-shift)
                for i in range(len(word)):
                    word[i] |= ((np.uint64(key[i]) - low) & mask) >> right


@ngjit
def radix_argsort(words, rows):
    """Stable argsort of the columns of `words` ([nwords, n] uint64 key words, most
    significant first), by MSD radix over (key word, row) pairs. words[0] is overwritten;
    rows ([2, n] of int32 or int64) is scratch for row numbers."""
    nwords, n = words.shape
    out = np.empty(n, np.int64)
    # a segment's current key word and its rows, in one of two buffers; word 0 is read only
    # here, so its array is the first buffer
    keys = (words[0], np.empty(n, np.uint64))
    for i in range(n):
        rows[0, i] = i
    counts = np.empty(1 << _MAX_DIGIT, np.int64)
    rank = np.empty(_SMALL, np.int64)
    # pending segments: (start, stop, key word held, buffer), disjoint and longer than
    # _SMALL but for the first
    stack = np.empty((n // (_SMALL + 1) + 2, 4), np.int64)
    stack[0, 0], stack[0, 1], stack[0, 2], stack[0, 3] = 0, n, 0, 0
    top = 1
    while top:
        top -= 1
        lo, hi, w, buf = stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3]
        key, row = keys[buf][lo:hi], rows[buf, lo:hi]
        if hi - lo <= _SMALL:
            _rank_sort(key, row, words, w, rank, out[lo:hi])
            continue
        # the first word where the segment's keys differ, and its highest differing bit
        while True:
            diff, first = np.uint64(0), key[0]
            for i in range(len(key)):
                diff |= key[i] ^ first
            if diff or w == nwords - 1:
                break
            w += 1
            for i in range(len(key)):
                key[i] = words[w, row[i]]
        if not diff:                        # all keys equal: input order
            out[lo:hi] = row
            continue
        shift = max(_bit_length(diff) - min(_MAX_DIGIT, max(_bit_length(hi - lo) - 4, 4)), 0)
        nbuckets = 1 << (_bit_length(diff) - shift)
        mask, ushift = np.uint64(nbuckets - 1), np.uint64(shift)
        counts[:nbuckets] = 0
        for x in key:
            counts[(x >> ushift) & mask] += 1
        start = lo
        for d in range(nbuckets):
            c = counts[d]
            counts[d] = start
            start += c
        dkey, drow = keys[1 - buf], rows[1 - buf]
        for i in range(len(key)):           # stable scatter into the other buffer
            d = (key[i] >> ushift) & mask
            j = counts[d]
            counts[d] = j + 1
            dkey[j] = key[i]
            drow[j] = row[i]
        start = lo                          # counts[d] is now the end of bucket d
        for d in range(nbuckets):
            stop = counts[d]
            if stop - start == 1:
                out[start] = drow[start]
            elif stop - start <= _SMALL:
                _rank_sort(dkey[start:stop], drow[start:stop], words, w, rank,
                           out[start:stop])
            elif stop > start:
                stack[top, 0], stack[top, 1], stack[top, 2], stack[top, 3] = \
                    start, stop, w, 1 - buf
                top += 1
            start = stop
    return out


@ngjit
def _bit_length(x):
    """Python's int.bit_length, in 6 steps."""
    n = 0
    for step in (32, 16, 8, 4, 2, 1):
        if x >> step:
            x >>= step
            n += step
    return n + 1 if x else n


@ngjit
def _rank_sort(key, row, words, w, rank, out):
    """out[:] = row in stable order of their keys (key: word w; the words before are equal;
    the words after are looked up by row): each row's rank counts the rows before it."""
    m, ties = len(key), 0
    for a in range(m):                      # branch-free: sorting a few random keys by
        r = 0                               # comparisons mispredicts half of them
        for b in range(m):
            r += (key[b] < key[a]) | ((key[b] == key[a]) & (b < a))
            ties += (key[b] == key[a]) & (b != a)
        rank[a] = r
    if ties and w < words.shape[0] - 1:
        for a in range(m):
            r = 0
            for b in range(m):
                if key[b] != key[a]:
                    r += key[b] < key[a]
                elif b != a:
                    k = w + 1
                    while k < words.shape[0] - 1 and \
                            words[k, row[b]] == words[k, row[a]]:
                        k += 1
                    x, y = words[k, row[b]], words[k, row[a]]
                    r += (x < y) | ((x == y) & (b < a))
            rank[a] = r
    for a in range(m):
        out[rank[a]] = row[a]
