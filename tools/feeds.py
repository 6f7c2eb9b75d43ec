"""The low level of one link inside a run: its operators, their spool writers and its timer.

`LinkFeeds` is what every packet source of `oopscope run` (a capture file replayed at full
speed or paced, a live interface) hands its batches and punctuation to. Per (query, link) an
`OperatorFeed` runs the `lowlevel.operator.LowLevelOperator` and buffers its partial rows,
writing them to the spool with the operator's punctuation whenever that punctuation advances
(or the buffer grows large), so the number of spool files follows windows, not packets.
"""

from __future__ import annotations

import logging
import threading

from tools.punctuation import LinkTimer

log = logging.getLogger(__name__)

#: partial rows buffered per operator before a spool file is written without punctuation
SPOOL_FLUSH_ROWS = 1 << 20
#: the punctuation of a link whose input has ended: every window may close
END_OF_INPUT = (1 << 63) - 1


class OperatorFeed:
    """One low-level operator of one link and its spool writer, with buffered partial rows."""

    def __init__(self, plan, spool_root, summary, compression: str = "snappy"):
        from highlevel.spool import SpoolWriter
        from lowlevel.operator import HOLD_ROWS, LowLevelOperator

        self.op = LowLevelOperator(plan, hold_rows=HOLD_ROWS)
        # flow records are closed on the driver of this process (highlevel.driverrows),
        # which takes their rows from memory
        flows = (plan.extras or {}).get("flow") is not None
        self.writer = SpoolWriter(spool_root, plan.query, plan.link, fsync=False,
                                  compression=compression, keep_in_memory=flows)
        self.summary = summary          # the query's summary: partial rows, spool files
        self.buffer: list = []
        self.buffered = 0

    def _add(self, parts) -> None:
        for b in parts:
            if b.num_rows:
                self.buffer.append(b)
                self.buffered += b.num_rows

    def _write(self, punctuation: int | None) -> None:
        if not self.buffer and punctuation is None:
            return
        self.writer.write(self.buffer, punctuation)
        self.summary.partial_rows += self.buffered
        self.summary.spool_files += 1
        self.buffer, self.buffered = [], 0

    def process(self, batch) -> None:
        self._add(self.op.process(batch))
        if self.buffered >= SPOOL_FLUSH_ROWS:
            self._write(None)

    def punctuate(self, p: int) -> None:
        rows, out = self.op.punctuate(p)
        self._add(rows)
        if out is not None:
            self._write(out)

    def finish(self) -> None:
        # the operator's final punctuation is the end of its last pane; the input is over,
        # though, so the link punctuates "nothing follows": a sliding window that reaches
        # past the last pane closes too (the reference evaluator outputs it)
        rows, _ = self.op.finish()
        self._add(rows)
        self._write(END_OF_INPUT)


class LinkFeeds:
    """Everything downstream of one link's packets: its operators and its punctuation timer."""

    def __init__(self, name: str, feeds: list[OperatorFeed], slack_ns: int):
        self.name = name
        self.feeds = feeds
        slides = [f.op.plan.window.slide_ns for f in feeds if f.op.plan.window is not None]
        self.timer = LinkTimer(min(slides) if slides else 0, slack_ns)
        self.packets = 0          # handed to the low level (the progress line reads it)
        self.bytes = 0
        self.finished = False
        self._lock = threading.Lock()

    @property
    def read_columns(self) -> tuple[str, ...] | None:
        """The packet columns this link's operators read (the reader decodes only those), or
        None (decode all) when one of them cannot tell."""
        names = {"timestamp", "len"}          # the timer and the byte counter above
        for f in self.feeds:
            cols = f.op.read_columns
            if cols is None:
                return None
            names.update(cols)
        return tuple(sorted(names))

    def process(self, batch) -> None:
        n = len(batch)
        if n == 0:
            return
        for f in self.feeds:
            f.process(batch)
        self.timer.observe(int(batch["timestamp"].max()))
        self.packets += n
        self.bytes += int(batch["len"].sum(dtype="int64"))

    def punctuate(self, p: int) -> None:
        """Hand punctuation `p` (already aligned and increasing) to every operator."""
        for f in self.feeds:
            f.punctuate(p)

    def tick(self, clock_ns: int | None) -> int | None:
        """A timer tick at `clock_ns`: punctuate when the link's punctuation advances."""
        p = self.timer.fire(clock_ns)
        if p is not None:
            self.punctuate(p)
        return p

    def finish(self) -> None:
        """The link's input is over (end of file, end of the run, a stop signal)."""
        if self.finished:
            return
        self.finished = True
        for f in self.feeds:
            f.finish()

    def counters(self) -> list[tuple[object, dict]]:
        return [(f.summary, f.op.counters) for f in self.feeds]
