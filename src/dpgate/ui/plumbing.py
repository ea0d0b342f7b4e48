"""The plumbing shared by the web pages under ``/ui`` (:mod:`dpgate.ui.pages`): the route class that
turns failures into HTML pages (:class:`UIRoute`), the signed-in session check
(:func:`signed_in`, against the API's role table :data:`dpgate.auth.ROLE_PERMISSIONS`), CSRF and
same-origin checks of forms, and form fields.

A page without a live session raises :class:`SignInRequired` (GET: a redirect to the sign-in
form; POST: 401); a form without this session's CSRF token, or from another site, raises
:class:`CsrfFailed` (403). Nothing shows a stack trace.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Mapping
from urllib.parse import urlencode, urlsplit

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import RedirectResponse, Response

from dpgate.auth import KeyStore, Permission, Principal, Role
from dpgate.errors import DpgateError, InvalidRequest
from dpgate.service import Gateway
from dpgate.ui.data import (
    BurndownCache,
)
from dpgate.ui.render import PAGE_HEADERS, error_page
from dpgate.ui.sessions import COOKIE_NAME, Session, SessionStore, csrf_matches

log = logging.getLogger("dpgate.ui")
#: Longest text accepted in a form field (the SQL; other fields are far shorter).
MAX_FIELD_CHARS = 20_000

_NEXT_RE = re.compile(r"^/ui(/[A-Za-z0-9._~%/-]*)?(\?[A-Za-z0-9._~%=&+-]*)?$")


class SignInRequired(Exception):
    """No live signed-in session: a GET is sent to the sign-in form, a POST gets 401."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class CsrfFailed(Exception):
    """A POST without this session's CSRF token, or from another site."""


class UIRoute(APIRoute):
    """An APIRoute whose failures are HTML pages (the API's JSON handlers never see them)."""

    def get_route_handler(self) -> Callable:
        """Wrap FastAPI's handler: sign-in redirects, 403/404/4xx/500 pages."""
        handler = super().get_route_handler()

        async def html_errors(request: Request) -> Response:
            """Run the handler; turn its failures into HTML pages or a sign-in redirect."""
            try:
                return await handler(request)
            except SignInRequired as exc:
                if request.method in ("GET", "HEAD"):
                    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                    query = {"next": target} if _safe_next(target) else {}
                    if exc.reason:
                        query["reason"] = exc.reason
                    return RedirectResponse("/ui/login" + (f"?{urlencode(query)}" if query else ""), 303,
                                            headers=PAGE_HEADERS)
                return error_page(request, 401, "unauthenticated", "sign in first: your session has ended")
            except CsrfFailed:
                return error_page(request, 403, "forbidden",
                                  "this form's CSRF token is missing or does not match your session, or it was "
                                  "sent from another site; reload the page and submit it again")
            except DpgateError as exc:
                if exc.http_status >= 500:
                    log.error("%s %s failed: %s: %s", request.method, request.url.path, exc.code, exc.message)
                return error_page(request, exc.http_status, exc.code, exc.message)
            except RequestValidationError as exc:
                where = ", ".join(".".join(str(p) for p in e.get("loc", ())[1:]) for e in exc.errors()[:3])
                return error_page(request, 400, "invalid_request", f"invalid request parameter: {where}")
            except StarletteHTTPException as exc:
                return error_page(request, exc.status_code, "http_error", str(exc.detail))
            except Exception:  # noqa: BLE001 - no stack trace, no data
                log.exception("unexpected error on %s %s", request.method, request.url.path)
                return error_page(request, 500, "internal", "internal error; the server log has the details")

        return html_errors


# ------------------------------------------------------------------------------- plumbing


def _store(request: Request) -> SessionStore:
    return request.app.state.ui_sessions


def _gateway(request: Request) -> Gateway:
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise DpgateError("the gateway is not open")
    return gateway


def _burndowns(request: Request) -> BurndownCache:
    return request.app.state.ui_burndowns


def _session(request: Request) -> tuple[str | None, Session | None]:
    sid = request.cookies.get(COOKIE_NAME)
    return sid, _store(request).get(sid)


