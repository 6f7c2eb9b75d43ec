"""Benchmark of NetFlow input: `oopscope run --netflow-in` beside nfcapd on the same datagrams.

    python -m bench.netflow_in [--records 3M] [--versions 9,10] [--repeat 2]
                               [--rates 25k,50k,100k,200k,400k] [--no-top] [--paced-nfcapd]
                               [--tools oopscope,nfcapd]
                               [--dir DIR] [--timeout 600] [--json bench_netflow_in.json]

The datagrams are made once per version (kept in --dir and reused while their parameters
match): a router's flows (`tools.experiments.nfdisorder.router_flows`: flows cut and exported
at every minute's cache purge, a purge's records in hash order, ~1.3 records a flow) encoded
by oopscope's own exporter as NetFlow v9 and IPFIX datagrams (1472-byte payloads: ~30 v9
records, ~25 IPFIX records each), templates every 64 datagrams.

Each receiver is started on a free loopback port and, once ready, gets every datagram from
one sending socket of this process (a loopback UDP replay):

- oopscope: `oopscope run Q --netflow-in r1=127.0.0.1:PORT --netflow-in-active-timeout 60s
  --output q=OUT.csv --progress` with Q a GROUP BY on the records (sum(bytes), count(*) per
  srcIP per minute of `first`); ready once its progress line no longer says Spark is
  starting. Its records come from the run's summary (`link r1: N records`);
- nfcapd: `nfcapd -w DIR -b 127.0.0.1 -p PORT -B 33554432`; its records from `nfdump -R DIR
  -I` once it is stopped.

The time runs from the first datagram sent until the receiver is done with what it got:
for nfcapd, its socket's receive queue first seen empty after the last datagram went out
(it reads and stores one datagram at a time); for oopscope, whose own thread empties the
socket into a queue, when its low level was done with the last record, as its summary says
(`link r1: the low level was done with the last record at T`, wall clock to the
microsecond), once its progress line has not changed for 3 s (the line's own end point,
the last change of the records it counts, has the line's 0.5 s period: `progress_seconds`
in the JSON). records/s is the records
the receiver kept over that time; `behind` is how long after the last datagram went out the
receiver was done. oopscope's windows close as the exporter's clock passes them: `rows+` is
how much later its result rows last changed (the Spark stage writing the windows closed
last); the records of the last minute (within the 60 s active timeout) are released and
their windows written at the stop, not timed. Before the receiver is stopped the
socket's drops are read (`/proc/net/udp`'s `drops` for its port) with its buffer size (`ss -u
-a -m`'s `rb`); records missing = sent - kept.

Two measurements:
- top speed: every datagram as fast as the sending loop goes; each tool --repeat times in
  turns, the best (most records/s) kept, and oopscope's ratio to nfcapd per version;
- loss-free rate: oopscope (v9) paced at each of --rates records/s over ~10 s of datagrams
  each (fewer when --records runs out), in increasing order until a rate drops datagrams at
  the socket: the highest rate with none is the answer. As the run's own thread empties the
  socket into a queue (bounded at 262,144 datagrams), a rate past what it decodes drops
  nothing for a while but falls behind: the highest rate it kept pace with (`behind` at most
  1 s) is given too.

The machine's load average is printed at the start and the end. Not a test.
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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.workloads import REPO, cli, kept_capture, work_dir

log = logging.getLogger(__name__)

QUERY = ("DEFINE { query_name q; }\n"
         "SELECT tb, srcIP, sum(bytes) AS b, count(*) AS n FROM r1.NETFLOW\n"
         "GROUP BY first/60000000000 AS tb, srcIP;\n")
#: the exporter's cache purge interval (router_flows), and so its active timeout
ACTIVE_TIMEOUT = "60s"
#: the progress line's period is 0.5 s: unchanged this long, the run has settled
SETTLE_S = 3.0
#: ... and this long when it has not counted every record sent (some may have been dropped)
UNDERCOUNT_SETTLE_S = 15.0


def count(text: str) -> int:
    from tools.commands.params import parse_count

    try:
        return parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass
class Datagrams:
    version: int
    payloads: list
    records: list        # records per datagram

    @property
    def total(self) -> int:
        return sum(self.records)


def ten_seconds(dg: Datagrams, rate: float) -> int:
    """How many of the first datagrams hold ~10 s of records at `rate` records/s."""
    limit, total = 0, 0
    while limit < len(dg.records) and total < rate * 10:
        total += dg.records[limit]
        limit += 1
    return limit


def make_datagrams(directory: Path, records: int, version: int) -> Datagrams:
    """The router's export as `version` datagrams (module docstring), made once."""
    from capture.flowdecode import FlowDecoder
    from capture.flowsource import read_datagrams
    from tools.experiments.nfdisorder import RouterConfig, router_flows, write_datagrams

    # ~1.33 records a flow with 20 s flows and 60 s purges
    cfg = RouterConfig(flows=max(1000, int(records / 1.33)), duration_s=1800, sources=20_000)
    pcap = directory / f"router-{cfg.flows}-v{version}.pcap"
    kept_capture(pcap, repr((cfg, version)),
                 lambda p: write_datagrams(router_flows(cfg), p, version))
    dg = read_datagrams(pcap)
    # records per datagram (the first ones carry templates; each is decoded in turn)
    dec = FlowDecoder()
    cols = dec.decode(dg.payloads, ["127.0.0.1"] * len(dg), list(range(len(dg))))
    per = [0] * len(dg)
    import numpy as np

    for i, n in zip(*np.unique(cols["arrival"], return_counts=True)):
        per[int(i)] = int(n)
    return Datagrams(version, dg.payloads, per)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def socket_stats(port: int, ss: bool = True) -> dict:
    """The receiving socket's drops and receive queue (/proc/net/udp) and buffer (ss -m rb)
    on `port`."""
    out: dict = {"drops": None, "rcvbuf": None}
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1] == f"0100007F:{port:04X}":
            out["drops"] = int(f[-1])
            out["rx_queue"] = int(f[4].split(":")[1], 16)
    if ss and shutil.which("ss"):
        text = subprocess.run(["ss", "-u", "-a", "-m", "-n", "sport", "=", f":{port}"],
                              capture_output=True, text=True).stdout
        m = re.search(r"skmem:\(r\d+,rb(\d+),.*?d(\d+)\)", text)
        if m:
            out["rcvbuf"] = int(m.group(1))
            out["ss_drops"] = int(m.group(2))
    return out


