"""The appliance's HTTP face against hostile requests (issue 34: findings 2, 3's body, 5, 6, 10),
each a real request to a real `oopscope serve`: the attack first, then the refusal and the
server still up with nothing changed. And a hypothesis fuzz of the JSON API: never a 5xx.

One server replays a capture with query `persec` running for the module's tests that use it
(`guarded`: they come after the others, so it runs only while they do, a running query costing
~0.4 CPU-s a second); the token's test has a server of its own (`tokened`, no query)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO
from tests.tools.conftest import PER_SECOND
from tests.tools.serving import Server, wait_for
from tools.serve.bodies import MAX_ROWS, SUBMISSION_FIELDS
from tools.serve.guard import COOKIE, Hosts
from tools.serve.tail import Hub, Subscriber

pytestmark = pytest.mark.slow

TOKEN = "guard-test-token-0123456789abcdef"
JSON = {"Content-Type": "application/json"}
#: `serve`'s defaults, which the tests below run against
MAX_BODY, MAX_STREAMS, REQUEST_TIMEOUT = 1 << 20, 32, 10


@pytest.fixture(scope="module")
def guarded(ten_seconds_pcap, tmp_path_factory):
    d = tmp_path_factory.mktemp("guarded")
    server = Server(["--link", f"main={ten_seconds_pcap}", "--loop", "--allow-host",
                     "proxy.example"], d / "state", d / "serve.log").start()
    try:
        server.wait_spark()
        server.client.submit(text=PER_SECOND, file="persec.gsql")
        wait_for(lambda: server.client.queries()[0]["rows_out"] >= 1, 90, "persec's rows")
        yield server
    finally:
        server.stop()
    assert "Traceback" not in server.log_path.read_text(errors="replace")


@pytest.fixture
def tokened(ten_seconds_pcap, tmp_path_factory):
    # one test uses it: stopped as that test ends, not idle to the module's end
    d = tmp_path_factory.mktemp("tokened")
    token_file = d / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    server = Server(["--link", f"main={ten_seconds_pcap}", "--token-file", str(token_file)],
                    d / "state", d / "serve.log", token=TOKEN).start()
    try:
        yield server
    finally:
        server.stop()


def call(server: Server, method: str, path: str, body: bytes | None = None,
         headers: dict | None = None, timeout: float = 60) -> tuple[int, dict, bytes]:
    """One raw request: (status, headers lower-cased, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        given = {"Host": f"127.0.0.1:{server.port}", **(headers or {})}
        if body is not None:
            given.setdefault("Content-Length", str(len(body)))
        for k, v in given.items():
            conn.putheader(k, v)
        try:
            conn.endheaders(body)
        except (BrokenPipeError, ConnectionResetError):
            pass        # refused before the whole body was sent (413): its reply is read
        try:
            resp = conn.getresponse()
        except (ConnectionResetError, http.client.RemoteDisconnected):
            return 0, {}, b""       # closed before a reply could be read
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def error_of(raw: bytes, one_line: bool = True) -> str:
    """A refusal's message: JSON, one line (the planner's show the query's line too), never
    a traceback."""
    message = json.loads(raw)["error"]
    assert isinstance(message, str) and "Traceback" not in message
    assert "\n" not in message or not one_line, message
    return message


def up(server: Server) -> bool:
    return server.proc.poll() is None and server.client.status()["links"][0]["name"] == "main"


# --- finding 10: the token is never in a URL; the page's cookie ------------------------------

def test_the_token_is_taken_from_a_header_or_cookie_never_the_url(tokened):
    port = tokened.port
    status, _, raw = call(tokened, "GET", f"/api/status?token={TOKEN}")
    assert status == 401 and "token is required" in error_of(raw)
    assert call(tokened, "GET", "/api/status",
                headers={"Authorization": f"Bearer {TOKEN}"})[0] == 200
    # the page's login: JSON from its own origin, the right token -> an HttpOnly cookie
    login = json.dumps({"token": TOKEN}).encode()
    assert call(tokened, "POST", "/api/login", login, {"Content-Type": "text/plain"})[0] == 415
    assert call(tokened, "POST", "/api/login", login,
                {**JSON, "Origin": "http://evil.example"})[0] == 403
    status, headers, raw = call(tokened, "POST", "/api/login",
                                json.dumps({"token": TOKEN + "x"}).encode(), JSON)
    assert status == 401 and "set-cookie" not in headers
    status, headers, raw = call(tokened, "POST", "/api/login", b'{"token": 5}', JSON)
    assert status == 400 and "set-cookie" not in headers
    status, headers, _ = call(tokened, "POST", "/api/login", login,
                              {**JSON, "Origin": f"http://127.0.0.1:{port}"})
    assert status == 200
    cookie = headers["set-cookie"]
    flags = {f.strip().lower() for f in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= flags
    pair = cookie.split(";")[0]
    assert pair.startswith(f"{COOKIE}=") and TOKEN not in pair
    # the cookie opens the API and the event stream
    assert call(tokened, "GET", "/api/queries", headers={"Cookie": pair})[0] == 200
    assert call(tokened, "GET", "/api/queries", headers={"Cookie": pair + "x"})[0] == 401
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/api/events", headers={"Cookie": pair})
        resp = conn.getresponse()
        assert resp.status == 200
        assert resp.readline().decode().startswith("event: status")
    finally:
        conn.close()
    # the page needs no token, and no longer reads one from its URL
    page = (REPO / "tools" / "serve" / "static" / "app.js").read_text()
    assert "location.search).get(\"token\")" not in page and 'set("token"' not in page
    assert up(tokened)


def test_a_token_file_others_may_read_is_refused(tmp_path, ten_seconds_pcap):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o644)
    res = subprocess.run([sys.executable, "-m", "tools.cli", "serve", "--link",
                          f"main={ten_seconds_pcap}", "--state", str(tmp_path / "s"),
                          "--token-file", str(token_file)], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 1
    assert "readable by others than its owner" in res.stderr and TOKEN not in res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "s").exists()


# --- finding 2: a web page cannot control the server ------------------------------------------

def test_host_rules():
    loop = Hosts("127.0.0.1", 7405, unix=False)
    assert loop.allowed("127.0.0.1:7405") and loop.allowed("localhost:7405")
    assert loop.allowed("[::1]:7405") and loop.allowed("LOCALHOST.:7405")
    for bad in ("evil.example:7405", "127.0.0.1:7406", "127.0.0.1", "10.0.0.1:7405",
                "localhost:7405:1", "[::1", "", None, "localhost:0"):
        assert not loop.allowed(bad), bad
    wild = Hosts("0.0.0.0", 7405, unix=False, allow=("proxy.example", "other.example:8080"))
    assert wild.allowed("10.1.2.3:7405") and wild.allowed("[fe80::1]:7405")
    assert wild.allowed(f"{socket.gethostname()}:7405")
    assert wild.allowed("proxy.example") and wild.allowed("proxy.example:1234")
    assert wild.allowed("other.example:8080") and not wild.allowed("other.example:8081")
    assert not wild.allowed("evil.example:7405") and not wild.allowed("10.1.2.3:7406")
    unix = Hosts(None, None, unix=True)
    assert unix.allowed("localhost") and unix.allowed("anything") and unix.allowed(None)
    proxied = Hosts(None, None, unix=True, allow=("proxy.example",))
    assert proxied.allowed("proxy.example") and proxied.allowed("localhost")
    assert not proxied.allowed("evil.example")


def test_cross_site_requests_are_refused(guarded):
    names = [q["name"] for q in guarded.client.queries()]
    port = guarded.port
    # the issue's attack: a DNS-rebound page posts a text/plain form to shutdown (was 202)
    status, _, raw = call(guarded, "POST", "/api/shutdown", b"x",
                          {"Host": "evil.example", "Origin": "http://evil.example",
                           "Content-Type": "text/plain"})
    assert status == 421 and "evil.example" in error_of(raw)
    # a rebound page may not even read
    for host in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}",
                 f"127.0.0.1:{port + 1}", ""):
        status, _, raw = call(guarded, "GET", "/api/status", headers={"Host": host})
        assert status == 421, host
    # the server's own Host, from a cross-site form (no JSON) or another origin's script
    for headers, want in (({"Content-Type": "text/plain"}, 415),
                          ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
                          ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
                          ({}, 415),
                          ({**JSON, "Origin": "http://evil.example"}, 403),
                          ({**JSON, "Origin": f"http://evil.example:{port}"}, 403),
                          ({**JSON, "Origin": "null"}, 403),
                          ({**JSON, "Origin": f"http://localhost:{port}"}, 403)):
        for method, path, body in (("POST", "/api/shutdown", b"{}"),
                                   ("POST", "/api/queries", json.dumps(
                                       {"text": PER_SECOND, "name": "evil"}).encode()),
                                   ("DELETE", "/api/queries/persec", b"")):
            status, resp_headers, raw = call(guarded, method, path, body, headers)
            assert status == want, (method, path, headers, raw)
            error_of(raw)
            assert not any(k.startswith("access-control-") for k in resp_headers)
    # a preflight gets no CORS permission either
    status, resp_headers, _ = call(guarded, "OPTIONS", "/api/queries", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert status >= 400 and not any(k.startswith("access-control-") for k in resp_headers)
    # nothing changed: the server is up, persec still running, no query `evil`
    time.sleep(1)
    assert up(guarded)
    assert [q["name"] for q in guarded.client.queries()] == names
    assert guarded.client.queries()[0]["state"] == "running"
    # the server's own origin, and a reverse proxy's name (--allow-host) are served
    status, _, raw = call(guarded, "DELETE", "/api/queries/nothing", b"",
                          {**JSON, "Origin": f"http://127.0.0.1:{port}"})
    assert status == 404 and "no running query" in error_of(raw)
    for host in ("proxy.example", "proxy.example:443", "PROXY.example."):
        status, _, _ = call(guarded, "GET", "/api/status", headers={"Host": host})
        assert status == 200, host
    status, _, raw = call(guarded, "DELETE", "/api/queries/nothing", b"",
                          {**JSON, "Origin": "https://proxy.example"})
    assert status == 404, raw


# --- finding 6 and 10: wrong types, limits, names ---------------------------------------------

WRONG = [({"text": PER_SECOND, "name": 7}, "name"), ({"text": PER_SECOND, "params": "abc"},
                                                      "params"),
         ({"text": PER_SECOND, "sets": [1]}, "sets"), ({"text": PER_SECOND, "outputs": "abc"},
                                                       "outputs"),
         ({"text": PER_SECOND, "outputs": {"persec": 5}}, "outputs"),
         ({"text": PER_SECOND, "format": 3}, "format"), ({"text": PER_SECOND, "file": {}}, "file"),
         ({"text": 5}, "text"), ({}, "text"), ({"text": PER_SECOND, "schemas": "x"}, "schemas"),
         ({"text": PER_SECOND, "schemas": [["a"]]}, "schemas"),
         ({"text": PER_SECOND, "params": {"a": [1]}}, "params"),
         ({"text": PER_SECOND, "params": {"a": None}}, "params"),
         ({"text": PER_SECOND, "link_map": "main=L"}, "link_map"),
         ({"text": PER_SECOND, "link_map": {"main": 5}}, "link_map"),
         ({"text": PER_SECOND, "link_map": {"main": "L" * 65}}, "link_map")]


def test_wrong_types_answer_400_naming_the_field(guarded):
    before = guarded.client.queries()
    for body, field in WRONG:
        status, _, raw = call(guarded, "POST", "/api/queries", json.dumps(body).encode(), JSON)
        message = error_of(raw)
        assert status == 400 and f"`{field}` must be" in message, (body, message)
        assert SUBMISSION_FIELDS[field].split(" (")[0] in message
    for raw_body, words in ((b"[1, 2]", "JSON object"), (b"\"x\"", "JSON object"),
                            (b"{", "not JSON"), (b"\xff\xfe", "not JSON"),
                            (b"[" * 100_000, "nests too deeply"),
                            (b'{"text": "x", "txt": 1}', "unknown field 'txt'")):
        status, _, raw = call(guarded, "POST", "/api/queries", raw_body, JSON)
        assert status == 400 and words in error_of(raw), raw_body[:20]
    status, _, raw = call(guarded, "DELETE", "/api/queries/persec", b"abc", JSON)
    assert status == 400 and "takes no body" in error_of(raw)
    # rows?limit: from 1 to MAX_ROWS, else 400 (0 returned everything)
    for bad in ("0", "-1", "-100000", str(MAX_ROWS + 1), "1e9", "abc", ""):
        status, _, raw = call(guarded, "GET", f"/api/queries/persec/rows?limit={bad}")
        assert status == 400 and f"from 1 to {MAX_ROWS}" in error_of(raw), bad
    wait_for(lambda: len(guarded.client.request("GET", "/api/queries/persec/rows?limit=100")
                         ["rows"]) >= 2, 60, "two rows")
    status, _, raw = call(guarded, "GET", "/api/queries/persec/rows?limit=1")
    assert status == 200 and len(json.loads(raw)["rows"]) == 1
    # a name in a path that cannot be one: 404, not 500, and not echoed whole
    for name in ("a" * 5000, "%00", "%ff%fe", "..%2f..%2fetc", "x" * 64 + ".y", "%E2%80%AE"):
        for method, path in (("DELETE", f"/api/queries/{name}"),
                             ("GET", f"/api/queries/{name}/rows"),
                             ("GET", f"/api/queries/{name}/tail")):
            status, _, raw = call(guarded, method, path, b"" if method == "DELETE" else None,
                                  JSON if method == "DELETE" else None)
            assert status == 404 and len(raw) < 600, (method, path[:40], raw[:200])
    assert [q["name"] for q in guarded.client.queries()] == [q["name"] for q in before]
    assert up(guarded)


# --- finding 3 (the body): a cap, checked before reading --------------------------------------

def test_a_body_over_the_cap_is_refused_unread(guarded):
    pid = guarded.proc.pid
    rss = _rss(pid)
    # Content-Length of 300 MB, nothing sent: refused at once, without waiting for the body
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=20) as s:
        s.sendall(f"POST /api/queries HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {300 << 20}\r\n\r\n"
                  .encode())
        reply = _read_reply(s)
    assert reply.startswith(b"HTTP/1.1 413") and b"serve --max-body" in reply
    # chunked, counted as it arrives: refused past the cap
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=20) as s:
        s.sendall(f"POST /api/queries HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
                  f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                  .encode())
        chunk = b"a" * 65536
        for _ in range(MAX_BODY // len(chunk) + 1):
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        reply = _read_reply(s)
    assert reply.startswith(b"HTTP/1.1 413")
    # under the cap: read, and answered by the planner
    body = json.dumps({"text": "-- " + "x" * (MAX_BODY - 200), "file": "big.gsql"}).encode()
    status, _, raw = call(guarded, "POST", "/api/queries", body, JSON)
    assert status == 400, raw[:300]
    assert _rss(pid) - rss < 100 << 20
    assert up(guarded)


def _read_reply(s: socket.socket) -> bytes:
    out = b""
    while b"\r\n\r\n" not in out or not out.rstrip().endswith(b"}"):
        try:
            data = s.recv(65536)
        except ConnectionResetError:
            break
        if not data:
            break
        out += data
    return out


def _rss(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


# --- finding 6: connections bounded in time and number; streams capped --------------------------

def test_half_open_connections_neither_starve_nor_stay(guarded):
    socks = []
    for i in range(300):
        s = socket.create_connection(("127.0.0.1", guarded.port), timeout=60)
        if i % 2:       # half a request line and headers
            s.sendall(b"GET /api/status HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow")
        else:           # whole headers, a body that never comes
            s.sendall(f"POST /api/queries HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{"
                      .encode())
        socks.append(s)
    try:
        t = time.monotonic()
        assert guarded.client.status()["links"][0]["name"] == "main"
        assert time.monotonic() - t < 5
        # every one of them is closed by the server (after the request timeout at the latest;
        # a few whose headers were whole may first be told 503, when every slot was busy)
        deadline = time.monotonic() + REQUEST_TIMEOUT + 20
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            got = b""
            try:
                while data := s.recv(65536):
                    got += data
            except ConnectionResetError:
                pass                    # closed with our bytes unread: closed all the same
            assert got == b"" or got.startswith(b"HTTP/1.1 503 "), got[:100]
    finally:
        for s in socks:
            s.close()
    assert up(guarded)


class Reader(threading.Thread):
    """The event kinds of a stream (`/api/events` or a tail) as they come, on a thread."""

    def __init__(self, server: Server, path: str):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        self.conn.request("GET", path)
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.kinds: list[str] = []
        self.ended: str | None = None

    def run(self):
        try:
            for line in self.resp:
                text = line.decode().strip()
                if text.startswith("event: "):
                    self.kinds.append(text[7:])
                elif text.startswith("{"):
                    self.kinds.append(json.loads(text)["event"])
            self.ended = "the server ended the stream"
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            self.ended = repr(exc)

    def after(self, kind: str, then: str) -> int:
        """How many `then` events came after the first `kind` one."""
        if kind not in self.kinds:
            return 0
        return self.kinds[self.kinds.index(kind):].count(then)

    def close(self):
        self.conn.close()


def test_every_page_and_tail_gets_its_own_events(guarded):
    pages = [Reader(guarded, "/api/events") for _ in range(2)]
    tail = Reader(guarded, "/api/queries/persec/tail")
    readers = [*pages, tail]
    try:
        for r in readers:
            assert r.status == 200
            r.start()
        wait_for(lambda: all(r.kinds.count("rows") >= 1 for r in readers), 60,
                 "rows on both pages and the tail")
        # a submission: every page is sent a `queries` event (the second one died of it)
        guarded.client.submit(text=PER_SECOND, file="persec.gsql", name="second")
        wait_for(lambda: all(p.after("queries", "rows") >= 2 for p in pages), 60,
                 "rows on both pages after the queries event")
        n = tail.kinds.count("rows")
        wait_for(lambda: tail.kinds.count("rows") >= n + 2, 60, "the tail's rows go on")
        assert [r.ended for r in readers] == [None, None, None]
        assert "subscribed" == tail.kinds[0]
    finally:
        for r in readers:
            r.close()
        guarded.client.cancel("second")


def test_subscribers_get_their_own_events_in_bounded_buffers():
    async def scenario():
        loop = asyncio.get_running_loop()
        hub = Hub()
        page, other = (hub.subscribe(Subscriber(loop, None)) for _ in range(2))
        small = hub.subscribe(Subscriber(loop, {"q"}, max_bytes=2000))
        hub.publish("queries", None, {})
        page.take()[0][0].pop("event")        # what the page's stream did to its event
        assert other.take()[0] == [{"event": "queries"}]
        for batch in range(5):
            hub.rows("q", ["tb", "s"], [[batch, "x" * 100] for _ in range(5)], batch)
        events, missed = small.take()
        assert [e["batch"] for e in events] == [2, 3, 4] and missed == 10
        assert all(e["event"] == "rows" for e in events)
        assert small in hub
        hub.unsubscribe(small)
        assert small not in hub

    asyncio.run(scenario())


def test_event_streams_and_tails_are_capped(guarded):
    # the readers of earlier tests gone, their slots come back
    wait_for(lambda: _stream_status(guarded, "/api/events") == 200, 30, "a free stream slot")
    held = []
    try:
        while len(held) < MAX_STREAMS:
            r = Reader(guarded, "/api/events" if len(held) % 2 else
                       "/api/queries/persec/tail")
            assert r.status == 200, len(held)
            held.append(r)
        for path in ("/api/events", "/api/queries/persec/tail"):
            status, _, raw = call(guarded, "GET", path)
            assert status == 503 and "--max-streams" in error_of(raw)
        res = guarded.cli("tail", "persec", check=False, timeout=60)
        assert res.returncode != 0 and "too many event streams" in res.stderr
        assert "Traceback" not in res.stderr
        assert up(guarded)                      # the rest of the API is served
        held.pop().close()
        wait_for(lambda: _stream_status(guarded, "/api/events") == 200, 30,
                 "the closed stream's slot")
    finally:
        for r in held:
            r.close()


def _stream_status(server: Server, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


# --- the fuzz: bodies of wrong types and sizes, never a 5xx -----------------------------------

_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | \
    st.floats(allow_nan=False) | st.text(max_size=30)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) |
                     st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
_texts = st.sampled_from([PER_SECOND, "", "SELECT", "-- nothing\n"]) | st.text(max_size=200)
_submission = st.fixed_dictionaries({"text": _texts | _json}, optional={
    k: _json | st.dictionaries(st.text(max_size=8), _scalars, max_size=3)
    for k in SUBMISSION_FIELDS if k != "text"})
# nearly right: the module's query under other names, formats, outputs (some start: each
# is cancelled at once, so at most one runs beside `persec`)
_near = st.fixed_dictionaries({"text": st.just(PER_SECOND), "file": st.just("persec.gsql")},
                              optional={
    "name": st.sampled_from(["fz1", "fz.2", "-x", "a" * 65]) | st.text(max_size=70),
    "format": st.sampled_from(["csv", "jsonl", "parquet", "xml", ""]) | st.none(),
    "outputs": st.dictionaries(st.sampled_from(["persec", "other"]),
                               st.sampled_from(["out/a", "../x", "/etc/x", "."]) |
                               st.text(max_size=20), max_size=2),
    "params": st.dictionaries(st.text(max_size=5), _scalars, max_size=2),
    "sets": st.dictionaries(st.sampled_from(["flush", "idle_timeout", "nope"]), _scalars,
                            max_size=2)})
_bodies = (_near.map(lambda b: json.dumps(b).encode()) |
           _submission.map(lambda b: json.dumps(b).encode()) | _json.map(
    lambda b: json.dumps(b).encode()) | st.binary(max_size=300) |
    st.integers(MAX_BODY - 1000, MAX_BODY + 1000))       # a text of that size, made below
_names = st.text(min_size=1, max_size=80).map(lambda s: s.replace("/", "_")) | \
    st.sampled_from(["persec", "second", "a" * 300])
_requests = st.one_of(
    st.tuples(st.just("POST"), st.just("/api/queries"), _bodies),
    st.tuples(st.just("POST"), st.just("/api/login"), _bodies),
    # a shutdown's only valid bodies (none, {}) would stop the server: never sent
    st.tuples(st.just("POST"), st.just("/api/shutdown"),
              _bodies.filter(lambda b: isinstance(b, int) or b.strip() not in (b"", b"{}"))),
    st.tuples(st.just("DELETE"), _names.map(lambda n: f"/api/queries/{_quote(n)}"),
              st.sampled_from([b"", b"{}", b"[]", b"x"])),
    st.tuples(st.just("GET"), st.tuples(_names, st.integers(-5, 2 * MAX_ROWS).map(str) |
                                        st.text(max_size=12)).map(
        lambda nl: f"/api/queries/{_quote(nl[0])}/rows?limit={_quote(nl[1])}"), st.none()))


def _quote(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(request=_requests)
def test_fuzz_the_json_api(guarded, request):
    method, path, body = request
    if method == "DELETE" and path.endswith("/persec"):
        return                            # the module's query stays
    if isinstance(body, int):
        body = json.dumps({"text": "x" * body}).encode()
    status, _, raw = call(guarded, method, path, body, JSON if body is not None else None)
    if status == 0:     # a body over the cap, refused while it was still being sent
        assert len(body) > MAX_BODY
        return
    assert status < 500, (method, path[:60], (body or b"")[:200], raw[:300])
    event(f"{method} {path.split('/')[2]}: {status}")
    if status >= 400:
        error_of(raw, one_line=False)
    if status == 201:                     # a valid submission: cancelled at once
        name = json.loads(raw)["name"]
        assert call(guarded, "DELETE", f"/api/queries/{_quote(name)}", b"", JSON)[0] == 200


def test_the_server_is_up_after_the_fuzz(guarded):
    assert up(guarded)
    running = [q["name"] for q in guarded.client.queries() if q["state"] == "running"]
    assert running == ["persec"]
