"""User-defined aggregates outside the hash-table kernel: combine and output over state rows.

A UDAF's state is `size` words of one dtype, carried as the state columns `queries.plan.
udaf_words` names (docs/gsql.md "User-defined aggregates"). The kernel's `update` calls are
written by `lowlevel.specialize`; here are the steps of the high level and of the numpy
paths: `combine_udaf_states` folds the partial states of each group with the UDAF's
`combine` (in place into the group's first row, as GS-lite's HFTA does), `udaf_output` maps
`output` over combined states. Both run jitted when Numba compiles the user's function, as a
plain Python loop over groups otherwise (same results: the same function).
"""

from __future__ import annotations

import logging

import numba
import numpy as np

from queries.plan import udaf_words
from queries.udf import jitted

log = logging.getLogger(__name__)

_NOT_JITTED: set[tuple[str, str, str]] = set()


@numba.njit(nogil=True)
def _fold(combine, rows, starts, out):
    n = rows.shape[0]
    for g in range(starts.shape[0]):
        end = starts[g + 1] if g + 1 < starts.shape[0] else n
        acc = out[g]
        acc[:] = rows[starts[g]]
        for r in range(starts[g] + 1, end):
            combine(acc, rows[r])


@numba.njit(nogil=True)
def _update_each(update, rows, values):
    for r in range(rows.shape[0]):
        update(rows[r], values[r])


@numba.njit(nogil=True)
def _map(output, rows, out):
    for r in range(rows.shape[0]):
        out[r] = output(rows[r])


def _try_jit(udaf, part: str, run) -> bool:
    """Run `run(dispatcher)`; False (logged once) when Numba cannot compile `part`."""
    key = (udaf.module, udaf.name, part)
    if key in _NOT_JITTED:
        return False
    try:
        run(jitted(udaf.module, udaf.name, part))
    except (numba.core.errors.TypingError, numba.core.errors.UnsupportedError,
            numba.core.errors.LoweringError, NotImplementedError) as exc:
        _NOT_JITTED.add(key)
        log.info("user-defined aggregate %s: Numba cannot compile its %s (%s); it runs as "
                 "Python", udaf.name, part, str(exc).splitlines()[0][:200])
        return False
    return True


def state_rows(name: str, udaf, states: dict[str, np.ndarray]) -> np.ndarray:
    """The state words of a UDAF as rows (n, size) of its dtype."""
    cols = [np.asarray(states[w]) for w in udaf_words(name, udaf.size)]
    return np.ascontiguousarray(np.stack(cols, axis=1).astype(udaf.dtype, copy=False))


def fold_rows(udaf, rows: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """One combined state per group of consecutive rows starting at `starts`."""
    out = np.empty((len(starts), udaf.size), udaf.dtype)
    if len(starts) == 0:
        return out
    starts = np.asarray(starts, np.int64)
    if not _try_jit(udaf, "combine", lambda fn: _fold(fn, rows, starts, out)):
        combine = udaf.implementation().combine
        bounds = np.append(starts, len(rows))
        for g in range(len(starts)):
            acc = out[g]
            acc[:] = rows[bounds[g]]
            for r in range(bounds[g] + 1, bounds[g + 1]):
                combine(acc, rows[r])
    return out


@numba.njit(nogil=True)
def _change_each(window_change, rows):
    for r in range(rows.shape[0]):
        window_change(rows[r])


def window_changed(udaf, rows: np.ndarray) -> np.ndarray:
    """A RUNNING UDAF's states (n, size) after `window_change` (its group carried into the
    next window), in place."""
    rows = np.ascontiguousarray(rows, dtype=udaf.dtype)
    if not _try_jit(udaf, "window_change", lambda fn: _change_each(fn, rows)):
        change = udaf.implementation().window_change
        for r in range(len(rows)):
            change(rows[r])
    return rows


def combined_pairs(udaf, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """`combine(first[i], second[i])` for each i: states (n, size) of one UDAF."""
    n = len(first)
    rows = np.empty((2 * n, udaf.size), udaf.dtype)
    rows[0::2], rows[1::2] = first, second
    return fold_rows(udaf, rows, np.arange(0, 2 * n, 2, dtype=np.int64))


def single_states(udaf, values: np.ndarray) -> np.ndarray:
    """The state (n, size) of each value alone: `init` (the identity), then `update` once;
    the partial state of one input row of a query-on-query or count-window aggregation."""
    values = np.ascontiguousarray(values, dtype=np.dtype(udaf.arg_dtype))
    rows = np.ascontiguousarray(np.tile(np.asarray(udaf.identity, udaf.dtype),
                                        (len(values), 1)))
    if not _try_jit(udaf, "update", lambda fn: _update_each(fn, rows, values)):
        update = udaf.implementation().update
        for r in range(len(values)):
            update(rows[r], values[r])
    return rows


def combine_udaf_states(name: str, udaf, states: dict[str, np.ndarray], order: np.ndarray,
                        starts: np.ndarray) -> dict[str, np.ndarray]:
    """The combined state columns of one UDAF (rows sorted by `order`, groups at `starts`)."""
    rows = state_rows(name, udaf, states)[order]
    out = fold_rows(udaf, rows, starts)
    return {w: out[:, j].copy() for j, w in enumerate(udaf_words(name, udaf.size))}


def udaf_output(udaf, rows: np.ndarray) -> np.ndarray:
    """`output` of each combined state row (n, size), as the declared result type."""
    want = {"float": np.float64, "int": np.int64, "llong": np.int64}.get(udaf.returns,
                                                                          np.uint64)
    rows = np.ascontiguousarray(rows, dtype=udaf.dtype)
    out = np.empty(len(rows), np.float64 if want is np.float64 else np.int64)
    # an extractor's function takes constants besides the state: called from Python
    if udaf.extract or not _try_jit(udaf, "output", lambda fn: _map(fn, rows, out)):
        output = udaf.output_function()
        out = np.array([output(r) for r in rows], dtype=out.dtype)
    return out.astype(want)
