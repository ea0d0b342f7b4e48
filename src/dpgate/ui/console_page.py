"""The query console under ``/ui/console``: explain (permission ``explain``) and, with "Run", a charged
query (``query``), in the SQL dialects of :data:`DIALECTS` and the budget forms of
:data:`BUDGET_KINDS`. Handlers that touch the gateway run in the thread pool. Mounted by
:mod:`dpgate.ui.pages`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Mapping

from fastapi import APIRouter, Depends, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from dpgate.auth import Permission, Principal
from dpgate.errors import DpgateError, Forbidden, InvalidBudget, InvalidRequest
from dpgate.service import Gateway, QueryBudget
from dpgate.sql.parse import DIALECTS as PLANNER_DIALECTS
from dpgate.sql.parse import check_dialect
from dpgate.ui.data import (
    explanation_view,
    recent_releases,
    release_title,
    release_view,
)
from dpgate.ui.plumbing import UIRoute, _form, _gateway, _positive, _session, _text, signed_in
from dpgate.ui.render import page

#: This module's pages, mounted under ``/ui`` by :data:`dpgate.ui.pages.router`.
router = APIRouter(route_class=UIRoute, include_in_schema=False)


#: The SQL dialects offered in the console when the gateway accepts a ``dialect`` (sqlglot names).
DIALECTS = PLANNER_DIALECTS
#: Budget forms of the console: the request's ``budget`` field names.
BUDGET_KINDS = ("default", "rho", "epsilon", "ci95")


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
