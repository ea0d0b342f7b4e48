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

import csv
import hashlib
import io
import json
import logging
import math
import re
import zlib
from typing import Annotated, Any, Callable, Iterator, Mapping
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import RedirectResponse, Response, StreamingResponse

from dpgate.auth import KeyStore, Permission, Principal, Role
from dpgate.errors import DpgateError, Forbidden, InvalidBudget, InvalidRequest, NotFound, Unauthenticated
from dpgate.ledger.browse import MAX_PAGE_SIZE, normalise_time
from dpgate.ledger.reports import entry_rho_checked
from dpgate.service import Gateway, QueryBudget
from dpgate.sql.parse import DIALECTS as PLANNER_DIALECTS, check_dialect
from dpgate.ui.data import (
    BurndownCache,
    drift_warning,
    explanation_view,
    governance_change,
    populations_overview,
    recent_releases,
    release_title,
    release_view,
)
from dpgate.ui.render import PAGE_HEADERS, error_page, page
from dpgate.ui.sessions import COOKIE_NAME, Session, SessionStore, csrf_matches

log = logging.getLogger("dpgate.ui")

__all__ = ["router", "SignInRequired", "CsrfFailed"]

#: The SQL dialects offered in the console when the gateway accepts a ``dialect`` (sqlglot names).
DIALECTS = PLANNER_DIALECTS
#: Budget forms of the console: the request's ``budget`` field names.
BUDGET_KINDS = ("default", "rho", "epsilon", "ci95")
#: Releases shown per dashboard page by default, and at most.
DASHBOARD_RELEASES, MAX_DASHBOARD_RELEASES = 12, 48
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


router = APIRouter(prefix="/ui", route_class=UIRoute, include_in_schema=False)


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


# ------------------------------------------------------------------------------- datasets


@router.get("/datasets")
def datasets(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.READ_DATASETS))]) -> Response:
    """Every dataset's published guarantee: population, cap, allocations, units, bounds, keys."""
    return page(request, "datasets.html", {"active": "datasets", "datasets": _gateway(request).datasets(),
                                           "drift": drift_warning})


# ------------------------------------------------------------------------------- admin


def _admin_context(request: Request, gateway: Gateway, *, zoom: bool = False,
                   preview: tuple[str, dict[str, float]] | None = None) -> dict[str, Any]:
    from dpgate.ui.budget_panel import budget_panel  # issue 23: renewal, cohorts, attack bound

    populations = populations_overview(gateway)
    cache = _burndowns(request)
    for p in populations:
        events = gateway.ledger_events(p["name"])
        p["events"] = [{**e, "change": governance_change(e)} for e in list(reversed(events))[:5]]
        p["burndown"] = cache.chart(gateway.ledger, p["name"], p["report"], events, zoom=zoom)
        p["anchor"] = "pop-" + format(zlib.crc32(p["name"].encode()), "08x")
        p["budget"] = budget_panel(gateway, p["name"], p["anchor"],
                                   preview[1] if preview is not None and preview[0] == p["name"] else None)
    return {"active": "admin", "populations": populations, "form_error": None, "zoom": zoom}


@router.get("/admin")
def admin(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.READ_LEDGER))],
          zoom: bool = False, preview: str | None = None, epsilon: str | None = None,
          delta: str | None = None) -> Response:
    """Populations: cap, spend per allocation, burn-down, recent governance events, cap form.

    ``zoom=true`` scales the burn-down charts to the spend instead of the cap.
    ``preview=<population>&epsilon=…&delta=…`` shows the membership-attack bound of that proposed
    cap beside the current one (issue 23: the bound before and after, before the cap is changed).
    """
    proposed = None
    if preview is not None:
        try:
            proposed = (preview, {"epsilon": float(epsilon or "nan"), "delta": float(delta or "nan")})
        except ValueError:
            proposed = (preview, {"epsilon": float("nan"), "delta": float("nan")})
    return page(request, "admin.html", _admin_context(request, _gateway(request), zoom=zoom, preview=proposed))


