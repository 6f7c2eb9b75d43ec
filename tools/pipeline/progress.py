"""The progress line of a long `oopscope run` on stderr: packets, rate, rows out, drops,
and per query its tables' slots and partial rows per result row (as `oopscope queries`).

Redrawn in place twice a second when stderr is a terminal (or `--progress` asks for it; then
each update is a line of its own when stderr is not a terminal), erased at the end so the
summary starts on a clean line.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

#: what the line shows of a query: its name, its tables' slots now, its partial rows per
#: result row so far (None: no result row yet)
TableState = tuple[str, int, float | None]


class Progress(threading.Thread):
    """Polls `sample()` -> (packets, rows out, drops, clock text, note, tables) and draws the
    line; the note says what the rows wait for (`Spark starting`), empty when nothing;
    `tables` has a `TableState` per query with a hash table."""

    def __init__(self, sample: Callable[[], tuple[int, int, int, str, str, list[TableState]]],
                 *,
                 every: float = 0.5, stream=None):
        super().__init__(name="oopscope-progress", daemon=True)
        self.sample = sample
        self.every = every
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._halt = threading.Event()
        self._width = 0
        self._last = (time.monotonic(), 0)

    def line(self) -> str:
        packets, rows, drops, clock, note, tables = self.sample()
        now = time.monotonic()
        t0, p0 = self._last
        rate = (packets - p0) / (now - t0) if now > t0 else 0.0
        self._last = (now, packets)
        text = (f"oopscope: {packets:,} packets ({_rate(rate)}), {rows:,} result rows, "
                f"{drops:,} drops")
        text += f", clock {clock}" if clock else ""
        for name, slots, per_row in tables:
            text += (f"; {name} {slots:,} slots, "
                     + ("- partials/row" if per_row is None else f"{per_row:.2f} partials/row"))
        return text + (f" ({note})" if note else "")

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self._draw(self.line())

    def _draw(self, text: str) -> None:
        if self.tty:
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2)
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()


def _rate(per_second: float) -> str:
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f} M pkts/s"
    if per_second >= 1e3:
        return f"{per_second / 1e3:.1f} K pkts/s"
    return f"{per_second:.0f} pkts/s"
