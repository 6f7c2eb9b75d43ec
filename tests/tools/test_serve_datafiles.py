"""Files named in a submitted query and the memory a submission may take, against a real
`oopscope serve` (issue 34, findings 1 and 3).

Before: `getlpmid(srcIP, '/etc/shadow')` read the file when the query was planned and the 400
reply quoted its first line; `/proc/self/environ` gave the server's environment; a FIFO
blocked the planner with the appliance's lock held (listing and cancel hung); `/dev/zero`
was read without end; `aggregate_slots` 2^30 allocated tens of GiB at once. Now a submission
reads only regular files below `--data-dir`, and its tables must fit `--memory-budget`.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from pathlib import Path

import pytest

from tests.tools.serving import Server, wait_for

SECRET = "root:$6$oopscope-test-SECRET-hash:19000:0:99999:7:::"


def _query(call: str, name: str = "lpm") -> str:
    return (f"DEFINE {{ query_name {name}; }}\n"
            f"SELECT tb, id, count(*) AS packets FROM main.IPV4\n"
            f"GROUP BY time AS tb, {call} AS id;\n")


def _submit(server: Server, text: str, sets: dict | None = None,
            timeout: float = 60) -> tuple[int, str]:
    """POST /api/queries as a page or a script would: (status, the raw reply body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        body = json.dumps({"text": text, "file": "lpm.gsql", "sets": sets or {}})
        conn.request("POST", "/api/queries", body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def _status_seconds(server: Server) -> float:
    start = time.monotonic()
    server.client.status()
    return time.monotonic() - start


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def outside(tmp_path):
    """A secret file outside the data directory, a data directory with a good prefix
    file, a FIFO, a symlink to the secret and a file over the size cap."""
    secret = tmp_path / "shadow"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    data = tmp_path / "data"
    data.mkdir()
    (data / "all.tbl").write_text("# every address\n0.0.0.0/0|7\n")
    os.mkfifo(data / "feed.fifo")
    os.mkfifo(tmp_path / "outside.fifo")
    (data / "shadow.tbl").symlink_to(secret)
    with open(data / "huge.tbl", "wb") as f:
        f.truncate(17 << 20)         # sparse: over the 16 MiB cap, nothing written
    return tmp_path, secret, data


@pytest.mark.slow
def test_submitted_files_only_from_data_dirs(ten_seconds_pcap, outside):
    tmp, secret, data = outside
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--data-dir", str(data),
                     "--memory-budget", "1GiB"], tmp / "state", tmp / "serve.log").start()
    try:
        refused = {
            str(secret): "not under a --data-dir",
            str(tmp / "missing"): "not under a --data-dir",      # same words: no probing
            "../shadow": "not under a --data-dir",
            "shadow.tbl": "not under a --data-dir",               # a symlink out of it
            "/proc/self/environ": "not under a --data-dir",
            "/dev/zero": "not under a --data-dir",
            str(tmp / "outside.fifo"): "not under a --data-dir",
            "feed.fifo": "not a regular file (a FIFO)",
            str(data / "feed.fifo"): "not a regular file (a FIFO)",
            "huge.tbl": "larger than the 16 MiB cap",
            "nosuch.tbl": "not found",
        }
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
        env_value = next(v for v in environ.split(b"\0") if v.startswith(b"PATH="))
        for path, rule in refused.items():
            status, body = _submit(server, _query(f"getlpmid(srcIP, '{path}')"))
            assert status == 400, (path, status, body)
            error = json.loads(body)["error"]
            assert f"prefix file {path}: {rule}" in error, error
            assert "SECRET" not in body and env_value.decode() not in body, body
        regex = ("DEFINE { query_name rx; }\nSELECT tb, count(*) AS packets FROM main.TCP\n"
                 "WHERE str_file_regex_match(TCP_data, '/proc/self/environ', 1, 1)\n"
                 "GROUP BY time AS tb;\n")
        status, body = _submit(server, regex)
        assert status == 400 and "not under a --data-dir" in body, body
        # the FIFO did not block the planner: the server answers at once
        assert _status_seconds(server) < 5
        assert server.client.queries() == []

        # a submission whose table would not fit the budget is refused before allocating
        rss = _rss_kib(server.proc.pid)
        start = time.monotonic()
        status, body = _submit(server, _query("getlpmid(srcIP, 'all.tbl')", "big"),
                               sets={"aggregate_slots": str(1 << 30)})
        assert time.monotonic() - start < 5
        assert status == 413, body
        error = json.loads(body)["error"]
        assert "aggregate_slots 1,073,741,824" in error and "memory budget of 1 GiB" in error
        assert _rss_kib(server.proc.pid) - rss < 200 * 1024         # nothing allocated
        status, body = _submit(server, _query("getlpmid(srcIP, 'all.tbl')", "big"),
                               sets={"aggregate_slots": str(1 << 31)})
        assert status == 400 and "too large" in body, body     # the parse-time bound

        # a prefix file inside the data directory works end to end
        server.wait_spark()
        status, body = _submit(server, _query("getlpmid(srcIP, 'all.tbl')"))
        assert status == 201, body
        wait_for(lambda: server.client.queries()[0]["rows_out"] >= 1, 120, "rows")
        reply = server.client.request("GET", "/api/queries/lpm/rows?limit=10")
        at = reply["columns"].index("id")
        assert reply["rows"] and {r[at] for r in reply["rows"]} == {7}, reply
    finally:
        server.stop()


def test_without_data_dir_no_file_is_read(ten_seconds_pcap, tmp_path):
    inside = tmp_path / "p.tbl"
    inside.write_text("0.0.0.0/0|7\n")
    server = Server(["--link", f"main={ten_seconds_pcap}"], tmp_path / "state",
                    tmp_path / "serve.log").start()
    try:
        for path in (str(inside), "p.tbl", "/etc/passwd"):
            status, body = _submit(server, _query(f"getlpmid(srcIP, '{path}')"))
            assert status == 400, body
            assert "start it with --data-dir DIR" in json.loads(body)["error"]
        assert server.client.queries() == []
    finally:
        server.kill9()
