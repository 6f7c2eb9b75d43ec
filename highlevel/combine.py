"""Super-aggregates: combine partial rows of one (window, group) with Spark aggregate functions.

count/sum -> sum, min -> min, max -> max, and/or/xor -> bit_and/bit_or/bit_xor, first -> the
value at the smallest time, last -> the value at the largest time, distinct -> register-wise
max of HyperLogLog registers (one column per register, see `common.spool`), udaf -> the
user-defined aggregate's `combine` over the group's state words (collected by the `groupBy`,
folded by a pandas UDF: `highlevel.udfcolumns.udaf_fold_column`). The combined rows have the
same columns as the partial rows, so the stage's open state and new partials combine with one
`groupBy`.

uint64 values travel as int64 with the same bits (Spark has no unsigned type): sums and bit
operations are bit-exact; min/max flip the sign bit to compare as unsigned. Min/max over an
`ip` value compare its halves (`name__hi`, `name__lo`) as one struct, hi first.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.spool import register_column
from highlevel.errors import StageConfigError
from highlevel.udfcolumns import udaf_collect, udaf_fold_column
from lowlevel.hll import hll_alpha
from queries.plan import ip_words, udaf_words


def _sign() -> Column:
    return F.lit(-(1 << 63))


def ip_order_struct(name: str) -> Column:
    """The halves of an `ip` MIN/MAX state as a struct whose (signed) order is the address's
    unsigned 128-bit one: each half with its sign bit flipped."""
    hi, lo = ip_words(name)
    return F.struct(F.col(hi).bitwiseXOR(_sign()).alias("h"),
                    F.col(lo).bitwiseXOR(_sign()).alias("l"))


def ip_order_words(best: Column, name: str) -> list[Column]:
    """The state columns `name__hi`, `name__lo` back from an `ip_order_struct` value."""
    hi, lo = ip_words(name)
    return [best.getField("h").bitwiseXOR(_sign()).alias(hi),
            best.getField("l").bitwiseXOR(_sign()).alias(lo)]


def hll_estimate_col(name: str, m: int) -> Column:
    """Cardinality estimate of the registers `name__r0 .. name__r<m-1>` (HyperLogLog with
    linear counting for small counts; a register holds rho = leading zeros + 1 of the hash
    bits after the index, 0 when empty)."""
    alpha = hll_alpha(m)
    regs = [F.col(register_column(name, i)) for i in range(m)]
    inverse = sum((F.pow(F.lit(2.0), -r) for r in regs), F.lit(0.0))
    raw = F.lit(alpha * m * m) / inverse
    zeros = sum(((r == 0).cast("int") for r in regs), F.lit(0))
    small = F.lit(float(m)) * F.log(F.lit(float(m)) / zeros)
    # rounded like lowlevel.hll.estimate, the reference evaluator's estimate
    return F.rint(F.when((raw <= F.lit(2.5 * m)) & (zeros > 0), small).otherwise(raw))


def _agg_exprs(states, m: int) -> tuple[list[Column], list[Column], dict[str, Column]]:
    """(aggregate expressions, post-aggregation selects restoring the state column names,
    columns computed between the two: a UDAF's combined state words as one array)."""
    aggs, post, folds = [], [], {}
    for s in states:
        c = F.col(s.name)
        if s.kind == "udaf":
            words = list(udaf_words(s.name, s.udaf.size))
            aggs.append(udaf_collect(words).alias(f"__{s.name}"))
            folds[f"__{s.name}"] = udaf_fold_column(s.udaf, F.col(f"__{s.name}"))
            post += [F.col(f"__{s.name}")[j].alias(w) for j, w in enumerate(words)]
            continue
        if s.dtype == "ip":
            # MIN/MAX over an address: the smallest / largest (hi, lo), each half unsigned
            fn = F.min if s.kind == "min" else F.max
            aggs.append(fn(ip_order_struct(s.name)).alias(f"__{s.name}"))
            post += ip_order_words(F.col(f"__{s.name}"), s.name)
            continue
        if s.kind in ("count", "sum"):
            aggs.append(F.sum(c).alias(s.name))
        elif s.kind in ("min", "max"):
            fn = F.min if s.kind == "min" else F.max
            if s.dtype == "uint64":
                aggs.append(fn(c.bitwiseXOR(_sign())).bitwiseXOR(_sign()).alias(s.name))
            else:
                aggs.append(fn(c).alias(s.name))
        elif s.kind in ("and", "or", "xor"):
            fn = {"and": F.bit_and, "or": F.bit_or, "xor": F.bit_xor}[s.kind]
            aggs.append(fn(c).alias(s.name))
        elif s.kind in ("first", "last"):
            # smallest/largest (time, value): ties at one time broken by value, deterministically
            fn = F.min if s.kind == "first" else F.max
            aggs.append(fn(F.struct(F.col(f"{s.name}__t").alias("t"), c.alias("v")))
                        .alias(f"__{s.name}"))
            post += [F.col(f"__{s.name}.v").alias(s.name), F.col(f"__{s.name}.t")
                     .alias(f"{s.name}__t")]
            continue
        elif s.kind == "distinct":
            names = [register_column(s.name, i) for i in range(m)]
            aggs += [F.max(r).alias(r) for r in names]
            post += [F.col(r) for r in names]
            continue
        else:
            raise StageConfigError(f"state `{s.name}`: unknown sub-aggregate kind {s.kind!r}")
        post.append(F.col(s.name))
    return aggs, post, folds


class Combiner:
    """The aggregate expressions of a set of states, built once and applied to many frames."""

    def __init__(self, states, registers: int = 64):
        self.aggs, self.post, self.folds = _agg_exprs(states, registers)

    def __call__(self, df: DataFrame, group_columns: list[str]) -> DataFrame:
        """One row per distinct `group_columns` value, every state combined; names kept."""
        if not self.aggs:
            return df.select(*group_columns).distinct()
        grouped = df.groupBy(*group_columns).agg(*self.aggs)
        if self.folds:      # each UDAF's fold once, its words then taken from the array
            grouped = grouped.withColumns(self.folds)
        return grouped.select(*[F.col(g) for g in group_columns], *self.post)


def combine(df: DataFrame, group_columns: list[str], states, registers: int = 64) -> DataFrame:
    """One row per distinct `group_columns` value, every state combined; columns keep names."""
    return Combiner(states, registers)(df, group_columns)
