"""Benchmarks of GS-lite's sequential operators: the sampling kernel and the running close.

    python -m bench.sampling [--rows 1000000] [--groups 20000] [--repeat 5]

- sampling: the manual's dynamic subset-sum query (sample size 100) and its flow sampling
  query over one window of --rows rows of --groups (srcIP, destIP) pairs: the window's
  preparation as `highlevel.sampling` does it (order of the rows, supergroup and group codes)
  and the compiled kernel (`rows` then `finish`), rows/s of each; the anchor, in the same run,
  is numpy's sort of the rows' timestamps (the least any order-dependent operator does);
- running: `highlevel.running.step_windows` over 10 windows in which each of --groups groups
  has a row with probability 1/2 (CLOSING_WHEN count(*) = 0): (window, group) rows/s.

Every figure is the median of --repeat runs on a warm JIT. Not a test.
"""

from __future__ import annotations

import statistics
import time

import click
import numpy as np
import pyarrow as pa

SUBSET_SUM = """\
SELECT tb, srcIP, destIP, UMAX(sum(len), ssthreshold()) AS est
FROM main.TCP
WHERE ssample(len, 100) = TRUE
GROUP BY time/20 AS tb, srcIP, destIP
HAVING ssfinal_clean(sum(len)) = TRUE
CLEANING_WHEN ssdo_clean() = TRUE
CLEANING_BY ssclean_with(sum(len)) = TRUE
"""

FLOWS = """\
SELECT tb, srcIP, destIP, count(*) AS n, UMAX(sum(len), ssthreshold()) AS est
FROM main.TCP
WHERE flow_ssample(100) = TRUE
GROUP BY time/20 AS tb, srcIP, destIP
HAVING flow_ssfinal_clean(Or_Aggr(flags & 1) | Or_Aggr((flags / 4) & 1), 5, max(time),
                          sum(len)) = TRUE
CLEANING_WHEN flow_ssdo_clean(max$(time)) = TRUE
CLEANING_BY flow_ssclean_with(Or_Aggr(flags & 1) | Or_Aggr((flags / 4) & 1), 5, max(time),
                              sum(len)) = TRUE
"""


def _median(fn, repeat: int) -> float:
    fn()                                    # warm: JIT and caches
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def window_rows(n: int, groups: int, seed: int = 3) -> pa.Table:
    """One 20-second window of rows in the projected layout of both queries."""
    rng = np.random.default_rng(seed)
    pair = rng.zipf(1.3, n) % groups
    start = 1_700_000_000 * 10**9
    ts = np.sort(start + rng.integers(0, 20 * 10**9, n))
    return pa.table({
        "__link": pa.array(np.full(n, "main")),
        "window": pa.array(ts),
        "src": pa.array(pair // 256), "dst": pa.array(pair % 256),
        "len": pa.array(rng.choice([40, 60, 576, 1500], n)),
        "time": pa.array(ts // 10**9),
        "fin": pa.array((rng.random(n) < 0.05).astype(np.int64)),
        "rst": pa.array((rng.random(n) < 0.01).astype(np.int64)),
    })


def sampling_rates(text: str, table: pa.Table, repeat: int) -> dict[str, float]:
    from highlevel import stateful as S
    from highlevel.running import key_codes
    from highlevel.sampling import canonical_order
    from highlevel.sampling_kernel import compile_kernel
    from queries.planner import plan_text

    plan = plan_text(text, ["main"]).queries[0].high.sampling
    assert plan is not None                 # a sampling query
    kernel = compile_kernel(plan)
    n = table.num_rows
    by_expr = {"srcIP": "src", "destIP": "dst", "len": "len", "time": "time",
               "flags & 1": "fin", "flags / 4 & 1": "rst"}
    from queries.printer import to_gsql

    names = [by_expr[to_gsql(c.expr)] for c in plan.columns]
    P = np.stack([np.asarray(table.column(c).to_numpy(), np.float64) for c in names], axis=1)
    gid, ng = key_codes(table, ["src", "dst"])

    def prepare():
        order = canonical_order(table, ("main",), [(c, "llong") for c in ("src", "dst", "len")])
        key_codes(table.take(pa.array(order)), ["src", "dst"])

    def run():
        states = np.zeros((1, S.WORDS))
        S.clean_init(states[0])
        cd = np.zeros(1, np.int64)
        ns, na = len(plan.super_aggregates), len(plan.aggregates)
        sagg = np.full((1, ns), np.nan)
        agg, shadow = np.zeros((ng, na)), np.zeros((ng, ns))
        alive, first, cur = np.zeros(ng, bool), np.full(ng, -1), np.full(ng, -1)
        ent_g, ent_next = np.zeros(n, np.int64), np.zeros(n, np.int64)
        head, tail, counts = np.full(1, -1), np.full(1, -1), np.zeros(4, np.int64)
        sgi = np.zeros(n, np.int64)
        kernel.rows(P, sgi, gid, 0.0, states, cd, sagg, agg, shadow, alive, first, cur, ent_g,
                    ent_next, head, tail, counts)
        kernel.finish(0.0, states, cd, sagg, agg, shadow, alive, first, cur, ent_g, ent_next,
                      head, tail, P, counts)

    ts = np.asarray(table.column("window").to_numpy())
    rng = np.random.default_rng(1)
    shuffled = rng.permutation(ts)
    return {"sort anchor": n / _median(lambda: np.sort(shuffled), repeat),
            "prepare": n / _median(prepare, repeat),
            "kernel": n / _median(run, repeat)}


def running_rate(groups: int, repeat: int) -> float:
    from highlevel.running import step_windows

    rng = np.random.default_rng(5)
    parts = []
    for w in range(10):
        present = np.flatnonzero(rng.random(groups) < 0.5)
        parts.append(pa.table({"window": pa.array(np.full(len(present), w, np.int64)),
                               "key": pa.array(present.astype(np.int64)),
                               "cnt": pa.array(np.ones(len(present), np.int64))}))
    closed = pa.concat_tables(parts)

    def closing(step: pa.Table) -> np.ndarray:
        return np.asarray(step.column("cnt").to_numpy()) == 0

    filled = step_windows(closed, None, None, ["key"], {"cnt": 0}, closing)[0]
    return filled.num_rows / _median(
        lambda: step_windows(closed, None, None, ["key"], {"cnt": 0}, closing), repeat)


@click.command()
@click.option("--rows", default=1_000_000, show_default=True)
@click.option("--groups", default=20_000, show_default=True)
@click.option("--repeat", default=5, show_default=True)
def main(rows: int, groups: int, repeat: int) -> None:
    table = window_rows(rows, groups)
    for name, text in (("subset-sum", SUBSET_SUM), ("flow sampling", FLOWS)):
        r = sampling_rates(text, table, repeat)
        click.echo(f"{name}: kernel {r['kernel'] / 1e6:.2f} M rows/s, window preparation "
                   f"{r['prepare'] / 1e6:.2f} M rows/s; sort anchor "
                   f"{r['sort anchor'] / 1e6:.2f} M rows/s (kernel / anchor "
                   f"{r['kernel'] / r['sort anchor']:.2f})")
    click.echo(f"running close (CLOSING_WHEN): {running_rate(groups, repeat) / 1e6:.2f} M "
               f"(window, group) rows/s")


if __name__ == "__main__":
    main()
