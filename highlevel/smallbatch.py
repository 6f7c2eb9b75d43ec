"""Small aggregation batches on the driver: combine and split with numpy, no Spark combine job.

The appliance closes windows every second or so, over a few hundred to a few thousand partial
rows a batch. On the Spark path each such batch costs a groupBy job (with its shuffle) and a
second job to collect the open state: most of a window's latency. Here the batch's partial
rows (read from its spool files, whose markers came from the footers) and the open state are
combined on the driver with numpy, with exactly the super-aggregates of `highlevel.combine`:

| state | combine |
|---|---|
| count, sum | sum (int64 wraps as Spark's long sum does without ANSI mode) |
| min, max | min, max (uint64 states compare unsigned, as the Spark path's sign flip does) |
| min, max over `ip` | the smallest / largest (hi, lo) pair, each half unsigned |
| and, or, xor | bitwise over the group |
| first, last | the value at the smallest / largest (time, value) pair |
| distinct | the HyperLogLog registers' maximum |
| udaf | the user-defined aggregate's `combine` over the group's state words |

The windows the punctuation passed are finalised by Spark over the closed rows as a local
relation (the same output and HAVING expressions as the Spark path: one small job, no
shuffle); the open rows are written with Arrow. Tumbling windows only, without late rows or
`late 'correct'`, and batches of at most `MAX_ROWS` rows; anything else takes the Spark path.
Results are the Spark path's, row for row (float sums up to their order of addition).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.spool import register_column
from highlevel.batchcontext import Batch, StageContext
from highlevel.microbatch import commit_open
from queries.plan import ip_words

if TYPE_CHECKING:
    from highlevel.batchfiles import SpoolFileMarker
    from highlevel.spec import StageSpec
    from highlevel.windows import WindowLogic

log = logging.getLogger(__name__)

#: partial rows (the batch's and the open state's) above which the Spark path combines
MAX_ROWS = 200_000
KINDS = frozenset({"count", "sum", "min", "max", "and", "or", "xor", "first", "last",
                   "distinct", "udaf"})


def usable(spec: StageSpec, window: WindowLogic) -> bool:
    """Whether an aggregation's windows and states allow its batches to close here (its
    stage checks the rest: module docstring)."""
    return window.tumbling and all(s.kind in KINDS for s in spec.states)


def read_rows(spec: StageSpec, files: list[SpoolFileMarker], open_dir: Path | None,
              limit: int = MAX_ROWS) -> pa.Table | None:
    """The batch's partial rows and the open state's, or None when they pass `limit` (or a
    file cannot be read here)."""
    names = [f.name for f in spec.partial_schema().fields]
    if sum(f.rows for f in files) > limit or any(f.rows and f.path is None for f in files):
        return None
    parts = []
    for f in files:
        if f.rows:
            t = pq.read_table(f.path, columns=names)
            parts.append(t.filter(pc.is_valid(t["window"])))
    if open_dir is not None:
        for p in sorted(Path(open_dir).glob("*.parquet")):
            if not p.name.startswith((".", "_")):
                parts.append(pq.read_table(p, columns=names))
    if not parts:
        return None
    table = pa.concat_tables([p.cast(parts[0].schema) for p in parts])
    return None if table.num_rows > limit else table


def _codes(col: pa.ChunkedArray) -> np.ndarray:
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        return np.asarray(col.combine_chunks()).view(np.int64) if col.type.bit_width == 64 \
            else np.asarray(col.combine_chunks()).astype(np.int64)
    return np.asarray(pc.dictionary_encode(col.combine_chunks()).indices).astype(np.int64)


def combine(table: pa.Table, group_columns: list[str], states, registers: int) -> pa.Table:
    """One row per distinct `group_columns` value, every state combined (module docstring)."""
    n = table.num_rows
    if n == 0:
        return table
    if any(table[c].null_count for c in table.column_names):
        raise ValueError("null values")     # never in partial rows; the Spark path decides
    keys = np.stack([_codes(table[c]) for c in group_columns], axis=1)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    g = len(first)
    out = {c: table[c].take(pa.array(first)) for c in group_columns}
    grouped = None      # (row order by group, group starts) for the UDAFs' folds
    for s in states:
        if s.kind == "udaf":
            from lowlevel.udafs import fold_rows, state_rows
            from queries.plan import udaf_words

            if grouped is None:
                order = np.argsort(inverse, kind="stable")     # arrival order within a group
                grouped = order, np.r_[0, np.flatnonzero(np.diff(inverse[order])) + 1]
            words = udaf_words(s.name, s.udaf.size)
            rows = state_rows(s.name, s.udaf, {word: np.asarray(table[word].combine_chunks())
                                               .view(np.dtype(s.udaf.dtype))
                                               if s.udaf.dtype == "uint64"
                                               else np.asarray(table[word].combine_chunks())
                                               for word in words})
            folded = fold_rows(s.udaf, np.ascontiguousarray(rows[grouped[0]]), grouped[1])
            if s.udaf.dtype == "uint64":
                folded = folded.view(np.int64)
            for j, word in enumerate(words):
                out[word] = pa.array(np.ascontiguousarray(folded[:, j]), table[word].type)
            continue
        if s.kind == "distinct":
            for i in range(registers):
                name = register_column(s.name, i)
                v = np.asarray(table[name].combine_chunks())
                acc = np.zeros(g, v.dtype)
                np.maximum.at(acc, inverse, v)
                out[name] = pa.array(acc, table[name].type)
            continue
        if s.dtype == "ip":     # MIN/MAX over an address: the smallest / largest (hi, lo)
            hi_name, lo_name = ip_words(s.name)
            hi, lo = (np.asarray(table[word].combine_chunks()).view(np.uint64)
                      for word in (hi_name, lo_name))
            order = np.lexsort((lo, hi, inverse))      # by group, then hi, then lo
            bounds = np.flatnonzero(np.diff(inverse[order])) + 1
            pick = order[np.r_[0, bounds]] if s.kind == "min" \
                else order[np.r_[bounds - 1, len(order) - 1]]
            for word, half in ((hi_name, hi), (lo_name, lo)):
                out[word] = pa.array(half[pick].view(np.int64), table[word].type)
            continue
        col = table[s.name]
        v = np.asarray(col.combine_chunks())
        if s.kind in ("first", "last"):
            t = np.asarray(table[f"{s.name}__t"].combine_chunks())
            order = np.lexsort((v, t, inverse))        # by group, then time, then value
            bounds = np.flatnonzero(np.diff(inverse[order])) + 1
            pick = order[np.r_[0, bounds]] if s.kind == "first" \
                else order[np.r_[bounds - 1, len(order) - 1]]
            out[s.name] = pa.array(v[pick], col.type)
            out[f"{s.name}__t"] = pa.array(t[pick], table[f"{s.name}__t"].type)
            continue
        unsigned = s.kind in ("min", "max") and s.dtype == "uint64"
        w = v.view(np.uint64) if unsigned else v
        if s.kind in ("count", "sum", "or", "xor"):
            acc = np.zeros(g, w.dtype)
        else:
            acc = w[first].copy()
        ufunc = {"count": np.add, "sum": np.add, "min": np.minimum, "max": np.maximum,
                 "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[s.kind]
        ufunc.at(acc, inverse, w)
        out[s.name] = pa.array(acc.view(v.dtype) if unsigned else acc, col.type)
    return pa.table(out).select(table.column_names)


def run(ctx: StageContext, batch: Batch) -> bool:
    """One micro-batch closed here; False (nothing done) when it is too large for the
    driver."""
    spec, prev, state = ctx.spec, batch.prev, batch.state
    batch_id, punctuation = batch.batch_id, batch.punctuation
    open_dir = ctx.store.path(prev.open_dir) if prev.open_dir is not None else None
    rows = read_rows(spec, batch.files, open_dir)
    if rows is None and (batch.kept or open_dir is not None):
        return False
    ctx.tick("read")
    still_open = None
    if rows is not None and rows.num_rows:
        try:
            combined = combine(rows, ["window"] + spec.key_columns(), spec.states,
                               spec.distinct_registers)
        except ValueError:
            return False
        ctx.tick("combine")
        still_open = combined
        if batch.advanced:
            ends = ctx.window.pane_end(np.asarray(combined["window"].combine_chunks()))
            closing = ends <= punctuation
            if prev.punctuation is not None:
                closing &= ends > prev.punctuation
            closed = combined.filter(pa.array(closing))
            still_open = combined.filter(pa.array(ends > punctuation))
            if closed.num_rows:
                result = ctx.finalize(ctx.spark.createDataFrame(closed))
                ctx.tick("outputs")
                state.closed_rows += ctx.emit(result, batch_id, punctuation)
    if batch.advanced:
        state.punctuation = punctuation
    commit_open(ctx, batch, still_open)
    log.debug("query %s: batch %d timings %s (small, on the driver)", spec.query, batch_id,
              ctx.tick.laps)
    return True
