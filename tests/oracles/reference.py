"""The reference evaluator: exact query results over whole packet batches, the oracle for every split.

Deliberately simple and independent of the low/high split: no hash table, no panes, no
punctuation. It works from the analysed query (the expressions as written, resolved), groups
whole inputs at once (pandas factorisation + numpy reductions), expands sliding windows by the
definition of docs/semantics.md "Windows" (`wids(x) = {w : floor(x/s) <= w < floor((x+r)/s)}`),
joins by key equality then the band / temporal condition, and reads earlier queries' results
for query-on-query. Every tuple counts (no late data: it sees the whole input).

Flow queries (DEFINE idle_timeout / flow_end) follow the flow semantics of docs/semantics.md "Flow
queries" with a plain loop over each link's packets in arrival order (`flow_assignment`): each
packet gets a flow number (a hidden group key) and each flow its end reason.

Record links (`capture.records`) are given as record batches (`read_all_records`): every row
is a record of the protocol, strings are compared and grouped as texts.

`evaluate_file(file_plan_or_tree, batches, params=None)` -> {query name: pandas.DataFrame}, the
columns as the SELECT says; `ip` columns hold 128-bit Python ints (IPv4-mapped for IPv4),
`ipv4` columns 32-bit values, join columns of a missing outer side hold None (a query reading
the join sees them as 0: GSQL has no NULL arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from capture.batch import PacketBatch
from capture.schema import L_TCP, protocol_mask
from common.errors import LinkError
from lowlevel import evaluate as _evaluate
from lowlevel.hll import estimate, registers_of
from lowlevel.values import plain, truthy
from queries import expressions as E
from queries.analysed import AnalysedQuery
from queries.inference import type_of, unit_ns
from queries.plan import FilePlan, QueryPlan
from queries.planner import param_literal, plan_file
from tests.oracles.functions import reference_functions

# getlpmid and user functions by the reference's own row-by-row code (tests/oracles/functions.py)
evaluate = partial(_evaluate.evaluate, functions=reference_functions)
evaluate_columns = partial(_evaluate.evaluate_columns, functions=reference_functions)

_REDUCE = {"SUM": np.add, "MIN": np.minimum, "MAX": np.maximum, "AND_AGGR": np.bitwise_and,
           "OR_AGGR": np.bitwise_or, "XOR_AGGR": np.bitwise_xor}


@dataclass
class Table:
    """Rows as named evaluated columns (ip columns as (hi, lo) tuples)."""

    columns: dict
    n: int


def evaluate_file(plan, batches: dict[str, PacketBatch], params: dict[str, str] | None = None,
                  source: str | None = None) -> dict[str, pd.DataFrame]:
    """Exact results of every query of a file (a FilePlan, or a parsed tree planned here over
    the links of `batches`)."""
    if not isinstance(plan, FilePlan):
        plan = plan_file(plan, list(batches), params, source=source)
    tables: dict[str, Table] = {}
    out = {}
    for qp in plan.queries:
        table = evaluate_query(qp, batches, tables)
        tables[qp.name] = table
        out[qp.name] = to_frame(table, qp)
    return out


# --- helpers ------------------------------------------------------------------------------------

def _in_windows(first, count, slide, keys: dict, args: list, times, window_end: str):
    """Row i repeated once per window first[i] .. first[i] + count[i] - 1 (window ids in slides):
    the keys, aggregate arguments and times of the copies, with `window_end` = (id + 1) * slide
    among the keys, and the number of copies."""
    idx = np.repeat(np.arange(len(first)), count)
    wid = np.repeat(first, count) + (np.arange(len(idx)) - np.repeat(np.cumsum(count) - count, count))
    keys = {k: _take(v, idx) for k, v in keys.items()}
    args = [None if a is None else _take(a, idx) for a in args]
    keys[window_end] = ((wid + 1) * slide).astype(np.int64)
    return keys, args, times[idx], len(idx)


def _take(v, idx):
    return (v[0][idx], v[1][idx]) if isinstance(v, tuple) else v[idx]


def _concat(parts: list):
    if isinstance(parts[0], tuple):
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    return np.concatenate(parts)


def _length(v) -> int:
    return len(v[0]) if isinstance(v, tuple) else len(v)


def _parts(v) -> list[np.ndarray]:
    return list(v) if isinstance(v, tuple) else [v]


def group_codes(keys: list, n: int) -> tuple[np.ndarray, int]:
    """Dense group numbers of rows (0..groups-1) by the values of `keys`."""
    if not keys:
        return np.zeros(n, np.int64), (1 if n else 0)
    cols = {}
    for i, k in enumerate(keys):
        for j, part in enumerate(_parts(k)):
            cols[f"k{i}_{j}"] = part
    df = pd.DataFrame(cols)
    codes = df.groupby(list(cols), sort=True, dropna=False).ngroup().to_numpy().astype(np.int64)
    return codes, (int(codes.max()) + 1 if n else 0)


def _reduce(ufunc, values: np.ndarray, codes: np.ndarray, ngroups: int) -> np.ndarray:
    if ngroups == 0:
        return values[:0]
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
    with np.errstate(over="ignore"):
        return ufunc.reduceat(values[order], starts)


def aggregate(name: str, arg, times: np.ndarray, codes: np.ndarray, ngroups: int):
    """One aggregate per group (groups numbered 0..ngroups-1, each with at least one row)."""
    if name == "COUNT":
        return np.bincount(codes, minlength=ngroups).astype(np.uint64)
    if name == "END_REASON":   # the reason of the row's flow, the same on every row of it
        name = "MAX"
    if name == "COUNT_DISTINCT":
        return estimate(registers_of(arg, codes, ngroups))
    if isinstance(arg, tuple) and name in ("MIN", "MAX"):
        # an address (hi, lo): ordered as one 128-bit unsigned number
        if ngroups == 0:
            return arg
        hi, lo = (np.asarray(x, np.uint64) for x in arg)
        order = np.lexsort((lo, hi, codes))
        sc = codes[order]
        pick = order[np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]] if name == "MIN"
                                    else np.r_[sc[1:] != sc[:-1], True])]
        return hi[pick], lo[pick]
    v = arg.astype(np.uint64) if arg.dtype == np.bool_ and name in ("SUM", "AND_AGGR", "OR_AGGR",
                                                                     "XOR_AGGR") else arg
    if name == "AVG":
        total = _reduce(np.add, v.astype(np.float64) if v.dtype == np.float64 else v, codes, ngroups)
        count = np.bincount(codes, minlength=ngroups)
        return total.astype(np.float64) / count
    if name in _REDUCE:
        return _reduce(_REDUCE[name], v, codes, ngroups)
    # FIRST / LAST: the value of the earliest / latest row, ties by the smaller / larger value
    if ngroups == 0:
        return v[:0]
    order = np.lexsort((v, times, codes))
    sc = codes[order]
    if name == "FIRST":
        pick = np.flatnonzero(np.r_[True, sc[1:] != sc[:-1]])
    else:
        pick = np.flatnonzero(np.r_[sc[1:] != sc[:-1], True])
    return v[order][pick]


def udaf_fold(udaf, arg, codes: np.ndarray, ngroups: int) -> np.ndarray:
    """A user-defined aggregate per group, directly: `init`, `update` with every row of the
    group in input order, `output`; plain Python calls (no Numba, no combine), so a split run
    that combines partial states must agree with it."""
    impl = udaf.implementation()
    states = np.zeros((ngroups, udaf.size), udaf.dtype)
    for g in range(ngroups):
        impl.init(states[g], *udaf.handles)
    values = np.asarray(arg).astype(udaf.arg_dtype)
    for v, g in zip(values, codes):
        impl.update(states[g], v)
    want = {"float": np.float64, "int": np.int64, "llong": np.int64}.get(udaf.returns, np.uint64)
    output = udaf.output_function()
    return np.array([output(s) for s in states], dtype=want)


def _bind(expr, aq: AnalysedQuery):
    if expr is None or not aq.param_values:
        return expr
    return expr.transform(lambda n: param_literal(aq.param_values[n.name], aq.params[n.name])
                          if isinstance(n, E.Param) and n.name in aq.param_values else n)


# --- input rows ---------------------------------------------------------------------------------

class Rows:
    """The input rows of a query: packets of some links, or an earlier query's table."""

    def __init__(self, batches: list[PacketBatch] | None = None, table: Table | None = None):
        self.batches = batches
        self.table = table

    @property
    def n(self) -> int:
        return sum(b.n for b in self.batches) if self.batches is not None else self.table.n

    def eval(self, expr):
        if self.batches is not None:
            # a record link's strings are codes into its intern table: the reference works
            # on the texts themselves
            parts = [plain(evaluate(expr, b)) for b in self.batches]
            if not parts:
                return evaluate(expr, PacketBatch.empty("none"))
            return _concat(parts)
        return evaluate_columns(expr, self.table.columns, self.table.n)


