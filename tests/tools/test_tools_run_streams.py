"""`oopscope run` over a stream (issue 25, item 9): a pcap written into a FIFO while the run
reads it, and a pcap piped into standard input (`--link main=-`), give the rows of the same
run over the regular file; a directory, a device or a socket is named as what it is."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools.resuming import run_here
from tests.tools.test_tools_run import run_cli

NS = 1_000_000_000


@pytest.fixture(scope="module")
def capture(tmp_path_factory) -> Path:
    """30k packets over 4 minutes: several q8_1 windows."""
    from tools.gen.traffic import TrafficConfig, generate

    out = tmp_path_factory.mktemp("streams") / "main.pcap"
    cfg = TrafficConfig(packets=30_000, duration_ns=240 * NS, groups=800, seed=25)
    return generate(cfg.validate(), out)["l0"]


def _run(link: str, out: Path, *, shell_input: str | None = None,
         here: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tools.cli", "run", "q8_1", "--link", f"main={link}",
           "--output", f"q8_1={out}"]
    if here:                        # the run over the file is the oracle: no process needed
        return run_here(cmd, check=False)
    if shell_input is not None:     # `producer | oopscope run ...`, as a shell runs it
        line = f"{shell_input} | {' '.join(cmd)}"
        return subprocess.run(line, shell=True, capture_output=True, text=True, cwd=REPO, timeout=600)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)


def _summary_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("link main: ")]
    return line.split(" [")[0]          # without the path


@pytest.mark.slow
def test_fifo_and_standard_input_give_the_rows_of_the_file(capture, tmp_path):
    want = _run(str(capture), tmp_path / "file.csv", here=True)
    assert want.returncode == 0, want.stderr
    rows = (tmp_path / "file.csv").read_text()
    assert rows.count("\n") > 100

    # a writer that trickles the file into a FIFO while the run reads it
    fifo = tmp_path / "live.fifo"
    os.mkfifo(fifo)
    data = capture.read_bytes()

    def write():
        with open(fifo, "wb") as f:
            for i in range(0, len(data), 1 << 16):
                f.write(data[i:i + (1 << 16)])
                f.flush()
                time.sleep(0.002)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    got = _run(str(fifo), tmp_path / "fifo.csv")
    writer.join(30)
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "fifo.csv").read_text() == rows
    assert _summary_line(got.stderr) == _summary_line(want.stderr)

    piped = _run("-", tmp_path / "stdin.csv", shell_input=f"cat {capture}")
    assert piped.returncode == 0, piped.stderr
    assert (tmp_path / "stdin.csv").read_text() == rows
    assert _summary_line(piped.stderr) == _summary_line(want.stderr)
    assert "Traceback" not in got.stderr + piped.stderr


def test_special_paths_say_what_they_are(tmp_path, capsys):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        for path, what in ((tmp_path, "is a directory, not a capture file"),
                           ("/dev/null", "is a character device, not a capture file"),
                           (tmp_path / "sock", "is a socket, not a capture file"),
                           (tmp_path / "none.pcap", "capture file not found")):
            code, _, err = run_cli(["run", "q8_1", "--link", f"main={path}"], capsys)
            assert code == 1 and err == f"oopscope: error: --link main={path}: {what}\n"
            code, _, err = run_cli(["decode", str(path)], capsys)
            assert code == 1 and err == f"oopscope: error: {path}: {what}\n"
    finally:
        sock.close()
    code, _, err = run_cli(["run", "q8_1", "--link", "main=-", "--link", "other=-"], capsys)
    assert code == 1 and "standard input (-) can feed one link only" in err and err.count("\n") == 1


def test_direction_is_passed_to_the_live_capture(monkeypatch, capsys):
    import tools.pipeline.runner as runner

    seen = {}

    def fake_run(config):
        seen["options"] = dict(config.capture_options)
        raise runner.RunConfigError("stop here")

    monkeypatch.setattr(runner, "run", fake_run)
    code, _, err = run_cli(["run", "q8_1", "--interface", "main=lo", "--direction", "in"], capsys)
    assert code == 1 and "stop here" in err and seen["options"]["direction"] == "in"
    code, _, err = run_cli(["run", "q8_1", "--interface", "main=lo"], capsys)
    assert seen["options"]["direction"] == "inout"
    code, _, err = run_cli(["run", "q8_1", "--interface", "main=lo", "--direction", "up"], capsys)
    assert code == 2 and "'up' is not one of 'in', 'out', 'inout'" in err


def test_a_fifo_nobody_writes_is_waited_for_visibly_and_a_stop_ends_the_wait(tmp_path):
    fifo = tmp_path / "quiet.fifo"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-m", "tools.cli", "run", "q8_1", "--link", f"main={fifo}",
                             "--output", f"q8_1={tmp_path / 'out.csv'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stderr is not None
        seen = []                             # the JVM starts meanwhile: its lines may come too
        while not any("waiting for a capture" in line for line in seen):
            line = proc.stderr.readline()
            assert line, f"ended without saying that it waits: {seen}"
            seen.append(line)
        assert f"{fifo}: waiting for a capture: nothing written to the FIFO yet" in seen[-1]
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "Traceback" not in rest
    assert rest.strip().splitlines()[-1] == f"oopscope: error: {fifo}: stopped before a capture arrived"
