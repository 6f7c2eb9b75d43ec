"""The appliance's front door: what a request must be before the API sees it (`Guard`, pure ASGI
middleware), and the limits the server was started with (`HttpLimits`).

In order, a request is refused when:

1. its `Host` does not name this server (421): a web page whose own name was re-pointed at
   127.0.0.1 (DNS rebinding) talks to the server with the page's name as `Host`. Accepted:
   the listen address and loopback names with the listen port, and on a non-loopback listen
   any IP address literal (a browser sends one only when its user typed it: no DNS is
   involved) and the machine's host name; anywhere, the `--allow-host` names (a reverse
   proxy's public name). A Unix socket accepts any `Host` (no browser reaches it; the CLI
   sends `localhost`) unless `--allow-host` names are given, which it then checks like TCP.
2. it changes something (POST, PUT, PATCH, DELETE) and its `Content-Type` is not
   `application/json` (415): a cross-site HTML form can send only form types and
   `text/plain`, and a script of another origin cannot send JSON without a CORS preflight,
   which is never answered (no CORS headers anywhere);
3. it changes something and carries an `Origin` that is not this server's own (403): the
   origin's host must be the request's `Host` (or an `--allow-host` name);
4. the server has a token and the request carries neither `Authorization: Bearer TOKEN` nor
   the page's session cookie (401; the page, its static files and `/api/login` are public);
5. its body is larger than `--max-body` (413): `Content-Length` is checked first, a chunked
   body is counted as it arrives, and never more than the cap is held. The body is read here,
   whole, so the handlers get it at once.

How long a client may take to send its request, and how many connections may be open, is
`tools.serve.connections`' part (below the ASGI layer: a request the client never finishes
never reaches this one).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import socket
from dataclasses import dataclass

#: the loopback names a client on the machine itself may use in `Host`
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: methods that change something: JSON only, and from this server's own origin
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: the cookie of a page that logged in with the token (`POST /api/login`)
COOKIE = "oopscope_session"


@dataclass(frozen=True)
class HttpLimits:
    """What `oopscope serve` bounds its HTTP face with (the `serve` options of the same
    names)."""

    #: names (`NAME` or `NAME:PORT`) a request's Host may carry besides the server's own
    allow_hosts: tuple[str, ...] = ()
    #: the largest request body, in bytes
    max_body: int = 1 << 20
    #: seconds a client has to send a whole request (line, headers, body)
    request_timeout: float = 10.0
    #: open connections; past it the oldest one still sending its request is closed
    max_connections: int = 200
    #: event streams and tails open at once (the page's `/api/events`, `oopscope tail`)
    max_streams: int = 32


class Hosts:
    """The `Host` values that name this server (module docstring, 1)."""

    def __init__(self, listen_host: str | None, port: int | None, unix: bool,
                 allow: tuple[str, ...] = ()):
        self.port, self.unix = port, unix
        self.allow_any_port: set[str] = set()
        self.allow_with_port: set[tuple[str, int]] = set()
        for entry in allow:
            name, entry_port = split_host(entry)
            if entry_port is None:
                self.allow_any_port.add(name)
            else:
                self.allow_with_port.add((name, entry_port))
        self.own: set[str] = set(LOOPBACK_NAMES)
        self.any_ip = False
        if listen_host is not None:
            self.own.add(_normal(listen_host))
            if not _is_loopback(listen_host):
                self.any_ip = True
                self.own.add(_normal(socket.gethostname()))

    def allowed(self, host: str | None) -> bool:
        if self.unix and not (self.allow_any_port or self.allow_with_port):
            return True
        if not host:
            return False
        try:
            name, port = split_host(host)
        except ValueError:
            return False
        if name in self.allow_any_port or (name, port) in self.allow_with_port:
            return True
        if self.unix:
            return name in LOOPBACK_NAMES
        if port is None:
            port = 80           # a Host without a port names the scheme's default
        return port == self.port and (name in self.own or self.any_ip and _is_ip(name))

    def is_allowed_name(self, name: str) -> bool:
        return name in self.allow_any_port or any(n == name for n, _ in self.allow_with_port)


def split_host(text: str) -> tuple[str, int | None]:
    """`name`, `name:port`, `[v6]:port` -> (normalised name, port or None); ValueError."""
    text = text.strip()
    if text.startswith("["):
        name, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(text)
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        name, port_text = text.split(":")
    else:
        name, port_text = text, None          # a bare name, or a bare IPv6 literal
    if port_text is None:
        return _normal(name), None
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(text)
    return _normal(name), int(port_text)


def _normal(name: str) -> str:
    return name.strip().lower().rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _is_loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return _normal(name) == "localhost"


def session_value(token: str) -> str:
    """The page's cookie for `token`: derived from it (a leaked cookie is not the token the
    CLI uses), and changed with it."""
    return hmac.new(token.encode(), b"oopscope page session", hashlib.sha256).hexdigest()


class Guard:
    """ASGI middleware in front of the API (module docstring)."""

    def __init__(self, app, hosts: Hosts, limits: HttpLimits, token: str | None):
        self.app, self.hosts, self.limits, self.token = app, hosts, limits, token
        self.session = None if token is None else session_value(token)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k, v)      # the first of a repeated header, as h11 keeps it
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await _reply(send, *refusal)
        size = headers.get(b"content-length")
        if size is not None and size.strip().isdigit() and int(size) > self.limits.max_body:
            return await _reply(send, 413, self._too_large())
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body += message.get("body", b"")
            if len(body) > self.limits.max_body:
                return await _reply(send, 413, self._too_large())
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        return await self.app(scope, replay, _with_headers(send))

    def _refusal(self, scope, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.hosts.allowed(host):
            return 421, (f"Host {_clip(host)!r} does not name this server (a page of another "
                         f"site? behind a proxy, serve --allow-host NAME)")
        method = scope.get("method", "GET")
        if method in STATE_CHANGING:
            kind = headers.get(b"content-type", b"").decode("latin-1")
            if kind.split(";")[0].strip().lower() != "application/json":
                return 415, (f"{method} requests need Content-Type: application/json "
                             f"(not {_clip(kind) or 'none'!r})")
            origin = headers.get(b"origin")
            if origin is not None and not self._own_origin(origin.decode("latin-1"), host):
                return 403, (f"Origin {_clip(origin.decode('latin-1'))!r} is not this "
                             f"server's: requests from other sites are refused")
        if self.token is not None and not _public(scope.get("path", "")) \
                and not self._authorised(headers):
            return 401, "a token is required (Authorization: Bearer TOKEN)"
        return None

    def _own_origin(self, origin: str, host: str) -> bool:
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme.lower() not in ("http", "https") or "/" in rest:
            return False          # `null` (a sandboxed frame, a file), or not an origin
        default = 443 if scheme.lower() == "https" else 80
        try:
            name, port = split_host(rest)
            host_name, host_port = split_host(host) if host else ("", None)
        except ValueError:
            return False
        if self.hosts.is_allowed_name(name):
            return True
        return (name, port or default) == (host_name, host_port or default) or \
            (self.hosts.unix and not host)

    def _authorised(self, headers: dict[bytes, bytes]) -> bool:
        assert self.token is not None and self.session is not None
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth[:7].lower() == "bearer " and \
                hmac.compare_digest(auth[7:].strip().encode(), self.token.encode()):
            return True
        for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and hmac.compare_digest(value.encode(), self.session.encode()):
                return True
        return False

    def _too_large(self) -> str:
        return (f"the request body is larger than {self.limits.max_body} bytes "
                f"(serve --max-body)")


def _public(path: str) -> bool:
    """The page and its static files hold no data, and a browser cannot add a header to the
    page's script and style requests; `/api/login` is how the page gets its cookie."""
    return path == "/" or path.startswith("/static/") or path == "/api/login"


#: headers every reply carries: no sniffing, no framing by another site, no referrer
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer")]


def _with_headers(send):
    async def wrapped(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              *SECURITY_HEADERS]}
        await send(message)

    return wrapped


async def _reply(send, status: int, error: str) -> None:
    body = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": body})


def _clip(text: str, n: int = 80) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text[:n + 1])
    return text if len(text) <= n else text[:n] + "..."
