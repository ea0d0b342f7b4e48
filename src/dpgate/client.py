"""A Python client for a running dpgate gateway (``dpgate serve``), for notebooks and scripts.

Needs httpx (``pip install 'dpgate[client]'``; pandas is optional, for
:meth:`Release.to_pandas`). It speaks the documented HTTP API only
(``/v1/...``), so it works against any dpgate server, local or remote::

    from dpgate.client import Client, BudgetExhaustedError

    with Client("http://127.0.0.1:8000", api_key=ANALYST, dataset="usage") as dp:
        cost = dp.explain("SELECT region, COUNT(*) AS n FROM prompts GROUP BY region", rho=0.002)
        release = dp.query("SELECT region, COUNT(*) AS n FROM prompts GROUP BY region", rho=0.002)
        release.to_pandas()          # region, n, "n ±" (the 95 % half-width of each row)
        release.charge               # {"charge_id", "rho", "epsilon_at_delta", "delta", ...} or None
        release.cached               # True: served from the release store, nothing was spent
        dp.budget()                  # spent and remaining, per allocation

Every request's budget is one of ``rho`` (zCDP ρ of the release), ``epsilon``
(a standalone ε of the release at the δ the ledger charges it at; pure ε for the
Laplace mechanism) or ``ci95`` (the 95 % half-width wanted per cell, in output
units); none means the dataset's ``default_query_rho``. The server validates
them (a budget naming two is 400 ``invalid_budget``, which costs nothing).

Errors: every non-2xx answer carries the API's ``{"error": {"code", "message",
"details"}}`` and is raised as a :class:`DpgateClientError` subclass chosen by
its code family (:data:`ERROR_CLASSES`), with ``.code``, ``.message``,
``.details`` and ``.status``; a server that cannot be reached raises
:class:`GatewayUnreachable` (``code = "unreachable"``, ``status = None``).

This module imports neither the gateway nor its dependencies (DuckDB, OpenDP…):
only httpx, and pandas when :meth:`Release.to_pandas` is called.
"""

from __future__ import annotations

import json as _json
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

__all__ = [
    "Client",
    "Release",
    "DpgateClientError",
    "InvalidRequestError",
    "QueryRejected",
    "AuthenticationError",
    "PermissionDenied",
    "NotFoundError",
    "BudgetExhaustedError",
    "ConflictError",
    "ServerError",
    "QueryTimeoutError",
    "RenewalRefused",
    "RequestTimeoutError",
    "ServiceUnavailable",
    "GatewayUnreachable",
    "ERROR_CLASSES",
]

# --- errors ---------------------------------------------------------------------------------


class DpgateClientError(Exception):
    """Root of the client's errors: one error answer of the gateway (or none at all).

    Attributes:
        code: the API's stable error code (``budget_exhausted``, ``invalid_sql``, …;
            ``unreachable`` when no answer came, ``invalid_response`` for a non-JSON answer).
        message: the server's one-sentence message.
        details: the server's ``details`` object (e.g. ``requested``/``remaining`` of a
            refused charge); empty when none.
        status: the HTTP status, or None when no answer came.
    """

    def __init__(self, code: str, message: str, details: Mapping[str, Any] | None = None,
                 status: int | None = None) -> None:
        super().__init__(f"{message} [{code}]")
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.status = status


class InvalidRequestError(DpgateClientError):
    """The request is malformed (``invalid_request``, ``invalid_budget``, ``payload_too_large``,
    ``method_not_allowed``…). Nothing was charged."""


class QueryRejected(InvalidRequestError):
    """The SQL is refused before any charge: ``invalid_sql``, ``unsupported_query``,
    ``unknown_table``, ``unknown_column``. Nothing was charged."""


class AuthenticationError(DpgateClientError):
    """No API key or an unknown/revoked one (``unauthenticated``, 401)."""


class PermissionDenied(DpgateClientError):
    """The key's role may not do this (``forbidden``, 403): e.g. a dashboard key running a query."""


class NotFoundError(DpgateClientError):
    """``not_found``, ``unknown_dataset``, ``unknown_population``, ``unknown_consumer`` (404)."""


