"""The web pages under ``/ui`` (design: ``GET /ui/…``): sign-in, admin, dashboards, console.

Who sees what follows the API's one role table (:data:`dpgate.auth.ROLE_PERMISSIONS`):

==========================================  ==========================  =====================================
page                                        permission                  roles (today)
==========================================  ==========================  =====================================
``/ui/admin`` spend, burn-down, cap form    ``read_ledger``             admin
``POST /ui/admin/populations/{p}/cap``      ``set_cap``                 admin
``/ui/admin/ledger`` (+ export), verify     ``read_ledger``             admin
``/ui/dashboard``, ``/ui/releases/{id}``    ``read_releases``           dashboard, analyst, admin
``POST /ui/dashboard/{d}/pins``             ``curate_dashboards``       dashboard, admin
``/ui/console`` (explain)                   ``explain``                 analyst, admin
``POST /ui/console`` with "Run"             ``query``                   analyst
``/ui/datasets``                            ``read_datasets``           every role
==========================================  ==========================  =====================================

A page a role may not see answers 403 with an HTML page; a page without a
session sends the browser to the sign-in form (``GET``) or answers 401
(``POST``). Every form is a POST carrying the session's CSRF token
(:mod:`dpgate.ui.sessions`); in addition a POST whose ``Sec-Fetch-Site`` says
it came from another site, or whose ``Origin`` names another host, is refused.
Failures are HTML pages with the API's error codes; nothing shows a stack trace.

Handlers that touch the gateway (DuckDB, the ledger, OpenDP) run in the thread
pool, like the API's.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from dpgate.auth import Permission, Principal
from dpgate.ui import admin_pages, console_page, dashboard_pages, sign_in_pages
from dpgate.ui.data import drift_warning
from dpgate.ui.plumbing import CsrfFailed, SignInRequired, UIRoute, _gateway, _session, signed_in
from dpgate.ui.render import error_page, page

# Every name that was importable from this module before the split stays importable here.
from dpgate.ui.plumbing import MAX_FIELD_CHARS, log  # noqa: F401
from dpgate.ui.sign_in_pages import (  # noqa: F401
    home,
    login_form,
    login,
    logout_form,
    logout,
)
from dpgate.ui.admin_pages import (  # noqa: F401
    _csv_cell,
    admin,
    change_cap,
    ledger,
    ledger_export,
    verify,
)
from dpgate.ui.dashboard_pages import (  # noqa: F401
    DASHBOARD_RELEASES,
    MAX_DASHBOARD_RELEASES,
    dashboards,
    dashboard,
    dashboard_pin,
    release,
)
from dpgate.ui.console_page import (  # noqa: F401
    DIALECTS,
    BUDGET_KINDS,
    console,
    console_submit,
)

__all__ = ["router", "SignInRequired", "CsrfFailed"]

#: Every page under ``/ui``, in the order they were always matched: sign-in, datasets, admin,
#: dashboards, console, and last the HTML 404 for any other path.
router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)
router.include_router(sign_in_pages.router)


# ------------------------------------------------------------------------------- datasets


@router.get("/datasets")
def datasets(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.READ_DATASETS))]) -> Response:
    """Every dataset's published guarantee: population, cap, allocations, units, bounds, keys."""
    return page(request, "datasets.html", {"active": "datasets", "datasets": _gateway(request).datasets(),
                                           "drift": drift_warning})


router.include_router(admin_pages.router)
router.include_router(dashboard_pages.router)
router.include_router(console_page.router)


# ------------------------------------------------------------------------------- fallback


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def not_found(request: Request, rest: str) -> Response:
    """Any other ``/ui/…`` path: an HTML 404 page."""
    _, session = _session(request)
    if session is not None and session.principal is not None:
        request.state.ui_session = session
    return error_page(request, 404, "not_found", f"no such page: {request.url.path}")
