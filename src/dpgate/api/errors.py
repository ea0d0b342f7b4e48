"""One error shape for every failure of the HTTP API, and the request-size limit.

Every 4xx/5xx answer is ``{"error": {"code", "message", "details"}}``:

* a :class:`~dpgate.errors.DpgateError` → its own ``code`` and ``http_status``;
* FastAPI's request validation errors (wrong type, missing field, malformed
  JSON) → 400 ``invalid_request``; ``details.errors`` lists each problem's
  location, type and message but never echoes the submitted value;
* unknown routes → 404 ``not_found``; a method the route does not support →
  405 ``method_not_allowed``; other HTTP errors → their status with a generic code;
* a body larger than ``Settings.max_body_bytes`` → 413 ``payload_too_large``
  (:class:`BodySizeLimitMiddleware`, checked from ``Content-Length`` and while
  the body streams in); a body not received within ``Settings.http_body_timeout_s``
  → 408 ``request_timeout``;
* a ledger that cannot be used right now (:class:`~dpgate.errors.LedgerUnavailable`, or
  a SQLite lock or open failure escaping a store) → 503 ``ledger_unavailable`` with
  ``Retry-After``; every 503 carries ``Retry-After``;
* anything unexpected → 500 ``internal`` with no stack trace and no data; the
  exception is logged server-side.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from typing import Any

import asyncio

import anyio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpgate.errors import DpgateError, InvalidRequest, LedgerUnavailable, PayloadTooLarge, RequestTimeout
from dpgate.jsonsafe import json_safe
from dpgate.ledger.connections import is_unavailable

log = logging.getLogger("dpgate.api")

#: HTTP status → error code for errors raised by the framework itself (routing, methods).
_HTTP_STATUS_CODES = {
    400: "invalid_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


class SafeJSONResponse(JSONResponse):
    """A JSON response that writes non-finite floats as strings instead of failing."""

    def render(self, content: Any) -> bytes:
        """Serialise ``content`` (non-finite floats as strings)."""
        return super().render(json_safe(content))


def error_response(
    status: int, code: str, message: str, details: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> SafeJSONResponse:
    """The documented error shape as a response (with ``X-Content-Type-Options: nosniff``, also
    on the 500 answers that Starlette sends outside the middleware)."""
    body = {"error": {"code": code, "message": message, "details": details or {}}}
    return SafeJSONResponse(body, status_code=status, headers={"X-Content-Type-Options": "nosniff", **(headers or {})})


def retry_after_s(request: Request) -> int:
    """Seconds a 503 answer asks the client to wait (``Retry-After``): the ledger wait, at least 1."""
    settings = getattr(request.app.state, "settings", None)
    return max(1, math.ceil(getattr(settings, "ledger_wait_s", 1.0)))


def _dpgate_error(request: Request, exc: Exception) -> SafeJSONResponse:
    assert isinstance(exc, DpgateError)
    if exc.http_status >= 500:
        log.error("%s %s failed: %s: %s", request.method, request.url.path, exc.code, exc.message)
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    if exc.http_status == 503:
        headers = {"Retry-After": str(retry_after_s(request))}
    return error_response(exc.http_status, exc.code, exc.message, exc.details, headers)


def _sqlite_error(request: Request, exc: Exception) -> SafeJSONResponse:
    """A SQLite error that escaped a store next to the ledger (releases, searches read it raw):
    503 ``ledger_unavailable`` when the file is locked or cannot be opened, else 500 ``internal``."""
    if is_unavailable(exc):
        return _dpgate_error(request, LedgerUnavailable(f"the ledger's database is unavailable: {exc}"))
    return _unexpected_error(request, exc)


def _location(loc: Any) -> list[Any]:
    return [part if isinstance(part, (str, int)) else str(part) for part in loc]


def _validation_error(request: Request, exc: Exception) -> SafeJSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    malformed = False
    for err in exc.errors():
        kind = str(err.get("type", "invalid"))
        if kind == "json_invalid":
            malformed = True
            problems.append({"loc": ["body"], "type": kind, "message": "request body is not valid JSON"})
            continue
        # never echo err["input"] or err["ctx"]: they carry the submitted values
        problems.append({"loc": _location(err.get("loc", ())), "type": kind, "message": str(err.get("msg", ""))})
    body_problem = next((p for p in problems if p["loc"] == ["body"]), None)
    content_type = request.headers.get("content-type", "")
    is_json = content_type.split(";")[0].strip().lower().endswith(("/json", "+json"))
    if malformed:
        message = "the request body is not valid JSON"
    elif body_problem is not None and not is_json:
        sent = f"Content-Type {content_type.split(';')[0].strip()!r}" if content_type else "no Content-Type"
        message = (f"the request body must be a JSON object sent with 'Content-Type: application/json' "
                   f"(this request sent {sent}; with curl add -H 'Content-Type: application/json')")
    elif body_problem is not None and body_problem["type"] == "missing":
        message = "this endpoint needs a JSON object as the request body"
    elif body_problem is not None and body_problem["type"] in ("model_attributes_type", "dict_type", "model_type"):
        message = "the request body must be a JSON object ({...})"
    elif problems:
        where = ".".join(str(p) for p in problems[0]["loc"])
        message = f"invalid request: {where}: {problems[0]['message']}"
        if len(problems) > 1:
            message += f" (and {len(problems) - 1} more)"
    else:
        message = "invalid request"
    return error_response(400, "invalid_request", message, {"errors": problems})


def _unparsable_body(cause: BaseException) -> str:
    """The message of a JSON body FastAPI could not parse but does not call invalid JSON
    (it answers "There was an error parsing the body"): bytes that are not UTF-8 text, or
    arrays/objects nested deeper than the JSON parser's recursion limit."""
    if isinstance(cause, UnicodeDecodeError):
        return "the request body is not valid JSON: it is not UTF-8 text"
    return "the request body is not valid JSON: it is nested too deeply"


