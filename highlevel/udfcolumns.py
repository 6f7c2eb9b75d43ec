"""Spark columns of GS-lite's library functions and of user-defined functions.

MIN/MAX, IF, EQ/GEQ/LEQ, sqrt and non_temporal are Spark expressions (`library_column`).
getlpmid and user-defined functions run Python code, so they are Arrow-batched pandas UDFs:
each executor batch is one call of the same numpy code the low level runs (`lowlevel.lpm`,
`lowlevel.library`), never a Python call per row. Values travel as Spark holds them (a uint64
as the bit pattern of a long, an address as two longs, `highlevel.ipcolumns.IpValue`).
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from highlevel.errors import StageConfigError
from highlevel.ipcolumns import IpValue
from queries import expressions as E

#: the Spark type a GSQL type travels as
SPARK_TYPES = {"uint": "long", "ullong": "long", "int": "long", "llong": "long",
               "ipv4": "long", "float": "double", "bool": "boolean", "string": "string"}


def _is_ip(value) -> bool:
    # not hasattr(value, "hi"): a Spark Column answers any attribute (a field of a struct)
    return isinstance(value, IpValue)


def getlpmid_column(path: str, value) -> Column:
    """getlpmid(value, 'path') as a pandas UDF over the address's long column(s)."""

    def lookup(*series):
        import numpy as np
        import pandas as pd

        from lowlevel import lpm

        halves = [s.fillna(0).to_numpy(np.int64).view(np.uint64) for s in series]
        addr = tuple(halves) if len(halves) == 2 else halves[0]
        return pd.Series(lpm.getlpmid(addr, path))

    udf = F.pandas_udf(lookup, "long")   # type: ignore[call-overload]
    return udf(value.hi, value.lo) if _is_ip(value) else udf(value)


def external_column(node: E.Func, compile_value: Callable, query: str) -> Column:
    """A user-defined function (`node.external`) as a pandas UDF: each argument's column(s)
    in, the function called once per Arrow batch (`lowlevel.library.call_external`)."""
    fn = node.external
    spark_type = SPARK_TYPES.get(fn.returns)
    if spark_type is None:
        raise StageConfigError(f"query {query!r}: {fn.name} returns {fn.returns}, which the "
                               f"Spark stage cannot take from a Python function: use it in "
                               f"WHERE, or in SELECT of a query without aggregates")
    columns: list[Column] = []
    layout: list[tuple[str, object]] = []   # per argument: ("value", None) or ("const", v)
    for arg, gsql, handle in zip(node.args["args"], fn.params, fn.handles):
        if handle or (isinstance(arg, E.Literal) and arg.kind == "string"):
            layout.append(("const", arg.value))
            continue
        value = compile_value(arg)
        if _is_ip(value):
            columns += [value.hi, value.lo]
            layout.append(("ip", None))
        else:
            columns.append(value)
            layout.append(("value", gsql))

    def run(*series):
        import numpy as np
        import pandas as pd

        from lowlevel import library

        values = []
        k = 0
        for kind, extra in layout:
            if kind == "const":
                values.append(extra)
            elif kind == "skip":    # the stand-in column of a call without column arguments
                k += 1
            elif kind == "ip":
                values.append(tuple(s.fillna(0).to_numpy(np.int64).view(np.uint64)
                                    for s in series[k:k + 2]))
                k += 2
            else:
                s = series[k]
                k += 1
                if extra == "string":
                    values.append(s.fillna("").to_numpy(object))
                elif extra == "float":
                    values.append(s.fillna(0.0).to_numpy(np.float64))
                elif extra == "bool":
                    values.append(s.fillna(False).to_numpy(bool))
                else:
                    arr = s.fillna(0).to_numpy(np.int64)
                    values.append(arr.view(np.uint64) if extra in ("uint", "ullong", "ipv4")
                                  else arr)
        n = len(series[0]) if series else 1
        out = library.call(node, values, n)
        if out.dtype == np.uint64:
            out = out.view(np.int64)
        return pd.Series(out)

    udf = F.pandas_udf(run, spark_type)   # type: ignore[call-overload]
    if not columns:     # every argument constant: one value for every row
        columns = [F.lit(0)]
        layout.insert(0, ("skip", None))
    return udf(*columns)


# --- user-defined aggregates (docs/gsql.md "User-defined aggregates") ---------------------------
# A UDAF's state is `size` words of one dtype, one state column each (`queries.plan.
# udaf_words`); Spark holds float64 words as doubles, int64 and uint64 words as longs (a
# uint64 as its bit pattern). The combine collects each group's words into one flat array
# (`udaf_collect`) and folds it with the UDAF's `combine` in a pandas UDF (`udaf_fold_column`,
# one call per Arrow batch of groups: `lowlevel.udafs.fold_rows`, jitted when Numba compiles
# `combine`); `udaf_output_column` maps `output` over the combined words the same way.

def _udaf_spark_type(udaf) -> str:
    return "double" if udaf.dtype == "float64" else "long"


def udaf_collect(words: list[str]) -> Column:
    """A group's state words, row after row, as one flat array (an aggregate expression).
    The rows come in no particular order: `combine` must be associative and commutative, as
    every built-in super-aggregate is (floating-point sums up to their order of addition)."""
    return F.flatten(F.collect_list(F.array(*[F.col(w) for w in words])))


def udaf_fold_column(udaf, collected: Column) -> Column:
    """The combined state of each group (an array of `udaf.size` words) from its collected
    words (`udaf_collect`), folded with the UDAF's `combine`."""
    size, dtype = udaf.size, udaf.dtype

    def fold(flat):
        import numpy as np
        import pandas as pd

        from lowlevel.udafs import fold_rows

        if len(flat) == 0:
            return pd.Series([], dtype=object)
        lengths = np.fromiter((len(a) // size for a in flat), np.int64, len(flat))
        values = np.concatenate([np.asarray(a) for a in flat])
        if dtype == "float64":
            rows = values.astype(np.float64)
        else:
            rows = values.astype(np.int64).view(np.dtype(dtype))
        rows = np.ascontiguousarray(rows.reshape(-1, size))
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
        out = fold_rows(udaf, rows, starts)
        if dtype == "uint64":
            out = out.view(np.int64)
        return pd.Series(list(out))

    udf = F.pandas_udf(fold, f"array<{_udaf_spark_type(udaf)}>")   # type: ignore[call-overload]
    return udf(collected)


def udaf_output_column(udaf, words: list[Column]) -> Column:
    """`udaf_output(words...)`: the UDAF's `output` of each row's combined state words, as
    the declared result type travels in Spark (float: double; others a long, a uint64 as its
    bit pattern)."""
    dtype = udaf.dtype

    def output(*series):
        import numpy as np
        import pandas as pd

        from lowlevel.udafs import udaf_output

        cols = [s.to_numpy(np.float64) if dtype == "float64"
                else s.to_numpy(np.int64).view(np.dtype(dtype)) for s in series]
        out = udaf_output(udaf, np.stack(cols, axis=1))
        if out.dtype == np.uint64:
            out = out.view(np.int64)
        return pd.Series(out)

    spark_type = "double" if udaf.returns == "float" else "long"
    udf = F.pandas_udf(output, spark_type)   # type: ignore[call-overload]
    return udf(*words)
