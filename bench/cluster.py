"""Benchmark of the scale-out work: `--fanout N` capacity, and two agents with one collector against one process.

    python -m bench.cluster [--parts fanout-offline,fanout-live,collector] [--repeat 3]
                            [--packets 10000000] [--loads 150000,top,top2] [--speed 20]
                            [--dir DIR] [--json bench_cluster.json]
    python -m bench.cluster --report bench_cluster.json      # print a saved run again

Three parts, each run --repeat times (interleaved, so machine noise hits the variants alike),
medians and min-max reported:

- `fanout-offline`: the capacity of the low level per process. One generated capture
  (Q8-1 shape: Ethernet/IPv4 TCP+UDP, 64-byte snaps, 10 minutes, 260K groups, `--flows`
  5-tuples) is also written as two halves split by a symmetric 5-tuple hash (what
  PACKET_FANOUT's hash mode gives each socket: `bench.workloads.flow_split_captures`).
  Worker processes (this module with `--worker`) warm the JIT and the page cache, then on a
  signal run the shipped q8_1 low level (`bench.lowlevel.time_operator`: read, decode,
  sub-aggregate, punctuate) over their file: 1 worker over the whole file, then 2 workers
  at once over one half each. Reported: packets/s of 1 process, the aggregate of 2 (all
  packets over the slower worker's time) and the ratio; beside it the same ratio for a CPU
  anchor (a pure-Python loop: what the two cores give two processes at the time, with the
  machine's other work), and whole `oopscope agent q8_1 --link main=F --spool D` processes
  (spool in /dev/shm): launch to exit, and with the start-up taken out (against the same
  agents over a 200K-packet capture).
- `fanout-live` (root, iproute2, tcpreplay, tcpdump): tcpreplay offers a small-packet
  capture into a veth pair from its namespace, at each of `--loads` (packets/s, `top` for
  --topspeed, `top2` for two of them), while `oopscope run q8_1 --interface main=OUTER
  --fanout 1`, then `--fanout 2`, then `tcpdump -w /dev/null` listen. Ours is stopped with
  SIGTERM after the replay; its summary gives packets, ring and kernel drops. The replay
  starts once the capture sockets are bound and Spark's start-up has gone quiet.
- `collector`: a generated two-link capture (20 minutes of data, 50K groups); `oopscope
  collect --links l0,l1` (local[*]) is started first, as a standing collector would be, and
  once its Spark start-up has gone quiet two `oopscope agent` processes replay one link each
  at `--speed` x real time into one spool. Every 0.5 s the spool and the collector's Spark
  checkpoint are sampled: spool files written and not yet in a committed micro-batch, the
  age of the oldest of them, and the punctuation lag (newest punctuation in the spool,
  minimum over the links, minus that of the files the collector has committed) in wall
  seconds; their maxima over the first and the second half of the replay say whether the
  lag grows. Against it: `oopscope run` over both files in one process at the same speed,
  launch to exit.

Warm JIT (a small run of each command first), warm page cache. Not a test.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.workloads import REPO, cli, flow_split_captures, generated_capture, warm_file, work_dir

log = logging.getLogger(__name__)

Q8_1_FILE = REPO / "queries" / "library" / "q8_1.gsql"
#: thesis Q8-2 (Q8-1 over the union of two links), with 10-second windows so a link's
#: spool gets a file every 0.5 s of wall time at 20 x real time
Q8_2_TEXT = """DEFINE { query_name q8_2; }
SELECT tb, srcIP, destIP, count(*)
FROM [l0, l1].IPV4
GROUP BY time/10 AS tb, srcIP, destIP;
"""
SAMPLE_S = 0.5
#: the collector's lag is also reported over the replay's last TAIL_S seconds
TAIL_S = 10
_LINK_LINE = re.compile(r"link (?P<link>\S+): (?P<packets>\d+) packets, \d+ bytes, \d+ malformed .*?, "
                        r"(?P<ring>\d+) ring drops, (?P<kernel>\d+) kernel drops")


def spread(values: list[float] | list[int]) -> dict:
    """Median, min and max of repeated measurements."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": list(values)}


