"""Sub-aggregates as create / append / combine / finalize: the Gigascope low/high split.

Every sub-aggregate of a query is an `AggSpec`. Its state lives in one of four banks of 2-D
arrays (one row per hash-table slot or partial row): `i` (int64), `u` (uint64), `f` (float64)
and `h` (uint8 HyperLogLog registers). The steps:

- create: `StateLayout.identity_*`, the state of an empty group (copied into a slot);
- append: `update_slot`, jitted, applied per packet by the hash-table kernel and dispatched by
  a small integer op code (`ops` rows: op, argument column, state column, aux);
  `lowlevel.specialize` writes it out as one `update_op` call per row with constant codes;
- combine: `combine_states`, vectorised numpy (sort + `ufunc.reduceat`): what the high level
  does with several partial rows of one (window, group);
- finalize: `finalize_state` (HLL estimate, FIRST/LAST value) and `average` for AVG.

MIN/MAX over an `ip` value keep its two uint64 halves in state columns `<name>__hi`,
`<name>__lo` (`ip_words`), one after the other in the u bank, and take their argument from two
u bank columns: the order is the 128-bit unsigned one.

First/last keep the time (ns) of their value in an int64 column `<name>__t`: first is the value
with the smallest time (ties: the smaller value), last the largest (ties: the larger value), so
the result does not depend on arrival order or on how rows were split. Distinct keeps HLL
registers of `lowlevel.hll.hash64` values (the wrapper hashes, the kernel takes the hash),
bit-exact with the reference evaluator's sketch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from common.jit import ngjit_inline
from lowlevel.hll import estimate, hash64, index_and_rank
from queries.plan import ip_words

if TYPE_CHECKING:
    from queries.udf import ExternalAggregate

OP_COUNT = 0
OP_SUM_I, OP_SUM_U, OP_SUM_F = 1, 2, 3
OP_MIN_I, OP_MIN_U, OP_MIN_F = 4, 5, 6
OP_MAX_I, OP_MAX_U, OP_MAX_F = 7, 8, 9
OP_AND_I, OP_AND_U = 10, 11
OP_OR_I, OP_OR_U = 12, 13
OP_XOR_I, OP_XOR_U = 14, 15
OP_FIRST_I, OP_FIRST_U, OP_FIRST_F = 16, 17, 18
OP_LAST_I, OP_LAST_U, OP_LAST_F = 19, 20, 21
OP_DISTINCT = 22
OP_COUNT_U = 23
#: a user-defined aggregate (aux: its index in `StateLayout.udafs`): only the specialized
#: kernels run it (`lowlevel.specialize` writes a call of its jitted `update`)
OP_UDAF = 24
#: MIN/MAX over an `ip` value (128 bits): two uint64 state words (hi, lo) and two argument
#: words, compared hi first, then lo, unsigned (GS-lite orders IPV6 values as numbers)
OP_MIN_IP, OP_MAX_IP = 25, 26

#: a "string" state (MIN/MAX over strings) is a uint64 rank (`lowlevel.strings.StringOrder`)
_BANK = {"int64": "i", "uint64": "u", "float64": "f", "string": "u", "ip": "u"}
_BANK_DTYPE = {"i": np.dtype(np.int64), "u": np.dtype(np.uint64), "f": np.dtype(np.float64),
               "h": np.dtype(np.uint8)}
_OPS = {  # (kind, bank) -> op code
    ("count", "i"): OP_COUNT, ("count", "u"): OP_COUNT_U,
    ("sum", "i"): OP_SUM_I, ("sum", "u"): OP_SUM_U, ("sum", "f"): OP_SUM_F,
    ("min", "i"): OP_MIN_I, ("min", "u"): OP_MIN_U, ("min", "f"): OP_MIN_F,
    ("max", "i"): OP_MAX_I, ("max", "u"): OP_MAX_U, ("max", "f"): OP_MAX_F,
    ("and", "i"): OP_AND_I, ("and", "u"): OP_AND_U,
    ("or", "i"): OP_OR_I, ("or", "u"): OP_OR_U,
    ("xor", "i"): OP_XOR_I, ("xor", "u"): OP_XOR_U,
    ("first", "i"): OP_FIRST_I, ("first", "u"): OP_FIRST_U, ("first", "f"): OP_FIRST_F,
    ("last", "i"): OP_LAST_I, ("last", "u"): OP_LAST_U, ("last", "f"): OP_LAST_F,
}
_OP_BANK = {op: bank for (kind, bank), op in _OPS.items()} | {OP_MIN_IP: "u", OP_MAX_IP: "u"}
_I64_MIN = np.iinfo(np.int64).min
_I64_MAX = np.iinfo(np.int64).max
_U64_MAX = np.iinfo(np.uint64).max


def _identity(kind: str, bank: str):
    """State of a group that has seen no packet (the neutral element of `combine`)."""
    if kind in ("count", "sum", "or", "xor"):
        return 0
    if kind == "and":
        return -1 if bank == "i" else _U64_MAX
    if kind == "min":
        return {"i": _I64_MAX, "u": _U64_MAX, "f": np.inf}[bank]
    if kind == "max":
        return {"i": _I64_MIN, "u": 0, "f": -np.inf}[bank]
    return 0  # first/last value: meaningless until its time is set


@dataclass(frozen=True)
class AggSpec:
    """One sub-aggregate: state column `name`, kind (plan.SUBAGG_KINDS), state dtype."""

    name: str
    kind: str
    dtype: str = "int64"
    registers: int = 64   # distinct only: HLL registers, a power of two
    udaf: ExternalAggregate | None = None   # udaf only

    @property
    def ext(self) -> ExternalAggregate:
        assert self.udaf is not None, f"{self.name} is not a user-defined aggregate"
        return self.udaf

    @property
    def bank(self) -> str:
        if self.kind == "udaf":
            return _BANK[self.ext.dtype]
        if self.kind == "count":
            return "u" if self.dtype == "uint64" else "i"
        if self.kind == "distinct":
            return "h"
        return _BANK[self.dtype]

    @property
    def arg_bank(self) -> str | None:
        """Which argument bank feeds it (`d`: uint64 values hashed for HLL); None for count."""
        if self.kind == "count":
            return None
        if self.kind == "distinct":
            return "d"
        if self.kind == "udaf":
            return _BANK[self.ext.arg_dtype]
        return self.bank


class StateLayout:
    """Where each sub-aggregate's state and argument live; the op table of the kernel."""

    def __init__(self, specs: tuple[AggSpec, ...] | list[AggSpec]):
        self.specs = tuple(specs)
        names = [s.name for s in self.specs]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate sub-aggregate names in {names}")
        width = {"i": 0, "u": 0, "f": 0, "h": 0}
        args = {"i": 0, "u": 0, "f": 0, "d": 0}
        ops = []
        ident: dict[str, list[int | float]] = {"i": [], "u": [], "f": []}
        #: state column name -> (bank, column index, width); first/last add `<name>__t`
        self.columns: dict[str, tuple[str, int, int]] = {}
        #: sub-aggregate name -> argument (bank, column index)
        self.arg_columns: dict[str, tuple[str, int]] = {}
        #: the user-defined aggregates, in the order their ops' aux column numbers them
        self.udafs: list[AggSpec] = []
        for s in self.specs:
            if s.kind == "udaf":
                from queries.plan import udaf_words

                bank = s.bank
                col = width[bank]
                width[bank] += s.ext.size
                ident[bank].extend(s.ext.identity)
                for j, w in enumerate(udaf_words(s.name, s.ext.size)):
                    self.columns[w] = (bank, col + j, 1)
                udaf_bank = _BANK[s.ext.arg_dtype]
                a = args[udaf_bank]
                args[udaf_bank] += 1
                self.arg_columns[s.name] = (udaf_bank, a)
                ops.append((OP_UDAF, a, col, len(self.udafs)))
                self.udafs.append(s)
                continue
            if s.kind == "distinct":
                r = s.registers
                if r < 16 or r > 65536 or r & (r - 1):
                    raise ValueError(f"distinct {s.name!r}: registers must be a power of two "
                                     f"in [16, 65536], not {r}")
                col = width["h"]
                width["h"] += r
                a = args["d"]
                args["d"] += 1
                ops.append((OP_DISTINCT, a, col, int(math.log2(r))))
                self.columns[s.name] = ("h", col, r)
                self.arg_columns[s.name] = ("d", a)
                continue
            if s.dtype == "ip":
                if s.kind not in ("min", "max"):
                    raise ValueError(f"sub-aggregate {s.name!r}: {s.kind} over an ip value "
                                     "is not supported")
                col, a = width["u"], args["u"]
                width["u"] += 2
                args["u"] += 2
                ident["u"].extend([_identity(s.kind, "u")] * 2)
                for j, w in enumerate(ip_words(s.name)):
                    self.columns[w] = ("u", col + j, 1)
                self.arg_columns[s.name] = ("u", a)
                ops.append((OP_MIN_IP if s.kind == "min" else OP_MAX_IP, a, col, 0))
                continue
            if s.kind != "count" and s.dtype not in _BANK:
                raise ValueError(f"sub-aggregate {s.name!r}: dtype {s.dtype!r} is not one of "
                                 f"{sorted(_BANK)}")
            bank = s.bank
            op = _OPS.get((s.kind, bank))
            if op is None:
                raise ValueError(f"sub-aggregate {s.name!r}: {s.kind} over {s.dtype} "
                                 "is not supported")
            col = width[bank]
            width[bank] += 1
            ident[bank].append(_identity(s.kind, bank))
            self.columns[s.name] = (bank, col, 1)
            aux = 0
            if s.kind in ("first", "last"):
                aux = width["i"]
                width["i"] += 1
                ident["i"].append(_I64_MAX if s.kind == "first" else _I64_MIN)
                self.columns[s.name + "__t"] = ("i", aux, 1)
            a = 0
            arg_bank = s.arg_bank
            if arg_bank is not None:
                a = args[arg_bank]
                args[arg_bank] += 1
                self.arg_columns[s.name] = (arg_bank, a)
            ops.append((op, a, col, aux))
        self.width = width
        self.arg_width = args
        self.ops = np.array(ops, dtype=np.int64).reshape(len(ops), 4)
        self.identity_i = np.array(ident["i"], dtype=np.int64)
        self.identity_u = np.array(ident["u"], dtype=np.uint64)
        self.identity_f = np.array(ident["f"], dtype=np.float64)

    def record_ops(self, nkeys: int) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
        """The op table and identity record for the hash-table record layout
        `[pane | keys (nkeys) | i bank | u bank | f bank]` (uint64 words): (ops with state
        columns as record words, identity record uint64[W], bank -> first word)."""
        base = {"i": 1 + nkeys}
        base["u"] = base["i"] + self.width["i"]
        base["f"] = base["u"] + self.width["u"]
        width = base["f"] + self.width["f"]
        ops = self.ops.copy()
        for row in ops:
            op = int(row[0])
            if op == OP_DISTINCT:
                continue
            if op == OP_UDAF:
                row[2] += base[self.udafs[int(row[3])].bank]
                continue
            row[2] += base[_OP_BANK[op]]
            if OP_FIRST_I <= op <= OP_LAST_F:
                row[3] += base["i"]
        ident = np.zeros(width, np.uint64)
        ident[base["i"]:base["u"]] = self.identity_i.view(np.uint64)
        ident[base["u"]:base["f"]] = self.identity_u
        ident[base["f"]:width] = self.identity_f.view(np.uint64)
        return ops, ident, base

    def empty_banks(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed state banks (i, u, f, h) of `rows` rows."""
        return tuple(np.zeros((rows, self.width[b]), _BANK_DTYPE[b]) for b in "iufh")

    def empty_args(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Zeroed argument banks (i, u, f, d) for `n` packets."""
        return (np.zeros((n, self.arg_width["i"]), np.int64),
                np.zeros((n, self.arg_width["u"]), np.uint64),
                np.zeros((n, self.arg_width["f"]), np.float64),
                np.zeros((n, self.arg_width["d"]), np.uint64))

    def state_columns(self, banks) -> dict[str, np.ndarray]:
        """Named state columns (views) of state banks (i, u, f, h); HLL as 2-D uint8."""
        bank_of = dict(zip("iufh", banks))
        out = {}
        for name, (bank, col, w) in self.columns.items():
            arr = bank_of[bank]
            out[name] = arr[:, col:col + w] if bank == "h" else arr[:, col]
        return out


# --- append: per packet, jitted --------------------------------------------------------------

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@ngjit_inline
def mix64(x):
    """splitmix64 finalizer: a bijective, well-mixed 64-bit hash."""
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


@ngjit_inline
def _clz64(x):
    n = 0
    if x >> np.uint64(32) == 0:
        n += 32
        x <<= np.uint64(32)
    if x >> np.uint64(48) == 0:
        n += 16
        x <<= np.uint64(16)
    if x >> np.uint64(56) == 0:
        n += 8
        x <<= np.uint64(8)
    if x >> np.uint64(60) == 0:
        n += 4
        x <<= np.uint64(4)
    if x >> np.uint64(62) == 0:
        n += 2
        x <<= np.uint64(2)
    if x >> np.uint64(63) == 0:
        n += 1
    return n


@ngjit_inline
def hll_position(h, bits):
    """(register, rank) of a 64-bit hash in an HLL of 2**bits registers (lowlevel.hll)."""
    reg = np.int64(h >> np.uint64(64 - bits))
    w = h << np.uint64(bits)
    if w == 0:
        return reg, 64 - bits + 1
    return reg, _clz64(w) + 1


@ngjit_inline
def _update_ip(tu, s, dst, h, lo, smallest):
    """An address's MIN (`smallest`) or MAX state, two words (hi, lo) compared hi first,
    unsigned, takes (h, lo) when it is smaller (larger)."""
    sh, sl = tu[s, dst], tu[s, dst + 1]
    if (h < sh or h == sh and lo < sl) if smallest else (h > sh or h == sh and lo > sl):
        tu[s, dst] = h
        tu[s, dst + 1] = lo


@ngjit_inline
def update_slot(ti, tu, tf, th, s, i, ops, ts, ai, au, af, ad):
    """Fold packet i into the state of slot s (the `append` step of every sub-aggregate)."""
    for a in range(ops.shape[0]):
        op = ops[a, 0]
        src = ops[a, 1]
        dst = ops[a, 2]
        if op == OP_COUNT:
            ti[s, dst] += 1
        elif op == OP_COUNT_U:
            tu[s, dst] += np.uint64(1)
        elif op == OP_SUM_I:
            ti[s, dst] += ai[i, src]
        elif op == OP_SUM_U:
            tu[s, dst] += au[i, src]
        elif op == OP_SUM_F:
            tf[s, dst] += af[i, src]
        elif op == OP_MIN_I:
            ti[s, dst] = min(ti[s, dst], ai[i, src])
        elif op == OP_MIN_U:
            tu[s, dst] = min(tu[s, dst], au[i, src])
        elif op == OP_MIN_F:
            tf[s, dst] = min(tf[s, dst], af[i, src])
        elif op == OP_MAX_I:
            ti[s, dst] = max(ti[s, dst], ai[i, src])
        elif op == OP_MAX_U:
            tu[s, dst] = max(tu[s, dst], au[i, src])
        elif op == OP_MAX_F:
            tf[s, dst] = max(tf[s, dst], af[i, src])
        elif op == OP_AND_I:
            ti[s, dst] &= ai[i, src]
        elif op == OP_AND_U:
            tu[s, dst] &= au[i, src]
        elif op == OP_OR_I:
            ti[s, dst] |= ai[i, src]
        elif op == OP_OR_U:
            tu[s, dst] |= au[i, src]
        elif op == OP_XOR_I:
            ti[s, dst] ^= ai[i, src]
        elif op == OP_XOR_U:
            tu[s, dst] ^= au[i, src]
        elif op <= OP_LAST_F:
            # first: smallest time, ties by the smaller value; last: largest time, ties by the
            # larger value (order independent, as tests.oracles.reference and the high level)
            t = ts[i]
            aux = ops[a, 3]
            tc = ti[s, aux]
            first = op <= OP_FIRST_F
            if first and t > tc or not first and t < tc:
                continue
            if op == OP_FIRST_I or op == OP_LAST_I:
                v = ai[i, src]
                if t == tc and (v >= ti[s, dst] if first else v <= ti[s, dst]):
                    continue
                ti[s, dst] = v
            elif op == OP_FIRST_U or op == OP_LAST_U:
                vu = au[i, src]
                if t == tc and (vu >= tu[s, dst] if first else vu <= tu[s, dst]):
                    continue
                tu[s, dst] = vu
            else:
                vf = af[i, src]
                if t == tc and (vf >= tf[s, dst] if first else vf <= tf[s, dst]):
                    continue
                tf[s, dst] = vf
            ti[s, aux] = t
        elif op == OP_MIN_IP or op == OP_MAX_IP:
            _update_ip(tu, s, dst, au[i, src], au[i, src + 1], op == OP_MIN_IP)
        else:  # OP_DISTINCT: the argument bank holds lowlevel.hll.hash64 of the values
            reg, rank = hll_position(ad[i, src], ops[a, 3])
            if rank > th[s, dst + reg]:
                th[s, dst + reg] = rank


@ngjit_inline
def update_op(ti, tu, tf, th, s, i, op, src, dst, aux, ts, ai, au, af, ad):
    """`update_slot` for one `ops` row: op code `op` over argument column `src` into state
    column `dst` (`aux`: the time column of first/last, the register bits of distinct).
    `lowlevel.specialize` calls it with constant codes, and the compiler keeps that op's code
    only. It repeats `update_slot`'s dispatch on purpose: `update_slot` looping over calls of
    this helper (both inlined) left it a real call with a reference count per array argument,
    on every packet, which made the generic kernels many times slower."""
    if op == OP_COUNT:
        ti[s, dst] += 1
    elif op == OP_COUNT_U:
        tu[s, dst] += np.uint64(1)
    elif op == OP_SUM_I:
        ti[s, dst] += ai[i, src]
    elif op == OP_SUM_U:
        tu[s, dst] += au[i, src]
    elif op == OP_SUM_F:
        tf[s, dst] += af[i, src]
    elif op == OP_MIN_I:
        ti[s, dst] = min(ti[s, dst], ai[i, src])
    elif op == OP_MIN_U:
        tu[s, dst] = min(tu[s, dst], au[i, src])
    elif op == OP_MIN_F:
        tf[s, dst] = min(tf[s, dst], af[i, src])
    elif op == OP_MAX_I:
        ti[s, dst] = max(ti[s, dst], ai[i, src])
    elif op == OP_MAX_U:
        tu[s, dst] = max(tu[s, dst], au[i, src])
    elif op == OP_MAX_F:
        tf[s, dst] = max(tf[s, dst], af[i, src])
    elif op == OP_AND_I:
        ti[s, dst] &= ai[i, src]
    elif op == OP_AND_U:
        tu[s, dst] &= au[i, src]
    elif op == OP_OR_I:
        ti[s, dst] |= ai[i, src]
    elif op == OP_OR_U:
        tu[s, dst] |= au[i, src]
    elif op == OP_XOR_I:
        ti[s, dst] ^= ai[i, src]
    elif op == OP_XOR_U:
        tu[s, dst] ^= au[i, src]
    elif op <= OP_LAST_F:
        # first: smallest time, ties by the smaller value; last: largest time, ties by the
        # larger value (order independent, as tests.oracles.reference and the high level)
        t = ts[i]
        tc = ti[s, aux]
        first = op <= OP_FIRST_F
        if first and t > tc or not first and t < tc:
            return
        if op == OP_FIRST_I or op == OP_LAST_I:
            v = ai[i, src]
            if t == tc and (v >= ti[s, dst] if first else v <= ti[s, dst]):
                return
            ti[s, dst] = v
        elif op == OP_FIRST_U or op == OP_LAST_U:
            vu = au[i, src]
            if t == tc and (vu >= tu[s, dst] if first else vu <= tu[s, dst]):
                return
            tu[s, dst] = vu
        else:
            vf = af[i, src]
            if t == tc and (vf >= tf[s, dst] if first else vf <= tf[s, dst]):
                return
            tf[s, dst] = vf
        ti[s, aux] = t
    elif op == OP_MIN_IP or op == OP_MAX_IP:
        _update_ip(tu, s, dst, au[i, src], au[i, src + 1], op == OP_MIN_IP)
    else:  # OP_DISTINCT: the argument bank holds lowlevel.hll.hash64 of the values
        reg, rank = hll_position(ad[i, src], aux)
        if rank > th[s, dst + reg]:
            th[s, dst + reg] = rank


# --- combine and finalize: vectorised, for the high level ---------------------------------------

_REDUCE = {"count": np.add, "sum": np.add, "min": np.minimum, "max": np.maximum,
           "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
           "distinct": np.maximum}


def group_starts(keys: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): a stable sort of the rows by `keys` and where each group starts."""
    n = len(keys[0]) if keys else 0
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort(tuple(reversed(keys)))  # np.lexsort is stable; last key is primary
    change = np.zeros(n, bool)
    change[0] = True
    for k in keys:
        ks = k[order]
        change[1:] |= ks[1:] != ks[:-1]
    return order, np.flatnonzero(change)


def combine_states(layout: StateLayout, keys: list[np.ndarray],
                   states: dict[str, np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Merge partial rows with equal `keys` (window first, then group keys) into one row each.

    `states` are named state columns as `StateLayout.state_columns` gives them. Row order of
    the input is the arrival order that breaks first/last time ties.
    """
    order, starts = group_starts(keys)
    out_keys = [k[order][starts] for k in keys]
    out: dict[str, np.ndarray] = {}
    for s in layout.specs:
        if s.kind == "udaf":
            from lowlevel.udafs import combine_udaf_states

            out.update(combine_udaf_states(s.name, s.udaf, states, order, starts))
            continue
        if s.dtype == "ip":
            out.update(_combine_ip(s, states, order, starts))
            continue
        col = states[s.name][order]
        if s.kind in ("first", "last"):
            t = states[s.name + "__t"][order]
            n = len(t)
            grp = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
            # per group: (smallest t, smallest value) / (largest t, largest value)
            sel = np.lexsort((col, t, grp))
            ends = np.append(starts[1:], n)[: len(starts)] - 1
            pick = sel[starts] if s.kind == "first" else sel[ends]
            out[s.name] = col[pick]
            out[s.name + "__t"] = t[pick]
        elif len(col) == 0:
            out[s.name] = col
        else:
            out[s.name] = _REDUCE[s.kind].reduceat(col, starts, axis=0)
    return out_keys, out


def _combine_ip(spec: AggSpec, states: dict[str, np.ndarray], order: np.ndarray,
                starts: np.ndarray) -> dict[str, np.ndarray]:
    """MIN/MAX over `ip` states: per group the smallest / largest (hi, lo) pair, unsigned."""
    hi_name, lo_name = ip_words(spec.name)
    hi = np.asarray(states[hi_name], np.uint64)[order]
    lo = np.asarray(states[lo_name], np.uint64)[order]
    n = len(hi)
    grp = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, n)))
    sel = np.lexsort((lo, hi, grp))
    ends = np.append(starts[1:], n)[: len(starts)] - 1
    pick = sel[starts] if spec.kind == "min" else sel[ends]
    return {hi_name: hi[pick], lo_name: lo[pick]}


