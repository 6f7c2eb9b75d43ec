"""Running aggregation: GS-lite's CLOSING_WHEN, groups carried from one window to the next.

Semantics (docs/semantics.md, "Running aggregation"): a group is identified by its keys
without the temporal item. At the end of each window every open group is output (when HAVING
holds) and then closed if CLOSING_WHEN holds; otherwise it is carried into the next window,
where it is open even without a row, its states empty (`queries.plan.empty_state`: COUNT and
SUM 0, MIN the type's largest value, ...). Windows advance one at a time, as GS-lite's later
runtime does (a gap of silent windows is reported window by window), up to the last window
that has a row: silent windows at the end of the input are not reported, as GS-lite reports
a window only once a later row shows it ended. The result depends neither on disorder nor on
how the windows are cut into batches.

How it runs: the low level pre-aggregates per (window, keys) exactly as for any tumbling
window, and the Spark stage combines the partial rows (`highlevel.aggregate`). What differs
is the close: the rows of the windows the punctuation closes are collected on the driver,
which steps through the windows in order (`step_windows`, numpy, one step per window, over
the open groups only), evaluates CLOSING_WHEN on each step's rows (`lowlevel.evaluate`), and
hands the filled rows (data rows and carried groups' empty rows) back to Spark as a local
relation for HAVING and the SELECT list. A RUNNING user-defined aggregate's state spans the
group's windows: the carried state (after `window_change`) is combined with each window's
partial state (`RunningState`). The carried groups' keys and the last window stepped
through are the stage's state (`StageState.extra`), written with each batch's commit, so a
restart resumes where the last committed batch ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.spool import register_column
from highlevel.aggregate import AggregateStage
from highlevel.errors import StageConfigError
from queries import expressions as E
from queries.plan import ip_words, udaf_words

log = logging.getLogger(__name__)

CARRY = "carry_dir"        # StageState.extra: the Parquet dir of the carried groups' keys
THROUGH = "through"        # StageState.extra: the last window stepped through


def key_codes(table: pa.Table, columns: list[str]) -> tuple[np.ndarray, int]:
    """One int code per row for its values of `columns` (equal values, equal codes)."""
    if not columns:
        return np.zeros(table.num_rows, np.int64), 1 if table.num_rows else 0
    codes = None
    for c in columns:
        col = table.column(c).combine_chunks() if table.num_rows else table.column(c)
        enc = pc.dictionary_encode(col)
        idx = enc.combine_chunks().indices if isinstance(enc, pa.ChunkedArray) else enc.indices
        part = np.asarray(idx.fill_null(-1), np.int64) + 1
        if codes is None:
            codes = part
            continue
        width = int(part.max()) + 1 if len(part) else 1
        if int(codes.max(initial=0)) >= (1 << 62) // width:
            codes = np.unique(codes, return_inverse=True)[1].reshape(-1).astype(np.int64)
        codes = codes * width + part      # a mixed-radix number: distinct per value tuple
    assert codes is not None
    _, codes = np.unique(codes, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    return codes, int(codes.max()) + 1 if len(codes) else 0


@dataclass(frozen=True)
class RunningState:
    """A RUNNING user-defined aggregate's state words (their columns in Spark's layout)."""

    words: tuple[str, ...]
    udaf: Any

    def read(self, table: pa.Table) -> np.ndarray:
        """The words of `table`'s rows as states (n, size) of the UDAF's dtype."""
        cols = [_np(table, w) for w in self.words]
        rows = np.stack(cols, axis=1) if cols and table.num_rows else \
            np.zeros((table.num_rows, len(self.words)))
        return rows.astype(np.float64) if self.udaf.dtype == "float64" else \
            rows.astype(np.int64).view(np.dtype(self.udaf.dtype))

    def write(self, table: pa.Table, rows: np.ndarray) -> pa.Table:
        if self.udaf.dtype != "float64":
            rows = np.ascontiguousarray(rows).view(np.int64)
        for j, w in enumerate(self.words):
            i = table.schema.get_field_index(w)
            table = table.set_column(i, table.schema.field(i),
                                     pa.array(np.ascontiguousarray(rows[:, j]),
                                              table.schema.field(i).type))
        return table


def step_windows(closed: pa.Table, carry: pa.Table | None, through: int | None,
                 key_columns: list[str], empty: dict[str, object],
                 closing: Callable[[pa.Table], np.ndarray],
                 running: tuple[RunningState, ...] = ()) -> tuple[pa.Table, pa.Table, int | None]:
    """Step through the windows after `through` up to the last window of `closed`.

    closed: one row per (window, keys) of the windows closing now (columns `window`, the key
    columns, the state columns); carry: the key columns of the groups open after window
    `through` (and the words of the RUNNING aggregates, `window_change`d already); empty: a
    state column's value for a group without a row; closing: the CLOSING_WHEN of a step's
    rows; running: the RUNNING aggregates, whose state spans a group's windows (a carried
    group's words `combine` the window's partial state). Returns (the filled rows of every
    step, in `closed`'s schema; the key columns (and running words) of the groups open after
    the last step; the last step)."""
    from lowlevel.udafs import combined_pairs, window_changed

    carried_cols = key_columns + [w for r in running for w in r.words]
    carry = carry if carry is not None else closed.select(carried_cols).slice(0, 0)
    if closed.num_rows == 0 and carry.num_rows == 0:
        return closed, carry, through
    windows = np.asarray(closed.column("window").combine_chunks() if closed.num_rows
                         else np.zeros(0, np.int64), np.int64)
    target = int(windows.max()) if len(windows) else through
    if through is not None and target is not None:
        target = max(target, through)
    start = through + 1 if through is not None else int(windows.min())
    keys_all = pa.concat_tables([carry.select(key_columns).cast(closed.select(key_columns).schema),
                                 closed.select(key_columns)])
    codes_all, ncodes = key_codes(keys_all, key_columns)
    nc = carry.num_rows
    row_codes = codes_all[nc:]
    rep = np.zeros(ncodes, np.int64)
    rep[codes_all[::-1]] = np.arange(len(codes_all))[::-1]      # a row of each code
    # the running words of every open group, by code (window_change'd: ready for its next window)
    words = {r.words: np.zeros((ncodes, len(r.words)), r.udaf.dtype) for r in running}
    for r in running:
        words[r.words][codes_all[:nc]] = r.read(carry)
    order = np.argsort(windows, kind="stable")
    sorted_w = windows[order]
    open_codes = np.unique(codes_all[:nc])
    pieces: list[pa.Table] = []
    w = start
    while target is not None and w <= target:
        lo, hi = np.searchsorted(sorted_w, [w, w + 1])
        if not len(open_codes) and lo == hi:
            if hi >= len(sorted_w):
                break
            w = int(sorted_w[hi])         # nothing open, nothing here: the next data window
            continue
        rows = order[lo:hi]
        here = row_codes[rows]
        extra = np.setdiff1d(open_codes, here)
        step = closed.take(pa.array(rows))
        if len(extra):
            step = pa.concat_tables([step, _empty_rows(closed.schema, keys_all.take(
                pa.array(rep[extra])), w, empty)])
        codes = np.concatenate([here, extra])
        for r in running:
            state = r.read(step)
            was_open = np.isin(codes, open_codes)
            carried = words[r.words][codes]
            fresh = np.arange(len(codes)) < len(here)      # rows with a partial state
            both = was_open & fresh
            if both.any():
                state[both] = combined_pairs(r.udaf, carried[both], state[both])
            state[~fresh] = carried[~fresh]
            step = r.write(step, state)
        closes = closing(step) if step.num_rows else np.zeros(0, bool)
        kept = codes[~closes]
        for r in running:
            words[r.words][kept] = window_changed(r.udaf, r.read(step)[~closes])
        open_codes = np.unique(kept)
        pieces.append(step)
        w += 1
    filled = pa.concat_tables(pieces) if pieces else closed.slice(0, 0)
    carry_out = keys_all.take(pa.array(rep[open_codes]))
    for r in running:
        rows_out = words[r.words][open_codes]
        if r.udaf.dtype != "float64":
            rows_out = np.ascontiguousarray(rows_out).view(np.int64)
        for j, wname in enumerate(r.words):
            field = closed.schema.field(wname)
            carry_out = carry_out.append_column(field, pa.array(
                np.ascontiguousarray(rows_out[:, j]), field.type))
    return filled, carry_out, target


def _empty_rows(schema: pa.Schema, keys: pa.Table, window: int,
                empty: dict[str, object]) -> pa.Table:
    """Rows of `schema` for carried groups without a row in `window`: their keys, empty
    states."""
    n = keys.num_rows
    cols = []
    for f in schema:
        if f.name == "window":
            cols.append(pa.array(np.full(n, window, np.int64), f.type))
        elif f.name in keys.column_names:
            cols.append(keys.column(f.name).cast(f.type))
        else:
            value = empty.get(f.name, 0)
            cols.append(pa.array([value] * n, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


class ClosingCondition:
    """CLOSING_WHEN evaluated on the driver over a step's rows (Spark's Arrow layout: IP keys
    as `name__hi`/`name__lo`, unsigned values as their int64 bit pattern)."""

    def __init__(self, spec):
        self.spec = spec
        finals = dict(spec.finals)
        self.expr = spec.closing.transform(
            lambda n: finals[n.name] if isinstance(n, E.Field) and n.name in finals else n)

    def __call__(self, step: pa.Table) -> np.ndarray:
        from lowlevel.evaluate import evaluate_columns
        from lowlevel.values import truthy

        spec, n = self.spec, step.num_rows
        cols: dict[str, object] = {}
        for k in spec.keys:
            if k.type == "ip":
                cols[k.name] = (_np(step, f"{k.name}__hi").view(np.uint64),
                                _np(step, f"{k.name}__lo").view(np.uint64))
            else:
                v = _np(step, k.name)
                cols[k.name] = v.view(np.uint64) if k.type == "uint64" else v
        win = spec.window
        if win.column is not None:
            ids = _np(step, "window")
            cols[win.column] = ids * win.scale + win.shift
        for s in spec.states:
            if s.kind == "distinct":
                cols[s.name] = np.stack([_np(step, register_column(s.name, i)).astype(np.uint8)
                                         for i in range(spec.distinct_registers)], axis=1)
                continue
            if s.dtype == "ip":         # MIN/MAX over an address: (hi, lo) as a key is
                cols[s.name] = tuple(_np(step, w).view(np.uint64) for w in ip_words(s.name))
                continue
            for c in [c for c, _ in spec.state_columns() if c == s.name or
                      c.startswith(f"{s.name}__")]:
                v = _np(step, c)
                cols[c] = v.view(np.uint64) if s.dtype == "uint64" and v.dtype == np.int64 else v
        return np.asarray(truthy(evaluate_columns(self.expr, cols, n)), bool)


def _np(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return np.asarray(arr.to_numpy(zero_copy_only=False))


class RunningStage(AggregateStage):
    """The Spark stage of a running aggregation (module docstring)."""

    may_close_on_driver = False

    def __init__(self, spec, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        if spec.closing is None or not self.window.tumbling:
            raise StageConfigError(f"query {spec.query!r}: a running aggregation needs "
                                   f"CLOSING_WHEN and tumbling windows")
        self.small_on_driver = False     # the close steps windows in order on the driver
        self.condition = ClosingCondition(spec)
        self.empty = self._empty_values()
        self.running = tuple(RunningState(tuple(udaf_words(s.name, s.udaf.size)), s.udaf)
                             for s in spec.states if s.kind == "udaf" and s.udaf.running)
        self._pending: tuple[pa.Table, int | None] | None = None

    def _empty_values(self) -> dict[str, object]:
        """Each state column's empty value as Spark holds it (uint64 as its int64 pattern)."""
        out: dict[str, object] = {}
        for name, value in self.spec.empty:
            if value is None:          # COUNT_DISTINCT: every register 0
                for i in range(self.spec.distinct_registers):
                    out[register_column(name, i)] = 0
            elif isinstance(value, int) and value >= 1 << 63:
                out[name] = value - (1 << 64)
            else:
                out[name] = value
        return out

    def _carried(self) -> pa.Table | None:
        name = self.state.extra.get(CARRY)
        return pq.read_table(self.store.path(name)) if name else None

    def close(self, combined, batch_id: int, before: int | None, upto: int,
              corrections: pa.Table | None = None, extra: pa.Table | None = None) -> int:
        assert extra is None            # no final rows here: the close steps windows in order
        closed = combined.where(self.closing(before, upto)).toArrow()
        self._tick("combine+collect")
        filled, carry, through = step_windows(closed, self._carried(),
                                              self.state.extra.get(THROUGH),
                                              self.spec.key_columns(), self.empty,
                                              self.condition, self.running)
        self._pending = (carry, through)
        self._tick("step windows")
        if not filled.num_rows:
            return 0
        result = self.finalize_rows(self.spark.createDataFrame(filled))
        return self.emit(result, batch_id, upto)

    def _commit(self, state) -> None:
        if self._pending is not None:
            carry, through = self._pending
            self._pending = None
            state.extra[THROUGH] = through
            state.extra.pop(CARRY, None)
            if carry.num_rows:
                name = f"carry-{state.batch:010d}"
                path = Path(self.store.path(name))
                path.mkdir(parents=True, exist_ok=True)
                pq.write_table(carry, path / "part-0.parquet")
                state.extra[CARRY] = name
        super()._commit(state)
