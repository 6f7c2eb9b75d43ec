"""`oopscope serve`'s control API without root: metrics against the counters, the token, the
output root, a Unix socket, a clean stop and restart, and the tails' bounded buffers."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, free_port, metric_samples, per_window, read_output, wait_for
from tools.serve.client import Client, ControlError
from tools.serve.tail import Hub, Subscriber

TOKEN = "s3cret-token-of-this-test-0123456789"




@pytest.mark.slow
def test_metrics_token_output_root_and_clean_restart(ten_seconds_pcap, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    state = tmp_path / "state"
    args = ["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4", "--token-file",
            str(token_file)]
    server = Server(args, state, tmp_path / "serve.log", token=TOKEN).start()
    try:
        # without the token: 401, whatever the path
        bare = Client(server.client.server)
        for call in (bare.status, bare.queries, lambda: bare.cancel("x")):
            with pytest.raises(ControlError, match="token is required"):
                call()
        conn, resp = bare._open("GET", "/metrics")
        assert resp.status == 401
        conn.close()
        for public in ("/", "/static/app.js"):          # the page itself holds no data
            conn, resp = bare._open("GET", public)
            assert resp.status == 200, public
            conn.close()
        server.wait_spark()
        # an output that escapes the root is refused, and nothing runs
        for bad in ("/etc/oops", "../elsewhere"):
            with pytest.raises(ControlError, match="outside the output root"):
                server.client.submit(text=PER_SECOND, file="persec.gsql",
                                     outputs={"persec": bad})
        assert server.client.queries() == []
        reply = server.client.submit(text=PER_SECOND, file="persec.gsql",
                                     outputs={"persec": "results/persec"})
        out = state / "results" / "persec"
        assert reply["outputs"] == {"persec": str(out)}
        server.client.submit(text=PER_SECOND, file="persec.gsql", name="keeps")
        wait_for(lambda: server.client.queries()[0]["rows_out"] >= 3, 90, "three windows")
        # cancelled, persec's counters stop: the metrics must equal them, and its files
        server.client.cancel("persec")
        before = server.client.status()
        m = metric_samples(server.client)
        after = server.client.status()
        q = next(q for q in server.client.queries() if q["name"] == "persec")
        assert q["state"] == "cancelled"
        got = per_window(read_output(out)[0])
        assert m[("oopscope_query_rows_total", (("query", "persec"),))] == q["rows_out"] \
            == len(got) > 0
        assert m[("oopscope_query_partial_rows_total", (("query", "persec"),))] == \
            q["partial_rows"] > 0
        assert m[("oopscope_query_late_packets_total", (("query", "persec"),))] == 0
        assert m[("oopscope_query_running", (("query", "persec"),))] == 0
        assert m[("oopscope_query_running", (("query", "keeps"),))] == 1
        assert m[("oopscope_query_output_latency_seconds_count", (("query", "keeps"),))] >= 1
        assert m[("oopscope_spark_up", ())] == 1
        # the link's counters grow (the file loops): the scrape lies between two statuses
        for key, metric in (("packets", "oopscope_link_packets_total"),
                            ("bytes", "oopscope_link_bytes_total"),
                            ("ring_drops", "oopscope_link_ring_drops_total")):
            value = m[(metric, (("link", "main"),))]
            assert before["links"][0][key] <= value <= after["links"][0][key], key
        assert after["links"][0]["packets"] > 20000
        # a clean stop, as SIGTERM: the CLI waits until the server is gone
        res = server.cli("shutdown", "--token-file", str(token_file))
        assert "server stopped" in res.stdout
        assert server.proc.wait(timeout=60) == 0
        keeps = state / "keeps"
        first = {f.name for f in read_output(keeps)[1]}
        assert first and all(n.startswith("part-g0001-") for n in first)
        server.start()
        q2 = {q["name"]: q for q in server.client.queries()}
        assert q2["keeps"]["state"] == "running" and q2["keeps"]["generation"] == 2
        assert q2["persec"]["state"] == "cancelled"
        assert server.client.status()["gaps"][-1]["reason"] == "server stopped"
        server.wait_spark()
        wait_for(lambda: any(f.name.startswith("part-g0002-") for f in read_output(keeps)[1]),
                 90, "the second generation's windows")
    finally:
        code = server.stop()
    assert code == 0, server.log()
    assert first <= {f.name for f in read_output(keeps)[1]}
    per_window(read_output(keeps)[0])          # still no window twice


def test_non_loopback_listen_needs_a_token(tmp_path, ten_seconds_pcap):
    res = subprocess.run([sys.executable, "-m", "tools.cli", "serve", "--link",
                          f"main={ten_seconds_pcap}", "--state", str(tmp_path / "s"),
                          "--listen", f"0.0.0.0:{free_port()}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert "not a loopback address: give --token-file" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_unix_socket_is_private(tmp_path, ten_seconds_pcap):
    sock = tmp_path / "ctl.sock"
    server = Server(["--link", f"main={ten_seconds_pcap}"], tmp_path / "state",
                    tmp_path / "serve.log", listen=f"unix:{sock}").start()
    try:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert server.client.server == f"unix:{sock}"
        assert server.client.status()["links"][0]["name"] == "main"
        res = server.cli("status")
        assert "main" in res.stdout
    finally:
        assert server.stop() == 0
    assert not sock.exists()


def test_a_slow_tail_is_told_what_it_missed():
    async def scenario():
        hub = Hub()
        sub = hub.subscribe(Subscriber(asyncio.get_running_loop(), {"q"}, limit=100))
        other = hub.subscribe(Subscriber(asyncio.get_running_loop(), {"r"}, limit=100))
        for batch in range(10):
            hub.rows("q", ["tb", "n"], [[batch, i] for i in range(30)], batch)
        await asyncio.sleep(0)
        events, missed = sub.take()
        assert missed == 7 * 30            # the oldest batches went, the newest 3 stayed
        assert [e["batch"] for e in events] == [7, 8, 9]
        assert other.take() == ([], 0)     # another stream's subscriber saw nothing
        assert list(hub.recent["q"])[-1] == [9, 29]
        hub.end("q", "cancelled")
        events, missed = sub.take()
        assert events[0]["event"] == "end" and missed == 0

    asyncio.run(scenario())
