"""Timer ticks on the wall clock's period boundaries (`capture.punctuation.next_tick`), and a
replayed link that punctuates while it is busy: it used to tick only when a turn found no
packet due, so at a few hundred thousand packets a second its windows closed seconds late."""

from __future__ import annotations

import time

import numpy as np

from capture.punctuation import LinkTimer, next_tick, tick_due
from tools.pipeline.links import ReplayLink

NS = 1_000_000_000


def test_ticks_fall_on_period_boundaries_plus_the_margin():
    assert next_tick(5 * NS + 300, NS) == 6 * NS
    assert next_tick(6 * NS, NS) == 7 * NS                       # never the same instant
    assert next_tick(6 * NS + 10, NS, margin_ns=20) == 6 * NS + 20
    assert next_tick(6 * NS + 25, NS, margin_ns=20) == 7 * NS + 20
    assert next_tick(123, 0) == 123                              # no period: at once


def test_a_tick_is_due_at_its_time_or_when_the_clock_went_back():
    assert not tick_due(10 * NS, 11 * NS, NS)
    assert tick_due(11 * NS, 11 * NS, NS)
    assert tick_due(3 * NS, 11 * NS, NS)        # set back by 8 s: tick now, plan anew


def test_a_busy_replay_punctuates_while_it_plays_and_never_before_its_packets(tmp_path):
    """500K packets/s paced (packets due at every turn of the replay): punctuations come
    while it plays, every 20 ms period; no packet is taken after a punctuation above it."""
    from tools.gen.traffic import TrafficConfig, generate

    pcap = generate(TrafficConfig(packets=150_000, duration_ns=3 * NS, groups=1000,
                                  seed=3).validate(), tmp_path / "busy.pcap")["l0"]
    replay = ReplayLink("main", str(pcap), LinkTimer(0, NS), period_ns=NS // 50, speed=10.0)
    replay.start()
    taken, puncts, largest_p, late = 0, [], None, 0
    deadline = time.monotonic() + 60
    try:
        while taken < 150_000 and time.monotonic() < deadline:
            batch, p = replay.ring.take(65536)
            if batch is not None:
                ts = np.asarray(batch["timestamp"])
                if largest_p is not None:
                    late += int((ts < largest_p).sum())
                taken += len(ts)
            if p is not None:
                if taken < 140_000:                # while packets still come
                    puncts.append(p)
                largest_p = p if largest_p is None else max(largest_p, p)
            if batch is None:
                time.sleep(0.005)
    finally:
        replay.ring.release()
        replay.stop()
        replay.join(timeout=10)
    assert replay.error is None and taken == 150_000
    assert late == 0
    # 0.3 s of packets, ticks every 20 ms: the old loop gave none until the file's end
    assert len(puncts) >= 2, puncts
    assert puncts == sorted(puncts)
