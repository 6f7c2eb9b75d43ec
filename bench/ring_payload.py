"""Benchmark of the packet ring's payload area: push + take of rows with payloads beside rows alone.

    python -m bench.ring_payload [--rows 1M] [--batch 65536] [--payload 200] [--repeat 5] [--json out.json]

One thread pushes a batch and takes it back (views, released by the next take) until --rows
rows have gone through: the cost of the ring itself, with no second thread to hide it. Modes:
`rows` (a ring without a payload area, the batch without payloads), `empty` (a payload area,
the batch without payloads: empty ones placed) and `payloads` (every row carries --payload
bytes, sizes spread from half to one and a half times that). The ring holds 1M rows and a
256 MiB area (the live links' sizes, `tools.pipeline.livelinks`), made once per mode and gone
through once before the clock starts (a fresh area's first lap pays a page fault every 4 KiB,
which a running capture pays once). Medians of --repeat runs on a warm JIT. Not a test.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import click

from tools.commands.params import COUNT

MODES = ("rows", "empty", "payloads")


def make_batch(rows: int, payload: int, with_payloads: bool):
    import numpy as np
    import pyarrow as pa

    from capture.batch import PacketBatch

    b = PacketBatch.empty("bench", rows)
    b.columns["timestamp"][:] = np.arange(rows)
    b.columns["len"][:] = 60
    if with_payloads:
        rng = np.random.default_rng(1)
        sizes = rng.integers(payload // 2, payload + payload // 2 + 1, rows)
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(sizes, out=offsets[1:])
        data = rng.integers(0, 256, int(offsets[-1]), dtype=np.uint8)
        b.payload = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets),
                                                              pa.py_buffer(data)])
    return b


def make_ring(mode: str, batch, payload: int):
    """The mode's ring, its kernels warm and every page of it written once."""
    from capture.ring import PacketRing
    from tools.pipeline.livelinks import RING_PAYLOAD_BYTES, RING_ROWS

    ring = PacketRing.create(RING_ROWS, link="bench",
                             payload_bytes=0 if mode == "rows" else RING_PAYLOAD_BYTES)
    rows = RING_ROWS if mode != "payloads" else max(RING_ROWS, RING_PAYLOAD_BYTES // payload)
    run_once(mode, ring, batch, rows + batch.n)
    return ring


def run_once(mode: str, ring, batch, rows: int) -> dict:
    batch_rows = batch.n
    moved = nbytes = 0
    t0 = time.perf_counter()
    while moved < rows:
        m = min(batch_rows, rows - moved)
        ring.push(batch, 0, m)
        while True:
            got, _ = ring.take(batch_rows)
            if got is None:
                break
            moved += got.n
            data = None if got.payload is None else got.payload.buffers()[2]
            nbytes += 0 if data is None else data.size
    secs = time.perf_counter() - t0
    ring.release()
    st = ring.stats()
    assert st.dropped == 0, st
    return {"mode": mode, "rows": moved, "payload_bytes": nbytes, "seconds": secs,
            "rows_per_s": moved / secs}


@click.command()
@click.option("--rows", type=COUNT, default="1M", show_default=True)
@click.option("--batch", "batch_rows", type=COUNT, default=65536, show_default=True)
@click.option("--payload", type=click.IntRange(min=2), default=200, show_default=True, help="mean payload bytes")
@click.option("--repeat", type=int, default=5, show_default=True)
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None)
def main(rows, batch_rows, payload, repeat, json_out):
    """Rows per second through a private PacketRing, with and without payloads."""
    results = []
    for mode in MODES:
        batch = make_batch(batch_rows, payload, mode == "payloads")
        ring = make_ring(mode, batch, payload)
        runs = [run_once(mode, ring, batch, rows) for _ in range(repeat)]
        results.append({"mode": mode, "median_seconds": statistics.median(r["seconds"] for r in runs),
                        "runs": runs})
    base = results[0]["median_seconds"]
    click.echo(f"{'mode':9} {'rows':>10} {'ms':>8} {'M rows/s':>9} {'GB/s':>6} {'vs rows':>8}")
    for r in results:
        secs = r["median_seconds"]
        gbs = r["runs"][0]["payload_bytes"] / secs / 1e9
        click.echo(f"{r['mode']:9} {rows:10,} {secs * 1e3:8.1f} {rows / secs / 1e6:9.2f} {gbs:6.2f} "
                   f"{secs / base:7.2f}x")
    if json_out:
        with open(json_out, "w") as fh:
            json.dump({"rows": rows, "batch": batch_rows, "payload": payload, "results": results},
                      fh, indent=2)


if __name__ == "__main__":
    sys.exit(main())