@router.post("/admin/populations/{population:path}/cap")
async def change_cap(request: Request, population: str,
                     principal: Annotated[Principal, Depends(signed_in(Permission.SET_CAP))]) -> Response:
    """Change a population's cap (a governance event with the admin's reason); show what remains."""
    _, session = _session(request)
    form = await _form(request, session)
    gateway = _gateway(request)
    try:
        epsilon = _positive(form, "epsilon", "ε", upper=1e3)
        delta = _positive(form, "delta", "δ", upper=1.0, strict_upper=True)
        reason = _text(form, "reason").strip()
        if not reason:
            raise InvalidRequest("a reason is required: it is recorded with the change", {"field": "reason"})
        if len(reason) > 1000:
            raise InvalidRequest("the reason is longer than 1000 characters", {"field": "reason"})
        result = await run_in_threadpool(gateway.set_cap, population, epsilon=epsilon, delta=delta,
                                         actor=principal.name, reason=reason)
    except DpgateError as exc:
        if isinstance(exc, NotFound):
            raise
        context = await run_in_threadpool(_admin_context, request, gateway)
        context["form_error"] = {"population": population, "message": exc.message, "fields": {
            "epsilon": _text(form, "epsilon"), "delta": _text(form, "delta"), "reason": _text(form, "reason")}}
        return page(request, "admin.html", context, status=exc.http_status)
    report = await run_in_threadpool(gateway.ledger.spend, population)
    assert session is not None
    if isinstance(result, Mapping) and result.get("changed") is False:
        session.add_flash("warn", f"The cap of {population} already is ε {_fmt(epsilon)} at δ {_fmt(delta)}: "
                                  "nothing was recorded.")
        return _redirect(f"/ui/admin#pop-{zlib.crc32(population.encode()):08x}")
    session.add_flash("ok", _cap_change_sentence(population, result, report.to_dict(), principal.name, reason))
    if isinstance(result, Mapping) and result.get("exhausted"):
        session.add_flash("warn", str(result.get("message") or
                                      f"The new cap of {population} is at or below what it has already spent: "
                                      "every further charge will be refused; past charges stay."))
    anchor = "pop-" + format(zlib.crc32(population.encode()), "08x")
    return _redirect(f"/ui/admin#{anchor}")


def _fmt(value: Any) -> str:
    from dpgate.ui.charts import fmt_number

    return fmt_number(value) if isinstance(value, (int, float)) else str(value)


def _cap_change_sentence(population: str, result: Any, report: Mapping[str, Any], actor: str, reason: str) -> str:
    old = (result.get("old") or {}) if isinstance(result, Mapping) else {}
    new = (result.get("new") or {}) if isinstance(result, Mapping) else {}
    old_cap, new_cap = old.get("cap", old), new.get("cap", new)
    remaining = report.get("remaining", {})
    cap = report.get("cap", {})
    parts = [f"Cap of {population} changed"]
    if old_cap:
        parts.append(f" from ε {_fmt(old_cap.get('epsilon'))} (δ {_fmt(old_cap.get('delta'))})")
    parts.append(f" to ε {_fmt(new_cap.get('epsilon', cap.get('epsilon')))} (δ {_fmt(new_cap.get('delta', cap.get('delta')))})")
    parts.append(f" by {actor}: “{reason}”.")
    parts.append(f" Remaining now: ρ {_fmt(remaining.get('rho'))}, ε {_fmt(remaining.get('epsilon'))} at δ {_fmt(cap.get('delta'))}")
    alpha = cap.get("alpha_cap", new_cap.get("alpha_cap"))
    if alpha is not None:
        parts.append(f"; α_cap {_fmt(alpha)}")
    return "".join(parts) + "."


