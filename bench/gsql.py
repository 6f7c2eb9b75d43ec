"""Benchmarks of the GS-lite parts: CSV record parsing, the cost of carrying payloads, and
getlpmid's lookups.

    python -m bench.gsql [--records 1000000] [--packets 1000000] [--repeat 5] [--dir DIR]

- records: `capture.records.RecordReader` over a file of GS-lite's CSV_EXAMPLE records (nine
  fields of every type, 1000 distinct strings), records/s and MB/s;
- payload: the Q8-1 low level over `bench.lowlevel`'s capture (read, decode, aggregate), CPU
  time, without and with the payload column a `TCP_data` query asks for, alternated;
- getlpmid: `lowlevel.lpm.lookup` of IPv4 addresses in a table of 5000 random prefixes.

Inputs are made once in --dir (kept and reused) or in a temporary directory; every figure is
taken on a warm JIT and page cache, the median of --repeat runs. Not a test.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click

from bench.workloads import warm_file, work_dir

SCHEMA = Path(__file__).resolve().parents[1] / "tests" / "queries" / "fixtures" / "gslite" / \
    "packet_schema.txt"


def make_records(path: Path, n: int) -> Path:
    """n CSV_EXAMPLE records at `path` (made once; reused while the count matches)."""
    import numpy as np

    if path.exists() and path.stat().st_size and path.with_suffix(".n").exists() \
            and path.with_suffix(".n").read_text() == str(n):
        return path
    rng = np.random.default_rng(7)
    cols = [
        rng.integers(0, 2**32, n).astype(str),
        rng.integers(0, 2**63, n).astype(str),
        np.char.add("10.0.0.", rng.integers(0, 256, n).astype(str)),
        np.char.add("2001:db8::", np.char.mod("%x", rng.integers(0, 65536, n))),
        np.char.add("name", rng.integers(0, 1000, n).astype(str)),
        rng.choice(np.array(["TRUE", "FALSE"]), n),
        rng.integers(-2**31, 2**31, n).astype(str),
        rng.integers(-2**62, 2**62, n).astype(str),
        np.round(rng.random(n) * 1e4, 3).astype(str),
    ]
    lines = cols[0]
    for c in cols[1:]:
        lines = np.char.add(np.char.add(lines, ","), c)
    path.write_text("\n".join(lines.tolist()) + "\n")
    path.with_suffix(".n").write_text(str(n))
    return path


def records_rate(path: Path, repeat: int) -> tuple[float, float]:
    """Median records/s and MB/s of reading `path` whole."""
    from capture.records import RecordReader
    from queries.schemafile import load_schema

    fmt = load_schema([SCHEMA]).record_format("CSV_EXAMPLE")
    assert fmt is not None
    rates, mbs = [], []
    for k in range(repeat + 1):
        t0 = time.perf_counter()
        reader = RecordReader(str(path), fmt, "csv")
        n = sum(len(b) for b in reader)
        dt = time.perf_counter() - t0
        if reader.stats.malformed:      # a malformed benchmark file measures the wrong path
            raise click.ClickException(f"{path}: {reader.stats.malformed} records skipped: "
                                       f"{reader.stats.reasons}")
        if k:                           # the first read compiles or loads the kernels
            rates.append(n / dt)
            mbs.append(reader.stats.bytes / dt / 1e6)
    return statistics.median(rates), statistics.median(mbs)


def payload_rates(directory: Path, packets: int, repeat: int) -> dict[str, float]:
    """Median packets/s (CPU time) of the Q8-1 low level, without and with payloads."""
    import bench.lowlevel as BL
    from capture.reader import open_capture
    from lowlevel.operator import LowLevelOperator

    path = BL.make_capture(directory, 66_000, packets)
    plan = BL.q81_plan(65536, "oop_lazy")
    warm_file(path)

    def once(extra: tuple[str, ...]) -> float:
        op = LowLevelOperator(plan)
        columns = tuple(op.read_columns or ()) + extra
        c0, n = time.process_time(), 0
        with open_capture(path, link="main", batch_size=65536, columns=columns) as reader:
            for batch in reader:
                n += len(batch)
                op.process(batch)
                op.punctuate(int(batch["timestamp"][-1]))
        op.finish()
        return n / (time.process_time() - c0)

    runs: dict[tuple[str, ...], list[float]] = {(): [], ("payload",): []}
    for extra in runs:
        once(extra)                     # warm
    for _ in range(repeat):
        for extra in runs:
            runs[extra].append(once(extra))
    return {"without payload" if not e else "with payload": statistics.median(v)
            for e, v in runs.items()}


def lpm_rate(directory: Path, repeat: int) -> tuple[float, int]:
    """Median lookups/s of 2M IPv4 addresses in a table of 5000 random prefixes."""
    import numpy as np

    from lowlevel import lpm
    from queries.prefixfile import load_table

    rng = np.random.default_rng(5)
    prefixes: set[tuple[int, int]] = set()
    while len(prefixes) < 5000:         # distinct networks (a prefix given twice is refused)
        length = int(rng.integers(8, 33))
        prefixes.add((int(rng.integers(0, 2**32)) >> (32 - length) << (32 - length), length))
    path = directory / "prefixes.tbl"
    path.write_text("".join(
        f"{'.'.join(str((v >> s) & 255) for s in (24, 16, 8, 0))}/{n}|{k + 1}\n"
        for k, (v, n) in enumerate(sorted(prefixes))))
    table = load_table(str(path))
    mapped = np.uint64(0xFFFF << 32)
    addrs = (rng.integers(0, 2**32, 2_000_000, dtype=np.uint64) | mapped)
    lpm.lookup(table, addrs[:10])       # compile
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        lpm.lookup(table, addrs)
        rates.append(len(addrs) / (time.perf_counter() - t0))
    return statistics.median(rates), len(table.ids)


@click.command()
@click.option("--records", type=int, default=1_000_000, show_default=True)
@click.option("--packets", type=int, default=1_000_000, show_default=True)
@click.option("--repeat", type=int, default=5, show_default=True)
@click.option("--dir", "directory", default=None, help="Keep the inputs here (reused).")
def main(records: int, packets: int, repeat: int, directory: str | None) -> None:
    where = work_dir(directory, "oopscope-bench-gsql-")
    data = make_records(where / "records.csv", records)
    warm_file(data)
    rate, mb = records_rate(data, repeat)
    click.echo(f"records   {rate / 1e6:6.2f} M records/s  {mb:6.0f} MB/s  "
               f"({records:,} CSV_EXAMPLE records)")
    for what, pps in payload_rates(where, packets, repeat).items():
        click.echo(f"q8_1 low level, {what:15s} {pps / 1e6:6.2f} M pkts/s (CPU time)")
    lookups, intervals = lpm_rate(where, repeat)
    click.echo(f"getlpmid  {lookups / 1e6:6.2f} M lookups/s over {intervals:,} intervals")


if __name__ == "__main__":
    main()
