"""The admin pages under ``/ui/admin`` (permission ``read_ledger``; the cap form ``set_cap``): spend and
burn-down per population, the cap change (previewed, then applied), the ledger browser with its
CSV export, and the ledger's verification. Mounted by :mod:`dpgate.ui.pages`.
"""

from __future__ import annotations

import csv
import io
import json
import zlib
from typing import Annotated, Any, Iterator, Mapping
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response, StreamingResponse

from dpgate.auth import Permission, Principal
from dpgate.errors import DpgateError, InvalidRequest, NotFound
from dpgate.ledger.browse import MAX_PAGE_SIZE, normalise_time
from dpgate.ledger.reports import entry_rho_checked
from dpgate.service import Gateway
from dpgate.ui.data import (
    governance_change,
    populations_overview,
)
from dpgate.ui.plumbing import UIRoute, _burndowns, _form, _gateway, _positive, _redirect, _session, _text, signed_in
from dpgate.ui.render import page

#: This module's pages, mounted under ``/ui`` by :data:`dpgate.ui.pages.router`.
router = APIRouter(route_class=UIRoute, include_in_schema=False)


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
