"""Cohorts: one budget per (population, cohort), fresh for every new cohort (issue 23 item 1).

A population may split its units into *cohorts* (e.g. the month a unit signed up), each unit in
exactly one (the engines check it when data loads). Because the cohorts' units are disjoint, a
charge that reads cohorts C costs every unit of each cohort in C at most the charge's cost and
costs the units of the other cohorts nothing: by parallel composition (McSherry, "Privacy
Integrated Queries", SIGMOD 2009, Thm. 2; for Rényi/zCDP filters the same argument per unit —
a unit's privacy loss is the composition of the mechanisms whose input contains it) each
unit's guarantee is its own cohort's spend, and each cohort gets the full cap. A cohort no
charge has touched yet starts with the whole cap: that is how a population "renews" honestly —
new people, new budget — while the units already there keep what they spent.

The ledger's rules for a population with a cohort column:

* every charge names the cohorts it drew on (a non-empty set; :func:`validate_cohorts`);
* for *each* of them the consumer's and the cohort's filters run
  (:func:`dpgate.ledger.filter.check_charge` on the cohort's own totals, against the full cap
  and share × cap), and the charge is admitted only if every cohort admits it: all or
  nothing, in the same write transaction;
* the admitted charge adds its full cost to every cohort it names (``cohort_totals``); the
  population's own totals (``spend_totals``) still add every charge once — the sum over all
  cohorts, an upper bound on any unit's loss, kept for reports and ``verify``;
* the cohort rule is fixed while the population has charges: switching cohorts on (or off, or
  to another column) after a charge would hand fresh budgets to units that already spent, and is
  refused (:class:`~dpgate.errors.RenewalRefused`).

Storage (schema migration 5, :data:`COHORT_MIGRATION`, both backends): ``charges.cohorts`` (the
canonical JSON list of cohort names; part of an entry, and of its hash, only when set, so
every earlier entry keeps its hash), ``population_cohorts`` (population → cohort column; the
``population_created`` event's ``new.cohort_column``, or a ``cohorts_changed`` event, say so in
the hash chain) and ``cohort_totals`` (exact running totals per population, cohort and
consumer; consumer ``""`` for the cohort itself), all recomputed by ``verify``.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

from dpgate.accounting import Cost
from dpgate.errors import DpgateError, InvalidRequest
from dpgate.ledger.caps import CapSpec
from dpgate.ledger.filter import Refusal, Totals, check_charge
from dpgate.ledger.reports import SpendReport, build_spend_report

__all__ = [
    "COHORT_MIGRATION",
    "MAX_COHORTS_PER_CHARGE",
    "validate_cohorts",
    "cohorts_json",
    "parse_cohorts",
    "totals_text",
    "totals_from_text",
    "check_cohort_charge",
    "cohort_refusal_error",
    "cohort_reports",
]

#: Most cohorts one charge may name (one budget row each).
MAX_COHORTS_PER_CHARGE = 10_000

#: Ledger schema migration 5 (both backends, appended to their ``MIGRATIONS``): cohorts.
COHORT_MIGRATION: tuple[int, str, tuple[str, ...]] = (
    5,
    "cohorts: the cohorts a charge drew on, the population's cohort column, totals per cohort",
    (
        "ALTER TABLE charges ADD COLUMN cohorts TEXT",
        """CREATE TABLE population_cohorts (
            population    TEXT PRIMARY KEY,
            cohort_column TEXT NOT NULL
        )""",
        """CREATE TABLE cohort_totals (
            population TEXT NOT NULL,
            cohort     TEXT NOT NULL,
            consumer   TEXT NOT NULL,
            totals     TEXT NOT NULL,
            PRIMARY KEY (population, cohort, consumer)
        )""",
    ),
)


def validate_cohorts(cohorts: Any) -> tuple[str, ...] | None:
    """A charge's cohorts as a sorted tuple of distinct names (None stays None).

    Raises:
        InvalidRequest: not a list of non-empty strings (≤ 200 characters, no NUL), empty,
            or more than :data:`MAX_COHORTS_PER_CHARGE`.
    """
    if cohorts is None:
        return None
    if isinstance(cohorts, (str, bytes)) or not isinstance(cohorts, Iterable):
        raise InvalidRequest("cohorts must be a list of cohort names", {"field": "cohorts"})
    out = set()
    for c in cohorts:
        if not isinstance(c, str) or not c or len(c) > 200 or "\x00" in c:
            raise InvalidRequest("each cohort must be a non-empty string of at most 200 characters",
                                 {"field": "cohorts"})
        out.add(c)
    if not out:
        raise InvalidRequest("a charge to a population with cohorts names at least one cohort "
                             "(a query that can touch no cohort reads no unit's data)", {"field": "cohorts"})
    if len(out) > MAX_COHORTS_PER_CHARGE:
        raise InvalidRequest(f"a charge may name at most {MAX_COHORTS_PER_CHARGE:,} cohorts", {"field": "cohorts"})
    return tuple(sorted(out))


def cohorts_json(cohorts: Iterable[str]) -> str:
    """The stored (and hashed) form of a charge's cohorts: a compact JSON list, sorted."""
    return json.dumps(sorted(cohorts), separators=(",", ":"), ensure_ascii=False)


