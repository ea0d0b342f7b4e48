"""Pure ASGI middleware of the HTTP API that acts before a route runs.

* :class:`SecurityHeaders` — ``X-Content-Type-Options: nosniff`` on every response (error
  responses, the UI and the docs too), so that no browser sniffs a JSON answer into HTML.
* :class:`ApiKeyGate` — refuses a request to ``/v1/…`` without a valid API key (401
  ``unauthenticated``, the documented shape) from its headers alone: the body is never read
  (``receive`` is never called), so an unauthenticated client cannot make the server buffer a
  body. The routes authenticate again, by the same function (:func:`dpgate.api.authn.authenticate`),
  and check the key's role.

The request body's size and read time are bounded by
:class:`dpgate.api.errors.BodySizeLimitMiddleware`, inside the gate; the header read time and the
connection cap by the server's protocol (:mod:`dpgate.api.server`).
"""

from __future__ import annotations


import logging

from starlette.datastructures import Headers, MutableHeaders
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dpgate.api.authn import authenticate
from dpgate.api.errors import error_response
from dpgate.api.errors import drain_small_body as _drain_small_body
from dpgate.errors import DpgateError, Unauthenticated

log = logging.getLogger("dpgate.api")

__all__ = ["SecurityHeaders", "ApiKeyGate", "NOSNIFF"]

#: The header every response carries.
NOSNIFF = ("X-Content-Type-Options", "nosniff")

#: Path prefix of the endpoints that need an API key (everything under it but nothing else:
#: ``/healthz``, ``/readyz``, ``/docs``, ``/openapi.json``, ``/`` and the UI's own session login).
API_PREFIX = "/v1"


class SecurityHeaders:
    """Add ``X-Content-Type-Options: nosniff`` to every HTTP response that lacks it.

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

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if NOSNIFF[0].lower() not in headers:
                    headers.append(*NOSNIFF)
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _has_body(headers: Headers) -> bool:
    """Whether the request announces a body (a positive Content-Length, or any Transfer-Encoding)."""
    if "transfer-encoding" in headers:
        return True
    try:
        return int(headers.get("content-length", "0")) > 0
    except ValueError:
        return True


def _has_route(app, scope: Scope) -> bool:
    """Whether a route of ``app`` takes this method and path (unknown paths and methods keep their
    404 and 405 answers, with or without a key)."""
    return any(route.matches(scope)[0] is Match.FULL for route in app.router.routes)


class ApiKeyGate:
    """Answer 401 ``unauthenticated`` to a ``/v1`` request without a valid API key, before its body.

    Only requests that a route takes (method and path) are checked: an unknown path or method keeps
    its 404 or 405 (from the headers too: the router never reads a body). The check is the routes' own (:func:`dpgate.api.authn.authenticate`: bearer token, then
    ``X-API-Key``; unknown, malformed and revoked keys refused), read from the headers only.
    A small announced body (``Content-Length`` ≤ :data:`~dpgate.api.errors.DRAIN_LIMIT_BYTES`) is read and discarded
    within :data:`~dpgate.api.errors.DRAIN_TIMEOUT_S` before the answer, so that the client reads its 401 (closing a
    socket with unread data makes TCP reset it, and a client still sending then sees "connection
    reset" instead of the answer); nothing of it is kept. A larger, chunked or slower body is not
    read: the answer carries ``Connection: close`` and the connection ends.

    Args:
        app: the wrapped ASGI application; its ``state.keys`` is the key store (read per request,
            so a test or a reload may replace it).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI entry point."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        app = scope.get("app")
        if app is None or not _has_route(app, scope):
            await self.app(scope, receive, send)  # 404 / 405 as before, whoever asks
            return
        headers = Headers(scope=scope)
        keys = app.state.keys
        try:
            if keys is None:
                raise Unauthenticated("no API keys are configured")
            authenticate(keys, headers.get("authorization"), headers.get("x-api-key"))
        except DpgateError as exc:  # Unauthenticated; or a keys file that became unreadable (invalid_policy)
            extra = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthenticated) else {}
            if exc.http_status >= 500:
                log.error("%s %s failed: %s: %s", scope.get("method"), path, exc.code, exc.message)
            if _has_body(headers) and not await _drain_small_body(headers, receive):
                extra["Connection"] = "close"
            response = error_response(exc.http_status, exc.code, exc.message, exc.details, headers=extra)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)
