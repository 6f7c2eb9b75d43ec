"""The Numba walk over whole datagrams (`capture.flowkernels.walk_datagrams`, used by
`FlowDecoder.decode`) against the decoder reading every datagram in Python (`walk = False`):
the same columns, counts by reason and exporter, sequence gaps, versions and export times, on
a real router's capture, softflowd's v9 and IPFIX output, oopscope's exporter, datagrams
lost in between, and mutated datagrams behind known templates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture.flowdecode import FlowDecoder
from capture.flowsource import read_datagrams
from tests.capture.test_capture_flowdecode import CAPTURE, mutate, softflowd_datagrams


def both(datagrams: list[bytes], exporters: list[str], per_call: int = 50):
    """(walked, read in Python): two decoders fed the same calls, and their columns."""
    out = []
    for walk in (True, False):
        dec = FlowDecoder(max_pending=16)
        dec.walk = walk
        calls = [dec.decode(datagrams[a:a + per_call], exporters[a:a + per_call],
                            list(range(a, min(a + per_call, len(datagrams)))))
                 for a in range(0, len(datagrams), per_call)]
        cols = {k: np.concatenate([c[k] for c in calls]) for k in calls[0]}
        out.append((dec, cols))
    return out


def assert_same(datagrams: list[bytes], exporters: list[str], per_call: int = 50) -> int:
    (a, ca), (b, cb) = both(datagrams, exporters, per_call)
    for k in cb:
        assert ca[k].dtype == cb[k].dtype and np.array_equal(ca[k], cb[k]), k
    assert a.stats.reasons == b.stats.reasons
    assert a.stats.by_exporter == b.stats.by_exporter
    assert a.stats.gaps == b.stats.gaps
    assert a.stats.versions == b.stats.versions
    assert (a.stats.records, a.stats.datagrams, a.stats.bytes) == \
        (b.stats.records, b.stats.datagrams, b.stats.bytes)
    assert a.latest_export == b.latest_export and a.latest_arrival == b.latest_arrival
    assert a._next_seq == b._next_seq and a.pending == b.pending
    return len(cb["first"])


@pytest.fixture(scope="module")
def softflowd(pcaps_dir) -> dict[int, list[bytes]]:
    return {v: softflowd_datagrams(pcaps_dir / CAPTURE, v) for v in (9, 10)}


def test_real_router_capture(pcaps_dir):
    """netflowv9.pcap's templates came before the capture: every data set is held, the
    headers and sequences read the same way."""
    dg = read_datagrams(pcaps_dir / "netflowv9.pcap")
    for per_call in (1, 7, 1000):
        assert assert_same(dg.payloads, dg.exporters, per_call) == 0
    (a, _), _ = both(dg.payloads, dg.exporters)
    assert a.pending > 0 and a.stats.versions == {9: 10}


@pytest.mark.parametrize("version", [9, 10])
def test_softflowd_output(softflowd, version):
    d = softflowd[version]
    n = assert_same(d * 3, ["192.0.2.1"] * (3 * len(d)))
    assert n > 100
    # two exporters interleaved: templates and sequences are theirs each
    mixed = [x for pair in zip(d, d) for x in pair]
    assert_same(mixed, ["192.0.2.1", "192.0.2.2"] * len(d), per_call=9)


@pytest.mark.parametrize("version", [9, 10])
def test_own_exporter_with_losses(pcaps_dir, tmp_path, version):
    """oopscope's exporter (templates every 8 messages), with datagrams lost: the walk
    counts the same sequence gaps."""
    from tests.capture.test_capture_flowdecode import _flow_table, _skype_flows
    from tools.netflow.exporter import Exporter

    pcap = tmp_path / "dg.pcap"
    ex = Exporter(None, version, pcap=str(pcap), template_every_messages=8)
    try:
        ex.export(_flow_table(_skype_flows(pcaps_dir)))
    finally:
        ex.close()
    d = read_datagrams(pcap).payloads
    assert len(d) > 10
    lost = [x for i, x in enumerate(d) if i % 5 != 3]
    (a, _), _ = both(lost, ["10.0.0.1"] * len(lost))
    assert a.stats.sequence_gaps > 0
    assert_same(lost, ["10.0.0.1"] * len(lost), per_call=6)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_mutated_datagrams_behind_known_templates(softflowd, data):
    """Data datagrams mutated after their templates came (what the walk takes): counted as
    the Python reader counts them, never raised."""
    version = data.draw(st.sampled_from([9, 10]))
    d = softflowd[version]
    mutated = [mutate(data, x, 4) for x in d[3:12]]
    feed = d[:3] + mutated
    assert_same(feed, ["192.0.2.7"] * len(feed), per_call=len(feed))
