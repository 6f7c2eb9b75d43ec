"""The appliance's memory budget: a submission whose tables would not fit beside those of the
running queries is refused before anything is allocated.

Whoever can submit a query chooses its `aggregate_slots` (DEFINE, or `submit --set`), which
the planner accepts up to 2^30: tens of GiB allocated at once, and the machine swaps or
kills the server. So the server is started with a budget (`serve --memory-budget`, by
default a quarter of the machine's memory and at most 4 GiB), and each submission's
estimate is checked against it: the low-level operators the server runs for it, each a
table of `aggregate_slots` records and its output buffer (`lowlevel.footprint`), one per
link it runs on (a link captured by N fanout members: N), plus what the running queries
already hold. Links whose low level a capture agent runs are the agent's memory, not the
server's. The high level's memory (Spark's) is not part of the estimate: it is bounded by
the Spark session's own settings.

An adaptive table (`lowlevel.sizing`) is admitted at its first size and may grow between
windows only while the budget holds it: each such table gets a grant (`MemoryBudget.grant`)
it asks before it grows; the bytes granted beyond the estimate count as held until the
query ends (`release`).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from common.datafiles import size_text
from tools.serve.config import ServeError

if TYPE_CHECKING:
    from lowlevel.footprint import Footprint
    from tools.serve.submission import Submission

log = logging.getLogger(__name__)

GIB = 1 << 30
#: the default budget's upper bound, and the share of the machine's memory below it
DEFAULT_CAP = 4 * GIB
DEFAULT_SHARE = 4


def machine_memory() -> int | None:
    """The machine's physical memory in bytes (None: unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def default_budget() -> int:
    """min(4 GiB, a quarter of the machine's memory)."""
    total = machine_memory()
    return DEFAULT_CAP if not total else min(DEFAULT_CAP, total // DEFAULT_SHARE)


def footprints(sub: Submission) -> list[Footprint]:
    """The operators the server runs for a submission: those of its chosen queries and of
    the queries they read, on the links the server captures itself (a fanned-out link once
    per member)."""
    from lowlevel.footprint import footprint

    needed: list[str] = []
    todo = [qp.name for qp in sub.chosen]
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.append(name)
        analysed = sub.plan.query(name).analysed
        todo += [s.query for s in (analysed.sources if analysed is not None else ())
                 if s.kind == "query" and s.query]
    out = []
    for name in needed:
        for lp in sub.plan.query(name).low:
            members = sub.fanout.get(lp.link, 0)
            if not members and lp.link in sub.remote:
                continue                      # its agent's memory
            out.extend([footprint(lp)] * max(1, members))
    return out


def estimate(sub: Submission) -> int:
    return sum(f.bytes for f in footprints(sub))


class MemoryBudget:
    """The bytes the running queries' tables may take together (module docstring)."""

    def __init__(self, total: int | None = None):
        self.total = int(total) if total else default_budget()
        self._lock = threading.Lock()
        #: submission name -> {grant: bytes beyond its table's estimate}
        self._grown: dict[str, dict[int, int]] = {}
        self._keys = itertools.count()

    def grown(self) -> int:
        """Bytes the adaptive tables hold beyond the running queries' estimates."""
        with self._lock:
            return sum(sum(g.values()) for g in self._grown.values())

    def grant(self, name: str, print_: Footprint,
              running: Callable[[], Iterable[Submission]]) -> Callable[[int], bool]:
        """`allow(slots)` for one adaptive table of submission `name` (estimated as
        `print_`): True, and the bytes counted, when a table of that many slots fits
        beside what `running()` and the other grants hold; shrinking always fits."""
        with self._lock:
            key = next(self._keys)
            self._grown.setdefault(name, {})[key] = 0

        def allow(slots: int) -> bool:
            extra = max(0, replace(print_, slots=slots).bytes - print_.bytes)
            held = sum(estimate(sub) for sub in running())
            with self._lock:
                mine = self._grown.setdefault(name, {})
                others = sum(sum(g.values()) for g in self._grown.values()) - mine.get(key, 0)
                if extra > mine.get(key, 0) and held + others + extra > self.total:
                    log.info("query %s: its table stays below %d slots: the memory budget "
                             "of %s is held", print_.query, slots, size_text(self.total))
                    return False
                mine[key] = extra
                return True

        return allow

    def release(self, name: str) -> None:
        """A submission ended: what its tables were granted is free again."""
        with self._lock:
            self._grown.pop(name, None)

    def check(self, sub: Submission, running: Iterable[Submission]) -> int:
        """The submission's estimate, or ServeError (413) naming the setting that sizes it,
        its value, the estimate and the budget."""
        prints = footprints(sub)
        need = sum(f.bytes for f in prints)
        held = sum(estimate(other) for other in running) + self.grown()
        if need == 0 or need + held <= self.total:
            return need
        big = max(prints, key=lambda f: f.bytes)
        slots = sub.plan.query(big.query).defines.get("aggregate_slots")
        setting = (f"aggregate_slots {int(slots):,}" if slots is not None
                   else f"aggregate_slots (the default, {big.slots:,})")
        tables = sum(1 for f in prints if f.bytes)
        raise ServeError(
            f"query {big.query}: {setting} needs about {size_text(need)} ({tables} "
            f"table{'s' if tables != 1 else ''} of up to {big.slots:,} slots of "
            f"{big.record_bytes} B, each with its output buffer), over the server's memory "
            f"budget of "
            f"{size_text(self.total)}"
            + (f" ({size_text(held)} held by the running queries)" if held else "")
            + "; lower aggregate_slots, or start the server with a larger --memory-budget",
            status=413)
