"""The reference evaluator of sampling queries (SUPERGROUP, CLEANING_WHEN / CLEANING_BY, `agg$`).

A brute-force, row-by-row simulation in plain Python of oopscope's intended semantics of GS-lite's
sampling operator, the oracle of the compiled one. The stateful functions are the plain-Python
`tests.oracles.stateful.SmartSamplingState`.

- Rows: the query's rows after WHERE's conjuncts without stateful calls, from every link, in
  canonical order: packet timestamp, link position (the order of the low-level plans), the values
  of the plan's projected columns in order (unsigned and ip values as unsigned), then input
  position; a query's rows carry no packet time: the projected values alone. Windows are the values of the temporal group item, processed in increasing order.
- Per window and supergroup (the SUPERGROUP items' values; none: one per window): a state, CD
  (its live groups), its super-aggregates and its live groups in creation order. A supergroup's
  first row of the window makes its state: `dirty_init(old state, old final CD)` if it had a
  state in the previous window that had rows, else `clean_init()`; super-aggregates start empty.
- Each row: with cd = CD, every stateful WHERE conjunct in order (no short-circuit); the row
  passes iff all hold. A passing row updates the super-aggregates (COUNT$ +1, SUM$, MIN$, MAX$,
  XOR_AGGR$), then its group (all group items, the temporal one too): a group not live is created
  (from this row alone, at the end of the creation order, CD + 1), else updated. Then
  CLEANING_WHEN with cd = CD (the row's group items, the supergroup's super-aggregates); if it
  holds, a cleaning pass over the supergroup's live groups in creation order, cd fixed at CD at
  the pass's start: every CLEANING_BY conjunct is evaluated; a group for which one is false is
  removed (CD - 1; COUNT$, SUM$ lose its rows, XOR_AGGR$ xors them out, MIN$ and MAX$ keep them).
  A removed group's later row makes a new group.
- Window end, per supergroup: `final_init(CD)`; over the live groups in creation order, cd fixed
  at CD before the pass, HAVING's conjuncts in order up to the first false, which removes the
  group as above. Each surviving group gives a row: SELECT with the final state and cd = the
  final CD. (state, final CD) carry to the next window by supergroup key. Output: windows in
  order, supergroups in order of their first row, groups in creation order.
- COUNT_DISTINCT$ reads the count the stateful functions get: in a cleaning or HAVING pass
  the live-group count at the pass's start, elsewhere the current one.
  Aggregates: COUNT, SUM, MIN, MAX, AVG (SUM / COUNT, a float), AND_AGGR / OR_AGGR / XOR_AGGR,
  typed by `queries.inference.type_of` (integers wrap at 64 bits).
- An expression is evaluated for one row: its group items, aggregates and super-aggregates as
  typed one-row columns, its stateful calls bottom-up (arguments first, then the call on the
  supergroup's state with the given cd), each replaced by a literal of its result, then the
  rest by the project's operators (`lowlevel.evaluate.evaluate_columns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lowlevel.values import truthy
from queries import expressions as E
from queries.inference import conjuncts, type_of
from tests.oracles.reference import Table, _bind, evaluate_columns, input_rows
from tests.oracles.stateful import FUNCTIONS, SmartSamplingState

U64, I64 = np.uint64, np.int64
_TWO64 = 1 << 64
#: numpy dtype of a GSQL type's one-row column (other integer types: uint64; ip: two uint64)
_DTYPE = {"float": np.float64, "bool": np.bool_, "int": I64, "llong": I64, "string": object}
#: the stateful functions of a float result (the others' are integers: 1 / 0 for decisions)
FLOAT_RESULTS = frozenset({"ssthreshold", "gamma"})
_TIMESTAMP = E.Field(name="timestamp", type="llong", columns=("timestamp",))


def _wrap(value, gsql_type: str):
    """An integer value as its type's 64-bit column holds it."""
    if isinstance(value, (bool, float)) or not isinstance(value, int):
        return value
    value %= _TWO64
    if _DTYPE.get(gsql_type) is I64 and value >= 1 << 63:
        value -= _TWO64
    return value


def _one(value, gsql_type: str):
    """A one-row column holding `value` of a GSQL type."""
    if gsql_type == "ip":
        return (np.array([value[0]], U64), np.array([value[1]], U64))
    return np.array([_wrap(value, gsql_type)], dtype=_DTYPE.get(gsql_type, U64))


def _py(col, i: int):
    """Row i of an evaluated column as a plain Python value (ip: (hi, lo))."""
    if isinstance(col, tuple):
        return (int(col[0][i]), int(col[1][i]))
    v = col[i]
    return v.item() if isinstance(v, np.generic) else v


