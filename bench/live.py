"""Benchmark of live capture: tcpreplay at top speed into a veth pair while oopscope's TPACKET_V3 capture, then tcpdump, listen.

    python -m bench.live [--seconds 5] [--repeat 3] [--packets 100000] [--size 64] [--senders 1]
                               [--dir DIR] [--json bench_live.json]

Needs root, iproute2, tcpreplay and tcpdump. A namespace with a veth pair is made for the run
(`tools.gen.veth`); a capture of small packets (`--size` bytes, TCP and UDP, from the traffic
generator) is replayed in a loop for `--seconds` with `tcpreplay --topspeed` from inside the
namespace while one capturer listens on the outer end:
- `oopscope`: `capture.live.LiveCapture` with its default ring (64 x 4 MiB blocks), every
  packet decoded into the batch columns and counted;
- `oopscope-2MiB`: the same with a ring the size of tcpdump's default buffer (4 x 512 KiB
  blocks, libpcap's geometry for a 256 KiB snap length), the like-for-like comparison;
- `tcpdump`: `tcpdump -i IF -w /dev/null` (its defaults: 2 MiB buffer, 256 KiB snap length).
Per run: packets sent (tcpreplay), arrived at the interface (its rx_packets counter: what the
veth delivered), captured, dropped by the kernel at the socket (PACKET_STATISTICS; tcpdump's
"dropped by kernel"), and the rates over tcpreplay's send time (medians; drops also as the worst run and the number of runs
with any). `--senders N` runs N tcpreplays at once (more
load than one sender can make, and competition for the two cores). Medians of --repeat runs.
The capturer runs in this process, tcpreplay in a child on the other core. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.workloads import generated_capture, work_dir

log = logging.getLogger(__name__)

TOOLS = ("tcpreplay", "tcpdump", "ip")


def make_capture(path: Path, packets: int, size: int) -> Path:
    """The replayed capture (generated once, reused while its parameters match)."""
    from tools.gen.traffic import TrafficConfig

    cfg = TrafficConfig(packets=packets, duration_ns=10 * 10**9, groups=min(5000, packets), tcp=0.8, udp=0.2,
                        icmp=0.0, sizes=f"fixed:{size}", seed=1)
    return generated_capture(path, cfg)


def _rx_packets(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/statistics/rx_packets").read_text())


def _replay_cmd(pair, pcap: Path, seconds: float) -> list[str]:
    return pair.inside(["tcpreplay", "-i", pair.inner, "--topspeed", "--preload-pcap", "--loop=0",
                        f"--duration={max(1, round(seconds))}", str(pcap)])


def _sent(outputs: list[str]) -> tuple[int, float]:
    """Packets sent by every tcpreplay and the longest send time (from their reports)."""
    total, secs = 0, 0.0
    for out in outputs:
        m = re.search(r"Actual: (\d+) packets \(\d+ bytes\) sent in ([\d.]+) seconds", out)
        if not m:
            raise RuntimeError(f"tcpreplay printed no packet count: {out[-400:]}")
        total += int(m.group(1))
        secs = max(secs, float(m.group(2)))
    return total, secs


def _start_replays(pair, pcap: Path, seconds: float, senders: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(_replay_cmd(pair, pcap, seconds), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for _ in range(senders)]


def _finish_replays(replays: list[subprocess.Popen]) -> tuple[int, float]:
    return _sent([r.communicate()[0] for r in replays])


def run_ours(pair, pcap: Path, seconds: float, senders: int, **ring) -> dict:
    """One replay captured by LiveCapture: every batch decoded (in poll) and counted."""
    from capture.live import LiveCapture

    with LiveCapture(pair.outer, **ring) as cap:
        cap.poll(0)                      # compiles (or loads) the kernels before the clock starts
        rx0 = _rx_packets(pair.outer)
        cpu0 = time.process_time()
        start = time.perf_counter()
        replays = _start_replays(pair, pcap, seconds, senders)
        captured = tcp = 0
        while any(r.poll() is None for r in replays):
            b = cap.poll(0.05)
            if b is not None:
                captured += len(b)
                tcp += int((b["protocol"] == 6).sum())   # touch a decoded column, as a query would
        wall = time.perf_counter() - start
        while (b := cap.poll(0.3)) is not None:          # what the last blocks still hold
            captured += len(b)
            tcp += int((b["protocol"] == 6).sum())
        cpu = time.process_time() - cpu0
        st = cap.stats
        sent, send_s = _finish_replays(replays)
        return {"sent": sent, "send_s": send_s, "arrived": _rx_packets(pair.outer) - rx0, "captured": captured,
                "kernel_drops": st.kernel_drops, "kernel_packets": st.kernel_packets, "freezes": st.freezes,
                "replay_s": wall, "cpu_s": cpu, "malformed": st.malformed, "tcp": tcp}


def run_tcpdump(pair, pcap: Path, seconds: float, senders: int) -> dict:
    """One replay captured by `tcpdump -w /dev/null`; its counts come from its exit report."""
    rx0 = _rx_packets(pair.outer)
    dump = subprocess.Popen(["tcpdump", "-i", pair.outer, "-w", "/dev/null"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    # wait for "listening on": packets before that would not be seen
    assert dump.stderr is not None   # stderr=PIPE
    line = dump.stderr.readline()
    if "listening" not in line:
        dump.kill()
        raise RuntimeError(f"tcpdump did not start: {line.strip()}")
    start = time.perf_counter()
    sent, send_s = _finish_replays(_start_replays(pair, pcap, seconds, senders))
    wall = time.perf_counter() - start
    time.sleep(1.5)                       # tcpdump hands over a block after 1 s at most: let it
    dump.send_signal(signal.SIGINT)
    err = dump.communicate(timeout=30)[1]

    def count(what: str) -> int:
        m = re.search(rf"(\d+) packets? {what}", err)
        return int(m.group(1)) if m else -1

    return {"sent": sent, "send_s": send_s, "arrived": _rx_packets(pair.outer) - rx0,
            "captured": count("captured"), "kernel_drops": count("dropped by kernel"),
            "kernel_packets": count("received by filter"), "replay_s": wall}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def summarize(name: str, runs: list[dict]) -> dict:
    row: dict[str, object] = {"capturer": name, "runs": runs}
    for k in ("sent", "arrived", "captured", "kernel_drops", "send_s"):
        row[k] = _median(runs, k)
    # rates over tcpreplay's own send time (its preload and start-up excluded)
    row["sent_pps"] = statistics.median(r["sent"] / r["send_s"] for r in runs)
    row["captured_pps"] = statistics.median(r["captured"] / r["send_s"] for r in runs)
    row["drop_share"] = statistics.median(r["kernel_drops"] / max(1, r["arrived"]) for r in runs)
    # drops are rare events: the median hides them, so the worst run and the sum are shown too
    row["kernel_drops_max"] = max(r["kernel_drops"] for r in runs)
    row["kernel_drops_total"] = sum(r["kernel_drops"] for r in runs)
    row["runs_with_drops"] = sum(1 for r in runs if r["kernel_drops"] > 0)
    if "cpu_s" in runs[0]:
        row["cpu_ns_per_packet"] = statistics.median(r["cpu_s"] * 1e9 / max(1, r["captured"]) for r in runs)
    return row


def print_table(rows: list[dict]) -> None:
    head = (f"{'capturer':<15}{'sent':>11}{'arrived':>11}{'captured':>11}{'k.drops':>10}{'max drops':>10}"
            f"{'runs w/ drops':>14}{'drop %':>8}"
            f"{'sent/s':>11}{'capt/s':>11}{'cpu ns/pkt':>11}")
    print(head)
    print("-" * len(head))
    for r in rows:
        cpu = f"{r['cpu_ns_per_packet']:.0f}" if "cpu_ns_per_packet" in r else "-"
        print(f"{r['capturer']:<15}{r['sent']:>11,.0f}{r['arrived']:>11,.0f}{r['captured']:>11,.0f}"
              f"{r['kernel_drops']:>10,.0f}{r['kernel_drops_max']:>10,}{r['runs_with_drops']:>14}"
              f"{100 * r['drop_share']:>8.2f}{r['sent_pps']:>11,.0f}"
              f"{r['captured_pps']:>11,.0f}{cpu:>11}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="replay time per run (default 5)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per capturer; medians reported (default 3)")
    ap.add_argument("--packets", type=int, default=100_000, help="packets in the replayed capture (looped)")
    ap.add_argument("--size", type=int, default=64, help="wire length of every packet (default 64)")
    ap.add_argument("--senders", type=int, default=1, help="tcpreplay processes sending at once (default 1)")
    ap.add_argument("--dir", default=None, help="where the capture is kept and reused (default: "
                    "a fresh temporary directory, removed at the end)")
    ap.add_argument("--json", dest="json_path", help="write the results as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)

    from tools.gen.veth import VethPair, can_make_pairs

    why = can_make_pairs()
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if why or missing:
        print(f"bench_live: {why or 'missing tools: ' + ', '.join(missing)}", file=sys.stderr)
        return 2
    pcap = make_capture(work_dir(args.dir, "oopscope-bench-live-")
                        / f"live_{args.packets}_{args.size}.pcap", args.packets, args.size)
    capturers = {
        "oopscope": lambda p: run_ours(p, pcap, args.seconds, args.senders),
        "oopscope-2MiB": lambda p: run_ours(p, pcap, args.seconds, args.senders, block_size=1 << 19, block_count=4),
        "tcpdump": lambda p: run_tcpdump(p, pcap, args.seconds, args.senders),
    }
    results: dict[str, list[dict]] = {k: [] for k in capturers}
    with VethPair("oopb") as pair:
        for i in range(args.repeat):
            for name, run in capturers.items():   # interleaved, so machine noise hits all alike
                r = run(pair)
                log.info("run %d %s: sent %d captured %d kernel drops %d in %.2f s", i + 1, name, r["sent"],
                         r["captured"], r["kernel_drops"], r["send_s"])
                results[name].append(r)
    rows = [summarize(name, runs) for name, runs in results.items()]
    print_table(rows)
    if args.json_path:
        doc = {"benchmark": "live", "seconds": args.seconds, "senders": args.senders, "repeat": args.repeat, "packets": args.packets,
               "size": args.size, "results": rows}
        Path(args.json_path).write_text(json.dumps(doc, indent=2) + "\n")
        log.info("wrote %s", args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