def hll_estimate(registers: np.ndarray) -> np.ndarray:
    """Distinct-count estimates of HLL register rows (n, R): `lowlevel.hll.estimate`."""
    return estimate(np.asarray(registers, dtype=np.uint8))


def hll_registers(hashes: np.ndarray, registers: int) -> np.ndarray:
    """The HLL registers (uint8[R]) of a set of 64-bit hashes, computed without a hash table:
    the reference that kernel output combined per group must equal exactly."""
    regs = np.zeros(registers, np.uint8)
    h = np.asarray(hashes, dtype=np.uint64)
    if len(h):
        idx, rank = index_and_rank(h, registers)
        np.maximum.at(regs, idx, rank)
    return regs


def _mix64_np(x: np.ndarray) -> np.ndarray:
    """`mix64` over arrays (numpy)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _S30)) * _M1
        x = (x ^ (x >> _S27)) * _M2
    return x ^ (x >> _S31)


def distinct_hashes(values) -> np.ndarray:
    """The argument of a distinct sub-aggregate: `lowlevel.hll.hash64` of the values (an
    `ip` value as its (hi, lo) tuple), so registers match the reference sketch bit for bit."""
    return hash64(values)


def finalize_state(spec: AggSpec, state: np.ndarray) -> np.ndarray:
    """The result value of a combined state: HLL estimate for distinct, the value otherwise."""
    if spec.kind == "distinct":
        return hll_estimate(state)
    return state


def average(total: np.ndarray, count: np.ndarray) -> np.ndarray:
    """AVG from its SUM and COUNT super-aggregates (float64; NaN where count is 0)."""
    c = np.asarray(count, dtype=np.float64)
    t = np.asarray(total, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(c == 0, np.nan, t / c)