class BudgetExhaustedError(DpgateClientError):
    """The charge does not fit what is left (``budget_exhausted``, 409). Nothing was charged;
    ``details`` has ``requested``, ``spent``, ``cap`` and ``remaining`` (``{rho, epsilon}``)."""


class ConflictError(DpgateClientError):
    """``conflict`` (409): e.g. the same release is still being computed; retry later."""


class ServerError(DpgateClientError):
    """A server-side failure (5xx: ``internal``, ``execution_error``, ``ledger_error``,
    ``mechanism_error``, ``invalid_policy``). A charge written before it stays."""


class QueryTimeoutError(ServerError):
    """``query_timeout`` (504): the bounded query ran past the server's timeout (``details.charged``
    says whether it was charged; a charge stays, ``details.charge_id``)."""


class RenewalRefused(ConflictError):
    """``renewal_refused`` (409): restoring spent budget for the same units is refused; the
    message gives what a unit present in every period would lose, and the honest options."""


class RequestTimeoutError(InvalidRequestError):
    """``request_timeout`` (408): the request's headers or body did not arrive in time."""


class ServiceUnavailable(ServerError):
    """``ledger_unavailable`` or ``server_busy`` (503): try again after ``Retry-After`` seconds
    (``details`` may say which); nothing was charged."""


class GatewayUnreachable(DpgateClientError):
    """No HTTP answer: the server is down, the URL is wrong, or the connection broke."""


#: API error code → the class raised for it. Codes not listed fall back by HTTP status
#: (:func:`_error_class`).
ERROR_CLASSES: Mapping[str, type[DpgateClientError]] = {
    "invalid_request": InvalidRequestError,
    "invalid_budget": InvalidRequestError,
    "payload_too_large": InvalidRequestError,
    "method_not_allowed": InvalidRequestError,
    "not_acceptable": InvalidRequestError,
    "unsupported_media_type": InvalidRequestError,
    "too_many_requests": InvalidRequestError,
    "invalid_sql": QueryRejected,
    "unsupported_query": QueryRejected,
    "unknown_table": QueryRejected,
    "unknown_column": QueryRejected,
    "unauthenticated": AuthenticationError,
    "forbidden": PermissionDenied,
    "not_found": NotFoundError,
    "unknown_dataset": NotFoundError,
    "unknown_population": NotFoundError,
    "unknown_consumer": NotFoundError,
    "budget_exhausted": BudgetExhaustedError,
    "conflict": ConflictError,
    "renewal_refused": RenewalRefused,
    "request_timeout": RequestTimeoutError,
    "ledger_unavailable": ServiceUnavailable,
    "server_busy": ServiceUnavailable,
    "query_timeout": QueryTimeoutError,
    "internal": ServerError,
    "execution_error": ServerError,
    "ledger_error": ServerError,
    "mechanism_error": ServerError,
    "invalid_policy": ServerError,
}


def _error_class(code: str, status: int) -> type[DpgateClientError]:
    if code in ERROR_CLASSES:
        return ERROR_CLASSES[code]
    if status == 401:
        return AuthenticationError
    if status == 403:
        return PermissionDenied
    if status == 404:
        return NotFoundError
    if status == 409:
        return ConflictError
    if status >= 500:
        return ServerError
    return InvalidRequestError if 400 <= status < 500 else DpgateClientError


def _raise_for(response: Any) -> None:
    """Raise the typed error of a non-2xx response (the API's documented error shape)."""
    status = response.status_code
    try:
        body = response.json()
        error = body["error"]
        code, message = str(error["code"]), str(error["message"])
        details = error.get("details") or {}
    except (ValueError, KeyError, TypeError):
        text = (response.text or "")[:200]
        raise _error_class("invalid_response", status)(
            "invalid_response", f"HTTP {status} without the documented error body: {text!r}", {}, status) from None
    raise _error_class(code, status)(code, message, details, status)