def packet_rows(qp: QueryPlan, source, batches: dict[str, PacketBatch], where) -> Rows:
    out = []
    plans = [lp for lp in qp.low if lp.side in (None, source.alias)]
    for lp in plans:
        link = lp.link
        if link not in batches:
            raise LinkError(f"query {qp.name} reads link {link!r}, which has no packets given")
        b = batches[link]
        mask = np.ones(b.n, bool)
        # a record link's rows are all records of its protocol (capture.records)
        need = 0 if lp.record is not None else protocol_mask(source.protocol)
        if need:
            mask &= (b["layers"] & need) != 0
        b = b.take(mask)
        if where is not None and b.n:
            b = b.take(truthy(evaluate(where, b)))
        out.append(b)
    return Rows(batches=out)


def without_nulls(t: Table, source) -> Table:
    """An earlier query's table as a reader sees it: the nulls of an outer join read as 0."""
    cols = {}
    for name, v in t.columns.items():
        if not isinstance(v, tuple) and v.dtype == object and any(x is None for x in v):
            typ = source.columns[name].type
            filled = [0 if x is None else x for x in v]
            v = np.array(filled, dtype=object) if typ in ("ip", "string") else \
                np.array(filled).astype(_PANDAS_DTYPE.get(typ, "int64"))
        cols[name] = v
    return Table(cols, t.n)


