"""A real `oopscope serve` process, for the appliance's tests and benchmark (and scripts):
started on a free port, asked through its client, SIGKILLed with its JVM, stopped, restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tools.serve.client import Client, ControlError

#: the checkout (or installation) root: `python -m tools.cli` runs from there
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`oopscope serve ARGS --state STATE` in a process group of its own (so a SIGKILL of the
    group takes its JVM too); `.client` talks to it. `verbose`: with `-v` (2: `-vv`, its
    debug lines; 0 or False: as an operator starts it)."""

    def __init__(self, args: list[str], state: Path, log: Path, port: int | None = None,
                 listen: str | None = None, token: str | None = None,
                 verbose: bool | int = True):
        self.args, self.state, self.log_path = list(args), Path(state), Path(log)
        self.port = port or free_port()
        self.listen = listen or f"127.0.0.1:{self.port}"
        self.url = f"http://127.0.0.1:{self.port}/" if listen is None else None
        self.token = token
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None
        self.ready = self.state.parent / f".{self.state.name}.ready"

    def start(self, timeout: float = 180) -> Server:
        self.ready.unlink(missing_ok=True)
        self._log = open(self.log_path, "ab")
        flags = ["-" + "v" * int(self.verbose)] if self.verbose else []
        cmd = [sys.executable, "-m", "tools.cli", *flags, "serve", *self.args, "--state",
               str(self.state), "--listen", self.listen, "--ready-file", str(self.ready)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=self._log,
                                     start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not start in {timeout} s:\n{self.log()}")
            time.sleep(0.2)
        url = self.ready.read_text()
        self.client = Client(url if self.url is None else self.url, self.token)
        return self

    def wait_spark(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.client.status()["spark"]["state"] != "up":
            assert time.monotonic() < deadline, f"Spark did not start:\n{self.log()}"
            time.sleep(0.5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def kill9(self) -> None:
        """SIGKILL the server and every process of its group (its JVM)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        _wait_group_gone(self.proc.pid)

    def stop(self, timeout: float = 300) -> int:
        """SIGTERM and wait: every window closed and written."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            _wait_group_gone(self.proc.pid)

    def cli(self, *args: str, timeout: float = 300, check: bool = True):
        server = self.client.server
        res = subprocess.run([sys.executable, "-m", "tools.cli", *args, "--server", server],
                             cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(f"oopscope {' '.join(args)} -> {res.returncode}:\n"
                                 f"{res.stdout}\n{res.stderr}\nserver log:\n{self.log()}")
        return res


def _wait_group_gone(pgid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except ControlError:
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
