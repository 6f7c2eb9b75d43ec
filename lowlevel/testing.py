"""Testing helpers for the low level: packet streams with punctuation, a driver, a plain reference.

Used by the project's tests and usable by anyone checking a low-level change: `make_stream`
builds timestamps in one of three arrival orders (in order, band disorder, block-sorted) with
*grammatical* punctuation (never violated by a later packet), `run_stream` feeds a
`HashAggregator` batch by batch and records every output row with the event that produced it,
`reference_groups` computes each (window, group) result in one plain pandas pass,
`finalize` finishes the combined partial rows of a planned query as the high level does, and
`patent_segments` gives the patent's late-data example.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lowlevel.aggregates import StateLayout, combine_states, hll_registers
from lowlevel.engine import HashAggregator, Partials

ORDERS = ("in_order", "band", "block")

#: the patent's late-data example (docs/semantics.md "Late data"): arrivals in minutes, "P" =
#: punctuation at that minute (patent p[49]-p[52])
PATENT_ARRIVALS = "1 3 2 4 1 2 P5 3 4 6 8 P10 11 7 2 3 9 12 P15".split()
PATENT_MINUTES = [int(a) for a in PATENT_ARRIVALS if not a.startswith("P")]


def patent_segments(ns_per_minute: int = 60_000_000_000) -> list[tuple[list[int], int]]:
    """[(packet minutes, punctuation ns)]: the patent's arrivals cut at each punctuation."""
    out: list[tuple[list[int], int]] = []
    cur: list[int] = []
    for a in PATENT_ARRIVALS:
        if a.startswith("P"):
            out.append((cur, int(a[1:]) * ns_per_minute))
            cur = []
        else:
            cur.append(int(a))
    return out


@dataclass
class Stream:
    """Packets in arrival order and punctuation events: `puncts[j] = (after_packet, p)`."""

    ts: np.ndarray
    keys: np.ndarray
    args: tuple
    valid: np.ndarray
    puncts: list[tuple[int, int]] = field(default_factory=list)


def arrival_order(ts: np.ndarray, order: str, rng: np.random.Generator, band: int = 0,
                  block: int = 1) -> np.ndarray:
    """A permutation of packets (given sorted by time) into an arrival order."""
    n = len(ts)
    if order == "in_order" or n == 0:
        return np.arange(n)
    if order == "band":
        # each packet arrives as if its time were up to `band` later
        key = ts + rng.integers(0, band + 1, n)
        return np.argsort(key, kind="stable")
    if order == "block":
        # consecutive blocks keep their order, packets inside a block are shuffled
        idx = np.arange(n)
        for s in range(0, n, block):
            rng.shuffle(idx[s:s + block])
        return idx
    raise ValueError(order)


def grammatical_punctuation(ts_arrival: np.ndarray, rng: np.random.Generator,
                            every: int) -> list[tuple[int, int]]:
    """Punctuation after random packets: p <= every later packet's time (monotone)."""
    n = len(ts_arrival)
    if n == 0:
        return []
    suffix_min = np.minimum.accumulate(ts_arrival[::-1])[::-1]
    out = []
    last = None
    for j in range(n - 1):
        if rng.integers(0, every) == 0:
            p = int(suffix_min[j + 1]) - int(rng.integers(0, 3))
            if last is None or p > last:
                out.append((j, p))
                last = p
    return out


@dataclass
class Run:
    """What a run produced: rows (in emission order), the event index of each row, the input
    punctuation in force before that event, and the output punctuations with their event."""

    rows: Partials
    row_event: np.ndarray
    row_in_punct: np.ndarray
    out_puncts: list[tuple[int, int]]
    counters: dict
    #: (input punctuation, the aggregator's output punctuation right after it, None before any)
    punct_pairs: list[tuple[int, int | None]] = field(default_factory=list)


def run_stream(agg: HashAggregator, stream: Stream, batch: int = 7) -> Run:
    """Feed the stream in batches of `batch` packets (split at punctuation), then finish."""
    chunks, events, inp = [], [], []
    outs: list[tuple[int, int]] = []
    pairs: list[tuple[int, int | None]] = []
    event = 0
    in_p = np.iinfo(np.int64).min
    n = len(stream.ts)
    cuts = sorted({j + 1 for j, _ in stream.puncts} | set(range(0, n, max(1, batch))) | {n})
    punct_at = {j + 1: p for j, p in stream.puncts}
    a0 = 0
    for a1 in cuts:
        if a1 > a0:
            sl = slice(a0, a1)
            got = agg.append(stream.ts[sl], stream.keys[sl],
                             tuple(a[sl] for a in stream.args), stream.valid[sl])
            for c in got:
                chunks.append(c)
                events.append(np.full(len(c), event))
                inp.append(np.full(len(c), in_p))
            event += 1
            a0 = a1
        if a1 in punct_at:
            got, p = agg.punctuate(punct_at[a1])
            for c in got:
                chunks.append(c)
                events.append(np.full(len(c), event))
                inp.append(np.full(len(c), in_p))
            if p is not None:
                outs.append((event, p))
            pairs.append((punct_at[a1], agg.out_punct))
            in_p = max(in_p, punct_at[a1])
            event += 1
    got, p = agg.finish()
    for c in got:
        chunks.append(c)
        events.append(np.full(len(c), event))
        inp.append(np.full(len(c), in_p))
    outs.append((event, p))
    rows = Partials.concat(chunks, agg.layout, agg.nkeys)
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64))
    return Run(rows, cat(events), cat(inp), outs, agg.counters, pairs)


