"""The endpoints of the HTTP API (design: "HTTP API").

Every endpoint except ``GET /healthz`` and ``GET /readyz`` needs an API key (``Authorization:
Bearer <key>`` or ``X-API-Key: <key>``) whose role grants the endpoint's
:class:`~dpgate.auth.Permission` (table in :data:`dpgate.auth.ROLE_PERMISSIONS`).
Endpoints are plain ``def`` functions: FastAPI runs them in its thread pool, so
the blocking gateway (DuckDB, the SQLite ledger, OpenDP) never stalls the event
loop. Responses are the gateway's JSON-ready dicts, checked against the models
of :mod:`dpgate.api.schemas`.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable

from fastapi import APIRouter, Depends, Path, Query, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from dpgate import __version__, limits
import dpgate.api.schemas as schemas
from dpgate.api.errors import json_safe
from dpgate.api.authn import authenticate
from dpgate.auth import Permission, Principal, Role
from dpgate.errors import Forbidden, Internal, InvalidRequest, LedgerUnavailable, NotFound, UnknownPopulation
from dpgate.service import Gateway, QueryBudget

_bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer <API key>`")
_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="`X-API-Key: <API key>`")

#: Error answers documented on every authenticated endpoint (all share one shape).
_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.ErrorResponse, "description": description}
    for status, description in {
        400: "invalid_request, invalid_sql, unsupported_query, unknown_table, unknown_column, invalid_budget",
        401: "unauthenticated: missing, malformed, unknown or revoked API key",
        403: "forbidden: the key's role does not allow this",
        404: "not_found, unknown_dataset, unknown_population, unknown_consumer",
        409: "budget_exhausted (details: requested, spent, cap, remaining) or conflict",
        408: "request_timeout: the body did not arrive in time (connection closed)",
        413: "payload_too_large",
        500: "internal (no stack trace, no data)",
        503: "ledger_unavailable or server_busy (Retry-After)",
    }.items()
}

DatasetName = Annotated[str, Path(min_length=1, max_length=128, description="dataset name (from its policy)")]


def get_gateway(request: Request) -> Gateway:
    """The application's open :class:`~dpgate.service.Gateway` (raises Internal outside the lifespan)."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise Internal("the gateway is not open")
    return gateway


def get_principal(
    request: Request,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    api_key: Annotated[str | None, Security(_api_key_header)],
) -> Principal:
    """Authenticate the request's API key (bearer token first, then ``X-API-Key``) with
    :func:`dpgate.api.authn.authenticate` (the same rules as the gate in front of ``/v1``, which
    has already refused a request without a valid key before its body was read).

    Raises:
        Unauthenticated: no key, a key that matches no principal, a revoked key, or an
            ``Authorization`` header without the ``Bearer`` scheme (the message says how to send it).
    """
    return authenticate(request.app.state.keys, request.headers.get("authorization"),
                        request.headers.get("x-api-key"))


def require(permission: Permission) -> Callable[..., Principal]:
    """A dependency returning the authenticated principal if its role grants ``permission``.

    Raises:
        Unauthenticated: (401) no valid key.
        Forbidden: (403) the role lacks ``permission``.
    """

    def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        principal.require(permission)
        return principal

    dependency.__name__ = f"require_{permission.value}"
    return dependency


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


def _budget(budget: schemas.BudgetRequest | None) -> QueryBudget | None:
    """The request's budget through the one validator (InvalidBudget, as in the CLI)."""
    return None if budget is None else budget.to_query_budget()


def _consumer_of(principal: Principal) -> str:
    if not principal.consumer:
        raise Forbidden(
            f"API key {principal.name!r} names no consumer, so it has no allocation to spend",
            {"key": principal.name},
        )
    return principal.consumer


def refuse_unknown_query_parameters(request: Request) -> None:
    """A query-string parameter the route does not take is refused (400 ``invalid_request``), as an
    unknown body field is: ``GET /v1/releases?datset=usage`` must not silently list every dataset's
    releases (trial finding). The route's parameters are its FastAPI ``Dependant``'s ``query_params`` and its dependencies'.

    Raises:
        InvalidRequest: naming the unknown parameters and the route's own.
    """
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    known: set[str] = set()
    todo = [dependant]
    while todo:  # the route's parameters and its dependencies' (Dependant.query_params, .dependencies)
        d = todo.pop()
        known |= {p.alias for p in d.query_params}
        todo += d.dependencies
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}: "
            + (f"this route takes {', '.join(sorted(known))}" if known else "this route takes none"),
            {"unknown": unknown, "known": sorted(known)})


