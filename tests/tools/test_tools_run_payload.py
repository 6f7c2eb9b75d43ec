"""A payload query end to end (`oopscope run` through the command line, in this process)
over real captures: regular expressions (RE2 over the payload column) and fixed-offset byte matches on
`TCP_data`, checked against dpkt's payloads and Python's `re`."""

from __future__ import annotations

import csv
import re
import sys
import warnings
from collections import Counter

import dpkt
import pytest

from capture.reader import read_all
from capture.schema import COLUMNS
from queries.planner import plan_text
from tests.oracles.reference import evaluate_file
from tests.tools.resuming import run_here

QUERY = """
SELECT tb, destPort, COUNT(*) AS n, SUM(data_length) AS bytes
FROM TCP
WHERE str_regex_match[TCP_data, '^(GET|POST|HTTP/1\\.[01]) ']
   OR (byte_match_offset(0, 19, TCP_data) = 1
       AND str_match_offset(1, 'BitTorrent protocol', TCP_data) = 1)
GROUP BY time/3600 AS tb, destPort
"""
PATTERN = re.compile(rb"^(GET|POST|HTTP/1\.[01]) ", re.MULTILINE)


def expected(path) -> Counter:
    out: Counter = Counter()
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pcapng = f.read(4) == b"\x0a\x0d\x0d\x0a"
        f.seek(0)
        for ts, buf in (dpkt.pcapng.Reader(f) if pcapng else dpkt.pcap.Reader(f)):
            ip = dpkt.ethernet.Ethernet(buf).data
            if not isinstance(ip, (dpkt.ip.IP, dpkt.ip6.IP6)) or \
                    not isinstance(ip.data, dpkt.tcp.TCP):
                continue
            data = bytes(ip.data.data)
            hit = bool(data) and PATTERN.search(data) is not None
            hit = hit or (data[:1] == b"\x13" and data[1:20] == b"BitTorrent protocol")
            if hit:
                out[(int(ts) // 3600, ip.data.dport)] += 1
    return out


@pytest.mark.parametrize("name", ["http-lines-split.pcap", "bittorrent.pcap",
                                  "aimini-http.pcap"])
def test_payload_regex_query(pcaps_dir, tmp_path, name):
    path = pcaps_dir / name
    query = tmp_path / "q.gsql"
    query.write_text(QUERY)
    out = tmp_path / "out.csv"
    run_here([sys.executable, "-m", "tools.cli", "run", str(query), "--link", str(path),
              "--output", f"q={out}"])
    with open(out, newline="") as f:
        got = Counter({(int(r["tb"]), int(r["destPort"])): int(r["n"])
                       for r in csv.DictReader(f)})
    want = expected(path)
    assert want and got == want
    # the reference evaluator over the same packets, read with their payloads
    batch = read_all(path, link="main", columns=[c.name for c in COLUMNS] + ["payload"])
    plan = plan_text(QUERY, ["main"])
    frame = next(iter(evaluate_file(plan, {"main": batch}).values()))
    assert Counter({(int(r["tb"]), int(r["destPort"])): int(r["n"])
                    for r in frame.to_dict("records")}) == want
