"""The sequential kernel of a sampling query: Numba code written for the query's clauses.

A sampling query's window is a sequence of decisions, each depending on the state the rows
before it left (`queries.sampling`), so it cannot be vectorised; it is compiled instead. For
each query, `SamplingKernel` writes the source of two functions from its
`queries.plan.SamplingPlan` and has Numba compile them:

- `rows(...)`: every row of one window in order: WHERE's stateful conjuncts (every one
  evaluated), the supergroup's super-aggregates, the group (created, or re-created after a
  cleaning removed it, at the end of its supergroup's creation order; else updated),
  CLEANING_WHEN and, when it holds, the cleaning pass over the supergroup's live groups in
  creation order (every CLEANING_BY conjunct evaluated, with the live-group count of the
  pass's start);
- `admit(...)`: WHERE's stateful conjuncts over rows in order, one state (a selection
  that samples, e.g. `WHERE nssample(len, 100) = TRUE`);
- `finish(...)`: at the window's end, per supergroup, `final_init` then HAVING over its live
  groups in creation order (conjuncts in order, up to the first false), with the live-group
  count of the pass's start.

A removed group gives back its COUNT$, SUM$ and XOR_AGGR$ contributions (each group keeps its
own share); MIN$ and MAX$ keep theirs, as in GS-lite. Values are float64 in the kernel: the
projected row values, the aggregates, the super-aggregates, the results of operators (integer
`/` and `%` truncate, a zero divisor gives 0, bitwise operators work on int64): exact for
integers up to 2^53. Plain arrays in, counts out; nothing raises in the loop.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import textwrap
import types
from pathlib import Path

from highlevel.errors import StageConfigError
from queries import expressions as E
from queries.inference import conjuncts, type_of
from queries.printer import to_gsql

log = logging.getLogger(__name__)

#: which super-aggregates a removed group gives its share back to
GIVES_BACK = ("count", "sum", "xor")

_INTEGER = {"uint", "ushort", "int", "ullong", "llong", "bool", "ipv4"}

_PRELUDE = '''\
import math
import numpy as np
from numba import njit
from highlevel import stateful as _S


@njit(inline="always")
def _fdiv(a, b):
    return 0.0 if b == 0.0 else a / b


@njit(inline="always")
def _idiv(a, b):
    return 0.0 if b == 0.0 else float(math.trunc(a / b))


@njit(inline="always")
def _imod(a, b):
    return 0.0 if b == 0.0 else math.fmod(a, b)


@njit(inline="always")
def _b(x):
    return 1.0 if x else 0.0


@njit(inline="always")
def _i(a):
    return np.int64(a) if a == a else np.int64(0)

'''


class _Writer:
    """Python source of an expression in one of the kernel's contexts."""

    def __init__(self, window_column: str | None, ctx: str):
        self.window_column = window_column
        self.ctx = ctx              # "row" (WHERE), "when" (CLEANING_WHEN), "group"

    def ref(self, name: str) -> str:
        if name.startswith("__p"):
            row = "i" if self.ctx in ("row", "when") else "first[h]"
            return f"P[{row}, {int(name[3:])}]"
        if name.startswith("__a"):
            if self.ctx != "group":
                raise StageConfigError(f"aggregate {name} read outside a group")
            return f"agg[h, {int(name[3:])}]"
        if name.startswith("__s"):
            return f"sagg[s, {int(name[3:])}]"
        if name == "__cd":
            return "float(cdv)"
        if name == self.window_column:
            return "wv"
        raise StageConfigError(f"unknown name {name!r} in a sampling query's condition")

    def expr(self, n) -> str:
        if isinstance(n, E.Literal):
            if not isinstance(n.value, (int, float, bool)):
                raise StageConfigError(f"literal {n.value!r} in a sampling query's condition")
            return repr(float(n.value))
        if isinstance(n, E.Field):
            return self.ref(n.name)
        if isinstance(n, E.Unary):
            this = self.expr(n.this)
            if n.op == "-":
                return f"(-{this})"
            if n.op == "+":
                return this
            if n.op.upper() in ("NOT", "!"):
                return f"_b({this} == 0.0)"
            if n.op == "~":
                return f"float(~_i({this}))"
        if isinstance(n, E.Binary):
            return self.binary(n)
        if isinstance(n, E.Func):
            args = [self.expr(a) for a in n.args["args"]]
            if n.name in ("float", "uint", "ullong", "int", "llong"):
                return args[0] if n.name == "float" else f"float(_i({args[0]}))"
            from highlevel.stateful import FUNCTIONS

            if n.name in FUNCTIONS:
                return f"float(_S.{n.name}(st, cdv{''.join(', ' + a for a in args)}))"
        raise StageConfigError(f"{to_gsql(n)} cannot be compiled in a sampling query's "
                               f"condition")

    def binary(self, n) -> str:
        op = n.op.upper()
        a, b = self.expr(n.left), self.expr(n.right)
        if op in ("AND", "OR"):
            return f"_b(({a} != 0.0) {op.lower()} ({b} != 0.0))"
        cmp = {"=": "==", "==": "==", "<>": "!=", "!=": "!=", "<": "<", "<=": "<=", ">": ">",
               ">=": ">="}
        if op in cmp:
            return f"_b({a} {cmp[op]} {b})"
        integer = type_of(n.left) in _INTEGER and type_of(n.right) in _INTEGER
        if op in ("+", "-", "*"):
            return f"({a} {op} {b})"
        if op == "/":
            return f"{'_idiv' if integer else '_fdiv'}({a}, {b})"
        if op == "%":
            return f"_imod({a}, {b})"
        if op in ("&", "|", "^", "<<", ">>"):
            return f"float(_i({a}) {op} _i({b}))"
        raise StageConfigError(f"operator {n.op} in a sampling query's condition")


