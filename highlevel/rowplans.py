"""Query-on-query aggregation: an input query's rows -> partial rows, inside Spark.

A `LowLevelPlan` with `source_kind == "query"` (the planner's `row_plans`) is the "low level"
of an aggregation over another query's results: WHERE over the input's columns, the pane id
from `window.expr`, the group keys and the sub-aggregate arguments. Here it runs per Arrow
batch inside `DataFrame.mapInArrow` (no hash table: each input row becomes one partial row
and the aggregation stage combines them as it combines evicted partials). Marker rows
(link, seq, punctuation) pass through unchanged, so the stage melds the input's punctuation
exactly as for links.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from common.spool import JOINT_MARKERS, LINK, PUNCT, SEQ, register_column
from highlevel import rowlayout as R
from lowlevel.hll import registers_of


def state_arrays(sub, v, n: int, registers: int) -> dict[str, pa.Array]:
    if sub.kind == "count":
        return {sub.name: pa.array(np.ones(n, np.int64))}
    if sub.kind == "distinct":
        regs = registers_of(v, np.arange(n, dtype=np.int64), n, registers)
        return {register_column(sub.name, i): pa.array(regs[:, i].astype(np.int32))
                for i in range(registers)}
    if sub.dtype == "ip":       # MIN/MAX over an address: its halves, as a key's
        return dict(R.from_value(v, "ip", n, sub.name))
    a = np.broadcast_to(np.asarray(v), (n,))
    if sub.kind == "udaf":
        from lowlevel.udafs import single_states
        from queries.plan import udaf_words

        rows = single_states(sub.udaf, a)
        if rows.dtype == np.uint64:
            rows = rows.view(np.int64)
        return {w: pa.array(np.ascontiguousarray(rows[:, j]))
                for j, w in enumerate(udaf_words(sub.name, sub.udaf.size))}
    if sub.dtype == "string":
        return {sub.name: pa.array(np.asarray(a, dtype=object), pa.string())}
    if a.dtype == np.bool_:
        a = a.astype(np.uint64)
    a = a.astype(np.dtype(sub.dtype))
    out = {sub.name: pa.array(a.astype(np.float64) if sub.dtype == "float64"
                              else np.ascontiguousarray(a).view(np.int64)
                              if a.dtype == np.uint64 else a.astype(np.int64))}
    if sub.kind in ("first", "last"):
        # an input query's rows carry no packet timestamp: ties broken by value, as the
        # reference evaluator does with its zero times
        out[f"{sub.name}__t"] = pa.array(np.zeros(n, np.int64))
    return out


def partial_rows_function(plan, input_columns, spec):
    """The mapInArrow function: raw rows of the input query -> the stage's spool rows."""
    schema = spec.spool_schema()
    registers = spec.distinct_registers
    key_types = {k.name: k.type for k in spec.keys}

    def convert(batch: pa.RecordBatch) -> pa.RecordBatch:
        data, markers = R.split_markers(batch)
        out = [R.batch_table(markers, schema, {c: markers.column(c)
                                               for c in (LINK, SEQ, PUNCT, *JOINT_MARKERS)
                                               if c in markers.schema.names})]
        n = data.num_rows
        if n:
            values = R.to_values(data, input_columns)
            keep = R.keep_mask(plan.predicate, values, n)
            if not keep.all():
                idx = np.flatnonzero(keep)
                values, data, n = R.take_values(values, idx), data.take(pa.array(idx)), len(idx)
        if n:
            cols = {LINK: data.column(LINK), SEQ: data.column(SEQ),
                    PUNCT: pa.nulls(n, pa.int64())}
            pane = np.broadcast_to(np.asarray(R.evaluate(plan.window.expr, values, n)), (n,))
            cols["window"] = pa.array(pane.astype(np.int64))
            for s in plan.subaggs:
                v = None if s.arg is None else R.evaluate(s.arg, values, n)
                cols.update(state_arrays(s, v, n, registers))
            # CUBE / ROLLUP / GROUPING_SETS: the rows once per grouping pattern, with that
            # pattern's keys (queries.plan.LowLevelPlan.patterns)
            for exprs in plan.patterns or ([k.expr for k in plan.keys],):
                keyed = dict(cols)
                for k, expr in zip(plan.keys, exprs):
                    v = R.evaluate(expr, values, n)
                    t = key_types[k.name]
                    gsql = "ip" if t == "ip" else ("float" if t == "float64" else
                                                   "bool" if t == "bool" else
                                                   "string" if t == "string" else "llong")
                    if t == "uint64":
                        v = np.broadcast_to(np.asarray(v), (n,)).astype(np.uint64)
                    for name, arr in R.from_value(v, gsql, n, k.name):
                        keyed[name] = arr
                out.append(R.batch_table(data, schema, keyed))
        return out

    def fn(batches):
        for b in batches:
            yield from convert(b)

    return fn


def prepare_function(plan, input_columns, spec):
    """`AggregateStage(prepare=...)`: the micro-batch DataFrame mapped to partial rows."""
    fn = partial_rows_function(plan, input_columns, spec)
    schema = spec.spool_schema()
    return lambda df: df.mapInArrow(fn, schema)