def _live_principal(request: Request, session: Session) -> Principal:
    """The session's principal as the keys file says now (revoked keys end their sessions)."""
    assert session.principal is not None
    keys: KeyStore = request.app.state.keys
    for record in keys.records():
        if record.key_id == session.principal.key_id and record.name == session.principal.name:
            principal = Principal(name=record.name, role=Role(record.role), consumer=record.consumer,
                                  key_id=record.key_id)
            session.principal = principal
            return principal
    _store(request).end_key(session.principal.key_id)
    raise SignInRequired("revoked")


def signed_in(permission: Permission | None = None) -> Callable[[Request], Principal]:
    """A dependency: the signed-in principal, if its role grants ``permission``.

    Raises:
        SignInRequired: no live session (or its key was revoked).
        Forbidden: the role lacks ``permission`` (a 403 page).
    """

    def dependency(request: Request) -> Principal:
        """The live signed-in principal (see :func:`signed_in`)."""
        _, session = _session(request)
        if session is None or session.principal is None:
            raise SignInRequired("expired" if request.cookies.get(COOKIE_NAME) else "")
        principal = _live_principal(request, session)
        request.state.ui_session = session
        if permission is not None:
            principal.require(permission)
        return principal

    dependency.__name__ = f"ui_requires_{permission.value if permission else 'session'}"
    return dependency


def _check_origin(request: Request) -> None:
    """Refuse a POST that the browser says came from another site (Fetch Metadata, Origin)."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise CsrfFailed()
    origin = request.headers.get("origin")
    if origin is not None and origin != "null":
        host = request.headers.get("host", "")
        if urlsplit(origin).netloc.lower() != host.lower():
            raise CsrfFailed()
    elif origin == "null":
        raise CsrfFailed()


async def _form(request: Request, session: Session | None) -> FormData:
    """The submitted form, after the origin and CSRF checks."""
    _check_origin(request)
    try:
        form = await request.form(max_files=0, max_fields=64)
    except Exception:  # noqa: BLE001 - a malformed body is the client's error
        raise InvalidRequest("the form data could not be read") from None
    if not csrf_matches(session, form.get("csrf_token")):
        raise CsrfFailed()
    for value in form.values():
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            raise InvalidRequest(f"a form field is longer than {MAX_FIELD_CHARS} characters")
    return form


def _text(form: Mapping[str, Any], name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value if isinstance(value, str) else default


def _positive(form: Mapping[str, Any], name: str, what: str, *, upper: float | None = None,
              strict_upper: bool = False, error: type[DpgateError] = InvalidRequest) -> float:
    """A form field as a finite number > 0 (≤ ``upper``); ``error`` (default InvalidRequest) otherwise."""
    raw = _text(form, name).strip()
    try:
        value = float(raw)
    except ValueError:
        raise error(f"{what} must be a number", {"field": name}) from None
    if not math.isfinite(value) or value <= 0:
        raise error(f"{what} must be a finite number > 0", {"field": name})
    if upper is not None and (value >= upper if strict_upper else value > upper):
        raise error(f"{what} must be {'<' if strict_upper else '≤'} {upper:g}", {"field": name})
    return value


def _safe_next(target: str | None) -> bool:
    """Whether ``target`` is a page of this UI (no other host, scheme or ``..`` segment)."""
    if not target or not _NEXT_RE.match(target) or "//" in target:
        return False
    path = target.split("?", 1)[0]
    return ".." not in path.split("/") and "%" not in path


def _home(principal: Principal) -> str:
    if principal.can(Permission.READ_LEDGER):
        return "/ui/admin"
    if principal.can(Permission.QUERY):
        return "/ui/console"
    if principal.can(Permission.READ_RELEASES):
        return "/ui/dashboard"
    return "/ui/datasets"


def _set_cookie(request: Request, response: Response, session_id: str) -> None:
    response.set_cookie(COOKIE_NAME, session_id, httponly=True, samesite="strict", path="/ui",
                        secure=request.url.scheme == "https")


def _redirect(url: str) -> RedirectResponse:
    return RedirectResponse(url, 303, headers=PAGE_HEADERS)