# --- releases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Release:
    """One released answer (``POST /v1/queries`` or a stored release), as the API returned it.

    Attributes:
        release_id: the stored release's id (``GET /v1/releases/{id}`` serves it again, free).
        dataset: the dataset name.
        columns: output column names, in order.
        rows: the released rows (lists, in column order); noisy values are floats or ints.
        accuracy: per noisy output column, the API's accuracy entry: ``ci95`` (the 95 %
            half-width in the column's units; ``ci95_rows`` per row when they differ),
            ``mechanism``, ``sigma``/``scale``, ``coverage`` where an interval is not
            exactly 95 %, and for a quantile ``rank_error95`` (in ranks) instead.
        guarantee: the published guarantee the ledger enforced (population, privacy unit,
            cap ``{epsilon, delta, rho, alpha_cap, selection_delta, rule}``).
        charge: the ledger charge that paid for the release (``charge_id``, ``rho``,
            ``epsilon_at_delta``, ``delta``, ``consumer``), or None when this answer spent
            nothing (a cached release, a public-only query).
        cached: True when the answer was served from the release store at no cost.
        raw: the whole JSON document (bounds, noise scales, plan hash, budget, …).
    """

    release_id: str
    dataset: str
    columns: list[str]
    rows: list[list[Any]]
    accuracy: dict[str, dict[str, Any]]
    guarantee: dict[str, Any] | None
    charge: dict[str, Any] | None
    cached: bool
    raw: dict[str, Any] = field(repr=False)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Release":
        """A Release from the API's JSON document."""
        return cls(
            release_id=str(doc.get("release_id", "")),
            dataset=str(doc.get("dataset", "")),
            columns=list(doc.get("columns", [])),
            rows=[list(r) for r in doc.get("rows", [])],
            accuracy=dict(doc.get("accuracy") or {}),
            guarantee=doc.get("guarantee"),
            charge=doc.get("charge"),
            cached=bool(doc.get("cached", False)),
            raw=dict(doc),
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records())

    def error_columns(self) -> dict[str, list[float | None]]:
        """Per noisy output column, the error of each row: ``"<col> ±"`` (the 95 % half-width,
        or the interval's stated ``coverage`` when it is not 95 %, in the column's units) or,
        for a quantile, ``"<col> rank_error95"`` (in ranks: with probability ≥ 95 % the value
        has q·n ± that many values below it). None where no honest interval exists (the entry's
        ``reason`` says why) or the value is NULL. Output columns without an accuracy entry
        (keys, exact public values) get none."""
        out: dict[str, list[float | None]] = {}
        n = len(self.rows)
        for col in self.columns:
            acc = self.accuracy.get(col)
            if not isinstance(acc, Mapping):
                continue
            if acc.get("rank_error95") is not None:
                out[f"{col} rank_error95"] = [float(acc["rank_error95"])] * n
                continue
            per_row = acc.get("ci95_rows")
            if isinstance(per_row, list) and len(per_row) == n:
                out[f"{col} ±"] = [None if v is None else float(v) for v in per_row]
            elif acc.get("ci95") is not None or "reason" in acc or "ci95" in acc:
                value = acc.get("ci95")
                out[f"{col} ±"] = [None if value is None else float(value)] * n
        return out

    def records(self) -> list[dict[str, Any]]:
        """The rows as dicts (column → value), each noisy column followed by its error column
        (:meth:`error_columns`). No pandas needed."""
        errors = self.error_columns()
        order = self._column_order(errors)
        out = []
        for i, row in enumerate(self.rows):
            values = dict(zip(self.columns, row))
            out.append({name: (errors[name][i] if name in errors else values[name]) for name in order})
        return out

    def _column_order(self, errors: Mapping[str, list]) -> list[str]:
        order: list[str] = []
        for col in self.columns:
            order.append(col)
            order.extend(name for name in (f"{col} ±", f"{col} rank_error95") if name in errors)
        return order

    def to_pandas(self):
        """The rows as a :class:`pandas.DataFrame`: the output columns in order, each noisy one
        followed by its error column (:meth:`error_columns`: ``"<col> ±"`` or ``"<col>
        rank_error95"``). The release's metadata is in ``df.attrs`` (``release_id``,
        ``charge``, ``cached``, ``guarantee``, ``accuracy``).

        Raises:
            ImportError: pandas is not installed (``pip install pandas``).
        """
        try:
            import pandas as pd
        except ImportError as exc:  # pragma: no cover - exercised where pandas is absent
            raise ImportError("Release.to_pandas() needs pandas, which is not installed: pip install pandas "
                              "(or use Release.records() for plain dicts)") from exc
        errors = self.error_columns()
        order = self._column_order(errors)
        data = {col: [row[j] for row in self.rows] for j, col in enumerate(self.columns)}
        data.update(errors)
        df = pd.DataFrame({name: data[name] for name in order}, columns=order)
        df.attrs.update(release_id=self.release_id, charge=self.charge, cached=self.cached,
                        guarantee=self.guarantee, accuracy=self.accuracy)
        return df


