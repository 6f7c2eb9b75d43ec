"""Where windows begin, for a query that starts, resumes or attaches mid-stream, and ns times
as UTC text for the messages that name them and for the tables that show a window's start."""

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


def window_starts(plan, qp):
    """A function from values of `qp`'s window column (`tb` of `GROUP BY time/60 AS tb`) to
    the start of each window as UTC text, or None when its windows are not times: no time
    window, a landmark, or a clock that is a field of records (`ivalue/10` counts whatever
    the records count). A value that is no window's (not `id * scale + shift`) shows none."""
    w = qp.high.window
    if w is None or w.column is None or w.landmark is not None or not w.slide_ns \
            or not _timed_by_clock(plan, qp, set()):
        return None

    def starts(values) -> list[str | None]:
        out: list[str | None] = []
        for v in values:
            if v is None or (int(v) - w.shift) % w.scale:
                out.append(None)
                continue
            start = w.window_end_ns((int(v) - w.shift) // w.scale) - w.range_ns
            out.append(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start / NS)))
        return out

    return starts


def _timed_by_clock(plan, qp, seen: set) -> bool:
    """Whether every source of `qp` is timed by a clock: packets (capture time), records read
    with the wall clock, or queries over those."""
    if qp.name in seen:
        return False
    seen.add(qp.name)
    sources = getattr(getattr(qp, "analysed", None), "sources", None)
    if not sources:
        return False
    for src in sources:
        if src.kind == "link":
            if src.record is not None and not src.record.system_clock:
                return False
        elif src.kind == "query":
            try:
                upstream = plan.query(src.query)
            except KeyError:
                return False
            if not _timed_by_clock(plan, upstream, seen):
                return False
        else:
            return False
    return True
