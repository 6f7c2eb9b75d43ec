"""Shared test fixtures: where the real captures are, and skips with a reason when they are not."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("OOPSCOPE_SHARED", REPO.parent / "shared"))
PCAPS = SHARED / "pcaps"


def shared_pcaps() -> list[Path]:
    """Every capture in ../shared/pcaps (empty when the folder is absent)."""
    if not PCAPS.is_dir():
        return []
    return sorted(p for p in PCAPS.iterdir() if p.suffix in {".pcap", ".pcapng", ".cap"})


@pytest.fixture(scope="session")
def pcaps_dir() -> Path:
    if not PCAPS.is_dir():
        pytest.skip(f"real captures not found at {PCAPS} (a checkout without ../shared)")
    return PCAPS


def require_tool(name: str) -> str:
    """Path of an external tool, or skip naming the missing Debian package's tool."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (.ci/run installs it)")
    return path


def free_udp_port() -> int:
    """A UDP port on loopback that nothing is bound to (for a collector)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def nfcapd(flowdir: Path):
    """A real nfcapd on a free loopback port, stopped (and drained) at the end."""
    exe = require_tool("nfcapd")
    port = free_udp_port()
    proc = subprocess.Popen([exe, "-b", "127.0.0.1", "-p", str(port), "-w", str(flowdir)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:     # ready once it has bound its port
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    break
            time.sleep(0.05)
        yield port
        time.sleep(0.3)                        # let nfcapd drain its socket
    finally:
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, log.decode(errors="replace")
