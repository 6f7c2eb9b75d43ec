"""The client side of the control API, for `oopscope submit | queries | tail | cancel | status |
shutdown`: plain HTTP over TCP or a Unix socket (`http.client`; nothing to install)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

from common import settings
from common.errors import OopscopeError

DEFAULT_SERVER = "http://127.0.0.1:7405/"


class ControlError(OopscopeError):
    """The server refused a request (its message), or cannot be reached (where and why)."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if self.timeout is not None:
            self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Client:
    def __init__(self, server: str | None = None, token: str | None = None,
                 timeout: float | None = 120.0):
        self.server = server or settings.server() or DEFAULT_SERVER
        self.token = token
        self.timeout = timeout

    def _connection(self, timeout=None) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        if self.server.startswith("unix:"):
            return _UnixConnection(self.server[5:], t)
        parts = urlsplit(self.server if "://" in self.server else f"http://{self.server}")
        if parts.scheme == "https":
            return http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=t)
        return http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=t)

    def _prefix(self) -> str:
        if self.server.startswith("unix:"):
            return ""
        path = urlsplit(self.server if "://" in self.server else f"http://{self.server}").path
        return path.rstrip("/")

    def _open(self, method: str, path: str, body=None, timeout=None):
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
        if body is not None or method in ("POST", "PUT", "PATCH", "DELETE"):
            # the server takes a state-changing request only as JSON (no HTML form can
            # send that type across sites)
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection(timeout)
        try:
            conn.request(method, self._prefix() + path, body=data, headers=headers)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise ControlError(f"server {self.server}: cannot reach it: {why} (is `oopscope "
                               f"serve` running there? --server URL names another)") from None

    def request(self, method: str, path: str, body=None) -> dict:
        conn, resp = self._open(method, path, body)
        try:
            raw = resp.read()
        finally:
            conn.close()
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError:
            reply = {"error": raw.decode(errors="replace")[:300]}
        if resp.status >= 400:
            raise ControlError(reply.get("error") or f"server {self.server}: HTTP {resp.status}")
        return reply

    def lines(self, path: str) -> Iterator[dict]:
        """The JSON lines of a streaming reply (a tail), as they come."""
        conn, resp = self._open("GET", path, timeout=None)
        try:
            if resp.status >= 400:
                raw = resp.read()
                try:
                    msg = json.loads(raw).get("error")
                except ValueError:
                    msg = raw.decode(errors="replace")[:300]
                raise ControlError(msg or f"HTTP {resp.status}")
            for line in resp:
                line = line.strip()
                if line:
                    yield json.loads(line)
        finally:
            conn.close()

    # --- the calls -----------------------------------------------------------------------------
    def submit(self, **body) -> dict:
        return self.request("POST", "/api/queries", body)

    def queries(self) -> list[dict]:
        return self.request("GET", "/api/queries")["queries"]

    def cancel(self, name: str) -> dict:
        return self.request("DELETE", f"/api/queries/{quote(name, safe='')}")

    def status(self) -> dict:
        return self.request("GET", "/api/status")

    def shutdown(self) -> dict:
        return self.request("POST", "/api/shutdown")

    def tail(self, name: str) -> Iterator[dict]:
        return self.lines(f"/api/queries/{quote(name, safe='')}/tail")