def input_rows(qp: QueryPlan, aq: AnalysedQuery, source, batches, tables, where) -> Rows:
    if source.kind == "link":
        return packet_rows(qp, source, batches, where)
    t = without_nulls(tables[source.query], source)
    if where is not None and t.n:
        keep = np.flatnonzero(truthy(evaluate_columns(where, t.columns, t.n)))
        t = Table({k: _take(v, keep) for k, v in t.columns.items()}, len(keep))
    return Rows(table=t)


# --- queries ------------------------------------------------------------------------------------

def evaluate_query(qp: QueryPlan, batches, tables) -> Table:
    aq: AnalysedQuery = qp.analysed
    if aq is None:
        raise ValueError("the reference evaluator needs a plan made by plan_file")
    if aq.kind == "aggregate":
        return _aggregate(qp, aq, batches, tables)
    if aq.kind == "select" and aq.sampling is not None:
        from tests.oracles.sampling import evaluate_sampling_selection

        return evaluate_sampling_selection(qp, aq, batches, tables)
    if aq.kind == "select":
        rows = input_rows(qp, aq, aq.sources[0], batches, tables, _bind(aq.where, aq))
        return Table({i.name: rows.eval(_bind(i.expr, aq)) for i in aq.items}, rows.n)
    if aq.kind == "join":
        return _join(qp, aq, batches, tables)
    return _merge(qp, aq, batches, tables)