def fmt(s: dict, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
    return (f"{s['median'] / scale:.{digits}f}{unit} "
            f"({s['min'] / scale:.{digits}f}-{s['max'] / scale:.{digits}f})")


def machine_load() -> str:
    """The 1, 5 and 15-minute load averages (as `uptime` shows them)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def link_counts(stderr: str, link: str) -> dict | None:
    """The last summary line of `link` in a run's or agent's stderr."""
    found = [m for m in _LINK_LINE.finditer(stderr) if m.group("link") == link]
    if not found:
        return None
    m = found[-1]
    return {"packets": int(m.group("packets")), "ring_drops": int(m.group("ring")),
            "kernel_drops": int(m.group("kernel"))}


# --- fanout, offline ------------------------------------------------------------------------

def offline_captures(workdir: Path, packets: int, flows: int) -> tuple[Path, list[Path], Path]:
    """(whole, [half 0, half 1], a small capture to warm the JIT with)."""
    from tools.gen.traffic import NS, TrafficConfig

    cfg = TrafficConfig(packets=packets, duration_ns=600 * NS, groups=260_000, flows=flows,
                        tcp=0.8, udp=0.2, icmp=0.0, snaplen=64, sizes="imix", seed=260_000)
    stem = f"fan_{packets}_{flows}"
    whole = workdir / f"{stem}.pcap"
    halves = flow_split_captures(cfg, whole, [workdir / f"{stem}-h{k}.pcap" for k in range(2)])
    return whole, halves, warm_capture(workdir)


def warm_capture(workdir: Path) -> Path:
    """A small capture to compile (or load) the kernels with before anything is timed."""
    from tools.gen.traffic import NS, TrafficConfig

    return generated_capture(workdir / "fan_warm.pcap",
                             TrafficConfig(packets=200_000, duration_ns=120 * NS, groups=20_000,
                                           tcp=0.8, udp=0.2, icmp=0.0, snaplen=64, seed=7))


def q8_1_plan():
    from queries.parser import parse
    from queries.planner import plan_file

    return plan_file(parse(Q8_1_FILE.read_text(), path=str(Q8_1_FILE)), ["main"]).queries[0].low[0]


#: iterations of the CPU anchor: a pure-Python loop, no memory traffic to speak of
SPIN = 20_000_000


def spin() -> tuple[float, int, int, None]:
    """The anchor: what one core gives a process right now (seconds, 'packets' = iterations)."""
    t0 = time.perf_counter()
    s = 0
    for i in range(SPIN):
        s += i
    return time.perf_counter() - t0, SPIN, 0, None


def worker(pcap: str, warm: Path) -> None:
    """`--worker PCAP|spin`: warm up, say `ready`, wait for a line on stdin, time the low
    level over PCAP (or the CPU anchor), print the result as one JSON line."""
    from bench.lowlevel import time_operator

    plan = q8_1_plan()
    if pcap != "spin":
        time_operator(warm, plan)
        warm_file(Path(pcap))
    print("ready", flush=True)
    sys.stdin.readline()
    cpu0 = time.process_time()
    seconds, packets, rows, _ = spin() if pcap == "spin" else time_operator(Path(pcap), plan)
    print(json.dumps({"seconds": seconds, "packets": packets, "rows": rows,
                      "cpu_s": time.process_time() - cpu0}), flush=True)


def run_workers(pcaps: list, warm: Path) -> dict:
    """Workers over `pcaps` (or "spin": the CPU anchor) at once, started together once all
    are warm."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.cluster", "--worker", str(p),
                               "--warm", str(warm)], cwd=REPO, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for p in pcaps]
    for p in procs:
        assert p.stdout is not None and p.stdin is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a worker did not start (its error is above)")
    for p in procs:
        p.stdin.write("go\n")     # type: ignore[union-attr]
        p.stdin.flush()           # type: ignore[union-attr]
    results = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    packets = sum(r["packets"] for r in results)
    slowest = max(r["seconds"] for r in results)
    return {"packets": packets, "seconds": slowest, "pps": packets / slowest,
            "per_worker_pps": [r["packets"] / r["seconds"] for r in results],
            "cpu_share": [r["cpu_s"] / r["seconds"] for r in results]}


def spool_parent(workdir: Path) -> Path:
    """Where the agents' spools go: memory (/dev/shm) when there is one, so the agents'
    figures are their CPU's, not the disk's (a spool on this VM's disk, fsynced per file,
    holds one agent at ~75% of a core)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else workdir


def run_agents(pcaps: list[Path], workdir: Path) -> dict:
    """Whole `oopscope agent` processes over `pcaps` at once: wall time from launch to exit,
    and each agent's own reported time."""
    import tempfile

    spool = Path(tempfile.mkdtemp(prefix="oopscope-bench-spool-", dir=spool_parent(workdir)))
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cli("agent", str(Q8_1_FILE), "--link", f"main={p}", "--spool",
                                  str(spool / f"s{k}"), "--host-id", f"bench{k}"),
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for k, p in enumerate(pcaps)]
    errs = [p.communicate()[1] for p in procs]
    wall = time.perf_counter() - t0
    shutil.rmtree(spool, ignore_errors=True)
    if any(p.returncode for p in procs):
        raise RuntimeError("an agent failed: " + " | ".join(e[-300:] for e in errs))
    packets = sum(link_counts(e, "main")["packets"] for e in errs)     # type: ignore[index]
    own = max(float(m.group(1)) for e in errs
              for m in [re.search(r"ended: .*; ([\d.]+) s", e)] if m)
    return {"packets": packets, "wall_s": wall, "pps": packets / wall, "agent_s": own,
            "agent_pps": packets / own}


def marginal(big: dict, small: dict) -> float:
    """An agent's packets/s with its start-up (imports, planning: ~1.5 s, the same for any
    capture) taken out: the extra packets of `big` over its extra time beside `small`."""
    return (big["packets"] - small["packets"]) / max(1e-9, big["agent_s"] - small["agent_s"])


