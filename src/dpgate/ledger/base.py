"""The privacy-budget ledger's contract: the :class:`Ledger` protocol.

A *population* (the people one budget protects) has a *cap* (ε, δ), fixed into
a budget curve when the cap is set, and *allocations*: named consumers, each
with a share of the population's budget. Every *charge* is one append-only
entry, written before the mechanism runs and never refunded. Cap and
allocation changes are recorded *governance events*, never edits.

**Who owns the cap.** A policy file's cap and allocations *create* a
population (:meth:`Ledger.ensure_population`). From then on the ledger is the
source of truth: ``ensure_population`` never changes an existing population,
it reports how the file differs (:class:`~dpgate.ledger.reports.PolicyDrift`).
Only a recorded governance event changes a cap or allocations: an admin's
:meth:`Ledger.set_cap`, or :meth:`Ledger.apply_policy` (``dpgate caps apply``),
which adopts a policy file's values.

The logic every backend shares lives in modules named after its concepts:

* :mod:`dpgate.ledger.validation` — names, free text, allocations, costs;
* :mod:`dpgate.ledger.caps` — caps fixed into budget curves (ρ_cap, α_cap);
* :mod:`dpgate.ledger.filter` — exact totals, the zCDP and Rényi filters, refusals;
* :mod:`dpgate.ledger.reports` — receipts, spend reports, cap changes, policy drift;
* :mod:`dpgate.ledger.entries` — entries, their hash chain and stored columns;
* :mod:`dpgate.ledger.replay` — recomputing the state from the entries (verify);

and the SQL that runs them on the common table layout is
:class:`dpgate.ledger.sql.SqlLedger` (backends: ``sqlite.py``, ``postgres.py``).
The names those modules export are re-exported here.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

from dpgate.accounting import Cost
from dpgate.ledger.caps import (
    FINITE_ORDERS,
    POPULATION_COLUMNS,
    LEDGER_RULE,
    LEDGER_RULE_DIFFERENCE,
    LEDGER_RULE_DOC,
    CapSpec,
    fix_epsilon_cap,
    fix_rho_cap,
    ledger_epsilon,
    ledger_rho,
    legacy_cap,
    optimal_order,
    order_epsilon,
    order_rho,
    population_from_row,
    validate_cap,
    validate_population,
)
from dpgate.ledger.entries import (
    CHARGE_COLUMNS,
    EVENT_COLUMNS,
    GENESIS_HASH,
    OPTIONAL_CHARGE_COLUMNS,
    STORED_CHARGE_COLUMNS,
    ChargeRequest,
    canonical_json,
    charge_entry,
    display_charge,
    display_event,
    entry_hash,
    event_entry,
    iter_sorted_entries,
    new_charge_entry,
    new_event_entry,
    prepare_charge,
    utc_now,
)
from dpgate.ledger.filter import (
    BudgetCurve,
    Decision,
    Refusal,
    Totals,
    charge_epsilon,
    charge_statement,
    check_charge,
    exhausted_error,
    filter_decision,
    rho_epsilon,
)
from dpgate.ledger.replay import Replay, VerifyReport, stored_state_problems
from dpgate.ledger.reports import (
    ChargeReceipt,
    ConsumerSpend,
    PolicyDrift,
    SpendReport,
    build_spend_report,
    cap_change_result,
    cap_standing,
    receipt_from_entry,
)
from dpgate.ledger.validation import (
    TOLERANCE,
    allocation_share,
    unknown_population,
    validate_allocations,
    validate_cost,
    validate_governance,
    validate_limit,
    validate_name,
    validate_text,
)

__all__ = [
    "Ledger",
    # validation
    "TOLERANCE", "allocation_share", "unknown_population", "validate_allocations", "validate_cost",
    "validate_governance", "validate_limit", "validate_name", "validate_text",
    # caps
    "FINITE_ORDERS", "POPULATION_COLUMNS", "CapSpec", "fix_epsilon_cap", "fix_rho_cap", "legacy_cap",
    "ledger_epsilon", "ledger_rho", "LEDGER_RULE", "LEDGER_RULE_DOC", "LEDGER_RULE_DIFFERENCE",
    "optimal_order", "order_epsilon", "order_rho", "population_from_row", "validate_cap", "validate_population",
    # filter
    "BudgetCurve", "Decision", "Refusal", "Totals", "charge_epsilon", "charge_statement", "check_charge",
    "exhausted_error",
    "filter_decision", "rho_epsilon",
    # reports
    "ChargeReceipt", "ConsumerSpend", "PolicyDrift", "SpendReport", "build_spend_report", "cap_change_result",
    "cap_standing", "receipt_from_entry",
    # entries
    "CHARGE_COLUMNS", "EVENT_COLUMNS", "GENESIS_HASH", "OPTIONAL_CHARGE_COLUMNS", "STORED_CHARGE_COLUMNS",
    "ChargeRequest", "canonical_json", "charge_entry", "display_charge", "display_event", "entry_hash",
    "event_entry", "iter_sorted_entries", "new_charge_entry", "new_event_entry", "prepare_charge", "utc_now",
    # replay
    "Replay", "VerifyReport", "stored_state_problems",
]  # fmt: skip


@runtime_checkable
class Ledger(Protocol):
    """A persistent privacy-budget ledger (see the module docstring for the rules).

    Implementations: :class:`dpgate.ledger.sqlite.SqliteLedger` (one SQLite file) and
    :class:`dpgate.ledger.postgres.PostgresLedger` (shared by several replicas).
    Every method is safe to call from several threads and processes at once.
    """

    def ensure_population(
        self,
        name: str,
        *,
        epsilon: float | None,
        delta: float,
        allocations: Mapping[str, float],
        actor: str = "policy",
        reason: str = "policy file",
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        composition: str | None = None,
    ) -> PolicyDrift:
        """Create population ``name`` from a policy file's values if absent; never change an
        existing one (the ledger owns its cap and allocations once created). ``composition``:
        ``"renyi"`` (None: the default) or ``"gdp"`` (the Gaussian-DP filter,
        :mod:`dpgate.ledger.filter`).

        Returns:
            The :class:`~dpgate.ledger.reports.PolicyDrift` of the file's values against the
            ledger's (``created`` True if this call created the population).

        Raises:
            PolicyError: invalid cap, allocations or name; nothing written.
            LedgerError: the store failed.
        """
        ...

    def apply_policy(
        self,
        name: str,
        *,
        epsilon: float | None,
        delta: float,
        allocations: Mapping[str, float],
        actor: str,
        reason: str,
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        cohort_column: str | None = None,
        composition: str | None = None,
    ) -> dict[str, Any]:
        """Adopt a policy file's cap and allocations for an existing population as recorded
        governance events (``cap_changed``, ``allocations_changed``, ``cohorts_changed``;
        nothing if equal). A different cohort column after a charge is refused
        (``RenewalRefused``: it would give the same units fresh budgets); so is a different
        ``composition`` (None: keep the ledger's) after a charge (``InvalidBudget``).

        Returns:
            ``{population, changed, events, cap, allocations, exhausted, spent, remaining,
            over_by, message}``.

        Raises:
            PolicyError: invalid values. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: store failure.
        """
        ...

    def set_cap(
        self,
        population: str,
        *,
        epsilon: float | None,
        delta: float,
        actor: str,
        reason: str,
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        composition: str | None = None,
    ) -> dict[str, Any]:
        """Record a cap change (governance event). Lowering it below the spend is allowed:
        every later charge is refused, and the result says so. ``composition`` (None: keep the
        current one) cannot change once the population has a charge (``InvalidBudget``).

        Returns:
            ``{population, changed, old, new, event_id, actor, reason, created_at, exhausted,
            spent, remaining, over_by, message}``.

        Raises:
            InvalidBudget: invalid cap. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: store failure.
        """
        ...

    def cap(self, population: str) -> CapSpec:
        """The cap in force (read-only). Raises UnknownPopulation."""
        ...

    def allocations(self, population: str) -> Mapping[str, float]:
        """The allocations in force, consumer → share of the cap (read-only; empty: an open
        population). One row read, no entry summed. Raises UnknownPopulation."""
        ...

    def charge(
        self,
        population: str,
        consumer: str,
        cost: Cost,
        *,
        purpose: str,
        release_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        selection_delta: float = 0.0,
        cohorts: Any = None,
    ) -> ChargeReceipt:
        """Atomically check the filters and append one charge (never refunded).

        Args:
            population, consumer: who pays.
            cost: this charge's cost (ρ or an RDP curve on ``ORDERS``).
            purpose: non-empty description (e.g. "query", a plan hash).
            release_key: single-flight key: if already charged for this
                population, nothing is written and the stored receipt is
                returned with ``duplicate=True``.
            metadata: JSON-serialisable mapping stored with the entry.
            selection_delta: δ_q spent on partition selection (approximate zCDP).
            cohorts: the cohorts the charge draws on — required for a population with cohorts
                (each cohort's filters run and each is charged the full cost, all or nothing),
                None otherwise.

        Raises:
            InvalidBudget: invalid cost, or a curve with no claim at a checked order.
            InvalidRequest: bad purpose, key or metadata.
            UnknownPopulation, UnknownConsumer: not found.
            BudgetExhausted: the consumer's or the population's filter refuses.
            LedgerError: store failure.
        """
        ...

    def spend(self, population: str) -> SpendReport:
        """The population's spend report (read-only). Raises UnknownPopulation."""
        ...

    def cohort_column(self, population: str) -> str | None:
        """The population's cohort column, or None (read-only)."""
        ...

    def cohort_spend(self, population: str) -> dict[str, SpendReport]:
        """Cohort → its spend report, for the cohorts charged so far (read-only)."""
        ...

    def entries(self, population: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Charges (ascending ``seq``; with ``limit``, the last ``limit``). Read-only."""
        ...

    def events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events, ascending ``seq``. Read-only."""
        ...

    def populations(self) -> list[str]:
        """Population names, sorted. Read-only."""
        ...

    def chain(self) -> list[dict[str, Any]]:
        """Every entry (charges and events) in ``seq`` order, exactly as hashed. Read-only."""
        ...

    def verify(self) -> VerifyReport:
        """Recompute the spend from the entries and check the hash chain. Read-only."""
        ...

    def close(self) -> None:
        """Release the store's resources."""
        ...
