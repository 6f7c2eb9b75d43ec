"""Benchmark of a served NETFLOW link's lanes: its reader and lanes on one clock vs two.

    python -m bench.flowlanes [--records 400k] [--repeat 7] [--dir DIR]

A capture of IPFIX datagrams (oopscope's own exporter; --records flows of random 5-tuples
starting over 10 minutes, lasting up to 30 s, exported in order of flow end) is read by
`capture.flowreader.FlowReader` as a served link reads it, and each batch is handed to the
link's lanes (`tools.pipeline.flowlinks.FlowLane`) and taken from their queues as the router
takes it: with the `first` lane alone (the reader melding one clock), and with a `last` lane
too (melding both). The two run in turns; the table gives medians and the ratio two / one
(the anchor: one clock, measured in the same run). Not a test.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def make_capture(path: Path, records: int) -> None:
    """`records` flows as IPFIX datagrams in a capture."""
    import pyarrow as pa

    from tools.netflow.exporter import Exporter

    rng = np.random.default_rng(1)
    t0 = 1_700_000_000 * 10**9
    first = t0 + np.sort(rng.integers(0, 600 * 10**9, records))
    last = first + rng.integers(0, 30 * 10**9, records)
    order = np.argsort(last, kind="stable")
    ips = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" for i in range(records)]
    table = pa.table({"srcIP": ips, "destIP": ips,
                      "srcPort": rng.integers(1, 65535, records),
                      "destPort": rng.integers(1, 65535, records),
                      "protocol": np.full(records, 6), "packets": rng.integers(1, 100, records),
                      "bytes": rng.integers(40, 100_000, records),
                      "first_ns": first[order], "last_ns": last[order]})
    ex = Exporter(None, 10, pcap=str(path))
    ex.export(table)
    ex.close()


def read_once(pcap: Path, clocks: tuple[str, ...]) -> tuple[int, float]:
    """(records, seconds) of the reader and the lanes of `clocks`, drained as the router
    drains them."""
    from capture.flowreader import FlowReader
    from capture.punctuation import LinkTimer
    from capture.recordqueue import RecordQueue
    from capture.schema import BUILTIN
    from tools.pipeline.flowlinks import FlowLane

    fmt = BUILTIN.record_format("NETFLOW")
    assert fmt is not None
    reader = FlowReader(pcap, fmt, "r1", 8192, clocks=clocks[1:])
    lanes = [FlowLane(c, RecordQueue(1 << 22, "r1"), LinkTimer(0, 0)) for c in clocks]
    records = 0
    started = time.perf_counter()
    for batch in reader:
        records += len(batch)
        for lane in lanes:
            lane.hand_on(batch, reader.clock, (batch.punctuations or {}).get(lane.clock))
            lane.tick()
            while lane.ring.take(65536) != (None, None):
                pass
            lane.ring.release()
    return records, time.perf_counter() - started


def count(text: str) -> int:
    from tools.commands.params import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=count, default=400_000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--dir", type=Path, default=None, help="where the capture is kept")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    work = args.dir or Path(tempfile.mkdtemp(prefix="oopscope-flowlanes-"))
    work.mkdir(parents=True, exist_ok=True)
    pcap = work / f"flows-{args.records}.pcap"
    if not pcap.exists():
        log.info("making %s", pcap)
        make_capture(pcap, args.records)
    read_once(pcap, ("first",))                 # Numba's compilation, the page cache
    cases = {"one clock": ("first",), "two clocks": ("first", "last")}
    times: dict[str, list[float]] = {k: [] for k in cases}
    records = 0
    for _ in range(args.repeat):
        for name, clocks in cases.items():
            records, seconds = read_once(pcap, clocks)
            times[name].append(seconds)
    for name, ts in times.items():
        med = float(np.median(ts))
        print(f"{name:11s} {records} records  median {med:.3f} s  "
              f"{records / med / 1e6:.2f} M records/s")
    ratios = [b / a for a, b in zip(times["one clock"], times["two clocks"])]
    print(f"two / one: {float(np.median(ratios)):.3f} (median of {args.repeat} turns)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
