"""A small sustained run of the appliance (issue 35): a link replayed in a loop at the wall
clock's pace for a minute, a per-5-second query over it. Asserted on rows and their order,
never on seconds, so that a busy machine cannot fail it:

- every window from the first full one is written once, in order, with exactly the rows the
  replay carried in it per (srcIP, destIP): the server logs where each pass of the file lies
  in wall-clock time, so the packets of every window are known from the file;
- each window is written before the link's punctuation passes three more window ends: a high
  level that fell behind and never caught up would break it within the minute;
- the query's spool does not grow: the files its stage applied are removed as it goes, but
  the link's last ones (a restart reads them).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from common.spool import parse_spool_name
from tests.tools.serving import Server, read_output

pytestmark = pytest.mark.slow

NS = 1_000_000_000
WINDOW_S = 5
QUERY = f"""
DEFINE {{ query_name pairs; }}
SELECT tb, srcIP, destIP, count(*) AS packets
FROM main.IPV4
GROUP BY time/{WINDOW_S} AS tb, srcIP, destIP;
"""
PASS = re.compile(r"link main: pass \d+ of .*: capture time (\d+) ns is wall time (\d+) ns")
#: windows measured (a minute of them), and how many window ends the punctuation may pass
#: beyond a window before its rows are written
WINDOWS, BEHIND = 12, 3


def replay_truth(pcap: Path, log: str) -> dict[tuple[int, int, int], int]:
    """{(window, srcIP, destIP): packets} the replay carried: each pass of the file stamped
    from the wall time the server's log gives (as `tools.pipeline.links.ReplayLink` does, at
    speed 1)."""
    from capture.reader import read_all

    batch = read_all(pcap, "main")
    v4 = batch["ipversion"] == 4
    # an IPv4 address is the low word of the pair (IPv4-mapped)
    ts, src, dst = (np.asarray(batch[c])[v4] for c in ("timestamp", "srcIP_lo", "destIP_lo"))
    truth: dict[tuple[int, int, int], int] = {}
    for m in PASS.finditer(log):
        t0, w0 = int(m.group(1)), int(m.group(2))
        window = (w0 + (ts - t0)) // (WINDOW_S * NS)
        keys, n = np.unique(np.stack([window, (src & 0xFFFFFFFF).astype(np.int64),
                                      (dst & 0xFFFFFFFF).astype(np.int64)]),
                            axis=1, return_counts=True)
        for (w, s, d), c in zip(keys.T.tolist(), n.tolist()):
            truth[(w, s, d)] = truth.get((w, s, d), 0) + c
    return truth


def _address(text: str) -> int:
    a, b, c, d = (int(x) for x in text.split("."))
    return a << 24 | b << 16 | c << 8 | d


def test_a_minute_of_load_keeps_every_window_whole_in_order_and_close_behind(tmp_path):
    from tools.gen.traffic import TrafficConfig, generate

    # 2,000 packets/s, 200 (srcIP, destIP) pairs, every pair in every window
    pcap = generate(TrafficConfig(packets=20_000, duration_ns=10 * NS, groups=200, tcp=0.8,
                                  udp=0.2, icmp=0.0, seed=11).validate(),
                    tmp_path / "load.pcap")["l0"]
    server = Server(["--link", f"main={pcap}", "--loop", "--speed", "1"], tmp_path / "state",
                    tmp_path / "serve.log")
    try:
        server.start()
        server.wait_spark()
        reply = server.client.submit(text=QUERY, file="pairs.gsql")
        first = reply["first_window_ns"] // (WINDOW_S * NS)
        out = Path(reply["outputs"]["pairs"])
        written: list[int] = []         # windows in the order their files came
        overdue: list[tuple[int, int]] = []
        deadline = time.monotonic() + WINDOWS * WINDOW_S * 3 + 120
        while len(written) < WINDOWS and time.monotonic() < deadline:
            # the punctuation first, then the files: a window written before this status
            # was read is in the listing
            p = server.client.status()["links"][0]["punctuation_ns"]
            table, _ = read_output(out)
            for w in ([] if table is None else table.column("tb").to_pylist()):
                if w not in written:
                    written.append(w)
            if p is not None:
                passed = p // (WINDOW_S * NS) - BEHIND      # windows with BEHIND more ends
                overdue += [(w, p) for w in range(first, passed) if w not in written
                            and (w, p) not in overdue]
            time.sleep(0.5)
        log = server.log()
        # a file per window at least was written; those applied are gone but the last
        spooled = [p for p in (tmp_path / "state").rglob("*.parquet")
                   if p.parent.name == "partials" and parse_spool_name(p.name)]
        applied = max(parse_spool_name(p.name)[1] for p in spooled)
    finally:
        server.stop()
    assert applied >= WINDOWS and len(spooled) <= 5, sorted(p.name for p in spooled)
    assert len(written) >= WINDOWS, f"{written}\n{log[-3000:]}"
    assert written == list(range(first, first + len(written)))      # in order, no gap
    assert not overdue, f"windows not written {BEHIND} windows after their end: {overdue}"
    table, _ = read_output(out)
    got: dict[tuple[int, int, int], int] = {}
    for w, s, d, n in zip(*(table.column(c).to_pylist()
                            for c in ("tb", "srcIP", "destIP", "packets"))):
        assert (w, _address(s), _address(d)) not in got, "a row written twice"
        got[(w, _address(s), _address(d))] = n
    truth = replay_truth(pcap, log)
    whole = set(written)
    assert {k: v for k, v in truth.items() if k[0] in whole} == \
        {k: v for k, v in got.items() if k[0] in whole}
    assert all(sum(1 for k in got if k[0] == w) == 200 for w in written)
