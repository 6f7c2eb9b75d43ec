"""Read-ahead for capture readers: a thread frames and decodes the next batches while the consumer works on the current one.

This is the packet ring of the thesis (section 8.3) on a multi-core machine: the framing and
decoding kernels release the GIL (`ngjit` is nogil), as do file reads and the low level's
hash-table kernel, so a reader thread decoding batch k+1 overlaps the consumer aggregating
batch k on another core. The reader decodes into a pool of `depth + 1` column buffers: the
consumer holds one (the batch it was given, valid until it asks for the next one, exactly as
without read-ahead), the thread fills up to `depth` others. Errors raised by the reader
(a broken record, a read error) are re-raised in the consumer after every batch before them,
in order, as without read-ahead.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

_END = object()


class ReadAhead:
    """Iterate `produce(take_buffer)`'s batches, produced in a thread.

    `produce` is a generator function; it calls `take_buffer()` for the column buffer of each
    next batch (blocking while every buffer is in use) and yields batches that are views of
    it. `buffers` holds `depth + 1` buffers.
    """

    def __init__(self, produce: Callable, buffers: list, name: str = "oopscope-read-ahead"):
        if len(buffers) < 2:
            raise ValueError("read-ahead needs at least two buffers")
        self._free: queue.Queue = queue.Queue()
        for b in buffers[1:]:
            self._free.put(b)
        self._first = buffers[0]
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._held = None           # the buffer of the batch the consumer holds
        self._produce = produce
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False

    def _take(self):
        if self._first is not None:
            b, self._first = self._first, None
            return b
        b = self._free.get()
        if self._stop.is_set():
            raise _Stopped
        return b

    def _run(self) -> None:
        try:
            for batch, buf in self._produce(self._take):
                self._ready.put((batch, buf, None))
                if self._stop.is_set():
                    return
        except _Stopped:
            return
        except BaseException as exc:  # handed to the consumer, raised there in order
            self._ready.put((None, None, exc))
            return
        self._ready.put((_END, None, None))

    def __iter__(self) -> Iterator:
        if not self._started:
            self._started = True
            self._thread.start()
        while True:
            batch, buf, exc = self._ready.get()
            if self._held is not None:
                self._free.put(self._held)   # the consumer asked for more: the last is done
                self._held = None
            if exc is not None:
                raise exc
            if batch is _END:
                return
            self._held = buf
            yield batch

    def close(self) -> None:
        """Stop the thread (an abandoned iteration) and wait for it."""
        if not self._started:
            return
        self._stop.set()
        self._free.put(None)   # wakes a thread waiting for a buffer
        while self._thread.is_alive():
            try:                # a thread blocked on nothing: drain so it can finish
                self._ready.get(timeout=0.05)
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)


class _Stopped(Exception):
    """The consumer closed the reader: the thread ends without reading further."""
