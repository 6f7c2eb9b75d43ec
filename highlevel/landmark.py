"""Landmark windows `[RANGE ALL, SLIDE s]` and `[RANGE ALL]`: one running state per group.

The low level aggregates tumbling panes of one slide s (`[RANGE ALL]`: of one unit of the
window attribute). Window w holds every pane <= w, from the origin, and ends at (w+1)*s.
Keeping every pane would let the state grow with the stream; instead the stage keeps, per
group, one *cumulative* row (the combination of every pane <= c, stored with window id c)
plus the panes after c that are still open. State is proportional to groups (plus open panes),
not to the panes seen.

When to output window w (docs/semantics.md, "Windows"; the reference evaluator's rule): a group has a row
at every slide end after its first packet, up to the window holding the *last* packet of the
query's input. Window w is therefore output once the combined punctuation P >= end(w) and some
row of a pane >= w has arrived (`max_pane`, kept in the state); a window whose end P passed
during a lull waits until the next row (or the end of input) shows the stream reached it.
This makes the rows independent of punctuation frequency: punctuation past the last packet
never invents windows. `[RANGE ALL]` outputs only its one window, at the end of input; before
that, complete panes are still folded into the cumulative rows so the state stays small.

Per micro-batch: combine new partial rows with the state by (window, keys); windows c+1..t
(t = min(max_pane, last window ending by P)) come from a running aggregate over the rows with
window <= t ordered by window (a Spark window function per group), each row repeated for the
windows until the group's next row; the last running value of each group is its new cumulative
row (window id t).
"""

from __future__ import annotations

import logging
from typing import cast

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from common.spool import LINK, PUNCT, SEQ, register_column
from common.units import INT64_MAX
from highlevel.aggregate import AggregateStage
from highlevel.batchfiles import SpoolFileMarker
from highlevel.combine import ip_order_struct, ip_order_words
from highlevel.errors import StageConfigError
from highlevel.state import StageState
from highlevel.udfcolumns import udaf_fold_column
from queries.plan import udaf_words

log = logging.getLogger(__name__)


def _sign() -> Column:
    return F.lit(-(1 << 63))


def running_states(states, registers: int, spec) -> list[Column]:
    """Each state column combined over every row of its group up to this one (by window):
    the super-aggregates of `highlevel.combine` as Spark window functions."""
    out = []
    for s in states:
        c = F.col(s.name)
        if s.kind == "udaf":
            # the running fold of the words so far, as one array (`unfold_udafs` splits it)
            words = udaf_words(s.name, s.udaf.size)
            collected = F.flatten(F.collect_list(F.array(*[F.col(w) for w in words])).over(spec))
            out.append(udaf_fold_column(s.udaf, collected).alias(f"__{s.name}"))
        elif s.dtype == "ip":
            fn = F.min if s.kind == "min" else F.max
            out += ip_order_words(fn(ip_order_struct(s.name)).over(spec), s.name)
        elif s.kind in ("count", "sum"):
            out.append(F.sum(c).over(spec).alias(s.name))
        elif s.kind in ("min", "max"):
            fn = F.min if s.kind == "min" else F.max
            if s.dtype == "uint64":
                out.append(fn(c.bitwiseXOR(_sign())).over(spec).bitwiseXOR(_sign()).alias(s.name))
            else:
                out.append(fn(c).over(spec).alias(s.name))
        elif s.kind in ("and", "or", "xor"):
            fn = {"and": F.bit_and, "or": F.bit_or, "xor": F.bit_xor}[s.kind]
            out.append(fn(c).over(spec).alias(s.name))
        elif s.kind in ("first", "last"):
            fn = F.min if s.kind == "first" else F.max
            best = fn(F.struct(F.col(f"{s.name}__t").alias("t"), c.alias("v"))).over(spec)
            out += [best.getField("v").alias(s.name), best.getField("t").alias(f"{s.name}__t")]
        elif s.kind == "distinct":
            out += [F.max(F.col(register_column(s.name, i))).over(spec)
                    .alias(register_column(s.name, i)) for i in range(registers)]
        else:
            raise StageConfigError(f"state `{s.name}`: unknown sub-aggregate kind {s.kind!r}")
    return out


def unfold_udafs(states, columns: list[str]) -> list[Column]:
    """`columns` (the state columns) after `running_states`: each UDAF's running array back
    to its words, the other columns as they are."""
    word = {w: F.col(f"__{s.name}")[j].alias(w) for s in states if s.kind == "udaf"
            for j, w in enumerate(udaf_words(s.name, s.udaf.size))}
    return [word.get(c, F.col(c)) for c in columns]