def combined(layout: StateLayout, rows: Partials) -> pd.DataFrame:
    """Partial rows merged per (window, keys...) as a DataFrame indexed by those keys."""
    nk = rows.keys.shape[1]
    keys = [rows.window] + [rows.keys[:, j] for j in range(nk)]
    out_keys, states = combine_states(layout, keys, layout.state_columns(rows.banks))
    return _frame(layout, out_keys, states, nk)


def reference_groups(layout: StateLayout, stream: Stream, pane_ns: int,
                     offset_ns: int = 0, keep: np.ndarray | None = None) -> pd.DataFrame:
    """Each (window, group)'s sub-aggregate states computed directly (pandas + numpy)."""
    sel = stream.valid.copy() if keep is None else stream.valid & keep
    ts = stream.ts[sel]
    nk = stream.keys.shape[1]
    window = (ts + offset_ns) // pane_ns
    cols = {"window": window, "ts": ts, "arrival": np.arange(len(ts))}
    for j in range(nk):
        cols[f"k{j}"] = stream.keys[sel, j]
    df = pd.DataFrame(cols)
    by = ["window"] + [f"k{j}" for j in range(nk)]
    groups = df.groupby(by, sort=True).indices if len(df) else {}
    out_keys: list[list] = [[] for _ in by]
    states: dict[str, list] = {name: [] for name in layout.columns}
    banks = dict(zip("iufd", stream.args))
    for gkey, idx in groups.items():
        gkey = gkey if isinstance(gkey, tuple) else (gkey,)
        for j, v in enumerate(gkey):
            out_keys[j].append(v)
        idx = np.asarray(idx)
        for s in layout.specs:
            st = states[s.name]
            if s.kind == "count":
                st.append(len(idx))
                continue
            bank, col = layout.arg_columns[s.name]
            v = banks[bank][sel][idx, col]
            if s.kind == "distinct":
                st.append(hll_registers(v, s.registers))
            elif s.kind == "sum":
                st.append(v.sum(dtype=v.dtype))
            elif s.kind in ("min", "max", "and", "or", "xor"):
                f = {"min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
                     "or": np.bitwise_or, "xor": np.bitwise_xor}[s.kind]
                st.append(f.reduce(v))
            else:
                t = ts[idx]
                pos = np.lexsort((v, t))   # by time, ties by value
                pick = pos[0] if s.kind == "first" else pos[-1]
                st.append(v[pick])
                states[s.name + "__t"].append(t[pick])
    return _frame(layout, [np.asarray(k) for k in out_keys], {k: np.asarray(v) for k, v in states.items()}, nk)


def _frame(layout: StateLayout, keys, states, nk) -> pd.DataFrame:
    cols: dict[str, np.ndarray | list[bytes]] = {"window": np.asarray(keys[0], np.int64)}
    for j in range(nk):
        cols[f"k{j}"] = np.asarray(keys[j + 1], np.uint64)
    for name, v in states.items():
        v = np.asarray(v)
        cols[name] = [bytes(r) for r in v.astype(np.uint8)] if v.ndim == 2 else v
    df = pd.DataFrame(cols)
    return df.sort_values(["window"] + [f"k{j}" for j in range(nk)]).reset_index(drop=True)


def finalize(qp, table) -> pd.DataFrame:
    """Combined partial rows (`partials.combine_partials`) of a planned aggregate query
    finished as the high level does: finals, then the SELECT outputs (ip as 128-bit ints)."""
    import pyarrow as pa

    from lowlevel.aggregates import hll_estimate
    from lowlevel.evaluate import evaluate_columns

    hp = qp.high
    w = hp.window
    cols: dict = {w.column: table.column("window").to_numpy() * w.scale + w.shift}
    for k in hp.keys:
        if k.type == "ip":
            cols[k.name] = (table.column(k.name + "__hi").to_numpy(),
                            table.column(k.name + "__lo").to_numpy())
        else:
            cols[k.name] = table.column(k.name).to_numpy()
    states: dict[str, Any] = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_binary(col.type):
            states[name] = np.frombuffer(col.buffers()[1], np.uint8).reshape(len(col), -1)
        else:
            states[name] = col.to_numpy()
    for name in [n for n in states if n.endswith("__hi") and n[:-4] + "__lo" in states]:
        # MIN/MAX over an address: its two halves, as an ip value (hi, lo)
        states[name[:-4]] = (states[name].astype(np.uint64),
                             states[name[:-4] + "__lo"].astype(np.uint64))
    for f in hp.finals:
        if getattr(f.expr, "name", None) == "hll_estimate":
            cols[f.name] = hll_estimate(states[f.expr.args["args"][0].name])
        else:
            cols[f.name] = evaluate_columns(f.expr, states, table.num_rows)
    frame = {}
    for o in hp.outputs:
        v = evaluate_columns(o.expr, cols, table.num_rows)
        if isinstance(v, tuple):
            v = [(int(h) << 64) | int(lo) for h, lo in zip(*v)]
        frame[o.name] = list(v)
    return pd.DataFrame(frame, columns=[o.name for o in hp.outputs])
