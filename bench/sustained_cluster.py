"""`bench.sustained --mode cluster`: two `oopscope agent`s and one `oopscope collect` under
sustained load (see bench/sustained.py for what is measured).

An agent given a query file replays its capture once; a sustained load needs a link that
goes on, stamped with the wall clock, as the appliance's looped link is. So each agent reads
its link from a FIFO that a feeder process (`python -m bench.sustained_cluster --feed`)
fills: the generated capture's records over and over, each stamped with the wall-clock time
it is written at, `--pps` records per second. Both links carry the same capture (the same
groups); the query melds them (`FROM [l0, l1]`), so the collector closes each 10-s window
over 2 x R packets/s.

The collector starts first (as a standing one would) and the agents once its Spark
start-up has gone quiet. Per window: the lag from its end to its first row in the
collector's output file, its result rows, the partial rows the agents' spool files held
for it, and the RSS of each process (agent a, agent b, the collector with its JVM).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.sustained import (
    WINDOW_S,
    Sampled,
    capture_for,
    declared,
    report,
    rss_mb,
    seconds_text,
)

log = logging.getLogger(__name__)

QUERY = f"""
DEFINE {{ query_name pairs; }}
SELECT tb, srcIP, destIP, count(*) AS packets, sum(len) AS bytes
FROM [l0, l1].IPV4
GROUP BY time/{WINDOW_S} AS tb, srcIP, destIP;
"""
#: how often a feeder writes (its records' times are spread over the tick)
TICK_S = 0.01


def _records(pcap: Path) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A classic pcap's global header, its records' bytes twice over (so that any run of at
    most all of them, from any record on, is one slice) and the offset of each record in
    them (one more than twice their number: the last is the end)."""
    data = pcap.read_bytes()
    head, body = data[:24], data[24:]
    if head[:4] != bytes.fromhex("d4c3b2a1"):
        raise SystemExit(f"{pcap}: not a little-endian microsecond pcap")
    offsets = []
    at = 0
    while at + 16 <= len(body):
        offsets.append(at)
        at += 16 + int.from_bytes(body[at + 8:at + 12], "little")
    offs = np.asarray(offsets + [at], np.int64)
    twice = np.concatenate([offs[:-1], offs + at])
    return head, np.frombuffer(body[:at] * 2, np.uint8), twice


def feed(fifo: Path, pcap: Path, pps: int, seconds: float) -> None:
    """Write `pcap`'s records into `fifo` at `pps`, stamped with the wall clock, for
    `seconds` (the reader's end of input when it closes)."""
    head, body, offs = _records(pcap)
    n = (len(offs) - 1) // 2
    field = np.arange(8)
    with open(fifo, "wb", buffering=0) as out:
        out.write(head)
        t0 = time.time()
        sent = at = 0
        while True:
            now = time.time()
            if now - t0 >= seconds:
                return
            due = min(n, int((now - t0) * pps) - sent)
            if due > 0:
                lo, hi = offs[at], offs[at + due]
                chunk = body[lo:hi].copy()
                # the records' times spread over the last tick, increasing
                ts = now - TICK_S + np.arange(due) * (TICK_S / due)
                sec = np.floor(ts)
                stamp = np.stack([sec, (ts - sec) * 1e6], axis=1).astype("<u4")
                chunk[(offs[at:at + due] - lo)[:, None] + field] = stamp.view(np.uint8) \
                    .reshape(due, 8)
                try:
                    out.write(chunk.tobytes())
                except BrokenPipeError:
                    return
                sent += due
                at = (at + due) % n
            time.sleep(TICK_S)


def _scan_output(path: Path, state: dict, sampled: Sampled) -> None:
    """New whole lines of the collector's CSV output: the windows they hold, their rows."""
    try:
        with open(path, "rb") as fh:
            fh.seek(state.get("offset", 0))
            data = fh.read()
    except FileNotFoundError:
        return
    end = data.rfind(b"\n")
    if end < 0:
        return
    state["offset"] = state.get("offset", 0) + end + 1
    now = time.time()
    for line in data[:end].split(b"\n"):
        first = line.split(b",", 1)[0]
        if not first.isdigit():
            continue                            # the header
        w = sampled.window(int(first))
        if w.file_s is None:
            w.file_s = now - (w.tb + 1) * WINDOW_S
        w.rows += 1


def _scan_spool(spool: Path, seen: set, partials: dict) -> None:
    """Partial rows per window in the agents' new spool files (read while they are there:
    the collector removes them once applied, `common.spool.prune_applied`)."""
    import pyarrow.parquet as pq

    for path in spool.glob("pairs/partials/*.parquet"):
        if path in seen:
            continue
        seen.add(path)
        try:
            table = pq.read_table(path, columns=["window"])
        except (OSError, ValueError):
            seen.discard(path)                  # being renamed into place: next time
            continue
        win = table.column("window").drop_null().to_numpy()
        for pane, count in zip(*np.unique(win, return_counts=True)):
            partials[int(pane)] = partials.get(int(pane), 0) + int(count)


