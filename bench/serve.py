"""Benchmark of the appliance's latencies: submission to first row, and window close to tail.

    python -m bench.serve [--pps 300000] [--windows 30] [--dir DIR] [--json bench_serve.json]

Needs root, iproute2 and tcpreplay. A namespace with a veth pair is made for the run
(`tools.gen.veth`); `oopscope serve` listens on the outer end while tcpreplay sends a
generated capture in a loop at `--pps` packets per second from inside the namespace. Once
Spark is up, a per-second query (`count(*)`, `sum(len)` per second) is submitted and tailed:

- submission to first row: from `submit` to the first row at the tail, and the part of it
  that is waiting for the first window to end (the first full window begins after the
  submission, by design);
- window close to tail (after the first `WARM` batches): per window, the tail's arrival time minus the time the punctuation
  that closed it reached the server (the rows event's `closed_ns`), and minus the window's
  end (which adds the punctuation's own delay: the timer period and the lull slack).

Reports medians and p99, the rate the link saw, and the kernel's and the ring's drops. Not a
test: it prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.workloads import generated_capture

log = logging.getLogger(__name__)

QUERY = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets, sum(len) AS bytes
FROM main.IPV4
GROUP BY time AS tb;
"""


#: batches of a new query's stage left out of the latencies: its stream's first batches plan
#: and compile (the submission-to-first-row figure covers them)
WARM = 3


def _quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run(pps: int, windows: int, workdir: Path) -> dict:
    from tools.gen.traffic import TrafficConfig
    from tools.gen.veth import VethPair
    from tools.serve.testing import Server

    pcap = generated_capture(workdir / "serve-bench.pcap",
                             TrafficConfig(packets=1_000_000, duration_ns=10 * 10**9,
                                           groups=5000, tcp=0.8, udp=0.2, icmp=0.0,
                                           sizes="fixed:64", seed=1))
    with VethPair("oopbsv") as pair:
        state = Path(tempfile.mkdtemp(prefix="state-", dir=workdir))
        server = Server(["--interface", f"main={pair.outer}"], state, workdir / "serve.log")
        server.start()
        sender = None
        try:
            server.wait_spark()
            sender = subprocess.Popen(pair.inside(["tcpreplay", "-i", pair.inner,
                                                   f"--pps={pps}", "--preload-pcap",
                                                   "--loop=0", str(pcap)]),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(3)                               # the rate settles
            submitted = time.time()
            reply = server.client.submit(text=QUERY, file="persec.gsql")
            first_end = reply["first_window_ns"] / 1e9 + 1
            close_lat, end_lat = [], []
            first_row = None
            events = 0
            for event in server.client.tail("persec"):
                if event.get("event") != "rows":
                    continue
                now = time.time()
                if first_row is None:
                    first_row = now
                events += 1
                if events <= WARM:
                    continue
                cols = event["columns"]
                for row in event["rows"]:
                    tb = row[cols.index("tb")]
                    end_lat.append(now - (tb + 1))
                if event.get("closed_ns"):
                    close_lat.append(now - event["closed_ns"] / 1e9)
                if len(end_lat) >= windows:
                    break
            status = server.client.status()["links"][0]
        finally:
            if sender is not None:
                sender.terminate()
                sender.wait()
            server.stop()
    assert first_row is not None
    return {"pps_offered": pps, "pps_seen": round(status["pps"]),
            "packets": status["packets"], "kernel_drops": status["kernel_drops"],
            "ring_drops": status["ring_drops"], "windows": len(end_lat),
            "submit_to_first_row_s": round(first_row - submitted, 3),
            "of_which_waiting_for_the_first_window_s": round(first_end - submitted, 3),
            "close_to_tail_median_s": round(statistics.median(close_lat), 3),
            "close_to_tail_p99_s": round(_quantile(close_lat, 0.99), 3),
            "end_to_tail_median_s": round(statistics.median(end_lat), 3),
            "end_to_tail_p99_s": round(_quantile(end_lat, 0.99), 3)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pps", type=int, default=300_000)
    ap.add_argument("--windows", type=int, default=30)
    ap.add_argument("--dir", type=Path, default=None,
                    help="keep the capture and logs here (default: a new temporary folder)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for tool in ("tcpreplay", "ip"):
        if shutil.which(tool) is None:
            sys.exit(f"bench.serve needs {tool}")
    workdir = args.dir or Path(tempfile.mkdtemp(prefix="oopscope-bench-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    result = run(args.pps, args.windows, workdir)
    width = max(map(len, result))
    for k, v in result.items():
        print(f"{k.ljust(width)}  {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
