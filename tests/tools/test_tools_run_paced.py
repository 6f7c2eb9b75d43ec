"""`oopscope run` in time: paced replay, timer punctuation during a lull, --duration, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from highlevel.sinks import Sink
from tests.tools.test_tools_run import assert_same_rows, run_cli

NS = 1_000_000_000

UNION_QUERY = """
DEFINE { query_name per5s; }
SELECT tb, protocol, COUNT(*) AS packets, SUM(ip_len) AS bytes
FROM [busy, quiet].IP
GROUP BY time/5 AS tb, protocol;
"""

ONE_LINK_QUERY = """
DEFINE { query_name per5s; }
SELECT tb, protocol, COUNT(*) AS packets, SUM(ip_len) AS bytes
FROM main.IP
GROUP BY time/5 AS tb, protocol;
"""


@pytest.fixture(scope="session")
def lull(tmp_path_factory):
    """Two links over 60 s: `busy` all along, `quiet` silent for 40 s of it."""
    from tools.gen.traffic import TrafficConfig, generate

    root = tmp_path_factory.mktemp("lull")
    cfg = TrafficConfig(packets=20_000, duration_ns=60 * NS, groups=500, links=2,
                        quiet_links=(1,), quiet_rate=200.0, lulls=1, lull_ns=40 * NS,
                        seed=21)
    paths = generate(cfg.validate(), root / "lull.pcap")
    manifest = json.loads((root / "lull.pcap.manifest.json").read_text())
    query = root / "per5s.gsql"
    query.write_text(UNION_QUERY)
    return {"busy": paths["l0"], "quiet": paths["l1"], "manifest": manifest, "query": query}


@pytest.fixture(scope="session")
def one_link(tmp_path_factory):
    from tools.gen.traffic import TrafficConfig, generate

    root = tmp_path_factory.mktemp("one")
    cfg = TrafficConfig(packets=30_000, duration_ns=120 * NS, groups=800, seed=22)
    path = generate(cfg.validate(), root / "one.pcap")["l0"]
    query = root / "per5s.gsql"
    query.write_text(ONE_LINK_QUERY)
    return {"pcap": path, "query": query}


def _reference(query: Path, batches: dict):
    from queries.planner import plan_text
    from tests.oracles.reference import evaluate_file

    plan = plan_text(query.read_text(), list(batches), {}, path=str(query))
    return plan, evaluate_file(plan, batches, {})


class TimingSink(Sink):
    """Records when each window's rows reached the outputs (wall clock)."""

    def __init__(self):
        self.seen: dict[int, float] = {}

    def write(self, batch_id, table) -> bool:
        now = time.time()
        for tb in table.column("tb").to_pylist():
            self.seen.setdefault(int(tb), now)
        return True

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_paced_run_closes_windows_during_a_lull(lull, spark_session, tmp_path):
    """The quiet link's lull does not hold the busy link's windows back (timer punctuation:
    clock - slack), and its packets after the lull are still counted."""
    from capture.reader import read_all
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    speed = 1.5
    out = tmp_path / "per5s.csv"
    timing = TimingSink()
    config = RunConfig(str(lull["query"]),
                       links=(("busy", str(lull["busy"])), ("quiet", str(lull["quiet"]))),
                       outputs=(("per5s", str(out)),), speed=speed,
                       extra_sinks=(("per5s", timing),))
    summary = run(config)
    assert summary.ended == "end of input"
    batches = {n: read_all(lull[n], n) for n in ("busy", "quiet")}
    plan, want = _reference(lull["query"], batches)
    assert_same_rows(out, want["per5s"], plan.query("per5s"))
    assert summary.links["quiet"].packets == len(batches["quiet"]) > 0

    # windows whose end falls inside the lull appear once the clock passes their end, before
    # the quiet link speaks again (an order, not a number of seconds: on a loaded machine a
    # micro-batch may take several seconds, yet the 40 s lull is far longer)
    wall0, t0 = summary.clock_origin
    quiet = next(x for x in lull["manifest"]["links"] if x["quiet"])
    (lull_start, lull_end), = quiet["lulls_ns"]
    resumed = wall0 + (lull_end - t0) / NS / speed
    inside = [tb for tb in timing.seen if lull_start + 10 * NS <= (tb + 1) * 5 * NS <= lull_end - 10 * NS]
    assert inside, "no window ends inside the lull"
    checked = []
    for tb in inside:
        due = wall0 + ((tb + 1) * 5 * NS + NS - t0) / NS / speed   # end + 1 s lull slack
        if due < wall0 + 8:    # the first seconds: the stages may still be starting
            continue
        checked.append(tb)
        assert timing.seen[tb] < resumed, f"window {tb} waited for the quiet link"
    assert checked, "no window inside the lull after the stages' start"


def test_duration_stops_the_replay_at_that_capture_time(one_link, spark_session, tmp_path):
    from capture.reader import read_all
    from tools.pipeline.config import RunConfig
    from tools.pipeline.runner import run

    out = tmp_path / "per5s.csv"
    summary = run(RunConfig(str(one_link["query"]), links=(("main", str(one_link["pcap"])),),
                            outputs=(("per5s", str(out)),), duration_ns=30 * NS))
    assert summary.ended == "duration"
    full = read_all(one_link["pcap"], "main")
    ts = full["timestamp"]
    keep = int(np.searchsorted(np.maximum.accumulate(ts), ts[0] + 30 * NS))
    assert summary.links["main"].packets == keep < len(full)
    plan, want = _reference(one_link["query"], {"main": full.slice(0, keep)})
    assert_same_rows(out, want["per5s"], plan.query("per5s"))