def _conditions(expr, writer: _Writer, name: str, indent: str) -> tuple[str, list]:
    """(source computing `name` = every conjunct true, evaluating each one), conjuncts."""
    parts = conjuncts(expr)
    lines = [f"{indent}{name}{k} = {writer.expr(c)} != 0.0" for k, c in enumerate(parts)]
    lines.append(f"{indent}{name} = " + (" and ".join(f"{name}{k}" for k in range(len(parts)))
                                        or "True"))
    return "\n".join(lines), parts


def _update(table: str, row: str, k: int, kind: str, v: str, indent: str) -> str:
    cell = f"{table}[{row}, {k}]"
    if kind == "count":
        return f"{indent}{cell} += 1.0"
    if kind == "sum":
        return f"{indent}{cell} += {v}"
    if kind in ("min", "max"):
        op = "<" if kind == "min" else ">"
        return (f"{indent}if {cell} != {cell} or {v} {op} {cell}:\n"
                f"{indent}    {cell} = {v}")
    op = {"and": "&", "or": "|", "xor": "^"}[kind]
    return f"{indent}{cell} = float(_i({cell}) {op} _i({v}))"


def _init(table: str, row: str, k: int, kind: str, v: str, indent: str) -> str:
    return f"{indent}{table}[{row}, {k}] = {'1.0' if kind == 'count' else v}"


def _arg(col: str | None) -> str:
    return "0.0" if col is None else f"P[i, {int(col[3:])}]"


def _pass(keep_src: str, indent: int) -> str:
    """The source of a pass over supergroup `s`'s live groups in creation order (a cleaning
    pass, HAVING): `keep_src` sets `keep` for group `h`; a group not kept is removed, and
    every dead entry met is unlinked, so a pass walks the live groups only, not every group
    the window ever made."""
    body = textwrap.indent(keep_src, " " * 8)
    return textwrap.indent(f"""prev = -1
while e >= 0:
    h = ent_g[e]
    live = alive[h] and cur[h] == e
    if live:
{body}
        if not keep:
            _remove(h, s, alive, cd, sagg, shadow)
            removed += 1
            live = False
    nxt = ent_next[e]
    if live:
        prev = e
    else:
        _unlink(e, prev, nxt, s, head, tail, ent_next)
    e = nxt
""", " " * indent)


