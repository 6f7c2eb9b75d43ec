"""OA-Join on Spark: tumbling-window and band equi-joins of two inputs.

The semantics: docs/semantics.md, "Joins: OA-Join and joint punctuation".

The join's spool holds the rows of both sides (files whose link is the side's alias, columns
prefixed `alias__`), written by the side's upstream stage (a query, or the selection stage
that unions the side's links). Per micro-batch:

1. each side's punctuation (in file order) gives its bound b_i, mapped to the side's temporal
   value (the tumbling attribute or the band's WA) with the column's TimeForm;
2. new rows of each side are evaluated in Spark (`mapInArrow`: side filter, equality keys,
   temporal value) and joined with the other side's stored rows and new rows (new x stored,
   stored x new, new x new: every pair exactly once); the residual condition and the SELECT
   list are evaluated over the joined rows;
3. the stored sets are updated (matched flags for preserved sides of outer joins; a semi
   join's left row that matched leaves its set, it is output once) and purged
   with the new bounds: a left row is kept only while a future right row can still match it
   (tumbling: its window >= win(b_R); band: l.ts >= b_R - RANGE_L), symmetrically on the right;
   an unmatched purged row of a preserved side is emitted once, the other side null;
4. the output punctuation (ns) is the earliest time a future result can carry:
   min(b_L, b_R) for a tumbling join, min(b_L, b_R - RANGE_L) / min(b_R, b_L - RANGE_R) on
   the two timestamps for a band join (the individual punctuation), mapped back to ns. Both
   are emitted: a reader whose windows are on one side's time (an aggregate grouping by a
   column of the left side's time, say; `SpoolSink.side`, set by the stage graph) gets that
   side's, every other reader the smaller of the two (`state.extra["side_punct"]`,
   `sink_punctuation`).
Band joins: `l` joins `r` iff `l.wa - RANGE_R <= r.wa < l.wa + RANGE_L` (JoinPlan's convention).

Joint punctuation (thesis 7.2, Fig 7-3/7-4): the pair (b_L, b_R) promises that no later
result has `l.wa < b_L` *and* `r.wa < b_R` (such a pair has both rows arrived, so it
was produced). It is emitted when the pair lies inside the band (tumbling: same window), as
`state.extra["joint"]` = [ns_L, ns_R] and `JoinStage.joint_punctuation`. A group of a
downstream aggregate keyed on both timestamps (windows ending at e_L on l.wa and e_R on r.wa)
may close when `group_closed(e_L, e_R, individual, joint)` holds: a box (joint) closes it as
soon as both bounds pass, without waiting for the band-wide slab of individual punctuation.
Such a reader (`highlevel.joint`, an inner join only) gets both individual values and the
joint pair with every spool file (`SpoolSink.joint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute.coalesce)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.spool import LINK
from common.units import INT64_MAX
from highlevel import rowlayout as R
from highlevel.errors import StageConfigError
from highlevel.rowlayout import form_value
from highlevel.select import RowStage
from highlevel.sinks import Sink
from queries import expressions as E
from queries.inference import type_of


def _inverse(form, v: int) -> int:
    """The first time (ns) whose temporal value is >= v."""
    k = -((-(v - form.shift)) // form.scale)
    return max(min(k * form.pane_ns - form.offset_ns, INT64_MAX), -INT64_MAX)


def joint_punctuation(b_l: int | None, b_r: int | None, band: bool, range_l: int = 0,
                      range_r: int = 0) -> tuple[int, int] | None:
    """The joint punctuation (b_l, b_r) of the two bounds (temporal values), or None when
    the pair is outside the band (band: `b_l - range_r <= b_r < b_l + range_l`; tumbling:
    `b_l == b_r`): only pairs inside the band are result timestamps the join can produce."""
    if b_l is None or b_r is None:
        return None
    inside = (b_l - range_r <= b_r < b_l + range_l) if band else b_l == b_r
    return (b_l, b_r) if inside else None


def individual_punctuation(b_l: int | None, b_r: int | None, band: bool, range_l: int = 0,
                           range_r: int = 0) -> tuple[int, int] | None:
    """Individual punctuation (on l.wa, on r.wa) of the bounds (docs/semantics.md, "Joins:
    OA-Join and joint punctuation")."""
    if b_l is None or b_r is None:
        return None
    if not band:
        return (min(b_l, b_r), min(b_l, b_r))
    return (min(b_l, b_r - range_l), min(b_r, b_l - range_r))


def group_closed(end_l: int, end_r: int, individual, joints=()) -> bool:
    """Whether a downstream group of results with `l.wa < end_l` and `r.wa < end_r` (a
    window on each timestamp) is complete: individual punctuation covers it (a slab), or a
    joint punctuation (a box) does."""
    if individual is not None and (end_l <= individual[0] or end_r <= individual[1]):
        return True
    return any(end_l <= jl and end_r <= jr for jl, jr in joints)


def _key_kind(le, re_) -> str:
    lt, rt = type_of(le), type_of(re_)
    if "ip" in (lt, rt):
        return "ip"
    if "float" in (lt, rt):
        return "float"
    if lt in ("string", "str") or rt in ("string", "str"):
        return "string"
    return "llong"


@dataclass(frozen=True)
class JoinSpec:
    """A join query: `join` the planner's JoinPlan, `columns` each alias's (name, GSQL type)
    raw columns, `outputs` (name, expression, GSQL type)."""

    query: str
    join: Any                       # a queries.plan.JoinPlan
    columns: dict = field(hash=False)
    outputs: tuple[tuple[str, object, str], ...]

    @property
    def links(self) -> tuple[str, ...]:
        """The two sides' aliases: the `__link` names of the join's spool files."""
        return (self.join.left.alias, self.join.right.alias)

    def spool_schema(self) -> T.StructType:
        fields = R.meta_fields()
        for s in (self.join.left, self.join.right):
            fields += R.raw_fields(self.columns[s.alias], prefix=f"{s.alias}__")
        return T.StructType(fields)

    def output_columns(self) -> list[tuple[str, str]]:
        return [(n, t) for n, _, t in self.outputs]


class JoinStage(RowStage):
    """The stage of a `JoinSpec` (module docstring)."""

    def __init__(self, spec: JoinSpec, spool, checkpoint, sinks, **options):
        query, join = spec.query, spec.join
        self.join = join
        self.sides = (join.left, join.right)
        self.columns = spec.columns
        self.out_exprs = list(spec.outputs)
        if join.temporal is not None:
            self.band = False
            self.forms = tuple(e.form for e in join.temporal)
            self.vexprs = tuple(join.temporal)
        elif join.left.range is not None and join.right.range is not None:
            self.band = True
            self.forms = (join.left.wa.form, join.right.wa.form)
            self.vexprs = (join.left.wa, join.right.wa)
        else:
            raise StageConfigError(f"query {query!r}: a join needs equal temporal attributes "
                                   f"or a band (RANGE on both sides)")
        if any(f is None for f in self.forms):
            raise StageConfigError(f"query {query!r}: the join's temporal attributes must be "
                                   f"increasing (a TimeForm on both sides)")
        self.kinds = [_key_kind(le, re_) for le, re_ in join.keys]
        super().__init__(spec, spool, checkpoint, sinks, **options)
        self.side_schema = [self._side_schema(i) for i in (0, 1)]
        self.out_schema = T.StructType([T.StructField("window", T.LongType())]
                                       + [T.StructField(f"__{t}{c}", T.LongType())
                                          for t in "LR" for c in ("rb", "ri")]
                                       + R.raw_fields(self.outputs))
        # the rows written: the residual condition and the outputs of the joined rows
        self.zeros = R.ZeroDivisorCount(self.spark, [join.residual]
                                        + [e for _, e, _ in self.out_exprs])

    # --- schemas and row functions -----------------------------------------------------------
    def _side_schema(self, i: int) -> T.StructType:
        t = "LR"[i]
        s = self.sides[i]
        fields = [T.StructField(f"__{t}w", T.LongType()), T.StructField(f"__{t}v", T.LongType())]
        for j, kind in enumerate(self.kinds):
            fields += R.raw_fields([(f"__{t}k{j}", kind)])
        fields += [T.StructField(f"__{t}rb", T.LongType()), T.StructField(f"__{t}ri", T.LongType()),
                   T.StructField(f"__{t}m", T.BooleanType())]
        return T.StructType(fields + R.raw_fields(self.columns[s.alias], prefix=f"{s.alias}__"))

    def _side_function(self, i: int, batch_id: int):
        t, s = "LR"[i], self.sides[i]
        cols, prefix, schema = self.columns[s.alias], f"{s.alias}__", self.side_schema[i]
        keys = [pair[i] for pair in self.join.keys]
        kinds, vexpr, pred = self.kinds, self.vexprs[i], s.predicate

        def fn(batches):
            for b in batches:
                n = b.num_rows
                values = R.to_values(b, cols, prefix, alias=s.alias)
                keep = R.keep_mask(pred, values, n)
                if not keep.all():
                    idx = np.flatnonzero(keep)
                    values, b, n = R.take_values(values, idx), b.take(pa.array(idx)), len(idx)
                out = {c: b.column(c) for c in b.schema.names if c.startswith(prefix)}
                out[f"__{t}w"] = b.column("window")
                v = np.broadcast_to(R.evaluate(vexpr, values, n), (n,))
                out[f"__{t}v"] = pa.array(np.asarray(v).astype(np.int64))
                for j, (expr, kind) in enumerate(zip(keys, kinds)):
                    for c, a in R.from_value(R.evaluate(expr, values, n), kind, n,
                                             f"__{t}k{j}"):
                        out[c] = a
                out[f"__{t}rb"] = pa.array(np.full(n, batch_id, np.int64))
                out[f"__{t}m"] = pa.array(np.zeros(n, bool))
                yield R.batch_table(b, schema, out)

        return fn

    def _output_function(self, mode: str):
        """Outputs over joined rows (mode "LR"), or over one side's unmatched rows ("L"/"R")."""
        sides = [s for t, s in zip("LR", self.sides) if t in mode]
        columns, schema = self.columns, self.out_schema
        exprs = [(name, self._from_present_side(cast(E.Expr, expr), mode), gsql)
                 for name, expr, gsql in self.out_exprs]
        residual = self.join.residual if mode == "LR" else None
        counting, acc = self.zeros.on, self.zeros.acc

        def fn(batches):
            for b in batches:
                n = b.num_rows
                values = {}
                for s in sides:
                    values.update(R.to_values(b, columns[s.alias], f"{s.alias}__", s.alias))
                zeros = R.ZeroDivisorCount.rows(counting, n)
                keep = R.keep_mask(residual, values, n, zeros)
                if not keep.all():
                    idx = np.flatnonzero(keep)
                    values, b, n = R.take_values(values, idx), b.take(pa.array(idx)), len(idx)
                    zeros = None if zeros is None else zeros[idx]
                names = set(b.schema.names)
                out = {c: b.column(c) for c in
                       ("__Lrb", "__Lri", "__Rrb", "__Rri") if c in names}
                w = [b.column(f"__{t}w") for t in "LR" if f"__{t}w" in names]
                out["window"] = w[0] if len(w) == 1 else pa.compute.coalesce(*w)
                aliases = {s.alias for s in sides}
                for name, expr, gsql in exprs:
                    used = {f.table for f in expr.find_all(E.Field)}
                    if used <= aliases:
                        for c, a in R.from_value(R.evaluate(expr, values, n, zeros), gsql, n,
                                                 name):
                            out[c] = a
                R.ZeroDivisorCount.add(acc, zeros)
                yield R.batch_table(b, schema, out)

        return fn

    def _from_present_side(self, expr: E.Expr, mode: str) -> E.Expr:
        """`expr` for an unmatched row of one side (mode "L" or "R"): as GS-lite fills an
        outer join's output, an expression of the absent side that one of the join's
        equalities (a key or the temporal pair) equates with an expression of the present
        side takes that expression's value: `B.k` of a left-only row of `A.k = B.k` is
        `A.k`. Whatever else reads the absent side stays null."""
        if mode == "LR":
            return expr
        pairs = list(self.join.keys)
        if not self.band and self.join.temporal is not None:
            pairs.append(self.join.temporal)
        present = 0 if mode == "L" else 1
        partner = {pair[1 - present]: pair[present] for pair in pairs}
        return cast(E.Expr, expr.transform(lambda n: partner.get(n, n)))

    # --- one micro-batch ---------------------------------------------------------------------
    def _condition(self, lf, rf):
        cond = F.lit(True)
        for j, kind in enumerate(self.kinds):
            for c in R.raw_names(f"k{j}", kind):
                cond = cond & (lf[f"__L{c}"] == rf[f"__R{c}"])
        lv, rv = lf["__Lv"], rf["__Rv"]
        if self.band:
            cond = cond & (lv - F.lit(self.sides[1].range) <= rv) & \
                (rv < lv + F.lit(self.sides[0].range))
        else:
            cond = cond & (lv == rv)
        return cond

    def _step(self, state, data, rows, bounds, batch_id):
        spark = self.spark
        new, old = [None, None], [None, None]
        for i, s in enumerate(self.sides):
            if data is not None:
                side = data.where(F.col(LINK) == F.lit(s.alias))
                new[i] = (side.mapInArrow(self._side_function(i, batch_id), self.side_schema[i])
                          .withColumn(f"__{'LR'[i]}ri", F.monotonically_increasing_id())
                          .persist())
            d = state.extra.get(f"{'lr'[i]}_dir")
            if d:
                old[i] = spark.read.schema(self.side_schema[i]).parquet(str(self.store.path(d)))
        pairs = []
        if new[0] is not None and (old[1] is not None or new[1] is not None):
            other = new[1] if old[1] is None else (old[1] if new[1] is None
                                                   else old[1].unionByName(new[1]))
            pairs.append((new[0], other))
        if old[0] is not None and new[1] is not None:
            pairs.append((old[0], new[1]))
        results = None
        for lf, rf in pairs:
            j = lf.join(rf, self._condition(lf, rf), "inner")
            if self.join.type == "semi":
                # a left row passes once, however many right rows it matches (its outputs
                # read the left side only, so any one of its pairs gives them)
                j = j.dropDuplicates(["__Lrb", "__Lri"])
            res = j.mapInArrow(self._output_function("LR"), self.out_schema)
            results = res if results is None else results.unionByName(res)
        tables = []
        if results is not None:
            results = results.persist()
            tables.append(results.toArrow())
        b = [None if bounds.get(s.alias) is None else form_value(f, bounds[s.alias])
             for s, f in zip(self.sides, self.forms)]
        preserved = {"inner": (), "left": (0,), "right": (1,), "outer": (0, 1),
                     "semi": ()}[self.join.type]
        # semi: a left row that has passed leaves the stored set (it is written once)
        marked = preserved + ((0,) if self.join.type == "semi" else ())
        for i in (0, 1):
            t = "LR"[i]
            parts = [p for p in (old[i], new[i]) if p is not None]
            if not parts:
                continue
            allrows = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
            if i in marked and results is not None:
                hits = (results.select(f"__{t}rb", f"__{t}ri").where(F.col(f"__{t}rb").isNotNull())
                        .distinct().withColumn("__hit", F.lit(True)))
                allrows = (allrows.join(hits, [f"__{t}rb", f"__{t}ri"], "left")
                           .withColumn(f"__{t}m", F.col(f"__{t}m") | F.coalesce("__hit", F.lit(False)))
                           .drop("__hit"))
            other = b[1 - i]
            if other is None:
                keep = F.lit(True)
            elif self.band:
                keep = F.col(f"__{t}v") >= F.lit(other - self.sides[i].range)
            else:
                keep = F.col(f"__{t}v") >= F.lit(other)
            if i in marked and i not in preserved:
                keep = keep & ~F.col(f"__{t}m")
            allrows = allrows.persist()
            if i in preserved:
                lonely = allrows.where(~keep & ~F.col(f"__{t}m"))
                tables.append(lonely.mapInArrow(self._output_function(t), self.out_schema)
                              .toArrow())
            d = f"buf-{'lr'[i]}-{batch_id:010d}"
            allrows.where(keep).write.mode("overwrite").parquet(str(self.store.path(d)))
            allrows.unpersist()
            state.extra[f"{'lr'[i]}_dir"] = d
        for f in new:
            if f is not None:
                f.unpersist()
        if results is not None:
            results.unpersist()
        state.extra["bounds"] = b
        self.zero_divisor_rows += self.zeros.take()
        tables = [x for x in tables if x.num_rows]
        if not tables:
            return None
        raw = pa.concat_tables(tables)
        return raw.select(["window"] + [c for c in raw.column_names
                                        if c != "window" and not c.startswith("__")])

    @property
    def joint_punctuation(self) -> tuple[int, int] | None:
        """The last joint punctuation (ns on l.wa, ns on r.wa), or None."""
        j = self.state.extra.get("joint")
        return None if j is None else (int(j[0]), int(j[1]))

    def _joint(self, state, p) -> None:
        """Record the joint punctuation of the side bounds p (ns) when inside the band and
        ahead of the last one on both timestamps (joint punctuation is monotone too)."""
        b = [form_value(f, x) for f, x in zip(self.forms, p)]
        rl, rr = (self.sides[0].range, self.sides[1].range) if self.band else (0, 0)
        j = joint_punctuation(b[0], b[1], self.band, rl, rr)
        if j is None:
            return
        ns = [_inverse(f, v) for f, v in zip(self.forms, j)]
        last = state.extra.get("joint")
        if last is None or (ns[0] >= last[0] and ns[1] >= last[1] and ns != list(last)):
            state.extra["joint"] = ns

    def _output_punctuation(self, state, meld_out, bounds):
        p = [bounds.get(s.alias) for s in self.sides]
        if any(x is None for x in p):
            return None
        self._joint(state, p)
        sides = self.side_bounds(p)
        last = state.extra.get("side_punct")
        if last is not None:      # monotone on each timestamp
            sides = [max(a, b) for a, b in zip(sides, last)]
        state.extra["side_punct"] = sides
        return min(sides)

    def side_bounds(self, p) -> list[int]:
        """The individual punctuation of the side bounds p (ns), one per timestamp, as ns:
        no later result has a left time (l.wa) before the first, or a right time before the
        second (tumbling: both min(b_L, b_R); band: docs/semantics.md, "Joins: OA-Join and
        joint punctuation")."""
        if all(x == INT64_MAX for x in p):
            return [INT64_MAX, INT64_MAX]
        b = [form_value(f, x) for f, x in zip(self.forms, p)]
        rl, rr = (self.sides[0].range, self.sides[1].range) if self.band else (0, 0)
        ind = individual_punctuation(b[0], b[1], self.band, rl, rr)
        assert ind is not None          # both bounds are known
        return [_inverse(f, v) for f, v in zip(self.forms, ind)]

    def sink_punctuation(self, sink: Sink, state):
        """A reader whose windows are on one side's time (`SpoolSink.side`) gets that
        side's individual punctuation; any other sink the stage's (the smaller of the two).
        A reader grouping by both times (`SpoolSink.joint`, highlevel.joint) gets (its
        first time's individual punctuation, the other's, the joint pair in the same order),
        or None before the join has punctuation on both sides."""
        side = sink.side
        sides = state.extra.get("side_punct")
        if sink.joint:
            if sides is None:
                return None
            j = state.extra.get("joint")
            assert side is not None         # a joint reader reads one side's time first
            other = 1 - side
            return (int(sides[side]), int(sides[other]),
                    None if j is None else int(j[side]), None if j is None else int(j[other]))
        if side is None or sides is None:
            return state.punctuation
        return int(sides[side])
