"""The sign-in pages under ``/ui``: home (the role's first page), the sign-in form (an API key in a
password field; the key never appears in a URL), sign-out. Mounted by :mod:`dpgate.ui.pages`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from dpgate.auth import KeyStore, Principal
from dpgate.errors import Unauthenticated
from dpgate.ui.plumbing import (
    CsrfFailed,
    SignInRequired,
    UIRoute,
    _form,
    _home,
    _live_principal,
    _redirect,
    _safe_next,
    _session,
    _set_cookie,
    _store,
    _text,
    signed_in,
)
from dpgate.ui.render import page
from dpgate.ui.sessions import COOKIE_NAME

#: This module's pages, mounted under ``/ui`` by :data:`dpgate.ui.pages.router`.
router = APIRouter(route_class=UIRoute, include_in_schema=False)


# ------------------------------------------------------------------------------- sign-in


@router.get("/", name="ui_home")
def home(request: Request) -> Response:
    """Send the browser to its role's first page, or to the sign-in form."""
    _, session = _session(request)
    if session is None or session.principal is None:
        return _redirect("/ui/login")
    try:
        principal = _live_principal(request, session)
    except SignInRequired:
        return _redirect("/ui/login?reason=revoked")
    return _redirect(_home(principal))


@router.get("/login")
def login_form(request: Request, next: str | None = None, reason: str | None = None) -> Response:
    """The sign-in form (an API key in a password field; the key never appears in a URL)."""
    sid, session = _session(request)
    if session is not None and session.principal is not None:
        return _redirect(next if _safe_next(next) else "/ui/")
    new_sid = None
    if session is None:
        new_sid, session = _store(request).anonymous()
    request.state.ui_session = session
    notes = {"expired": "Your session has ended; sign in again.",
             "revoked": "The API key of your session was revoked; sign in with another key.",
             "signed_out": "You are signed out."}
    response = page(request, "login.html", {"next": next if _safe_next(next) else "", "error": "",
                                             "note": notes.get(reason or "", "")})
    if new_sid is not None:
        _set_cookie(request, response, new_sid)
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the API key; start a fresh session (new id and CSRF token) and go to the next page."""
    sid, session = _session(request)
    if session is None:
        raise CsrfFailed()
    form = await _form(request, session)
    request.state.ui_session = session
    nxt = _text(form, "next")
    keys: KeyStore = request.app.state.keys
    try:
        principal = keys.authenticate(_text(form, "api_key").strip() or None)
    except Unauthenticated as exc:
        return page(request, "login.html", {"next": nxt if _safe_next(nxt) else "", "note": "",
                                             "error": exc.message}, status=401)
    new_sid, new_session = _store(request).sign_in(principal, previous=sid)
    request.state.ui_session = new_session
    response = _redirect(nxt if _safe_next(nxt) else _home(principal))
    _set_cookie(request, response, new_sid)
    return response


@router.get("/logout")
def logout_form(request: Request, principal: Annotated[Principal, Depends(signed_in())]) -> Response:
    """A page with the sign-out button (signing out is a POST with the CSRF token)."""
    return page(request, "logout.html", {"active": ""})


@router.post("/logout")
async def logout(request: Request) -> Response:
    """End the session and clear its cookie."""
    sid, session = _session(request)
    await _form(request, session)
    _store(request).end(sid)
    response = _redirect("/ui/login?reason=signed_out")
    response.delete_cookie(COOKIE_NAME, path="/ui", httponly=True, samesite="strict",
                           secure=request.url.scheme == "https")
    return response
