"""The appliance's HTTP face (Starlette): the control API, the tails, `/metrics`, the page.

| method and path | what |
|---|---|
| `GET /api/status` | links (rates, drops, punctuation), Spark, gaps |
| `GET /api/queries` | every query with its state and counters |
| `POST /api/queries` | submit: JSON `{text, file, name?, params?, sets?, outputs?, format?, schemas?, link_map?}` (`schemas`: `[[path, text], ...]` of schema files; `link_map`: the query's link names -> the server's) |
| `DELETE /api/queries/NAME` | cancel: open windows closed and written, outputs kept |
| `GET /api/queries/NAME/rows?limit=N` | the latest rows written |
| `GET /api/queries/NAME/tail` | JSON lines: `{"event": "rows", ...}` as windows close, `{"event": "missed", "rows": N}` when the reader fell behind, `{"event": "end"}`; of a query that ended, its last rows (`?limit=N`, default 20) and the end |
| `GET /api/events` | server-sent events for the page: `rows`, `status`, `queries` |
| `POST /api/shutdown` | as SIGTERM |
| `POST /api/login` | the page: `{"token": T}` -> its session cookie (with `--token-file`) |
| `GET /metrics` | Prometheus text format |
| `GET /` | the live page (`static/`) |

Every request first passes `tools.serve.guard.Guard` (Host, Content-Type and Origin checks,
the token, the body cap); the bodies and query strings are checked by `tools.serve.bodies`.
With a token (`--token-file`), every request but the page, its static files and the login
must carry it: `Authorization: Bearer TOKEN`, or the cookie the page got from `/api/login`
(an EventSource cannot set headers; a token in the URL would stay in the browser's history).
Event streams and tails are at most `max_streams` at once: past it, 503.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tools.serve import bodies
from tools.serve.appliance import Appliance
from tools.serve.config import ServeError
from tools.serve.guard import COOKIE, Guard, Hosts, HttpLimits, session_value
from tools.serve.tail import Subscriber

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
#: seconds between status events on the page's stream
STATUS_EVERY = 1.0
#: rows a tail of a query that ended shows by default (`?limit=N`)
ENDED_ROWS = 20


class StreamSlots:
    """How many event streams and tails are open; a new one past `limit` is refused."""

    def __init__(self, limit: int):
        self.limit, self.open = limit, 0

    def take(self) -> None:
        if self.open >= self.limit:
            raise ServeError(f"too many event streams and tails open ({self.limit}, serve "
                             f"--max-streams): close one and try again", status=503)
        self.open += 1

    def give_back(self) -> None:
        self.open -= 1


class _Stream(StreamingResponse):
    """A streaming reply that gives its slot back and unsubscribes however it ends (a client
    gone before the first byte included: its generator then never runs)."""

    def __init__(self, content, media_type: str, done: Callable[[], None], **kw):
        super().__init__(content, media_type=media_type, **kw)
        self._done = done

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


def _ended_lines(ended: dict) -> str:
    """A tail's reply for a stream of a query that ended: its last rows, and the end."""
    stream = ended["name"]
    events = [{"event": "subscribed", "query": stream, "columns": ended["columns"],
               "state": ended["state"], "last_rows": len(ended["rows"])}]
    if ended["rows"]:
        events.append({"event": "rows", "query": stream, "columns": ended["columns"],
                       "rows": ended["rows"]})
    events.append({"event": "end", "query": stream, "why": ended["state"]})
    return "".join(json.dumps(e, default=str) + "\n" for e in events)


def _error(exc: ServeError) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=exc.status)


