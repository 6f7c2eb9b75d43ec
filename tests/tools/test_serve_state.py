"""The appliance's state directory, trusted only as far as it can be (issue 34, findings 7-10):
planted records skipped without touching what they name, outputs kept out of the state
directory, the directory locked by one server, private to its user (umask 077), a Unix socket
removed only when nothing answers on it, a token file readable by others refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, free_port, read_output, wait_for
from tools.serve.client import ControlError


def _record(name: str, **fields) -> dict:
    return {"name": name, "file": "persec.gsql", "text": PER_SECOND, **fields}


def _plant(state: Path, stem: str, record: dict) -> None:
    d = state / "queries"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stem}.json").write_text(json.dumps(record))


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.cli", "serve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _refused(res: subprocess.CompletedProcess, message: str) -> None:
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and message in lines[0], res.stderr


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.slow
def test_planted_records_are_skipped_and_outputs_stay_out_of_the_state(ten_seconds_pcap,
                                                                        tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    # a record named ../../victim that stopped cleanly: its generation was
    # state/run/../../victim/g1, removed at the start before a new one began
    victim = tmp_path / "victim" / "g1"
    victim.mkdir(parents=True)
    (victim / "precious").write_text("keep me")
    _plant(state, "x", _record("../../victim", stopped_cleanly=True))
    # outputs outside the output root: their temporaries were deleted at the start
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name in (".part-g0001-0.csv.1.tmp", ".notes.tmp"):
        (elsewhere / name).write_text("keep me")
    _plant(state, "away", _record("away", outputs={"persec": str(elsewhere)}))
    # a name with a slash whose text cannot be planned: its failure crashed every start
    _plant(state, "ab", _record("a/b", text="SELECT nonsense"))
    _plant(state, "typed", _record("typed", generation="1"))
    _plant(state, "spool", _record("spool", spool_root=str(tmp_path)))
    # a heartbeat and gaps of the wrong shapes: each crashed the start with a traceback
    (state / "server.json").write_text(json.dumps({"heartbeat_ns": "soon", "clean": True}))
    (state / "gaps.json").write_text("{}")
    # and a sound one, which resumes
    _plant(state, "good", _record("good", outputs={"persec": str(state / "good")}))
    log = tmp_path / "serve.log"
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"], state,
                    log).start()
    try:
        queries = {q["name"]: q for q in server.client.queries()}
        assert set(queries) == {"good"} and queries["good"]["state"] == "running"
        assert (victim / "precious").read_text() == "keep me"
        assert sorted(p.name for p in elsewhere.iterdir()) == [".notes.tmp",
                                                                 ".part-g0001-0.csv.1.tmp"]
        text = log.read_text()
        assert "Traceback" not in text
        for stem, why in (("x", "not a query name"), ("away", "outside the output root"),
                          ("ab", "not a query name"), ("typed", "generation: not"),
                          ("spool", "spool_root")):
            lines = [line for line in text.splitlines() if f"queries/{stem}.json" in line]
            assert len(lines) == 1 and why in lines[0] and "skipped" in lines[0], lines
        assert "keep me" not in text and "nonsense" not in text     # no contents echoed
        assert "server.json: not a heartbeat" in text and "gaps.json: not a list" in text
        assert server.client.status()["gaps"] == []

        # outputs into the state directory's own entries, or holding it: refused, and
        # nothing is created or recorded
        for outputs, name in (({"persec": "."}, None), ({"persec": "queries"}, None),
                              ({"persec": "run/x"}, None), ({"persec": "queries/q"}, "q"),
                              (None, "run"), (None, "queries")):
            with pytest.raises(ControlError, match="state directory"):
                server.client.submit(text=PER_SECOND, file="persec.gsql", name=name,
                                     outputs=outputs)
        assert not (state / "run" / "x").exists() and not (state / "queries" / "q").exists()
        assert sorted(p.name for p in (state / "queries").iterdir()
                      if not p.name.startswith(".")) == \
            ["ab.json", "away.json", "good.json", "spool.json", "typed.json", "x.json"]
        assert [q["name"] for q in server.client.queries()] == ["good"]

        # umask 077: results and state files are the user's alone
        server.wait_spark()
        wait_for(lambda: read_output(state / "good")[1], 120, "a result file")
        part = read_output(state / "good")[1][0]
        assert _mode(part) == 0o600 and _mode(part.parent) == 0o700
        for path in (state / "queries" / "good.json", state / "server.json",
                     state / "serve.lock"):
            assert _mode(path) == 0o600, path
        assert _mode(state / "run") == 0o700
    finally:
        assert server.stop() == 0, server.log()


def test_state_and_output_root_must_be_private(ten_seconds_pcap, tmp_path):
    link = f"main={ten_seconds_pcap}"
    listen = f"127.0.0.1:{free_port()}"
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    _refused(_serve("--link", link, "--state", str(shared), "--listen", listen),
             "writable by others than its owner (mode 0777)")
    group = tmp_path / "group"
    group.mkdir()
    os.chmod(group, 0o770)
    _refused(_serve("--link", link, "--state", str(tmp_path / "s"), "--output-root",
                    str(group), "--listen", listen), "writable by others")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        _refused(_serve("--link", link, "--state", str(theirs), "--listen", listen),
                 "is owned by uid 65534")
        assert list(theirs.iterdir()) == []
    inside = tmp_path / "s2"
    _refused(_serve("--link", link, "--state", str(inside), "--output-root",
                    str(inside / "run"), "--listen", listen),
             "run is the server's own")
    assert _mode(inside) == 0o700        # made by the server: its user's alone
    # a group-writable umask, a token file others can read: refused in one line
    res = _serve("--link", link, "--state", str(tmp_path / "s3"), "--umask", "002")
    assert res.returncode == 2 and "keep 022" in res.stderr
    token = tmp_path / "token"
    token.write_text("a-token-of-this-test-0123456789")
    os.chmod(token, 0o644)
    res = _serve("--link", link, "--state", str(tmp_path / "s4"), "--listen", listen,
                 "--token-file", str(token))
    _refused(res, "readable by others than its owner (mode 0644): chmod 600 it")
    assert "a-token-of" not in res.stderr and not (tmp_path / "s4").exists()


def _holders(path: Path) -> list[int]:
    """The processes with `path` open."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(path) for fd in fds):
                out.append(int(pid))
        except OSError:
            continue
    return out


