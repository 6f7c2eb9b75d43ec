"""`oopscope serve` runs submission after submission for months: a submitted and cancelled
query must leave no thread behind in the server process.

Each query's high level is a Structured Streaming query whose JVM thread calls `foreachBatch`
back in Python; py4j (pinned threads) serves that call on a socket and a Python thread of
its own, and never closed them when the query stopped: one more thread (and JVM socket) per
submission (`highlevel.callbacks`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, wait_for

#: submit+cancel cycles measured (~2.5 CPU-seconds each): a leaked thread a cycle leaves
#: baseline + CYCLES, over baseline + ONCE even with a baseline taken one thread high (the
#: `- 1` tolerated at the end) as long as CYCLES >= ONCE + 2
CYCLES = 4
#: threads that may start once in a process's life, after the warm-up: the py4j connection
#: of the JVM's finalizer thread (its first callback, telling Python a proxy was collected,
#: comes whenever the JVM's GC runs) and a native pool thread (Arrow's allocator)
ONCE = 2


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count in /proc")


@pytest.mark.slow
def test_cancelled_queries_leave_no_thread_and_others_keep_running(ten_seconds_pcap, tmp_path,
                                                                  monkeypatch):
    # the suite's servers skip Spark's warm-up (tests/conftest.py); this one runs it as
    # users' servers do, and its threads count after it
    monkeypatch.setenv("OOPSCOPE_SPARK_WARMUP", "1")
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"],
                    tmp_path / "state", tmp_path / "serve.log").start()
    client = server.client

    def rows(name: str) -> int:
        return next(q["rows_out"] for q in client.queries() if q["name"] == name)

    def cycle(name: str) -> None:
        client.submit(text=PER_SECOND, file="persec.gsql", name=name)
        # rows out: its stream's thread has called Python back (the connection exists)
        wait_for(lambda: rows(name) >= 1, 90, f"{name}'s first window")
        client.cancel(name)
        wait_for(lambda: next(q["state"] for q in client.queries()
                              if q["name"] == name) == "cancelled", 60, f"{name} cancelled")

    try:
        server.wait_spark()
        wait_for(lambda: "Spark warmed up: a micro-batch's code paths compiled" in server.log(),
                 120, "Spark's warm-up")
        # a query that runs through every cycle: its own callbacks must keep working
        client.submit(text=PER_SECOND, file="persec.gsql", name="keeps")
        wait_for(lambda: rows("keeps") >= 1, 90, "keeps' first window")
        for k in range(2):       # threads started once per process (pools, the finalizer)
            cycle(f"warmup{k}")
        pid = server.proc.pid
        baseline = _threads(pid)
        kept = rows("keeps")
        for k in range(CYCLES):
            cycle(f"q{k}")
        # before: one more py4j connection thread per cycle (baseline + CYCLES)
        try:
            wait_for(lambda: _threads(pid) <= baseline + ONCE, 30, "the thread count back")
        except AssertionError:
            raise AssertionError(f"{_threads(pid)} threads after {CYCLES} submit+cancel "
                                 f"cycles, {baseline} before") from None
        assert _threads(pid) >= baseline - 1
        # the query that kept running still gets its micro-batches called back
        wait_for(lambda: rows("keeps") > kept + CYCLES, 90, "keeps' rows after the cycles")
        assert next(q["state"] for q in client.queries() if q["name"] == "keeps") == "running"
    finally:
        server.stop()
