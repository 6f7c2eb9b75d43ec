"""The JSON bodies and query strings the control API accepts, checked in one place.

Every handler of `tools.serve.api` reads its request through these functions before anything
of the appliance is called: a body that is not JSON, a field of the wrong type, an unknown
field, a `limit` out of range answer 400 with one line naming the field and what it must be
(never a 500 from deep inside the planner). What a value *means* (a format's name, a query
name's pattern, an output under the root) is the appliance's to check.
"""

from __future__ import annotations

import json

from tools.serve.config import ServeError

#: the fields of a submission (`POST /api/queries`) and what each must be
SUBMISSION_FIELDS = {
    "text": "a string (the query file's text)",
    "file": "a string (the query file's name, for messages) or null",
    "name": "a string or null",
    "params": "an object of PARAM name -> string, number or boolean",
    "sets": "an object of DEFINE key -> string, number or boolean",
    "outputs": "an object of query name -> directory string",
    "format": "a string (csv, jsonl or parquet) or null",
    "schemas": "a list of [path, text] string pairs",
    "link_map": "an object of the query's link name -> the server's link name (names of 1 "
                "to 64 characters)",
}
#: the longest link name a link map may hold (a link name's limit, queries.tokens)
MAX_LINK_NAME = 64
#: rows a `GET /api/queries/NAME/rows` may ask for
MAX_ROWS = 10_000
#: the longest query or stream name a path may carry (`NAME.QUERY`: 64 + 1 + a query name)
MAX_PATH_NAME = 200


def parse(raw: bytes):
    """The JSON value of a request body (400 when it is not JSON)."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise ServeError("the body nests too deeply to be a request") from None
    except ValueError:      # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ServeError("the body is not JSON (send an object, Content-Type: "
                         "application/json)") from None


def submission(raw: bytes) -> dict:
    """The keyword arguments of `Appliance.submit` from a submission's body."""
    body = parse(raw)
    if not isinstance(body, dict):
        raise ServeError(f"the body must be a JSON object with {_fields()}, not "
                         f"{_kind(body)}")
    unknown = sorted(k for k in body if k not in SUBMISSION_FIELDS)
    if unknown:
        raise ServeError(f"unknown field {_clip(unknown[0])!r}: a submission has {_fields()}")
    if not isinstance(body.get("text"), str):
        raise _wrong("text", body.get("text"))
    for key in ("file", "name", "format"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _wrong(key, body[key])
    for key in ("params", "sets"):
        _mapping(key, body.get(key), _scalar)
    _mapping("outputs", body.get("outputs"), lambda v: isinstance(v, str))
    _mapping("link_map", body.get("link_map"), _link_name)
    if not all(_link_name(k) for k in body.get("link_map") or {}):
        raise _wrong("link_map", body["link_map"])
    schemas = body.get("schemas")
    if schemas is not None and not (isinstance(schemas, list) and all(
            isinstance(f, list) and len(f) == 2 and all(isinstance(x, str) for x in f)
            for f in schemas)):
        raise _wrong("schemas", schemas)
    for key, value in (("file", body.get("file")), ("name", body.get("name")),
                       *(("outputs", v) for v in (body.get("outputs") or {}).values()),
                       *(("schemas", p) for p, _ in schemas or [])):
        if isinstance(value, str) and "\0" in value:
            raise ServeError(f"`{key}`: a name or path cannot hold a NUL character")
    return {"text": body["text"], "file": body.get("file") or "query.gsql",
            "name": body.get("name"), "params": body.get("params"), "sets": body.get("sets"),
            "outputs": body.get("outputs"), "fmt": body.get("format"),
            "schemas": schemas or [], "link_map": body.get("link_map") or {}}


def login(raw: bytes) -> str:
    """The token of a `POST /api/login` body: `{"token": "..."}`."""
    body = parse(raw)
    if not isinstance(body, dict) or set(body) != {"token"} or \
            not isinstance(body["token"], str):
        raise ServeError('the body must be {"token": "..."} (a string)')
    return body["token"]


def nothing(raw: bytes) -> None:
    """A request that takes no body (cancel, shutdown): none, or an empty object."""
    try:
        empty = not raw.strip() or parse(raw) == {}
    except ServeError:
        empty = False
    if not empty:
        raise ServeError("this request takes no body (send none, or {})")


def limit(text: str | None, default: int = 100) -> int:
    """`?limit=N` of the rows request: an integer from 1 to MAX_ROWS."""
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_ROWS:
        raise ServeError(f"limit must be an integer from 1 to {MAX_ROWS}, not "
                         f"{_clip(text)!r}")
    return n


def path_name(name: str) -> str:
    """A query or stream name from a path (404 when it cannot be one: too long)."""
    if len(name) > MAX_PATH_NAME:
        raise ServeError(f"no query by that name (a name has at most {MAX_PATH_NAME} "
                         f"characters)", status=404)
    return name


def _mapping(key: str, value, ok) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise _wrong(key, value)
    odd = [v for v in value.values() if not ok(v)]
    if odd:
        raise ServeError(f"`{key}` must be {SUBMISSION_FIELDS[key]}, not an object holding "
                         f"{_shallow(odd[0])}")


def _link_name(value) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_LINK_NAME


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float))       # a boolean is an int


def _wrong(key: str, value) -> ServeError:
    return ServeError(f"`{key}` must be {SUBMISSION_FIELDS[key]}, not {_kind(value)}")


def _kind(value) -> str:
    """What a JSON value is, in a message (never the value itself: it may be large), with
    the first odd member of a list or object (one level: a value may nest deeply)."""
    if isinstance(value, list):
        odd = [v for v in value if not isinstance(v, str)]
        return f"a list holding {_shallow(odd[0])}" if odd else "a list of strings"
    return _shallow(value)


def _shallow(value) -> str:
    if value is None:
        return "null"
    for t, name in ((bool, "a boolean"), (int, "a number"), (float, "a number"),
                    (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, t):
            return name
    return type(value).__name__


def _fields() -> str:
    return ", ".join(f"`{k}`" for k in SUBMISSION_FIELDS)


def _clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."