health = APIRouter(tags=["health"])
v1 = APIRouter(prefix="/v1", responses=_ERRORS, dependencies=[Depends(refuse_unknown_query_parameters)])


@health.get("/healthz", response_model=schemas.Health, summary="Liveness (no API key needed)")
def healthz() -> dict[str, str]:
    """Liveness probe: the process answers HTTP. Needs no API key and touches no data."""
    return {"status": "ok", "version": __version__}


@health.get("/readyz", response_model=schemas.Readiness, summary="Readiness: ledger and release store (no API key)",
            responses={503: {"model": schemas.ErrorResponse,
                             "description": "ledger_unavailable (details.checks; Retry-After)"}})
def readyz(request: Request) -> dict[str, Any]:
    """Readiness probe: the ledger answers and its write lock can be taken, and the release store
    answers, each within the ledger wait (:mod:`dpgate.api.readiness`; one result is reused for a
    second). 503 ``ledger_unavailable`` with ``Retry-After`` and ``details.checks`` otherwise. Needs
    no API key; names no path or server message."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        raise LedgerUnavailable("not ready: the gateway is not open (starting or stopping)",
                                {"checks": {"ledger": "unavailable", "release_store": "unavailable"}})
    checks = request.app.state.readiness.check(gateway)
    failed = [name for name, state in checks.items() if state != "ok"]
    if failed:
        raise LedgerUnavailable(f"not ready: {' and '.join(n.replace('_', ' ') for n in failed)} unavailable",
                                {"checks": checks})
    return {"status": "ready", "version": __version__, "checks": checks}


# --- queries ---------------------------------------------------------------------------


@v1.post("/queries", response_model=schemas.Release, tags=["queries"], summary="Run a query (charges the key's consumer)")
def run_query(
    body: schemas.QueryRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.QUERY))],
) -> dict[str, Any]:
    """Answer one aggregate SQL query with differential privacy.

    The budget is charged to the API key's consumer before any noise is drawn;
    an identical earlier query (same plan, data version, mechanism and budget)
    is served from the release store at no cost (``cached: true``). A request
    that does not fit the remaining allocation gets 409 ``budget_exhausted``
    with ``requested``, ``spent``, ``cap`` and ``remaining`` (ρ and ε at the
    cap's δ) and no rows.
    """
    if body.trial is not None:
        raise InvalidRequest("trial goes with POST /v1/queries/explain (a free run on the proxy), not with a query",
                             {"field": "trial"})
    if body.reference_rows is not None:
        raise InvalidRequest("reference_rows goes with POST /v1/queries/explain (the group size its warnings "
                             "compare the ± at), not with a query", {"field": "reference_rows"})
    release = gateway.query(
        body.dataset,
        body.sql,
        consumer=_consumer_of(principal),
        budget=_budget(body.budget),
        mechanism=body.mechanism,
        dialect=body.dialect,
        search_id=body.search_id,
        fallback=body.fallback,
    )
    return json_safe(release)


@v1.post(
    "/queries/explain",
    response_model=schemas.Explanation,
    tags=["queries"],
    summary="Explain a query: plan, bounded SQL, sensitivity, cost (free)",
)
def explain_query(
    body: schemas.QueryRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.EXPLAIN))],
) -> dict[str, Any]:
    """Show the plan, the bounded SQL template, the sensitivities and the cost a query would
    charge. Reads no data and charges nothing."""
    if body.fallback is not None:
        raise InvalidRequest("fallback goes with POST /v1/queries (explain charges nothing, so nothing is refused)",
                             {"field": "fallback"})
    explanation = gateway.explain(body.dataset, body.sql, budget=_budget(body.budget), mechanism=body.mechanism,
                                  consumer=principal.consumer, dialect=body.dialect, trial=bool(body.trial),
                                  reference_rows=body.reference_rows)
    return json_safe(explanation)


# --- releases --------------------------------------------------------------------------


@v1.get("/releases/{release_id}", response_model=schemas.Release, tags=["releases"], summary="One stored release (free)")
def get_release(
    release_id: Annotated[str, Path(min_length=1, max_length=128)],
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_RELEASES))],
) -> dict[str, Any]:
    """A stored release. Re-serving it is post-processing and costs no budget."""
    return json_safe(gateway.release(release_id))


@v1.get("/releases", response_model=schemas.ReleaseList, tags=["releases"], summary="Stored releases (free)")
def list_releases(
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_RELEASES))],
    dataset: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Stored releases, newest first, optionally of one dataset. Free."""
    return json_safe({"releases": gateway.releases(dataset, limit=limit)})


# --- dashboards (curation: pins; spends nothing) ------------------------------------------


@v1.get("/dashboards/{name}/pins", response_model=schemas.PinList, tags=["releases"],
        summary="The releases pinned to a dataset's dashboard (free)")
def list_pins(
    name: DatasetName,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_RELEASES))],
) -> dict[str, Any]:
    """The pins of the dashboard of dataset ``name``, oldest first, each with its stored release."""
    return json_safe({"pins": gateway.dashboard_pins(name)})