def _row_slice(col, i: int):
    """Row i of an evaluated column as a one-row column of the same dtype."""
    if isinstance(col, tuple):
        return (col[0][i:i + 1], col[1][i:i + 1])
    return col[i:i + 1]


def _scalar(v):
    """A one-row evaluated value as a plain Python value."""
    return _py(v, 0)


def _sort_values(col, n: int) -> list:
    """A column's values as sort keys: unsigned as unsigned, ip as (hi, lo), NaN last."""
    if isinstance(col, tuple):
        return [(int(h), int(lo)) for h, lo in zip(col[0], col[1])]
    col = np.asarray(col)
    if col.dtype == np.float64:
        return [(True, 0.0) if v != v else (False, v) for v in col.tolist()]
    if col.dtype == np.bool_:
        return [int(v) for v in col.tolist()]
    return list(col.tolist()) if n else []


# --- expressions --------------------------------------------------------------------------------

def evaluate_one(expr: E.Expr, columns: dict, state, cd: int):
    """`expr` for one row over one-row `columns`: stateful calls bottom-up on `state` with `cd`
    (arguments first), each replaced by a literal of its result, then the project's
    operators. A one-row evaluated value."""

    def call(node):
        if isinstance(node, E.Func) and node.name in FUNCTIONS:
            args = [_scalar(evaluate_columns(a, columns, 1)) for a in node.arguments]
            result = state.call(node.name, cd, args)
            if node.name in FLOAT_RESULTS:
                return E.Literal(value=float(result), kind="float")
            return E.Literal(value=int(result), kind="int")
        return node

    return evaluate_columns(expr.transform(call), columns, 1)


def _holds(expr: E.Expr, columns: dict, state, cd: int) -> bool:
    return bool(truthy(evaluate_one(expr, columns, state, cd))[0])


# --- aggregates ---------------------------------------------------------------------------------

class _Aggregate:
    """One aggregate of a group: its running value (AVG: sum and count)."""

    def __init__(self, name: str, value):
        self.name = name
        self.count = 1
        self.value = int(value) if name in ("SUM", "AVG") and isinstance(value, bool) else value
        if name == "COUNT":
            self.value = 1

    def add(self, value) -> None:
        self.count += 1
        name = self.name
        if name == "COUNT":
            self.value += 1
        elif name in ("SUM", "AVG"):
            self.value += int(value) if isinstance(value, bool) else value
        elif name == "MIN":
            self.value = min(self.value, value)
        elif name == "MAX":
            self.value = max(self.value, value)
        elif name == "AND_AGGR":
            self.value &= value
        elif name == "OR_AGGR":
            self.value |= value
        elif name == "XOR_AGGR":
            self.value ^= value
        else:
            raise ValueError(f"aggregate {name} in a sampling query")

    def result(self, sum_type: str):
        """The value; AVG as float(SUM as its type) / COUNT."""
        if self.name == "AVG":
            return float(_wrap(self.value, sum_type)) / self.count
        return self.value


@dataclass
class _Group:
    keys: dict                    # group item name -> one-row column
    aggregates: list              # _Aggregate per query aggregate
    count: int = 1                # its rows (COUNT$ loses them when the group is removed)
    sums: dict = field(default_factory=dict)   # super-aggregate index -> sum / xor of its arg


@dataclass
class _Supergroup:
    state: object
    cd: int = 0
    supers: list = field(default_factory=list)     # super-aggregate values (None: no value yet)
    groups: dict = field(default_factory=dict)     # group key -> _Group, in creation order


# --- the evaluator ------------------------------------------------------------------------------

def _canonical_order(qp, aq, rows) -> list[int]:
    """Input positions in order of (timestamp, link position, projections' values, position)."""
    n = rows.n
    if rows.batches is not None:
        times = np.asarray(rows.eval(_TIMESTAMP)).astype(np.int64).tolist() if n else []
        link = np.repeat(np.arange(len(rows.batches)), [b.n for b in rows.batches]).tolist()
    else:
        times, link = [0] * n, [0] * n
    projections = qp.high.sampling.columns
    values = [_sort_values(rows.eval(_bind(k.expr, aq)), n) for k in projections]
    return sorted(range(n), key=lambda i: (times[i], link[i], *(v[i] for v in values)))


