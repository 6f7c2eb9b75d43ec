"""How many partial rows an adaptive table sends per result row, by probe count.

    python -m bench.tablesize [--groups 10000,100000,260000] [--probes 2,3,4]
                              [--window-packets 1000000] [--windows 6] [--dir DIR]

The query of `bench.sustained` (a per-10-second `count(*)`, `sum(len)` per (srcIP, destIP))
planned as `oopscope serve` plans it (an adaptive table from the default 65,536 slots, no
groups declared; punctuation closes each pane at once; rows held as the appliance holds
them) runs over a generated capture of `--windows` 10-second windows, `--window-packets`
packets each, `--groups` (srcIP, destIP) pairs met in every window, punctuated after every
batch as a link's timer would. Per group count and probe count it reports:

- partial rows per result row (result rows: the distinct (window, srcIP, destIP)), over all
  windows and at steady state (the windows after the table reached its size);
- the table's slots at the end and its resizes;
- the operator's rate over the capture decoded beforehand, in M packets/s, and its ratio to
  the first probe count's rate measured in the same run (the anchor).

Not a test; rates on a shared machine are noisy, compare within one run.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
from pathlib import Path

import click
import numpy as np

from bench.workloads import generated_capture, work_dir

log = logging.getLogger(__name__)

WINDOW_S = 10
NS = 1_000_000_000
QUERY = f"""
DEFINE {{ query_name pairs; }}
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time/{WINDOW_S} AS tb, srcIP, destIP;
"""


def make_capture(directory: Path, groups: int, window_packets: int, windows: int) -> Path:
    from tools.gen.traffic import TrafficConfig

    cfg = TrafficConfig(packets=window_packets * windows, duration_ns=windows * WINDOW_S * NS,
                        groups=groups, tcp=0.8, udp=0.2, icmp=0.0, snaplen=64, seed=groups)
    return generated_capture(directory / f"tsize_{groups}_{window_packets}_{windows}.pcap", cfg)


def plan():
    from queries.parser import parse
    from queries.planner import plan_file

    return plan_file(parse(QUERY), ["main"]).queries[0].low[0]


def decoded(path: Path, columns) -> list:
    from capture.batch import PacketBatch
    from capture.reader import open_capture

    with open_capture(path, link="main", batch_size=65536, columns=columns) as reader:
        return [PacketBatch("main", {c: a.copy() for c, a in b.columns.items()}) for b in reader]


def run(batches, probes: int, pane_ns: int) -> dict:
    """One pass of the operator as the appliance runs it: rows out, rate, table size."""
    import pyarrow as pa

    from lowlevel.operator import HOLD_ROWS, LowLevelOperator

    op = LowLevelOperator(plan(), probes=probes, hold_rows=HOLD_ROWS, punctuation_flush=True)
    out: list = []
    t0 = time.perf_counter()
    for batch in batches:
        out += op.process(batch)
        got, _ = op.punctuate(int(batch["timestamp"][-1]))
        out += got
    got, _ = op.finish()
    out += got
    secs = time.perf_counter() - t0
    assert op.engine is not None        # a windowed aggregate has a table
    packets = sum(len(b) for b in batches)
    rows = pa.Table.from_batches([b for b in out if b.num_rows])
    names = ["window", *op.schema.key_names]
    keys = rows.select(names).group_by(names).aggregate([([], "count_all")])
    per_window = {}
    tb_all = rows.column("window").to_numpy()
    tb_res = keys.column("window").to_numpy()
    for tb in np.unique(tb_res):
        per_window[int(tb)] = (int(np.count_nonzero(tb_all == tb)),
                               int(np.count_nonzero(tb_res == tb)))
    return {"seconds": secs, "packets": packets, "partial_rows": rows.num_rows,
            "result_rows": keys.num_rows, "per_window": per_window,
            "slots": op.adaptive_slots, "resizes": op.engine.resizes}


@click.command()
@click.option("--groups", "groups_opt", default="10000,100000,260000", show_default=True,
              help="Comma-separated (srcIP, destIP) pairs per window.")
@click.option("--probes", "probes_opt", default="2,3,4", show_default=True,
              help="Comma-separated probe counts (the first is the rate's anchor).")
@click.option("--window-packets", type=int, default=1_000_000, show_default=True)
@click.option("--windows", type=int, default=6, show_default=True)
@click.option("--repeat", type=int, default=3, show_default=True,
              help="Timed passes per figure (median).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              default=None, help="Keep the generated captures here for later runs.")
def main(groups_opt: str, probes_opt: str, window_packets: int, windows: int, repeat: int,
         directory: Path | None) -> None:
    """Partial rows per result row of an adaptive table, by probe count."""
    from lowlevel.operator import LowLevelOperator

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="bench_tablesize: %(message)s")
    directory = work_dir(directory, "oopscope-bench-tablesize-")
    probes_list = [int(p) for p in probes_opt.split(",")]
    columns = LowLevelOperator(plan()).read_columns
    pane_ns = WINDOW_S * NS
    warm = decoded(make_capture(directory, 1000, 20_000, 2), columns)
    for p in probes_list:
        run(warm, p, pane_ns)
    header = (f"{'groups':>7} {'probes':>6} {'rows/result':>11} {'steady':>7} {'slots':>8} "
              f"{'resizes':>7} {'M pkts/s':>8} {'ratio':>6}")
    lines = [f"{window_packets:,} packets per 10-s window, {windows} windows, median of "
             f"{repeat}", header, "-" * len(header)]
    print(lines[0], file=sys.stderr)
    for groups in (int(g) for g in groups_opt.split(",")):
        batches = decoded(make_capture(directory, groups, window_packets, windows), columns)
        run(batches, probes_list[0], pane_ns)       # first touch of the batches: not timed
        # passes interleaved by probe count, so the machine's load falls on all of them alike
        runs: dict[int, list] = {p: [] for p in probes_list}
        for _ in range(repeat):
            for p in probes_list:
                runs[p].append(run(batches, p, pane_ns))
        anchor = None
        for p in probes_list:
            r = runs[p][0]
            rate = r["packets"] / statistics.median(x["seconds"] for x in runs[p]) / 1e6
            anchor = anchor or rate
            # steady state: the windows after the first two (the table has grown by then),
            # leaving out the last (the capture may end inside it)
            later = [v for tb, v in sorted(r["per_window"].items())[2:-1]]
            steady = sum(v[0] for v in later) / max(1, sum(v[1] for v in later))
            line = (f"{groups:>7} {p:>6} {r['partial_rows'] / r['result_rows']:>11.2f} "
                    f"{steady:>7.2f} {r['slots']:>8} {r['resizes']:>7} {rate:>8.2f} "
                    f"{rate / anchor:>6.2f}")
            lines.append(line)
            print(line, file=sys.stderr)
        del batches
    print("\n".join(lines))


if __name__ == "__main__":
    main()
