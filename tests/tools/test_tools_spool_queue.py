"""tools.pipeline.feeds.SpoolQueue: spool files written on a thread of their own, in order; a write
that fails reaches the low level's thread."""

from __future__ import annotations

import threading

import pytest

from tools.pipeline.feeds import SpoolQueue


class Recorder:
    def __init__(self, fail_at=None):
        self.calls, self.fail_at, self.threads = [], fail_at, set()
        self.gate = threading.Event()
        self.gate.set()

    def write(self, partials, punctuation):
        self.gate.wait()
        self.threads.add(threading.get_ident())
        if punctuation == self.fail_at:
            raise OSError(f"disk full at {punctuation}")
        self.calls.append((partials, punctuation))


def test_writes_in_order_on_another_thread():
    q, a, b = SpoolQueue(depth=2), Recorder(), Recorder()
    for i in range(50):
        q.put(a if i % 3 else b, [i], i)
    q.flush()
    assert [p for _, p in a.calls] == [i for i in range(50) if i % 3]
    assert [p for _, p in b.calls] == [i for i in range(50) if not i % 3]
    assert threading.get_ident() not in a.threads | b.threads
    q.close()
    assert not q._thread.is_alive()


def test_a_failed_write_is_raised_and_no_later_file_is_written():
    q, w = SpoolQueue(depth=8), Recorder(fail_at=3)
    w.gate.clear()                 # every put is in before the first write
    for i in range(6):
        q.put(w, [i], i)
    w.gate.set()
    with pytest.raises(OSError, match="disk full at 3"):
        q.flush()
    q.flush()                      # raised once
    assert [p for _, p in w.calls] == [0, 1, 2]
    q.close()