def _aggregate(qp, aq, batches, tables) -> Table:
    if getattr(aq, "sampling", None) is not None:
        from tests.oracles.sampling import evaluate_sampling

        return evaluate_sampling(qp, aq, batches, tables)
    rows = input_rows(qp, aq, aq.sources[0], batches, tables, _bind(aq.where, aq))
    n = rows.n
    keys = {g.name: rows.eval(_bind(g.expr, aq)) for g in aq.group}
    aggs: list[E.Aggregate] = []
    for e in [i.expr for i in aq.items] + [aq.having, aq.closing]:
        for a in (e.find_all(E.Aggregate) if e is not None else ()):
            if a not in aggs:
                aggs.append(a)
    times = rows.eval(E.Field(name="timestamp", type="llong", columns=("timestamp",))) \
        if rows.batches is not None else np.zeros(n, np.int64)
    flow = qp.low[0].flow if qp.low else None
    reason = None
    if flow is not None:
        link_max = [int(batches[lp.link]["timestamp"].max()) if batches[lp.link].n else 0
                    for lp in qp.low]
        fid, reason = flow_assignment(rows, list(keys.values()), times, qp.high.window, flow,
                                      link_max)
        keys["\0flow"] = fid
    args = [reason if a.name == "END_REASON" else
            None if isinstance(a.arg, E.Star) else rows.eval(_bind(a.arg, aq)) for a in aggs]
    if aq.window is not None and aq.window.kind == "rows":
        keys[aq.window_end] = row_windows(qp, aq, rows, keys, aggs, args, times)
    elif aq.window is not None and aq.window.kind == "landmark" and n:
        # landmark: window w holds every row with x < (w+1)*s (from the origin); a group has a
        # row at every slide end after its first row up to the window of the input's last
        # row. [RANGE ALL] (no SLIDE): only that last window, ending at max(x) + 1
        w = aq.window
        x = np.asarray(rows.eval(w.field)).astype(np.int64)
        s = (w.slide_ns or w.unit_ns) // w.unit_ns
        last = int(np.floor_divide(x.max(), s))
        first = np.floor_divide(x, s)
        if not w.slide_ns:
            first = np.full(n, last, np.int64)
        count = last - first + 1
        keys, args, times, n = _in_windows(first, count, s, keys, args, times,
                                           aq.window_end)
    elif aq.window is not None and aq.window.kind == "landmark":
        keys[aq.window_end] = np.zeros(0, np.int64)
    elif aq.window is not None:
        # sliding (or tumbling) window spec: a row is in every window of wids(x)
        w = aq.window
        r, s = w.range_ns // w.unit_ns, w.slide_ns // w.unit_ns
        x = np.asarray(rows.eval(w.field)).astype(np.int64)
        first = np.floor_divide(x, s)
        count = np.floor_divide(x + r, s) - first
        keys, args, times, n = _in_windows(first, count, s, keys, args, times,
                                           aq.window_end)
    if aq.patterns is not None:
        keys, args, times, n = pattern_rows(aq, keys, args, times, n)
    codes, ngroups = group_codes(list(keys.values()), n)
    first_row = np.full(ngroups, -1, np.int64)
    first_row[codes[::-1]] = np.arange(n)[::-1]
    frame = {k: _take(v, first_row) for k, v in keys.items()}
    agg_field = {}
    for i, (a, arg) in enumerate(zip(aggs, args)):
        name = f"_ref{i}"
        frame[name] = udaf_fold(a.udaf, arg, codes, ngroups) if a.udaf is not None else \
            aggregate(a.name, arg, times, codes, ngroups)
        agg_field[a] = E.Field(name=name, type="llong")

    def finals(e):
        return _bind(e.transform(lambda n: agg_field.get(n, n) if isinstance(n, E.Aggregate) else n), aq)

    if aq.closing is not None:
        # a RUNNING aggregate's rows per (window, group), in input order: its state spans
        # the group's windows, so running_frame folds them itself
        running = {}
        for a, arg in zip(aggs, args):
            if a.udaf is not None and a.udaf.running:
                per_group: list[list] = [[] for _ in range(ngroups)]
                for v, g in zip(np.asarray(arg).astype(a.udaf.arg_dtype), codes):
                    per_group[g].append(v)
                running[agg_field[a].name] = (a.udaf, per_group)
        frame, ngroups = running_frame(aq, frame, ngroups, agg_field, finals, running)
    if aq.having is not None and ngroups:
        keep = np.flatnonzero(truthy(evaluate_columns(finals(aq.having), frame, ngroups)))
        frame = {k: _take(v, keep) for k, v in frame.items()}
        ngroups = len(keep)
    out = {}
    for item in aq.items:
        if aq.window_end is not None and item.name == aq.window_end:
            out[item.name] = frame[aq.window_end]
        else:
            out[item.name] = evaluate_columns(finals(item.expr), frame, ngroups)
    if getattr(qp.high, "correction", None):
        # late 'correct': every row of the whole input is a regular row (docs/semantics.md
        # "Late data")
        out[qp.high.correction] = np.zeros(ngroups, np.int64)
    return Table(out, ngroups)


