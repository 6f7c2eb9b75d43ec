"""The server's heartbeat in its state directory, and the gaps it tells a restart."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from tools.pipeline.windows import when

log = logging.getLogger(__name__)


class Downtime:
    """The heartbeat (`server.json` in the state directory, rewritten every second while
    the server runs, and once with `clean` at its shutdown) and the gaps (`gaps.json`): at a
    start, the time since the previous server's last beat is a gap, "server stopped" or
    "server crashed"."""

    def __init__(self, state_dir: Path, stopping: threading.Event):
        self.state_dir = state_dir
        self.started_ns = time.time_ns()
        #: every time the server was down ({from_ns, to_ns, reason}), oldest first
        self.gaps: list[dict] = []
        self._stopping = stopping
        self._thread: threading.Thread | None = None

    def note(self) -> None:
        """Read the gaps, and add the one since the previous server's last beat."""
        beat = self.state_dir / "server.json"
        gaps = self.state_dir / "gaps.json"
        try:
            self.gaps = json.loads(gaps.read_text()) if gaps.exists() else []
        except (OSError, ValueError, RecursionError):
            self.gaps = []
        if not (isinstance(self.gaps, list) and all(map(_is_gap, self.gaps))):
            log.error("%s: not a list of gaps; the earlier gaps are forgotten", gaps)
            self.gaps = []
        try:
            last = json.loads(beat.read_text())
        except (OSError, ValueError, RecursionError):
            return
        if not (isinstance(last, dict) and _is_int(last.get("heartbeat_ns"))):
            log.error("%s: not a heartbeat; the time the server was down is unknown", beat)
            return
        reason = "server stopped" if last.get("clean") is True else "server crashed"
        gap: dict[str, Any] = {"from_ns": last["heartbeat_ns"], "to_ns": self.started_ns,
                               "reason": reason}
        self.gaps.append(gap)
        _write_json(gaps, self.gaps)
        log.warning("%s: no capture from %s to %s", reason, when(gap["from_ns"]),
                    when(gap["to_ns"]))

    @property
    def down_since(self) -> int | None:
        """When the server last went down (None: it never did)."""
        return self.gaps[-1]["from_ns"] if self.gaps else None

    def start(self) -> None:
        """Beat every second until the server stops."""
        self._thread = threading.Thread(target=self._beat, name="oopscope-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stopping.wait(1.0):
            self.write(clean=False)

    def write(self, clean: bool) -> None:
        """One beat; `clean`: the last, of a server that stopped with every window written."""
        try:
            _write_json(self.state_dir / "server.json",
                        {"pid": os.getpid(), "started_ns": self.started_ns,
                         "heartbeat_ns": time.time_ns(), "clean": clean})
        except OSError as exc:
            log.error("state %s: cannot write the heartbeat: %s", self.state_dir, exc)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_gap(g) -> bool:
    return isinstance(g, dict) and _is_int(g.get("from_ns")) and _is_int(g.get("to_ns")) \
        and isinstance(g.get("reason"), str)


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)