def evaluate_sampling(qp, aq, batches, tables) -> Table:
    """The rows of a sampling query (`aq.sampling`), one column per SELECT item."""
    sp = aq.sampling
    if aq.temporal is None or aq.window is not None:
        raise ValueError("the sampling reference needs a temporal group item and no window spec")
    rows = input_rows(qp, aq, aq.sources[0], batches, tables, _bind(aq.where, aq))
    group_cols = {g.name: rows.eval(_bind(g.expr, aq)) for g in aq.group}

    where = [_bind(c, aq) for c in sp.where_stateful]
    having = [_bind(c, aq) for c in conjuncts(aq.having)]
    cleaning_when = _bind(sp.cleaning_when, aq)
    cleaning_by = [_bind(c, aq) for c in conjuncts(sp.cleaning_by)]
    items = [_bind(i.expr, aq) for i in aq.items]
    group_level = items + having + cleaning_by + ([cleaning_when] if cleaning_when is not None
                                                  else [])

    aggs: list[E.Aggregate] = []
    supers: list[E.SuperAggregate] = []
    for e in group_level:
        for a in e.find_all(E.Aggregate):
            if a not in aggs:
                aggs.append(a)
        for s in e.find_all(E.SuperAggregate):
            if s not in supers:
                supers.append(s)
    agg_types = [type_of(a) for a in aggs]
    sum_types = [type_of(E.Aggregate(name="SUM", arg=a.arg)) if a.name == "AVG" else ""
                 for a in aggs]
    super_types = [type_of(s) for s in supers]
    super_args = [next((x for x in s.arguments if not isinstance(x, E.Star)), None)
                  for s in supers]
    args: dict = {}
    for a in [a.arg for a in aggs] + super_args:
        if a is not None and not isinstance(a, E.Star) and a not in args:
            args[a] = rows.eval(a)
    agg_args = [None if isinstance(a.arg, E.Star) else args[a.arg] for a in aggs]

    # group-level expressions read aggregates and super-aggregates as one-row columns
    names = {a: f"\0a{k}" for k, a in enumerate(aggs)}
    names.update({s: f"\0s{k}" for k, s in enumerate(supers)})

    def columns_of(node):
        if isinstance(node, (E.Aggregate, E.SuperAggregate)) and node in names:
            return E.Field(name=names[node], type=type_of(node))
        return node

    items, having, cleaning_by = ([e.transform(columns_of) for e in es]
                                  for es in (items, having, cleaning_by))
    if cleaning_when is not None:
        cleaning_when = cleaning_when.transform(columns_of)

    # the columns WHERE's stateful conjuncts read, by the names evaluate_columns looks up
    row_fields = {}
    for c in where:
        for f in c.find_all(E.Field):
            row_fields.setdefault(f"{f.table}.{f.name}" if f.table else f.name, f)
    row_cols = {k: rows.eval(f) for k, f in row_fields.items()}

    temporal = group_cols[aq.temporal.name]
    order = sorted(_canonical_order(qp, aq, rows), key=lambda i: _py(temporal, i))
    supergroup_items = list(sp.supergroup)

    def group_columns(sg: _Supergroup, group: _Group, cd: int | None = None) -> dict:
        """A group's items, aggregates and its supergroup's super-aggregates, one row each;
        COUNT_DISTINCT$ is `cd`, the count a pass's stateful calls get (default: live)."""
        cols = dict(group.keys)
        for k, (s, t) in enumerate(zip(supers, super_types)):
            if s.name == "COUNT_DISTINCT":
                cols[f"\0s{k}"] = _one(sg.cd if cd is None else cd, t)
            elif sg.supers[k] is None:
                raise ValueError(f"{s.name}$ read before any row of its supergroup passed")
            else:
                cols[f"\0s{k}"] = _one(sg.supers[k], t)
        for k, (agg, t) in enumerate(zip(group.aggregates, agg_types)):
            cols[f"\0a{k}"] = _one(agg.result(sum_types[k]), t)
        return cols

    def remove(sg: _Supergroup, key) -> None:
        group = sg.groups.pop(key)
        sg.cd -= 1
        for k, s in enumerate(supers):
            if s.name == "COUNT":
                sg.supers[k] -= group.count
            elif s.name == "SUM":
                sg.supers[k] -= group.sums[k]
            elif s.name == "XOR_AGGR":
                sg.supers[k] ^= group.sums[k]

    out: dict[str, list] = {i.name: [] for i in aq.items}
    carried: dict = {}          # supergroup key -> (state, final CD) of the last window
    current: dict = {}          # supergroup key -> _Supergroup of this window

    def close_window() -> dict:
        finals = {}
        for skey, sg in current.items():
            sg.state.final_init(sg.cd)
            cd0 = sg.cd
            for key, group in list(sg.groups.items()):
                cols = group_columns(sg, group, cd0)
                if not all(_holds(c, cols, sg.state, cd0) for c in having):
                    remove(sg, key)
            for group in sg.groups.values():
                cols = group_columns(sg, group)
                for item, expr in zip(aq.items, items):
                    out[item.name].append(evaluate_one(expr, cols, sg.state, sg.cd))
            finals[skey] = (sg.state, sg.cd)
        return finals

    window = None
    for i in order:
        w = _py(temporal, i)
        if window is not None and w != window:
            carried = close_window()
            current = {}
        window = w
        skey = tuple(_py(group_cols[g], i) for g in supergroup_items)
        sg = current.get(skey)
        if sg is None:
            state = SmartSamplingState()
            if skey in carried:
                old, old_cd = carried[skey]
                state.dirty_init(old, old_cd)
            else:
                state.clean_init()
            sg = current[skey] = _Supergroup(state, 0, [0 if s.name in ("COUNT", "SUM",
                                                                          "XOR_AGGR") else None
                                                        for s in supers])
        row = {k: _row_slice(v, i) for k, v in row_cols.items()}
        passed = [_holds(c, row, sg.state, sg.cd) for c in where]
        if not all(passed):
            continue
        for k, (s, a) in enumerate(zip(supers, super_args)):
            v = None if a is None else _py(args[a], i)
            if s.name == "COUNT":
                sg.supers[k] += 1
            elif s.name == "SUM":
                sg.supers[k] += int(v) if isinstance(v, bool) else v
            elif s.name == "XOR_AGGR":
                sg.supers[k] ^= v
            elif s.name == "MIN":
                sg.supers[k] = v if sg.supers[k] is None else min(sg.supers[k], v)
            elif s.name == "MAX":
                sg.supers[k] = v if sg.supers[k] is None else max(sg.supers[k], v)
            elif s.name != "COUNT_DISTINCT":
                raise ValueError(f"super-aggregate {s.name}$ in a sampling query")
        gkey = tuple(_py(group_cols[g.name], i) for g in aq.group)
        values = [None if a is None else _py(a, i) for a in agg_args]
        group = sg.groups.get(gkey)
        if group is None:
            keys = {g.name: _row_slice(group_cols[g.name], i) for g in aq.group}
            group = _Group(keys, [_Aggregate(a.name, v) for a, v in zip(aggs, values)])
            sg.groups[gkey] = group
            sg.cd += 1
        else:
            group.count += 1
            for agg, v in zip(group.aggregates, values):
                agg.add(v)
        for k, (s, a) in enumerate(zip(supers, super_args)):
            if s.name in ("SUM", "XOR_AGGR"):
                v = _py(args[a], i)
                v = int(v) if isinstance(v, bool) else v
                if k not in group.sums:
                    group.sums[k] = v
                elif s.name == "SUM":
                    group.sums[k] += v
                else:
                    group.sums[k] ^= v
        if cleaning_when is None:
            continue
        if _holds(cleaning_when, group_columns(sg, group), sg.state, sg.cd):
            cd0 = sg.cd
            for key, g in list(sg.groups.items()):
                cols = group_columns(sg, g, cd0)
                kept = [_holds(c, cols, sg.state, cd0) for c in cleaning_by]
                if not all(kept):
                    remove(sg, key)
    if window is not None:
        close_window()
    n = len(next(iter(out.values()), []))
    return Table({i.name: _column(out[i.name], i.type) for i in aq.items}, n)


