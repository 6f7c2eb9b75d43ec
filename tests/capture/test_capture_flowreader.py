"""A NETFLOW link's meld of exporters (`capture.flowreader.FlowMeld`) over softflowd's real
v9 datagrams sent as several exporters: exporters with different clocks and a silent one,
the punctuation on flow start or flow end, and a link whose every exporter is silent."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from capture.flowdecode import FlowDecoder
from capture.flowreader import FlowMeld
from tests.capture.test_capture_flowdecode import CAPTURE, softflowd_datagrams

S = 10**9


def shifted(datagram: bytes, seconds: int) -> bytes:
    """A v9 datagram whose exporter clock is `seconds` later (header unix seconds)."""
    (secs,) = struct.unpack_from(">I", datagram, 8)
    return datagram[:8] + struct.pack(">I", secs + seconds) + datagram[12:]


@pytest.fixture(scope="module")
def v9(pcaps_dir) -> list[bytes]:
    return softflowd_datagrams(pcaps_dir / CAPTURE, 9)


def melded(feed: list[tuple[bytes, str]], timeout_s: int, clock: str = "first",
           idle_s: int | None = None):
    """Feed datagrams one at a time, arriving 10 s apart; (the punctuation after each, the
    records decoded, the meld)."""
    dec, meld = FlowDecoder(), FlowMeld(timeout_s * S, clock,
                                        None if idle_s is None else idle_s * S)
    puncts, decoded = [], 0
    for i, (data, exporter) in enumerate(feed):
        cols = dec.decode([data], [exporter], [i * 10 * S])
        decoded += len(cols["first"])
        meld.admit(cols[clock])
        puncts.append(meld.advance(meld.punctuation(dec)))
    return puncts, decoded, meld, dec


def test_two_clocks_no_record_late(v9):
    """Two exporters, the second's clock two minutes ahead, their datagrams interleaved
    (softflowd exports every flow at the capture's end: an hour's timeout covers its
    disorder): the punctuation only grows, no record comes below it."""
    feed = [x for a, b in zip(v9, v9) for x in ((a, "192.0.2.1"), (shifted(b, 120), "192.0.2.2"))]
    puncts, decoded, meld, dec = melded(feed, 3600)
    assert decoded == 2 * 394 and meld.late == 0
    assert all(b >= a for a, b in zip(puncts, puncts[1:]))
    # the meld waits for the exporter behind: .1's export time minus the hour, plus the
    # 10 s it has been silent since (the last datagram was .2's)
    assert puncts[-1] == dec.latest_export[("192.0.2.1", 0)] + 10 * S - 3600 * S


def test_a_silent_exporter_does_not_stall_the_meld(v9):
    """Exporter .3 sends one datagram, its clock ten minutes behind, then nothing: with a
    60 s timeout it no longer holds .1 back once silent for a minute; with an hour it does."""
    feed = [(shifted(v9[0], -600), "192.0.2.3")] + [(d, "192.0.2.1") for d in v9]
    live, _, _, dec = melded(feed, 60)
    held, _, _, _ = melded(feed, 3600)
    e1 = dec.latest_export[("192.0.2.1", 0)]
    assert live[-1] == e1 - 60 * S                       # .1's alone
    assert held[-1] < e1 - 3600 * S                      # .3's, extrapolated by its silence


def test_every_exporter_silent_punctuation_goes_on(v9):
    """A collector whose exporters all fell silent: the punctuation advances with our clock
    (the next datagram cannot be exported before the silence ends), so windows close."""
    _, _, meld, dec = melded([(d, "192.0.2.1") for d in v9], 60)
    last_arrival = max(dec.latest_arrival.values())
    e = dec.latest_export[("192.0.2.1", 0)]
    marks = [meld.punctuation(dec, last_arrival + k * 30 * S) for k in range(6)]
    assert marks == [e - 60 * S + k * 30 * S for k in range(6)]
    # less the lull slack: a datagram may come that much later than the last one's delay
    slack = FlowMeld(60 * S, lull_slack_ns=2 * S)
    marks = [slack.punctuation(dec, last_arrival + k * 30 * S) for k in range(6)]
    assert marks == [e - 60 * S + max(0, k * 30 - 2) * S for k in range(6)]


def test_flow_end_punctuated_by_the_idle_timeout(v9):
    """On `last` the lag is the idle timeout: softflowd dumps its cache at the capture's end,
    so with a 10 s lag most records of later datagrams are late; an idle timeout above the
    capture's span (softflowd's own are minutes to an hour) makes none late, and the
    punctuation is the export time minus it."""
    feed = [(d, "192.0.2.1") for d in v9]
    _, _, strict, _ = melded(feed, 3600, "last", idle_s=10)
    puncts, _, safe, dec = melded(feed, 3600, "last", idle_s=600)
    assert strict.late > 100 and safe.late == 0
    assert puncts[-1] == dec.latest_export[("192.0.2.1", 0)] - 600 * S
    # unknown idle timeout: the active one (a flow ends after it starts)
    p_unknown, _, _, _ = melded(feed, 3600, "last")
    assert p_unknown[-1] == dec.latest_export[("192.0.2.1", 0)] - 3600 * S
    assert np.all(np.diff(np.array(puncts, np.int64)) >= 0)


def _reader(v9, tmp_path, clock: str = "first", **options):
    from dataclasses import replace

    from capture.flowreader import FlowReader
    from capture.schema import BUILTIN
    from tools.netflow.sender import PcapWriter

    pcap = tmp_path / "dg.pcap"
    writer = PcapWriter(str(pcap))
    writer.send([(d, None, 1_431_969_808_000 + 1000 * i) for i, d in enumerate(v9)])
    writer.close()
    fmt = BUILTIN.record_format("NETFLOW")
    assert fmt is not None
    return FlowReader(pcap, replace(fmt, clock=clock), "r1", **options)


@pytest.mark.parametrize("clock", ["first", "last"])
def test_records_leave_as_decoded_with_the_punctuation(v9, tmp_path, clock):
    """Nothing is held for the active timeout: each second's datagrams come out as one batch
    at once (a record per decoded record, timed by the link's clock), disordered, the
    batch carrying the punctuation; with an hour's timeout no record is below the
    punctuation given before it."""
    reader = _reader(v9, tmp_path, clock, active_timeout_ns=3600 * S)
    batches = list(reader)
    sizes = [len(b) for b in batches]
    dec = FlowDecoder()
    per_datagram = [len(dec.decode([d], ["127.0.0.1"], [0])["first"]) for d in v9]
    assert sizes == [n for n in per_datagram if n]
    given = None
    for b in batches:
        ts = b["timestamp"]
        assert np.array_equal(ts, b[clock])
        if given is not None:
            assert int(ts.min()) >= given
        assert b.punctuation is not None and (given is None or b.punctuation >= given)
        given = b.punctuation
    assert any((np.diff(b["timestamp"]) < 0).any() for b in batches)      # disordered
    assert reader.stats.late == 0 and reader.punctuation == given


def ipfix_active_timeout(seconds: int, export_s: int, domain: int = 0) -> bytes:
    """An IPFIX datagram of an options template (scope: exportingProcessId) and its record
    giving the exporter's flowActiveTimeout (IE 36), as a router sends it."""
    tmpl = struct.pack(">HHHHHHHH", 3, 18, 300, 2, 1, 144, 4, 36) + struct.pack(">H", 2)
    data = struct.pack(">HHIH", 300, 10, 1, seconds) + b"\0\0"
    body = tmpl + data
    return struct.pack(">HHIII", 10, 16 + len(body), export_s, 0, domain) + body


def test_the_operators_timeout_of_an_exporter_goes_first(v9):
    """Three exporters on one link, operator's timeout 1 h for all and 60 s for .1: .1 and
    .2 say theirs is 120 s (an options record), .3 says nothing. .1 is taken at the
    operator's word, .2 at its own, .3 at the operator's for all; the link's punctuation is
    the smallest of the three export times less their own lag."""
    export_s = struct.unpack_from(">I", v9[0], 8)[0]
    dec = FlowDecoder()
    meld = FlowMeld(3600 * S, exporter_timeouts_ns={"192.0.2.1": 60 * S})
    for exporter in ("192.0.2.1", "192.0.2.2"):
        dec.decode([ipfix_active_timeout(120, export_s)], [exporter], [0])
    feed = [(d, e) for d in v9 for e in ("192.0.2.1", "192.0.2.2", "192.0.2.3")]
    cols = dec.decode([d for d, _ in feed], [e for _, e in feed], [0] * len(feed))
    assert len(cols["first"]) == 3 * 394 and dec.stats.malformed == 0
    lags = {e: meld._timeouts(dec, e, 0) for e in ("192.0.2.1", "192.0.2.2", "192.0.2.3")}
    assert lags == {"192.0.2.1": (60 * S, 60 * S), "192.0.2.2": (120 * S, 120 * S),
                    "192.0.2.3": (3600 * S, 3600 * S)}
    marks = {e: dec.latest_export[(e, 0)] - lags[e][1] for e in lags}
    assert meld.punctuation(dec) == min(marks.values()) == marks["192.0.2.3"]
    # the operator's key is an address, however written (a dual-stack socket's view of .1)
    mapped = FlowMeld(3600 * S, exporter_timeouts_ns={"::ffff:192.0.2.1": 60 * S})
    assert mapped._timeouts(dec, "192.0.2.1", 0) == (60 * S, 60 * S)
    # without the operator's value for .1 it is taken at its own word too
    assert FlowMeld(3600 * S)._timeouts(dec, "192.0.2.1", 0) == (120 * S, 120 * S)


def test_a_reader_decodes_only_the_columns_read(v9, tmp_path):
    """Given the columns its queries read (a run's link), the reader's batches carry those
    and the batch's own, equal to a full reader's; the fields no query reads are not made."""
    full = list(_reader(v9, tmp_path))
    cols = ("timestamp", "len", "layers", "reason", "srcIP_hi", "srcIP_lo", "bytes")
    some = list(_reader(v9, tmp_path, columns=cols))
    assert [len(b) for b in some] == [len(b) for b in full]
    for a, b in zip(some, full):
        assert set(a.columns) == {*cols, "arrival", "first"}       # and its clock
        for c in a.columns:
            assert np.array_equal(a[c], b[c]), c
        assert a.punctuation == b.punctuation
    assert "destPort" in full[0].columns and "time_s" in full[0].columns


_WARM_QUERY = ("SELECT tb, srcIP, sum(bytes) AS b, count(*) AS n FROM r1.NETFLOW "
               "WHERE {where} GROUP BY first/60000000000 AS tb, srcIP")


def _rows(op, batches) -> list:
    import pyarrow as pa

    out = []
    for b in batches:
        out += op.process(b)
        if b.punctuation is not None:
            out += op.punctuate(b.punctuation)[0]
    out += op.finish()[0]
    return sorted(pa.Table.from_batches([r for r in out if r.num_rows]).to_pylist(),
                  key=lambda r: sorted(r.items()))


def test_a_sample_batch_warms_the_operators_it_leaves_as_they_were(v9, tmp_path):
    """A reader's made-up batch (a collector's operators are warmed with it before the
    first datagram) has the columns and types of its real batches; the operator warmed
    with it then gives the rows and counts of one that was not. A plan calling a user
    function is not warmed: the function would see the made-up records."""
    from lowlevel.operator import LowLevelOperator
    from queries.planner import plan_text
    from queries.udf import FunctionLibrary

    plan = plan_text(_WARM_QUERY.format(where="bytes > 100"), ["r1"]).queries[0].low[0]
    warmed, plain = LowLevelOperator(plan), LowLevelOperator(plan)
    reader = _reader(v9, tmp_path, columns=warmed.read_columns)
    sample = reader.sample_batch()
    assert len(sample) == 2 and sample.punctuation is None and reader.punctuation is None
    batches = list(reader)
    assert set(sample.columns) == set(batches[0].columns)
    assert all(sample[c].dtype == batches[0][c].dtype for c in sample.columns)
    assert warmed.warm(sample)
    assert warmed.counters == plain.counters
    rows = _rows(warmed, batches)
    assert len(rows) > 10 and rows == _rows(plain, batches)
    assert warmed.counters == plain.counters

    (tmp_path / "f.def").write_text("uint FUN [LFTA_LEGAL] halved(uint);\n")
    (tmp_path / "f.py").write_text("def halved(x):\n    return x // 2\n")
    library = FunctionLibrary.load((str(tmp_path / "f.def"),), str(tmp_path / "f.py"))
    udf = plan_text(_WARM_QUERY.format(where="halved(bytes) > 50"), ["r1"],
                    functions=library).queries[0].low[0]
    assert not LowLevelOperator(udf).warm(sample)
