"""Benchmark of the low-level operator's cost per call: what one packet batch costs at the batch
sizes a ring consumer sees.

    python -m bench.percall [--groups 260000] [--table 1] [--rows 350,2048] [--repeat 3] [--json out.json]

Q8-1 (`queries/library/q8_1.gsql`) over the IOP-vs-OOP bench's generated lap (3 packets per
group per one-minute window, decoded once), planned with each flush policy and the bench's
DEFINE overrides, run as `oopscope run` runs it (`hold_rows = HOLD_ROWS`) in batches of each
`--rows` size, no ring. Per configuration: microseconds per `process` call and packets per
second (best of --repeat runs, each a fresh operator over the whole lap; the JIT is warmed
first). At a few hundred rows per call (what a consumer keeping up with a ring takes) the
fixed cost per call dominates; at 2048 the packets' own work does.
"""

from __future__ import annotations

import json
import time

import click

from tools.commands.params import COUNT


def time_calls(columns: dict, plan, rows: int) -> float:
    """Seconds for one fresh operator over the lap in batches of `rows` packets."""
    from capture.batch import PacketBatch
    from lowlevel.operator import HOLD_ROWS, LowLevelOperator

    n = len(columns["timestamp"])
    batches = [PacketBatch("main", {k: v[a:a + rows] for k, v in columns.items()})
               for a in range(0, n, rows)]
    op = LowLevelOperator(plan, hold_rows=HOLD_ROWS)
    t0 = time.perf_counter()
    for b in batches:
        op.process(b)
    return time.perf_counter() - t0


@click.command()
@click.option("--groups", type=COUNT, default=260_000, show_default=True)
@click.option("--table", "factor", type=float, default=1.0, show_default=True,
              help="Hash table size as a multiple of --groups.")
@click.option("--rows", "sizes", default="350,2048", show_default=True,
              help="Batch sizes (packets per call), comma-separated.")
@click.option("--repeat", type=int, default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(groups, factor, sizes, repeat, json_out):
    import numpy as np

    from capture.reader import read_all
    from tools.experiments import iop_oop as io
    from tools.experiments.q81 import q81_plan

    cfg = io.ThroughputConfig()
    io.warm_jit(cfg)
    path = io.make_capture(cfg, groups)
    columns = {k: np.ascontiguousarray(v) for k, v in read_all(path, "main").columns.items()}
    n = len(columns["timestamp"])
    slots = io.table_slots(groups, factor)
    results = []
    click.echo(f"Q8-1, {groups:,} groups, {slots:,} slots, {n:,} packets; best of {repeat}")
    click.echo(f"{'policy':10} {'rows/call':>9} {'us/call':>9} {'M pkts/s':>9}")
    for policy in io.POLICIES:
        plan = q81_plan(slots, policy)
        for rows in (int(x) for x in sizes.split(",")):
            best = min(time_calls(columns, plan, rows) for _ in range(repeat))
            calls = -(-n // rows)
            r = {"policy": policy, "rows": rows, "us_per_call": 1e6 * best / calls,
                 "mpps": n / best / 1e6}
            results.append(r)
            click.echo(f"{policy:10} {rows:9,} {r['us_per_call']:9.1f} {r['mpps']:9.2f}")
    if json_out:
        with open(json_out, "w") as fh:
            json.dump({"groups": groups, "slots": slots, "packets": n, "results": results},
                      fh, indent=1)


if __name__ == "__main__":
    main()