class _LedgerFilters:
    def __init__(self, show: str, population: str | None, consumer: str | None, since: str | None,
                 until: str | None, limit: int) -> None:
        self.show, self.population, self.consumer = show, population or None, consumer or None
        self.since, self.until, self.limit = since or None, until or None, limit

    def query(self, **extra: Any) -> str:
        """The filters (and ``extra`` parameters) as a URL query string."""
        params = {"show": self.show, "population": self.population, "consumer": self.consumer,
                  "since": self.since, "until": self.until, "limit": self.limit, **extra}
        return urlencode({k: v for k, v in params.items() if v not in (None, "")})

    def kwargs(self) -> dict[str, Any]:
        """The filters as keyword arguments of :meth:`LedgerBrowsing.entries_page`."""
        return {"population": self.population, "consumer": self.consumer, "since": self.since, "until": self.until}


def _filters(show: str, population: str | None, consumer: str | None, since: str | None, until: str | None,
             limit: int) -> _LedgerFilters:
    if show not in ("charges", "events"):
        raise InvalidRequest("show must be 'charges' or 'events'")
    f = _LedgerFilters(show, (population or "").strip(), (consumer or "").strip(), (since or "").strip(),
                       (until or "").strip(), limit)
    normalise_time(f.since, "since")
    normalise_time(f.until, "until")
    return f


