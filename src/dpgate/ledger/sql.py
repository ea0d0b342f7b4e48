"""The SQL plumbing both ledger backends share (:class:`SqlLedger`).

Every decision, report, entry and hash comes from :mod:`dpgate.ledger.base`; this module holds
what the SQLite and PostgreSQL backends do *with SQL* in the same way: the statements on the
common layout (``populations``, ``events``, ``charges``, ``spend_totals``, ``chain_head``), the
governance and charge transactions, the reads and the replay of :meth:`SqlLedger.verify`.

A backend subclass keeps only what is its own and fills these hooks:

* :attr:`SqlLedger._PARAM` — the driver's placeholder (``?`` for ``sqlite3``, ``%s`` for
  psycopg); every shared statement is built with it once per class;
* :meth:`SqlLedger._begin` — one transaction (write: serialised against every other writer of
  the hash chain; read: one consistent snapshot), committed on success and rolled back on
  error, yielding an *executor* (an object with DB-API ``execute(query, params)`` returning a
  cursor, and ``executemany``) and turning driver errors into :class:`~dpgate.errors.LedgerError`;
* :attr:`SqlLedger._HEAD_LOCK` — a statement run first in every write transaction that locks
  the chain-head row and returns ``(seq, hash)`` (PostgreSQL ``SELECT … FOR UPDATE``), or None
  when the transaction itself already excludes every other writer (SQLite ``BEGIN IMMEDIATE``;
  the head is then read when first needed);
* :meth:`SqlLedger._flag` (how a boolean column is written), :attr:`SqlLedger._NAME_ORDER` (the
  binary collation of population names), :meth:`SqlLedger._entry_streams` (how
  :meth:`~SqlLedger.verify` streams the entries), :meth:`SqlLedger._trigger_names`,
  :attr:`SqlLedger._REQUIRED_TRIGGERS` and :attr:`SqlLedger._MIGRATIONS` (what
  :meth:`~SqlLedger.verify` requires).

Connection management, pragmas and pooling, the schema DDL and triggers, migrations and the
locking itself stay in ``sqlite.py`` and ``postgres.py``. The statements themselves,
:class:`SqlTransaction` and :func:`orders_json` are in :mod:`dpgate.ledger.sql_statements`
(importable from here as before).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from typing import Any, ClassVar, Iterable, Iterator, Mapping

from dpgate.accounting import Cost
from dpgate.errors import InvalidRequest, PolicyError
from dpgate.ledger.browse import LedgerBrowsing
from dpgate.ledger.cohorts import CohortStore, check_cohort_charge, cohort_refusal_error, totals_from_text
from dpgate.ledger.caps import CapSpec, new_composition, population_from_row, validate_cap, validate_population
from dpgate.ledger.entries import (
    EVENT_COLUMNS,
    STORED_CHARGE_COLUMNS,
    canonical_json,
    charge_entry,
    display_charge,
    display_event,
    event_entry,
    iter_sorted_entries,
    new_charge_entry,
    new_event_entry,
    prepare_charge,
    utc_now,
)
from dpgate.ledger.filter import Totals, charge_statement, check_charge
from dpgate.ledger.replay import Replay, VerifyReport, stored_state_problems
from dpgate.ledger.reports import (
    ChargeReceipt,
    PolicyDrift,
    SpendReport,
    build_spend_report,
    cap_change_result,
    cap_standing,
    receipt_from_entry,
)
from dpgate.ledger.validation import (
    allocation_share,
    unknown_population,
    validate_governance,
    validate_limit,
    validate_name,
)
from dpgate.ledger.sql_statements import _HEAD_SELECT, SqlTransaction, _Statements, orders_json

__all__ = ["SqlLedger", "SqlTransaction", "orders_json"]


class SqlLedger(LedgerBrowsing, CohortStore):
    """The ledger's operations on the common SQL layout (implements :class:`dpgate.ledger.base.Ledger`
    together with a backend subclass that provides the hooks listed in :mod:`dpgate.ledger.sql`).

    Not used directly: open :class:`dpgate.ledger.sqlite.SqliteLedger` or
    :class:`dpgate.ledger.postgres.PostgresLedger` (or :func:`dpgate.ledger.open_ledger`).
    Subclasses call ``super().__init__()`` before their first transaction.
    """

    #: The driver's placeholder ("?" or "%s").
    _PARAM: ClassVar[str] = "?"
    #: ORDER BY expression listing population names in binary (code point) order.
    _NAME_ORDER: ClassVar[str] = "name"
    #: Statement locking the chain-head row and returning (seq, hash), run first in every
    #: write transaction; None when :meth:`_begin` already excludes every other writer.
    _HEAD_LOCK: ClassVar[str | None] = None
    #: The append-only triggers :meth:`verify` requires.
    _REQUIRED_TRIGGERS: ClassVar[tuple[str, ...]] = ()
    #: The backend's schema migrations ``(version, name, statements)``; :meth:`verify`
    #: requires every version to be recorded.
    _MIGRATIONS: ClassVar[tuple[tuple[int, str, tuple[str, ...]], ...]] = ()
    _sql: ClassVar[_Statements] = _Statements.build("?")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._sql = _Statements.build(cls._PARAM)

    def __init__(self) -> None:
        # the δ at which each population's ρ converts (cap δ − selection δ), last seen: lets a
        # charge compute its ε outside the write transaction (recomputed inside if it changed)
        self._delta_hint: dict[str, float] = {}

    # -- hooks ---------------------------------------------------------------------------

    def _begin(self, *, write: bool) -> AbstractContextManager[Any]:
        """One transaction yielding the backend's executor (see the module docstring)."""
        raise NotImplementedError

    @staticmethod
    def _flag(value: bool) -> Any:
        """A boolean as stored in a boolean column (``rho_stated``)."""
        return value

    @contextmanager
    def _entry_streams(self, tx: SqlTransaction) -> Iterator[tuple[Iterable[Any], Iterable[Any]]]:
        """Charge rows and event rows, each in ``seq`` order, to be read interleaved.

        This default needs an executor whose ``execute`` returns a new cursor each
        time (``sqlite3.Connection``); PostgreSQL overrides it with server-side cursors.
        """
        yield (tx.execute(self._sql.charges + " ORDER BY seq"),
               tx.execute(self._sql.events + " ORDER BY seq"))

    def _trigger_names(self, tx: SqlTransaction) -> set[str]:
        """Names of the (enabled) triggers on the ledger's tables."""
        raise NotImplementedError

    # -- transactions and shared steps -----------------------------------------------------

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[SqlTransaction]:
        with self._begin(write=write) as executor:
            tx = SqlTransaction(executor)
            if write and self._HEAD_LOCK is not None:
                tx.lock_head(self._HEAD_LOCK)
            yield tx

    def _population_row(self, tx: SqlTransaction, name: str) -> tuple[CapSpec, dict[str, float]] | None:
        row = tx.execute(self._sql.population, (name,)).fetchone()
        return None if row is None else population_from_row(row)

    def _move_head(self, tx: SqlTransaction, entry: Mapping[str, Any]) -> None:
        tx.execute(self._sql.move_head, (entry["seq"], entry["hash"]))
        tx.set_head(entry["seq"], entry["hash"])

    def _append_event(
        self,
        tx: SqlTransaction,
        population: str,
        kind: str,
        actor: str,
        reason: str,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Append one governance event after the chain head and move the head."""
        seq, prev_hash = tx.head()
        entry = new_event_entry(population, kind, actor, reason, old, new, seq=seq + 1, prev_hash=prev_hash)
        tx.execute(self._sql.insert_event, tuple(entry[c] for c in EVENT_COLUMNS))
        self._move_head(tx, entry)
        return entry

    def _totals(self, tx: SqlTransaction, population: str, consumer: str) -> tuple[Totals, Totals]:
        pt = ct = Totals()
        for row in tx.execute(self._sql.totals, (population, consumer)):
            t = Totals.from_row(*row[1:])
            if row[0] == "":
                pt = t
            else:
                ct = t
        return pt, ct

    def _apply_cap(self, tx: SqlTransaction, name: str, old: CapSpec, new: CapSpec,
                   actor: str, reason: str) -> dict[str, Any]:
        tx.execute(self._sql.update_cap,
                   (new.epsilon, new.delta, new.rho_cap, new.alpha_star, self._flag(new.rho_stated),
                    new.alpha_cap, new.selection_delta, new.composition if new.gdp else None, name))
        return self._append_event(tx, name, "cap_changed", actor, reason, old.to_dict(), new.to_dict())

    def _apply_allocations(self, tx: SqlTransaction, name: str, old: Mapping[str, float],
                           new: Mapping[str, float], actor: str, reason: str) -> dict[str, Any]:
        tx.execute(self._sql.update_allocations, (canonical_json(dict(new)), name))
        return self._append_event(tx, name, "allocations_changed", actor, reason,
                                  {"allocations": dict(old)}, {"allocations": dict(new)})

    # -- governance ----------------------------------------------------------------------

    def ensure_population(
        self,
        name: str,
        *,
        epsilon: float | None = None,
        delta: float,
        allocations: Mapping[str, float] | None = None,
        actor: str = "policy",
        reason: str = "policy file",
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        cohort_column: str | None = None,
        composition: str | None = None,
    ) -> PolicyDrift:
        """Create population ``name`` from a policy file's values if it is absent; never change
        an existing population.

        The cap (ε, δ) is fixed into its budget curve by :func:`dpgate.ledger.caps.validate_cap`
        (ρ_cap and α_cap on the ledger's order grid; ``rho_cap`` states the budget in ρ instead).
        Creation is recorded as a ``population_created`` event. Once a population exists, the
        ledger owns its cap and allocations: a policy file that states other values changes
        nothing here (a restart, a deploy or a CLI command must not undo an admin's change or
        renew spent budget); the returned drift says how they differ, and :meth:`apply_policy`
        (``dpgate caps apply``) adopts them as a recorded governance event. Idempotent, also when
        several processes or replicas start at once (one write transaction).

        Args:
            name: population name (1-128 characters ``[A-Za-z0-9._:@/+-]``).
            epsilon: cap ε > 0 (total), or None with ``rho_cap``.
            delta: cap δ in (0, 1).
            allocations: consumer → share in [0, 1], summing to ≤ 1; empty or
                None: an open population (any consumer, held to the population's
                budget only).
            actor, reason: recorded with the creation event (non-empty).
            rho_cap: the budget in ρ (total), instead of ε.
            selection_delta: the part of δ reserved for partition selection (default 0).
            cohort_column: the population's cohort column (one budget per cohort,
                :mod:`dpgate.ledger.cohorts`), or None; recorded in the creation event. composition:
                ``"renyi"`` (None: the default) or ``"gdp"`` (:mod:`dpgate.ledger.filter`).

        Returns:
            :class:`~dpgate.ledger.reports.PolicyDrift`: the file's values against the
            ledger's (``created`` True if this call created the population).

        Raises:
            PolicyError: invalid name, cap, allocations, actor or reason (nothing written).
            LedgerError: the store failed.
        """
        cap, allocs = validate_population(name, epsilon, delta, allocations, actor, reason, rho_cap,
                                          selection_delta, composition)
        if cohort_column is not None:
            validate_name(cohort_column, "cohort_column", PolicyError)
        with self._tx(write=False) as tx:  # the common case (it exists) takes no write lock
            current = self._population_row(tx, name)
            ledger_column = None if current is None else self._cohort_column(tx, name)
        created = False
        if current is None:
            with self._tx(write=True) as tx:
                current = self._population_row(tx, name)
                if current is None:
                    tx.execute(self._sql.insert_population,
                               (name, cap.epsilon, cap.delta, cap.rho_cap, cap.alpha_star,
                                self._flag(cap.rho_stated), canonical_json(allocs), cap.alpha_cap,
                                cap.selection_delta, cap.composition if cap.gdp else None, utc_now()))
                    new: dict[str, Any] = {"cap": cap.to_dict(), "allocations": allocs}
                    if cohort_column is not None:  # only when set: earlier events hash as they were
                        new["cohort_column"] = cohort_column
                        self._set_cohort_column(tx, name, cohort_column)
                    self._append_event(tx, name, "population_created", actor, reason, None, new)
                    current, created, ledger_column = (cap, allocs), True, cohort_column
                else:
                    ledger_column = self._cohort_column(tx, name)
        ledger_cap, ledger_allocs = current
        self._delta_hint[name] = ledger_cap.rho_delta
        return PolicyDrift(name, ledger_cap, ledger_allocs, cap, allocs, created, ledger_column, cohort_column,
                           composition)

    def apply_policy(
        self,
        name: str,
        *,
        epsilon: float | None = None,
        delta: float,
        allocations: Mapping[str, float] | None = None,
        actor: str,
        reason: str,
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        cohort_column: str | None = None,
        composition: str | None = None,
    ) -> dict[str, Any]:
        """Adopt a policy file's cap and allocations for population ``name`` (``dpgate caps apply``):
        a ``cap_changed`` event if the cap differs (also when only its rule does: a legacy cap is
        re-fixed by the α_cap rule; ``composition`` None keeps the ledger's, a stated one is adopted
        only while the population has no charge, :func:`~dpgate.ledger.caps.new_composition`),
        an ``allocations_changed`` event if the allocations differ, both with ``actor`` and
        ``reason``; nothing if both are equal. Charges are never refunded or rewritten: a cap below
        what was spent refuses every later charge, and the result says by how much it is exceeded.

        Args:
            name: an existing population.
            epsilon, delta, rho_cap, selection_delta: the file's cap (see :meth:`ensure_population`).
            allocations: the file's allocations.
            actor: who adopts them (non-empty). reason: why (non-empty).
            cohort_column: the file's cohort column: adopted (``cohorts_changed`` event) only
                while the population has no charge; after one it would renew spent budget and
                is refused (:func:`dpgate.ledger.renewal.renewal_refused`).
            composition: the file's ``[budget] composition`` (``"renyi"``/``"gdp"``), or None (keep).

        Returns:
            ``{population, changed, events, cap, allocations, exhausted, spent, remaining,
            over_by, message}`` (``events``: the recorded events' ``{event_id, kind}``;
            ``cap``: the cap now in force, as ``CapSpec.to_dict``).

        Raises:
            PolicyError: invalid values. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: the store failed.
            RenewalRefused: the cohort column differs and the population has charges.
            InvalidBudget: ``composition`` differs from the ledger's and the population has charges.
        """
        validate_governance(actor, reason)
        cap, allocs = validate_population(name, epsilon, delta, allocations, actor, reason, rho_cap,
                                          selection_delta, composition)
        if cohort_column is not None:
            validate_name(cohort_column, "cohort_column", PolicyError)
        events: list[dict[str, Any]] = []
        with self._tx(write=True) as tx:
            current = self._population_row(tx, name)
            if current is None:
                raise unknown_population(name)
            old_cap, old_allocs = current
            old_column = self._cohort_column(tx, name)
            if old_column != cohort_column:  # cohorts hook (issue 23): never renews spent budget
                if self._has_charges(tx, name):
                    from dpgate.ledger.renewal import renewal_refused

                    what = (f"switching population {name!r} to cohorts ({cohort_column!r})" if old_column is None
                            else f"changing the cohort rule of population {name!r} from {old_column!r} to "
                                 f"{cohort_column!r}")
                    raise renewal_refused(name, old_cap, what + " after it was charged", cohort_column=old_column)
                self._set_cohort_column(tx, name, cohort_column)
                events.append(self._append_event(tx, name, "cohorts_changed", actor, reason,
                                                 {"cohort_column": old_column}, {"cohort_column": cohort_column}))
            if composition is None:  # the file states none: the ledger's is kept
                cap = replace(cap, composition=old_cap.composition) if old_cap.gdp and not cap.rho_stated else cap
            elif composition != old_cap.composition:  # fixed before the first charge (caps.new_composition)
                new_composition(name, old_cap, composition, cap.rho_stated, lambda: self._has_charges(tx, name))
            if not old_cap.same_cap(cap):
                events.append(self._apply_cap(tx, name, old_cap, cap, actor, reason))
            else:
                cap = old_cap
            if old_allocs != allocs:
                events.append(self._apply_allocations(tx, name, old_allocs, allocs, actor, reason))
            pt, _ = self._totals(tx, name, "")
        self._delta_hint[name] = cap.rho_delta
        standing = cap_standing(cap, pt)
        out: dict[str, Any] = {
            "population": name, "changed": bool(events), "cohort_column": cohort_column,
            "events": [{"event_id": e["event_id"], "kind": e["kind"]} for e in events],
            "cap": cap.to_dict(), "allocations": allocs, "actor": actor, "reason": reason,
        }
        out.update(standing)
        if standing["over_by"] is not None:
            out["message"] = (f"population {name!r} now spends more than its cap allows (rho "
                              f"{standing['over_by']['rho']:.6g} over); every further charge is refused")
        elif events:
            out["message"] = f"population {name!r} now enforces the policy file's values"
        else:
            out["message"] = f"population {name!r} already enforces the policy file's values"
        return out

    def set_cap(
        self,
        population: str,
        *,
        epsilon: float | None = None,
        delta: float,
        actor: str,
        reason: str,
        rho_cap: float | None = None,
        selection_delta: float | None = None,
        composition: str | None = None,
    ) -> dict[str, Any]:
        """Change a population's cap: a recorded ``cap_changed`` event, never an edit.

        The new cap is fixed into a new budget curve (see :meth:`ensure_population`). Lowering it
        below what was already spent is allowed; every later charge is then refused, the remaining
        budget is reported as 0, and the result says so (``exhausted``, ``over_by``). Charges are
        never refunded or rewritten. A cap equal to the current one (same values, same rule)
        records nothing (``changed`` is False).

        Args:
            population: the population.
            epsilon: new cap ε > 0 (total), or None with ``rho_cap``.
            delta: new cap δ in (0, 1).
            actor: who made the change (non-empty). reason: why (non-empty).
            rho_cap: the new budget in ρ (total), instead of ε.
            selection_delta: the part of δ reserved for partition selection (None: keep the
                current one if it is below the new δ, else 0).
            composition: ``"renyi"``, ``"gdp"`` or None (:func:`~dpgate.ledger.caps.new_composition`).

        Returns:
            ``{population, changed, old, new, event_id, actor, reason, created_at, exhausted,
            spent, remaining, over_by, message}``; ``old``/``new`` as ``CapSpec.to_dict``;
            ``spent``/``remaining`` ``{rho, epsilon}`` under the cap now in force;
            ``over_by`` None or ``{rho, epsilon}`` by which the spend exceeds it.

        Raises:
            InvalidBudget: invalid cap. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        validate_name(population, "population")
        validate_cap(epsilon, delta, rho_cap=rho_cap, selection_delta=selection_delta, composition=composition)
        validate_governance(actor, reason)
        event = None
        with self._tx(write=True) as tx:
            current = self._population_row(tx, population)
            if current is None:
                raise unknown_population(population)
            old = current[0]
            sel = selection_delta
            if sel is None:
                sel = old.selection_delta if old.selection_delta < delta else 0.0
            comp = new_composition(population, old, composition, rho_cap is not None,
                                   lambda: self._has_charges(tx, population))
            cap = validate_cap(epsilon, delta, rho_cap=rho_cap, selection_delta=sel, composition=comp)
            if not old.same_cap(cap):
                event = self._apply_cap(tx, population, old, cap, actor, reason)
            pt, _ = self._totals(tx, population, "")
        in_force = cap if event is not None else old
        self._delta_hint[population] = in_force.rho_delta
        return cap_change_result(population, old, cap, event, actor, reason, cap_standing(in_force, pt))

    def cap(self, population: str) -> CapSpec:
        """The cap in force for ``population`` (read-only).

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:
            current = self._population_row(tx, population)
        if current is None:
            raise unknown_population(population)
        return current[0]

    def allocations(self, population: str) -> Mapping[str, float]:
        """The allocations in force for ``population`` (consumer → share; empty: an open
        population). Reads the population's row only (no entry is summed, unlike :meth:`spend`).

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:
            current = self._population_row(tx, population)
        if current is None:
            raise unknown_population(population)
        return dict(current[1])

    # -- charging ------------------------------------------------------------------------

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
        cohorts: Iterable[str] | None = None,
    ) -> ChargeReceipt:
        """Atomically check the consumer's and the population's filter and append one charge.

        One write transaction that excludes every other writer of the ledger for its whole length,
        across threads, processes and (PostgreSQL) replicas — SQLite: ``BEGIN IMMEDIATE``;
        PostgreSQL: READ COMMITTED with the chain-head row locked first (``SELECT … FOR UPDATE``):
        read the cap, allocations and exact totals; return the stored receipt if ``release_key``
        was charged before (single flight); decide with :func:`dpgate.ledger.filter.check_charge`
        (zCDP filter and one fixed-order Rényi filter per checked order: Feldman & Zrnic 2021,
        "Individual privacy accounting via a Rényi filter", Thm. 3.1; Whitehouse et al. 2023,
        "Fully-adaptive composition in differential privacy"; or, for a cap of composition
        ``"gdp"``, the Gaussian-DP filter, Smith & Thakurta 2022) against share × B(α) for the
        consumer and B(α) = α·ρ_cap for the population (and the selection δ for
        ``selection_delta``); append the hash-chained entry; update the totals and the chain
        head; commit. The charge is never refunded.

        Args:
            population: the population charged.
            consumer: the allocation charged (any name for an open population).
            cost: the cost of this charge (``Cost.zcdp(ρ)``, ``Cost.continuous_gaussian(ρ)``,
                ``Cost.rdp(curve)`` on ``accounting.ORDERS``, ``Cost.pure(ε)``, …).
            purpose: non-empty description stored with the entry.
            release_key: single-flight key (e.g. the release cache key), or None.
            metadata: JSON-serialisable mapping stored with the entry (no NaN/inf).
            selection_delta: δ_q spent on private partition selection (default 0).
            cohorts: for a population with cohorts (:mod:`dpgate.ledger.cohorts`), the cohorts
                the charge draws on (required, non-empty): each cohort's own filters run instead
                of the population's (all must admit it) and each is charged the full cost. None
                for a population without cohorts.

        Returns:
            :class:`~dpgate.ledger.reports.ChargeReceipt` (``duplicate=True`` if
            ``release_key`` had been charged: nothing new written), with the cap in force.

        Raises:
            InvalidBudget: invalid cost (NaN, negative, zero, wrong grid), a curve with no claim (∞)
                at an order the population's cap checks, or a charge without a GDP claim in a
                population of composition ``"gdp"``.
            InvalidRequest: invalid name, purpose, release_key, metadata or cohorts; cohorts missing
                for a population with cohorts, or given for one without.
            UnknownPopulation: no such population. UnknownConsumer: no allocation for ``consumer``.
            BudgetExhausted: a filter refuses (details: the rule, the order that failed and by how
                much, requested/spent/cap/remaining in ρ and ε); nothing written.
            LedgerError: the store failed, or stayed busy (locked by another writer) past the
                backend's busy or lock timeout; ``details["outcome"] == "unknown"`` when the commit
                itself failed (the charge may or may not exist).
        """
        req = prepare_charge(population, consumer, cost, purpose=purpose, release_key=release_key,
                             metadata=metadata, selection_delta=selection_delta, cohorts=cohorts)
        cost = req.cost
        hint = self._delta_hint.get(population)
        stated = charge_statement(cost, hint) if hint is not None else None  # outside the write transaction
        refusal = None
        cohort_refusal = None
        receipt: ChargeReceipt | None = None
        with self._tx(write=True) as tx:
            current = self._population_row(tx, population)
            if current is None:
                raise unknown_population(population)
            cap, allocs = current
            share = allocation_share(population, consumer, allocs)
            column = self._cohort_column(tx, population)  # cohorts hook (issue 23)
            if (column is None) != (req.cohorts is None):
                raise InvalidRequest(
                    f"population {population!r} has cohorts ({column!r}): a charge names the cohorts it draws on"
                    if column is not None else
                    f"population {population!r} has no cohorts: a charge to it names none",
                    {"population": population, "cohort_column": column})
            if release_key is not None:
                row = tx.execute(self._sql.charge_by_release_key, (population, release_key)).fetchone()
                if row is not None:
                    receipt = receipt_from_entry(charge_entry(row), duplicate=True, cap=cap)
            if receipt is None:
                pt, ct = self._totals(tx, population, consumer)
                cohort_after = None
                if req.cohorts is None:
                    pt_after, ct_after, refusal = check_charge(population, consumer, cost, cap, share, pt, ct,
                                                               req.selection_delta)
                else:  # each cohort's filters, all or nothing; the population's totals only add up
                    pt_after, ct_after = pt.add(cost, req.selection_delta), ct.add(cost, req.selection_delta)
                    cohort_after, cohort_refusal = check_cohort_charge(
                        population, consumer, cost, cap, share,
                        self._cohort_totals(tx, population, consumer, req.cohorts), req.selection_delta)
                    refusal = None if cohort_refusal is None else cohort_refusal[1]
                if refusal is None:
                    if stated is None or hint != cap.rho_delta or cap.gdp:
                        stated = charge_statement(cost, cap.rho_delta, gdp=cap.gdp)
                    seq, prev_hash = tx.head()
                    entry = new_charge_entry(req, seq=seq + 1, prev_hash=prev_hash, epsilon_at_delta=stated[0],
                                             delta=stated[1])
                    tx.execute(self._sql.insert_charge, tuple(entry.get(c) for c in STORED_CHARGE_COLUMNS))
                    tx.executemany(self._sql.upsert_totals, [(population, "", *pt_after.to_row()),
                                                             (population, consumer, *ct_after.to_row())])
                    if cohort_after is not None:
                        self._store_cohort_totals(tx, population, consumer, cohort_after)
                    self._move_head(tx, entry)
                    receipt = receipt_from_entry(entry, duplicate=False, cost=cost, cap=cap)
        self._delta_hint[population] = cap.rho_delta
        if cohort_refusal is not None:
            raise cohort_refusal_error(cohort_refusal[0], req.cohorts or (), cohort_refusal[1])
        if refusal is not None:
            raise refusal.error()
        assert receipt is not None
        return receipt

    # -- reading -------------------------------------------------------------------------

    def populations(self) -> list[str]:
        """Population names, sorted by code point (read-only).

        Raises:
            LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:
            return [r[0] for r in tx.execute(f"SELECT name FROM populations ORDER BY {self._NAME_ORDER}")]

    def spend(self, population: str) -> SpendReport:
        """Spent and remaining budget of ``population`` and of each consumer (read-only,
        one snapshot).

        ρ totals are exact sums of the entries; ε is at the cap's δ less its selection δ by the
        ledger's one conversion (see
        :func:`dpgate.ledger.base.build_spend_report`).

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:
            current = self._population_row(tx, population)
            if current is None:
                raise unknown_population(population)
            rows = tx.execute(self._sql.spend_totals, (population,)).fetchall()
        cap, allocs = current
        totals = {r[0]: Totals.from_row(*r[1:]) for r in rows}
        pt = totals.pop("", Totals())
        return build_spend_report(population, cap, allocs, pt, totals)

    def entries(self, population: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Charges in ``seq`` order (read-only); with ``limit``, the most recent ``limit``.

        Each dict: seq, charge_id, population, consumer, kind, rho, epsilon_at_delta,
        delta, cost (dict), purpose, release_key, metadata (dict), created_at,
        prev_hash, hash, type ("charge").

        Raises:
            InvalidRequest: ``limit`` not a positive integer. LedgerError: store failure.
        """
        validate_limit(limit)
        query = self._sql.charges
        args: list[Any] = []
        if population is not None:
            query += self._sql.where_population
            args.append(population)
        query += " ORDER BY seq DESC"
        if limit is not None:
            query += self._sql.limit
            args.append(limit)
        with self._tx(write=False) as tx:
            rows = tx.execute(query, args).fetchall()
        return [display_charge(charge_entry(r)) for r in reversed(rows)]

    def events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events in ``seq`` order (read-only).

        Each dict: seq, event_id, population, kind ("population_created",
        "cap_changed", "allocations_changed"), actor, reason, old, new (dicts),
        created_at, prev_hash, hash, type ("event").

        Raises:
            LedgerError: the store failed.
        """
        query = self._sql.events
        args: tuple = ()
        if population is not None:
            query += self._sql.where_population
            args = (population,)
        with self._tx(write=False) as tx:
            rows = tx.execute(query + " ORDER BY seq", args).fetchall()
        return [display_event(event_entry(r)) for r in rows]

    def chain(self) -> list[dict[str, Any]]:
        """Every entry (charges and events) in ``seq`` order, exactly as hashed (read-only).

        ``cost``, ``metadata``, ``old`` and ``new`` are the stored JSON texts, so
        :func:`dpgate.ledger.base.entry_hash` of each dict reproduces its ``hash``
        and an auditor can check the chain outside dpgate.

        Raises:
            LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:
            charges = [charge_entry(r) for r in tx.execute(self._sql.charges + " ORDER BY seq").fetchall()]
            events = [event_entry(r) for r in tx.execute(self._sql.events + " ORDER BY seq").fetchall()]
        return list(iter_sorted_entries(charges, events))

    def verify(self) -> VerifyReport:
        """Check the ledger's integrity (read-only; one consistent snapshot).

        Recomputes, from the entries alone (:class:`dpgate.ledger.base.Replay`, entries
        streamed): the hash chain (consecutive ``seq``, ``prev_hash`` links, every
        hash), the caps and allocations in force, the exact spend per population and
        consumer, and that every charge fitted its filters when written; then
        compares with the stored derived state (populations, spend totals, chain
        head) and checks that the append-only triggers exist (PostgreSQL: and are
        enabled) and that every schema migration is recorded
        (:func:`dpgate.ledger.base.stored_state_problems`).

        Returns:
            :class:`~dpgate.ledger.base.VerifyReport` (``ok`` False with one
            sentence per problem, e.g. after a row was edited with the triggers
            dropped).

        Raises:
            LedgerError: the store cannot be read.
        """
        replay = Replay()
        with self._tx(write=False) as tx:
            with self._entry_streams(tx) as (charge_rows, event_rows):
                for entry in iter_sorted_entries((charge_entry(r) for r in charge_rows),
                                                 (event_entry(r) for r in event_rows)):
                    replay.feed(entry)
            head = tx.execute(_HEAD_SELECT).fetchone()
            pops = {r[0]: r[1:] for r in tx.execute(self._sql.all_populations)}
            stored_totals = {(r[0], r[1]): r[2:] for r in tx.execute(self._sql.all_totals)}
            triggers = self._trigger_names(tx)
            versions = {r[0] for r in tx.execute("SELECT version FROM schema_migrations")}
            cohort_columns = {r[0]: r[1] for r in tx.execute("SELECT population, cohort_column FROM population_cohorts")}
            cohort_totals = {(r[0], r[1], r[2]): totals_from_text(r[3]) for r in
                             tx.execute("SELECT population, cohort, consumer, totals FROM cohort_totals")}
        problems = stored_state_problems(
            replay,
            head=None if head is None else (head[0], head[1]),
            populations=pops,
            totals=stored_totals,
            triggers=triggers,
            required_triggers=self._REQUIRED_TRIGGERS,
            versions=versions,
            required_versions=[v for v, _, _ in self._MIGRATIONS],
            cohort_columns=cohort_columns,
            cohort_totals=cohort_totals,
        )
        return VerifyReport(not problems, problems, replay.count, replay.head, replay.charges, replay.events)
