"""The one error hierarchy of dpgate.

Every error the gateway raises on purpose is a :class:`DpgateError` with a
stable machine-readable ``code``, the HTTP status it maps to and a ``details``
mapping of JSON-serialisable values. The HTTP layer turns any of them into the
documented shape ``{"error": {"code", "message", "details"}}``.

Messages and details never contain data values read from a protected table
(they would be a side channel that no noise covers), nor stack traces.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping


class DpgateError(Exception):
    """Root of every dpgate error.

    Args:
        message: human-readable sentence naming what is wrong and, where it
            helps, what to do instead.
        details: JSON-serialisable mapping (no protected data values).

    Attributes:
        code: stable snake_case error code (class attribute).
        http_status: HTTP status code the API answers with (class attribute).
    """

    code: str = "internal"
    http_status: int = 500

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_dict(self) -> dict[str, Any]:
        """Return the documented error shape ``{"error": {code, message, details}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to ``word``, or ``""``.

    Closeness is :func:`difflib.get_close_matches` (ratio >= 0.6), case-insensitive.
    """
    options = {str(c).lower(): str(c) for c in choices}
    if not isinstance(word, str) or not options:
        return ""
    close = difflib.get_close_matches(word.lower(), list(options), n=1, cutoff=0.6)
    return f" (did you mean {options[close[0]]!r}?)" if close else ""


# --- 4xx: the request is wrong; nothing was charged -------------------------------------


class InvalidRequest(DpgateError):
    """A request body or argument fails validation (wrong type, missing field, bad value)."""

    code = "invalid_request"
    http_status = 400


class InvalidSql(DpgateError):
    """The SQL text does not parse, or is not exactly one statement."""

    code = "invalid_sql"
    http_status = 400


class UnsupportedQuery(DpgateError):
    """The SQL parses but uses a construct the gateway refuses (raw columns, joins, …)."""

    code = "unsupported_query"
    http_status = 400


class UnknownTable(DpgateError):
    """The query names a table the dataset's policy does not declare."""

    code = "unknown_table"
    http_status = 400


class UnknownColumn(DpgateError):
    """The query names a column the table's policy does not declare."""

    code = "unknown_column"
    http_status = 400


class InvalidBudget(DpgateError):
    """A requested budget is not a finite positive number, or names several currencies."""

    code = "invalid_budget"
    http_status = 400


class Unauthenticated(DpgateError):
    """No API key, or an API key that matches no principal."""

    code = "unauthenticated"
    http_status = 401


class Forbidden(DpgateError):
    """The principal's role may not perform this action."""

    code = "forbidden"
    http_status = 403


class NotFound(DpgateError):
    """A resource (release, route) does not exist."""

    code = "not_found"
    http_status = 404


class UnknownDataset(NotFound):
    """No policy declares a dataset of that name."""

    code = "unknown_dataset"
    http_status = 404

    @classmethod
    def named(cls, name: str, known: Iterable[str]) -> "UnknownDataset":
        """The error for ``name``, listing the datasets that exist (and the closest one).

        ``details``: ``dataset`` (the name asked for) and ``datasets`` (the known
        names, sorted).
        """
        names = sorted(known)
        if names:
            listed = ", ".join(names)
            message = f"unknown dataset {name!r}{did_you_mean(name, names)}; datasets: {listed}"
        else:
            message = f"unknown dataset {name!r}: no policy declares any dataset (see the policies folder)"
        return cls(message, {"dataset": name, "datasets": names})


class UnknownPopulation(NotFound):
    """The ledger has no population of that name."""

    code = "unknown_population"
    http_status = 404


class UnknownConsumer(NotFound):
    """The population has no allocation for that consumer."""

    code = "unknown_consumer"
    http_status = 404


class BudgetExhausted(DpgateError):
    """A charge does not fit the population's or the consumer's remaining budget.

    ``details`` carries ``requested``, ``spent``, ``cap`` and ``remaining``, each
    as ``{"rho": float, "epsilon": float}`` with ε at the cap's δ less its selection δ, plus
    ``population``, ``consumer`` and ``delta``. No charge was written.
    """

    code = "budget_exhausted"
    http_status = 409


class RenewalRefused(DpgateError):
    """An attempt to restore spent budget for the same units (a reset, a renewal, a dataset moved
    to a fresh population, cohorts switched on after charges) is refused: the units have lost
    what they spent, whatever the ledger says next. ``details`` carries the arithmetic: what a
    unit present in every period loses after 12 and 36 periods at the cap's rate."""

    code = "renewal_refused"
    http_status = 409


class Conflict(DpgateError):
    """The request conflicts with the current state (e.g. a release still being computed)."""

    code = "conflict"
    http_status = 409


class RequestTimeout(DpgateError):
    """The client did not send the request's headers or body within the server's read timeout
    (``Settings.http_header_timeout_s``, ``Settings.http_body_timeout_s``); the connection is closed."""

    code = "request_timeout"
    http_status = 408


class PayloadTooLarge(DpgateError):
    """The request body exceeds the configured size limit."""

    code = "payload_too_large"
    http_status = 413


# --- configuration and server-side failures -------------------------------------------


class PolicyError(DpgateError):
    """A policy file is invalid; the message names the file, table, column and problem."""

    code = "invalid_policy"
    http_status = 500


class LedgerError(DpgateError):
    """The ledger store failed or its integrity check found a problem."""

    code = "ledger_error"
    http_status = 500


class LedgerUnavailable(LedgerError):
    """The ledger's database (or a store in it: releases, searches) cannot be used right now: the
    SQLite file stayed locked by another writer, or cannot be opened; the PostgreSQL server is
    down, unreachable, or every pooled connection stayed busy — for longer than the request path
    waits (``Settings.ledger_wait_s``). The failed step wrote nothing (a charge written before it
    stays, as after any failure); try again (HTTP 503 with ``Retry-After``). A commit whose outcome
    is unknown is a :class:`LedgerError` (500), never this."""

    code = "ledger_unavailable"
    http_status = 503


class ServerBusy(DpgateError):
    """The server holds its cap of open connections or requests in flight
    (``Settings.http_max_connections``); try again (HTTP 503 with ``Retry-After``)."""

    code = "server_busy"
    http_status = 503


class QueryTimeout(DpgateError):
    """The bounded query ran past the engine's per-query timeout. ``details.charged``: False when
    it timed out before the charge (nothing was charged), True after it (the charge stays;
    ``details.charge_id`` names it)."""

    code = "query_timeout"
    http_status = 504


class ExecutionError(DpgateError):
    """Executing the bounded SQL failed (the charge stays; no data in the message)."""

    code = "execution_error"
    http_status = 500


class MechanismError(DpgateError):
    """Calibrating or sampling noise failed, or OpenDP's privacy map disagreed with ours."""

    code = "mechanism_error"
    http_status = 500


class Internal(DpgateError):
    """Any unexpected failure; the message never includes a stack trace or data."""

    code = "internal"
    http_status = 500


def policy_error(
    path: Any, problem: str, table: str | None = None, column: str | None = None
) -> PolicyError:
    """A :class:`PolicyError` naming where the problem is: the policy file, then the table and
    column when given (``details``: file, table, column, problem)."""
    where = [f"policy file {str(path)!r}" if path is not None else "policy"]
    if table is not None:
        where.append(f"table {table!r}")
    if column is not None:
        where.append(f"column {column!r}")
    return PolicyError(
        f"{', '.join(where)}: {problem}",
        {"file": str(path) if path else None, "table": table, "column": column, "problem": problem},
    )
