"""The dashboard pages under ``/ui``: dashboards and their releases (permission ``read_releases``), pins
(``curate_dashboards``), one release. Mounted by :mod:`dpgate.ui.pages`.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from dpgate.auth import Permission, Principal
from dpgate.errors import InvalidRequest, NotFound
from dpgate.ui.data import (
    release_title,
    release_view,
)
from dpgate.ui.plumbing import UIRoute, _form, _gateway, _redirect, _session, _text, signed_in
from dpgate.ui.render import page

#: This module's pages, mounted under ``/ui`` by :data:`dpgate.ui.pages.router`.
router = APIRouter(route_class=UIRoute, include_in_schema=False)


#: Releases shown per dashboard page by default, and at most.
DASHBOARD_RELEASES, MAX_DASHBOARD_RELEASES = 12, 48


# ------------------------------------------------------------------------------- dashboards


@router.get("/dashboard")
def dashboards(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.READ_RELEASES))]) -> Response:
    """The datasets whose stored releases can be shown."""
    return page(request, "dashboards.html", {"active": "dashboard", "datasets": _gateway(request).datasets()})


@router.get("/dashboard/{dataset}")
def dashboard(
    request: Request,
    dataset: str,
    principal: Annotated[Principal, Depends(signed_in(Permission.READ_RELEASES))],
    limit: Annotated[int, Query(ge=1, le=MAX_DASHBOARD_RELEASES)] = DASHBOARD_RELEASES,
) -> Response:
    """The newest stored releases of ``dataset`` as charts with 95 % error bars and tables.

    Reads only the release store: showing (and refreshing) a dashboard spends nothing.
    """
    gateway = _gateway(request)
    info = gateway.dataset(dataset)
    pins = gateway.dashboard_pins(dataset)
    pinned_ids = {p["release_id"] for p in pins}
    pinned = [{"release": p["release"], "view": release_view(p["release"], max_charts=2), "pin": p,
               "title": p["title"] or release_title(p["release"])} for p in reversed(pins)]
    releases = [r for r in gateway.releases(dataset, limit=limit + len(pinned_ids))
                if r["release_id"] not in pinned_ids][:limit]
    views = [{"release": r, "view": release_view(r, max_charts=2), "pin": None, "title": release_title(r)}
             for r in releases]
    return page(request, "dashboard.html", {"active": "dashboard", "dataset": info, "items": views,
                                            "pinned": pinned, "limit": limit, "max_limit": MAX_DASHBOARD_RELEASES,
                                            "can_curate": principal.can(Permission.CURATE_DASHBOARDS)})


@router.post("/dashboard/{dataset}/pins")
async def dashboard_pin(request: Request, dataset: str,
                        principal: Annotated[Principal, Depends(signed_in(Permission.CURATE_DASHBOARDS))]) -> Response:
    """Pin (``action=pin``, with an optional ``title``) or unpin (``action=unpin``) a stored
    release of ``dataset`` on its dashboard. Curation only: it spends nothing."""
    _, session = _session(request)
    form = await _form(request, session)
    assert session is not None
    gateway = _gateway(request)
    release_id = _text(form, "release_id").strip()
    action = _text(form, "action", "pin")
    if not release_id or len(release_id) > 128:
        raise InvalidRequest("choose a release to pin", {"field": "release_id"})
    if action == "pin":
        pin = await run_in_threadpool(lambda: gateway.pin_release(dataset, release_id, title=_text(form, "title"),
                                                                  actor=principal.name))
        session.add_flash("ok", f"Pinned {pin['title'] or release_id} to the dashboard of {dataset}.")
    elif action == "unpin":
        removed = await run_in_threadpool(gateway.unpin_release, dataset, release_id)
        session.add_flash("ok" if removed else "warn", f"Unpinned release {release_id}." if removed else
                          f"Release {release_id} was not pinned.")
    else:
        raise InvalidRequest("action must be pin or unpin", {"field": "action"})
    return _redirect(f"/ui/dashboard/{quote(dataset, safe='')}")


@router.get("/releases/{release_id}")
def release(request: Request, release_id: str,
            principal: Annotated[Principal, Depends(signed_in(Permission.READ_RELEASES))]) -> Response:
    """One stored release: its guarantee, mechanism, bounds, charge, table and charts."""
    if len(release_id) > 128:
        raise NotFound("no such release")
    doc = _gateway(request).release(release_id)
    return page(request, "release.html", {"active": "dashboard", "release": doc, "view": release_view(doc)})
