"""A NETFLOW link's meld of exporters (`capture.flowreader.FlowReorder`) over softflowd's real
v9 datagrams sent as several exporters: exporters with different clocks and a silent one,
every record released once, in order of flow start, windows never stalled by the silent one."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from capture.flowdecode import FlowDecoder
from capture.flowreader import FlowReorder
from tests.capture.test_capture_flowdecode import CAPTURE, softflowd_datagrams

S = 10**9


def shifted(datagram: bytes, seconds: int) -> bytes:
    """A v9 datagram whose exporter clock is `seconds` later (header unix seconds)."""
    (secs,) = struct.unpack_from(">I", datagram, 8)
    return datagram[:8] + struct.pack(">I", secs + seconds) + datagram[12:]


@pytest.fixture(scope="module")
def v9(pcaps_dir) -> list[bytes]:
    return softflowd_datagrams(pcaps_dir / CAPTURE, 9)


def melded(feed: list[tuple[bytes, str]], timeout_s: int):
    """Feed datagrams one at a time; (every release, the count decoded, the reorder)."""
    dec, reorder = FlowDecoder(), FlowReorder(timeout_s * S)
    releases, decoded = [], 0
    for i, (data, exporter) in enumerate(feed):
        cols = dec.decode([data], [exporter], [i * 10 * S])     # arriving 10 s apart
        decoded += len(cols["first"])
        out = reorder.push(cols, reorder.punctuation(dec))
        if out is not None:
            releases.append(out)
    return releases, decoded, reorder


def test_two_clocks_each_record_once_in_order(v9):
    """Two exporters, the second's clock two minutes ahead, their datagrams interleaved (softflowd
    exports every flow at the capture's end: an hour's timeout covers its disorder)."""
    feed = [x for a, b in zip(v9, v9) for x in ((a, "192.0.2.1"), (shifted(b, 120), "192.0.2.2"))]
    releases, decoded, reorder = melded(feed, 3600)
    end = reorder.flush()
    assert end is not None
    releases.append(end)
    firsts = np.concatenate([r["first"] for r in releases])
    assert len(firsts) == decoded == 2 * 394
    assert reorder.late == 0 and (np.diff(firsts) >= 0).all()
    exporters = np.concatenate([r["exporter_lo"] for r in releases]) & 0xFF
    assert sorted(set(exporters.tolist())) == [1, 2]


def test_a_silent_exporter_does_not_stall_the_meld(v9):
    """Exporter .3 sends one datagram, its clock ten minutes behind, then nothing: with a
    60 s timeout it no longer holds .1's records back; with an hour it does."""
    feed = [(shifted(v9[0], -600), "192.0.2.3")] + [(d, "192.0.2.1") for d in v9]
    released, decoded, reorder = melded(feed, 60)
    held_back, _, _ = melded(feed, 3600)
    from_live = sum(int(np.count_nonzero(r["exporter_lo"] & 0xFF == 1)) for r in released)
    assert from_live > 0
    assert sum(len(r["first"]) for r in held_back) < sum(len(r["first"]) for r in released)
    rest = reorder.flush()
    total = sum(len(r["first"]) for r in released) + (0 if rest is None else len(rest["first"]))
    assert total == decoded
