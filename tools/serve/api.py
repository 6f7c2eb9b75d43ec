"""The appliance's HTTP face (Starlette): the control API, the tails, `/metrics`, the page.

| method and path | what |
|---|---|
| `GET /api/status` | links (rates, drops, punctuation), Spark, gaps |
| `GET /api/queries` | every query with its state and counters |
| `POST /api/queries` | submit: JSON `{text, file, name?, params?, sets?, outputs?, format?, schemas?}` (`schemas`: `[[path, text], ...]` of schema files) |
| `DELETE /api/queries/NAME` | cancel: open windows closed and written, outputs kept |
| `GET /api/queries/NAME/rows?limit=N` | the latest rows written |
| `GET /api/queries/NAME/tail` | JSON lines: `{"event": "rows", ...}` as windows close, `{"event": "missed", "rows": N}` when the reader fell behind, `{"event": "end"}` |
| `GET /api/events` | server-sent events for the page: `rows`, `status`, `queries` |
| `POST /api/shutdown` | as SIGTERM |
| `GET /metrics` | Prometheus text format |
| `GET /` | the live page (`static/`) |

With a token (`--token-file`), every request but the page and its static files must carry
it: `Authorization: Bearer TOKEN`, or `?token=TOKEN` (the page's event stream cannot set
headers); others get 401.
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

from tools.serve.appliance import Appliance
from tools.serve.config import ServeError
from tools.serve.tail import Subscriber

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
#: seconds between status events on the page's stream
STATUS_EVERY = 1.0


class TokenGuard:
    """ASGI middleware: 401 for a request without the token (when there is one)."""

    def __init__(self, app, token: str | None):
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send):
        if self.token is None or scope["type"] != "http" or _public(scope.get("path", "")):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        given = ""
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if auth.lower().startswith("bearer "):
            given = auth[7:].strip()
        else:
            from urllib.parse import parse_qs

            given = parse_qs(scope.get("query_string", b"").decode()).get("token", [""])[0]
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            response = JSONResponse({"error": "a token is required (Authorization: Bearer "
                                              "TOKEN)"}, status_code=401)
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _public(path: str) -> bool:
    """The page and its static files need no token: they hold no data, and a browser cannot
    add one to the page's script and style requests (the page adds it to its API calls)."""
    return path == "/" or path.startswith("/static/")


def _schemas(value) -> list:
    """The `schemas` of a submission: [[path, text], ...] (anything else is refused)."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(x, str) for x in f)
            for f in value):
        raise ServeError("`schemas` must be a list of [path, text] pairs of schema files")
    return value


def _error(exc: ServeError) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=exc.status)


def make_app(appliance: Appliance, metrics, request_stop: Callable[[], None],
             token: str | None = None):
    """The ASGI application over `appliance`; `request_stop()` begins a shutdown."""

    async def status(request: Request):
        return JSONResponse(await run_in_threadpool(appliance.status))

    async def queries(request: Request):
        return JSONResponse({"queries": await run_in_threadpool(appliance.queries)})

    async def submit(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body is not JSON"}, status_code=400)
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            return JSONResponse({"error": "give the query file's text as `text`"},
                                status_code=400)
        try:
            reply = await run_in_threadpool(
                lambda: appliance.submit(text=body["text"], file=str(body.get("file") or
                                                                     "query.gsql"),
                                         name=body.get("name"), params=body.get("params"),
                                         sets=body.get("sets"), outputs=body.get("outputs"),
                                         fmt=body.get("format"),
                                         schemas=_schemas(body.get("schemas"))))
        except ServeError as exc:
            return _error(exc)
        appliance.hub.publish("queries", None, {})
        return JSONResponse(reply, status_code=201)

    async def cancel(request: Request):
        try:
            reply = await run_in_threadpool(appliance.cancel, request.path_params["name"])
        except ServeError as exc:
            return _error(exc)
        return JSONResponse(reply)

    async def rows(request: Request):
        try:
            limit = int(request.query_params.get("limit", "100"))
            return JSONResponse(appliance.rows(request.path_params["name"], limit))
        except ValueError:
            return JSONResponse({"error": "limit must be an integer"}, status_code=400)
        except ServeError as exc:
            return _error(exc)

    async def tail(request: Request):
        try:
            stream = appliance.stream_of(request.path_params["name"])
        except ServeError as exc:
            return _error(exc)
        sub = appliance.hub.subscribe(Subscriber(asyncio.get_running_loop(), {stream}))

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
                appliance.hub.unsubscribe(sub)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def events(request: Request):
        sub = appliance.hub.subscribe(Subscriber(asyncio.get_running_loop(), None))

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
                        kind = e.pop("event")
                        if kind == "queries":
                            e = {"queries": await run_in_threadpool(appliance.queries)}
                        yield f"event: {kind}\ndata: {json.dumps(e, default=str)}\n\n"
            finally:
                appliance.hub.unsubscribe(sub)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def shutdown(request: Request):
        request_stop()
        return JSONResponse({"message": "stopping: every window is being closed and written"},
                            status_code=202)

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
        Route("/metrics", metrics_text),
        Mount("/static", StaticFiles(directory=STATIC, check_dir=False), name="static"),
    ]
    return TokenGuard(Starlette(routes=routes), token)
