"""The HTTP server of ``dpgate serve``: uvicorn's h11 protocol with a header read timeout and a
connection cap, and the uvicorn configuration built from :class:`~dpgate.settings.Settings`.

uvicorn bounds the idle time between requests (``timeout_keep_alive``) but not the time a client
takes to send a request's headers: a connection that trickles a request line, or sends nothing
after connecting, stays open for ever (one client held 1,500 of them for over a minute). Its
``limit_concurrency`` answers 503 in plain text, outside the API's error shape. So the protocol
here is uvicorn's :class:`~uvicorn.protocols.http.h11_impl.H11Protocol` with two additions:

* **header timeout** — a timer from the connection's start (or from the first byte of a later
  request on a kept-alive connection) until the request's head is complete; when it fires, a
  connection that sent part of a head gets 408 ``request_timeout`` in the documented error shape,
  one that sent nothing is closed silently, and either way the connection ends;
* **connection cap** — a request that arrives while more than ``max_connections`` connections are
  open, or more than ``max_connections`` requests are in flight, is answered 503 ``server_busy``
  (documented shape, ``Retry-After``, ``Connection: close``), as uvicorn's ``limit_concurrency``
  would but in the API's shape.

The body's read time and size are bounded inside the application
(:class:`dpgate.api.errors.BodySizeLimitMiddleware`), once the headers are in.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from dpgate.api.errors import error_response
from dpgate.errors import RequestTimeout, ServerBusy

__all__ = ["GuardedH11Protocol", "guarded_protocol", "uvicorn_config"]


def raw_error(status: int, reason: str, code: str, message: str, details: dict[str, Any]) -> bytes:
    """A complete HTTP/1.1 error response in the documented shape, closing the connection (for
    answers written by the protocol itself, before any request reached the application)."""
    body = json.dumps({"error": {"code": code, "message": message, "details": details}},
                      separators=(",", ":")).encode("utf-8")
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\nx-content-type-options: nosniff\r\n\r\n")
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header read timeout and a connection cap (module docstring).

    Configure a subclass with :func:`guarded_protocol`; uvicorn builds one instance per connection.

    Attributes:
        header_timeout_s: seconds to receive a request's line and headers.
        max_connections: open connections (and requests in flight) above which requests get 503;
            None: no cap.
        retry_after_s: the ``Retry-After`` of a 503 ``server_busy``.
    """

    header_timeout_s: float = 10.0
    max_connections: int | None = None
    retry_after_s: int = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        if self.max_connections is not None:
            self.app = self._capped(self.app)

    # -- connection cap ----------------------------------------------------------------

    def _capped(self, app: Any) -> Any:
        cap = int(self.max_connections)  # type: ignore[arg-type]

        async def capped(scope: Any, receive: Any, send: Any) -> None:
            # this connection and this request's task are already counted
            if len(self.connections) > cap or len(self.tasks) > cap:
                self.logger.warning("dpgate: %d connections, %d requests in flight: over the cap of %d",
                                    len(self.connections), len(self.tasks), cap)
                response = error_response(
                    ServerBusy.http_status, ServerBusy.code,
                    f"the server is at its cap of {cap} open connections or requests in flight; try again",
                    {"max_connections": cap},
                    headers={"Retry-After": str(self.retry_after_s), "Connection": "close"})
                await response(scope, receive, send)
                return
            await app(scope, receive, send)

        return capped

    # -- header timeout ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the header timer with the connection."""
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        """Feed h11; keep the header timer while a request head is incomplete, stop it once it is in."""
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # (part of) a request head, or nothing yet
            if self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()  # a later request on a kept-alive connection
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the header timer."""
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        pending, _ = self.conn.trailing_data
        if pending:  # part of a request head arrived: say why the connection ends
            self.transport.write(raw_error(
                RequestTimeout.http_status, "Request Timeout", RequestTimeout.code,
                f"the request's headers did not arrive within {self.header_timeout_s:g} s; the connection is closed",
                {"header_timeout_s": self.header_timeout_s}))
        self.transport.close()


def guarded_protocol(*, header_timeout_s: float, max_connections: int | None,
                     retry_after_s: int = 1) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` subclass with these limits (uvicorn's ``http=`` argument)."""
    return type("DpgateH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": float(header_timeout_s), "max_connections": max_connections,
        "retry_after_s": int(retry_after_s)})


def uvicorn_config(app: Any, settings: Any, *, log_level: str = "info") -> uvicorn.Config:
    """The uvicorn configuration of ``dpgate serve``.

    The h11 protocol with ``settings.http_header_timeout_s`` and ``settings.http_max_connections``
    (:func:`guarded_protocol`), ``settings.http_keep_alive_s`` as uvicorn's ``timeout_keep_alive``,
    and WebSocket upgrades off (the API has none).
    """
    protocol = guarded_protocol(header_timeout_s=settings.http_header_timeout_s,
                                max_connections=settings.http_max_connections)
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level, http=protocol,
                          ws="none", timeout_keep_alive=settings.http_keep_alive_s)  # type: ignore[arg-type]