def fanout_offline(workdir: Path, packets: int, flows: int, repeat: int) -> dict:
    whole, halves, warm = offline_captures(workdir, packets, flows)
    for f in (whole, *halves):
        warm_file(f)
    run_agents([warm], workdir)                   # the agent's own kernels, compiled or loaded
    one, two, a1, a2, s1, s2, m1, m2 = [], [], [], [], [], [], [], []
    for i in range(repeat):
        s1.append(run_workers(["spin"], warm))
        s2.append(run_workers(["spin", "spin"], warm))
        one.append(run_workers([whole], warm))
        two.append(run_workers(halves, warm))
        a1.append(run_agents([whole], workdir))
        a2.append(run_agents(halves, workdir))
        m1.append(marginal(a1[-1], run_agents([warm], workdir)))
        m2.append(marginal(a2[-1], run_agents([warm, warm], workdir)))
        log.info("offline run %d: CPU anchor 2/1 processes %.2fx; low level 1 process %.2f M "
                 "pkts/s, 2 processes %.2f M pkts/s (%.2fx); agents %.2f / %.2f M pkts/s "
                 "(start-up out: %.2f / %.2f); load %s", i + 1, s2[-1]["pps"] / s1[-1]["pps"],
                 one[-1]["pps"] / 1e6, two[-1]["pps"] / 1e6, two[-1]["pps"] / one[-1]["pps"],
                 a1[-1]["pps"] / 1e6, a2[-1]["pps"] / 1e6, m1[-1] / 1e6, m2[-1] / 1e6,
                 machine_load())
    return {"packets": packets, "flows": flows,
            "anchor_ratio": spread([b["pps"] / a["pps"] for a, b in zip(s1, s2)]),
            "agent_one_marginal_pps": spread(m1), "agent_two_marginal_pps": spread(m2),
            "agent_marginal_ratio": spread([b / a for a, b in zip(m1, m2)]),
            "one_pps": spread([r["pps"] for r in one]),
            "two_pps": spread([r["pps"] for r in two]),
            "ratio": spread([b["pps"] / a["pps"] for a, b in zip(one, two)]),
            "two_per_worker_pps": [r["per_worker_pps"] for r in two],
            "two_cpu_share": [r["cpu_share"] for r in two],
            "agent_one_pps": spread([r["pps"] for r in a1]),
            "agent_two_pps": spread([r["pps"] for r in a2]),
            "agent_ratio": spread([b["pps"] / a["pps"] for a, b in zip(a1, a2)]),
            "agent_one_own_pps": spread([r["agent_pps"] for r in a1]),
            "agent_two_own_pps": spread([r["agent_pps"] for r in a2]),
            "agent_own_ratio": spread([b["agent_pps"] / a["agent_pps"] for a, b in zip(a1, a2)])}


# --- fanout, live ---------------------------------------------------------------------------

