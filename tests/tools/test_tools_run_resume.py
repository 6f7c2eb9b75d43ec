"""`oopscope run` resumes after `kill -9` (issue 25, item 6): a paced run with a kept spool
and checkpoint is killed while it writes windows, the same command then finishes it, and
the output equals an uninterrupted run's (every window once, none lost). The same state
under another query file or another capture is refused, saying why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools.resuming import csv_rows as _rows
from tests.tools.resuming import csv_windows as _windows
from tests.tools.resuming import kill_when, run_here

NS = 1_000_000_000


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """400k packets over 10 minutes, 2000 groups: ten q8_1 windows of many rows each."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("resume") / "main.pcap"
    cfg = TrafficConfig(packets=400_000, duration_ns=600 * NS, groups=2000, seed=6)
    return generate(cfg.validate(), out)["l0"]


def _cmd(query: str, link: Path, out: Path, spool: Path | None, ck: Path | None,
         speed: str) -> list[str]:
    cmd = [sys.executable, "-m", "tools.cli", "run", query, "--link", f"main={link}",
           "--output", f"q8_1={out}", "--speed", speed]
    if spool is not None and ck is not None:
        cmd += ["--spool", str(spool), "--checkpoint", str(ck)]
    return cmd


@pytest.mark.slow
def test_kill_9_and_resume_gives_the_uninterrupted_rows(capture, tmp_path):
    want = tmp_path / "want.csv"
    run_here(_cmd("q8_1", capture, want, None, None, "max"))
    want_header, want_rows = _rows(want)
    assert len({r[0] for r in want_rows}) >= 8

    spool, ck, out = tmp_path / "spool", tmp_path / "ck", tmp_path / "out.csv"
    # paced slowly enough that Spark, slow to start on a busy two-core machine, still finds
    # windows to come when it is up (at 40, its first batch could take every window)
    cmd = _cmd("q8_1", capture, out, spool, ck, "20")
    kill_when(cmd, lambda: _windows(out) >= 3, poll=0.05)
    killed_windows = _windows(out)
    assert killed_windows < len({r[0] for r in want_rows}), "killed too late to tell"

    # the same state under another query file, or another capture, is refused as it is
    other_query = tmp_path / "q8_1.gsql"
    other_query.write_text((REPO / "queries/library/q8_1.gsql").read_text() + "\n-- changed\n")
    refused = run_here(_cmd(str(other_query), capture, out, spool, ck, "20"), check=False)
    assert refused.returncode == 1
    assert "the query differs" in refused.stderr and "Traceback" not in refused.stderr
    other_capture = tmp_path / "other.pcap"
    other_capture.write_bytes(capture.read_bytes())
    refused = run_here(_cmd("q8_1", other_capture, out, spool, ck, "20"), check=False)
    assert refused.returncode == 1
    assert "link main: a different capture file" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    resumed = run_here(cmd)
    # continued from the spool: the packets it holds were read past, not counted again
    assert "run resumed from its spool and checkpoint; packets already in the spool, read " \
           "past: link main" in resumed.stderr, resumed.stderr
    header, rows = _rows(out)
    assert header == want_header
    assert len(rows) == len(set(rows)), "a row written twice"
    assert sorted(rows) == sorted(want_rows)
    assert rows == want_rows                 # windows in order, as one run writes them

    # a finished run's state resumes to nothing more: the output stays as it is
    run_here(cmd)
    assert _rows(out)[1] == want_rows


PER_SECOND = """
DEFINE { query_name persec; }
SELECT tb, count(*) AS packets FROM main.IPV4 GROUP BY time AS tb;
"""


@pytest.mark.slow
@pytest.mark.needs_root
def test_a_live_run_resumes_with_the_gap_left_out(tmp_path):
    """`--interface` over a kept spool and checkpoint: killed under traffic, the same command
    resumes; windows that had closed are kept, the windows of the time it was down are not
    written (and the gap is reported), the windows after the restart are exact."""
    from tests.tools.serving import Sender, burst_truth
    from tests.tools.test_tools_run_live import _wait_for_progress
    from tools.gen.veth import VethPair, can_make_pairs

    why = can_make_pairs()
    if why:
        pytest.skip(f"a live run needs a veth pair in a namespace: {why}")
    query = tmp_path / "persec.gsql"
    query.write_text(PER_SECOND)
    out, spool, ck = tmp_path / "out.csv", tmp_path / "spool", tmp_path / "ck"
    with VethPair("oopres") as pair:
        cmd = [sys.executable, "-m", "tools.cli", "run", str(query), "--interface",
               f"main={pair.outer}", "--output", f"persec={out}", "--spool", str(spool),
               "--checkpoint", str(ck), "--progress"]

        def start():
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
            _wait_for_progress(proc, timeout=120)
            return proc

        def windows() -> dict:
            if not out.exists():
                return {}
            lines = out.read_text().splitlines()[1:]
            return {int(a): int(b) for a, b in (ln.split(",") for ln in lines if ln)}

        first = start()
        sender = Sender(pair, seconds=120, per_burst=100)
        try:
            deadline = time.monotonic() + 90
            while len(windows()) < 3:
                assert time.monotonic() < deadline, "no windows written"
                sender.read(1)
            before = out.read_bytes()
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            killed_at = time.time()
            second = start()
            restarted_at = time.time()
            deadline = time.monotonic() + 120
            while len([w for w in windows() if w > restarted_at + 1]) < 3:
                assert time.monotonic() < deadline, "no windows after the restart"
                sender.read(1)
            sender.stop_between_bursts()
            sender.lines += [ln for ln in sender.proc.stdout.read().splitlines() if ln.strip()]
            time.sleep(3)                     # the lull: punctuation passes the last burst
            second.send_signal(signal.SIGTERM)
            _, err = second.communicate(timeout=120)
        finally:
            if sender.proc.poll() is None:
                sender.proc.kill()
            for p in (first, locals().get("second")):
                if p is not None and p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
    assert second.returncode == 0, err.decode(errors="replace")[-2000:]
    assert b"gap" in err, err.decode(errors="replace")[-2000:]
    assert out.read_bytes().startswith(before)          # what was written stays
    got = windows()
    lines = out.read_text().splitlines()[1:]
    assert len(lines) == len(got)                       # no window twice
    truth = burst_truth(sender.lines)
    for w, n in got.items():
        assert truth.get(w) == n, (w, n, truth.get(w))  # every window written is exact
    missing = sorted(w for w in truth if w not in got)
    # what is missing is the time it was down (and the windows it cut), in one block
    assert missing and missing == list(range(missing[0], missing[-1] + 1)), missing
    assert missing[0] <= killed_at and missing[-1] >= killed_at - 1
    assert missing[-1] < restarted_at + 3
    assert max(got) > restarted_at