# --- the client -----------------------------------------------------------------------------


class Client:
    """A connection to one dpgate gateway with one API key.

    Args:
        url: the gateway's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: the API key (sent as ``Authorization: Bearer …``). Its role decides what is
            allowed (analyst: query/explain/budget; dashboard: stored releases only; admin).
        dataset: the default dataset of :meth:`query`, :meth:`explain`, :meth:`budget` and
            :meth:`releases` (each also takes ``dataset=``).
        timeout: seconds per request (default 120: a large query may run for a while).
        transport: an httpx transport (tests, proxies); default httpx's.

    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, url: str, api_key: str | None = None, *, dataset: str | None = None,
                 timeout: float = 120.0, transport: Any = None) -> None:
        try:
            import httpx
        except ImportError as exc:  # pragma: no cover - httpx is in the client extra
            raise ImportError("dpgate.client needs httpx: pip install 'dpgate[client]'") from exc
        self._httpx = httpx
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.url = url.rstrip("/")
        self.dataset = dataset
        kwargs: dict[str, Any] = {"base_url": self.url, "headers": headers, "timeout": timeout}
        if transport is not None:
            kwargs["transport"] = transport
        self._http = httpx.Client(**kwargs)

    # -- plumbing --

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def _request(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        if json is not None:
            try:  # strict JSON (no NaN/∞), the encoding httpx uses: refuse here, before sending
                _json.dumps(json, allow_nan=False)
            except (ValueError, TypeError) as exc:
                raise InvalidRequestError("invalid_request", f"the request body cannot be sent as JSON: {exc}",
                                          {"path": path}, None) from None
        try:
            response = self._http.request(method, path, json=json, params=params)
        except self._httpx.HTTPError as exc:
            raise GatewayUnreachable("unreachable", f"no answer from {self.url}{path}: {exc}", {"url": self.url},
                                     None) from exc
        if response.status_code >= 400:
            _raise_for(response)
        try:
            return response.json()
        except ValueError:
            raise DpgateClientError("invalid_response", f"HTTP {response.status_code} answer is not JSON", {},
                                    response.status_code) from None

    def _dataset(self, dataset: str | None) -> str:
        name = dataset or self.dataset
        if not name:
            raise ValueError("name the dataset: dataset='…' (or Client(…, dataset='…'))")
        return name

    @staticmethod
    def _body(sql: str, dataset: str, *, rho: float | None, epsilon: float | None, ci95: float | None,
              expected_count: float | None, delta: float | None, dialect: str | None, mechanism: str | None,
              search_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"dataset": dataset, "sql": sql}
        budget = {k: v for k, v in (("rho", rho), ("epsilon", epsilon), ("ci95", ci95),
                                    ("expected_count", expected_count), ("delta", delta)) if v is not None}
        for key, value in budget.items():  # NaN/∞ cannot be written in JSON; say which field, as the server would
            if isinstance(value, float) and not math.isfinite(value):
                raise InvalidRequestError("invalid_budget", f"budget.{key} must be a finite number, got {value!r}",
                                          {"field": f"budget.{key}"}, None)
        if budget:
            body["budget"] = budget
        if dialect is not None:
            body["dialect"] = dialect
        if mechanism is not None:
            body["mechanism"] = mechanism
        if search_id is not None:
            body["search_id"] = search_id
        return body

    # -- queries --

    def query(self, sql: str, *, dataset: str | None = None, rho: float | None = None,
              epsilon: float | None = None, ci95: float | None = None, expected_count: float | None = None,
              delta: float | None = None, dialect: str | None = None, mechanism: str | None = None,
              search_id: str | None = None) -> Release:
        """Run one aggregate query (``POST /v1/queries``): charged to the key's allocation before
        any noise is drawn, unless the same release is stored (then free, ``cached``).

        Args:
            sql: the aggregate SQL.
            dataset: the dataset (default: the client's).
            rho / epsilon / ci95: the release's budget, at most one (see the module docstring);
                none: the dataset's ``default_query_rho``.
            expected_count: with ``ci95``, the rows per group expected (AVG/VAR/STDDEV).
            delta: the δ a query that selects keys privately may spend.
            dialect: the SQL dialect (``postgres``, ``bigquery``…; default DuckDB's).
            mechanism: ``"gaussian"`` (zCDP ρ) or ``"laplace"`` (pure ε); default the policy's.

        Raises:
            BudgetExhaustedError: it does not fit what is left (nothing charged).
            QueryRejected: the SQL is refused (nothing charged).
            DpgateClientError: any other error answer (its subclass by code).
        """
        body = self._body(sql, self._dataset(dataset), rho=rho, epsilon=epsilon, ci95=ci95,
                          expected_count=expected_count, delta=delta, dialect=dialect, mechanism=mechanism,
                          search_id=search_id)
        return Release.from_json(self._request("POST", "/v1/queries", json=body))

    def explain(self, sql: str, *, dataset: str | None = None, rho: float | None = None,
                epsilon: float | None = None, ci95: float | None = None, expected_count: float | None = None,
                delta: float | None = None, dialect: str | None = None, mechanism: str | None = None
                ) -> dict[str, Any]:
        """What a query would do and cost (``POST /v1/queries/explain``): plan hash, canonical and
        bounded SQL, sensitivities, ``cost`` (ρ, ε at the δ it would be charged at, whether it
        fits). Reads no data, charges nothing. Arguments as :meth:`query`."""
        body = self._body(sql, self._dataset(dataset), rho=rho, epsilon=epsilon, ci95=ci95,
                          expected_count=expected_count, delta=delta, dialect=dialect, mechanism=mechanism)
        return self._request("POST", "/v1/queries/explain", json=body)

    # -- reading --

    def budget(self, dataset: str | None = None) -> dict[str, Any]:
        """Spent and remaining budget of the dataset's population, in ρ and ε, per allocation
        (``GET /v1/datasets/{name}/budget``; analyst and admin keys)."""
        name = self._dataset(dataset)
        return self._request("GET", f"/v1/datasets/{_quote(name)}/budget")

    def releases(self, dataset: str | None = None, *, limit: int = 100) -> list[Release]:
        """Stored releases, newest first (``GET /v1/releases``; free for every role). With no
        dataset given and none set on the client, every dataset's."""
        params: dict[str, Any] = {"limit": limit}
        name = dataset or self.dataset
        if name:
            params["dataset"] = name
        doc = self._request("GET", "/v1/releases", params=params)
        return [Release.from_json(r) for r in doc.get("releases", [])]

    def release(self, release_id: str) -> Release:
        """One stored release by id (``GET /v1/releases/{id}``; free)."""
        return Release.from_json(self._request("GET", f"/v1/releases/{_quote(release_id)}"))

    def datasets(self) -> list[dict[str, Any]]:
        """Every dataset's published guarantee (``GET /v1/datasets``): population, the cap the
        ledger enforces, allocations, and per table the privacy unit, bounds and public keys."""
        return list(self._request("GET", "/v1/datasets").get("datasets", []))

    def dataset_info(self, dataset: str | None = None) -> dict[str, Any]:
        """One dataset's published guarantee (``GET /v1/datasets/{name}``)."""
        return self._request("GET", f"/v1/datasets/{_quote(self._dataset(dataset))}")

    def health(self) -> dict[str, Any]:
        """``GET /healthz`` (no key needed): ``{"status": "ok", "version"}``."""
        return self._request("GET", "/healthz")


def _quote(segment: str) -> str:
    from urllib.parse import quote

    return quote(segment, safe="")