@v1.put("/dashboards/{name}/pins/{release_id}", response_model=schemas.Pin, tags=["releases"],
        summary="Pin a stored release to a dataset's dashboard")
def put_pin(
    name: DatasetName,
    release_id: Annotated[str, Path(min_length=1, max_length=128)],
    body: schemas.PinRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.CURATE_DASHBOARDS))],
) -> dict[str, Any]:
    """Pin (or re-title) a stored release of dataset ``name`` on its dashboard; the key's name is
    recorded as ``pinned_by``. Curation only: it reads and spends nothing."""
    return json_safe(gateway.pin_release(name, release_id, title=body.title, actor=principal.name))


@v1.delete("/dashboards/{name}/pins/{release_id}", tags=["releases"], summary="Unpin a release")
def delete_pin(
    name: DatasetName,
    release_id: Annotated[str, Path(min_length=1, max_length=128)],
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.CURATE_DASHBOARDS))],
) -> dict[str, Any]:
    """Remove a release from the dashboard of dataset ``name``; 404 if it was not pinned."""
    if not gateway.unpin_release(name, release_id):
        raise NotFound(f"release {release_id} is not pinned to the dashboard of {name}",
                       {"release_id": release_id, "dashboard": name})
    return {"unpinned": release_id, "dashboard": name}


# --- datasets --------------------------------------------------------------------------


@v1.get("/datasets", response_model=schemas.DatasetList, tags=["datasets"], summary="Every dataset's published guarantee")
def list_datasets(
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_DATASETS))],
) -> dict[str, Any]:
    """The published guarantee of every dataset (cap, δ, allocations, units, bounds, schema)."""
    return json_safe({"datasets": gateway.datasets()})


@v1.get("/datasets/{name}", response_model=schemas.DatasetInfo, tags=["datasets"], summary="One dataset's published guarantee")
def get_dataset(
    name: DatasetName,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_DATASETS))],
) -> dict[str, Any]:
    """The published guarantee of one dataset: population, cap (ε, δ), allocations, and per
    table the privacy unit, contribution bounds and the public parts of the schema."""
    return json_safe(gateway.dataset(name))


@v1.get("/datasets/{name}/budget", response_model=schemas.BudgetReport, tags=["datasets"], summary="Spent and remaining budget")
def get_budget(
    name: DatasetName,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_BUDGET))],
) -> dict[str, Any]:
    """Spent and remaining budget of the dataset's population, in ρ and in ε (the ledger's one conversion),
    overall and per allocation (totals, not per release)."""
    return json_safe(gateway.budget(name))


# --- ledger ----------------------------------------------------------------------------


@v1.post(
    "/ledger/charges",
    response_model=schemas.ChargeReceipt,
    status_code=201,
    tags=["ledger"],
    summary="Charge an external cost (e.g. a DP-SGD run's RDP curve)",
)
def post_external_charge(
    body: schemas.ExternalChargeRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.CHARGE_EXTERNAL))],
) -> dict[str, Any]:
    """Charge a cost computed by an external accountant to a population and consumer.

    The consumer comes from a service key (``consumer`` may be omitted; naming
    another one is 403); an admin names the consumer in the body. 409
    ``budget_exhausted`` when it does not fit (nothing is written).
    """
    consumer = body.consumer
    if principal.role is Role.SERVICE:
        if consumer is not None and consumer != principal.consumer:
            raise Forbidden(
                f"API key {principal.name!r} may charge only consumer {principal.consumer!r}",
                {"key": principal.name, "consumer": consumer},
            )
        consumer = principal.consumer
    if not consumer:
        raise InvalidRequest("name the consumer that pays: consumer is required with an admin key",
                             {"field": "consumer"})
    receipt = gateway.charge_external(
        body.population,
        consumer,
        curve=body.curve,
        orders=body.orders,
        rho=body.rho,
        kind=body.kind,
        purpose=body.purpose,
        actor=principal.name,
        search_id=body.search_id,
        candidate=body.candidate,
        step=body.step,
        outcome=body.outcome,
        attempt=body.attempt,
        note=body.note,
        any_search=principal.role is Role.ADMIN,  # an admin sees every search; its consumer still pays
        dp_sgd=None if body.dp_sgd is None else body.dp_sgd.to_dict(),
        cohorts=body.cohorts,
    )
    return json_safe(receipt)