@pytest.mark.slow
def test_sigterm_closes_every_window_and_exits_0(one_link, tmp_path):
    """A paced run stopped by SIGTERM writes the windows of every packet it read, exit 0.
    Stopped once its first window is written (Spark up, the replay under way: 60 s of it at
    2x), not after a fixed time a busy machine may not have started it in."""
    from capture.reader import read_all
    from tests.tools.test_tools_run import expected_rows

    out = tmp_path / "per5s.csv"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "run", str(one_link["query"]),
                             "--link", f"main={one_link['pcap']}", "--speed", "2",
                             "--output", f"per5s={out}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and proc.poll() is None and not (
            out.exists() and len(out.read_text().splitlines()) > 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 0, err
    assert "run ended: stopped" in err
    packets = int(err.split("link main: ")[1].split(" packets")[0])
    full = read_all(one_link["pcap"], "main")
    assert 0 < packets < len(full)
    plan, want = _reference(one_link["query"], {"main": full.slice(0, packets)})
    assert_same_rows(out, want["per5s"], plan.query("per5s"))
    assert expected_rows(want["per5s"], plan.query("per5s"))


def test_speed_and_sources_are_checked(one_link, capsys):
    code, _, err = run_cli(["run", str(one_link["query"]), "--link",
                            f"main={one_link['pcap']}", "--speed", "fast"], capsys)
    assert code == 2 and "--speed" in err
    code, _, err = run_cli(["run", str(one_link["query"]), "--link",
                            f"main={one_link['pcap']}", "--interface", "lo"], capsys)
    assert code == 1 and "not both" in err
    code, _, err = run_cli(["run", str(one_link["query"])], capsys)
    assert code == 2 and "--interface" in err


THREE_WINDOWS_QUERY = """
DEFINE { query_name per15s; }
SELECT tb, protocol, COUNT(*) AS packets, SUM(ip_len) AS bytes
FROM main.IP
GROUP BY time/15 AS tb, protocol;
"""


@pytest.mark.slow
def test_a_paced_run_writes_each_window_as_it_closes(spark_session, tmp_path):
    """A paced replay of three windows writes the first ones while the replay still runs,
    and its progress line counts them. Before, oop_lazy held a window's groups in the table
    until max_lfta_disorder (2) windows later, so a run of three windows wrote every row at
    its end and the progress line said "0 result rows" throughout. Asserted on the order of
    events (rows in the file, then the replay's last packet), never on seconds: the windows
    are 15 s of wall time each, so a slow Spark start still leaves the last window's."""
    import contextlib
    import io
    import threading

    from capture.reader import read_all
    from tests.tools.test_tools_run import expected_rows
    from tools.cli import main
    from tools.gen.traffic import TrafficConfig, generate

    pcap = generate(TrafficConfig(packets=30_000, duration_ns=45 * NS, groups=200, seed=23)
                    .validate(), tmp_path / "three.pcap")["l0"]
    query = tmp_path / "per15s.gsql"
    query.write_text(THREE_WINDOWS_QUERY)
    full = read_all(pcap, "main")
    last_second = int(full["timestamp"].max()) // NS          # of the last packet
    out = tmp_path / "per15s.csv"
    progress: list[tuple[int, int | None]] = []       # (result rows, clock second) per line
    err_lines: list[str] = []

    class Stderr(io.TextIOBase):
        """The run's stderr, its progress lines parsed as they are written."""

        def __init__(self):
            self.part = ""

        def isatty(self) -> bool:
            return False

        def write(self, text: str) -> int:
            *lines, self.part = (self.part + text).split("\n")
            for line in lines:
                err_lines.append(line + "\n")
                if " result rows, " in line:
                    rows = int(line.split(" result rows")[0].rsplit(", ", 1)[1]
                               .replace(",", ""))
                    clock = line.split(", clock ")[1][:8] if ", clock " in line else None
                    progress.append((rows, None if clock is None else _second_of(clock)))
            return len(text)

    # the command in this process, on a thread (the test's Spark session: no JVM to start),
    # watched from here as a process of its own would be
    ended: dict = {}

    def replay() -> None:
        try:
            main(["run", str(query), "--link", f"main={pcap}", "--speed", "1", "--output",
                  f"per15s={out}", "--progress"])
            ended["code"] = 0
        except SystemExit as exc:
            ended["code"] = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException as exc:      # raised again below, in the test's thread
            ended["error"] = exc

    runner = threading.Thread(target=replay, daemon=True)
    seen_early = None           # (data rows in the file, clock of the progress line then)
    with contextlib.redirect_stderr(Stderr()):
        runner.start()
        while runner.is_alive():
            if out.exists() and seen_early is None:
                rows = max(0, len(out.read_text().splitlines()) - 1)
                clocks = [c for _, c in progress if c is not None]
                if rows and runner.is_alive() and clocks:
                    seen_early = (rows, clocks[-1])
            time.sleep(0.1)
    if "error" in ended:
        raise ended["error"]
    assert ended["code"] == 0, "".join(err_lines)[-3000:]

    # rows were in the file while the run went on, before the last packet's second was
    # replayed (the clock of the progress line is the capture time read so far)
    assert seen_early is not None, "no row before the run ended:\n" + "".join(err_lines)[-3000:]
    rows, clock = seen_early
    assert clock % 86400 < last_second % 86400, (seen_early, last_second)
    # the progress line counted them as they were written, before the replay's end
    assert any(r > 0 and c is not None and c % 86400 < last_second % 86400
               for r, c in progress), progress
    plan, want = _reference(query, {"main": full})
    assert_same_rows(out, want["per15s"], plan.query("per15s"))
    assert rows < len(expected_rows(want["per15s"], plan.query("per15s")))


def _second_of(clock: str) -> int:
    h, m, s = (int(x) for x in clock.split(":"))
    return h * 3600 + m * 60 + s
