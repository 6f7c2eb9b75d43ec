"""A served NETFLOW link on flow start and flow end at once (`tools.pipeline.flowlinks`), over
softflowd's real v9 datagrams of skype.pcap in a capture: the reader's punctuation on each
clock equals that of a reader of that clock alone; a lane stamps the records with its clock
(the arrays shared) and punctuates it; a restarted file link reads past records by flow end
once a query windows on it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from capture.schema import BUILTIN
from tests.capture.test_capture_flowdecode import CAPTURE, softflowd_datagrams

S = 10**9


@pytest.fixture(scope="module")
def pcap(pcaps_dir, tmp_path_factory):
    from tools.netflow.sender import PcapWriter

    path = tmp_path_factory.mktemp("lanes") / "dg.pcap"
    writer = PcapWriter(str(path))
    writer.send([(d, None, 1_431_969_808_000 + 1000 * i)
                 for i, d in enumerate(softflowd_datagrams(pcaps_dir / CAPTURE, 9))])
    writer.close()
    return path


def _reader(pcap, clock: str, clocks=()):
    from capture.flowreader import FlowReader

    fmt = BUILTIN.record_format("NETFLOW")
    assert fmt is not None
    # a 10-s idle timeout: the punctuation on flow end runs ahead of that on flow start
    return FlowReader(pcap, replace(fmt, clock=clock), "r1", 64, clocks=clocks,
                      idle_timeout_ns=10 * S)


def test_reader_punctuates_both_clocks_as_each_alone(pcap):
    both = _reader(pcap, "first", ("last",))
    batches = list(both)
    assert sum(len(b) for b in batches) > 300
    assert all(set(b.punctuations) == {"first", "last"} for b in batches)
    assert all(b.punctuation == b.punctuations["first"] for b in batches)
    for clock in ("first", "last"):
        alone = list(_reader(pcap, clock))
        assert [b.punctuation for b in alone] == [b.punctuations[clock] for b in batches]
        assert both.stats.late_by_clock[clock] == _late(pcap, clock)
    given = batches[-1].punctuations
    assert given["last"] > given["first"]
    # softflowd's end-of-capture dump ends long before its export time less 10 s: late
    assert both.stats.late_by_clock["last"] > 100 and both.stats.late_by_clock["first"] == 0
    assert both.stats.late == both.stats.late_by_clock["first"]


def _late(pcap, clock: str) -> int:
    reader = _reader(pcap, clock)
    for _ in reader:
        pass
    return reader.stats.late


def _link(pcap):
    from tools.pipeline.flowlinks import open_flow_links

    return open_flow_links([("r1", str(pcap))], period_ns=0, slack_ns=0, speed=1.0,
                           timeout_ns=1800 * S, state_dir=None)["r1"]


def test_lanes_stamp_and_punctuate_their_clock(pcap):
    link = _link(pcap)
    reader = link._reader()
    batches = iter(reader)
    link._hand_on(next(batches))           # before any query on `last`: its lane is not made
    assert list(link.lanes) == ["first"]
    lane = link.want("last")
    assert list(link.lanes) == ["first", "last"] and link.want("last") is lane
    # the new lane starts at the latest flow end read and the punctuation given on it
    assert lane.timer.max_seen is not None and lane.given is not None
    for batch in batches:
        link._hand_on(batch)
    taken = {}
    for clock, l in link.lanes.items():
        rows, puncts = [], []
        while True:
            got, p = l.ring.take(1 << 20)
            if got is None and p is None:
                break
            if got is not None:
                rows.append(got)
                assert np.shares_memory(got["timestamp"], got.columns[clock])
            if p is not None:
                puncts.append(p)
        taken[clock] = (rows, puncts)
    first_rows, first_p = taken["first"]
    last_rows, last_p = taken["last"]
    assert sum(map(len, first_rows)) > sum(map(len, last_rows)) > 300
    assert first_p == sorted(first_p) and last_p == sorted(last_p) and last_p[-1] > 0
    # each lane's punctuation is the reader's on its clock after the batches it queued
    given = reader.melds
    assert first_p[-1] == given["first"].given and last_p[-1] == given["last"].given
    assert link.netflow_stats()["late_by_clock"].keys() == {"first", "last"}


def test_restarted_file_link_reads_past_by_flow_end_for_last(pcap):
    from capture.batch import RecordBatch

    link = _link(pcap)
    batch = RecordBatch.concat([b for b in link._reader() if len(b)])
    first, last = batch.columns["first"], batch.columns["last"]
    cut = int(np.median(last))
    # a record that starts before the cut and ends after it: a `last` window needs it
    assert np.any((first < cut) & (last >= cut))
    link.skip_before = cut
    kept = link._unskipped(batch)
    assert kept is not None and np.array_equal(kept.columns["first"], first[first >= cut])
    link.want("last")
    kept = link._unskipped(batch)
    assert kept is not None and np.array_equal(kept.columns["last"], last[last >= cut])
