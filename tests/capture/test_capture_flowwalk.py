"""The Numba walk over whole datagrams (`capture.flowkernels.walk_datagrams`, used by
`FlowDecoder.decode`) against the decoder reading every datagram in Python (`walk = False`):
the same columns, counts by reason and exporter, sequence gaps, versions and export times, on
a real router's capture, softflowd's v9 and IPFIX output, oopscope's exporter, datagrams
lost in between, and mutated datagrams behind known templates."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capture.flowdecode import FLOW_COLUMNS, FlowDecoder
from capture.flowsource import read_datagrams
from tests.capture.test_capture_flowdecode import (
    CAPTURE,
    _template_set,
    _v9,
    mutate,
    own_exporter_datagrams,
    softflowd_datagrams,
)


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
    d = own_exporter_datagrams(pcaps_dir, tmp_path, version).payloads
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


#: the NETFLOW columns, and the sets of them a run's queries may read
COLUMNS = [name for name, _ in FLOW_COLUMNS]


def projected(datagrams: list[bytes], exporters: list[str], columns, per_call: int = 50):
    """The columns of a decoder made to produce only `columns` (`FlowDecoder.project`), with
    its counts."""
    dec = FlowDecoder(max_pending=16)
    dec.project(columns)
    calls = [dec.decode(datagrams[a:a + per_call], exporters[a:a + per_call],
                        list(range(a, min(a + per_call, len(datagrams)))))
             for a in range(0, len(datagrams), per_call)]
    assert all(tuple(c) == dec.produces for c in calls)
    return dec, {k: np.concatenate([c[k] for c in calls]) for k in dec.produces}


def assert_projection_same(datagrams: list[bytes], exporters: list[str], columns,
                           per_call: int = 50) -> None:
    """A projected decode makes exactly the named columns, each equal to the full decode's,
    with the same counts (a field skipped is still walked over by its length)."""
    (full, cols), _ = both(datagrams, exporters, per_call)
    dec, got = projected(datagrams, exporters, columns, per_call)
    assert set(got) == set(columns)
    for k in columns:
        assert got[k].dtype == cols[k].dtype and np.array_equal(got[k], cols[k]), k
    assert dec.stats.reasons == full.stats.reasons
    assert dec.stats.records == full.stats.records and dec.pending == full.pending


@pytest.mark.parametrize("version", [9, 10])
def test_projected_columns_equal_the_full_decode(softflowd, version):
    """softflowd's IPv4 and IPv6 flows (an address read by halves), a query's few columns,
    each column alone, and none but the clock."""
    d = softflowd[version]
    exporters = ["192.0.2.7"] * len(d)
    for columns in (["first", "srcIP_hi", "srcIP_lo", "bytes"], ["ipversion", "sampling"],
                    ["last", "destIP_lo", "destIP_hi", "next_hop_hi", "next_hop_lo",
                     "exporter_hi", "exporter_lo", "arrival", "export", "version", "domain"],
                    ["first"], *([c] for c in COLUMNS)):
        if columns[0].endswith("_hi") or columns[0].endswith("_lo"):
            columns = [columns[0][:-3] + "_hi", columns[0][:-3] + "_lo"]
        assert_projection_same(d, exporters, columns)


def _ipfix(body: bytes, seq: int) -> bytes:
    return struct.pack(">HHIII", 10, 16 + len(body), 1_700_000_000, seq, 0) + body


def ipfix_varlen_pair(n: int = 20) -> list[bytes]:
    """IPFIX datagrams: templates 256 and 257, the same n records in a data set of each.
    256 has a variable-length interfaceName (IE 82: lengths 0 to 300, the long ones in
    three bytes), 257 the same field 6 bytes long (padded). Both are skipped by length."""
    fields = [(8, 4), (1, 8), (82, 65535), (7, 2), (150, 4), (2, 4), (4, 1)]
    t256 = struct.pack(">HH", 256, len(fields)) + b"".join(struct.pack(">HH", *f)
                                                          for f in fields)
    fixed = [(ie, 6 if ln == 65535 else ln) for ie, ln in fields]
    t257 = struct.pack(">HH", 257, len(fixed)) + b"".join(struct.pack(">HH", *f)
                                                         for f in fixed)
    tmpl = t256 + t257
    tset = struct.pack(">HH", 2, 4 + len(tmpl)) + tmpl
    var, fix = b"", b""
    for i in range(n):
        name = b"x" * (300 if i % 7 == 3 else i % 5)
        head = struct.pack(">IQ", 0x0A000000 + i, 1000 + i)
        tail = struct.pack(">HIIB", 1024 + i, 1_700_000_000 - 60 + i, 70_000 + i, 6 + i % 2)
        size = bytes([len(name)]) if len(name) < 255 else b"\xff" + struct.pack(">H", len(name))
        var += head + size + name + tail
        fix += head + name[:6].ljust(6, b"\0") + tail
    return [_ipfix(tset, 0), _ipfix(struct.pack(">HH", 256, 4 + len(var)) + var, 0),
            _ipfix(struct.pack(">HH", 257, 4 + len(fix)) + fix, n)]


def test_variable_length_fields_read_as_fixed_ones():
    """The same records under a template with a variable-length field (read record by
    record) and one with that field fixed (read by the template's plan): the same columns,
    in full and projected."""
    d = ipfix_varlen_pair()
    dec = FlowDecoder()
    cols = dec.decode(d, ["192.0.2.7"] * 3, [0, 0, 0])
    assert dec.stats.records == 40 and not dec.stats.reasons
    for k, v in cols.items():
        assert np.array_equal(v[:20], v[20:]), k
    assert cols["srcPort"][:3].tolist() == [1024, 1025, 1026]
    assert cols["packets"][:3].tolist() == [70_000, 70_001, 70_002]
    assert cols["protocol"][:3].tolist() == [6, 7, 6]
    assert cols["bytes"][:3].tolist() == [1000, 1001, 1002]
    assert (cols["first"][:3] // 10**9).tolist() == [1_700_000_000 - 60 + i for i in range(3)]
    assert_projection_same(d, ["192.0.2.7"] * 3, ["first", "bytes", "srcPort"])
    assert_projection_same(d, ["192.0.2.7"] * 3, ["srcIP_hi", "srcIP_lo"], per_call=1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_projected_mutated_datagrams(softflowd, data):
    """Mutated data datagrams behind known templates, a random choice of columns: the same
    records, columns and counts as the full decode."""
    version = data.draw(st.sampled_from([9, 10]))
    d = softflowd[version]
    feed = d[:3] + [mutate(data, x, 4) for x in d[3:12]]
    columns = data.draw(st.lists(st.sampled_from(["first", "last", "bytes", "packets",
                                                  "srcPort", "protocol", "ipversion",
                                                  "sampling", "arrival"]),
                                 min_size=1, unique=True))
    assert_projection_same(feed, ["192.0.2.7"] * len(feed), columns, per_call=len(feed))


def _read_in_python(dec: FlowDecoder) -> list[int]:
    """The datagrams (index in their call) the walk of `dec` leaves to the Python reader."""
    read: list[int] = []
    walk_stops_at = dec._read_one

    def counted(blob, d_start, lens, codes, arr, i, *rest):
        read.append(int(i))
        return walk_stops_at(blob, d_start, lens, codes, arr, i, *rest)

    dec._read_one = counted         # type: ignore[method-assign]
    return read


@pytest.mark.parametrize("version", [9, 10])
def test_refreshed_templates_and_options_stay_on_the_walk(pcaps_dir, tmp_path, version):
    """oopscope's exporter resends its template set (v9: its options template and sampling
    record too) every 2 messages: past the first two, the walk steps over the byte-equal
    copies instead of leaving their datagrams to Python, and decodes as Python does."""
    d = own_exporter_datagrams(pcaps_dir, tmp_path, version, template_every=2).payloads
    refreshes = sum(1 for x in d if x[20 if version == 9 else 16:][:2] in
                    (b"\0\0", b"\0\2"))
    assert refreshes >= 4
    dec = FlowDecoder()
    read = _read_in_python(dec)
    cols = dec.decode(d, ["10.0.0.1"] * len(d), list(range(len(d))))
    assert len(read) <= 2 and len(cols["first"]) == dec.stats.records > 100
    assert_same(d, ["10.0.0.1"] * len(d), per_call=len(d))
    assert_same(d, ["10.0.0.1"] * len(d), per_call=5)


def test_a_refresh_that_changes_an_option_is_read():
    """v9 datagrams each with a data set: the template, options template and a sampling
    record (interval 10) are sent, sent again unchanged (stepped over by the walk), then
    with interval 20 (read), then again: every record has the interval of the latest record
    before it, walked or read in Python."""
    tmpl = _template_set((8, 4), (2, 4), (1, 4))
    opt_t = struct.pack(">HH", 1, 4 + 14) + struct.pack(">HHHHHHH", 258, 4, 4, 1, 4, 34, 4)

    def sampling(interval: int) -> bytes:
        return struct.pack(">HHII", 258, 12, 1, interval)

    data = struct.pack(">HHIII", 256, 16, 0x0A000001, 5, 700)
    plan = [(tmpl, opt_t, sampling(10), data), (data,), (tmpl, opt_t, sampling(10), data),
            (data,), (tmpl, opt_t, sampling(20), data), (data,),
            (tmpl, opt_t, sampling(20), data), (data,)]
    datagrams = [_v9(i, *sets) for i, sets in enumerate(plan)]
    dec = FlowDecoder()
    read = _read_in_python(dec)
    cols = dec.decode(datagrams, ["192.0.2.1"] * len(plan), list(range(len(plan))))
    assert cols["sampling"].tolist() == [10, 10, 10, 10, 20, 20, 20, 20]
    assert 2 not in read and 4 in read and read[0] == 0
    assert_same(datagrams, ["192.0.2.1"] * len(plan), per_call=len(plan))
    assert_same(datagrams, ["192.0.2.1"] * len(plan), per_call=3)