@pytest.mark.slow
def test_one_server_per_state_and_a_killed_one_restarts(ten_seconds_pcap, tmp_path):
    state = tmp_path / "state"
    args = ["--link", f"main={ten_seconds_pcap}", "--loop", "--speed", "4"]
    server = Server(args, state, tmp_path / "serve.log").start()
    old_group = None
    try:
        res = _serve(*args, "--state", str(state), "--listen", f"127.0.0.1:{free_port()}")
        _refused(res, f"another server uses it (pid {server.proc.pid})")
        assert server.client.status()["links"][0]["name"] == "main"
        server.wait_spark()
        server.client.submit(text=PER_SECOND, file="persec.gsql")
        # the JVM (and any process it starts) must not hold the lock: after the server
        # alone is killed, the restart would be refused while they live
        lock = state / "serve.lock"
        assert _holders(lock) == [server.proc.pid]
        old_group = server.proc.pid
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=30)
        server.start()
        (q,) = server.client.queries()
        assert q["name"] == "persec" and q["state"] == "running"
    finally:
        if old_group is not None:
            try:
                os.killpg(old_group, signal.SIGKILL)     # the killed server's JVM
            except ProcessLookupError:
                pass
        assert server.stop() == 0, server.log()


def test_unix_socket_removed_only_when_nothing_answers(ten_seconds_pcap, tmp_path):
    sock = tmp_path / "ctl.sock"
    args = ["--link", f"main={ten_seconds_pcap}"]
    first = Server(args, tmp_path / "a", tmp_path / "a.log", listen=f"unix:{sock}").start()
    try:
        res = _serve(*args, "--state", str(tmp_path / "b"), "--listen", f"unix:{sock}")
        _refused(res, f"unix:{sock}: another server listens on it")
        assert first.client.status()["links"][0]["name"] == "main"    # still its socket
        first.kill9()
        assert sock.is_socket()                # left behind: nothing answers on it
        with socket.socket(socket.AF_UNIX) as s, pytest.raises(ConnectionRefusedError):
            s.connect(str(sock))
        second = Server(args, tmp_path / "b", tmp_path / "b.log",
                        listen=f"unix:{sock}").start()
        try:
            assert second.client.status()["state_dir"] == str(tmp_path / "b")
        finally:
            assert second.stop() == 0, second.log()
    finally:
        first.stop()
    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    _refused(_serve(*args, "--state", str(tmp_path / "c"), "--listen", f"unix:{plain}"),
             "exists and is not a socket")
    assert plain.read_text() == "not a socket"