def _ifindex(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/ifindex").read_text())


def _packet_sockets(ifindex: int) -> int:
    """Packet sockets bound to `ifindex` (from /proc/net/packet)."""
    lines = Path("/proc/net/packet").read_text().splitlines()[1:]
    return sum(1 for line in lines if len(line.split()) > 4 and int(line.split()[4]) == ifindex)


def _session_cpu(sid: int) -> float:
    """CPU seconds of every process of session `sid` (the run and its Spark JVM)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:            # fields after the name: state ppid pgrp session ...
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _wait_ready(proc: subprocess.Popen, iface: str, sockets: int, timeout: float = 60) -> float:
    """Until `sockets` packet sockets are bound to `iface` and the run's session has used
    under 0.15 s of CPU in the last 0.5 s (Spark's start-up done). Seconds waited."""
    t0 = time.monotonic()
    ifindex = _ifindex(iface)
    while _packet_sockets(ifindex) < sockets:
        if proc.poll() is not None:
            raise RuntimeError(f"oopscope run exited with {proc.returncode} before capturing")
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("oopscope run bound no capture socket in time")
        time.sleep(0.1)
    _wait_quiet(proc, timeout - (time.monotonic() - t0))
    return time.monotonic() - t0


def _wait_quiet(proc: subprocess.Popen, timeout: float, least: float = 3.0) -> float:
    """Until the session of `proc` (started with start_new_session: it and its Spark JVM) has
    used under 0.15 s of CPU in 0.5 s, after at least `least` s. Seconds waited."""
    t0 = time.monotonic()
    last = _session_cpu(proc.pid)
    while time.monotonic() - t0 < timeout:
        time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(f"the process {proc.pid} exited with {proc.returncode} while "
                               f"starting")
        now = _session_cpu(proc.pid)
        if now - last < 0.15 and time.monotonic() - t0 > least:
            break
        last = now
    return time.monotonic() - t0


def _replay_cmd(pair, pcap: Path, seconds: float, load: str) -> list[str]:
    rate = ["--topspeed"] if load.startswith("top") else [f"--pps={int(load)}"]
    return pair.inside(["tcpreplay", "-i", pair.inner, *rate, "--preload-pcap", "--loop=0",
                        f"--duration={max(1, round(seconds))}", str(pcap)])


def _replay(pair, pcap: Path, seconds: float, load: str) -> tuple[int, float]:
    """Replay at `load`: packets/s, `top` (--topspeed) or `topN` (N tcpreplays at top speed,
    more than one sender makes; they compete with the capturer for the two cores)."""
    from bench.live import _sent

    senders = int(load[3:] or 1) if load.startswith("top") else 1
    procs = [subprocess.Popen(_replay_cmd(pair, pcap, seconds, load), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(senders)]
    return _sent([p.communicate(timeout=seconds + 60)[0] for p in procs])


def _rx(iface: str) -> int:
    return int(Path(f"/sys/class/net/{iface}/statistics/rx_packets").read_text())


def live_ours(pair, pcap: Path, seconds: float, load: str, fanout: int, workdir: Path) -> dict:
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="live-", dir=workdir))
    proc = subprocess.Popen(cli("run", str(Q8_1_FILE), "--interface", f"main={pair.outer}",
                                "--fanout", str(fanout), "--output", f"q8_1={out / 'q.csv'}",
                                "--no-progress"),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        waited = _wait_ready(proc, pair.outer, fanout)
        rx0 = _rx(pair.outer)
        sent, send_s = _replay(pair, pcap, seconds, load)
        time.sleep(1.5)                             # the last ring blocks are handed over
        arrived = _rx(pair.outer) - rx0
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(out, ignore_errors=True)
    counts = link_counts(err, "main")
    if proc.returncode != 0 or counts is None:
        raise RuntimeError(f"oopscope run --fanout {fanout} failed ({proc.returncode}): {err[-600:]}")
    return {"sent": sent, "send_s": send_s, "arrived": arrived, "captured": counts["packets"],
            "kernel_drops": counts["kernel_drops"], "ring_drops": counts["ring_drops"],
            "ready_s": waited}


def live_tcpdump(pair, pcap: Path, seconds: float, load: str) -> dict:
    dump = subprocess.Popen(["tcpdump", "-i", pair.outer, "-w", "/dev/null"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert dump.stderr is not None
    if "listening" not in dump.stderr.readline():
        dump.kill()
        raise RuntimeError("tcpdump did not start")
    rx0 = _rx(pair.outer)
    sent, send_s = _replay(pair, pcap, seconds, load)
    time.sleep(1.5)
    arrived = _rx(pair.outer) - rx0
    dump.send_signal(signal.SIGINT)
    err = dump.communicate(timeout=30)[1]

    def count(what: str) -> int:
        m = re.search(rf"(\d+) packets? {what}", err)
        return int(m.group(1)) if m else -1

    return {"sent": sent, "send_s": send_s, "arrived": arrived, "captured": count("captured"),
            "kernel_drops": count("dropped by kernel"), "ring_drops": 0}


def fanout_live(workdir: Path, loads: list[str], seconds: float, repeat: int) -> dict | str:
    from bench.live import TOOLS, make_capture
    from tools.gen.veth import VethPair, can_make_pairs

    why = can_make_pairs()
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if why or missing:
        return why or "missing tools: " + ", ".join(missing)
    pcap = make_capture(workdir / "live_100000_64.pcap", 100_000, 64)
    capturers = {"fanout 1": lambda pair, load: live_ours(pair, pcap, seconds, load, 1, workdir),
                 "fanout 2": lambda pair, load: live_ours(pair, pcap, seconds, load, 2, workdir),
                 "tcpdump": lambda pair, load: live_tcpdump(pair, pcap, seconds, load)}
    results: dict = {load: {name: [] for name in capturers} for load in loads}
    with VethPair("oopbc") as pair:
        for i in range(repeat):
            for load in loads:
                for name, run in capturers.items():
                    r = run(pair, load)
                    r["load"] = machine_load()
                    log.info("live run %d, load %s, %s: sent %d (%.0f/s), captured %d, kernel "
                             "drops %d, ring drops %d; machine load %s", i + 1, load, name,
                             r["sent"], r["sent"] / r["send_s"], r["captured"],
                             r["kernel_drops"], r["ring_drops"], r["load"])
                    results[load][name].append(r)
    rows = []
    for load, by in results.items():
        for name, runs in by.items():
            rows.append({"offered": load, "capturer": name,
                         "sent_pps": spread([r["sent"] / r["send_s"] for r in runs]),
                         "captured_pps": spread([r["captured"] / r["send_s"] for r in runs]),
                         "drops": spread([r["kernel_drops"] + r["ring_drops"] for r in runs]),
                         "kernel_drops": [r["kernel_drops"] for r in runs],
                         "ring_drops": [r["ring_drops"] for r in runs],
                         "drop_share": spread([(r["kernel_drops"] + r["ring_drops"])
                                               / max(1, r["arrived"]) for r in runs]),
                         "runs": runs})
    return {"seconds": seconds, "rows": rows}


# --- two agents and a collector -------------------------------------------------------------

class SpoolSampler(threading.Thread):
    """Every SAMPLE_S: spool files written and not yet in a committed micro-batch of the
    collector, the age of the oldest such, and the punctuation lag."""

    def __init__(self, spool: Path, stream: Path, query: str, links: list[str], start_ns: int):
        super().__init__(daemon=True)
        self.spool, self.stream, self.query, self.links = spool, stream, query, links
        self.start_ns = start_ns
        self.samples: list[dict] = []
        self.first_seen: dict[Path, float] = {}
        self.punct: dict[Path, int | None] = {}
        self.done: set[Path] = set()
        self.committed = -1
        self.halt = threading.Event()
        self.t0 = time.monotonic()

    def _punct(self, path: Path) -> int | None:
        import pyarrow.parquet as pq

        if path not in self.punct:
            try:
                v = (pq.read_schema(path).metadata or {}).get(b"oopscope.punct", b"")
            except (OSError, ValueError):
                return None
            self.punct[path] = int(v) if v else None
        return self.punct[path]

    def sample(self) -> dict:
        from common.spool import END_OF_INPUT, list_spool
        from highlevel.batchfiles import batch_files

        now = time.monotonic()
        files = list_spool(self.spool, self.query)
        for _, _, path in files:
            self.first_seen.setdefault(path, now)
        commits = self.stream / "commits"
        ids = sorted(int(n.name) for n in commits.iterdir() if n.name.isdigit()) \
            if commits.is_dir() else []
        for b in ids:
            if b > self.committed:
                got = batch_files(self.stream, b)
                if got is None:
                    break
                self.done.update(got)
                self.committed = b
        pending = [p for _, _, p in files if p not in self.done]
        newest: dict[str, int] = {}
        processed: dict[str, int] = {}
        for link, _, path in files:
            p = self._punct(path)
            if p is None or p == END_OF_INPUT:
                continue
            newest[link] = max(newest.get(link, p), p)
            if path in self.done:
                processed[link] = max(processed.get(link, p), p)
        lag = None
        if all(n in newest for n in self.links):
            # the Meld's punctuation is the minimum over the links, in the spool and in
            # what the collector has committed (the data's start before its first batch)
            spool_p = min(newest[n] for n in self.links)
            coll_p = min(processed.get(n, self.start_ns) for n in self.links)
            lag = max(0, spool_p - coll_p)
        return {"t": now - self.t0, "files": len(files), "pending": len(pending),
                "oldest_pending_s": max((now - self.first_seen[p] for p in pending), default=0.0),
                "punct_lag_ns": lag, "batches": self.committed + 1}

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            try:
                self.samples.append(self.sample())
            except OSError as exc:              # a file renamed under the listing
                log.debug("sample: %s", exc)


def cluster_capture(workdir: Path, packets: int):
    from tools.gen.traffic import NS, TrafficConfig, generate, link_paths

    cfg = TrafficConfig(packets=packets, duration_ns=1200 * NS, groups=50_000, tcp=0.8, udp=0.2,
                        icmp=0.0, snaplen=64, links=2, seed=2)
    out = workdir / f"two_{packets}.pcap"
    paths = link_paths(out, 2)
    stamp = out.with_name(out.name + ".params")
    if not (stamp.exists() and stamp.read_text() == repr(cfg) and all(p.exists() for p in paths.values())):
        generate(cfg, out)
        stamp.write_text(repr(cfg))
    for p in paths.values():
        warm_file(p)
    return cfg, paths


def run_cluster(query: Path, paths: dict, speed: float, workdir: Path, start_ns: int) -> dict:
    """A collector, then (once its Spark is up, as a standing collector would be) two agents
    of one link each; the spool sampled throughout. Times from the agents' launch."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="cluster-", dir=workdir))
    spool, ck = base / "spool", base / "ck"
    launched = time.perf_counter()
    coll = subprocess.Popen(cli("collect", str(query), "--spool", str(spool), "--links",
                                ",".join(paths), "--checkpoint", str(ck), "--output",
                                f"q8_2={base / 'out.csv'}"),
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    agents: list[subprocess.Popen] = []
    sampler = SpoolSampler(spool, ck / "q8_2" / "stream", "q8_2", list(paths), start_ns)
    try:
        head_start = _wait_quiet(coll, 120)
        t0 = time.perf_counter()
        sampler.t0 = time.monotonic()
        sampler.start()
        agents = [subprocess.Popen(cli("agent", str(query), "--link", f"{name}={p}", "--spool",
                                       str(spool), "--host-id", f"bench-{name}", "--speed",
                                       f"{speed:g}"),
                                   cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
                  for name, p in paths.items()]
        agent_err = [a.communicate(timeout=900)[1] for a in agents]
        agents_done = time.perf_counter() - t0
        coll_err = coll.communicate(timeout=900)[1]
        wall = time.perf_counter() - t0
        total = time.perf_counter() - launched
    finally:
        sampler.halt.set()
        for p in (coll, *agents):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    sampler.join()
    shutil.rmtree(base, ignore_errors=True)
    if coll.returncode or any(a.returncode for a in agents):
        raise RuntimeError(f"cluster run failed: {coll_err[-500:]} {[e[-300:] for e in agent_err]}")
    rates = []
    for name, err in zip(paths, agent_err):
        n = link_counts(err, name)["packets"]                  # type: ignore[index]
        secs = float(re.search(r"ended: .*; ([\d.]+) s", err).group(1))   # type: ignore[union-attr]
        rates.append({"link": name, "packets": n, "seconds": secs, "pps": n / secs})
    rows = int(m.group(1)) if (m := re.search(r"q8_2: (\d+) rows", coll_err)) else -1
    # while the agents replay (their end-of-input makes every window ready at once after);
    # halves: does the lag grow from the first to the second?
    during = [s for s in sampler.samples if s["t"] <= agents_done]
    halves = [[s for s in during if s["t"] <= agents_done / 2],
              [s for s in during if s["t"] > agents_done / 2]]

    def worst(samples: list[dict], key: str) -> float:
        return max((s[key] for s in samples), default=0.0)

    def lag_s(samples: list[dict]) -> float:
        return max((s["punct_lag_ns"] / 1e9 / speed for s in samples
                    if s["punct_lag_ns"] is not None), default=float("nan"))

    return {"wall_s": wall, "total_s": total, "head_start_s": head_start,
            "agents_s": agents_done, "agents": rates, "rows": rows,
            "samples": sampler.samples,
            "max_pending": worst(during, "pending"),
            "max_pending_halves": [worst(h, "pending") for h in halves],
            "max_oldest_pending_s": worst(during, "oldest_pending_s"),
            "max_oldest_halves": [worst(h, "oldest_pending_s") for h in halves],
            "max_punct_lag_s": lag_s(during),
            "max_punct_lag_halves": [lag_s(h) for h in halves],
            "drain_s": wall - agents_done, "load": machine_load()}


def run_single(query: Path, paths: dict, speed: float, workdir: Path) -> dict:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="single-", dir=workdir))
    args = ["run", str(query), "--speed", str(speed), "--output", f"q8_2={base / 'out.csv'}",
            "--no-progress"]
    for name, p in paths.items():
        args += ["--link", f"{name}={p}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cli(*args), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True, timeout=900)
    wall = time.perf_counter() - t0
    shutil.rmtree(base, ignore_errors=True)
    if proc.returncode:
        raise RuntimeError(f"oopscope run failed: {proc.stderr[-600:]}")
    rows = int(m.group(1)) if (m := re.search(r"q8_2: (\d+) rows", proc.stderr)) else -1
    return {"wall_s": wall, "rows": rows, "load": machine_load()}


def collector_part(workdir: Path, packets: int, speed: float, repeat: int) -> dict:
    cfg, paths = cluster_capture(workdir, packets)
    query = workdir / "q8_2_10s.gsql"
    query.write_text(Q8_2_TEXT)
    # warm: the agents' and the stages' kernels compiled (or loaded) once, Spark's jars cached
    small = {n: warm_capture(workdir) for n in paths}
    run_single(query, small, 1000.0, workdir)
    clusters, singles = [], []
    for i in range(repeat):
        clusters.append(run_cluster(query, paths, speed, workdir, cfg.start_ns))
        singles.append(run_single(query, paths, speed, workdir))
        c = clusters[-1]
        log.info("collector run %d: head start %.1f s; agents %.1f s (%s pkts/s each), "
                 "collector end %.1f s; max pending %d files (halves %s), oldest pending %.2f s "
                 "(halves %s), punct lag max %.2f s (halves %s); one process %.1f s; rows %d / "
                 "%d; load %s", i + 1, c["head_start_s"], c["agents_s"],
                 "/".join(f"{a['pps']:,.0f}" for a in c["agents"]), c["wall_s"],
                 c["max_pending"], c["max_pending_halves"], c["max_oldest_pending_s"],
                 [round(x, 2) for x in c["max_oldest_halves"]], c["max_punct_lag_s"],
                 [round(x, 2) for x in c["max_punct_lag_halves"]], singles[-1]["wall_s"],
                 c["rows"], singles[-1]["rows"], c["load"])
    return {"packets_per_link": packets, "data_s": cfg.duration_ns / 1e9, "speed": speed,
            "ideal_replay_s": cfg.duration_ns / 1e9 / speed,
            "offered_pps_per_link": packets * speed / (cfg.duration_ns / 1e9),
            "agent_pps": spread([a["pps"] for c in clusters for a in c["agents"]]),
            "agents_s": spread([c["agents_s"] for c in clusters]),
            "cluster_s": spread([c["wall_s"] for c in clusters]),
            "single_s": spread([s["wall_s"] for s in singles]),
            "drain_s": spread([c["drain_s"] for c in clusters]),
            "head_start_s": spread([c["head_start_s"] for c in clusters]),
            "cluster_total_s": spread([c["total_s"] for c in clusters]),
            "max_pending": spread([c["max_pending"] for c in clusters]),
            "max_pending_1st_half": spread([c["max_pending_halves"][0] for c in clusters]),
            "max_pending_2nd_half": spread([c["max_pending_halves"][1] for c in clusters]),
            "max_oldest_1st_half": spread([c["max_oldest_halves"][0] for c in clusters]),
            "max_oldest_2nd_half": spread([c["max_oldest_halves"][1] for c in clusters]),
            "max_lag_1st_half": spread([c["max_punct_lag_halves"][0] for c in clusters]),
            "max_lag_2nd_half": spread([c["max_punct_lag_halves"][1] for c in clusters]),
            "max_oldest_pending_s": spread([c["max_oldest_pending_s"] for c in clusters]),
            "max_punct_lag_s": spread([c["max_punct_lag_s"] for c in clusters]),
            "rows": [(c["rows"], s["rows"]) for c, s in zip(clusters, singles)],
            "clusters": clusters, "singles": singles}


# --- report ---------------------------------------------------------------------------------

def lag_timeline(samples: list[dict], agents_s: float, every: float = 2.0) -> str:
    """One run's lag every `every` seconds: files written, pending, oldest pending, lag."""
    out, next_t, marked = [], 0.0, False
    for s in samples:
        if s["t"] < next_t:
            continue
        lag = "-" if s["punct_lag_ns"] is None else f"{s['punct_lag_ns'] / 1e9:.0f}"
        note = ""
        if s["t"] > agents_s and not marked:
            note, marked = "  <- agents have ended", True
        out.append(f"    t={s['t']:5.1f} s  files {s['files']:3d}  pending {s['pending']:3d}  "
                   f"oldest pending {s['oldest_pending_s']:4.1f} s  lag {lag:>3} data-s{note}")
        next_t = s["t"] + every
    return "\n".join(out)


def report(doc: dict) -> None:
    print(f"bench.cluster on {os.cpu_count()} cores; load average at start {doc['load_start']}, "
          f"at end {doc['load_end']}; warm JIT and page cache; medians (min-max) of "
          f"{doc['repeat']} runs")
    off = doc.get("fanout_offline")
    if off:
        print(f"\n1. Fanout, offline: shipped q8_1 low level, {off['packets']:,} packets, "
              f"260K groups, {off['flows']:,} flows, split in two by a symmetric 5-tuple hash")
        print(f"  {'':<34}{'1 process':>20}{'2 processes':>20}{'ratio':>18}")
        print(f"  {'low level in-process, M pkts/s':<34}{fmt(off['one_pps'], 1e6):>20}"
              f"{fmt(off['two_pps'], 1e6):>20}{fmt(off['ratio'], digits=2, unit='x'):>18}")
        print(f"  {'agent, start-up taken out':<34}{fmt(off['agent_one_marginal_pps'], 1e6):>20}"
              f"{fmt(off['agent_two_marginal_pps'], 1e6):>20}"
              f"{fmt(off['agent_marginal_ratio'], digits=2, unit='x'):>18}")
        print(f"  {'agent, its own reported time':<34}{fmt(off['agent_one_own_pps'], 1e6):>20}"
              f"{fmt(off['agent_two_own_pps'], 1e6):>20}"
              f"{fmt(off['agent_own_ratio'], digits=2, unit='x'):>18}")
        print(f"  {'oopscope agent, launch to exit':<34}{fmt(off['agent_one_pps'], 1e6):>20}"
              f"{fmt(off['agent_two_pps'], 1e6):>20}{fmt(off['agent_ratio'], digits=2, unit='x'):>18}")
        print(f"  {'CPU anchor (pure-Python loop)':<34}{'-':>20}{'-':>20}"
              f"{fmt(off['anchor_ratio'], digits=2, unit='x'):>18}")
        per = [f"{a / 1e6:.2f}/{b / 1e6:.2f}" for a, b in off["two_per_worker_pps"]]
        print(f"  low level, 2 processes, each (M pkts/s): {', '.join(per)}")
        print("  (agents: spool in /dev/shm; the anchor's ratio is what the two cores gave two "
              "processes at the time)")
    live = doc.get("fanout_live")
    if isinstance(live, str):
        print(f"\n1b. Fanout, live: skipped ({live})")
    elif live:
        print(f"\n1b. Fanout, live: tcpreplay into a veth pair, {live['seconds']:.0f} s per run, "
              f"64-byte packets; oopscope run q8_1 --interface --fanout N, stopped by SIGTERM")
        print(f"  {'offered':<9}{'capturer':<10}{'sent K/s':>18}{'captured K/s':>18}"
              f"{'drops (k+ring)':>22}{'drop %':>8}  drops per run")
        for r in live["rows"]:
            runs = ",".join(str(k + g) for k, g in zip(r["kernel_drops"], r["ring_drops"]))
            print(f"  {r['offered']:<9}{r['capturer']:<10}{fmt(r['sent_pps'], 1e3, 0):>18}"
                  f"{fmt(r['captured_pps'], 1e3, 0):>18}{fmt(r['drops'], 1, 0):>22}"
                  f"{100 * r['drop_share']['median']:>8.2f}  {runs}")
    col = doc.get("collector")
    if col:
        print(f"\n2. Two agents + one collector (local[*]) vs one `oopscope run`: Q8-2 shape "
              f"(10 s windows) over l0, l1, {col['packets_per_link']:,} packets per link, "
              f"{col['data_s']:.0f} s of data at --speed {col['speed']:g} "
              f"({col['ideal_replay_s']:.0f} s, {col['offered_pps_per_link']:,.0f} pkts/s per link)")
        print("  (collector started first; agents launched once its Spark start-up went quiet;"
              " times from the agents' launch)")
        rows = [
            ("agents' replay rate, pkts/s each", fmt(col["agent_pps"], 1, 0)),
            ("agents end, s", fmt(col["agents_s"], 1, 1)),
            ("spool files pending, max: 1st half of the replay", fmt(col["max_pending_1st_half"], 1, 0)),
            ("                          2nd half", fmt(col["max_pending_2nd_half"], 1, 0)),
            ("oldest pending file, s: 1st half", fmt(col["max_oldest_1st_half"], 1, 1)),
            ("                        2nd half", fmt(col["max_oldest_2nd_half"], 1, 1)),
            ("punctuation lag, wall s: 1st half", fmt(col["max_lag_1st_half"], 1, 2)),
            ("                         2nd half", fmt(col["max_lag_2nd_half"], 1, 2)),
            ("collector ends, s after the agents", fmt(col["drain_s"], 1, 1)),
            ("end to end: agents + collector, s", fmt(col["cluster_s"], 1, 1)),
            ("  + the collector's head start", fmt(col["cluster_total_s"], 1, 1)),
            ("end to end: one oopscope run, s", fmt(col["single_s"], 1, 1)),
        ]
        for label, value in rows:
            print(f"  {label:<56}{value}")
        # the end of the replay: what is left once the fresh JVM's first batches are behind
        tails = [[x for x in c["samples"] if c["agents_s"] - TAIL_S <= x["t"] <= c["agents_s"]]
                 for c in col["clusters"]]
        for label, key, scale in (("pending, max", "pending", 1.0),
                                  ("oldest pending file, s, max", "oldest_pending_s", 1.0),
                                  ("punctuation lag, wall s, max", "punct_lag_ns",
                                   1e9 * col["speed"])):
            vals = [max((x[key] or 0) / scale for x in t) for t in tails if t]
            print(f"  {'last ' + str(TAIL_S) + ' s of the replay: ' + label:<56}"
                  f"{fmt(spread(vals), 1, 0 if key == 'pending' else 1)}")
        # micro-batches: when each commit was first seen; the gaps are the batches' durations
        counts, longest, last_gap = [], [], []
        for c in col["clusters"]:
            seen = [x for x in c["samples"] if x["t"] <= c["agents_s"]]
            at = [b["t"] for a, b in zip(seen, seen[1:]) if b["batches"] > a["batches"]]
            gaps = [b - a for a, b in zip(at, at[1:])] or [float("nan")]
            counts.append(len(at))
            longest.append(max(gaps))
            last_gap.append(gaps[-1])
        print(f"  {'commits seen during the replay':<56}{fmt(spread(counts), 1, 0)}")
        print(f"  {'longest time between commits, s':<56}{fmt(spread(longest), 1, 1)}")
        print(f"  {'last time between commits in the replay, s':<56}{fmt(spread(last_gap), 1, 1)}")
        print(f"  rows written (cluster, single) per run: {col['rows']}")
        best = sorted(col["clusters"], key=lambda c: c["wall_s"])[len(col["clusters"]) // 2]
        print("  lag over time, median run (pending = written, not yet in a committed batch):")
        print(lag_timeline(best["samples"], best["agents_s"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="fanout-offline,fanout-live,collector")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--packets", type=int, default=10_000_000, help="offline capture (default 10M)")
    ap.add_argument("--flows", type=int, default=1_000_000, help="5-tuples in the offline capture")
    ap.add_argument("--loads", default="150000,top,top2",
                    help="offered loads: pkts/s, `top` (tcpreplay --topspeed) or `topN` (N of them)")
    ap.add_argument("--seconds", type=float, default=5.0, help="replay time per live run")
    ap.add_argument("--cluster-packets", type=int, default=4_000_000,
                    help="packets per link of the two-link capture (20 minutes of data)")
    ap.add_argument("--speed", type=float, default=20.0)
    ap.add_argument("--dir", default=None, help="keep the captures here for later runs")
    ap.add_argument("--json", dest="json_path")
    ap.add_argument("--report", type=Path, help="print the report of a saved --json file again")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--warm", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.warm)
        return 0
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    parts = {p.strip() for p in args.parts.split(",")}
    workdir = work_dir(args.dir, "oopscope-bench-cluster-")
    doc: dict = {"benchmark": "cluster", "repeat": args.repeat, "load_start": machine_load()}
    if "fanout-offline" in parts:
        doc["fanout_offline"] = fanout_offline(workdir, args.packets, args.flows, args.repeat)
    if "fanout-live" in parts:
        doc["fanout_live"] = fanout_live(workdir, args.loads.split(","), args.seconds, args.repeat)
    if "collector" in parts:
        doc["collector"] = collector_part(workdir, args.cluster_packets, args.speed, args.repeat)
    doc["load_end"] = machine_load()
    report(doc)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
        log.info("wrote %s", args.json_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
