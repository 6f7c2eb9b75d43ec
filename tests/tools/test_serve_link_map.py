"""`oopscope submit --link-map`: a query naming link `main` (as the shipped ones do) reads a
server's link of another name, is told how when it does not, and keeps its map across a
kill -9 and restart."""

from __future__ import annotations

import json

import pytest

from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, read_output, wait_for
from tools.serve.client import ControlError


@pytest.mark.slow
def test_link_map_reads_the_server_link_and_survives_a_restart(ten_seconds_pcap, tmp_path):
    state = tmp_path / "state"
    server = Server(["--link", f"L={ten_seconds_pcap}", "--loop", "--speed", "4"], state,
                    tmp_path / "serve.log").start()
    query = tmp_path / "persec.gsql"
    query.write_text(PER_SECOND)
    try:
        # the server's only link is L, the query reads main: the error says what to write
        res = server.cli("submit", str(query), check=False)
        assert res.returncode == 1
        assert "no link main on this server" in res.stderr
        assert "--link-map main=L" in res.stderr
        assert "Traceback" not in res.stderr
        # a map naming a link the query does not read, or a link the server lacks
        res = server.cli("submit", str(query), "--link-map", "mian=L", check=False)
        assert res.returncode == 1 and "reads no link mian" in res.stderr
        with pytest.raises(ControlError, match="--link-map main=M: no link M on this server"):
            server.client.submit(text=PER_SECOND, file="persec.gsql", link_map={"main": "M"})
        assert server.client.queries() == []
        assert not (state / "queries" / "persec.json").exists()

        server.wait_spark()
        server.cli("submit", str(query), "--link-map", "main=L")
        (q,) = server.client.queries()
        assert q["name"] == "persec" and q["links"] == ["L"]
        record = json.loads((state / "queries" / "persec.json").read_text())
        assert record["link_map"] == {"main": "L"}
        out = state / "persec"
        wait_for(lambda: len(read_output(out)[1]) >= 2, 90, "persec's windows")

        # a crash and a restart: the query is planned again from its record, map included
        server.kill9()
        written = len(read_output(out)[1])
        server.start()
        (q,) = server.client.queries()
        assert q["state"] == "running" and q["links"] == ["L"], q
        server.wait_spark()
        wait_for(lambda: len(read_output(out)[1]) > written, 120,
                 "windows written after the restart")
    finally:
        code = server.stop()
    assert code == 0, server.log()