def _http_error(request: Request, exc: Exception) -> SafeJSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    status = exc.status_code
    code = _HTTP_STATUS_CODES.get(status, "internal" if status >= 500 else "http_error")
    if status == 404:
        message = f"no such endpoint: {request.method} {request.url.path}"
    elif status == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif status == 400 and isinstance(exc.__cause__, (UnicodeDecodeError, RecursionError)):
        message = _unparsable_body(exc.__cause__)
    elif isinstance(exc.detail, str):
        message = exc.detail
    else:
        message = code.replace("_", " ")
    headers = dict(exc.headers) if exc.headers else None
    return error_response(status, code, message, {}, headers)


def _unexpected_error(request: Request, exc: Exception) -> SafeJSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; the server log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that give every failure the documented error shape."""
    app.add_exception_handler(DpgateError, _dpgate_error)
    app.add_exception_handler(sqlite3.Error, _sqlite_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)


class UnexpectedErrors:
    """Pure ASGI middleware answering an exception that no handler took with 500 ``internal``.

    Starlette's outermost ``ServerErrorMiddleware`` sends the handler's 500 and then re-raises the
    exception (for the server to log), and uvicorn then drops the connection: a keep-alive client
    could lose the 500 itself (a connection reset) or its next request on that connection. Caught
    here, inside the other middlewares, the 500 is an ordinary answer (logged once, with its trace;
    never a trace or data in the body) and the connection stays usable. An exception after the
    response has started is re-raised: nothing else can be sent on it.

    Args:
        app: the wrapped ASGI application.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            if started:
                raise
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"), exc_info=exc)
            await error_response(500, "internal", "internal error; the server log has the details")(
                scope, receive, send)


#: The largest announced body an unauthenticated request may have read (and discarded) before
#: its 401 or 413, and how long that may take (:class:`~dpgate.api.middleware.ApiKeyGate`,
#: :class:`BodySizeLimitMiddleware`): answering while the client still sends makes its TCP stack
#: reset the connection, and the client may lose the answer.
DRAIN_LIMIT_BYTES = 64 * 1024
DRAIN_TIMEOUT_S = 0.5