# --- searches (issue 15) ---------------------------------------------------------------

SearchId = Annotated[str, Path(min_length=1, max_length=64, description="search id (srch_…)")]


def _search_owner(principal: Principal) -> str | None:
    """Whose searches ``principal`` may read, close and attach steps to: its own consumer's (a
    search of another consumer is answered 404 ``not_found``, exactly like a missing one), or every
    consumer's for an admin key (None)."""
    if principal.role is Role.ADMIN:
        return None
    return _consumer_of(principal)


@v1.post("/searches", response_model=schemas.SearchRecord, status_code=201, tags=["searches"],
         summary="Declare a tuning/selection search (charges nothing)")
def create_search(
    body: schemas.SearchRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SEARCH))],
) -> dict[str, Any]:
    """Declare a search: candidates, training and validation data (and whether they hold the same
    people), public or private selection, and the stopping rule. Its charges (training runs via
    ``POST /v1/ledger/charges`` with ``search_id``, selection queries with ``search_id``) are recorded
    with the accountant's state after each. Data-dependent stopping that is not privatised, score-like
    fields and unstated disjointness are refused (400). The consumer is the key's (an admin names it)."""
    consumer = body.consumer
    if principal.consumer:
        if consumer is not None and consumer != principal.consumer:
            raise Forbidden(f"API key {principal.name!r} may declare searches only for consumer "
                            f"{principal.consumer!r}", {"key": principal.name, "consumer": consumer})
        consumer = principal.consumer
    if not consumer:
        raise InvalidRequest("name the consumer whose allocation the search spends", {"field": "consumer"})
    spec = body.model_dump(exclude={"consumer"})
    return json_safe(gateway.create_search(spec, consumer=consumer, actor=principal.name))


@v1.get("/searches", response_model=schemas.SearchList, tags=["searches"], summary="Search records, newest first")
def list_searches(
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SEARCH))],
    population: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    consumer: Annotated[str | None, Query(min_length=1, max_length=128,
                                          description="only this consumer's searches (admin keys)")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Search records (id, population, purpose, consumer), newest first: the key's own consumer's
    searches (an admin key sees every consumer's, or one consumer's with ``consumer``)."""
    owner = _search_owner(principal)
    if owner is not None and consumer is not None and consumer != owner:
        raise Forbidden(f"API key {principal.name!r} may list only consumer {owner!r}'s searches",
                        {"key": principal.name, "consumer": consumer})
    return json_safe({"searches": gateway.search_list(population, limit=limit, owner=owner or consumer)})


@v1.get("/searches/{search_id}", response_model=schemas.SearchRecord, tags=["searches"],
        summary="One search record, replayed against the ledger")
def get_search(
    search_id: SearchId,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SEARCH))],
) -> dict[str, Any]:
    """Every step (charges with candidate, outcome and attempt; selections with the released keys,
    never scores; the closing step) with the accountant's state after it, the totals of the whole
    search (ρ and ε), and ``replay``: each step recomputed from the ledger. A search
    of another consumer is 404 ``not_found`` (admin keys read every search)."""
    return json_safe(gateway.search(search_id, owner=_search_owner(principal)))


@v1.post("/searches/{search_id}/close", response_model=schemas.SearchRecord, tags=["searches"],
         summary="Close a search with the selected candidate and artifacts")
def close_search(
    search_id: SearchId,
    body: schemas.SearchCloseRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SEARCH))],
) -> dict[str, Any]:
    """Record the selected candidate and artifact ids. Private selection names the selection release
    recorded in the search; public selection is recorded as free post-processing. A closed search
    cannot be reopened (409 ``conflict``): a new search is a new record on the same budget. Only the
    search's consumer (or an admin key; the step records the key's name as actor) may close it:
    another consumer's search is 404 ``not_found``."""
    return json_safe(gateway.close_search(search_id, selected=body.selected, artifacts=list(body.artifacts),
                                          selection_release=body.selection_release, note=body.note,
                                          actor=principal.name, owner=_search_owner(principal)))