def _column(values: list, gsql_type: str):
    """One-row evaluated values as one column of the item's type."""
    if gsql_type == "ip":
        return (np.array([int(v[0][0]) for v in values], U64),
                np.array([int(v[1][0]) for v in values], U64))
    return np.array([_wrap(_scalar(v), gsql_type) for v in values],
                    dtype=_DTYPE.get(gsql_type, U64))


def evaluate_sampling_selection(qp, aq, batches, tables) -> Table:
    """A selection whose WHERE calls stateful functions (`WHERE nssample(len, 100) = TRUE`):
    every row in the canonical order through the stateful conjuncts with one state for the
    whole stream (clean_init once, the group count 0); the admitted rows' SELECT list."""
    rows = input_rows(qp, aq, aq.sources[0], batches, tables, _bind(aq.where, aq))
    where = [_bind(c, aq) for c in aq.sampling.where_stateful]
    fields = {}
    for c in where:
        for f in c.find_all(E.Field):
            fields.setdefault(f"{f.table}.{f.name}" if f.table else f.name, f)
    cols = {k: rows.eval(f) for k, f in fields.items()}
    state = SmartSamplingState()
    state.clean_init()
    admitted = []
    for i in _canonical_order(qp, aq, rows):
        row = {k: _row_slice(v, i) for k, v in cols.items()}
        if all([_holds(c, row, state, 0) for c in where]):
            admitted.append(i)
    idx = np.asarray(admitted, np.int64)
    out = {}
    for item in aq.items:
        v = rows.eval(_bind(item.expr, aq))
        out[item.name] = (v[0][idx], v[1][idx]) if isinstance(v, tuple) else \
            np.broadcast_to(np.asarray(v), (rows.n,))[idx]
    return Table(out, len(idx))