async def drain_small_body(headers: Headers, receive: Receive) -> bool:
    """Read and discard a body announced by ``Content-Length`` ≤ :data:`DRAIN_LIMIT_BYTES` within
    :data:`DRAIN_TIMEOUT_S`; True when it was read to its end (the connection can stay open),
    False when it is not drained (chunked, too large, too slow, or the client left)."""
    if "transfer-encoding" in headers:
        return False
    try:
        announced = int(headers.get("content-length", "0"))
    except ValueError:
        return False
    if announced > DRAIN_LIMIT_BYTES:
        return False

    async def drain() -> bool:
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            total += len(message.get("body", b""))
            if total > DRAIN_LIMIT_BYTES:
                return False
            if not message.get("more_body", False):
                return True

    try:
        return await asyncio.wait_for(drain(), DRAIN_TIMEOUT_S)
    except asyncio.TimeoutError:
        return False


class _DuplicateKey(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen[key] = value
    return seen


def duplicate_json_key(body: bytes, content_type: str) -> str | None:
    """The first key a JSON object of ``body`` repeats, else None (also for a body that is not
    JSON: the route's parser answers that).

    Python's parser, like FastAPI's, keeps the *last* of two equal keys; another reader (a proxy,
    an audit log) may keep the first, so ``{"epsilon": 3.9, "epsilon": 1000}`` would mean two things.
    The gateway refuses such a body (400 ``invalid_request``) before any route reads it.
    """
    if not body or not content_type.split(";")[0].strip().lower().endswith(("/json", "+json")):
        return None
    try:
        json.loads(body, object_pairs_hook=_pairs)
    except _DuplicateKey as e:
        return str(e.args[0])
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    return None


class BodySizeLimitMiddleware:
    """Pure ASGI middleware bounding a request body's size and the time to receive it.

    A request whose ``Content-Length`` exceeds ``max_body_bytes`` is refused (413
    ``payload_too_large``) before any byte of the body is read. Otherwise the body is read
    (counting bytes as the chunks arrive, so a chunked or lying client is stopped as soon as it
    passes the limit) and then replayed to the application. A body that has not fully arrived
    ``body_timeout_s`` seconds after the request reached the application is refused (408
    ``request_timeout``). Both answers close the connection.

    Args:
        app: the wrapped ASGI application.
        max_body_bytes: largest accepted body, in bytes (> 0).
        body_timeout_s: seconds to receive the whole body (> 0), or None for no bound.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_body_bytes = int(max_body_bytes)
        self.body_timeout_s = body_timeout_s

    async def _reject(self, scope: Scope, receive: Receive, send: Send, message: str, status: int = 413) -> None:
        code = {413: PayloadTooLarge.code, 408: RequestTimeout.code}.get(status, InvalidRequest.code)
        details = {413: {"max_body_bytes": self.max_body_bytes},
                   408: {"body_timeout_s": self.body_timeout_s}}.get(status, {})
        response = error_response(status, code, message, details, headers={"Connection": "close"})
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(scope, receive, send, "invalid Content-Length header", 400)
                    return
                if declared < 0:
                    await self._reject(scope, receive, send, "invalid Content-Length header", 400)
                    return
        if declared is not None and declared > limit:
            await drain_small_body(Headers(scope=scope), receive)  # so that the client reads the 413
            await self._reject(
                scope, receive, send, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
            return

        chunks: list[bytes] = []
        size = 0
        more = True
        with anyio.move_on_after(self.body_timeout_s) as deadline:
            while more and size <= limit:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # client went away before sending its body
                if message["type"] != "http.request":
                    continue
                chunk = message.get("body", b"")
                size += len(chunk)
                chunks.append(chunk)
                more = bool(message.get("more_body", False))
        if size > limit:  # stopped reading as soon as it passed the limit
            await self._reject(scope, receive, send, f"request body exceeds the limit of {limit} bytes")
            return
        if deadline.cancelled_caught:
            await self._reject(scope, receive, send, f"the request body did not arrive within "
                               f"{self.body_timeout_s:g} s (received {size} bytes); the connection is closed", 408)
            return

        body = b"".join(chunks)
        repeated = duplicate_json_key(body, Headers(scope=scope).get("content-type", ""))
        if repeated is not None:
            await self._reject(scope, receive, send, f"the JSON body has the key {repeated[:80]!r} twice in one "
                               "object: send each key once (JSON parsers disagree on which one counts)", 400)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


__all__ = [
    "BodySizeLimitMiddleware",
    "retry_after_s",
    "SafeJSONResponse",
    "UnexpectedErrors",
    "error_response",
    "install_error_handlers",
    "json_safe",
]
