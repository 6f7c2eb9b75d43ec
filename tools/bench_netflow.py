"""Benchmark of NetFlow metering: `oopscope run netflow` end to end beside softflowd and nfpcapd.

    python -m tools.bench_netflow [--packets 5M] [--flows N] [--flow-duration 5s | --spread]
                                  [--dir /tmp/oopscope-bench-nf] [--repeat 3] [--timeout 900]
                                  [--json bench_netflow.json]

The capture (`oopscope gen`, kept in --dir and reused while its parameters match) has many
flows: --flows (default packets / 10, so 500K flows at 5M packets) 5-tuples over 10 minutes,
70% TCP (SYN first, FIN last), 28% UDP, 2% ICMP, 10% IPv6, 96-byte snaps. By default the
traffic is bursty as real traffic is: each flow lives for an exponential time of mean
--flow-duration (5 s) starting at a random moment, and its packets (Poisson, ~10 on average:
a few to tens) fall within that life. So a flow is one record, a few thousand flows are open
at a time, and a TCP flow ends on its FIN. `--spread` keeps the former shape: every flow's
packets spread over the whole 10 minutes, so with the 15 s idle timeout of netflow.gsql
nearly every packet is a flow record of its own (4M records from 5M packets), which no real
link looks like; it stresses the flow table's evictions and the Spark stage's row volume.

The capture is metered by:
- oopscope: `oopscope run netflow --link main=FILE --output netflow=OUT.csv` (a fresh process:
  Python, Numba and Spark start-up included, as a user runs it);
- softflowd: `softflowd -r FILE -a -v 9 -d -6 -n 127.0.0.1:PORT` into a running nfcapd (the time
  is softflowd's own run; nfcapd is stopped afterwards and its flow count read);
- nfpcapd: `nfpcapd -r FILE -w DIR`.
With --repeat N the tools run in turns (oopscope, softflowd, nfpcapd, oopscope, ...), so a
change in the machine's load hits them alike; the table gives medians, and each ratio is the
median of the per-turn ratios. The page cache is warm (the capture was just written or read).
A tool that fails or times out is reported with its status and the last line of its error
output. Prints a table of seconds, packets/s and flow records, and writes the JSON. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]


def count(text: str) -> int:
    from tools.params import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tools.cli", *args]


def make_capture(path: Path, packets: int, flows: int, flow_duration: str | None) -> Path:
    """The capture (generated once; reused while its parameters match). `flow_duration`:
    mean flow life ("5s"), or None for flows spread over the whole capture."""
    stamp = path.with_name(path.name + ".params")
    params = f"{packets} {flows} {flow_duration or 'spread'}"
    if path.exists() and stamp.exists() and stamp.read_text() == params:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    groups = max(1, min(flows, max(flows // 8, 1000)))
    cmd = _cli("gen", str(path), "-n", str(packets), "--duration", "10min", "--groups",
               str(groups), "--flows", str(flows), "--tcp", "0.7", "--udp", "0.28", "--icmp",
               "0.02", "--snaplen", "96", "--ipv6", "0.1", "--seed", "7")
    if flow_duration:
        cmd += ["--flow-duration", flow_duration]
    log.info("generating: %s", " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=REPO)
    stamp.write_text(params)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(cmd: list[str], timeout: float, cwd=None) -> dict:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout after {timeout:.0f} s", "seconds": None}
    except FileNotFoundError as exc:
        return {"status": f"not installed: {exc.filename}", "seconds": None}
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        return {"status": f"exit {proc.returncode}: {tail[0][:160]}", "seconds": seconds}
    return {"status": "ok", "seconds": seconds, "stderr": proc.stderr[-2000:]}


def run_oopscope(capture: Path, work: Path, timeout: float) -> dict:
    out = work / "netflow.csv"
    out.unlink(missing_ok=True)
    res = _timed(_cli("run", "netflow", "--link", f"main={capture}", "--output",
                      f"netflow={out}"), timeout, cwd=REPO)
    if res["status"] == "ok" and out.exists():
        res["flows"] = max(0, sum(1 for _ in open(out)) - 1)
    return res


def run_softflowd(capture: Path, work: Path, timeout: float) -> dict:
    if not (shutil.which("softflowd") and shutil.which("nfcapd")):
        return {"status": "softflowd or nfcapd not installed", "seconds": None}
    flowdir = Path(tempfile.mkdtemp(dir=work, prefix="softflowd-"))
    port = _free_port()
    collector = subprocess.Popen(["nfcapd", "-B", "33554432", "-b", "127.0.0.1", "-p", str(port),
                                  "-w", str(flowdir)], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT)
    time.sleep(0.5)
    try:
        # without -c/-p: with a control socket softflowd does not exit at the end of the file
        res = _timed(["softflowd", "-r", str(capture), "-a", "-v", "9", "-d", "-6",
                      "-n", f"127.0.0.1:{port}"], timeout)
    finally:
        time.sleep(0.5)
        collector.send_signal(signal.SIGTERM)
        text, _ = collector.communicate(timeout=60)
    m = re.search(r"Flows: (\d+)", text.decode(errors="replace"))
    if m:
        res["flows"] = int(m.group(1))
    return res


def run_nfpcapd(capture: Path, work: Path, timeout: float) -> dict:
    if not shutil.which("nfpcapd"):
        return {"status": "nfpcapd not installed", "seconds": None}
    flowdir = Path(tempfile.mkdtemp(dir=work, prefix="nfpcapd-"))
    res = _timed(["nfpcapd", "-r", str(capture), "-w", str(flowdir)], timeout)
    if res["status"] == "ok" and shutil.which("nfdump"):
        info = subprocess.run(["nfdump", "-R", str(flowdir), "-I"], capture_output=True,
                              text=True, timeout=120).stdout
        m = re.search(r"^Flows: (\d+)", info, re.M)
        if m:
            res["flows"] = int(m.group(1))
    return res


TOOLS = {"oopscope": run_oopscope, "softflowd": run_softflowd, "nfpcapd": run_nfpcapd}


def _median_ratio(runs: dict, a: str, b: str) -> float | None:
    """Median over turns of (b's seconds / a's seconds): how many times faster a is."""
    pairs = [rb["seconds"] / ra["seconds"] for ra, rb in zip(runs[a], runs[b])
             if ra["status"] == "ok" and rb["status"] == "ok"]
    return statistics.median(pairs) if pairs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packets", type=count, default=count("5M"))
    ap.add_argument("--flows", type=count, default=None, help="5-tuples (default packets / 10)")
    shape = ap.add_mutually_exclusive_group()
    shape.add_argument("--flow-duration", default="5s",
                       help="mean life of a flow (bursty traffic; default 5s)")
    shape.add_argument("--spread", action="store_true",
                       help="every flow spans the whole capture (the former, unrealistic shape)")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "oopscope-bench-nf")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per tool run")
    ap.add_argument("--repeat", type=int, default=1, help="turns (medians over them)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset")
    ap.add_argument("--json", type=Path, default=Path("bench_netflow.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bench_netflow: %(message)s", stream=sys.stderr)

    flows = args.flows or max(1, args.packets // 10)
    flow_duration = None if args.spread else args.flow_duration
    name = f"netflow-{args.packets}-{flows}-{flow_duration or 'spread'}.pcap"
    capture = make_capture(args.dir / name, args.packets, flows, flow_duration)
    tools = args.tools.split(",")
    runs: dict[str, list] = {t: [] for t in tools}
    for turn in range(max(1, args.repeat)):
        for tool in tools:
            log.info("turn %d: running %s", turn + 1, tool)
            r = TOOLS[tool](capture, args.dir, args.timeout)
            r.pop("stderr", None)
            log.info("turn %d: %s %s", turn + 1, tool, r)
            runs[tool].append(r)
    results = {}
    for tool in tools:
        ok = [r["seconds"] for r in runs[tool] if r["status"] == "ok"]
        best = dict(runs[tool][-1])
        best["seconds"] = statistics.median(ok) if ok else best.get("seconds")
        best["pkts_per_s"] = args.packets / best["seconds"] if ok else None
        best["runs"] = [r["seconds"] for r in runs[tool]]
        results[tool] = best

    print(f"capture: {capture} ({args.packets:,} packets, {flows:,} flows, "
          f"{'flows spread over 10 min' if args.spread else 'mean flow life ' + flow_duration}"
          f"; medians of {max(1, args.repeat)} turn(s))")
    print(f"{'tool':<10} {'seconds':>9} {'pkts/s':>12} {'records':>9}  status")
    for tool, r in results.items():
        secs = f"{r['seconds']:.1f}" if r.get("seconds") else "-"
        rate = f"{r['pkts_per_s']:,.0f}" if r.get("pkts_per_s") else "-"
        print(f"{tool:<10} {secs:>9} {rate:>12} {r.get('flows', '-'):>9}  {r['status']}")
    ratios = {}
    if "oopscope" in runs:
        for other in ("softflowd", "nfpcapd"):
            if other in runs:
                ratio = _median_ratio(runs, "oopscope", other)
                if ratio is not None:
                    ratios[other] = ratio
                    print(f"oopscope vs {other}: {ratio:.2f}x as fast (median of per-turn ratios)")
    args.json.write_text(json.dumps({"packets": args.packets, "flows": flows,
                                     "flow_duration": flow_duration, "capture": str(capture),
                                     "results": results, "speedup": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