@v1.get(
    "/ledger/orders",
    response_model=schemas.LedgerOrders,
    tags=["ledger"],
    summary="The ledger's RDP order grid and the orders each population's cap checks (any role)",
)
def get_ledger_orders(
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(get_principal)],
) -> dict[str, Any]:
    """The RDP orders the ledger accounts at (``inf`` is the pure-ε order) and, per population,
    α_cap: the filter checks ε(α) ≤ α·ρ_cap at the grid orders up to α_cap (the order whose
    conversion proves the cap), and nothing above it. External accountants (DP-SGD) should report
    their curve at least up to α_cap; a curve on their own grid is mapped conservatively."""
    return json_safe(gateway.ledger_orders())


@v1.get("/admin/ledger", response_model=schemas.LedgerView, tags=["admin"], summary="Ledger entries and governance events")
def get_ledger(
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.READ_LEDGER))],
    population: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> dict[str, Any]:
    """The append-only ledger: charge entries (at most ``limit``) and governance events
    (cap and allocation changes with actor and reason), optionally of one population (404
    ``unknown_population`` for a population the ledger does not know)."""
    if population is not None and population not in gateway.ledger.populations():
        raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
    return json_safe(
        {
            "entries": gateway.ledger_entries(population, limit=limit),
            "events": gateway.ledger_events(population),
        }
    )


@v1.post(
    "/admin/datasets/{name}/reload",
    response_model=schemas.DatasetInfo,
    tags=["admin"],
    summary="Load a dataset's data again without a restart",
)
def reload_dataset(
    name: DatasetName,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.RELOAD_DATASETS))],
) -> dict[str, Any]:
    """Reload a dataset's files (or re-check a live source's schema) and serve the new data
    under a new data version. Stored releases of the old data stay and are served as they
    were; queries running during the reload finish on the old data. Invalid new files leave
    the old data serving (``invalid_policy``)."""
    return json_safe(gateway.reload(name))


@v1.post(
    "/admin/populations/{population}/cap",
    response_model=schemas.CapChangeResult,
    tags=["admin"],
    summary="Change a population's cap (recorded with a reason)",
)
def set_cap(
    population: Annotated[str, Path(min_length=1, max_length=128)],
    body: schemas.CapChangeRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SET_CAP))],
) -> dict[str, Any]:
    """Set a population's (ε, δ) cap. The change is a governance event in the ledger (old and
    new cap, the admin's key name as actor, the reason); past charges are never edited."""
    event = gateway.set_cap(
        population, epsilon=body.epsilon, delta=body.delta, actor=principal.name, reason=body.reason
    )
    return json_safe(event)


@v1.post(
    "/admin/populations/{population}/renew",
    tags=["admin"],
    status_code=409,
    summary="Renew (reset) a population's spent budget: always refused, with the arithmetic",
)
def renew_population(
    population: Annotated[str, Path(min_length=1, max_length=128)],
    body: schemas.RenewalRequest,
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SET_CAP))],
) -> dict[str, Any]:
    """Spent budget is never restored to the same units (issue 23): 409 ``renewal_refused`` with what a unit
    present in every period would lose after 12 and 36 periods at the cap's rate; a population with cohorts
    renews only by opening new cohorts. Raising the cap stays possible (``POST …/cap``, a recorded decision)."""
    gateway.renew(population, actor=principal.name, reason=body.reason)
    raise AssertionError("unreachable")  # pragma: no cover - renew always raises


@v1.get(
    "/admin/populations/{population}/cap-preview",
    tags=["admin"],
    summary="The membership-attack bound of the cap in force and of a proposed cap (changes nothing)",
)
def cap_preview(
    population: Annotated[str, Path(min_length=1, max_length=128)],
    gateway: GatewayDep,
    principal: Annotated[Principal, Depends(require(Permission.SET_CAP))],
    epsilon: Annotated[float, Query(gt=0, le=limits.MAX_CAP_EPSILON, allow_inf_nan=False)],
    delta: Annotated[float, Query(gt=0, lt=1, allow_inf_nan=False)],
) -> dict[str, Any]:
    """TPR bound at FPR = 1 % and the curve over FPR, before and after the proposed (ε, δ) (issue 23)."""
    from dpgate.budget_views import cap_change_preview

    if population not in gateway.ledger.populations():
        raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
    return json_safe(cap_change_preview(gateway.ledger, population, epsilon, delta))
