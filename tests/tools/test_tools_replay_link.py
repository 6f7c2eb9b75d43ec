"""A capture file as a replay link (tools.pipeline.replay.FileLink): packets come out in chunks bounded by
the running maximum of capture time, across batches, whether a batch's timestamps are in order
(the reader says so, and the link then takes them as they are) or not.

Oracle: the running maximum computed over the whole file at once with numpy."""

from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from capture.reader import open_capture
from tests.capture.capture_writers import NS, pcap_bytes
from tools.pipeline.replay import FileLink

FRAME = bytes(Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=1, dport=2))
#: batches of 4: in order; starting below the last maximum and out of order inside; in order
#: again above it; in order but starting below the maximum
SECONDS = [10, 20, 30, 40, 35, 50, 45, 60, 70, 80, 90, 95, 93, 96, 97, 98]


@pytest.fixture()
def capture(tmp_path):
    path = tmp_path / "order.pcap"
    path.write_bytes(pcap_bytes([(s * NS, FRAME) for s in SECONDS]))
    return path


def test_the_reader_says_which_batches_are_in_order(capture):
    with open_capture(capture, batch_size=4) as reader:
        flags = [b.in_order for b in reader]
    assert flags == [True, False, True, True]
    # a slice keeps the flag; an out-of-order batch is never called in order
    with open_capture(capture, batch_size=4) as reader:
        first = next(iter(reader))
        assert first.slice(1, 3).in_order


@pytest.mark.parametrize("prefetch", [0, 2])
def test_chunks_follow_the_running_maximum(capture, prefetch):
    ts = np.array(SECONDS, np.int64) * NS
    running = np.maximum.accumulate(ts)
    link = FileLink("a", str(capture), batch_size=4, prefetch=prefetch)
    got, heads = [], []
    for bound_s in (15, 36, 41, 55, 61, 94, 96, 200):
        while True:
            head = link.head()
            if head is None or head >= bound_s * NS:
                break
            heads.append(head)
            chunk = link.take_until(bound_s * NS)
            assert chunk is not None
            got.append(np.array(chunk["timestamp"]))
            # every packet of the chunk has a running maximum below the bound
            seen = np.concatenate(got)
            assert (running[:len(seen)] < bound_s * NS).all()
    seen = np.concatenate(got)
    np.testing.assert_array_equal(seen, ts)                  # every packet, in file order
    assert heads == sorted(heads)                            # the head never goes back
    assert link.head() is None and link.max_seen == running[-1]
    link.close()