def cluster_run(pps: int, groups: int, minutes: float, workdir: Path,
                expected: int | None = None, debug: bool = False) -> dict:
    """One run: 2 agents at `pps` each + a collector (`debug`: with -vv, its micro-batches'
    timings in its log), for `minutes` of load."""
    from bench.cluster import _wait_quiet
    from bench.workloads import cli

    pcap = capture_for(pps, groups, workdir)
    run = Path(tempfile.mkdtemp(prefix=f"cluster-{pps}-{groups}-", dir=workdir))
    query, spool, out = run / "pairs.gsql", run / "spool", run / "pairs.csv"
    query.write_text(declared(QUERY, expected))
    sampled = Sampled()
    procs: dict[str, subprocess.Popen] = {}
    with contextlib.ExitStack() as undo:
        def start(name: str, cmd: list[str]) -> subprocess.Popen:
            logf = undo.enter_context(open(run / f"{name}.log", "ab"))
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs[name] = proc

            def end() -> None:
                if proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
            undo.callback(end)
            return proc

        collector = start("collect", cli("-vv" if debug else "-v", "collect", str(query),
                                         "--spool", str(spool), "--links", "l0,l1", "--output",
                                         f"pairs={out}", "--checkpoint", str(run / "ck")))
        waited = _wait_quiet(collector, timeout=180, least=15)
        log.info("collector up (%.0f s); agents at %d packets/s each", waited, pps)
        feed_s = minutes * 60 + 30
        for link, host in (("l0", "a"), ("l1", "b")):
            fifo = run / f"{link}.fifo"
            os.mkfifo(fifo)
            # paced (at 1x: the records come at the wall clock's pace anyway) so that each
            # window's groups leave the table as its punctuation closes it; at full speed an
            # agent keeps oop_lazy's smoothing, and its windows reach the spool two late
            start(f"agent-{host}", cli("agent", str(query), "--link", f"{link}={fifo}",
                                      "--spool", str(spool), "--host-id", host,
                                      "--speed", "1"))
            start(f"feed-{link}", [sys.executable, "-m", "bench.sustained_cluster", "--feed",
                                   str(fifo), "--pcap", str(pcap), "--pps", str(pps),
                                   "--seconds", str(feed_s)])
        first_s = (int(time.time()) // WINDOW_S + 2) * WINDOW_S   # the first whole window
        scan: dict = {}
        seen: set = set()
        partials: dict[int, int] = {}
        ended = time.time() + minutes * 60
        last_tb = None
        while time.time() < ended:
            time.sleep(0.25)
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise SystemExit(f"{name} exited with {proc.returncode}: see "
                                     f"{run / (name + '.log')}")
            _scan_output(out, scan, sampled)
            # as they come: the collector removes each file once its batch has committed
            _scan_spool(spool, seen, partials)
            now_tb = int(time.time() // WINDOW_S) - 1
            if now_tb != last_tb:
                w = sampled.window(now_tb)
                w.rss = {n: round(rss_mb(p.pid)) for n, p in procs.items()
                         if not n.startswith("feed")}
                w.rss_mb = sum(w.rss.values())
                last_tb = now_tb
                done = sampled.window(now_tb - 1)
                log.info("t+%.0f s: window %d: %s rows, lag to file %s s, RSS %s MB",
                         minutes * 60 - (ended - time.time()), done.tb, f"{done.rows:,}",
                         seconds_text(done.file_s), w.rss)
        _scan_spool(spool, seen, partials)
        for w in sampled.windows.values():
            w.partial_rows = partials.get(w.tb)
    # the agents' own counts are in their logs (a FIFO link has no ring)
    status = {"pps": 2 * pps, "ring_drops": None, "kernel_drops": None}
    result = report(2 * pps, groups, "cluster", sampled, status, first_s)
    result["rss_by_process_end_mb"] = next(
        (w.rss for w in sorted(sampled.windows.values(), key=lambda w: -w.tb) if w.rss),
        None)
    result["logs"] = str(run)
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a feeder of bench.sustained --mode cluster")
    ap.add_argument("--feed", type=Path, required=True)
    ap.add_argument("--pcap", type=Path, required=True)
    ap.add_argument("--pps", type=int, required=True)
    ap.add_argument("--seconds", type=float, required=True)
    args = ap.parse_args(argv)
    feed(args.feed, args.pcap, args.pps, args.seconds)


if __name__ == "__main__":
    main()
