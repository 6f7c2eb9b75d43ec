"""Agents remember their tables' sizes (issue 35): an `oopscope agent` notes each adaptive
table's size in `SPOOL/agents/HOST.tables`, and started again its tables start there instead
of growing from the declared size again."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

NS = 1_000_000_000
ROOT = Path(__file__).resolve().parents[2]
# 100 groups declared (a table of 256 slots), 2,000 met per window: the table grows twice
QUERY = """
DEFINE { query_name pairs; expected_groups 100; }
SELECT tb, srcIP, destIP, count(*) AS packets
FROM l0.IPV4
GROUP BY time/10 AS tb, srcIP, destIP;
"""


def _agent(query: Path, pcap: Path, spool: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "tools.cli", "-v", "agent", str(query),
                           "--link", f"l0={pcap}", "--spool", str(spool), "--host-id", "h1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return text


def _table(text: str) -> tuple[int, int, int]:
    """(slots, resizes, evictions) of query pairs in an agent's summary."""
    m = re.search(r"query pairs: \d+ partial rows in \d+ spool files, (\d+) evictions, .*; "
                  r"table ([\d,]+) slots \((\d+) resizes\)", text)
    assert m, text[-3000:]
    return int(m[2].replace(",", "")), int(m[3]), int(m[1])


def test_an_agent_started_again_starts_at_its_grown_size(tmp_path):
    from tools.gen.traffic import TrafficConfig, generate

    pcap = generate(TrafficConfig(packets=30_000, duration_ns=60 * NS, groups=2000, tcp=0.8,
                                  udp=0.2, icmp=0.0, seed=35).validate(),
                    tmp_path / "a.pcap")["l0"]
    query = tmp_path / "pairs.gsql"
    query.write_text(QUERY)
    spool = tmp_path / "spool"

    slots, resizes, evictions = _table(_agent(query, pcap, spool))
    assert slots == 4096 and resizes == 2          # 256 -> 1,024 -> 4,096
    assert json.loads((spool / "agents" / "h1.tables").read_text()) == \
        {"pairs": {"l0": 4096}}

    # the same agent over the same capture, its query's spool gone (it starts from the
    # capture's first packet again) but its host's sizes kept
    shutil.rmtree(spool / "pairs")
    text = _agent(query, pcap, spool)
    assert "query pairs, link l0: table starts at 4096 slots" in text
    again, resizes_again, evictions_again = _table(text)
    assert (again, resizes_again) == (4096, 0)
    assert evictions_again < evictions        # its first windows no longer overflow


def test_a_fanout_member_keeps_its_own_sizes(tmp_path):
    from tools.pipeline.fanout import Member
    from tools.pipeline.tablesizes import TableLog, agent_tables

    member = agent_tables(tmp_path, f"h1.{Member(1, 2, 7).k}")
    assert member == tmp_path / "agents" / "h1.1.tables"
    assert agent_tables(tmp_path, "h1") == tmp_path / "agents" / "h1.tables"
    TableLog(member, resumed=True).note("q", "eth0#1", 8192)
    assert TableLog(member, resumed=True).slots("q", "eth0#1") == 8192
    assert TableLog(agent_tables(tmp_path, "h1"), resumed=True).slots("q", "eth0#1") is None


def test_a_watching_agent_sizes_each_work_item_from_its_record(tmp_path):
    """The watching agent (`tools.cluster.watch.Work`): a query it ran before starts at the
    size it had here, another query at its declared one; its heartbeat reports both."""
    from tools.cluster.watch import Work
    from tools.cluster.work import WorkItem
    from tools.pipeline.tablesizes import TableLog, agent_tables, table_report

    tables = TableLog(agent_tables(tmp_path, "h1"), resumed=True)
    tables.note("pairs", "l0", 16384)
    works = {name: Work(WorkItem(name, 1, f"{name}.gsql", QUERY.replace("pairs", name),
                                 queries=[name], links=["l0"], agents={"l0": "h1"},
                                 spool=str(tmp_path / name)), ["l0"],
                        TableLog(agent_tables(tmp_path, "h1"), resumed=True))
             for name in ("pairs", "other")}
    try:
        report = {q: t for w in works.values()
                  for q, t in table_report(f for af in w.feeds.values()
                                           for f in af.feeds).items()}
        assert report == {"pairs": {"l0": {"slots": 16384, "resizes": 0}},
                          "other": {"l0": {"slots": 256, "resizes": 0}}}
        assert works["pairs"].report()["slots"] == 16384
    finally:
        for w in works.values():
            w.close()
