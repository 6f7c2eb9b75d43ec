"""The buffer of a record link in the appliance: the packet ring's contract over record batches.

A packet link's producer thread hands its rows to the consumer through a fixed-size packet
ring (`capture.ring.PacketRing`), whose columns are the packet schema's. The records of a
schema-file protocol have the columns of their protocol and carry their link's string table
(`capture.batch.RecordBatch`), so a record link's producer hands them over through this
queue instead, with the same rules:

- it holds at most `capacity` rows; `push` never waits: the rows that do not fit are dropped
  and counted, so `offered == processed + dropped + occupancy`;
- punctuation travels in order with the rows: `take` returns, with a batch, the largest
  punctuation whose rows have all been handed out;
- `take` hands out at most `max_rows` rows, counted as processed at the next `take` or
  `release`; `finish` ends the stream and `done` says when everything has been taken.

Batches are queued whole (a record reader makes fresh arrays for every batch, so no copy is
needed); one lock guards the queue: records arrive in batches of thousands, not per packet.
"""

from __future__ import annotations

import threading
from collections import deque

from capture.errors import RingError
from capture.ring import NO_PUNCT, RingStats


class RecordQueue:
    """A bounded FIFO of record batches and punctuations (see the module docstring)."""

    def __init__(self, capacity: int, link: str):
        if capacity < 1:
            raise RingError(f"record queue capacity must be a positive number of rows "
                            f"(got {capacity})")
        self.capacity = int(capacity)
        self.link = link
        self._items: deque = deque()          # RecordBatch, or int (a punctuation)
        self._lock = threading.Lock()
        self._rows = 0                        # rows queued, not yet handed out
        self._lent = 0                        # rows of the last take, not yet released
        self._finished = False
        self._last_punct = NO_PUNCT
        self.offered = self.processed = self.dropped = self.high = self.punctuations = 0

    # --- producer ---------------------------------------------------------------------------
    def push(self, batch) -> int:
        """Queue what fits of `batch`; the rest is dropped and counted. Rows accepted."""
        n = len(batch)
        with self._lock:
            k = max(0, min(n, self.capacity - self._rows - self._lent))
            if k:
                self._items.append(batch if k == n else batch.slice(0, k))
                self._rows += k
                self.high = max(self.high, self._rows + self._lent)
            self.offered += n
            self.dropped += n - k
        return k

    def punctuate(self, p: int) -> bool:
        """`no row of this link with a timestamp below p follows`; False if it adds nothing."""
        p = int(p)
        with self._lock:
            if p <= self._last_queued():
                return False
            self._items.append(p)
            self.punctuations += 1
            return True

    def _last_queued(self) -> int:
        for item in reversed(self._items):
            if isinstance(item, int):
                return item
        return self._last_punct

    def finish(self) -> None:
        with self._lock:
            self._finished = True

    # --- consumer ---------------------------------------------------------------------------
    def take(self, max_rows: int = 65536):
        """(batch or None, punctuation or None), as `PacketRing.take`."""
        if max_rows < 1:
            raise RingError(f"take needs max_rows >= 1 (got {max_rows})")
        self.release()
        batch = None
        punct = NO_PUNCT
        with self._lock:
            items = self._items
            while items and isinstance(items[0], int):
                punct = max(punct, items.popleft())
            if items:
                head = items[0]
                if len(head) <= max_rows:
                    batch = items.popleft()
                else:
                    batch = head.slice(0, max_rows)
                    items[0] = head.slice(max_rows, len(head))
                self._rows -= len(batch)
                self._lent = len(batch)
                while items and isinstance(items[0], int):
                    punct = max(punct, items.popleft())
        if punct > self._last_punct:
            self._last_punct = punct
            return batch, punct
        return batch, None

    def release(self) -> None:
        with self._lock:
            self.processed += self._lent
            self._lent = 0

    @property
    def done(self) -> bool:
        """The producer has finished and everything has been taken."""
        with self._lock:
            return self._finished and not self._items

    def free(self) -> int:
        with self._lock:
            return self.capacity - self._rows - self._lent

    def __len__(self) -> int:
        with self._lock:
            return self._rows + self._lent

    def stats(self) -> RingStats:
        with self._lock:
            return RingStats(self.capacity, self.offered, self.processed, self.dropped,
                             self._rows + self._lent, self.high, self.punctuations)

    def close(self) -> None:
        with self._lock:
            self._items.clear()
            self._rows = 0
