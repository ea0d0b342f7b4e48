"""The FastAPI application factory.

``create_app(settings)`` returns a new application; nothing happens at import
time and there is no module-level application object. The application's
lifespan opens the :class:`~dpgate.service.Gateway` (policies, DuckDB data,
ledger, release store) with ``Gateway.open(settings)`` unless one is injected,
and closes it on shutdown (an injected gateway belongs to the caller and is
left open).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

import anyio.to_thread
from fastapi import FastAPI

from dpgate import __version__
from dpgate.api.errors import BodySizeLimitMiddleware, SafeJSONResponse, UnexpectedErrors, install_error_handlers
from dpgate.api.middleware import ApiKeyGate, SecurityHeaders
from dpgate.api.readiness import Readiness
from dpgate.api.routes import health, v1
from dpgate.auth import KeyStore
from dpgate.service import Gateway
from dpgate.settings import Settings
from dpgate.ui import install_ui

_DESCRIPTION = """\
A differentially private SQL gateway. Analysts send aggregate SQL; the gateway
bounds each privacy unit's contribution, charges the population's budget ledger
*before* drawing noise (OpenDP), and stores every release so that reading it
again is free.

Authenticate with `Authorization: Bearer <API key>` (or `X-API-Key`). Every
failure has the shape `{"error": {"code", "message", "details"}}`.
"""


def _strip_422(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop FastAPI's default 422 answers from the OpenAPI schema: validation errors are 400 here."""
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    return schema


def create_app(
    settings: Settings,
    *,
    gateway: Gateway | None = None,
    keys: KeyStore | None = None,
    progress: Callable[[str], None] | None = None,
) -> FastAPI:
    """Build the HTTP application.

    Args:
        settings: the process settings (policies folder, home, ledger URL,
            ``max_body_bytes``, keys file, …).
        gateway: an already open gateway to serve (the caller keeps ownership and
            closes it); when None the lifespan opens ``Gateway.open(settings)``
            on startup and closes it on shutdown.
        keys: the API key store; default ``KeyStore(settings.resolved_keys_file())``
            (re-read whenever the file changes, so ``dpgate keys`` takes effect live).
        progress: callback for the gateway's start-up progress lines.

    Returns:
        A FastAPI application with every endpoint of the design's HTTP table,
        the web pages under ``/ui`` (:mod:`dpgate.ui`), OpenAPI docs at ``/docs``
        (Swagger UI from local files) and ``/openapi.json``, the one error shape,
        ``X-Content-Type-Options: nosniff`` on every response, ``/v1`` requests
        without a valid key refused from their headers (before the body is read),
        a request body limit of ``settings.max_body_bytes`` received within
        ``settings.http_body_timeout_s``, and ``GET /readyz``. The header read
        timeout, keep-alive and connection cap belong to the server
        (:func:`dpgate.api.server.uvicorn_config`).

    Raises:
        Nothing at build time; errors of ``Gateway.open`` (e.g. PolicyError)
        surface when the application starts.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = gateway is None
        if owned:
            opened = await anyio.to_thread.run_sync(lambda: Gateway.open(settings, progress=progress))
        else:
            opened = gateway
        app.state.gateway = opened
        try:
            yield
        finally:
            if owned:  # an injected gateway stays served: it belongs to the caller
                app.state.gateway = None
                await anyio.to_thread.run_sync(opened.close)

    app = FastAPI(
        title="dpgate",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # /docs is served by dpgate.ui with local assets (no CDN)
        redoc_url=None,
        openapi_url="/openapi.json",
        default_response_class=SafeJSONResponse,
        # /v1/queries/ is not /v1/queries: a 404 in the documented error shape, not a bare 307
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.keys = keys if keys is not None else KeyStore(settings.resolved_keys_file())
    app.state.gateway = gateway  # None until the lifespan opens one
    install_error_handlers(app)
    app.include_router(health)
    app.include_router(v1)
    install_ui(app)  # /ui pages, /docs (local Swagger UI), / (UI or JSON index)
    app.state.readiness = Readiness(settings.ledger_wait_s)
    # the last added is the outermost: nosniff on everything, then the key check from the headers
    # alone (401 before any body byte is read), then the body's size and read-time bounds
    # innermost: an exception no handler took is answered here (500 internal), so that
    # Starlette's re-raise after the 500 never drops the connection (errors.UnexpectedErrors)
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(BodySizeLimitMiddleware, max_body_bytes=settings.max_body_bytes,
                       body_timeout_s=settings.http_body_timeout_s)
    app.add_middleware(ApiKeyGate)
    app.add_middleware(SecurityHeaders)

    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _strip_422(original_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
