"""Issue 25, the capture side: loopback counted once and `direction`, damaged pcapng sections,
records longer than the snap length, FIFOs and standard input as streams, special files, and a
bounded fuzz of damaged captures.

Oracles: tshark (what it reads of a damaged file, and of the section after the damage on its
own), dpkt for intact files, the datagrams the test sends itself, and tcpdump's count on
loopback where it is installed.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import dpkt
import pytest

from capture.errors import CaptureError, CaptureFormatError
from capture.reader import open_capture
from capture.source import FILE, STREAM, classify
from common.errors import ConfigError, OopscopeError
from tests.capture.capture_writers import Interface, Section, pcap_bytes, pcapng_bytes, ts_units
from tests.capture.test_capture_files import frames, timestamps
from tests.conftest import PCAPS, REPO, require_tool
from tools.gen.veth import VethPair, can_make_pairs

N = 30
FRAMES = frames(3 * N, seed=25)
TIMES = timestamps(3 * N)


# --- helpers ---------------------------------------------------------------------------------

def _tshark_rows(path: Path) -> list[tuple[int, int, int]]:
    """(time ns, len, caplen) of every frame tshark reads (it stops at damage, quietly for
    us: its exit status and message are not the point, its rows are)."""
    tshark = require_tool("tshark")
    res = subprocess.run([tshark, "-n", "-r", str(path), "-T", "fields", "-e", "frame.time_epoch",
                          "-e", "frame.len", "-e", "frame.cap_len", "-e", "frame.protocols"],
                         capture_output=True, text=True, timeout=120)
    rows = []
    for line in res.stdout.splitlines():
        epoch, wire, cap, protocols = line.split("\t")
        if not protocols or protocols.startswith("mime_dlt"):
            continue        # tshark shows a file it cannot read as one "MIME file" frame
        sec, _, frac = epoch.partition(".")
        rows.append((int(sec) * 1_000_000_000 + int((frac + "000000000")[:9]), int(wire), int(cap)))
    return rows


def _ours(path, **options):
    """(reader, [(time ns, len, caplen)], [reason codes]) of every packet we read."""
    rows, reasons = [], []
    with open_capture(path, **options) as r:
        for b in r:
            rows += list(zip(b["timestamp"].tolist(), b["len"].tolist(), b["caplen"].tolist()))
            reasons += b["reason"].tolist()
    return r, rows, reasons


def _blocks(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, length) of every block of a little-endian pcapng file."""
    out, pos = [], 0
    while pos + 8 <= len(data):
        btype, blen = struct.unpack_from("<II", data, pos)
        out.append((pos, btype, blen))
        pos += blen
    return out


def _three_sections(second: Interface | None = None) -> bytes:
    secs = []
    for k in range(3):
        iface = second if (k == 1 and second is not None) else Interface()
        items = [("epb", 0, ts_units(t, iface.tsresol), f)
                 for t, f in zip(TIMES[k * N:(k + 1) * N], FRAMES[k * N:(k + 1) * N])]
        secs.append(Section(interfaces=[iface], items=items))
    return pcapng_bytes(secs)


