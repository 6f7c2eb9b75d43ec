"""A served query's adaptive table keeps its size across a crash (`Record.tables`): its table
grows to its groups, the server is killed with SIGKILL and started again, and the resumed
query's table already has the grown size before its first window closes (in `queries` and
`/metrics`), grows no more, and its rows are those of the same query with a fixed table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.csv as pacsv
import pytest

from tests.tools.resuming import run_here
from tests.tools.serving import Server, metric_samples, read_output, wait_for

QUERY = ("DEFINE { query_name pairs; } SELECT tb, srcIP, destIP, count(*) AS n, sum(len) AS b "
         "FROM main.IPV4 GROUP BY time AS tb, srcIP, destIP")


def _query(server: Server, name: str) -> dict:
    return next(q for q in server.client.queries() if q["name"] == name)


def _by_window(directory) -> dict:
    """{window: sorted rows} of an output directory."""
    table = read_output(directory)[0]
    out: dict = {}
    for row in ([] if table is None else table.to_pylist()):
        out.setdefault(row["tb"], []).append(tuple(sorted(row.items())))
    return {tb: sorted(rows) for tb, rows in out.items()}


def _windows(directory) -> set:
    """The windows of an output directory: `set(_by_window(directory))`, reading only the
    `tb` column (the waits below ask every half second, over thousands of rows)."""
    tbs: set = set()
    for part in sorted(Path(directory).glob("part-*.csv")):
        tbs.update(pacsv.read_csv(part, convert_options=pacsv.ConvertOptions(
            include_columns=["tb"])).column("tb").to_pylist())
    return tbs


@pytest.mark.slow
def test_a_restarted_query_starts_at_its_grown_size(tmp_path):
    # 2,000 packets/s over 2,000 (srcIP, destIP) pairs: about 1,300 groups per 1-s window,
    # which need 4,096 slots at load 1/2; the query declares 100 (256 slots)
    cap = tmp_path / "pairs.pcap"
    run_here([sys.executable, "-m", "tools.cli", "gen", str(cap), "-n", "20k",
              "--duration", "10s", "--groups", "2000"])
    query = tmp_path / "pairs.gsql"
    query.write_text(QUERY)
    state = tmp_path / "state"
    server = Server(["--link", f"main={cap}", "--loop", "--speed", "1"], state,
                    tmp_path / "serve.log").start()
    try:
        server.cli("submit", str(query), "--name", "grow", "--set", "expected_groups=100")
        server.cli("submit", str(query), "--name", "fixed", "--set", "aggregate_slots=4096")
        server.wait_spark()
        record = state / "queries" / "grow.json"
        seen: dict = {}

        def settled() -> bool:
            # the size in the record has held for three more windows: grown to its groups
            try:
                size = json.loads(record.read_text())["tables"]["pairs"]["main"]
            except (OSError, ValueError, KeyError):
                return False
            windows = len(_windows(state / "grow"))
            if seen.get("size") != size:
                seen.update(size=size, windows=windows)
            return size >= 4096 and windows >= seen["windows"] + 3

        wait_for(settled, 240, "the grown table's size saved in its record", every=0.5)
        server.kill9()
        had = json.loads(record.read_text())["tables"]["pairs"]["main"]
        server.start()
        # before any window of the restarted process closed: the remembered size
        assert _query(server, "grow")["slots"] == had
        m = metric_samples(server.client)
        assert m[("oopscope_query_table_slots", (("query", "grow"),))] == had
        # `status` shows each running query's table as `queries` does
        lines = [ln.split() for ln in server.cli("status").stdout.splitlines()]
        assert ["QUERY", "SLOTS", "PER", "ROW"] in [ln[:4] for ln in lines]
        assert ["grow", str(had)] in [ln[:2] for ln in lines]
        assert ["fixed", "4096"] in [ln[:2] for ln in lines]
        before = _windows(state / "grow")
        server.wait_spark()
        wait_for(lambda: len(_windows(state / "grow") - before) >= 5
                 and len(_windows(state / "fixed") - before) >= 5, 240,
                 "five windows after the restart")
        q = _query(server, "grow")
        assert q["slots"] == had, q          # it needed no growth
        assert q["generation"] == 1 and q["gaps"][-1]["reason"] == "restart"
        # every window both wrote has the same rows, before and after the crash
        grow, fixed = _by_window(state / "grow"), _by_window(state / "fixed")
        common = sorted(set(grow) & set(fixed))
        assert len([tb for tb in common if tb not in before]) >= 3
        assert all(grow[tb] == fixed[tb] for tb in common)
    finally:
        server.stop()