@router.get("/admin/ledger")
def ledger(
    request: Request,
    principal: Annotated[Principal, Depends(signed_in(Permission.READ_LEDGER))],
    show: str = "charges",
    population: Annotated[str | None, Query(max_length=128)] = None,
    consumer: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[str | None, Query(max_length=64)] = None,
    until: Annotated[str | None, Query(max_length=64)] = None,
    before: Annotated[int | None, Query(ge=0)] = None,
    after: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """The ledger browser: charges or governance events, filtered, newest first, one page at a time."""
    gateway = _gateway(request)
    f = _filters(show, population, consumer, since, until, limit)
    result = gateway.ledger.entries_page("charge" if show == "charges" else "event", before=before, after=after,
                                         limit=limit, **f.kwargs())
    entries = result.entries
    if show == "charges":  # an RDP curve is shown with the ρ the cap check used, not the stored ∞ bound
        caps = {p: gateway.ledger.cap(p) for p in {e["population"] for e in entries if e.get("kind") == "rdp"}}
        entries = [{**e, "rho_checked": entry_rho_checked(e, caps.get(e["population"]))} for e in entries]
    else:
        entries = [{**e, "change": governance_change(e)} for e in entries]
    context = {
        "active": "ledger",
        "filters": f,
        "entries": entries,
        "newer": f.query(after=result.newer) if result.newer is not None else None,
        "older": f.query(before=result.older) if result.older is not None else None,
        "paged": before is not None or after is not None,
        "newest": f.query(),
        "export_jsonl": f.query(format="jsonl"),
        "export_csv": f.query(format="csv"),
        "populations": gateway.ledger.populations(),
    }
    return page(request, "ledger.html", context)


_CSV_CHARGES = ("seq", "created_at", "population", "consumer", "kind", "rho", "epsilon_at_delta", "delta",
                "purpose", "charge_id", "release_key", "cost", "metadata", "prev_hash", "hash")
_CSV_EVENTS = ("seq", "created_at", "population", "kind", "actor", "reason", "old", "new", "event_id",
               "prev_hash", "hash")


def _csv_cell(value: Any) -> Any:
    """A CSV cell; text that a spreadsheet would run as a formula is prefixed with ``'`` (OWASP)."""
    if isinstance(value, (dict, list)):
        value = json.dumps(value, sort_keys=True, ensure_ascii=False)
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


@router.get("/admin/ledger/export")
def ledger_export(
    request: Request,
    principal: Annotated[Principal, Depends(signed_in(Permission.READ_LEDGER))],
    format: str = "jsonl",
    show: str = "charges",
    population: Annotated[str | None, Query(max_length=128)] = None,
    consumer: Annotated[str | None, Query(max_length=128)] = None,
    since: Annotated[str | None, Query(max_length=64)] = None,
    until: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    """Every entry matching the ledger browser's filters, oldest first (chain order), streamed
    as JSON lines (the form ``dpgate ledger export`` writes, decoded) or CSV."""
    if format not in ("jsonl", "csv"):
        raise InvalidRequest("format must be 'jsonl' or 'csv'")
    gateway = _gateway(request)
    f = _filters(show, population, consumer, since, until, limit)
    kind = "charge" if show == "charges" else "event"
    gateway.ledger.entries_page(kind, limit=1, **f.kwargs())  # validate the filters before streaming

    def entries() -> Iterator[dict[str, Any]]:
        """Every matching entry, oldest first, read a page of MAX_PAGE_SIZE at a time."""
        cursor = 0
        while True:
            chunk = gateway.ledger.entries_page(kind, after=cursor, limit=MAX_PAGE_SIZE, **f.kwargs())
            for e in reversed(chunk.entries):
                yield e
            if chunk.newer is None or not chunk.entries:
                return
            cursor = chunk.entries[0]["seq"]

    def jsonl() -> Iterator[bytes]:
        """The entries as JSON lines."""
        for e in entries():
            yield (json.dumps(e, ensure_ascii=False, sort_keys=True) + "\n").encode()

    def as_csv() -> Iterator[bytes]:
        """The entries as CSV, in chunks of about 64 KB."""
        columns = _CSV_CHARGES if kind == "charge" else _CSV_EVENTS
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(columns)
        for e in entries():
            writer.writerow([_csv_cell(e.get(c)) for c in columns])
            if buf.tell() > 64 * 1024:
                yield buf.getvalue().encode()
                buf.seek(0)
                buf.truncate()
        yield buf.getvalue().encode()

    name = f"dpgate-ledger-{show}.{format}"
    media = "application/x-ndjson" if format == "jsonl" else "text/csv; charset=utf-8"
    headers = {"Content-Disposition": f'attachment; filename="{name}"', "Cache-Control": "no-store",
               "X-Content-Type-Options": "nosniff"}
    return StreamingResponse(jsonl() if format == "jsonl" else as_csv(), media_type=media, headers=headers)


@router.post("/admin/verify")
async def verify(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.READ_LEDGER))]) -> Response:
    """Run ``verify`` on the whole ledger (hash chain, replayed spend, triggers) and show its result."""
    _, session = _session(request)
    await _form(request, session)
    report = await run_in_threadpool(_gateway(request).ledger.verify)
    return page(request, "verify.html", {"active": "ledger", "report": report.to_dict()})


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


# ------------------------------------------------------------------------------- console


def _dialect_supported(gateway: Gateway) -> bool:
    import inspect

    try:
        return "dialect" in inspect.signature(gateway.explain).parameters and \
            "dialect" in inspect.signature(gateway.query).parameters
    except (TypeError, ValueError):
        return False


def _console_request(form: Mapping[str, Any], datasets: list[str]) -> dict[str, Any]:
    dataset = _text(form, "dataset")
    if dataset not in datasets:
        raise InvalidRequest(f"choose a dataset: one of {', '.join(datasets)}", {"field": "dataset"})
    sql = _text(form, "sql").strip()
    if not sql:
        raise InvalidRequest("write a SQL query first", {"field": "sql"})
    kind = _text(form, "budget_kind", "default")
    if kind not in BUDGET_KINDS:
        raise InvalidRequest("the budget must be default, rho, epsilon or ci95", {"field": "budget_kind"})
    value = None
    if kind != "default":
        # the API's code for a bad budget (invalid_budget), not a generic invalid_request
        value = _positive(form, "budget_value", {"rho": "ρ", "epsilon": "ε", "ci95": "the ci95 half-width"}[kind],
                          upper=1e6, error=InvalidBudget)
    mechanism = _text(form, "mechanism", "default")
    if mechanism not in ("default", "gaussian", "laplace"):
        raise InvalidRequest("the mechanism must be gaussian or laplace", {"field": "mechanism"})
    try:
        dialect = check_dialect(_text(form, "dialect", "duckdb") or None)
    except InvalidRequest as e:
        raise InvalidRequest(e.message, {**e.details, "field": "dialect"}) from None
    return {"dataset": dataset, "sql": sql, "budget_kind": kind, "budget_value": value,
            "mechanism": mechanism, "dialect": dialect}