class LandmarkStage(AggregateStage):
    """The Spark stage of a landmark-window aggregation (see the module docstring)."""

    may_close_on_driver = False

    def __init__(self, spec, spool, checkpoint, sinks, **options):
        super().__init__(spec, spool, checkpoint, sinks, **options)
        mode = spec.window.landmark
        if mode not in ("slide", "end"):
            raise StageConfigError(f"query {spec.query!r}: not a landmark window ({mode!r})")
        self.only_at_end = mode == "end"
        keys = spec.key_columns()
        order = Window.partitionBy(*keys).orderBy("window") if keys else \
            Window.orderBy("window")
        self._running = running_states(spec.states, spec.distinct_registers,
                                       order.rowsBetween(Window.unboundedPreceding,
                                                         Window.currentRow))
        self._next = F.lead("window").over(order)
        self._release: list[DataFrame] = []      # frames persisted for the batch

    def last_window(self, p: int) -> int:
        """The last window (= pane) id ending at or before punctuation p."""
        return (p + self.window.offset_ns) // self.window.pane_ns - 1

    def _process(self, df: DataFrame, batch_id: int) -> None:
        spec, win, prev = self.spec, self.window, self.state
        is_row = F.col("window").isNotNull()
        late = is_row & (win.pane_end_col(F.col("window")) <= F.lit(prev.punctuation)) \
            if prev.punctuation is not None else F.lit(False)
        keep = is_row & ~late
        files = [SpoolFileMarker.from_row(r) for r in
                 df.select(LINK, SEQ, PUNCT, "window").groupBy(LINK, SEQ)
                 .agg(F.max(PUNCT).alias("p"), F.sum(keep.cast("long")).alias("kept"),
                      F.sum(late.cast("long")).alias("late"),
                      F.max(F.when(keep, F.col("window"))).alias("max_pane"))
                 .collect()]
        state = prev.for_batch(batch_id)
        punctuation = self._meld(state, files)
        late_rows = sum(f.late for f in files)
        if late_rows:
            log.warning("query %s: %d partial rows arrived for panes already folded into the "
                        "landmark (P=%s); dropped and counted", spec.query, late_rows,
                        prev.punctuation)
        state.late_rows += late_rows
        kept = sum(f.kept for f in files)
        panes = [int(f.max_pane) for f in files if f.max_pane is not None]
        # None until a batch brings rows (a first batch may hold punctuation only)
        before = state.extra.get("max_pane")
        max_pane = max(panes + ([before] if before is not None else []), default=None)
        state.extra["max_pane"] = max_pane
        if punctuation is not None and (prev.punctuation is None or punctuation > prev.punctuation):
            state.punctuation = punctuation
        done = state.extra.get("through")        # cumulative rows hold every pane <= this
        target = None
        if state.punctuation is not None and max_pane is not None:
            target = min(max_pane, self.last_window(state.punctuation))
        at_end = state.punctuation is not None and state.punctuation >= INT64_MAX
        moves = target is not None and (done is None or target > done)
        if not kept and not moves:
            self._commit(state)
            return
        columns = [f.name for f in spec.partial_schema().fields]
        parts = df.where(keep).select(*columns) if kept else None
        if prev.open_dir is not None:
            old = self.spark.read.schema(spec.partial_schema()).parquet(
                str(self.store.path(prev.open_dir)))
            parts = old if parts is None else parts.unionByName(old)
        combined = self.combine(cast(DataFrame, parts), ["window"] + spec.key_columns())
        self._release = []
        if moves:
            combined = combined.persist()
            self._release.append(combined)
        try:
            if moves:
                assert target is not None
                rest = self._advance(combined, batch_id, done, target, at_end, state)
                state.extra["through"] = target
            else:
                rest = combined
            if at_end:
                state.open_dir = None
            else:
                open_dir = f"open-{batch_id:010d}"
                rest.write.mode("overwrite").parquet(str(self.store.path(open_dir)))
                state.open_dir = open_dir
            self._commit(state)
        finally:
            for frame in self._release:
                frame.unpersist()

    def _advance(self, combined: DataFrame, batch_id: int, done: int | None, target: int,
                 at_end: bool, state: StageState) -> DataFrame:
        """Output the windows done+1..target (only `target` at the end of input for
        [RANGE ALL]); returns the new state: cumulative rows at `target` plus later panes."""
        spec = self.spec
        keys = spec.key_columns()
        state_cols = [c for c, _ in spec.state_columns()]
        closing = combined.where(F.col("window") <= F.lit(target))
        running = closing.select("window", *keys, *self._running,
                                 self._next.alias("__next"))
        if any(s.kind == "udaf" for s in spec.states):
            running = running.select("window", *keys, *unfold_udafs(spec.states, state_cols),
                                     "__next")
        running = running.persist()
        self._release.append(running)      # released once the new state is written
        if (not self.only_at_end) or at_end:
            first = F.greatest(F.col("window"), F.lit(done + 1)) if done is not None \
                else F.col("window")
            if self.only_at_end:
                first = F.lit(target).cast("long")
            upto = F.coalesce(F.col("__next") - 1, F.lit(target).cast("long"))
            if self.only_at_end:
                rows = running.where(F.col("__next").isNull())
            else:
                rows = running
            rows = rows.where(first <= upto)
            closed = rows.select(F.explode(F.sequence(first, upto)).alias("window"), *keys,
                                 *state_cols)
            if self.having is not None:
                closed = closed.where(self.having)
            result = closed.select(*self.outputs, *self.hidden).toArrow()
            self._tick("landmark windows")
            state.closed_rows += self.emit(result, batch_id, state.punctuation)
        cumulative = running.where(F.col("__next").isNull()).select(
            F.lit(target).cast("long").alias("window"), *keys, *state_cols)
        later = combined.where(F.col("window") > F.lit(target))
        return cumulative.unionByName(later)
