"""Server-rendered web pages for admins, dashboards and analysts (design: ``GET /ui/…``).

:func:`install_ui` adds to a FastAPI application (the API's, built by
:func:`dpgate.api.create_app`):

* ``/ui/…`` — the pages (:mod:`dpgate.ui.pages`): sign-in with an API key, the
  admin's spend, burn-down, ledger browser, verify and cap changes, dashboards
  of stored releases with 95 % error bars, and the analyst console (explain,
  then run);
* ``/ui/static/…`` — the one stylesheet and icon (shipped in the package);
* ``/docs`` — Swagger UI from local files, and ``/`` — the UI for a browser, a
  JSON index for an API client (:mod:`dpgate.ui.docs`).

Everything the pages need ships inside the package (templates, CSS, charts
drawn as inline SVG on the server): they work offline and with JavaScript
disabled. The module imports the service layer and below, never ``dpgate.api``.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from dpgate.ui.data import BurndownCache
from dpgate.ui.sessions import SessionStore

__all__ = ["install_ui"]


def install_ui(app: FastAPI, *, sessions: SessionStore | None = None) -> None:
    """Mount the web pages, their static files, ``/docs`` and ``/`` on ``app``.

    Args:
        app: the application; it must have ``app.state.keys`` (a
            :class:`~dpgate.auth.KeyStore`) and, once started,
            ``app.state.gateway`` (an open :class:`~dpgate.service.Gateway`).
        sessions: the session store (default: a new in-memory
            :class:`~dpgate.ui.sessions.SessionStore`).

    Call it before the application serves requests (it adds routes). Build the
    app with ``docs_url=None``: ``/docs`` is served here, without a CDN.
    """
    from dpgate.ui import docs, pages

    app.state.ui_sessions = sessions if sessions is not None else SessionStore()
    app.state.ui_burndowns = BurndownCache()
    app.mount("/ui/static", StaticFiles(directory=docs.static_dir()), name="ui-static")
    app.include_router(docs.router)
    app.include_router(pages.router)
