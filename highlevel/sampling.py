"""The stage of a sampling query: windows of rows sampled in order on the driver.

Semantics (docs/semantics.md, "Sampling queries"): a window's rows are taken in order of
(timestamp, link position, the projected columns' values), so the sample depends neither on
disorder nor on how the rows were cut into batches; ties are broken by values, never by
arrival. The low level selects and projects (`queries.plan.SamplingPlan`); the rows wait in
the stage's buffer until the punctuation passes their window's end, and each closed window,
in order, is sampled by the query's compiled kernel (`highlevel.sampling_kernel`): rows, then
the window's end (final_init, HAVING). Each supergroup's state carries into the next window
(the previous window that had rows) through `dirty_init` with the live-group count HAVING
left; a supergroup new to the window starts with `clean_init`. SELECT is evaluated with numpy
over the surviving groups (`lowlevel.evaluate`), with the supergroups' final states.

State (`StageState.extra`, committed with the batch): the waiting rows (a Parquet dir), the
last window sampled, and each supergroup's state words and live-group count after it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import types as T

from common.spool import LINK
from common.units import INT64_MAX
from highlevel import rowlayout as R
from highlevel.running import key_codes
from highlevel.select import RowStage
from queries import expressions as E
from queries.plan import SamplingPlan

log = logging.getLogger(__name__)

BUFFER = "buffer_dir"        # StageState.extra: the rows of windows not closed yet
DONE = "sampled_through"     # StageState.extra: the last window sampled (a selection: time)
PANE = "__pane"              # a query's row's window, computed on arrival
CARRY = "supergroups"        # StageState.extra: {key text: [state words, live groups]}
#                              (a selection's: the stream's state words)


@dataclass(frozen=True)
class SamplingSpec:
    """A sampling query's stage: its links, the projected columns (name, GSQL type) the
    spool holds, the outputs (name, expression, GSQL type) and the plan."""

    query: str
    inputs: tuple[str, ...]
    input_columns: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[str, Any, str], ...]      # (name, expression, GSQL type)
    plan: SamplingPlan
    #: over another query's rows: its columns (name, GSQL type), which WHERE and the
    #: projections read here (the spool holds them as that query wrote them)
    source_columns: tuple[tuple[str, str], ...] | None = None
    predicate: Any = None

    @property
    def links(self) -> tuple[str, ...]:
        return self.inputs

    def spool_schema(self) -> T.StructType:
        return R.raw_schema(self.source_columns if self.source_columns is not None
                            else self.input_columns)

    def output_columns(self) -> list[tuple[str, str]]:
        return [(n, t) for n, _, t in self.outputs]


def canonical_order(table: pa.Table, links: tuple[str, ...], columns,
                    by_time: bool = True) -> np.ndarray:
    """Row order: timestamp, link position (`by_time`: rows of links; a query's rows carry
    no packet time), then each projected column's value (unsigned values and IP halves as
    unsigned numbers, strings as text)."""
    n = table.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    keys: list[np.ndarray] = []
    if by_time:
        keys.append(np.asarray(table.column("window").to_numpy(), np.int64))
        link_names = np.asarray(table.column(LINK).to_pylist(), dtype=object)
        position = {name: k for k, name in enumerate(links)}
        keys.append(np.fromiter((position.get(x, len(links)) for x in link_names), np.int64,
                                n))
    for name, gsql in columns:
        value = R.to_value(table, name, gsql)
        parts = value if isinstance(value, tuple) else (value,)
        for p in parts:
            if p.dtype == object:
                p = np.unique(p.astype(str), return_inverse=True)[1]
            keys.append(p)
    return np.lexsort(keys[::-1])


class SamplingStage(RowStage):
    """The stage of a `SamplingSpec` (module docstring)."""

    def __init__(self, spec: SamplingSpec, spool, checkpoint, sinks, **options):
        from highlevel.sampling_kernel import compile_kernel

        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.spec: SamplingSpec = spec
        self.plan = spec.plan
        self.kernel = compile_kernel(self.plan)
        w = self.plan.window
        # a selection that samples has no windows: its "window" is every row's own time
        self.pane_ns, self.offset_ns = (w.pane_ns, w.offset_ns) if w is not None else (1, 0)
        self.types = dict(spec.input_columns)
        self.key_cols = [k.expr.name for k in self.plan.keys]
        names = {k.name: k.expr.name for k in self.plan.keys}
        self.super_cols = [names[g] for g in self.plan.supergroup]
        self._meld_out: int | None = None

    def _meld(self, state, files):
        self._meld_out = super()._meld(state, files)
        return self._meld_out

    def _window_of(self, t: np.ndarray) -> np.ndarray:
        return (t + self.offset_ns) // self.pane_ns

    def _windows(self, table: pa.Table) -> np.ndarray:
        """Each row's window: from its time, or (rows of a query) the pane column computed
        from the temporal item on arrival."""
        if PANE in table.column_names:
            return np.asarray(table.column(PANE).to_numpy(), np.int64)
        return self._window_of(np.asarray(table.column("window").to_numpy(), np.int64))

    def _projected(self, data) -> pa.Table:
        """A batch's rows in the projected layout (LINK, window, the `__p` columns, and for a
        query's rows `__pane`); a query's rows pass WHERE and are projected here."""
        spec = self.spec
        if spec.source_columns is None:
            cols = [LINK, "window"] + [c for name, gsql in spec.input_columns
                                       for c in R.raw_names(name, gsql)]
            return data.select(*cols).toArrow()
        table = data.toArrow()
        n = table.num_rows
        values = R.to_values(table, spec.source_columns)
        keep = R.keep_mask(spec.predicate, values, n)
        if not keep.all():
            idx = np.flatnonzero(keep)
            values, table, n = R.take_values(values, idx), table.take(pa.array(idx)), len(idx)
        out = {LINK: table.column(LINK), "window": table.column("window")}
        for k in self.plan.columns:
            for c, a in R.from_value(R.evaluate(k.expr, values, n), dict(spec.input_columns)[
                    k.name], n, k.name):
                out[c] = a
        w = self.plan.window
        if w is not None:
            pane = R.evaluate(w.expr, values, n) if w.expr is not None else \
                self._window_of(np.asarray(table.column("window").to_numpy(), np.int64))
            out[PANE] = pa.array(np.broadcast_to(np.asarray(pane), (n,)).astype(np.int64))
        return pa.table(out)

    def _output_punctuation(self, state, meld_out, bounds):
        """Rows to come are of windows not sampled yet: at or after the open window's start
        (a selection's: at or after the punctuation)."""
        if meld_out is None or meld_out >= INT64_MAX or self.plan.window is None:
            return meld_out
        return int(self._window_of(np.int64(meld_out))) * self.pane_ns - self.offset_ns

    # --- the batch -------------------------------------------------------------------------
    def _step(self, state, data, rows, bounds, batch_id):
        parts = []
        if state.extra.get(BUFFER):
            parts.append(pq.read_table(self.store.path(state.extra[BUFFER])))
        if data is not None:
            parts.append(self._projected(data))
        table = pa.concat_tables([p.select(parts[0].column_names).cast(parts[0].schema)
                                  for p in parts]) if parts else None
        done = state.extra.get(DONE)
        p = self._meld_out
        out: list[pa.Table] = []
        rest = table
        if self.plan.window is None and table is not None and table.num_rows:
            t = np.asarray(table.column("window").to_numpy(), np.int64)
            if done is not None:
                table, t = self._drop_late(state, table, t, t < done)
            ready = t < p if p is not None else np.zeros(len(t), bool)
            if ready.any():
                out.append(self._select(state, table.filter(pa.array(ready))))
            rest = table.filter(pa.array(~ready))
            if p is not None:
                state.extra[DONE] = int(p)     # a selection: sampled up to this time
        elif table is not None and table.num_rows:
            windows = self._windows(table)
            if done is not None:
                table, windows = self._drop_late(state, table, windows, windows <= done)
            ends = (windows + 1) * self.pane_ns - self.offset_ns
            closed = ends <= p if p is not None else np.zeros(len(windows), bool)
            for w in np.unique(windows[closed]):
                sel = np.flatnonzero(windows == w)
                out.append(self._window(state, int(w), table.take(pa.array(sel))))
                state.extra[DONE] = int(w)
            rest = table.filter(pa.array(~closed))
        state.extra.pop(BUFFER, None)
        if rest is not None and rest.num_rows:
            name = f"buffer-{batch_id:010d}"
            path = Path(self.store.path(name))
            path.mkdir(parents=True, exist_ok=True)
            pq.write_table(rest, path / "part-0.parquet")
            state.extra[BUFFER] = name
        out = [t for t in out if t.num_rows]
        return pa.concat_tables(out) if out else None

    def _window(self, state, w: int, table: pa.Table) -> pa.Table:
        """Sample one closed window's rows; the raw output rows."""
        from highlevel import stateful as S

        plan, spec = self.plan, self.spec
        table = table.take(pa.array(canonical_order(table, spec.inputs, spec.input_columns,
                                                    spec.source_columns is None)))
        n = table.num_rows
        values = R.to_values(table, spec.input_columns)
        P = self._numbers(values, n)
        sgi, nsg = key_codes(table, [c for name in self.super_cols
                                     for c in R.raw_names(name, self.types[name])])
        gid, ng = key_codes(table, [c for name in self.key_cols
                                    for c in R.raw_names(name, self.types[name])])
        # each supergroup's state: dirty_init from the previous window's, else clean_init
        first_of = np.full(nsg, -1, np.int64)
        first_of[sgi[::-1]] = np.arange(n)[::-1]
        carried = state.extra.get(CARRY) or {}
        states = np.zeros((nsg, S.WORDS))
        sg_keys = []
        for s in range(nsg):
            key = self._key_text(values, first_of[s])
            sg_keys.append(key)
            old = carried.get(key)
            if old is None:
                S.clean_init(states[s])
            else:
                S.dirty_init(states[s], np.asarray(old[0], np.float64), int(old[1]))
        na, ns = len(plan.aggregates), len(plan.super_aggregates)
        cd = np.zeros(nsg, np.int64)
        sagg = np.zeros((nsg, ns))
        for k, (kind, _) in enumerate(plan.super_aggregates):
            if kind in ("min", "max"):
                sagg[:, k] = np.nan
        agg, shadow = np.zeros((ng, na)), np.zeros((ng, ns))
        alive = np.zeros(ng, bool)
        first = np.full(ng, -1, np.int64)
        cur = np.full(ng, -1, np.int64)
        ent_g, ent_next = np.zeros(n, np.int64), np.zeros(n, np.int64)
        head, tail = np.full(nsg, -1, np.int64), np.full(nsg, -1, np.int64)
        counts = np.zeros(4, np.int64)
        window = plan.window
        assert window is not None          # an aggregation samples per window
        w_value = float(w * window.scale + window.shift)
        self.kernel.rows(P, sgi, gid, w_value, states, cd, sagg, agg, shadow, alive, first,
                         cur, ent_g, ent_next, head, tail, counts)
        self.kernel.finish(w_value, states, cd, sagg, agg, shadow, alive, first, cur, ent_g,
                           ent_next, head, tail, P, counts)
        state.extra[CARRY] = {key: [states[s].tolist(), int(cd[s])]
                              for s, key in enumerate(sg_keys)}
        log.debug("query %s: window %d: %d rows, %d admitted, %d groups kept, %d cleaning "
                  "passes, %d groups removed", spec.query, w, n, counts[1], int(alive.sum()),
                  counts[2], counts[3])
        return self._outputs(w, window, values, first, alive, sgi, agg, sagg, cd, states)

    def _drop_late(self, state, table: pa.Table, keys: np.ndarray, late: np.ndarray):
        """Rows behind what was sampled already: dropped and counted."""
        if not late.any():
            return table, keys
        state.late_rows += int(late.sum())
        log.warning("query %s: %d rows arrived behind what was sampled already; dropped and "
                    "counted", self.spec.query, int(late.sum()))
        return table.filter(pa.array(~late)), keys[~late]

    def _select(self, state, table: pa.Table) -> pa.Table:
        """A sampling selection: the rows before the punctuation, in order, through WHERE's
        stateful conjuncts with the stream's one state; the admitted rows' SELECT list."""
        from highlevel import stateful as S
        from lowlevel.evaluate import evaluate_columns

        spec = self.spec
        table = table.take(pa.array(canonical_order(table, spec.inputs, spec.input_columns,
                                                    spec.source_columns is None)))
        values = R.to_values(table, spec.input_columns)
        P = self._numbers(values, table.num_rows)
        st = np.zeros(S.WORDS)
        if state.extra.get(CARRY) is None:
            S.clean_init(st)
        else:
            st[:] = state.extra[CARRY]
        admitted = np.zeros(table.num_rows, bool)
        self.kernel.admit(P, 0.0, st, 0, admitted)
        state.extra[CARRY] = st.tolist()
        idx = np.flatnonzero(admitted)
        m = len(idx)
        kept = {k: (v[0][idx], v[1][idx]) if isinstance(v, tuple) else v[idx]
                for k, v in values.items()}
        raw = {"window": table.column("window").take(pa.array(idx))}
        for name, expr, gsql in spec.outputs:
            v = evaluate_columns(expr, kept, m) if m else np.zeros(0)
            for c, a in R.from_value(v, gsql, m, name):
                raw[c] = a
        return pa.table(raw)

    def _numbers(self, values: dict, n: int) -> np.ndarray:
        """The projected columns as float64 (n, columns) for the kernel; NaN for addresses
        and strings, which conditions do not read."""
        P = np.full((n, len(self.spec.input_columns)), np.nan)
        for j, (name, _) in enumerate(self.spec.input_columns):
            v = values[name]
            if not isinstance(v, tuple) and v.dtype != object:
                P[:, j] = v.astype(np.float64)
        return P

    def _key_text(self, values: dict, row: int) -> str:
        """A supergroup's key as JSON-able text (the state carries across windows by it)."""
        parts = []
        for name in self.super_cols:
            v = values[name]
            parts.append(repr((int(v[0][row]), int(v[1][row])) if isinstance(v, tuple)
                              else v[row].item() if hasattr(v[row], "item") else v[row]))
        return "|".join(parts)

    def _outputs(self, w, window, values, first, alive, sgi, agg, sagg, cd, states):
        """The surviving groups' SELECT rows (raw layout; `window` = the window's start)."""
        from lowlevel.evaluate import evaluate_columns

        plan = self.plan
        groups = np.flatnonzero(alive)
        m = len(groups)
        rows = first[groups]
        group_sg = sgi[rows]
        cols: dict[str, object] = {}
        for name in self.key_cols:
            v = values[name]
            cols[name] = (v[0][rows], v[1][rows]) if isinstance(v, tuple) else v[rows]
        for k in range(len(plan.aggregates)):
            cols[f"__a{k}"] = agg[groups, k]
        for k in range(len(plan.super_aggregates)):
            cols[f"__s{k}"] = np.nan_to_num(sagg[group_sg, k])
        cols["__cd"] = cd[group_sg]
        cols[window.column] = np.full(m, w * window.scale + window.shift, np.int64)
        raw = {"window": pa.array(np.full(m, w * self.pane_ns - self.offset_ns, np.int64))}
        for name, expr, gsql in self.spec.outputs:
            expr = self._typed(expr, cols, states, cd, group_sg)
            v = evaluate_columns(expr, cols, m) if m else np.zeros(0)
            for c, a in R.from_value(v, gsql, m, name):
                raw[c] = a
        return pa.table(raw)

    def _typed(self, expr, cols, states, cd, group_sg):
        """`expr` over `cols`: the kernel's float64 aggregates read as their types, the
        accessor calls (ssthreshold() ...) as columns of their supergroup's final value."""
        from highlevel import stateful as S

        def fix(n):
            if isinstance(n, E.Field) and n.name.startswith(("__a", "__s")):
                key = f"{n.name}:{n.type}"
                if key not in cols:
                    raw = np.asarray(cols[n.name])
                    t = n.type or "float"
                    cols[key] = raw if t == "float" else raw.astype(np.int64).view(np.uint64) \
                        if t in R.UNSIGNED else raw.astype(np.int64)
                return n.replace(name=key)
            if isinstance(n, E.Func) and n.name in S.FUNCTIONS:
                key = f"__f_{n.name}"
                if key not in cols:
                    fid = S.FUNCTIONS[n.name][0]
                    per_sg = np.array([S.call(fid, states[s], int(cd[s]), np.zeros(0))
                                       for s in range(len(states))])
                    v = per_sg[group_sg] if len(per_sg) else np.zeros(0)
                    cols[key] = v if S.FUNCTIONS[n.name][2] == "float" else v.astype(np.int64)
                return E.Field(name=key, type="float" if S.FUNCTIONS[n.name][2] == "float"
                               else "int")
            return n

        return expr.transform(fix)
