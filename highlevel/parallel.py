"""Work on the parts of a large result on several threads, results in order.

A closed batch of flow records is millions of rows. Taking them in sorted order, turning
addresses into text and formatting CSV are kernels that release the GIL (Arrow compute,
Numba `nogil`), so the parts of a batch run side by side on the machine's cores. When the low
level is done (the end of a replay) a core is otherwise idle; while it reads, the threads
share the priority of the thread that made them (`highlevel.session.lower_priority`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: threads at most (the machines this runs on have 2 to a few cores; more threads only
#: split memory bandwidth)
MAX_THREADS = 4


def threads() -> int:
    return max(1, min(MAX_THREADS, os.cpu_count() or 1))


def map_ordered(fn: Callable[[T], R], parts: Iterable[T], ahead: int | None = None) -> Iterator[R]:
    """fn(part) for each part, in order, computed on `threads()` threads with at most
    `ahead` parts (default: 2 per thread) in flight; on one core, in this thread."""
    n = threads()
    if n == 1:
        yield from map(fn, parts)
        return
    ahead = ahead or 2 * n
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="oopscope-part") as pool:
        pending = []
        for part in parts:
            pending.append(pool.submit(fn, part))
            if len(pending) >= ahead:
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()