def _digest(req: Mapping[str, Any]) -> str:
    payload = json.dumps([req["dataset"], req["sql"], req["budget_kind"], req["budget_value"], req["mechanism"],
                          req["dialect"]], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def _call_args(gateway: Gateway, req: Mapping[str, Any]) -> dict[str, Any]:
    budget = None if req["budget_kind"] == "default" else QueryBudget(**{req["budget_kind"]: req["budget_value"]})
    kwargs: dict[str, Any] = {"budget": budget, "mechanism": None if req["mechanism"] == "default" else req["mechanism"]}
    if req["dialect"] != "duckdb":
        if not _dialect_supported(gateway):
            raise InvalidRequest("this gateway reads SQL in the duckdb dialect only", {"field": "dialect"})
        kwargs["dialect"] = req["dialect"]
    return kwargs


def _remaining(gateway: Gateway, dataset: str, principal: Principal) -> dict[str, Any] | None:
    if not principal.can(Permission.READ_BUDGET):
        return None
    report = gateway.budget(dataset)
    mine = (report.get("consumers") or {}).get(principal.consumer or "", None)
    if mine is None:
        return None
    return {**mine, "consumer": principal.consumer,
            "population_remaining_rho": (report.get("remaining") or {}).get("rho"),
            "population": report.get("population")}


def _console_context(gateway: Gateway, principal: Principal, req: Mapping[str, Any]) -> dict[str, Any]:
    names = sorted(gateway.policies)
    dataset = req.get("dataset") if req.get("dataset") in names else (names[0] if names else "")
    info = gateway.dataset(dataset) if dataset else None
    mine: list[dict[str, Any]] = []
    if principal.consumer:
        mine = recent_releases(gateway.releases(None, limit=100), principal.consumer)
    return {
        "active": "console",
        "datasets": names,
        "dataset_info": info,
        "form": {"dataset": dataset, "sql": req.get("sql") or _example_sql(info), "budget_kind": req.get("budget_kind", "default"),
                 "budget_value": "" if req.get("budget_value") is None else repr(req["budget_value"]),
                 "mechanism": req.get("mechanism", "default"), "dialect": req.get("dialect", "duckdb")},
        "dialects": DIALECTS if _dialect_supported(gateway) else ("duckdb",),
        "can_run": principal.can(Permission.QUERY),
        "remaining": _remaining(gateway, dataset, principal) if dataset else None,
        "mine": [{"release": r, "view": release_view(r, charts=False), "title": release_title(r)} for r in mine],
        "explanation": None,
        "result": None,
        "trial": None,
        "error": None,
        "explained": False,
    }


def _example_sql(info: Mapping[str, Any] | None) -> str:
    if not info:
        return ""
    for tname, table in (info.get("tables") or {}).items():
        keys = [c for c, col in (table.get("columns") or {}).items() if col.get("public_keys")]
        if keys:
            return f"SELECT {keys[0]}, COUNT(*) AS n FROM {tname} GROUP BY {keys[0]}"
        return f"SELECT COUNT(*) AS n FROM {tname}"
    return ""


@router.get("/console")
def console(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.EXPLAIN))],
            dataset: Annotated[str | None, Query(max_length=128)] = None) -> Response:
    """The analyst console: write SQL, explain it (free), then run it (charged)."""
    gateway = _gateway(request)
    return page(request, "console.html", _console_context(gateway, principal, {"dataset": dataset}))


