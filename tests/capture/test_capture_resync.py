"""Reading past broken framing: the reader finds the next readable record and loses nothing else.

The oracle is dpkt reading the intact file: every record but the damaged one must come out,
with its time and source port, and the bytes skipped must be exactly the damaged record.
"""

from __future__ import annotations

import random
import subprocess
import sys

import dpkt
import numpy as np
import pytest

from capture.errors import CaptureFormatError
from capture.reader import open_capture
from tests.capture.capture_writers import (
    Interface,
    Section,
    pcap_bytes,
    pcapng_bytes,
    ts_units,
)
from tests.capture.test_capture_files import frames, timestamps

N = 120
FRAMES = frames(N, seed=3)
TIMES = timestamps(N)


def _record_starts(data: bytes) -> list[int]:
    starts, pos = [], 24
    while pos + 16 <= len(data):
        starts.append(pos)
        pos += 16 + int.from_bytes(data[pos + 8:pos + 12], "little")
    return starts


def _dpkt(data: bytes, tmp_path) -> tuple[list[int], list[int]]:
    """(times in ns, source ports) of every record, as dpkt reads the file."""
    path = tmp_path / "oracle.pcap"
    path.write_bytes(data)
    times, ports = [], []
    with open(path, "rb") as f:
        reader = dpkt.pcapng.Reader(f) if data[:4] == b"\x0a\x0d\x0d\x0a" else \
            dpkt.pcap.Reader(f)
        for ts, buf in reader:
            times.append(round(float(ts) * 1e6) * 1000)
            l4 = getattr(dpkt.ethernet.Ethernet(buf).data, "data", None)
            ports.append(getattr(l4, "sport", 0))
    return times, ports


def _read(path, **options):
    times, ports = [], []
    with open_capture(path, **options) as r:
        for b in r:
            times += b["timestamp"].tolist()
            ports += b["srcPort"].tolist()
    return r, times, ports


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 20])
@pytest.mark.parametrize("victim", [0, 1, 57, N - 2])
def test_a_record_with_an_impossible_length_is_skipped(tmp_path, victim, chunk):
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    start = _record_starts(intact)[victim]
    broken = bytearray(intact)
    broken[start + 8:start + 12] = (300_000).to_bytes(4, "little")
    path = tmp_path / "broken.pcap"
    path.write_bytes(bytes(broken))
    want_t, want_p = _dpkt(intact, tmp_path)
    del want_t[victim], want_p[victim]
    r, got_t, got_p = _read(path, chunk_size=chunk)
    assert got_t == want_t and got_p == want_p
    assert r.stats.resyncs == 1 and r.stats.skipped_bytes == 16 + len(FRAMES[victim])
    (problem,) = r.stats.problems
    assert f"byte {start}: broken pcap record" in problem and "found 300000" in problem
    assert f"skipped {16 + len(FRAMES[victim])} bytes" in problem


def test_junk_between_records_is_stepped_over(tmp_path):
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    starts = _record_starts(intact)
    rnd = random.Random(11)
    data = bytearray(intact)
    junk_total = 0
    for at in sorted(rnd.sample(starts[1:], 3), reverse=True):
        junk = bytes([0xFF]) * 12 + rnd.randbytes(rnd.randrange(1, 3000))   # caplen 2^32-1
        data[at:at] = junk
        junk_total += len(junk)
    path = tmp_path / "junk.pcap"
    path.write_bytes(bytes(data))
    r, got_t, got_p = _read(path, chunk_size=512)
    assert (got_t, got_p) == _dpkt(intact, tmp_path)
    assert r.stats.resyncs == 3 and r.stats.skipped_bytes == junk_total


def test_damage_in_the_last_record_skips_to_the_end(tmp_path):
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    start = _record_starts(intact)[-1]
    broken = bytearray(intact)
    broken[start + 8:start + 12] = (1 << 30).to_bytes(4, "little")
    path = tmp_path / "end.pcap"
    path.write_bytes(bytes(broken))
    r, got_t, _ = _read(path)
    assert got_t == _dpkt(intact, tmp_path)[0][:-1]
    assert r.stats.resyncs == 0 and r.stats.skipped_bytes == len(intact) - start
    assert "no readable record after it" in r.stats.problems[0]


def test_strict_raises_at_the_damage_after_earlier_packets(tmp_path):
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    start = _record_starts(intact)[5]
    broken = bytearray(intact)
    broken[start + 8:start + 12] = (300_000).to_bytes(4, "little")
    path = tmp_path / "strict.pcap"
    path.write_bytes(bytes(broken))
    got = 0
    with pytest.raises(CaptureFormatError) as err, open_capture(path, strict=True) as r:
        for b in r:
            got += len(b)
    assert got == 5 and err.value.offset == start and err.value.found == 300_000


@pytest.mark.parametrize("chunk", [64, 1 << 20])
def test_a_broken_pcapng_block_is_skipped(tmp_path, chunk):
    items = [("epb", 0, ts_units(t, None), f) for t, f in zip(TIMES, FRAMES)]
    intact = pcapng_bytes([Section(interfaces=[Interface()], items=items)])
    # the 40th enhanced packet block: find it by walking the blocks
    pos, seen, victim = 0, 0, None
    while pos < len(intact):
        btype = int.from_bytes(intact[pos:pos + 4], "little")
        blen = int.from_bytes(intact[pos + 4:pos + 8], "little")
        if btype == 6:
            if seen == 40:
                victim = (pos, blen)
                break
            seen += 1
        pos += blen
    at, blen = victim
    broken = bytearray(intact)
    broken[at + 4:at + 8] = (7).to_bytes(4, "little")       # not a multiple of 4
    path = tmp_path / "broken.pcapng"
    path.write_bytes(bytes(broken))
    want_t, want_p = _dpkt(intact, tmp_path)
    del want_t[40], want_p[40]
    r, got_t, got_p = _read(path, chunk_size=chunk)
    assert got_t == want_t and got_p == want_p
    assert r.stats.resyncs == 1 and r.stats.skipped_bytes == blen


def test_decode_cli_reads_past_the_damage(tmp_path):
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    start = _record_starts(intact)[30]
    broken = bytearray(intact)
    broken[start + 8:start + 12] = (300_000).to_bytes(4, "little")
    path = tmp_path / "cli.pcap"
    path.write_bytes(bytes(broken))
    res = subprocess.run([sys.executable, "-m", "tools.cli", "decode", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.strip().splitlines()) == 1 + N - 1       # header + every other row
    warnings = [ln for ln in res.stderr.splitlines() if "broken pcap record" in ln]
    assert len(warnings) == 1 and f"byte {start}" in warnings[0]
    assert np.all(np.diff([int(ln.split(",")[1]) for ln in
                           res.stdout.strip().splitlines()[1:]]) > 0)