def parse_cohorts(text: str | None) -> tuple[str, ...] | None:
    """Inverse of :func:`cohorts_json` (None for a charge without cohorts)."""
    return None if text is None else tuple(json.loads(text))


def totals_text(t: Totals) -> str:
    """A cohort's :class:`~dpgate.ledger.filter.Totals` as stored (JSON of ``Totals.to_row()``)."""
    return json.dumps(list(t.to_row()), separators=(",", ":"))


def totals_from_text(text: str) -> Totals:
    """Inverse of :func:`totals_text`."""
    return Totals.from_row(*json.loads(text))


def check_cohort_charge(
    population: str,
    consumer: str,
    cost: Cost,
    cap: CapSpec,
    share: float,
    totals: Mapping[str, tuple[Totals, Totals]],
    selection_delta: float = 0.0,
) -> tuple[dict[str, tuple[Totals, Totals]], tuple[str, Refusal] | None]:
    """Run the filters of every cohort a charge names (all or nothing).

    Args:
        totals: cohort → (the cohort's totals, the consumer's totals in that cohort); a cohort
            never charged has empty totals (the whole cap).

    Returns:
        ``(after, refusal)``: every cohort's totals with the charge added, and None or the
        first ``(cohort, refusal)`` in cohort order.
    """
    after: dict[str, tuple[Totals, Totals]] = {}
    for cohort in sorted(totals):
        pt, ct = totals[cohort]
        pt_after, ct_after, refusal = check_charge(population, consumer, cost, cap, share, pt, ct, selection_delta)
        if refusal is not None:
            return after, (cohort, refusal)
        after[cohort] = (pt_after, ct_after)
    return after, None


def cohort_refusal_error(cohort: str, cohorts: Iterable[str], refusal: Refusal) -> DpgateError:
    """The error for a charge refused by ``cohort``'s filter: the population's message, naming
    the cohort; ``details.cohort`` and ``details.cohorts`` (every cohort the charge named)."""
    err = refusal.error()
    p, c = refusal.population, refusal.consumer
    err.message = (err.message
                   .replace(f"consumer {c!r} of population {p!r}", f"consumer {c!r} in cohort {cohort!r} of population {p!r}")
                   .replace(f"for population {p!r}", f"for cohort {cohort!r} of population {p!r}"))
    names = sorted(cohorts)
    named = f"cohort {cohort!r}" in err.message
    note = ((f" (the charge draws on {len(names)} cohort(s); each is charged its full cost, since their units are "
             "disjoint)") if named else
            (f" in cohort {cohort!r} (the charge draws on {len(names)} cohort(s); each is charged its full cost, "
             "since their units are disjoint)"))
    for tail in ("; nothing was charged", ". Nothing was charged"):
        if err.message.endswith(tail):
            err.message = err.message[: -len(tail)] + note + tail
            break
    else:
        err.message += note
    err.args = (err.message,)
    err.details["cohort"] = cohort
    err.details["cohorts"] = names
    return err


def cohort_reports(population: str, cap: CapSpec, allocations: Mapping[str, float],
                   rows: Iterable[tuple[str, str, str]]) -> dict[str, SpendReport]:
    """Cohort → its :class:`~dpgate.ledger.reports.SpendReport` (the cohort's spend against the
    full cap, per consumer) from stored ``(cohort, consumer, totals_text)`` rows."""
    by: dict[str, dict[str, Totals]] = {}
    for cohort, consumer, text in rows:
        by.setdefault(cohort, {})[consumer] = totals_from_text(text)
    out = {}
    for cohort in sorted(by):
        consumers = dict(by[cohort])
        pt = consumers.pop("", Totals())
        out[cohort] = build_spend_report(population, cap, allocations, pt, consumers)
    return out


