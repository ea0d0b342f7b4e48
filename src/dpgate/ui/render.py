"""Templates, formatting filters, security headers and HTML error pages of the web UI.

Every page is a Jinja2 template from ``dpgate/ui/templates`` rendered with
autoescaping on for every template (``autoescape=True``, not only for
``.html``): any text that reaches a page — dataset and column names, SQL, cap
reasons, key names, error messages — is HTML-escaped. Only the SVG charts of
:mod:`dpgate.ui.charts` are inserted as markup, and they escape their own text.

Pages are sent with a strict Content-Security-Policy (no script at all, styles
and images only from this origin or inline SVG), ``X-Frame-Options: DENY``,
``Referrer-Policy: same-origin``, ``X-Content-Type-Options: nosniff`` and
``Cache-Control: no-store`` (pages show budgets and results of one principal).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from importlib import resources
from typing import Any, Mapping

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from dpgate import __version__
from dpgate.auth import Permission
from dpgate.ui.charts import fmt_number

__all__ = ["PAGE_HEADERS", "page", "templates"]

#: Content-Security-Policy of every UI page: nothing runs, nothing loads from elsewhere.
PAGE_CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

#: Headers sent with every UI page.
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _num(value: Any, digits: int = 4) -> str:
    return fmt_number(_unstring(value), digits)


def _unstring(value: Any) -> Any:
    """The API's spelling of non-finite numbers (``"inf"``, ``"nan"``) back to floats."""
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    return value


def _pct(value: Any, digits: int = 1) -> str:
    value = _unstring(value)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} %"


def _when(value: Any) -> str:
    """An ISO-8601 timestamp as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if not isinstance(value, str) or not value:
        return ""
    try:
        t = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return value
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(num=_num, pct=_pct, when=_when, pretty_json=_pretty_json)
    from dpgate.ledger.caps import LEDGER_RULE, LEDGER_RULE_DIFFERENCE

    # the one conversion's name and its difference from the textbook one, said by every page that shows ε
    env.globals.update(version=__version__, Permission=Permission, ledger_rule=LEDGER_RULE,
                       ledger_rule_difference=LEDGER_RULE_DIFFERENCE)
    return env


def _load_template(name: str) -> str | None:
    if "/" in name or "\\" in name or name.startswith("."):
        return None
    path = resources.files("dpgate.ui").joinpath("templates", name)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


_env: jinja2.Environment | None = None


def templates() -> jinja2.Environment:
    """The (lazily built, shared) Jinja2 environment of the UI templates."""
    global _env
    if _env is None:
        _env = _environment()
    return _env


def page(
    request: Request,
    template: str,
    context: Mapping[str, Any],
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMLResponse:
    """Render ``template`` with ``context`` (plus ``request``, the session and its principal).

    The session (``request.state.ui_session``, set by the page dependencies) gives
    the CSRF token for the forms, the principal for the navigation, and its
    queued flash messages (shown once).
    """
    session = getattr(request.state, "ui_session", None)
    principal = session.principal if session is not None else None
    body = templates().get_template(template).render(
        {
            "request": request,
            "principal": principal,
            "csrf_token": session.csrf_token if session is not None else "",
            "flash": session.pop_flash() if session is not None else [],
            **context,
        }
    )
    return HTMLResponse(body, status_code=status, headers={**PAGE_HEADERS, **(headers or {})})


def error_page(request: Request, status: int, code: str, message: str, *, title: str | None = None) -> HTMLResponse:
    """The HTML error page (same codes as the API's error shape; the message is escaped)."""
    titles = {400: "Bad request", 401: "Sign in required", 403: "Forbidden", 404: "Not found",
              405: "Method not allowed", 409: "Conflict", 413: "Request too large", 500: "Internal error"}
    return page(
        request,
        "error.html",
        {"status": status, "code": code, "message": message,
         "title": title or titles.get(status, "Error")},
        status=status,
    )