#: GS-lite's value of an aggregate over no row, in a window where a running aggregation's group
#: got none (its reinitialised aggregates): MIN the largest value of the type, MAX the smallest
_TYPE_RANGE = {"uint": (0, 2**32 - 1), "ullong": (0, 2**64 - 1), "int": (-2**31, 2**31 - 1),
               "llong": (-2**63, 2**63 - 1), "bool": (0, 1)}


def _empty_aggregate(a: E.Aggregate, aq: AnalysedQuery, udaf_empty):
    if a.udaf is not None:
        return udaf_empty(a.udaf)
    t = "" if isinstance(a.arg, E.Star) else type_of(a.arg)
    if a.name in ("MIN", "MAX"):
        if t == "float":
            return 1.7976931348623157e308 if a.name == "MIN" else -1.7976931348623157e308
        lo, hi = _TYPE_RANGE.get(t, _TYPE_RANGE["llong"])
        return hi if a.name == "MIN" else lo
    return 0.0 if t == "float" and a.name in ("SUM", "AVG") else 0


def running_frame(aq: AnalysedQuery, frame: dict, n: int, agg_field: dict, finals,
                  running: dict | None = None):
    """GS-lite's running aggregation (CLOSING_WHEN), brute force: per group (keys without the
    temporal item), window after window from its first row up to the input's last window
    with a row; a group with no row in a window it is open in gets every aggregate's empty
    value; after each window it closes when CLOSING_WHEN holds (on that window's values),
    else it stays open into the next window. `running`: a RUNNING aggregate's column ->
    (its UDAF, the row values of each frame row): one state from the group's opening on
    (`init`, then `update` per row), `output` each window, `window_change` between windows."""
    from lowlevel.udafs import udaf_output

    def udaf_empty(udaf):
        return udaf_output(udaf, np.asarray([udaf.identity], udaf.dtype))[0].item()

    if not n:
        return frame, n
    tb, form = aq.temporal.name, aq.temporal.form
    wid = [(int(v) - form.shift) // form.scale for v in np.asarray(frame[tb])]
    others = [g.name for g in aq.group if g is not aq.temporal]

    def key(i):
        return tuple(_value(frame[k], i) for k in others)

    rows_of: dict = {}
    for i in range(n):
        rows_of.setdefault(key(i), {})[wid[i]] = i
    last = max(wid)
    empty = {f.name: _empty_aggregate(a, aq, udaf_empty) for a, f in agg_field.items()}
    running = running or {}
    out_rows: list[dict] = []
    for windows in rows_of.values():
        any_row = next(iter(windows.values()))
        w, open_ = min(windows), True
        states: dict = {}                  # running aggregate -> its state while open
        while w <= last:
            if w in windows:
                row = {c: _value(frame[c], windows[w]) for c in frame}
            elif open_:
                row = {c: _value(frame[c], any_row) for c in others}
                row[tb] = w * form.scale + form.shift
                row.update(empty)
            else:
                later = [x for x in windows if x > w]
                if not later:
                    break
                w, open_ = min(later), True
                continue
            for name, (udaf, per_group) in running.items():
                impl = udaf.implementation()
                if name not in states:
                    states[name] = np.zeros(udaf.size, udaf.dtype)
                    impl.init(states[name], *udaf.handles)
                for v in (per_group[windows[w]] if w in windows else ()):
                    impl.update(states[name], v)
                row[name] = np.asarray(udaf.output_function()(states[name])).item()
            one = {c: _column([v], frame[c]) for c, v in row.items()}
            closes = bool(truthy(evaluate_columns(finals(aq.closing), one, 1))[0])
            out_rows.append(row)
            open_ = not closes
            if closes:
                states = {}
            for name, (udaf, _) in running.items():
                if name in states:
                    udaf.implementation().window_change(states[name])
            w += 1
    cols = {c: _column([r[c] for r in out_rows], frame[c]) for c in frame}
    return cols, len(out_rows)


def _value(col, i):
    if isinstance(col, tuple):
        return (int(col[0][i]), int(col[1][i]))
    v = col[i]
    return v.item() if isinstance(v, np.generic) else v


def _column(values: list, like):
    """`values` as a column of `like`'s kind (an IP column stays a (hi, lo) pair)."""
    if isinstance(like, tuple):
        return (np.array([v[0] for v in values], np.uint64),
                np.array([v[1] for v in values], np.uint64))
    return np.array(values, dtype=np.asarray(like).dtype)


def pattern_rows(aq: AnalysedQuery, keys: dict, args: list, times, n: int):
    """CUBE / ROLLUP / GROUPING_SETS as the union of one group-by per pattern (Tigon SQL
    manual 6.2.11.2): every row once per pattern, the variables absent from it at their
    type's default, and the pattern's number as a hidden key."""
    from queries.grouping_sets import default_literal

    types = {g.name: g.type for g in aq.group}
    parts: dict = {k: [] for k in keys}
    parts["\0pattern"] = []
    for number, present in enumerate(aq.patterns):
        for k, v in keys.items():
            if k in types and k not in present:
                d = evaluate_columns(default_literal(types[k]), {}, n)
                if isinstance(d, tuple):
                    d = tuple(np.broadcast_to(np.asarray(x), (n,)).copy() for x in d)
                else:
                    d = np.broadcast_to(np.asarray(d), (n,)).copy()
                v = d
            parts[k].append(v)
        parts["\0pattern"].append(np.full(n, number, np.int64))
    count = len(aq.patterns)
    new_keys = {k: _concat(v) for k, v in parts.items()}
    new_args = [None if a is None else _concat([a] * count) for a in args]
    return new_keys, new_args, np.concatenate([np.asarray(times)] * count), n * count


def row_windows(qp, aq: AnalysedQuery, rows: Rows, keys: dict, aggs, args, times) -> np.ndarray:
    """The count window of each row (docs/semantics.md "Windows"): rows in order of timestamp, link
    position, then the values of PARTITION BY, GROUP BY and the aggregates' arguments (in query
    order; unsigned and ip values as unsigned); numbered per partition from 0; window = number
    // n. The partition values join the group keys (a window is per partition)."""
    n = rows.n
    link = np.repeat(np.arange(len(rows.batches)), [b.n for b in rows.batches])
    parts = [rows.eval(_bind(f, aq)) for f in aq.window.partition]
    uniq_args = []
    for a, arg in zip(aggs, args):
        if arg is not None and not isinstance(a.arg, E.Star) and \
                all(a.arg != b for b, _ in uniq_args):
            uniq_args.append((a.arg, arg))
    order_values = parts + [keys[g.name] for g in aq.group] + [v for _, v in uniq_args]
    sort_keys = []
    for v in order_values:
        for part in _parts(v):
            part = np.asarray(part)
            sort_keys.append(part.astype(np.uint8) if part.dtype == np.bool_ else part)
    # np.lexsort: the last key is the primary one
    order = np.lexsort(tuple(reversed([times, link] + sort_keys))) if n else np.zeros(0, np.int64)
    for i, v in enumerate(parts):
        keys[f"\0part{i}"] = v
    pcodes, _ = group_codes(parts, n)
    sorted_codes = pcodes[order]
    rank = np.empty(n, np.int64)
    seen: dict[int, int] = {}
    for j, c in zip(order.tolist(), sorted_codes.tolist()):
        rank[j] = seen.get(c, 0)
        seen[c] = rank[j] + 1
    return rank // aq.window.rows


def flow_assignment(rows: Rows, keys: list, times: np.ndarray, window, flow: dict,
                    link_max: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(flow number of each row, end reason of each row's flow) by the flow rules, per link in
    arrival order: a gap > idle ends a flow (1); TCP FIN/RST ends it after the packet (3);
    at the end a flow whose idle expiry (last + idle + 1) or bucket end, the earlier, is at or
    before the link's largest capture time ends with 1 or 2 accordingly, else with 4."""
    sizes = [b.n for b in rows.batches]
    n = sum(sizes)
    link = np.repeat(np.arange(len(sizes)), sizes)
    codes, _ = group_codes(list(keys) + [link], n)
    layers = np.concatenate([b["layers"] for b in rows.batches]) if n else np.zeros(0, np.uint16)
    flags = np.concatenate([b["flags"] for b in rows.batches]) if n else np.zeros(0, np.uint8)
    ends = ((layers & L_TCP) != 0) & ((flags & 0x05) != 0) & flow.fin_rst
    idle = flow.idle_ns
    pane = (times + window.offset_ns) // window.pane_ns
    fid = np.empty(n, np.int64)
    open_flow: dict[int, int] = {}
    last: list[int] = []
    reasons: list[int] = []
    first_row: list[int] = []
    for i, (c, t, e) in enumerate(zip(codes.tolist(), times.tolist(), ends.tolist())):
        f = open_flow.get(c)
        if f is not None and idle is not None and t - last[f] > idle:
            reasons[f] = 1
            f = None
        if f is None:
            f = len(last)
            open_flow[c] = f
            last.append(t)
            reasons.append(0)
            first_row.append(i)
        fid[i] = f
        last[f] = max(last[f], t)
        if e:
            reasons[f] = 3
            del open_flow[c]
    for f in open_flow.values():
        i = first_row[f]
        end = (int(pane[i]) + 1) * window.pane_ns - window.offset_ns
        expiry = last[f] + idle + 1 if idle is not None else None
        event, why = (expiry, 1) if expiry is not None and expiry <= end else (end, 2)
        reasons[f] = why if event <= link_max[int(link[i])] else 4
    return fid, np.asarray(reasons, np.uint64)[fid] if n else np.zeros(0, np.uint64)


def _side_columns(qp, aq, source, batches, tables) -> Table:
    """A join side's rows as columns named `alias.column`."""
    if source.kind == "query":
        t = without_nulls(tables[source.query], source)
        return Table({f"{source.alias}.{k}": v for k, v in t.columns.items()}, t.n)
    rows = packet_rows(qp, source, batches, None)
    cols = {}
    exprs = [i.expr for i in aq.items] + [aq.where] + [s.wa for s in aq.sources]
    for e in exprs:
        for f in (e.find_all(E.Field) if e is not None else ()):
            if f.table == source.alias:
                cols[f"{source.alias}.{f.name}"] = rows.eval(f.replace(table=None))
    return Table(cols, rows.n)


def _join(qp, aq, batches, tables) -> Table:
    left, right = (_side_columns(qp, aq, s, batches, tables) for s in aq.sources)
    lkeys, rkeys = [], []
    pairs = list(aq.join_keys) + ([aq.join_temporal] if aq.join_temporal else [])
    for le, re_ in pairs:
        lkeys.append(evaluate_columns(_bind(le, aq), left.columns, left.n))
        rkeys.append(evaluate_columns(_bind(re_, aq), right.columns, right.n))
    # joint key codes over both sides
    both = [_concat([lk if isinstance(lk, tuple) else lk, rk]) if _same_kind(lk, rk)
            else _concat([_as_ip(lk), _as_ip(rk)]) for lk, rk in zip(lkeys, rkeys)]
    codes, _ = group_codes(both, left.n + right.n)
    lc = pd.DataFrame({"code": codes[:left.n], "li": np.arange(left.n)})
    rc = pd.DataFrame({"code": codes[left.n:], "ri": np.arange(right.n)})
    m = lc.merge(rc, on="code")
    li, ri = m["li"].to_numpy(np.int64), m["ri"].to_numpy(np.int64)
    ls, rs = aq.sources
    if ls.wa is not None:
        lw = np.asarray(evaluate_columns(ls.wa, left.columns, left.n)).astype(np.int64)[li]
        rw = np.asarray(evaluate_columns(rs.wa, right.columns, right.n)).astype(np.int64)[ri]
        rl = ls.window_ns // unit_ns(ls.wa.form)
        rr = rs.window_ns // unit_ns(rs.wa.form)
        keep = (lw - rr <= rw) & (rw < lw + rl)
        li, ri = li[keep], ri[keep]
    joined = {k: _take(v, li) for k, v in left.columns.items()}
    joined.update({k: _take(v, ri) for k, v in right.columns.items()})
    if aq.join_residual is not None and len(li):
        keep = np.flatnonzero(truthy(evaluate_columns(_bind(aq.join_residual, aq), joined, len(li))))
        li, ri = li[keep], ri[keep]
        joined = {k: _take(v, keep) for k, v in joined.items()}
    if aq.join.upper() == "FILTER_JOIN" and len(li):
        # a semi-join (Tigon SQL manual 6.2.10): each result-stream row with a match, once
        _, first = np.unique(li, return_index=True)
        li, ri = li[first], ri[first]
        joined = {k: _take(v, first) for k, v in joined.items()}
    out = {i.name: [evaluate_columns(_bind(i.expr, aq), joined, len(li))] for i in aq.items}
    n = len(li)
    kind = aq.join.upper()
    for side_table, matched, alias, wanted in (
            (left, li, ls.alias, kind in ("LEFT_OUTER_JOIN", "OUTER_JOIN")),
            (right, ri, rs.alias, kind in ("RIGHT_OUTER_JOIN", "OUTER_JOIN"))):
        if not wanted:
            continue
        alone = np.setdiff1d(np.arange(side_table.n), matched)
        cols = {k: _take(v, alone) for k, v in side_table.columns.items()}
        # GS-lite fills the absent side's expressions that a join equality ties to the
        # present side with the present side's value (`B.k` of a left-only row is `A.k`)
        present = 0 if alias == ls.alias else 1
        partner = {pair[1 - present]: pair[present] for pair in pairs}
        for i in aq.items:
            expr = i.expr.transform(lambda n, partner=partner: partner.get(n, n))
            tables_used = {f.table for f in expr.find_all(E.Field)}
            if tables_used <= {alias}:
                out[i.name].append(evaluate_columns(_bind(expr, aq), cols, len(alone)))
            else:
                out[i.name].append(np.full(len(alone), None, dtype=object))
        n += len(alone)
    return Table({k: _concat_nullable(v) for k, v in out.items()}, n)


def _same_kind(a, b) -> bool:
    return isinstance(a, tuple) == isinstance(b, tuple)


def _as_ip(v):
    from lowlevel.values import promote_ip

    return promote_ip(v)


def _concat_nullable(parts: list):
    if len(parts) == 1:
        return parts[0]
    if any(not isinstance(p, tuple) and p.dtype == object and len(p) and p[0] is None
           for p in parts):
        return np.concatenate([_objects(p) for p in parts])
    return _concat(parts)


def _objects(v) -> np.ndarray:
    if isinstance(v, tuple):
        return np.array([(int(h) << 64) | int(l) for h, l in zip(v[0], v[1])], dtype=object)
    return v.astype(object)


def _merge(qp, aq, batches, tables) -> Table:
    parts, keys = [], []
    for s, field in zip(aq.sources, aq.merge_fields):
        if s.kind == "query":
            t = tables[s.query]
            cols = dict(t.columns)
            n = t.n
        else:
            rows = packet_rows(qp, s, batches, None)
            cols = {i.name: rows.eval(E.Field(name=i.name, type=i.type, columns=_columns(s, i.name)))
                    for i in aq.items}
            n = rows.n
        parts.append(cols)
        keys.append(np.asarray(evaluate_columns(field.replace(table=None), cols, n)))
    order = np.argsort(np.concatenate(keys), kind="stable")
    out = {i.name: _take(_concat([p[i.name] for p in parts]), order) for i in aq.items}
    return Table(out, len(order))


def _columns(source, name: str):
    from capture.schema import protocol_fields

    return tuple(protocol_fields(source.protocol)[name].columns)


# --- output -------------------------------------------------------------------------------------

_PANDAS_DTYPE = {"uint": "uint64", "ullong": "uint64", "ipv4": "uint64", "mac": "uint64",
                 "int": "int64", "llong": "int64", "float": "float64", "bool": "bool",
                 "string": "object", "ip": "object"}


def to_frame(table: Table, qp: QueryPlan) -> pd.DataFrame:
    data = {}
    for col in qp.high.outputs:
        v = table.columns[col.name]
        if isinstance(v, tuple):
            data[col.name] = _objects(v)
        elif v.dtype == object:
            data[col.name] = v
        else:
            data[col.name] = v.astype(_PANDAS_DTYPE.get(col.type, v.dtype))
    return pd.DataFrame(data, columns=[c.name for c in qp.high.outputs])