def _us(times: list[int]) -> list[int]:
    """Times as a microsecond-resolution capture stores them."""
    return [t // 1000 * 1000 for t in times]


PROBLEM = re.compile(r"^(?P<path>.+?): byte (?P<offset>\d+): ")


# --- item 3: a damaged pcapng section header or interface description -------------------------

def _damage(data: bytes, how: str) -> tuple[bytes, int, int, int]:
    """`data` with the second section damaged: (damaged, the damaged block's offset, the
    damaged field's offset, the offset of the third section)."""
    shbs = [pos for pos, btype, _ in _blocks(data) if btype == 0x0A0D0D0A]
    second, third = shbs[1], shbs[2]
    d = bytearray(data)
    if how == "byte-order":
        d[second + 8:second + 12] = b"XXXX"
        return bytes(d), second, second + 8, third
    if how == "length":
        d[second + 4:second + 8] = (13).to_bytes(4, "little")
        return bytes(d), second, second + 4, third
    if how == "version":
        d[second + 12:second + 14] = (7).to_bytes(2, "little")
        return bytes(d), second, second + 12, third
    # the interface description's first option (if_tsresol) runs past its block
    idb = next(pos for pos, btype, _ in _blocks(data) if btype == 1 and pos > second)
    d[idb + 18:idb + 20] = (200).to_bytes(2, "little")
    return bytes(d), idb, idb + 16, third


@pytest.mark.parametrize("chunk", [64, 1 << 20])
@pytest.mark.parametrize("how", ["byte-order", "length", "version", "interface option"])
def test_damaged_section_loses_only_itself(tmp_path, how, chunk):
    """Every packet before the damage, then the error with file and offset, then the next
    section: tshark reads the part before the damage, and the third section on its own."""
    intact = _three_sections(Interface(tsresol=6) if how == "interface option" else None)
    data, block, where, third = _damage(intact, how)
    path = tmp_path / "damaged.pcapng"
    path.write_bytes(data)
    tail = tmp_path / "tail.pcapng"
    tail.write_bytes(data[third:])
    before, after = _tshark_rows(path), _tshark_rows(tail)
    assert len(before) == N and len(after) == N      # tshark stops at the damage

    r, rows, _ = _ours(path, chunk_size=chunk)
    assert rows == before + after
    (problem,) = r.stats.problems
    m = PROBLEM.match(problem)
    assert m and m["path"] == str(path) and int(m["offset"]) == where
    assert f"next section header at byte {third}" in problem
    assert r.stats.skipped_bytes == third - block and r.stats.resyncs == 1

    # strict: the first section's packets, then the error at the damage
    got = 0
    with pytest.raises(CaptureFormatError) as err, open_capture(path, strict=True) as r2:
        for b in r2:
            got += len(b)
    assert got == N and str(path) in str(err.value)


def test_damaged_section_in_decode_cli(tmp_path):
    data, _, where, _ = _damage(_three_sections(), "byte-order")
    path = tmp_path / "damaged.pcapng"
    path.write_bytes(data)
    res = subprocess.run([sys.executable, "-m", "tools.cli", "decode", str(path), "--fields", "timestamp"],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    assert [int(x) for x in res.stdout.split()[1:]] == _us(TIMES[:N] + TIMES[2 * N:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: byte {where}: bad pcapng byte-order magic" in lines[0]
    assert "Traceback" not in res.stderr


def test_damaged_first_section_header(tmp_path):
    """Damage at byte 0: with a later section the file is read from there; without, it is an
    error at open that names the byte."""
    data, _, _, third = _damage(_three_sections(), "byte-order")
    d = bytearray(data)
    d[8:12] = b"YYYY"
    path = tmp_path / "first.pcapng"
    path.write_bytes(bytes(d))
    r, rows, _ = _ours(path)
    assert [t for t, _, _ in rows] == _us(TIMES[2 * N:])
    (problem,) = r.stats.problems          # the damaged second section is skipped with the first
    assert problem.startswith(f"{path}: byte 8: ") and problem.endswith(f"next section header at byte {third}")
    one = pcapng_bytes([Section(interfaces=[Interface()], items=[("epb", 0, 1, FRAMES[0])])])
    path.write_bytes(b"\x0a\x0d\x0d\x0a" + one[4:8] + b"ZZZZ" + one[12:])
    with pytest.raises(CaptureFormatError, match="byte-order magic") as err:
        open_capture(path)
    assert err.value.offset == 8


# --- item 4: records longer than the snap length ---------------------------------------------

def test_records_longer_than_the_snap_length_are_read_as_tshark_reads_them(tmp_path, caplog):
    pcap = tmp_path / "snap.pcap"
    pcap.write_bytes(pcap_bytes(list(zip(TIMES, FRAMES)), snaplen=64))
    ng = tmp_path / "snap.pcapng"
    ng.write_bytes(pcapng_bytes([Section(interfaces=[Interface(snaplen=64)],
                                         items=[("epb", 0, ts_units(t, None), f) for t, f in zip(TIMES, FRAMES)])]))
    assert sum(len(f) > 64 for f in FRAMES) > len(FRAMES) // 2
    for path in (pcap, ng):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="capture.reader"):
            r, rows, reasons = _ours(path, chunk_size=512)
        assert rows == _tshark_rows(path)
        assert len(rows) == len(FRAMES) and all(cap == wire == len(f) for (_, wire, cap), f in zip(rows, FRAMES))
        assert set(reasons) <= {0} and r.stats.malformed == 0 and r.stats.problems == []
        warned = [rec.getMessage() for rec in caplog.records if "longer than" in rec.getMessage()]
        assert len(warned) == 1 and warned[0].startswith(f"{path}: byte ")


def test_a_length_running_past_the_end_of_the_file_is_damage(tmp_path):
    """A captured length within 256 KiB but beyond the end of the file: the records after its
    header are still read (a cut file loses only its last record: tests/capture/test_capture_files.py)."""
    intact = pcap_bytes(list(zip(TIMES, FRAMES)))
    starts, pos = [], 24
    while pos < len(intact):
        starts.append(pos)
        pos += 16 + int.from_bytes(intact[pos + 8:pos + 12], "little")
    victim = 40
    data = bytearray(intact)
    data[starts[victim] + 8:starts[victim] + 12] = (len(intact) + 5000).to_bytes(4, "little")
    path = tmp_path / "past.pcap"
    path.write_bytes(bytes(data))
    want = [round(float(ts) * 1e6) * 1000 for ts, _ in dpkt.pcap.Reader(io.BytesIO(intact))]
    del want[victim]
    r, rows, _ = _ours(path)
    assert [t for t, _, _ in rows] == want
    (problem,) = r.stats.problems
    assert problem.startswith(f"{path}: byte {starts[victim]}: broken pcap record: length runs past the end")
    assert r.stats.resyncs == 1 and r.stats.skipped_bytes == 16 + len(FRAMES[victim])


# --- item 9: special files, FIFOs and standard input ----------------------------------------

def test_special_files_say_what_they_are(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    regular = tmp_path / "x.pcap"
    regular.write_bytes(pcap_bytes([]))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        assert classify(regular) == (FILE, "") and classify(fifo) == (STREAM, "")
        for path, what in ((tmp_path, "is a directory"), ("/dev/null", "is a character device"),
                           (tmp_path / "sock", "is a socket"), (tmp_path / "none.pcap", "not found")):
            with pytest.raises(CaptureError) as err:
                open_capture(path)
            assert str(err.value).startswith(f"{path}: ") and what in str(err.value)
    finally:
        sock.close()


@contextmanager
def _fifo_writer(path: Path, parts: list[bytes], *, before: float = 0.0, hold: threading.Event | None = None,
                 between: threading.Event | None = None):
    """A thread that opens the FIFO for writing after `before` seconds and writes `parts`; it
    waits for `between` (at most 20 s) after the first part, and for `hold` before it closes."""
    state = {"waited": None}

    def write():
        time.sleep(before)
        with open(path, "wb", buffering=0) as f:
            for i, part in enumerate(parts):
                f.write(part)
                if i == 0 and between is not None:
                    state["waited"] = between.wait(20)
            if hold is not None:
                hold.wait(20)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        yield state
    finally:
        if hold is not None:
            hold.set()
        t.join(30)


def _pcap_parts(k: int) -> tuple[bytes, list[bytes]]:
    data = pcap_bytes(list(zip(TIMES, FRAMES)), nano=True)
    starts, pos = [], 24
    while pos < len(data):
        starts.append(pos)
        pos += 16 + int.from_bytes(data[pos + 8:pos + 12], "little")
    return data, [data[:starts[k]], data[starts[k]:]]


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_fifo_is_read_as_its_packets_arrive(tmp_path, prefetch):
    """The writer stops after k packets until the reader has them: a reader that waited for a
    full buffer (or the end) would never get them, and time out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    k = 37
    data, parts = _pcap_parts(k)
    got_first = threading.Event()
    rows: list[tuple] = []
    with _fifo_writer(fifo, parts, between=got_first) as state:
        with open_capture(fifo, prefetch=prefetch) as r:
            assert r.stream
            for b in r:
                rows += list(zip(b["timestamp"].tolist(), b["srcPort"].tolist(), b["reason"].tolist()))
                if len(rows) >= k:
                    got_first.set()
    assert state["waited"] is True, "the first packets were not delivered while the writer waited"
    assert r.stats.problems == []
    path = tmp_path / "same.pcap"
    path.write_bytes(data)
    with open_capture(path) as f:
        want = [row for b in f for row in zip(b["timestamp"].tolist(), b["srcPort"].tolist(), b["reason"].tolist())]
    assert rows == want and [t for t, _, _ in rows] == TIMES


def test_a_fifo_without_a_writer_says_that_it_waits(tmp_path, caplog):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    data, _ = _pcap_parts(1)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="capture.reader"), _fifo_writer(fifo, [data], before=1.6):
        r, rows, _ = _ours(fifo)
    assert time.monotonic() - start >= 1.5 and len(rows) == len(FRAMES)
    waits = [rec.getMessage() for rec in caplog.records if "waiting" in rec.getMessage()]
    assert len(waits) == 1 and waits[0].startswith(f"{fifo}: waiting for a capture")


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_stop_ends_a_quiet_stream(tmp_path, prefetch):
    """A writer that keeps the FIFO open and writes no more: a stop ends the stream like its
    end (every packet delivered, no truncation reported); close() does not hang either."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    k = 20
    data, parts = _pcap_parts(k)
    # the first k packets and half the next record: it stays incomplete
    partial = [parts[0] + parts[1][:10]]
    stop = threading.Event()
    hold = threading.Event()
    n = 0
    with _fifo_writer(fifo, partial, hold=hold):
        with open_capture(fifo, prefetch=prefetch, stop=stop.is_set) as r:
            for b in r:
                n += len(b)
                if n >= k:
                    stop.set()
    assert n == k and r.stats.problems == []
    # nothing at all arrived before the stop: a clear error, not a hang
    stop2 = threading.Event()
    threading.Timer(0.5, stop2.set).start()
    with pytest.raises(CaptureError, match="stopped before a capture arrived"):
        open_capture(fifo, stop=stop2.is_set)
    # close() of a reading-ahead reader stuck on a quiet writer returns
    with _fifo_writer(fifo, [parts[0]], hold=threading.Event()):
        r = open_capture(fifo, prefetch=2)
        it = iter(r)
        assert len(next(it)) == k
        started = time.monotonic()
        r.close()
        assert time.monotonic() - started < 5


def test_standard_input_is_a_stream(tmp_path):
    data, _ = _pcap_parts(1)
    code = ("from capture.reader import open_capture\n"
            "with open_capture('-') as r:\n"
            "    print(r.stream, r.link, r.path, sum(len(b) for b in r))\n")
    res = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().split() == ["True", "stdin", "<stdin>", str(len(FRAMES))]


# --- fuzz: damaged captures ---------------------------------------------------------------------

FUZZ_SEED = 2025
FUZZ_CASES = 240
_SHARED = ("dhcp.pcapng", "dhcp_big_endian.pcapng", "z3950.pcapng", "quic-mvfst-27.pcapng",
           "4in4tunnel.pcap", "NTPv4.pcap", "dns_long_domainname.pcap", "dlt_ppp.pcap", "raw.pcap")


def _fuzz_sources() -> list[tuple[str, bytes]]:
    """Small captures to damage: generated ones (always), and some of ../shared/pcaps."""
    out = [("gen.pcap", pcap_bytes(list(zip(TIMES, FRAMES)))),
           ("gen-ns-big.pcap", pcap_bytes(list(zip(TIMES, FRAMES)), big=True, nano=True)),
           ("gen.pcapng", _three_sections()),
           ("gen-big.pcapng", pcapng_bytes([Section(big=True, interfaces=[Interface(tsresol=9)],
                                                    items=[("epb", 0, ts_units(t, 9), f) for t, f in zip(TIMES, FRAMES)]
                                                    + [("spb", FRAMES[0])])]))]
    out += [(name, (PCAPS / name).read_bytes()) for name in _SHARED if (PCAPS / name).is_file()]
    return out


def _length_fields(data: bytes) -> list[int]:
    """Offsets of the record / block length fields (a pcap's captured length, a pcapng
    block's total length), as the intact file frames them."""
    out = []
    if data[:4] == b"\x0a\x0d\x0d\x0a":
        order: Literal["big", "little"] = "big" if data[8:12] == b"\x1a\x2b\x3c\x4d" else "little"
        pos = 0
        while pos + 8 <= len(data):
            out.append(pos + 4)
            blen = int.from_bytes(data[pos + 4:pos + 8], order)
            if blen < 12:
                break
            pos += blen
    else:
        order = "big" if data[:2] == b"\xa1\xb2" else "little"
        pos = 24
        while pos + 16 <= len(data):
            out.append(pos + 8)
            pos += 16 + int.from_bytes(data[pos + 8:pos + 12], order)
    return out


def _mutate(data: bytes, rnd: random.Random) -> tuple[str, bytes]:
    d = bytearray(data)
    kind = rnd.choice(["truncate", "flip", "length", "length", "header", "section", "splice"])
    if kind == "truncate":
        return kind, bytes(d[:rnd.randrange(len(d))])
    if kind == "flip":
        for _ in range(rnd.randint(1, 6)):
            d[rnd.randrange(len(d))] ^= 1 << rnd.randrange(8)
    elif kind == "length":
        at = rnd.choice(_length_fields(data))
        value = rnd.choice([0, 7, 13, 0xFFFF_FFFF, rnd.randrange(1 << 32), rnd.randrange(2000),
                            rnd.randrange(70_000), rnd.randrange(300_000)])
        d[at:at + 4] = value.to_bytes(4, rnd.choice(["little", "big"]))
    elif kind == "header":      # the file header or the first section header
        d[rnd.randrange(min(28, len(d)))] = rnd.randrange(256)
    elif kind == "section":     # a pcapng section header or interface description, any of them
        heads = [pos for pos, btype, _ in _blocks(data) if btype in (0x0A0D0D0A, 1)] \
            if data[:4] == b"\x0a\x0d\x0d\x0a" and data[8:12] == b"\x4d\x3c\x2b\x1a" else [0]
        at = rnd.choice(heads) + rnd.randrange(4, 24)
        d[at:at + 2] = rnd.randbytes(2)
    else:                       # a run of random bytes inside
        at = rnd.randrange(len(d))
        d[at:at + rnd.randrange(1, 200)] = rnd.randbytes(rnd.randrange(1, 200))
    return kind, bytes(d)


@contextmanager
def _deadline(seconds: int, what: str):
    def hang(signum, frame):
        raise TimeoutError(f"{what}: no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _read_damaged(path, **options) -> tuple[int, list[str], str | None]:
    """(packets, problems, error): everything but a user-facing error fails the test."""
    n = 0
    try:
        with _deadline(20, str(path)), open_capture(path, **options) as r:
            for b in r:
                n += len(b)
        return n, list(r.stats.problems), None
    except OopscopeError as exc:
        return n, [], str(exc)


def _stream(data: bytes, **options) -> tuple[int, list[str], str | None]:
    """`_read_damaged` of `data` written into a pipe in pieces (a stream: not mapped, no seek)."""
    rfd, wfd = os.pipe()

    def write():
        with os.fdopen(wfd, "wb") as f:
            for i in range(0, len(data), 997):
                f.write(data[i:i + 997])
                f.flush()

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        path = f"/dev/fd/{rfd}"
        assert stat.S_ISFIFO(os.stat(path).st_mode)
        return _read_damaged(path, **options)
    finally:
        t.join(20)
        os.close(rfd)


def test_fuzz_damaged_captures(tmp_path, capsys):
    """Seeded damage (truncation, flipped bits, corrupt lengths, broken headers, random runs)
    to pcap and pcapng files: no traceback, no hang, every problem or error is one message that
    names the file and the byte offset; as a stream the same packets come out; `oopscope
    decode` exits 0 or 1 with only such lines; and no damaged file gives fewer packets than
    tshark reads of it (tshark stops at the first damage; we go on past it)."""
    from tools.cli import main

    rnd = random.Random(FUZZ_SEED)
    sources = _fuzz_sources()
    kinds: Counter = Counter()
    vs_tshark = errors = 0
    started = time.monotonic()
    for case in range(FUZZ_CASES):
        name, intact = sources[case % len(sources)]
        kind, data = _mutate(intact, rnd)
        kinds[kind] += 1
        path = tmp_path / f"{case:03d}-{kind}-{name}"
        path.write_bytes(data)
        n, problems, error = _read_damaged(path, chunk_size=rnd.choice([64, 4096, 1 << 20]))
        for message in problems + ([error] if error else []):
            m = PROBLEM.match(message)
            assert m and m["path"] == str(path) and "\n" not in message, message
        errors += error is not None
        if case % 6 == 0:
            sn, sproblems, serror = _stream(data, prefetch=case % 4)
            assert (sn, len(sproblems), serror is None) == (n, len(problems), error is None), path
        if case % 20 == 0 or (kind == "section" and name == "gen.pcapng"):
            vs_tshark += 1
            theirs = len(_tshark_rows(path))
            if not (error and "unsupported link type" in error):   # tshark knows more link types
                assert n >= theirs, (path, n, theirs, problems, error)
        if case % 24 == 0:
            with _deadline(20, f"decode {path}"):
                try:
                    main(["decode", str(path), "--fields", "len"])
                    code = 0
                except SystemExit as exc:
                    code = exc.code
            err = capsys.readouterr().err
            assert code in (0, 1) and "Traceback" not in err, err
            for line in err.splitlines():
                assert re.match(rf"oopscope: (warning|error): {re.escape(str(path))}: byte \d+: ", line), line
    assert set(kinds) == {"truncate", "flip", "length", "header", "section", "splice"} and vs_tshark >= 12
    assert 0 < errors < FUZZ_CASES // 2       # most damage is read past, some is fatal (headers)
    assert time.monotonic() - started < 120


# --- item 2: loopback counted once; direction ----------------------------------------------------

def test_direction_is_checked():
    from capture.live import LiveCapture

    with pytest.raises(ConfigError, match="direction='sideways'.*in, out, inout"):
        LiveCapture("lo", direction="sideways")


@pytest.fixture
def namespace():
    """A network namespace of the test's own, its loopback up (and nothing else)."""
    why = can_make_pairs()
    if why:
        pytest.skip(f"loopback in a namespace: {why}")
    name = f"oopl-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True, timeout=30)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], timeout=30)


#: run inside the namespace: captures on lo in every direction while it sends N datagrams
#: to a bound port (paced, so the loopback's receive backlog never overflows), then prints
#: per direction the datagrams seen, and the backlog drops of the time (/proc/net/softnet_stat)
_LOOPBACK = r"""
import json, socket, sys, time
from capture.live import LiveCapture
n, port = int(sys.argv[1]), int(sys.argv[2])

def backlog_drops():
    return sum(int(line.split()[1], 16) for line in open("/proc/net/softnet_stat"))

caps = {d: LiveCapture("lo", direction=d, block_size=1 << 20, block_count=16, frame_timeout_ms=10)
        for d in ("inout", "in", "out")}
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", port))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
seen = dict.fromkeys(caps, 0)

def drain(wait):
    for d, cap in caps.items():
        while (b := cap.poll(wait)) is not None:
            seen[d] += int(((b["protocol"] == 17) & (b["destPort"] == port)).sum())

drops = backlog_drops()
for i in range(n):
    tx.sendto(b"oopscope", ("127.0.0.1", port))
    if i % 100 == 99:
        time.sleep(0.001)
        drain(0)
drain(0.3)
print(json.dumps({"seen": seen, "backlog_drops": backlog_drops() - drops,
                  "kernel_drops": {d: c.stats.kernel_drops for d, c in caps.items()}}))
"""


def _listening(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Wait for tcpdump's "listening on" line (it has opened its socket)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    line = b""
    while time.monotonic() < deadline and b"listening on" not in line:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
    assert b"listening on" in line, "tcpdump did not start"


@pytest.mark.needs_root
def test_loopback_packets_are_counted_once(namespace, tmp_path):
    """N datagrams over 127.0.0.1: N packets in every direction (the kernel taps each twice on
    lo), as many as tcpdump sees."""
    n, port = 20_000, 47_000
    tcpdump = None
    pcap = tmp_path / "tcpdump.pcap"
    if shutil.which("tcpdump"):
        tcpdump = subprocess.Popen(["ip", "netns", "exec", namespace, "tcpdump", "-i", "lo", "-n", "-Z", "root",
                                    "-B", "65536", "-w", str(pcap), "udp", "and", "dst", "port", str(port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _listening(tcpdump)
    try:
        res = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", _LOOPBACK, str(n), str(port)],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    finally:
        if tcpdump is not None:
            tcpdump.send_signal(signal.SIGINT)
            tcpdump.wait(30)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["kernel_drops"] == {"inout": 0, "in": 0, "out": 0}
    # a datagram the receive backlog dropped was only ever tapped going out
    received = n - got["backlog_drops"]
    assert got["seen"] == {"inout": received, "in": received, "out": n}
    if tcpdump is not None:
        with open(pcap, "rb") as f:
            assert sum(1 for _ in dpkt.pcap.Reader(f)) == received


@pytest.mark.needs_root
def test_direction_on_a_veth_pair():
    """Frames sent into the outer end from the namespace are incoming there; frames the outer
    end sends are outgoing: `in`, `out` and `inout` see exactly those."""
    why = can_make_pairs()
    if why:
        pytest.skip(f"live capture tests: {why}")
    from capture.live import LiveCapture

    incoming_mac, outgoing_mac = 0x02005E005311, 0x02005E005322
    frame = lambda mac: b"\xff" * 6 + mac.to_bytes(6, "big") + b"\x08\x06" + bytes(46)   # noqa: E731
    with VethPair("oopd") as pair:
        caps = {d: LiveCapture(pair.outer, direction=d, block_size=1 << 16, block_count=8, frame_timeout_ms=10)
                for d in ("in", "out", "inout")}
        try:
            code = ("import socket\n"
                    "s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
                    f"s.bind(({pair.inner!r}, 0))\n"
                    f"for _ in range(300):\n    s.send({frame(incoming_mac)!r})\n")
            pair.run_inside([sys.executable, "-c", code])
            with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
                s.bind((pair.outer, 0))
                for _ in range(200):
                    s.send(frame(outgoing_mac))
            seen = {}
            for d, cap in caps.items():
                macs: Counter = Counter()
                while (b := cap.poll(0.3)) is not None:
                    macs.update(b["srcMAC"].tolist())
                seen[d] = dict(macs)
        finally:
            for cap in caps.values():
                cap.close()
    assert seen == {"in": {incoming_mac: 300}, "out": {outgoing_mac: 200},
                    "inout": {incoming_mac: 300, outgoing_mac: 200}}