def replay(dg: Datagrams, port: int, rate: float | None, limit: int | None = None) -> dict:
    """Send the datagrams (the first `limit`) to 127.0.0.1:port, at `rate` records/s or as
    fast as the loop goes; returns the datagrams and records sent and the seconds taken."""
    payloads = dg.payloads[:limit]
    per = dg.records[:limit]
    target = ("127.0.0.1", port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        send = s.sendto
        wall0 = time.time()
        t0 = time.perf_counter()
        if rate is None:
            for p in payloads:
                send(p, target)
        else:
            sent_records, chunk = 0, 16
            for a in range(0, len(payloads), chunk):
                due = t0 + sent_records / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                for p in payloads[a:a + chunk]:
                    send(p, target)
                sent_records += sum(per[a:a + chunk])
        seconds = time.perf_counter() - t0
    return {"datagrams": len(payloads), "records": sum(per), "send_seconds": seconds,
            "t0": t0, "wall0": wall0}


def await_drained(port: int, after: float, deadline: float) -> float:
    """When the socket's receive queue was first seen empty past `after` (the replay's end)."""
    while time.perf_counter() < deadline:
        now = time.perf_counter()
        if now >= after and not socket_stats(port, ss=False).get("rx_queue"):
            return now
        time.sleep(0.001)
    return time.perf_counter()


_PROGRESS = re.compile(r"^oopscope: ([\d,]+) packets .*?, ([\d,]+) result rows", re.M)


def await_settled(err_path: Path, port: int, after: float,
                  deadline: float, expected: int | None = None) -> tuple[float, float]:
    """When oopscope's progress line last changed its records handed on and its result rows
    written, once neither has changed for SETTLE_S past `after` (over as many lines as that
    takes: a busy process may delay its progress thread) and the socket is drained. Short of
    the `expected` records, UNDERCOUNT_SETTLE_S of no change: a starved run (load ~20 on two
    cores) can hand on no batch for SETTLE_S while it still has records queued."""
    changed = [after, after]
    seen: list = [None, None]
    pos, same = 0, 0
    while time.perf_counter() < deadline:
        with open(err_path) as f:
            f.seek(pos)
            text = f.read()
            pos = f.tell()
        now = time.perf_counter()
        for m in _PROGRESS.finditer(text):
            same += 1
            for k in (0, 1):
                if m.group(k + 1) != seen[k]:
                    seen[k], changed[k], same = m.group(k + 1), now, 0
        wait = SETTLE_S if expected is None or seen[0] is None or \
            int(seen[0].replace(",", "")) >= expected else UNDERCOUNT_SETTLE_S
        if now - max(*changed, after) >= wait and same >= wait / 0.5 - 1 and \
                not socket_stats(port, ss=False).get("rx_queue"):
            return max(changed[0], after), max(changed[1], after)
        time.sleep(0.1)
    return time.perf_counter(), time.perf_counter()


def run_oopscope(dg: Datagrams, work: Path, rate: float | None, timeout: float,
                 limit: int | None = None) -> dict:
    port = _free_port()
    (work / "q.gsql").write_text(QUERY)
    out = work / "q.csv"
    out.unlink(missing_ok=True)
    err_path = work / "oopscope.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cli("run", str(work / "q.gsql"), "--netflow-in",
                                    f"r1=127.0.0.1:{port}", "--netflow-in-active-timeout",
                                    ACTIVE_TIMEOUT, "--output", f"q={out}", "--progress"),
                                cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.perf_counter() + timeout
    try:
        # ready: the socket bound and Spark up (the progress line stops saying it starts)
        while time.perf_counter() < deadline and proc.poll() is None:
            lines = err_path.read_text().splitlines()
            if lines and lines[-1].startswith("oopscope: ") and "Spark starting" not in \
                    lines[-1]:
                break
            time.sleep(0.2)
        if proc.poll() is not None:
            return {"status": f"exit {proc.returncode}: {_tail(err_path)}"}
        time.sleep(1.0)                     # the start's own work settles
        sent = replay(dg, port, rate, limit)
        end, rows_end = await_settled(err_path, port, sent["t0"] + sent["send_seconds"],
                                      deadline, sent["records"])
        sock = socket_stats(port)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=max(10.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return {"status": f"timeout after {timeout:.0f} s"}
    text = err_path.read_text()
    m = re.search(r"link r1: (\d+) records", text)
    if proc.returncode != 0 or not m:
        return {"status": f"exit {proc.returncode}: {_tail(err_path)}"}
    gaps = re.search(r"(\d+) sequence gaps", text)
    # the run's own end point (its summary): when the low level was done with the last
    # record, to the microsecond, where the progress line changes every 0.5 s
    done = re.search(r"link r1: the low level was done with the last record at ([\d.]+)", text)
    progress_end = end
    if done:
        end = sent["t0"] + float(done.group(1)) - sent["wall0"]
    return _result(sent, end, int(m.group(1)), sock, progress_seconds=progress_end - sent["t0"],
                   sequence_gaps=int(gaps.group(1)) if gaps else None,
                   rows_after_s=max(0.0, rows_end - end),
                   rows=max(0, sum(1 for _ in open(out)) - 1) if out.exists() else 0)


def run_nfcapd(dg: Datagrams, work: Path, rate: float | None, timeout: float,
               limit: int | None = None) -> dict:
    if not (shutil.which("nfcapd") and shutil.which("nfdump")):
        return {"status": "nfcapd or nfdump not installed"}
    flowdir = Path(tempfile.mkdtemp(dir=work, prefix="nfcapd-"))
    port = _free_port()
    proc = subprocess.Popen(["nfcapd", "-w", str(flowdir), "-b", "127.0.0.1", "-p", str(port),
                             "-B", "33554432"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.perf_counter() + timeout
    try:
        while socket_stats(port)["drops"] is None and proc.poll() is None:
            time.sleep(0.1)
        if proc.poll() is not None:
            return {"status": f"nfcapd exited {proc.returncode} at start"}
        time.sleep(0.5)
        sent = replay(dg, port, rate, limit)
        end = await_drained(port, sent["t0"] + sent["send_seconds"], deadline)
        sock = socket_stats(port)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        info = subprocess.run(["nfdump", "-R", str(flowdir), "-I"], capture_output=True,
                              text=True, timeout=120).stdout
        m = re.search(r"^Flows: (\d+)", info, re.M)
        return _result(sent, end, int(m.group(1)) if m else 0, sock)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(flowdir, ignore_errors=True)


def _result(sent: dict, end: float, kept: int, sock: dict, **more) -> dict:
    seconds = end - sent["t0"]
    return {"status": "ok", "records_sent": sent["records"], "datagrams_sent": sent["datagrams"],
            "send_seconds": sent["send_seconds"],
            "offered_per_s": sent["records"] / sent["send_seconds"],
            "records_kept": kept, "missing": sent["records"] - kept, "seconds": seconds,
            "records_per_s": kept / seconds if seconds > 0 else None, **sock, **more}


def _tail(path: Path) -> str:
    lines = [x for x in path.read_text().strip().splitlines()
             if not x.startswith("oopscope: ")]
    return lines[-1][:200] if lines else ""


TOOLS = {"oopscope": run_oopscope, "nfcapd": run_nfcapd}


def _row(tool: str, r: dict) -> str:
    if r.get("status") != "ok":
        return f"{tool:<10} {r.get('status')}"
    rows = r.get("rows_after_s")
    return (f"{tool:<10} {r['records_sent']:>10,} {r['offered_per_s']:>12,.0f} "
            f"{r['records_kept']:>10,} {r['missing']:>9,} {r['drops']!s:>8} "
            f"{r['seconds']:>7.1f} {r['seconds'] - r['send_seconds']:>7.1f} "
            f"{r['records_per_s']:>12,.0f} {'-' if rows is None else f'{rows:.1f}':>6}")


HEADER = (f"{'tool':<10} {'sent':>10} {'offered/s':>12} {'kept':>10} {'missing':>9} "
          f"{'drops':>8} {'seconds':>7} {'behind':>7} {'records/s':>12} {'rows+':>6}")
#: a paced run keeps pace when done within this long of the last datagram (the progress
#: line's period and a window's write)
KEEP_PACE_S = 1.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=count, default=count("3M"),
                    help="flow records in the replay (default 3M)")
    ap.add_argument("--versions", default="9,10", help="NetFlow versions (9, 10 = IPFIX)")
    ap.add_argument("--repeat", type=int, default=2,
                    help="top-speed runs per tool and version, in turns (the best is kept)")
    ap.add_argument("--no-top", action="store_true", help="skip the top-speed runs")
    ap.add_argument("--rates", default="25k,50k,100k,200k,400k",
                    help="records/s for oopscope's loss-free rate (empty: skip)")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset")
    ap.add_argument("--paced-nfcapd", action="store_true",
                    help="run nfcapd at the same --rates after oopscope (its drops there)")
    ap.add_argument("--dir", type=Path, default=None,
                    help="where the datagrams are kept and reused (default: a fresh temporary "
                         "directory, removed at the end)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--json", type=Path, default=Path("bench_netflow_in.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bench_netflow_in: %(message)s",
                        stream=sys.stderr)
    args.dir = work_dir(args.dir, "oopscope-bench-nfin-")
    tools = args.tools.split(",")
    report: dict = {"load_start": os.getloadavg(), "cpus": os.cpu_count(), "top": {},
                    "rates": []}
    datagrams = {v: make_datagrams(args.dir, args.records, int(v))
                 for v in args.versions.split(",")}
    for v, dg in ({} if args.no_top else datagrams).items():
        runs: dict[str, list] = {t: [] for t in tools}
        for turn in range(max(1, args.repeat)):
            for tool in tools:
                log.info("v%s, turn %d: %s at top speed", v, turn + 1, tool)
                r = TOOLS[tool](dg, args.dir, None, args.timeout)
                log.info("v%s, turn %d: %s %s", v, turn + 1, tool, r)
                runs[tool].append(r)
        best = {t: max(rs, key=lambda r: r.get("records_per_s") or 0) for t, rs in runs.items()}
        report["top"][v] = {"records": dg.total, "datagrams": len(dg.payloads), "best": best,
                            "runs": runs}
        print(f"v{v} at top speed: {dg.total:,} records in {len(dg.payloads):,} datagrams "
              f"(best of {max(1, args.repeat)})")
        print(HEADER)
        for t, r in best.items():
            print(_row(t, r))
        a, b = best.get("oopscope", {}), best.get("nfcapd", {})
        if a.get("records_per_s") and b.get("records_per_s"):
            ratio = a["records_per_s"] / b["records_per_s"]
            report["top"][v]["ratio"] = ratio
            print(f"oopscope / nfcapd records/s: {ratio:.2f}")
        print()
    rates = [count(x) for x in args.rates.split(",") if x]
    if rates and "oopscope" in tools:
        dg = datagrams.get("9") or next(iter(datagrams.values()))
        print(f"oopscope, v{dg.version} paced (~10 s of datagrams each)")
        print(HEADER)
        for rate in sorted(rates):
            r = run_oopscope(dg, args.dir, float(rate), args.timeout, ten_seconds(dg, rate))
            r["rate"] = rate
            report["rates"].append(r)
            print(_row("oopscope", r))
            if r.get("status") != "ok" or (r.get("drops") or 0) > 0 or r["missing"] > 0:
                break
        clean = [r for r in report["rates"]
                 if r.get("status") == "ok" and not r.get("drops") and not r["missing"]]
        report["loss_free_rate"] = max((r["rate"] for r in clean), default=None)
        # without drops, a rate past what the run decodes fills its own queue instead
        paced = [r["rate"] for r in clean if r["seconds"] - r["send_seconds"] <= KEEP_PACE_S]
        report["kept_pace_rate"] = max(paced, default=None)
        print(f"highest rate without drops: {report['loss_free_rate']}; highest it kept pace "
              f"with (done within {KEEP_PACE_S} s of the last datagram): "
              f"{report['kept_pace_rate']}")
    if rates and args.paced_nfcapd:
        dg = datagrams.get("9") or next(iter(datagrams.values()))
        print(f"nfcapd, v{dg.version} paced (~10 s of datagrams each)")
        print(HEADER)
        report["nfcapd_rates"] = []
        for rate in sorted(rates):
            r = run_nfcapd(dg, args.dir, float(rate), args.timeout, ten_seconds(dg, rate))
            r["rate"] = rate
            report["nfcapd_rates"].append(r)
            print(_row("nfcapd", r))
    report["load_end"] = os.getloadavg()
    print(f"load average {report['load_start'][0]:.1f} at start, {report['load_end'][0]:.1f} "
          f"at end, on {report['cpus']} CPUs")
    args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
