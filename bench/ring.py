"""Benchmark of the packet ring between two processes: rows per second through shared memory, lossless and dropping.

    python -m bench.ring [--rows 20M] [--batch 65536] [--capacity 1M] [--repeat 3] [--json out.json]

`lossless`: the producer waits for room (spinning on `free()`: the transfer rate of the
ring itself). `dropping`: the producer never waits (the Gigascope rule), the consumer
sums one column of every batch; the table shows how much it dropped. Medians of --repeat runs.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time

import click

from tools.commands.params import COUNT


def _producer(name: str, rows: int, batch_rows: int, lossless: bool, ready, go) -> None:
    """Offer `rows` rows whose timestamps are 0, 1, 2 ...; punctuate the next id after each batch."""
    import numpy as np

    from capture.batch import PacketBatch
    from capture.ring import PacketRing

    ring = PacketRing.attach(name)
    b = PacketBatch.empty(ring.link, batch_rows)
    b.columns["timestamp"][:] = np.arange(batch_rows)
    b.columns["len"][:] = 60
    ring.push(b, 0, 0)          # warm the jitted ring core before the clock starts
    ready.set()
    go.wait()
    sent = 0
    ids = np.arange(batch_rows, dtype=np.int64)
    while sent < rows:
        m = min(batch_rows, rows - sent)
        np.add(ids, sent, out=b.columns["timestamp"])
        if lossless:
            done = 0
            while done < m:            # wait for room instead of dropping (spins: a bench, not capture)
                room = ring.free()
                if room:
                    done += ring.push(b, done, min(m, done + room))
        else:
            ring.push(b, 0, m)
        sent += m
        ring.punctuate(sent)
    ring.finish()
    ring.close()


def run_once(rows: int, batch_rows: int, capacity: int, lossless: bool) -> dict:
    from capture.ring import PacketRing

    ctx = mp.get_context("spawn")
    ring = PacketRing.create(capacity, link="bench", shared=True)
    ready, go = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_producer, args=(ring.name, rows, batch_rows, lossless, ready, go))
    proc.start()
    ready.wait()
    ring.take(1)                # warm the consumer side too (nothing offered yet)
    got = 0
    total_len = 0
    puncts = 0
    t0 = time.perf_counter()
    go.set()
    while True:
        batch, p = ring.take(batch_rows)
        if batch is not None:
            got += batch.n
            if not lossless:
                total_len += int(batch["len"].sum())
        if p is not None:
            puncts += 1
        if batch is None and p is None and ring.done:
            break
    secs = time.perf_counter() - t0
    proc.join()
    st = ring.stats()
    ring.close()
    assert st.offered == st.processed + st.dropped, st
    return {"mode": "lossless" if lossless else "dropping", "rows": rows, "received": got,
            "dropped": st.dropped, "seconds": secs, "rows_per_s": got / secs,
            "offered_per_s": st.offered / secs, "high_water": st.high_water, "punctuations": puncts}


@click.command()
@click.option("--rows", type=COUNT, default="20M", show_default=True)
@click.option("--batch", "batch_rows", type=COUNT, default=65536, show_default=True)
@click.option("--capacity", type=COUNT, default="1M", show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(rows, batch_rows, capacity, repeat, json_out):
    """Rows per second through a shared-memory PacketRing between two processes."""
    results = []
    for lossless in (True, False):
        runs = [run_once(rows, batch_rows, capacity, lossless) for _ in range(repeat)]
        med = statistics.median(r["rows_per_s"] for r in runs)
        drop = statistics.median(r["dropped"] / r["rows"] for r in runs)
        results.append({"mode": runs[0]["mode"], "median_rows_per_s": med, "median_drop_share": drop, "runs": runs})
    click.echo(f"{'mode':10} {'rows':>12} {'batch':>8} {'capacity':>10} {'M rows/s':>9} {'dropped':>8}")
    for r in results:
        click.echo(f"{r['mode']:10} {rows:12,} {batch_rows:8,} {capacity:10,} "
                   f"{r['median_rows_per_s'] / 1e6:9.2f} {r['median_drop_share']:8.1%}")
    if json_out:
        with open(json_out, "w") as fh:
            json.dump({"rows": rows, "batch": batch_rows, "capacity": capacity, "results": results}, fh, indent=2)


if __name__ == "__main__":
    sys.exit(main())
