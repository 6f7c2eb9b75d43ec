"""Benchmark of the capture reader: packets/s of `capture.reader` beside tcpdump and a dpkt loop, same file, same run.

    python -m bench.decode [--packets 5000000] [--repeat 3] [--dpkt-packets 300000]
                                 [--dir DIR] [--json bench_decode.json]

The capture is an Ethernet/IPv4 TCP+UDP file with a 64-byte snap length made by the traffic
generator (`tools.gen.traffic`), kept in --dir and reused when it is already there (without
--dir, in a fresh temporary directory removed at the end). Every timed
reader runs on a warm page cache (the file is read once first) and our reader on a warm JIT.
Figures are medians of --repeat runs, wall-clock and CPU time (CPU time is the steadier figure
on a shared machine); "vs ours" compares wall-clock rates. Not a test.
"""

from __future__ import annotations

import json
import logging
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

from bench.workloads import generated_capture, warm_file, work_dir

log = logging.getLogger(__name__)


def make_capture(path: Path, packets: int) -> Path:
    """The benchmark capture at `path` (generated once; reused while its parameters match)."""
    from tools.gen.traffic import TrafficConfig

    cfg = TrafficConfig(packets=packets, duration_ns=600 * 10**9, groups=min(50_000, packets),
                        tcp=0.8, udp=0.2, icmp=0.0, snaplen=64, sizes="imix", seed=1)
    return generated_capture(path, cfg)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def time_ours(path: Path, repeat: int) -> tuple[list[float], list[float], int]:
    """Wall and CPU seconds of full reads (batches of 128K packets)."""
    from capture.reader import open_capture

    with open_capture(path) as r:  # warm the JIT (compiled or loaded from the cache)
        for _ in r:
            break
    wall, cpu, n = [], [], 0
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        with open_capture(path, batch_size=131072) as r:
            for _batch in r:
                pass
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        n = r.stats.packets
    return wall, cpu, n


def time_tcpdump(path: Path, repeat: int) -> tuple[list[float], list[float]] | None:
    exe = shutil.which("tcpdump")
    if exe is None:
        return None
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), _children_cpu()
        subprocess.run([exe, "-r", str(path), "-w", "/dev/null"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall.append(time.perf_counter() - t0)
        cpu.append(_children_cpu() - c0)
    return wall, cpu


def time_dpkt(path: Path, limit: int) -> tuple[float, float, int]:
    """A typical dpkt loop (parse Ethernet, IP, transport ports) over the first `limit` packets."""
    import dpkt

    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.Reader(f):
            eth = dpkt.ethernet.Ethernet(buf)
            ip = eth.data
            if isinstance(ip, dpkt.ip.IP):
                _ = (ip.src, ip.dst, ip.p)
                l4 = ip.data
                if isinstance(l4, (dpkt.tcp.TCP, dpkt.udp.UDP)):
                    _ = (l4.sport, l4.dport)
            n += 1
            if n >= limit:
                break
    return time.perf_counter() - t0, time.process_time() - c0, n


@click.command()
@click.option("--packets", type=click.IntRange(min=1000), default=5_000_000, show_default=True)
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--dpkt-packets", type=click.IntRange(min=1000), default=300_000, show_default=True,
              help="dpkt is slow: time it on this prefix of the file.")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Where the capture is generated, kept and reused (default: a fresh "
                   "temporary directory, removed at the end).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default="bench_decode.json",
              show_default=True)
def main(packets: int, repeat: int, dpkt_packets: int, workdir: str | None,
         json_path: str) -> None:
    """Packets/s of the capture reader beside tcpdump and dpkt on one generated capture."""
    logging.basicConfig(level=logging.INFO, format="bench_decode: %(message)s", stream=sys.stderr)
    path = make_capture(work_dir(workdir, "oopscope-bench-decode-") / f"decode_{packets}.pcap",
                        packets)
    size = path.stat().st_size
    warm_file(path)
    wall, cpu, n = time_ours(path, repeat)
    assert n == packets, (n, packets)
    rows = [("oopscope capture.reader", n, wall, cpu)]
    tcpd = time_tcpdump(path, repeat)
    if tcpd is not None:
        rows.append(("tcpdump -r FILE -w /dev/null", n, *tcpd))
    dwall, dcpu, dn = time_dpkt(path, dpkt_packets)
    rows.append((f"dpkt loop (first {dn} packets)", dn, [dwall], [dcpu]))

    print(f"capture: {path} ({n} packets, {size / 2**20:.0f} MiB, snaplen 64); medians of {repeat} runs")
    print(f"{'reader':36} {'packets':>9} {'wall s':>7} {'Mpkt/s':>7} {'cpu s':>7} {'Mpkt/cpu-s':>10} "
          f"{'vs ours':>7}")
    ours_rate = n / statistics.median(wall)
    results = []
    for name, count, walls, cpus in rows:
        w, c = statistics.median(walls), statistics.median(cpus)
        rate, crate = count / w, count / c if c > 0 else float("nan")
        print(f"{name:36} {count:>9} {w:>7.3f} {rate / 1e6:>7.2f} {c:>7.3f} {crate / 1e6:>10.2f} "
              f"{rate / ours_rate:>7.2f}")
        results.append({"reader": name, "packets": count, "median_wall_seconds": w, "wall_seconds": walls,
                        "median_cpu_seconds": c, "cpu_seconds": cpus, "packets_per_second": rate,
                        "packets_per_cpu_second": crate})
    Path(json_path).write_text(json.dumps({"capture": str(path), "packets": n, "bytes": size,
                                           "repeat": repeat, "results": results}, indent=2) + "\n")
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