@router.post("/console")
async def console_submit(request: Request, principal: Annotated[Principal, Depends(signed_in(Permission.EXPLAIN))]) -> Response:
    """Explain (``action=explain``: reads no data, charges nothing) or run (``action=run``) a query.

    Run needs the ``query`` permission and answers only a request this session
    explained first, unchanged (dataset, SQL, budget, mechanism, dialect).
    """
    _, session = _session(request)
    form = await _form(request, session)
    assert session is not None
    gateway = _gateway(request)
    action = _text(form, "action", "explain")
    raw = {k: _text(form, k) for k in ("dataset", "sql", "budget_kind", "mechanism", "dialect")}
    raw["budget_value"] = None
    try:
        req = _console_request(form, sorted(gateway.policies))
    except DpgateError as exc:
        context = await run_in_threadpool(_console_context, gateway, principal, {**raw, "budget_kind": "default"})
        context["form"].update({k: v for k, v in raw.items() if v is not None})
        context["form"]["budget_value"] = _text(form, "budget_value")
        context["error"] = {"code": exc.code, "message": exc.message}
        return page(request, "console.html", context, status=exc.http_status)
    context = await run_in_threadpool(_console_context, gateway, principal, req)
    context["explained"] = _digest(req) in session.explained
    status = 200
    try:
        kwargs = _call_args(gateway, req)
        if action == "run":
            if not principal.can(Permission.QUERY):
                raise Forbidden(f"role {principal.role.value!r} may not run queries (explain only)",
                                {"role": principal.role.value})
            if _digest(req) not in session.explained:
                raise InvalidRequest("explain this query first (the console runs only what it explained, "
                                     "unchanged): press Explain, check the cost, then Run")
            result = await run_in_threadpool(lambda: gateway.query(req["dataset"], req["sql"],
                                                                   consumer=_consumer(principal), **kwargs))
            context["result"] = {"release": result, "view": release_view(result)}
            context["remaining"] = await run_in_threadpool(_remaining, gateway, req["dataset"], principal)
            if principal.consumer:
                mine = recent_releases(await run_in_threadpool(gateway.releases, None, limit=100), principal.consumer)
                context["mine"] = [{"release": r, "view": release_view(r, charts=False), "title": release_title(r)} for r in mine]
        elif action in ("explain", "trial"):  # trial (issue 23): explain plus a free run on the proxy
            trial = action == "trial"
            explanation = await run_in_threadpool(lambda: gateway.explain(req["dataset"], req["sql"], trial=trial,
                                                                          consumer=principal.consumer, **kwargs))
            context["trial"] = explanation.get("trial")
            session.remember_explained(_digest(req))
            context["explanation"] = {"doc": explanation,
                                      "view": explanation_view(explanation, context["dataset_info"] or {},
                                                               context["remaining"])}
            context["explained"] = True
        else:
            raise InvalidRequest("action must be explain, trial or run")
    except Forbidden:
        raise
    except DpgateError as exc:
        context["error"] = {"code": exc.code, "message": exc.message, "details": exc.details}
        status = exc.http_status
    return page(request, "console.html", context, status=status)


def _consumer(principal: Principal) -> str:
    if not principal.consumer:
        raise Forbidden(f"API key {principal.name!r} names no consumer, so it has no allocation to spend",
                        {"key": principal.name})
    return principal.consumer


# ------------------------------------------------------------------------------- fallback


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
def not_found(request: Request, rest: str) -> Response:
    """Any other ``/ui/…`` path: an HTML 404 page."""
    _, session = _session(request)
    if session is not None and session.principal is not None:
        request.state.ui_session = session
    return error_page(request, 404, "not_found", f"no such page: {request.url.path}")