def kernel_source(plan) -> str:
    """The Python source of the query's `rows` and `finish` functions."""
    wc = plan.window.column if plan.window is not None else None
    row_w, when_w, group_w = _Writer(wc, "row"), _Writer(wc, "when"), _Writer(wc, "group")
    i3 = " " * 12
    where_src, _ = _conditions(E.chain("AND", list(plan.where)) if plan.where else None,
                               row_w, "ok", " " * 8)
    sup_upd = "\n".join(_update("sagg", "s", k, kind, _arg(col), " " * 8)
                        for k, (kind, col) in enumerate(plan.super_aggregates)) or "        pass"
    shadow_init = "\n".join(_init("shadow", "g", k, kind, _arg(col), i3)
                            for k, (kind, col) in enumerate(plan.super_aggregates)
                            if kind in GIVES_BACK)
    shadow_upd = "\n".join(_update("shadow", "g", k, kind, _arg(col), i3)
                           for k, (kind, col) in enumerate(plan.super_aggregates)
                           if kind in GIVES_BACK)
    agg_init = "\n".join(_init("agg", "g", k, kind, _arg(col), i3)
                         for k, (kind, col) in enumerate(plan.aggregates))
    agg_upd = "\n".join(_update("agg", "g", k, kind, _arg(col), i3)
                        for k, (kind, col) in enumerate(plan.aggregates))
    give_back = []
    for k, (kind, _) in enumerate(plan.super_aggregates):
        if kind in ("count", "sum"):
            give_back.append(f"    sagg[s, {k}] -= shadow[h, {k}]")
        elif kind == "xor":
            give_back.append(f"    sagg[s, {k}] = float(_i(sagg[s, {k}]) ^ _i(shadow[h, {k}]))")
    remove = ("@njit(inline='always')\n"
              "def _unlink(e, prev, nxt, s, head, tail, ent_next):\n"
              "    if prev < 0:\n"
              "        head[s] = nxt\n"
              "    else:\n"
              "        ent_next[prev] = nxt\n"
              "    if tail[s] == e:\n"
              "        tail[s] = prev\n\n\n"
              "@njit(inline='always')\n"
              "def _remove(h, s, alive, cd, sagg, shadow):\n"
              "    alive[h] = False\n"
              "    cd[s] -= 1\n" + "\n".join(give_back) + "\n\n\n")
    if plan.cleaning_when is not None:
        when_src = f"        cdv = cd[s]\n        when = {when_w.expr(plan.cleaning_when)} != 0.0"
        by_src, _ = _conditions(plan.cleaning_by, group_w, "keep", "")
        walk = _pass(by_src, 12)
        cleaning = f'''{when_src}
        if when:
            cleanings += 1
            cdv = cd[s]
            e = head[s]
{walk}'''
    else:
        cleaning = ""
    # HAVING: its conjuncts in order, up to the first false
    having_src = "\n".join(["keep = True"] + [f"if keep:\n    keep = {group_w.expr(c)} != 0.0"
                                               for c in conjuncts(plan.having)])
    having_walk = _pass(having_src, 8)
    return _PRELUDE + remove + f'''@njit(nogil=True, cache=True)
def rows(P, sgi, gid, wv, states, cd, sagg, agg, shadow, alive, first, cur, ent_g, ent_next,
         head, tail, counts):
    nent = counts[0]
    cleanings = 0
    removed = 0
    for i in range(P.shape[0]):
        s = sgi[i]
        g = gid[i]
        st = states[s]
        cdv = cd[s]
{where_src}
        if not ok:
            continue
        counts[1] += 1
{sup_upd}
        if not alive[g]:
            alive[g] = True
            if first[g] < 0:
                first[g] = i
{agg_init or '            pass'}
{shadow_init}
            cd[s] += 1
            e = nent
            nent += 1
            ent_g[e] = g
            ent_next[e] = -1
            cur[g] = e
            if head[s] < 0:
                head[s] = e
            else:
                ent_next[tail[s]] = e
            tail[s] = e
        else:
{agg_upd or '            pass'}
{shadow_upd}
{cleaning}
    counts[0] = nent
    counts[2] += cleanings
    counts[3] += removed


@njit(nogil=True, cache=True)
def admit(P, wv, st, cdv, out):
    for i in range(P.shape[0]):
{where_src}
        out[i] = ok


@njit(nogil=True, cache=True)
def finish(wv, states, cd, sagg, agg, shadow, alive, first, cur, ent_g, ent_next, head, tail,
           P, counts):
    removed = 0
    for s in range(states.shape[0]):
        st = states[s]
        _S.final_init(st, cd[s])
        cdv = cd[s]
        e = head[s]
{having_walk}
    counts[3] += removed
'''


def compile_kernel(plan):
    """The query's compiled module (functions `rows`, `admit`, `finish`): written to the
    project's kernel directory (`lowlevel.kerneldir.load_generated`, where Numba caches the
    machine code) and imported once per process; compiled from memory, without a disk cache,
    when no kernel directory can be written."""
    from lowlevel.kerneldir import load_generated

    source = kernel_source(plan)
    # the kernels inline the stateful functions: their sources name the module too
    here = Path(__file__).resolve().parent
    deps = hashlib.sha1(b"".join((here / f).read_bytes() for f in
                                 ("stateful.py", "sampling_kernel.py"))).hexdigest()[:6]
    module = load_generated("sampling_", source, deps)
    if module is not None:
        return module
    name = f"oopscope_sampling_{hashlib.sha1(source.encode()).hexdigest()[:16]}"
    if name not in sys.modules:
        log.info("a sampling kernel is compiled without a disk cache (no writable kernel "
                 "directory)")
        module = types.ModuleType(name)
        exec(compile(source.replace("cache=True", "cache=False"),
                     f"<{name}>", "exec"), module.__dict__)
        sys.modules[name] = module
    return sys.modules[name]