class CohortStore:
    """The SQL of cohorts on the common layout, mixed into :class:`dpgate.ledger.sql.SqlLedger`.

    Uses the host class's ``_PARAM`` (driver placeholder) and ``_tx`` (transactions); every
    method taking ``tx`` runs inside the caller's transaction.
    """

    _PARAM: str

    def _cohort_column(self, tx: Any, population: str) -> str | None:
        p = self._PARAM
        row = tx.execute(f"SELECT cohort_column FROM population_cohorts WHERE population = {p}",
                         (population,)).fetchone()
        return None if row is None else row[0]

    def _set_cohort_column(self, tx: Any, population: str, column: str | None) -> None:
        p = self._PARAM
        tx.execute(f"DELETE FROM population_cohorts WHERE population = {p}", (population,))
        if column is not None:
            tx.execute(f"INSERT INTO population_cohorts (population, cohort_column) VALUES ({p}, {p})",
                       (population, column))

    def _has_charges(self, tx: Any, population: str) -> bool:
        p = self._PARAM
        return tx.execute(f"SELECT 1 FROM charges WHERE population = {p} LIMIT 1", (population,)).fetchone() \
            is not None

    def _cohort_totals(self, tx: Any, population: str, consumer: str,
                       cohorts: Iterable[str]) -> dict[str, tuple[Totals, Totals]]:
        p = self._PARAM
        wanted = set(cohorts)
        found: dict[tuple[str, str], Totals] = {}
        for cohort, who, text in tx.execute(
                f"SELECT cohort, consumer, totals FROM cohort_totals WHERE population = {p} AND consumer IN ('', {p})",
                (population, consumer)).fetchall():
            if cohort in wanted:
                found[(cohort, who)] = totals_from_text(text)
        return {c: (found.get((c, ""), Totals()), found.get((c, consumer), Totals())) for c in sorted(wanted)}

    def _store_cohort_totals(self, tx: Any, population: str, consumer: str,
                             after: Mapping[str, tuple[Totals, Totals]]) -> None:
        p = self._PARAM
        rows = []
        for cohort, (pt, ct) in after.items():
            rows.append((population, cohort, "", totals_text(pt)))
            rows.append((population, cohort, consumer, totals_text(ct)))
        tx.executemany(
            f"INSERT INTO cohort_totals (population, cohort, consumer, totals) VALUES ({p}, {p}, {p}, {p})"
            " ON CONFLICT (population, cohort, consumer) DO UPDATE SET totals = excluded.totals", rows)

    # -- public reads ------------------------------------------------------------------

    def cohort_column(self, population: str) -> str | None:
        """The population's cohort column, or None (one budget for the whole population).

        Raises:
            LedgerError: the store failed.
        """
        with self._tx(write=False) as tx:  # type: ignore[attr-defined]
            return self._cohort_column(tx, population)

    def cohort_spend(self, population: str) -> dict[str, SpendReport]:
        """Cohort → its spend report (the cohort's spend against the full cap, per consumer), for
        every cohort charged so far; a cohort absent here has spent nothing (the whole cap).
        One snapshot, read-only.

        Raises:
            UnknownPopulation: no such population. LedgerError: the store failed.
        """
        from dpgate.ledger.validation import unknown_population

        p = self._PARAM
        with self._tx(write=False) as tx:  # type: ignore[attr-defined]
            current = self._population_row(tx, population)  # type: ignore[attr-defined]
            if current is None:
                raise unknown_population(population)
            rows = tx.execute(f"SELECT cohort, consumer, totals FROM cohort_totals WHERE population = {p}",
                              (population,)).fetchall()
        cap, allocs = current
        return cohort_reports(population, cap, allocs, rows)

    def populations_charged_for(self, dataset: str) -> list[str]:
        """The populations holding charges whose metadata names ``dataset`` (sorted; read-only).
        Used to refuse moving a dataset with charges to a fresh population
        (:func:`dpgate.service.check_population_moves`). Scans the charges with a LIKE prefilter
        on the stored canonical metadata, then checks each candidate's parsed metadata exactly.

        Raises:
            LedgerError: the store failed.
        """
        p = self._PARAM
        key = json.dumps({"dataset": dataset}, separators=(",", ":"), ensure_ascii=False)[1:-1]
        pattern = "%" + key.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
        found: set[str] = set()
        with self._tx(write=False) as tx:  # type: ignore[attr-defined]
            for population, metadata in tx.execute(
                    f"SELECT population, metadata FROM charges WHERE metadata LIKE {p} ESCAPE '!'",
                    (pattern,)).fetchall():
                try:
                    if json.loads(metadata).get("dataset") == dataset:
                        found.add(population)
                except (ValueError, AttributeError):  # pragma: no cover - metadata is canonical JSON
                    continue
        return sorted(found)