def make_app(appliance: Appliance, metrics, request_stop: Callable[[], None],
             token: str | None = None, hosts: Hosts | None = None,
             limits: HttpLimits | None = None):
    """The ASGI application over `appliance`; `request_stop()` begins a shutdown; `hosts`:
    the Host values naming this server (default: loopback, any port)."""
    limits = limits or HttpLimits()
    hosts = hosts or Hosts(None, None, unix=True)
    slots = StreamSlots(limits.max_streams)

    async def status(request: Request):
        return JSONResponse(await run_in_threadpool(appliance.status))

    async def queries(request: Request):
        return JSONResponse({"queries": await run_in_threadpool(appliance.queries)})

    async def submit(request: Request):
        try:
            args = bodies.submission(await request.body())
            reply = await run_in_threadpool(lambda: appliance.submit(**args))
        except ServeError as exc:
            return _error(exc)
        appliance.hub.publish("queries", None, {})
        return JSONResponse(reply, status_code=201)

    async def cancel(request: Request):
        try:
            bodies.nothing(await request.body())
            name = bodies.path_name(request.path_params["name"])
            reply = await run_in_threadpool(appliance.cancel, name)
        except ServeError as exc:
            return _error(exc)
        return JSONResponse(reply)

    async def rows(request: Request):
        try:
            limit = bodies.limit(request.query_params.get("limit"))
            name = bodies.path_name(request.path_params["name"])
            return JSONResponse(appliance.rows(name, limit))
        except ServeError as exc:
            return _error(exc)

    def open_stream(streams: set[str] | None) -> tuple[Subscriber, Callable[[], None]]:
        slots.take()
        sub = appliance.hub.subscribe(Subscriber(asyncio.get_running_loop(), streams))

        def done() -> None:
            if sub in appliance.hub:
                appliance.hub.unsubscribe(sub)
                slots.give_back()

        return sub, done

    async def tail(request: Request):
        try:
            name = bodies.path_name(request.path_params["name"])
            stream = appliance.stream_of(name)
            sub, done = open_stream({stream})
        except ServeError as exc:
            try:
                # a query that ended: its last rows, then the end
                ended = await run_in_threadpool(
                    appliance.ended_rows, request.path_params["name"],
                    bodies.limit(request.query_params.get("limit"), ENDED_ROWS))
            except ServeError as err:
                return _error(err)
            if ended is None:
                return _error(exc)
            return Response(_ended_lines(ended), media_type="application/x-ndjson")

        async def lines():
            try:
                yield json.dumps({"event": "subscribed", "query": stream,
                                  "columns": appliance.hub.columns.get(stream, [])}) + "\n"
                while True:
                    try:
                        await asyncio.wait_for(sub.wakeup.wait(), timeout=15)
                    except TimeoutError:
                        yield "\n"                  # keeps proxies and the client awake
                        continue
                    events, missed = sub.take()
                    if missed:
                        yield json.dumps({"event": "missed", "rows": missed}) + "\n"
                    for e in events:
                        yield json.dumps(e, default=str) + "\n"
                        if e["event"] == "end":
                            return
            finally:
                done()

        return _Stream(lines(), "application/x-ndjson", done)

    async def events(request: Request):
        try:
            sub, done = open_stream(None)
        except ServeError as exc:
            return _error(exc)

        async def stream():
            try:
                while True:
                    st = await run_in_threadpool(appliance.status)
                    yield f"event: status\ndata: {json.dumps(st, default=str)}\n\n"
                    try:
                        await asyncio.wait_for(sub.wakeup.wait(), timeout=STATUS_EVERY)
                    except TimeoutError:
                        continue
                    events, _ = sub.take()
                    for e in events:
                        # every subscriber reads the same event: read it, never change it
                        kind = e["event"]
                        data = {k: v for k, v in e.items() if k != "event"}
                        if kind == "queries":
                            data = {"queries": await run_in_threadpool(appliance.queries)}
                        yield f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n"
            finally:
                done()

        return _Stream(stream(), "text/event-stream", done,
                       headers={"Cache-Control": "no-cache"})

    async def shutdown(request: Request):
        try:
            bodies.nothing(await request.body())
        except ServeError as exc:
            return _error(exc)
        request_stop()
        return JSONResponse({"message": "stopping: every window is being closed and written"},
                            status_code=202)

    async def login(request: Request):
        """The page's token, once, for an HttpOnly cookie its requests then carry."""
        try:
            given = bodies.login(await request.body())
        except ServeError as exc:
            return _error(exc)
        if token is None:
            return JSONResponse({"message": "this server needs no token"})
        if not hmac.compare_digest(given.encode(), token.encode()):
            return JSONResponse({"error": "wrong token"}, status_code=401)
        reply = JSONResponse({"message": "logged in"})
        secure = request.headers.get("origin", "").lower().startswith("https://")
        reply.set_cookie(COOKIE, session_value(token), httponly=True, samesite="strict",
                         path="/", secure=secure)
        return reply

    async def metrics_text(request: Request):
        body = await run_in_threadpool(metrics.text)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def page(request: Request):
        return FileResponse(STATIC / "index.html")

    routes = [
        Route("/", page),
        Route("/api/status", status),
        Route("/api/queries", queries, methods=["GET"]),
        Route("/api/queries", submit, methods=["POST"]),
        Route("/api/queries/{name}", cancel, methods=["DELETE"]),
        Route("/api/queries/{name}/rows", rows),
        Route("/api/queries/{name}/tail", tail),
        Route("/api/events", events),
        Route("/api/shutdown", shutdown, methods=["POST"]),
        Route("/api/login", login, methods=["POST"]),
        Route("/metrics", metrics_text),
        Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static"),
    ]
    return Guard(Starlette(routes=routes), hosts, limits, token)
