"""Where windows begin, for a query that starts, resumes or attaches mid-stream, and ns times
as UTC text for the messages that name them."""

from __future__ import annotations

import time

from common.units import NS_PER_S as NS


def when(ns: int) -> str:
    """A ns timestamp as UTC text (for replies and logs)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / NS)) + " UTC"


def _first_starts(plan, after) -> list[int]:
    """Per query with a window, the start of its first window that begins after
    `after(window)` (windows begin at multiples of the slide, shifted by the offset)."""
    starts = []
    for qp in plan:
        w = qp.high.window
        if w is None or not w.slide_ns:
            continue
        step, off = w.slide_ns, w.offset_ns
        starts.append(((after(w) + off) // step + 1) * step - off)
    return starts


def first_window_start(plan, after_ns: int) -> int:
    """The start of the first window of the file's chosen queries that begins after
    `after_ns`; queries without a window begin right after it."""
    return max(_first_starts(plan, lambda w: after_ns), default=after_ns + 1)


def first_open_window(plan, p: int) -> int:
    """Where a resumed query's records start again on a link timed by its records' own
    field, whose file is read again from its start: the start of the first window that had
    not closed at punctuation `p` (each window ending by `p` was written before; the next
    ones are counted again from the records). With windows of several sizes, the latest
    such start of any query: the windows of the others that begin before it are a gap."""
    return max(_first_starts(plan, lambda w: p - max(w.range_ns, w.slide_ns)), default=p)
