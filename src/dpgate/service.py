"""The query pipeline of the gateway, without HTTP or CLI.

One query (see the design's "Data flow of one query")::

    policy → parse/plan → release cache lookup
        hit  → stored release, cost 0, cached = true
        miss → sensitivity + calibration → ledger.charge (before any data access)
             → bounded SQL in DuckDB → noise (OpenDP) → post-processing → store release

A query that fails validation, planning or calibration costs nothing. Once the
charge is written it stays, whatever happens after (execution error, timeout,
noise or storage failure): charges are never refunded.

Identical concurrent requests are *single-flight*, and a charged release that
was never stored does not block its question: both are the release cache's
(:class:`dpgate.releases.ReleaseCache`: in-process locks, the ledger's
``release_key`` across processes, durable failure markers in the shared store).

The ledger owns each population's cap and allocations once created: opening a
gateway creates missing populations from the policy files, and reports (never
applies) a policy file that differs (:meth:`Gateway.policy_drift`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import logging
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping

import numpy as np
from dpgate import accounting, partition_selection
from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import (
    BudgetExhausted,
    Conflict,
    DpgateError,
    ExecutionError,
    InvalidBudget,
    InvalidRequest,
    NotFound,
    UnknownDataset,
    UnknownPopulation,
    UnsupportedQuery,
)
from dpgate.budget_views import budget_cohort_views, dataset_budget_views
from dpgate.cohorts import charge_scope, population_cohorts, release_guarantee, scope_signature
from dpgate.ledger import Ledger, open_ledger
from dpgate.ledger.base import FINITE_ORDERS, PolicyDrift, charge_statement, ledger_rho
from dpgate.mechanisms import calibrate, ci95_halfwidth, mechanism_name, sample
from dpgate.notices import first_notice
from dpgate.policy import MECHANISMS, DatasetPolicy, KeyTuples, load_policies
from dpgate.postprocess import check_postprocess_expression, finalize, output_unit
from dpgate.postprocess.expected import accuracy_reference, check_reference_rows, column_bounds, expected_accuracy
from dpgate.postprocess.calibration import CellTarget, ci95_rules, scales_for_ci95
from dpgate.postprocess.ranges import value_ranges
from dpgate.representable import check_representable
from dpgate.releases.keys import post_processing_settings
from dpgate.releases import (
    CacheKeys,
    NoisyPrimitives,
    Release,
    ReleaseCache,
    ReleaseStore,
    new_release_id,
    now,
    open_release_store,
)
from dpgate.sensitivity import sensitivities
from dpgate.settings import Settings
from dpgate.sql import partition_selection as selection_plan
from dpgate.sql.bound import bounded_query, bounded_sql_template
from dpgate.sql.explain import contribution, released_columns
from dpgate.sql.constant import refuse_constant_plan
from dpgate.sql.parse import nothing_charged, parse_query, parse_statement
from dpgate.sql.selection_query import check_candidates, recognize as recognize_selection
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan
from dpgate import quantile_release
from dpgate.quantile_release import PlanCalibration, has_quantiles, without_quantiles
from dpgate.sql.quantile import histogram_query, histogram_sql_template
from dpgate.sql.public import (MAX_PUBLIC_ROWS, exact_query, exact_sql, key_tuples_query, key_values_query,
                               public_key_columns, reads_public_only, reads_rows, releases_public_keys_only)
from dpgate.sql.joins import JoinedTable, policy_for
from dpgate.sql.per_unit import PerUnitTable
from types import MappingProxyType

#: Most distinct values of a public table's column used as its keys.
MAX_PUBLIC_TABLE_KEYS = 100_000

#: Margin (seconds) added to the engine's query timeout to make the release lease: how long
#: after a charge its release must be stored before another process declares it lost.
RELEASE_LEASE_MARGIN_S = 60.0
#: Budget-policy fields that are not post-processing (the cap and the per-query defaults);
#: every other field (``suppress_ci95_above``, ``clamp_counts``, …) is a display setting.
log = logging.getLogger("dpgate")


@dataclass(frozen=True)
class QueryBudget:
    """The budget a query asks for; at most one field is set (none: the policy's default).

    The one validator of requested budgets: the HTTP API (``budget`` in a query
    body, via :meth:`from_request`) and the CLI (``--rho``/``--epsilon``/``--ci95``)
    both build one, so both refuse the same values with the same error.

    Attributes:
        rho: total zCDP ρ of this release (summed over its noisy primitives);
            finite, > 0, at most :attr:`MAX_RHO`.
        epsilon: a standalone (ε, δ) guarantee for this release at the δ it is charged at
            (the cap's δ less its selection δ), turned into ρ by the ledger's one conversion
            (its cap rule, :func:`dpgate.ledger.caps.ledger_rho`); for the Laplace mechanism
            the pure ε of the release (at δ = 0); finite,
            > 0, at most :attr:`MAX_EPSILON`.
        ci95: target 95 % half-width of each *released cell*, in its output units (rows
            for counts, column units for sums and averages): the noise is calibrated so
            that every aggregate column's reported ``ci95`` is at most this
            (:func:`dpgate.postprocess.calibration.scales_for_ci95`); finite, > 0, at
            most :attr:`MAX_CI95`.
        expected_count: with ``ci95`` only: the number of rows the analyst expects per
            group, an assumption needed for AVG, VAR and STDDEV (whose half-width
            depends on the count, unknown before the release); never read from data.
        delta: δ_q spent on private partition selection (issue 11), in (0, 1); only for a
            query that selects keys privately (None: the policy's
            ``default_selection_delta``). Goes with rho or epsilon (or alone: the default ρ).

    Raises:
        InvalidBudget: more than one of rho/epsilon/ci95 set, a value that is not a
            finite positive number within its limit, or ``expected_count`` without
            ``ci95``.
    """

    #: Largest ρ a query may name (per release; far above any sane cap).
    MAX_RHO: ClassVar[float] = 1e4
    #: Largest ε a query may name (per release).
    MAX_EPSILON: ClassVar[float] = 1e4
    #: Largest ci95 half-width a query may name (output units).
    MAX_CI95: ClassVar[float] = 1e15
    #: The budget fields, in the order documented.
    FIELDS: ClassVar[tuple[str, ...]] = ("rho", "epsilon", "ci95")

    rho: float | None = None
    epsilon: float | None = None
    ci95: float | None = None
    expected_count: float | None = None
    delta: float | None = None

    def __post_init__(self) -> None:
        given = {k: getattr(self, k) for k in self.FIELDS if getattr(self, k) is not None}
        if len(given) > 1:
            raise InvalidBudget(
                f"a budget names one of rho, epsilon, ci95, not {' and '.join(given)}", {"given": list(given)}
            )
        limits = {"rho": self.MAX_RHO, "epsilon": self.MAX_EPSILON, "ci95": self.MAX_CI95}
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidBudget(f"budget {name} must be a number", {"field": name})
            if not math.isfinite(value) or value <= 0:
                raise InvalidBudget(f"budget {name} must be a finite number > 0", {"field": name})
            if value > limits[name]:
                raise InvalidBudget(
                    f"budget {name} must be at most {limits[name]:g}", {"field": name, "max": limits[name]}
                )
        d = self.delta
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d)
                              or not 0 < d < 1):
            raise InvalidBudget("budget delta (the δ of private partition selection) must be a number in (0, 1)",
                                {"field": "delta"})
        n = self.expected_count
        if n is not None:
            if self.ci95 is None:
                raise InvalidBudget("expected_count goes with a ci95 budget", {"field": "expected_count"})
            if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or not 1 < n <= 1e15:
                raise InvalidBudget("expected_count must be a number of rows > 1 (and ≤ 1e15)",
                                    {"field": "expected_count"})

    @classmethod
    def from_request(cls, fields: Mapping[str, Any]) -> "QueryBudget":
        """The budget of a request body's ``budget`` object: exactly one of rho, epsilon, ci95.

        Raises:
            InvalidBudget: none or several named, or a value :class:`QueryBudget` refuses.
        """
        given = {k: v for k, v in fields.items() if v is not None}
        if not given:
            raise InvalidBudget(
                "budget names none of rho, epsilon, ci95 (omit budget for the policy's default_query_rho)",
                {"given": []},
            )
        return cls(**given)


class Gateway:
    """The in-process gateway: policies, the engines, the ledger and the release store.

    Build it with :meth:`open` (which loads policies and data) or inject the
    parts (tests). All public methods return JSON-ready dicts and raise
    :class:`~dpgate.errors.DpgateError` subclasses. Thread-safe.

    Args:
        policies: dataset name → policy.
        engine: a loaded :class:`~dpgate.engines.EngineSet` (one engine per dataset).
        data_versions: dataset name → published data version (from ``EngineSet.load``,
            keyed by :func:`_published_version`); None for a live source whose version
            comes from ``version_sql`` per query, or is unknown (release cache off).
        ledger: the budget ledger.
        releases: the release store (same backend as the ledger).
        salt_source: draws the secret that picks each unit's k groups (default: 63 bits
            from the OS CSPRNG; tests pass a constant to compare engines).
        fingerprint_key: the key of published data fingerprints (default: a per-process key).
        notice: ``(kind, key, text) -> bool``, whether a warning is new (default: every warning
            is); :meth:`open` passes :func:`dpgate.notices.first_notice` on the state folder, so a
            policy-drift warning is logged once per change.
    """

    def __init__(
        self,
        policies: Mapping[str, DatasetPolicy],
        engine: EngineSet,
        data_versions: Mapping[str, str | None],
        ledger: Ledger,
        releases: ReleaseStore,
        *,
        salt_source: Callable[[], int] | None = None,
        fingerprint_key: bytes | None = None,
        notice: Callable[[str, str, str], bool] | None = None,
    ) -> None:
        self.policies = dict(policies)
        self.engine = engine
        self.data_versions = dict(data_versions)
        self._salt_source = salt_source or (lambda: secrets.randbits(63))
        # keys published data fingerprints; a gateway built without one keys them per process
        self._fingerprint_key = fingerprint_key or secrets.token_bytes(32)
        self.ledger = ledger
        self.release_store = releases
        timeout = getattr(engine, "timeout_s", None)
        self.release_cache = ReleaseCache(releases, lease_s=(timeout or 30.0) + RELEASE_LEASE_MARGIN_S)
        check_population_moves(ledger, self.policies)  # issue 23: no renewal by renaming a population
        for population, drift in ensure_populations(ledger, self.policies).items():
            text = drift.message()
            # said once per change of the drift (`notice`: dpgate.notices.first_notice on the state
            # folder), not on every start or command; the API and `dpgate budget --json` always report it
            new = notice("policy_drift", population, text) if notice is not None else bool(text)
            if text:
                log.log(logging.WARNING if new else logging.DEBUG, "%s", text)

    # ----------------------------------------------------------------- lifecycle

    @classmethod
    def open(cls, settings: Settings, *, progress: Callable[[str], None] | None = None,
             salt_source: Callable[[], int] | None = None) -> "Gateway":
        """Load the policies, the data (each dataset's engine), the ledger and the release store.

        Args:
            settings: injected configuration.
            progress: called with human-readable progress lines (loading large files).
            salt_source: see :class:`Gateway` (tests only; default: the OS CSPRNG).
        Raises:
            PolicyError: a policy file is invalid or names a missing source or column.
            LedgerError: the ledger cannot be opened.
        """
        policies = load_policies(Path(settings.policies))
        settings.home.mkdir(parents=True, exist_ok=True)
        engine = EngineSet(options=EngineOptions(
            timeout_s=settings.query_timeout_s,
            duckdb_memory_limit=settings.duckdb_memory_limit,
            duckdb_threads=settings.duckdb_threads,
            duckdb_load=settings.duckdb_load,
            in_place_above_bytes=settings.duckdb_in_place_above,
            spark_master=settings.spark_master,
        ))
        try:
            versions = engine.load(policies, progress=progress)
            ledger = open_ledger(settings.ledger_url_with_wait())  # bounded waits: 503 ledger_unavailable after
        except BaseException:
            engine.close()
            raise
        try:
            store = open_release_store(ledger)
            key = fingerprint_key(settings, store)
        except BaseException:
            ledger.close()
            engine.close()
            raise
        versions = {name: None if v is None else _published_version(v, key) for name, v in versions.items()}
        home = settings.home
        return cls(policies, engine, versions, ledger, store, fingerprint_key=key, salt_source=salt_source,
                   notice=lambda kind, k, text: first_notice(home, kind, k, text))

    @property
    def searches(self):
        """The search records (:class:`dpgate.searches.Searches`), opened on first use in the
        ledger's database (issue 15)."""
        if getattr(self, "_searches", None) is None:
            from dpgate.searches import Searches, open_search_store

            self._searches = Searches(self.ledger, open_search_store(self.ledger))
        return self._searches

    def close(self) -> None:
        """Close the search and release stores, the ledger and the engine."""
        searches = getattr(self, "_searches", None)
        if searches is not None:
            try:
                searches.store.close()
            except Exception:  # noqa: BLE001 - closing must not mask the caller's error
                pass
        for closer in (self.release_store.close, self.ledger.close, self.engine.close):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing must not mask the caller's error
                pass

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- datasets

    def policy(self, dataset: str) -> DatasetPolicy:
        """The policy of ``dataset``; raises :class:`UnknownDataset`."""
        try:
            return self.policies[dataset]
        except KeyError:
            raise UnknownDataset.named(dataset, self.policies) from None

    def population_of(self, dataset: str) -> str:
        """The population (ledger key) whose budget ``dataset`` spends."""
        return self.policy(dataset).population

    def datasets(self) -> list[dict[str, Any]]:
        """The published guarantee of every dataset (see :meth:`dataset`)."""
        return [self.dataset(name) for name in sorted(self.policies)]

    def dataset(self, name: str) -> dict[str, Any]:
        """The published guarantee of one dataset.

        Returns a dict with the dataset's population, data version, cap
        (ε, δ and the ρ it is enforced as), allocations, default mechanism and
        per table the privacy unit, contribution bounds (k, m) and the public
        parts of the schema (types, clamp bounds, resolution, public keys).
        The cap and allocations shown are the ledger's (which own them once the
        population exists); ``policy_drift`` says how the policy file differs
        (:meth:`PolicyDrift.to_dict`). Raises :class:`UnknownDataset`.
        """
        policy = self.policy(name)
        drift = self.policy_drift(name)
        tables = {tname: table.to_dict() for tname, table in policy.tables.items()}
        return {
            "name": policy.name,
            "population": policy.population,
            "data_version": self.data_versions.get(name),
            **self._serving(name),
            "cap": drift.ledger_cap.public(),
            "policy_cap": {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta},
            "policy_drift": drift.to_dict(),
            "allocations": dict(drift.ledger_allocations),
            "default_mechanism": policy.budget.mechanism,
            "default_query_rho": policy.budget.default_query_rho,
            "tables": tables,
            **dataset_budget_views(self, policy, drift.ledger_cap),  # issue 23: renewal, cohorts, attack bound, proxy
        }

    def budget(self, dataset: str) -> dict[str, Any]:
        """Spend report of ``dataset``'s population: ρ and ε (the ledger's conversion), per allocation,
        with ``policy_drift`` (how the policy file differs from the ledger's values, which hold)."""
        policy = self.policy(dataset)
        report = self.ledger.spend(policy.population).to_dict()
        report["dataset"] = dataset
        report["policy_drift"] = self.policy_drift(dataset).to_dict()
        report.update(budget_cohort_views(self.ledger, policy))  # issue 23: spend per cohort
        return report

    def _serving(self, name: str) -> dict[str, Any]:
        """Engine, load modes and release-cache state of a dataset (for :meth:`dataset`)."""
        try:
            info = self.engine.describe(name)
        except Exception:  # noqa: BLE001 - an injected engine without describe()
            return {}
        cache = "enabled" if info["versioned_by"] else (
            "disabled: a live source without data_version or version_sql has no data version, "
            "so every query is computed (and charged) afresh")
        return {"engine": info["engine"], "versioned_by": info["versioned_by"],
                "release_cache": cache, "load": {t: v["load"] for t, v in info["tables"].items()}}

    def _data_version(self, dataset: str) -> str:
        """The published data version a query is cached under.

        A declared version or a source fingerprint is fixed at load (reload to change
        it); ``version_sql`` is evaluated now and published keyed (HMAC), like a
        fingerprint. Without any version the release cache is off for the dataset:
        every query gets a fresh ``unversioned:`` key that nothing else shares.
        """
        version = self.data_versions.get(dataset)
        if version is not None:
            return version
        describe = getattr(self.engine, "describe", None)
        if describe is not None and describe(dataset)["versioned_by"] == "version_sql":
            raw = self.engine.current_version(dataset)
            if raw is not None:
                return _published_version(raw, self._fingerprint_key)
        return f"unversioned:{secrets.token_hex(16)}"

    def reload(self, dataset: str, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Load ``dataset``'s data again without a restart (its files changed).

        The new data gets a new data version (a new fingerprint, or the policy's
        declared one); releases of the old data stay stored and are served as they
        were; queries on the new data are computed and charged afresh. Queries
        running during the reload finish on the old data.

        Returns:
            The dataset view (:meth:`dataset`) after the reload.
        Raises:
            UnknownDataset; PolicyError (the new files are invalid: the old data keeps serving).
        """
        self.policy(dataset)
        report = self.engine.reload(dataset, progress=progress)
        raw = report.data_version
        self.data_versions[dataset] = (None if raw is None
                                       else _published_version(raw, self._fingerprint_key))
        return self.dataset(dataset)

    def policy_drift(self, dataset: str) -> PolicyDrift:
        """How ``dataset``'s policy file differs from the cap and allocations the ledger enforces
        (read live, so a change by an admin or another replica shows at once).

        Raises:
            UnknownDataset: no such dataset. PolicyError: the file's cap is invalid.
        """
        policy = self.policy(dataset)
        return ensure_populations(self.ledger, {dataset: policy})[policy.population]

    # ----------------------------------------------------------------- planning

    def _plan(self, dataset: str, sql: str, dialect: str | None = None) -> tuple[DatasetPolicy, QueryPlan]:
        policy = self.policy(dataset)
        if not isinstance(sql, str) or not sql.strip():
            from dpgate.errors import InvalidSql

            raise InvalidSql("the SQL text is empty")
        policy = self._with_public_table_keys(policy)  # public tables hook: their keys are their values
        try:
            statement = parse_statement(sql, dialect)  # the analyst's text, parsed once
            check_candidates(statement, policy)  # selection hook (issue 15); reads the tree only
        except DpgateError as e:
            raise nothing_charged(e)
        plan = parse_query(sql, policy, dialect=dialect, statement=statement)
        try:
            refuse_constant_plan(plan)
            _check_derived_outputs(plan, policy_for(plan.table, policy))
        except DpgateError as e:
            raise nothing_charged(e)
        return policy_for(plan.table, policy), plan  # joins hook: the plan's joined table

    def _with_public_table_keys(self, policy: DatasetPolicy) -> DatasetPolicy:
        """The policy with each public table's key-less text/int/bool columns keyed by their
        values, and the combinations of its key columns that occur together (issue 19 item 5).

        A public table holds nothing to protect, so its distinct values (read from the
        policy's data source, NULLs left out, at most :data:`MAX_PUBLIC_TABLE_KEYS`) are
        public keys: grouping a protected aggregate by a joined public table's column
        releases every one of them (empty groups as noisy zeros). Its distinct rows over the
        columns with public keys (at most as many; NULLs kept) are its
        :class:`~dpgate.policy.KeyTuples`: grouping by several of its columns releases those
        combinations, never the product of the columns' keys. Cached per data version.
        """
        def keyed(c) -> bool:
            return c.public_keys is not None or c.type in ("text", "int", "bool")

        targets = [t for t in policy.tables.values() if t.public and (any(
            c.public_keys is None and c.type in ("text", "int", "bool") for c in t.columns.values())
            or sum(keyed(c) for c in t.columns.values()) > 1)]
        if not targets:
            return policy
        version = self.data_versions.get(policy.name)
        cache = self.__dict__.setdefault("_public_keys_cache", {})
        if version is not None and (policy.name, version) in cache:
            return cache[(policy.name, version)]
        tables = dict(policy.tables)
        for t in targets:
            cols = {}
            for name, col in t.columns.items():
                if col.public_keys is None and col.type in ("text", "int", "bool"):
                    values = self.engine.execute(key_values_query(t, name, MAX_PUBLIC_TABLE_KEYS + 1))["v"]
                    keys = tuple(_plain(v) for v in np.asarray(values).tolist())
                    if 0 < len(keys) <= MAX_PUBLIC_TABLE_KEYS:
                        col = dataclasses.replace(col, public_keys=keys)
                cols[name] = col
            key_tuples = ()
            keyed_names = [n for n, c in cols.items() if c.public_keys is not None]
            if len(keyed_names) > 1:
                values = self.engine.execute(key_tuples_query(t, keyed_names, MAX_PUBLIC_TABLE_KEYS + 1))
                columns = [[_plain(v) for v in np.asarray(values[n]).tolist()] for n in keyed_names]
                rows = tuple(zip(*columns)) if columns else ()
                key_tuples = (KeyTuples(tuple(keyed_names), rows if len(rows) <= MAX_PUBLIC_TABLE_KEYS else None),)
            tables[t.name] = dataclasses.replace(t, columns=MappingProxyType(cols), key_tuples=key_tuples)
        out = dataclasses.replace(policy, tables=MappingProxyType(tables))
        if version is not None:
            cache[(policy.name, version)] = out
        return out

    @staticmethod
    def _selection_of(plan: QueryPlan, policy: DatasetPolicy):
        """The selection query ``plan`` is (:mod:`dpgate.sql.selection_query`), or None; its
        refusals happen while planning, so they say that nothing was charged."""
        try:
            return recognize_selection(plan, policy)
        except DpgateError as e:
            raise nothing_charged(e)

    def _mechanism(self, policy: DatasetPolicy, mechanism: str | None) -> str:
        mech = mechanism or policy.budget.mechanism
        if not isinstance(mech, str) or mech not in MECHANISMS:
            raise InvalidBudget(f"unknown mechanism {mech!r}; use one of {', '.join(MECHANISMS)}",
                                {"mechanism": mech})
        return mech

    def _resolve_budget(self, policy: DatasetPolicy, mech: str, budget: QueryBudget | None) -> dict[str, Any]:
        """The budget as it enters the cache key: ``{ci95}``, ``{rho}`` or ``{epsilon[, delta]}``.

        Cheap (no calibration), so that a cache hit does no privacy arithmetic; a Gaussian
        ``{epsilon}`` is stated at the δ of the cap the ledger enforces (one ledger read).
        """
        budget = budget or QueryBudget()
        if budget.ci95 is not None:
            if budget.expected_count is not None:
                return {"ci95": float(budget.ci95), "expected_count": float(budget.expected_count)}
            return {"ci95": float(budget.ci95)}
        if budget.epsilon is not None:
            if mech == "gaussian":  # a standalone (ε, δ) guarantee at the δ it is charged at
                return {"epsilon": float(budget.epsilon), "delta": self.ledger.cap(policy.population).rho_delta}
            return {"epsilon": float(budget.epsilon)}
        rho = budget.rho if budget.rho is not None else policy.budget.default_query_rho
        return {"rho": float(rho)}

    def _resolve_selection(self, policy: DatasetPolicy, plan: QueryPlan, resolved: dict[str, Any],
                           budget: QueryBudget | None) -> dict[str, Any]:
        """Issue 11 hook: add ``selection_delta`` (δ_q) to the resolved budget of a selecting query
        (:func:`dpgate.partition_selection.selection_budget`; refusals cost nothing)."""
        requested = budget.delta if budget is not None else None
        if not plan.selected_keys and requested is None:
            return resolved
        cap = self.ledger.cap(policy.population).selection_delta if plan.selected_keys else 0.0
        delta = partition_selection.selection_budget(policy, plan, cap, requested, "ci95" in resolved)
        return resolved if delta is None else {**resolved, "selection_delta": delta}

    def _calibrate(self, policy: DatasetPolicy, plan: QueryPlan, mech: str, resolved: Mapping[str, Any]):
        """Return (calibration, sensitivities) for a resolved budget (see :meth:`_resolve_budget`).

        A ``ci95`` budget constrains each released aggregate cell (AVG/VAR/STDDEV at the
        budget's ``expected_count``; :func:`~dpgate.postprocess.calibration.scales_for_ci95`).
        """
        try:
            return self._calibrate_plan(policy, plan, mech, resolved)
        except InvalidBudget as e:  # name the aggregate, not the internal primitive id
            pid = e.details.get("primitive")
            if isinstance(pid, str) and pid in {p.id for p in plan.primitives}:
                label = _primitive_text(plan.primitive(pid))
                e.message = e.message.replace(f"primitive {pid!r}", label)
                e.args = (e.message,)
                e.details["aggregate"] = label
            raise nothing_charged(e) from None

    def _calibrate_plan(self, policy: DatasetPolicy, plan: QueryPlan, mech: str, resolved: Mapping[str, Any]):
        check_representable(plan, policy)
        if plan.selected_keys and has_quantiles(plan):  # issue 11: not combined yet
            raise UnsupportedQuery(
                "quantiles (MEDIAN, PERCENTILE_CONT, MIN/MAX, …) are not supported with private partition "
                f"selection yet: give GROUP BY {', '.join(plan.selected_keys)} public keys",
                {"selected_keys": list(plan.selected_keys)})
        if has_quantiles(plan):  # quantiles hook: budget split over counts/sums and quantiles
            sens = sensitivities(without_quantiles(plan), policy)
            pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
            return quantile_release.calibrate_plan(plan, policy, mech, resolved, pairs, calibrate), sens
        sens = sensitivities(plan, policy)
        pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
        if plan.selected_keys:  # issue 11 hook: the selection histogram shares the budget
            gaussian = mech == "gaussian"
            budget_arg = (
                {"rho": (ledger_rho(resolved["epsilon"], resolved["delta"])
                         if "epsilon" in resolved else resolved["rho"])} if gaussian else
                {"epsilon": resolved["epsilon"] if "epsilon" in resolved else math.sqrt(2.0 * resolved["rho"])})
            return partition_selection.calibrate_selecting(
                plan, policy, pairs, mechanism=mech, delta=resolved["selection_delta"], **budget_arg), sens
        if "ci95" in resolved:
            return calibrate(pairs, mechanism=mech, scales=self._ci95_scales(policy, plan, mech, resolved,
                                                                             sens).scales), sens
        if mech == "gaussian":
            # a standalone ε at the δ it is charged at → ρ by the ledger's one conversion (its cap rule)
            rho = (ledger_rho(resolved["epsilon"], resolved["delta"])
                   if "epsilon" in resolved else resolved["rho"])
            return calibrate(pairs, mechanism=mech, rho=rho), sens
        # laplace: pure ε; a ρ budget buys ε = √(2ρ) (ε-DP ⇒ ε²/2-zCDP, Bun–Steinke 2016 Prop. 1.4)
        eps = resolved["epsilon"] if "epsilon" in resolved else math.sqrt(2.0 * resolved["rho"])
        return calibrate(pairs, mechanism=mech, epsilon=eps), sens

    @staticmethod
    def _ci95_scales(policy: DatasetPolicy, plan: QueryPlan, mech: str, resolved: Mapping[str, Any], sens):
        """Scales (integer units) meeting a ``ci95`` budget on every aggregate output."""
        targets = _cell_targets(policy, plan)
        gaussian = mechanism_name(mech) == "discrete_gaussian"
        d_in = {pid: (s.l2 if gaussian else s.l1) for pid, s in sens.items()}
        units = {p.id: _output_unit(policy, plan, p.id) for p in plan.primitives}
        return scales_for_ci95(targets, d_in, units, mechanism=mech, halfwidth=resolved["ci95"],
                               expected_count=resolved.get("expected_count"))

    # ----------------------------------------------------------------- explain

    def explain(self, dataset: str, sql: str, *, budget: QueryBudget | None = None,
                mechanism: str | None = None, consumer: str | None = None,
                dialect: str | None = None, trial: bool = False,
                reference_rows: float | None = None) -> dict[str, Any]:
        """:meth:`_explain`'s document with ``expected_accuracy``: each primitive's sensitivity in
        its unit and each output's expected 95 % half-width
        (:func:`dpgate.postprocess.expected.expected_accuracy`, from the document alone), and
        ``warnings`` (issue 22 item 6): one sentence per output whose ± would swamp it, compared
        with its column's bounds (``column_bounds``) at a group of ``reference_rows`` rows
        (default: the budget's ``expected_count``, else
        :data:`~dpgate.postprocess.expected.DEFAULT_REFERENCE_ROWS`), data-independent.

        Raises:
            as :meth:`_explain`; InvalidRequest: ``reference_rows`` not a number > 1.
        """
        check_reference_rows(reference_rows)
        doc = self._explain(dataset, sql, budget=budget, mechanism=mechanism, consumer=consumer,
                            dialect=dialect, trial=trial)
        if doc.get("plan") and not doc.get("public") and not doc.get("public_keys_only"):
            # issue 22 item 6: the bounds and group size each output's ± is compared with (data-independent)
            doc["column_bounds"] = column_bounds(self.policy(dataset), doc["plan"])
            doc["accuracy_reference"] = accuracy_reference(
                self.policy(dataset), reference_rows, None if budget is None else budget.expected_count)
        doc["expected_accuracy"] = expected_accuracy(doc)
        doc["warnings"] = [w["message"] for w in doc["expected_accuracy"].get("warnings", [])]
        return doc

    def _explain(self, dataset: str, sql: str, *, budget: QueryBudget | None = None,
                 mechanism: str | None = None, consumer: str | None = None,
                 dialect: str | None = None, trial: bool = False) -> dict[str, Any]:
        """Plan, bounded SQL (salt hidden), sensitivities and cost of a query.

        Reads no data and charges nothing. Raises the same errors as :meth:`query`
        before its charge. ``cost.fits`` says whether the charge fits what is left
        for ``consumer`` (or for the population when None), from the ledger's spend
        report: a charge that does not fit is refused by :meth:`query` with
        ``budget_exhausted`` and nothing is written. A ``ci95`` budget adds
        ``accuracy_target``: each cell's rule and the half-width it will report.
        ``dialect`` is as for :meth:`query`. With ``trial``, the plan also runs on the dataset's
        proxy (free; :func:`dpgate.proxy.trial`): ``trial`` holds what the answer would look like
        and the ± each cell would carry at the requested budget (issue 23 item 6). For a
        population with cohorts, ``cohorts`` lists the cohorts the charge would draw on and
        ``cost.fits`` is checked against each of them.

        Raises:
            as :meth:`query` before its charge; InvalidRequest: ``trial`` without a proxy.
        """
        policy, plan = self._plan(dataset, sql, dialect)
        # what dpgate explain prints as well: the released columns and the contribution bounds
        shown = {"columns": released_columns(plan), "contribution": contribution(plan, policy)}
        if reads_public_only(plan, policy):  # public tables hook: exact and free
            return {"dataset": dataset, "canonical_sql": plan.canonical_sql, "plan_hash": plan.plan_hash, **shown,
                    "plan": plan.canonical_dict(), "public": True, "exact_sql": exact_sql(plan, policy),
                    "bounded_sql": None, "sensitivity": {}, "mechanism": None, "noise_scales": {},
                    "budget": None, "cost": {"rho": 0.0, "epsilon": 0.0, "epsilon_at_delta": 0.0, "fits": True,
                                             "message": "reads public tables only: answered exactly, no charge"}}
        if releases_public_keys_only(plan, policy):  # keys only: the policy's keys, free
            return {"dataset": dataset, "canonical_sql": plan.canonical_sql, "plan_hash": plan.plan_hash, **shown,
                    "plan": plan.canonical_dict(), "public_keys_only": True, "exact_sql": None,
                    "bounded_sql": None, "sensitivity": {}, "mechanism": None, "noise_scales": {},
                    "budget": None, "cost": {"rho": 0.0, "epsilon": 0.0, "epsilon_at_delta": 0.0, "fits": True,
                                             "message": _KEYS_ONLY_NOTE}}
        selection = self._selection_of(plan, policy)
        if selection is not None:  # selection hook (issue 15): keys only, exponential mechanism
            from dpgate.selection import explain_selection

            return {**explain_selection(self, dataset, policy, selection, budget, consumer), **shown}
        mech = self._mechanism(policy, mechanism)
        resolved = self._resolve_selection(policy, plan, self._resolve_budget(policy, mech, budget), budget)
        cal, sens = self._calibrate(policy, plan, mech, resolved)
        delta = self.ledger.cap(policy.population).rho_delta
        extra: dict[str, Any] = {}
        scope = charge_scope(self.ledger, policy, plan)  # cohorts hook (issue 23)
        if scope is not None:
            extra["cohorts"] = {"column": policy.cohorts.column, "drew_on": list(scope)}
        if trial:  # utility trial on the proxy (issue 23 item 6): free, reads only the proxy
            from dpgate.proxy import trial as proxy_trial

            extra["trial"] = proxy_trial(self, policy, plan, cal)
        if getattr(cal, "selection", None) is not None:  # issue 11: threshold, δ and the units a key needs
            extra["partition_selection"] = partition_selection.describe(plan, cal, resolved["selection_delta"])
        if "ci95" in resolved:
            extra["accuracy_target"] = self._ci95_scales(policy, plan, mech, resolved, sens).describe(
                resolved["ci95"], resolved.get("expected_count"))
        joined = policy.table(plan.table)
        if isinstance(joined, PerUnitTable):  # per-unit hook: the outer row's derived ranges
            extra["per_unit"] = joined.describe()
        elif isinstance(joined, JoinedTable):  # joins hook: the join and where bounding happens
            extra["join"] = {
                "tables": list(joined.sources), "join_sql": joined.join_sql,
                "privacy_unit": joined.privacy_unit,
                "bounding": (f"after the join, on the joined rows: at most k = {joined.max_groups_per_unit} "
                             f"groups and m = {joined.max_rows_per_unit} rows per unit and group, values clamped"),
            }
        if isinstance(cal, PlanCalibration):  # quantiles hook: grid, scale, rank error, cost
            extra["quantiles"] = {pid: {**q.describe(), "histogram_sql": histogram_sql_template(plan, policy, q.column)}
                                  for pid, q in cal.quantiles.items()}
        return {
            "dataset": dataset,
            "canonical_sql": plan.canonical_sql,
            "plan_hash": plan.plan_hash,
            **shown,
            "plan": plan.canonical_dict(),
            # the analyst's names of the outputs (the plan's canonical form leaves labels out)
            "columns": [o.label or o.name for o in plan.visible_outputs],
            "labels": {o.name: o.label or o.name for o in plan.outputs},
            "bounded_sql": _bounded_template(plan, policy),
            "computed_keys": [
                {"name": k.name, "expression": k.expression, "rule": k.rule, "type": k.type,
                 "domain_size": len(k.domain)}
                for k in plan.computed_keys
            ],
            "sensitivity": {pid: {"l1": s.l1, "l2": s.l2, "linf": s.linf} for pid, s in sens.items()},
            "mechanism": cal.mechanism,
            "noise_scales": dict(cal.scales),
            "noise_scale_units": noise_scale_units(policy, plan, cal.scales),
            "budget": resolved,
            "cost": {
                "rho": cal.rho,
                "epsilon": cal.epsilon,
                **_stated(cal.cost, delta),
                **({"selection_delta": cal.selection.delta} if getattr(cal, "selection", None) is not None else {}),
                **self._fit(policy, cal.cost, consumer, scope),
            },
            **extra,
        }

    def _fit(self, policy: DatasetPolicy, cost: accounting.Cost, consumer: str | None,
             scope: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Whether ``cost`` fits what is left (the ledger's spend report), as explain reports it:
        within the consumer's allocation (when ``consumer`` has one) *and* the population's cap,
        as the ledger's filter checks at run time. ``remaining_rho`` is the binding one (the
        smaller), ``consumer`` the allocation it names (None: the population's). With cohorts:
        against the cohort of ``scope`` (None: every declared cohort) with the least left."""
        report = self.ledger.spend(policy.population)
        if getattr(policy, "cohorts", None) is not None and self.ledger.cohort_column(policy.population):
            from dpgate.budget_views import cohort_remaining  # cohorts hook (issue 23)

            left, who = cohort_remaining(self.ledger, policy, consumer, scope or policy.cohorts.names)
            named = consumer if consumer is not None and consumer in report.consumers else None
        else:
            left, who, named = report.remaining_rho, f"population {policy.population!r}", None
            if consumer is not None and consumer in report.consumers:
                mine = report.consumers[consumer].remaining_rho
                if mine <= left:
                    left, who, named = mine, f"consumer {consumer!r}", consumer
        need = cost.rho_bound()  # ρ for a zCDP charge; for a pure-ε curve, the ρ it is at most
        fits = bool(need <= left)
        verdict = "fits" if fits else "does NOT fit: the query would be refused with budget_exhausted"
        return {"fits": fits, "remaining_rho": left, "consumer": named,
                "population_remaining_rho": report.remaining_rho,
                "message": f"this release costs rho={need:.6g}; {who} has rho={left:.6g} left: it {verdict}"}

    # ----------------------------------------------------------------- query

    def query(self, dataset: str, sql: str, *, consumer: str, budget: QueryBudget | None = None,
              mechanism: str | None = None, dialect: str | None = None,
              search_id: str | None = None, fallback: str | None = None) -> dict[str, Any]:
        """Answer ``sql`` with a DP release (:meth:`_answer`); when the budget refuses it and
        ``fallback`` is ``"proxy"`` (or None and the policy's ``proxy_default_for`` names the
        consumer), answer the same plan on the dataset's proxy instead: exact, free, labelled
        ``"source": "proxy"``, ``"dp": false``, never stored in the release cache
        (:mod:`dpgate.proxy`, issue 23). ``fallback = "none"`` never falls back.

        Raises:
            as :meth:`_answer`; InvalidRequest: ``fallback`` not "proxy"/"none", or "proxy" for a
            dataset without a proxy (checked before anything is charged).
        """
        from dpgate.proxy import check_fallback, fallback_answer  # proxy hook (issue 23)

        check_fallback(self.policy(dataset), fallback)
        try:
            return self._answer(dataset, sql, consumer=consumer, budget=budget, mechanism=mechanism,
                                dialect=dialect, search_id=search_id)
        except BudgetExhausted as refusal:
            answer = fallback_answer(self, dataset, sql, consumer=consumer, dialect=dialect, fallback=fallback,
                                     refusal=refusal)
            if answer is None:
                raise
            return answer

    def _answer(self, dataset: str, sql: str, *, consumer: str, budget: QueryBudget | None = None,
                mechanism: str | None = None, dialect: str | None = None,
                search_id: str | None = None) -> dict[str, Any]:
        """Answer ``sql`` on ``dataset`` with a DP release, charged to ``consumer``'s allocation.

        Args:
            dataset: dataset name (policy).
            sql: the analyst's SQL text (never executed as such).
            consumer: the allocation that pays (from the principal, not the request).
            budget: the release's budget (None: the policy's ``default_query_rho``).
            mechanism: ``"gaussian"`` (discrete Gaussian, zCDP) or ``"laplace"``
                (discrete Laplace, pure ε); None: the policy's default. A selection query
                (keys only, ORDER BY an aggregate, LIMIT k) always uses the exponential
                mechanism (:mod:`dpgate.selection`) and ignores it.
            search_id: a selection query's search record (:mod:`dpgate.searches`): it must be
                open and of the dataset's population; the selection is recorded in it.
            dialect: the SQL dialect ``sql`` is written in (one of
                :data:`dpgate.sql.parse.DIALECTS`; None: ``duckdb``). The plan, its hash
                and the release cache do not depend on it.
        Returns:
            The release document: ``{release_id, dataset, columns, rows, accuracy,
            charge: {rho, epsilon_at_delta, charge_id} | None, cached, data_version,
            created_at, guarantee, …}``. A cache hit has ``cached = True`` and
            ``charge = None`` (it cost nothing).
        Raises:
            InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn, InvalidBudget,
            UnknownDataset, UnknownConsumer: before any charge.
            BudgetExhausted: the charge did not fit; nothing was written.
            QueryTimeout, ExecutionError, MechanismError: after the charge, which stays.
        """
        policy, plan = self._plan(dataset, sql, dialect)
        if reads_public_only(plan, policy) and search_id is None:  # public tables hook: exact and free
            return self._public_release(policy, plan)
        if releases_public_keys_only(plan, policy) and search_id is None:  # keys only: the policy's keys, free
            return self._public_keys_release(policy, plan)
        selection = self._selection_of(plan, policy)
        if selection is not None or search_id is not None:  # selection hook (issue 15)
            return self._selection_query(dataset, policy, plan, selection, consumer=consumer, budget=budget,
                                         search_id=search_id)
        mech = self._mechanism(policy, mechanism)
        resolved = self._resolve_selection(policy, plan, self._resolve_budget(policy, mech, budget), budget)
        scope = charge_scope(self.ledger, policy, plan)  # cohorts hook (issue 23): the cohorts this charge draws on
        version = self._data_version(dataset)
        # Two keys: the noise key names the noisy primitives (what is charged and noised:
        # table, filter, grouping, primitives, bounds, budget, mechanism, data version); the
        # release key names this exact query, post-processing (outputs, HAVING, ORDER BY,
        # LIMIT) and display settings included. Queries that differ only in post-processing
        # share one charge.
        keys = CacheKeys.of(plan_hash=plan.plan_hash + scope_signature(scope),
                            noise_signature=_noise_signature(plan, cell_targets="ci95" in resolved)
                            + scope_signature(scope),
                            data_version=version, mechanism=mech, budget=resolved,
                            post_processing=post_processing_settings(policy))
        display = [o.label or o.name for o in plan.outputs if not o.hidden]

        with self.release_cache.flight(keys) as flight:
            hit = flight.lookup()
            if hit is not None:
                return self._serve(hit, policy, plan, keys.release, display)
            # Calibrate and bind the rewrite before charging (reads no data): a query
            # DuckDB refuses whatever the data costs nothing.
            cal, _ = self._calibrate(policy, plan, mech, resolved)
            if has_quantiles(plan):
                for statement in _engine_statements(plan, policy):
                    self.engine.check(statement)
            else:
                self._run_bounded(self.engine.check, plan, policy, salt=0)
            if getattr(cal, "selection", None) is not None:  # what select_rows reads of the plan, before the charge
                selection_plan.public_combinations(plan, policy)

            def charge(release_key: str):
                """Charge this query's cost under the attempt's single-flight key.

                None when every primitive is a constant (sensitivity 0): the release is
                exact and costs nothing, so nothing is written to the ledger.
                """
                if cal.exact:
                    return None
                return self.ledger.charge(
                    policy.population, consumer, cal.cost,
                    purpose=f"query on {dataset}: {plan.canonical_sql}"[:500],
                    release_key=release_key,
                    metadata={"dataset": dataset, "plan_hash": plan.plan_hash, "data_version": version},
                    # issue 11: the δ OpenDP's threshold map gives, against the cap's selection_delta
                    **({"selection_delta": cal.selection.delta} if getattr(cal, "selection", None) is not None else {}),
                    **({"cohorts": scope} if scope is not None else {}),
                )

            # ---- once charged, nothing refunds the charge (a failed attempt stays charged) ----
            release, fresh = flight.run(
                charge=charge,
                compute=lambda receipt: self._compute(policy, plan, cal, resolved, receipt, keys.noise, version),
            )
        if fresh:
            return release.to_dict(cached=False)
        return self._serve(release, policy, plan, keys.release, display)

    def _selection_query(self, dataset: str, policy: DatasetPolicy, plan: QueryPlan, selection, *,
                         consumer: str, budget: QueryBudget | None, search_id: str | None) -> dict[str, Any]:
        """A selection query (issue 15; :func:`dpgate.selection.run_selection`), recorded in its
        search when ``search_id`` is given.

        Raises:
            UnsupportedQuery: ``search_id`` on a query that is not a selection.
            NotFound / Conflict: the search does not exist, is closed or protects another population.
        """
        from dpgate.selection import run_selection

        if reads_public_only(plan, policy):
            raise UnsupportedQuery("this query reads public tables only: it is answered exactly and free, without "
                                   "search_id; a search records public-data selection when it is closed",
                                   {"reason": "search_public_query"})
        if selection is None:
            raise UnsupportedQuery("search_id goes with a selection query (keys only, ORDER BY an aggregate, "
                                   "LIMIT k); charge other steps of a search through /v1/ledger/charges",
                                   {"reason": "search_needs_selection"})
        if search_id is not None:  # the consumer's own search only (another's: NotFound)
            self.searches.check_open(search_id, population=policy.population, consumer=consumer)
        release = run_selection(self, dataset, policy, selection, budget, consumer, search_id=search_id)
        if search_id is not None:
            self.searches.record_selection(search_id, release, consumer=consumer)
        return release

    def _serve(self, hit: Release, policy: DatasetPolicy, plan: QueryPlan, key: str,
               display: list[str]) -> dict[str, Any]:
        """Serve a stored release for ``plan`` at no cost.

        The same query (same plan hash) under the same display settings gets the stored
        release under this request's column labels. A query that differs in
        post-processing — outputs, HAVING, ORDER BY, LIMIT, or the policy's display
        settings since the release was made — gets a new release derived from the stored
        noisy primitives with the rules in force now (post-processing: free, Dwork & Roth
        2014 Prop. 2.1), stored under its own key and pointing at the release it was
        derived from.
        """
        settings = post_processing_settings(policy)
        same = hit.plan_hash == plan.plan_hash and hit.post_processing == settings
        if same or hit.noisy is None:
            return _rename(hit.to_dict(cached=True), display)
        noisy = hit.noisy
        ids = {_primitive_sig(p): p.id for p in plan.primitives}
        keys = {c: _array(v) for c, v in noisy.keys.items()}
        values = {ids[s]: _array(v) for s, v in noisy.values.items()}
        scales = {ids[s]: float(v) for s, v in noisy.scales.items()}
        halfwidths = {ids[s]: float(v) for s, v in noisy.halfwidths.items()}
        table = finalize(plan, policy, keys, values, scales, halfwidths, mechanism=hit.document["mechanism"])
        labels = [o.label or o.name for o in plan.outputs if not o.hidden]
        doc = dict(hit.document)
        release_id, created = new_release_id(), now()
        doc.update({
            "release_id": release_id,
            "columns": labels,
            "rows": [list(r) for r in table.rows],
            "accuracy": _relabel(table.accuracy, list(table.columns), labels),
            "created_at": created,
            "plan_hash": plan.plan_hash,
            "canonical_sql": plan.canonical_sql,
            "noise_scales": scales,
            "noise_scale_units": noise_scale_units(policy, plan, scales),
            "post_processing": settings,
            "derived_from": hit.release_id,
        })
        derived = Release(release_id, key, policy.name, plan.plan_hash, created, doc, noisy)
        stored = self.release_store.put(derived)
        return _rename(stored.to_dict(cached=True), display)

    def _run_bounded(self, run, plan: QueryPlan, policy: DatasetPolicy, *, salt: int):
        """``run`` (the engine's check or execute) on the plan's bounded query.

        Where the engine's load found one row per privacy unit in the table, the query
        skips the per-unit aggregation (same bounded values, less work; see
        :mod:`dpgate.sql.bound`). The engine refuses such a query with ``Conflict`` if a
        reload swapped in data without that property meanwhile; it then runs once more
        in the general form, so a reload never fails a charged query.
        """
        # A joined table (joins hook) never takes the fast path: a join can give one unit
        # several rows even where each table read has one row per unit.
        unique = not isinstance(policy.table(plan.table), JoinedTable) and \
            self.engine.unit_is_unique(policy.name, plan.table)
        if not unique:
            return run(bounded_query(plan, policy, salt=salt))
        try:
            return run(bounded_query(plan, policy, salt=salt, unit_unique=True))
        except Conflict:
            return run(bounded_query(plan, policy, salt=salt))

    def _compute(self, policy: DatasetPolicy, plan: QueryPlan, cal, resolved: Mapping[str, Any],
                 receipt, key: str, version: str) -> Release:
        salt = self._salt_source()
        try:
            if isinstance(cal, PlanCalibration):  # quantiles hook
                keys, noisy, halfwidths = self._compute_quantiles(policy, plan, cal, salt)
            else:
                values = self._run_bounded(self.engine.execute, plan, policy, salt=salt)
        except DpgateError:
            raise
        except Exception as exc:  # noqa: BLE001 - no data in the message
            raise ExecutionError("executing the bounded query failed; the charge stays",
                                 {"charge_id": receipt and receipt.charge_id}) from exc
        del salt
        if not isinstance(cal, PlanCalibration):
            if getattr(cal, "selection", None) is not None:  # issue 11 hook: threshold, then noise on the selected rows
                keys, noisy = partition_selection.select_rows(plan, policy, cal, values)
            else:
                keys = {k: values[k] for k in plan.group_by}
                noisy = sample(cal, {p.id: values[p.id] for p in plan.primitives})
            halfwidths = {pid: ci95_halfwidth(cal.mechanism, s) for pid, s in cal.scales.items()}
        sig = {p.id: _primitive_sig(p) for p in plan.primitives}
        table = finalize(plan, policy, keys, noisy, cal.scales, halfwidths, mechanism=cal.mechanism)
        table_policy = policy.table(plan.table)
        cap = receipt.cap.public() if getattr(receipt, "cap", None) is not None \
            else {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta}
        release_id, created = new_release_id(), now()
        document = {
            "release_id": release_id,
            "dataset": policy.name,
            "table": plan.table,
            "columns": [o.label or o.name for o in plan.outputs if not o.hidden],
            "rows": [list(r) for r in table.rows],
            "accuracy": _relabel(table.accuracy, list(table.columns),
                                 [o.label or o.name for o in plan.outputs if not o.hidden]),
            "charge": None if receipt is None else {
                "charge_id": receipt.charge_id,
                "rho": receipt.rho,
                "epsilon_at_delta": receipt.epsilon_at_delta,
                "delta": receipt.delta,
                "consumer": receipt.consumer,
                **({"selection_delta": receipt.selection_delta} if getattr(receipt, "selection_delta", 0) else {}),
            },
            "cached": False,
            "data_version": version,
            "created_at": created,
            "plan_hash": plan.plan_hash,
            "canonical_sql": plan.canonical_sql,
            "mechanism": cal.mechanism,
            "noise_scales": dict(cal.scales),
            "noise_scale_units": noise_scale_units(policy, plan, cal.scales),
            "budget": dict(resolved, **({"accuracy_target": ci95_rules(
                _cell_targets(policy, plan), resolved["ci95"], resolved.get("expected_count"))}
                if "ci95" in resolved else {})),
            "bounds": {
                "privacy_unit": table_policy.privacy_unit,
                "max_groups_per_unit": table_policy.max_groups_per_unit,
                "max_rows_per_unit": table_policy.max_rows_per_unit,
                "columns": {
                    c: {"lower": col.lower, "upper": col.upper, "resolution": col.resolution}
                    for c, col in table_policy.columns.items() if col.bounded
                },
            },
            # the range each aggregate's true value lies in, and whether the value is clamped to it
            # (issue 24: error bars clipped to the declared bounds, clamped values marked)
            "value_ranges": value_ranges(plan, policy),
            "post_processing": post_processing_settings(policy),
            **({"partition_selection": partition_selection.describe(plan, cal, resolved["selection_delta"])}
               if getattr(cal, "selection", None) is not None else {}),
            # the published guarantee: the cap the ledger enforced when it charged this release
            "guarantee": {
                "population": policy.population,
                "privacy_unit": table_policy.privacy_unit or "record",
                "cap": cap,
                **release_guarantee(policy, receipt),  # issue 23: renewal rule, cohorts drawn on
            },
        }
        # the noisy primitives themselves (DP outputs), so that queries differing only in
        # post-processing are answered from them for free; stored, never served
        primitives = NoisyPrimitives(
            keys={c: np.asarray(v).tolist() for c, v in keys.items()},
            values={sig[pid]: [int(x) for x in np.asarray(v).tolist()] for pid, v in noisy.items()},
            scales={sig[pid]: float(s) for pid, s in cal.scales.items()},
            halfwidths={sig[pid]: float(h) for pid, h in halfwidths.items()},
        )
        return Release(release_id, key, policy.name, plan.plan_hash, created, document, primitives)

    def _compute_quantiles(self, policy: DatasetPolicy, plan: QueryPlan, cal: PlanCalibration, salt: int):
        """Keys, noisy values and half-widths of a plan with quantiles (quantile index per group)."""
        base = without_quantiles(plan)
        keys: dict[str, Any] = {}
        noisy: dict[str, Any] = {}
        if base.primitives:
            values = self._run_bounded(self.engine.execute, base, policy, salt=salt)
            keys = {k: values[k] for k in plan.group_by}
            noisy = dict(sample(cal.base, {p.id: values[p.id] for p in base.primitives}))
        qkeys, qnoisy = quantile_release.run(plan, policy, cal, self.engine.execute, salt)
        noisy.update(qnoisy)
        return keys or qkeys, noisy, cal.halfwidths()

    def _public_release(self, policy: DatasetPolicy, plan: QueryPlan) -> dict[str, Any]:
        """The exact answer of a query that reads public tables only (no charge, no noise).

        Public tables hold nothing to protect (``public = true`` in the policy), so the
        release is the exact result of SQL generated from the plan
        (:func:`dpgate.sql.public.exact_sql`), marked ``exact`` and ``public`` and stored
        like any release; it is not charged and carries no accuracy entries.
        """
        version = self._data_version(policy.name)
        try:
            values = self.engine.execute(exact_query(plan, policy))
        except DpgateError:
            raise
        except Exception as exc:  # noqa: BLE001 - public data, but keep one error shape
            raise ExecutionError("executing the exact query on public tables failed") from exc
        names = [o.name for o in plan.visible_outputs]
        columns = [[_plain(v) for v in np.asarray(values[n]).tolist()] for n in names]
        rows = [list(r) for r in zip(*columns)] if columns else []
        if reads_rows(plan) and len(rows) > MAX_PUBLIC_ROWS:
            raise UnsupportedQuery(
                f"the query reads more than {MAX_PUBLIC_ROWS:,} rows of a public table: narrow it with "
                "WHERE or LIMIT, or aggregate (nothing was charged: public data costs nothing)",
                {"rows": MAX_PUBLIC_ROWS, "charged": False})
        return self._store_free_release(policy, plan, rows, version, key_prefix="public", extra={
            "public": True,
            "note": "this query reads public tables only (public = true in the policy): answered "
                    "exactly and at no privacy cost",
        })

    def _public_keys_release(self, policy: DatasetPolicy, plan: QueryPlan) -> dict[str, Any]:
        """The release of a keys-only query whose keys are all public (no charge, no data read).

        ``SELECT educ FROM pums GROUP BY educ`` asks which keys there are; with public keys
        that is the policy's key list (every combination, as any GROUP BY over public keys
        releases it, empty groups included), which is a function of the policy alone and
        so costs nothing. Which keys occur in the data is *not* released: that would need a
        noisy count per key (ask ``COUNT(*)``) or private partition selection (keys without
        public keys). HAVING / ORDER BY / LIMIT / select-list expressions run on the keys
        (:func:`dpgate.postprocess.finalize`).
        """
        table = finalize(plan, policy, public_key_columns(plan, policy), {}, {}, {}, mechanism="none")
        return self._store_free_release(policy, plan, [list(r) for r in table.rows], self._data_version(policy.name),
                                        key_prefix="keys",
                                        extra={"public_keys_only": True, "note": _KEYS_ONLY_NOTE})

    def _store_free_release(self, policy: DatasetPolicy, plan: QueryPlan, rows: list[list[Any]], version: str, *,
                            key_prefix: str, extra: Mapping[str, Any]) -> dict[str, Any]:
        """Store and return an exact release that costs nothing (public data or public keys only).

        ``version`` is the data version read before the rows were; ``extra`` adds the kind's own
        fields (``public`` or ``public_keys_only``, and a ``note``).
        """
        release_id, created = new_release_id(), now()
        document = {
            "release_id": release_id,
            "dataset": policy.name,
            "table": plan.table,
            "columns": [o.label or o.name for o in plan.visible_outputs],
            "rows": rows,
            "accuracy": {},
            "charge": None,
            "cached": False,
            "exact": True,
            **extra,
            "data_version": version,
            "created_at": created,
            "plan_hash": plan.plan_hash,
            "canonical_sql": plan.canonical_sql,
            "mechanism": None,
            "noise_scales": {},
            "budget": None,
            "guarantee": {"population": policy.population, "public_data": True},
        }
        key = f"{key_prefix}:{plan.plan_hash}:{version}:{release_id}"
        stored = self.release_store.put(Release(release_id, key, policy.name, plan.plan_hash, created, document, None))
        return stored.to_dict(cached=False)

    # ----------------------------------------------------------------- releases

    def release(self, release_id: str) -> dict[str, Any]:
        """A stored release (free); raises :class:`~dpgate.errors.NotFound`."""
        return self.release_store.get(release_id).to_dict(cached=True)

    def releases(self, dataset: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Stored releases, newest first (free); ``dataset`` must exist if given."""
        if dataset is not None:
            self.policy(dataset)
        return [r.to_dict(cached=True) for r in self.release_store.list(dataset, limit=limit)]

    # ----------------------------------------------------------------- dashboards

    def dashboard_pins(self, dashboard: str) -> list[dict[str, Any]]:
        """The releases pinned to the dashboard of dataset ``dashboard``, oldest first: each pin
        (``release_id``, ``title``, ``pinned_by``, ``pinned_at``) with its ``release`` document
        (free: stored releases only). Raises UnknownDataset."""
        self.policy(dashboard)
        out = []
        for pin in self.release_store.pins(dashboard):
            try:
                out.append({**pin, "release": self.release(pin["release_id"])})
            except NotFound:  # pragma: no cover - releases are never deleted
                continue
        return out

    def pin_release(self, dashboard: str, release_id: str, *, title: str, actor: str) -> dict[str, Any]:
        """Pin a stored release of dataset ``dashboard`` to its dashboard, with a title in the
        pinner's words (empty: the page derives one from the release's column names).

        Raises:
            UnknownDataset: no such dataset. NotFound: no such release.
            InvalidRequest: the release is of another dataset, the title is too long, or the
                dashboard has :data:`dpgate.releases.store.MAX_PINS` pins.
        """
        self.policy(dashboard)
        release = self.release_store.get(release_id)
        if release.dataset != dashboard:
            raise InvalidRequest(f"release {release_id} is of dataset {release.dataset!r}, not {dashboard!r}",
                                 {"release_id": release_id, "dataset": release.dataset})
        return self.release_store.pin(dashboard, release_id, title=title, actor=actor)

    def unpin_release(self, dashboard: str, release_id: str) -> bool:
        """Remove a release from the dashboard of dataset ``dashboard``; True if it was pinned."""
        self.policy(dashboard)
        return self.release_store.unpin(dashboard, release_id)

    # ----------------------------------------------------------------- ledger

    def charge_external(self, population: str, consumer: str, *, curve: list[float] | None = None,
                        orders: list[float] | None = None, rho: float | None = None, kind: str = "rdp",
                        purpose: str, actor: str, search_id: str | None = None, candidate: str | None = None,
                        step: str | None = None, outcome: str | None = None, attempt: int | None = None,
                        note: str | None = None, any_search: bool = False,
                        dp_sgd: Mapping[str, Any] | None = None,
                        cohorts: list[str] | None = None) -> dict[str, Any]:
        """Charge a cost computed by an external accountant, or a DP-SGD run described by its
        parameters (``dp_sgd``: the gateway computes the curve, :mod:`dpgate.training`).

        A curve may be given on the caller's own order grid (the orders its accountant
        used): it is mapped onto the ledger's grid conservatively by
        :func:`dpgate.accounting.curve_on_grid` (Rényi divergence is non-decreasing in its
        order, so each ledger order takes the value at the next caller order above it; no
        claim above the caller's largest order). The filter checks only the orders up to
        the population's α_cap (:meth:`ledger_orders`), so a curve that explodes at high
        orders, like DP-SGD's, fits if the cap's guarantee allows it. The caller's own
        orders and curve are kept in the charge's metadata.

        Args:
            population, consumer: who pays.
            curve: RDP ε(α) at ``orders`` (default: the ledger's
                :data:`~dpgate.accounting.ORDERS`) for ``kind = "rdp"``; total for this charge.
            orders: the caller's ascending orders α > 1 (``inf`` allowed), or None.
            rho: total ρ for ``kind = "zcdp"`` or ``"gaussian"`` (continuous Gaussian).
            dp_sgd: ``{q, noise_multiplier, steps, sampler}``: the gateway computes the run's curve
                (amplified only for ``sampler = "poisson"``); with ``curve`` too, the caller's curve
                ("caller's accountant") must be at least the gateway's (:func:`dpgate.training.external_cost`).
            cohorts: for a population with cohorts, the cohorts whose units the run read (default:
                every cohort the population's policies declare).
            purpose, actor: recorded with the charge.
            search_id: the search this charge is a step of (issue 15): it must be open and spend
                ``population``; the step records ``candidate`` (declared in the search),
                ``step`` (training, retry, evaluation, stopping, other; default training),
                ``outcome`` (completed, failed, target_missed, discarded, aborted), ``attempt``
                and ``note``, with the accountant's state after the charge. A failed run or a
                retry is charged and recorded like any other. The search must be ``consumer``'s:
                another consumer's is NotFound (as a missing one), checked before the charge.
            any_search: an admin's charge: any consumer's search is visible, but it must still be
                the search's consumer that pays (InvalidRequest otherwise).
        Raises:
            InvalidBudget: malformed cost, or no claim at an order the cap checks.
            UnknownPopulation / UnknownConsumer.
            BudgetExhausted: it does not fit (nothing written); the message names the order
                that failed and by how much.
        """
        if population not in self.ledger.populations():
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        metadata: dict[str, Any] = {"actor": actor, "external": True}
        if search_id is None and any(v is not None for v in (candidate, step, outcome, attempt, note)):
            raise InvalidRequest("candidate, step, outcome, attempt and note go with a search_id",
                                 {"field": "search_id"})
        if search_id is not None:  # search hook (issue 15): validated before anything is charged
            from dpgate.searches.record import OUTCOMES, STEP_KINDS

            step = step or "training"
            if step not in STEP_KINDS:
                raise InvalidRequest(f"step must be one of {', '.join(STEP_KINDS)}", {"field": "step"})
            if outcome is not None and outcome not in OUTCOMES:
                raise InvalidRequest(f"outcome must be one of {', '.join(OUTCOMES)}", {"field": "outcome"})
            if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)
                                        or not 1 <= attempt <= 10_000):
                raise InvalidRequest("attempt must be an integer in [1, 10000]", {"field": "attempt"})
            self.searches.check_open(search_id, population=population, consumer=consumer, candidate=candidate,
                                     any_consumer=any_search)
            metadata.update({"search_id": search_id, "search_step": step})
            if candidate is not None:
                metadata["candidate"] = candidate
        from dpgate.training import external_cost  # training-runs hook (issue 23)

        cost, how = external_cost(kind=kind, curve=curve, orders=orders, rho=rho, dp_sgd=dp_sgd)
        metadata.update(how)
        scope = self._external_cohorts(population, cohorts)  # cohorts hook (issue 23)
        receipt = self.ledger.charge(population, consumer, cost, purpose=purpose, metadata=metadata,
                                     **({"cohorts": scope} if scope is not None else {}))
        out = receipt.to_dict()
        out["accountant"] = how["accountant"]
        if "dp_sgd" in how:
            out.update(dp_sgd=how["dp_sgd"], formula=how["formula"])
        if search_id is not None:
            recorded = self.searches.record_charge(search_id, out, step=step or "training", candidate=candidate,
                                                   outcome=outcome, attempt=attempt, note=note)
            out["search_id"] = search_id
            out["search_step"] = recorded["step"]
        return out

    # ----------------------------------------------------------------- searches (issue 15)

    def create_search(self, spec: Mapping[str, Any], *, consumer: str, actor: str) -> dict[str, Any]:
        """Declare a search (:meth:`dpgate.searches.Searches.create`); charges nothing."""
        return self.searches.create(spec, consumer=consumer, actor=actor)

    def search(self, search_id: str, *, owner: str | None = None) -> dict[str, Any]:
        """A search record with every step, the accountant's state after each, and its replay.

        ``owner``: the consumer the caller acts for (another consumer's search is NotFound, as a
        missing one); None: any consumer's (admin, operator)."""
        return self.searches.get(search_id, owner=owner)

    def search_list(self, population: str | None = None, *, limit: int = 100,
                    owner: str | None = None) -> list[dict[str, Any]]:
        """Searches, newest first; only ``owner``'s when given (None: every consumer's)."""
        return self.searches.list(population, limit=limit, consumer=owner)

    def close_search(self, search_id: str, *, selected: str, artifacts: list[str],
                     selection_release: str | None = None, note: str | None = None, actor: str,
                     owner: str | None = None) -> dict[str, Any]:
        """Close a search with its selected candidate and artifacts (:meth:`dpgate.searches.Searches.close`);
        ``owner`` as in :meth:`search`."""
        return self.searches.close(search_id, selected=selected, artifacts=artifacts,
                                   selection_release=selection_release, note=note, actor=actor, owner=owner)

    def ledger_entries(self, population: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Ledger charges (oldest first), optionally of one population."""
        return self.ledger.entries(population, limit=limit)

    def ledger_events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events (cap and allocation changes) with who, when, old, new and reason."""
        return self.ledger.events(population)

    def set_cap(self, population: str, *, epsilon: float, delta: float, actor: str, reason: str) -> dict[str, Any]:
        """Record a cap change as a governance event (never an edit). It stays: the ledger owns
        the cap, and no restart or CLI command puts the policy file's value back.

        Returns:
            :meth:`Ledger.set_cap`'s answer: the event, and whether the cap is now exhausted
            (``exhausted``, ``over_by`` when lowered below what was spent).
        Raises:
            UnknownPopulation, InvalidBudget, InvalidRequest.
        """
        if population not in self.ledger.populations():
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        return self.ledger.set_cap(population, epsilon=epsilon, delta=delta, actor=actor, reason=reason)

    def _external_cohorts(self, population: str, cohorts: list[str] | None) -> tuple[str, ...] | None:
        """The cohorts an external charge draws on: None for a population without cohorts; else the
        named ones (each declared by a policy of the population) or, by default, every declared one.

        Raises:
            InvalidRequest: cohorts for a population without, or a cohort no policy declares.
        """
        declared = population_cohorts(self.policies, population)
        if self.ledger.cohort_column(population) is None:  # the ledger's rule holds (policy cohorts: drift)
            declared = None
        if declared is None:
            if cohorts is not None:
                raise InvalidRequest(f"population {population!r} has no cohorts: do not name any",
                                     {"field": "cohorts"})
            return None
        if cohorts is None:
            return declared
        unknown = sorted(set(cohorts) - set(declared))
        if unknown:
            raise InvalidRequest(f"population {population!r} declares no cohort {unknown[0]!r}",
                                 {"field": "cohorts", "declared": list(declared)})
        return tuple(sorted(set(cohorts)))

    def renew(self, population: str, *, actor: str, reason: str) -> dict[str, Any]:
        """A request to renew (reset) a population's spent budget: always refused (issue 23 item 2).

        Raises:
            UnknownPopulation: no such population.
            RenewalRefused: with the arithmetic of renewing at the cap's rate (12 and 36 periods), or,
                for a population with cohorts, that it renews only by opening new cohorts.
        """
        from dpgate.ledger.renewal import renewal_refused

        if population not in self.ledger.populations():
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        raise renewal_refused(population, self.ledger.cap(population), f"renewing population {population!r}",
                              cohort_column=self.ledger.cohort_column(population))

    def ledger_orders(self) -> dict[str, Any]:
        """The ledger's RDP order grid and, per population, the orders its filter checks.

        Returns:
            ``{orders: [...], populations: {name: {alpha_cap, rule, checked_orders, rho_cap,
            epsilon, delta, selection_delta}}}`` (the order ∞ as ``"inf"``). External
            accountants should give ε(α) at least at every order up to α_cap; curves on
            other grids are mapped conservatively.
        """
        pops: dict[str, Any] = {}
        for name in self.ledger.populations():
            cap = self.ledger.cap(name)
            pops[name] = {**cap.public(), "checked_orders": list(cap.checked_orders)}
        return {"orders": ["inf" if math.isinf(a) else a for a in accounting.ORDERS],
                "finite_orders": list(FINITE_ORDERS), "populations": pops}


#: What a keys-only release over public keys is (release note and explain message).
_KEYS_ONLY_NOTE = ("keys only, all public: the release lists the policy's public key values (every "
                   "combination), not the keys present in the data; it reads no data and costs "
                   "nothing. Add COUNT(*) to learn which keys have rows")


def population_policies(policies: Mapping[str, DatasetPolicy]) -> dict[str, DatasetPolicy]:
    """One policy per population (the policy loader already checks that datasets of one
    population state the same cap and allocations)."""
    out: dict[str, DatasetPolicy] = {}
    # a proxy dataset (provenance set, every table public) never charges: the protected dataset speaks
    for name in sorted(policies, key=lambda n: (getattr(policies[n], "provenance", None) is not None, n)):
        out.setdefault(policies[name].population, policies[name])
    return out


def _cap_arguments(policy: DatasetPolicy) -> dict[str, Any]:
    """The ledger arguments of a policy file's cap and allocations."""
    args: dict[str, Any] = {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta,
                            "allocations": dict(policy.allocations)}
    selection = getattr(policy.budget, "selection_delta", None)
    if selection is not None:
        args["selection_delta"] = selection
    cohorts = getattr(policy, "cohorts", None)
    if cohorts is not None:  # issue 23: one budget per cohort
        args["cohort_column"] = cohorts.column
    return args


def _stated(cost: accounting.Cost, delta: float) -> dict[str, float]:
    """``{epsilon_at_delta, delta}`` of a cost as its receipt will state it (the ledger's one
    conversion at the δ it is charged at; a pure-ε cost at δ = 0):
    :func:`dpgate.ledger.filter.charge_statement`."""
    eps, d = charge_statement(cost, delta)
    return {"epsilon_at_delta": eps, "delta": d}


def ensure_populations(ledger: Ledger, policies: Mapping[str, DatasetPolicy]) -> dict[str, PolicyDrift]:
    """Create every population the policies name that the ledger lacks, and report drift.

    Never changes an existing population (the ledger owns its cap and allocations).

    Returns:
        population → :class:`~dpgate.ledger.base.PolicyDrift`.
    Raises:
        PolicyError: a policy's cap or allocations are invalid. LedgerError: store failure.
    """
    return {pop: ledger.ensure_population(pop, **_cap_arguments(policy), reason=f"policy file {policy.path}"
                                          if getattr(policy, "path", None) else "policy file")
            for pop, policy in population_policies(policies).items()}


def apply_policies(ledger: Ledger, policies: Mapping[str, DatasetPolicy], *, actor: str, reason: str,
                   population: str | None = None) -> list[dict[str, Any]]:
    """Adopt the policy files' caps and allocations as governance events (``dpgate caps apply``).

    Args:
        ledger: the ledger.
        policies: dataset → policy.
        actor, reason: recorded with every event.
        population: only this population (None: every population the policies name).

    Returns:
        One :meth:`Ledger.apply_policy` answer per population (populations the ledger lacks
        are created first, from the same values).
    Raises:
        UnknownPopulation: ``population`` is named by no policy. PolicyError, InvalidRequest,
        LedgerError.
    """
    chosen = population_policies(policies)
    if population is not None:
        if population not in chosen:
            raise UnknownPopulation(f"no policy file names population {population!r}",
                                    {"population": population, "populations": sorted(chosen)})
        chosen = {population: chosen[population]}
    check_population_moves(ledger, {n: p for n, p in policies.items() if p.population in chosen})
    out = []
    for pop, policy in chosen.items():
        ledger.ensure_population(pop, **_cap_arguments(policy), reason=f"policy file {policy.path}")
        out.append(ledger.apply_policy(pop, **_cap_arguments(policy), actor=actor, reason=reason))
    return out


def check_population_moves(ledger: Ledger, policies: Mapping[str, DatasetPolicy]) -> None:
    """Refuse a policy edit that moves a dataset with charges to a population the ledger lacks
    (a renamed ``[dataset] population``): the new population would give the same units a fresh
    budget (issue 23 item 2, :mod:`dpgate.ledger.renewal`). One read of the population names; the
    charges are searched only for a population about to be created.

    Raises:
        RenewalRefused: naming the dataset, the old and the new population, with the arithmetic.
    """
    from dpgate.ledger.renewal import renewal_refused

    existing = set(ledger.populations())
    for name, policy in sorted(policies.items()):
        if policy.population in existing or getattr(policy, "provenance", None) is not None:
            continue
        finder = getattr(ledger, "populations_charged_for", None)
        old = [p for p in (finder(name) if finder is not None else []) if p != policy.population]
        if old:
            raise renewal_refused(
                old[0], ledger.cap(old[0]),
                f"moving dataset {name!r} from population {old[0]!r} (where it has charges) to the new population "
                f"{policy.population!r} (if the dataset now holds different people, give it a new dataset name)",
                cohort_column=ledger.cohort_column(old[0]) if hasattr(ledger, "cohort_column") else None)


def _cell_targets(policy: DatasetPolicy, plan: QueryPlan) -> list[CellTarget]:
    """The aggregate outputs of ``plan`` as ``ci95`` targets (name, function, primitives, bounds)."""
    table = policy.table(plan.table)
    targets = []
    for o in plan.outputs:
        if isinstance(o, AggregateOutput):
            col = plan.column_policy(table, o.column) if o.column else None
            bounds = (float(col.lower), float(col.upper)) if col is not None and col.bounded else None
            targets.append(CellTarget(o.label or o.name, o.function, tuple(o.primitives), bounds))
    return targets


def _output_unit(policy: DatasetPolicy, plan: QueryPlan, primitive_id: str) -> float:
    """Size of one integer unit of a primitive in output units (1 for counts)."""
    p = plan.primitive(primitive_id)
    table = policy.table(plan.table)
    return output_unit(p.kind, plan.column_policy(table, p.column).resolution if p.column else None)


def noise_scale_units(policy: DatasetPolicy, plan: QueryPlan, scales: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """What each ``noise_scales`` entry is measured in, and its size in the output's units.

    ``noise_scales`` holds the scale the sampler used, on the integer scale the
    bounded query computes (the σ of the discrete Gaussian, or the discrete Laplace
    scale b): for a count, in rows or units (= output units); for a ``sum``, in
    integer steps of the column's ``resolution``; for a ``sum_squares``, in steps of
    resolution²; for a quantile, the rank scale ``s_r`` in ranks. The ``accuracy``
    entries (``sigma``/``scale``, ``ci95``) are in the output's units. This document
    relates the two.

    Returns:
        primitive id → ``{"kind", "column", "in", "unit", "value_scale"}``: ``in`` says
        the unit in words, ``unit`` is the output units per integer step (1,
        resolution, resolution²; None for a quantile) and ``value_scale`` =
        scale × unit (None for a quantile: a rank scale has no value-scale figure).
    """
    out: dict[str, dict[str, Any]] = {}
    for pid, scale in scales.items():
        p = plan.primitive(pid)
        if p.kind == "quantile":
            out[pid] = {"kind": p.kind, "column": p.column, "in": "ranks (the quantile's rank scale)",
                        "unit": None, "value_scale": None}
            continue
        unit = _output_unit(policy, plan, pid)
        if p.kind == "sum":
            words = f"integer steps of the resolution {unit:g}"
        elif p.kind == "sum_squares":
            words = f"integer steps of resolution² ({unit:g})"
        else:
            words = "rows or units counted (output units)"
        out[pid] = {"kind": p.kind, "column": p.column, "in": words, "unit": unit,
                    "value_scale": float(scale) * unit}
    return out


def _primitive_sig(p) -> str:
    """A primitive's identity independent of its id: ``kind:column`` (``:alpha`` for quantiles)."""
    alpha = getattr(p, "alpha", None)
    return f"{p.kind}:{p.column or ''}" + (f":{alpha!r}" if alpha is not None else "")


def _engine_statements(plan: QueryPlan, policy: DatasetPolicy) -> list:
    """The statements (sqlglot trees) the engine will run for ``plan`` (salt 0), to bind before the charge."""
    if not has_quantiles(plan):
        return [bounded_query(plan, policy, salt=0)]
    base = without_quantiles(plan)
    out = [bounded_query(base, policy, salt=0)] if base.primitives else []
    columns = dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile")
    return out + [histogram_query(plan, policy, c, salt=0) for c in columns]


def _bounded_template(plan: QueryPlan, policy: DatasetPolicy) -> str | None:
    """The bounded SQL of the count/sum primitives (salt hidden); None when there are none."""
    if not has_quantiles(plan):
        return bounded_sql_template(plan, policy)
    base = without_quantiles(plan)
    return bounded_sql_template(base, policy) if base.primitives else None


def _primitive_text(p) -> str:
    """A primitive as the analyst would read it: ``SUM(cost)``, ``SUM(cost²) (behind VAR/STDDEV)``, …"""
    col = p.column or "*"
    return {
        "count": "COUNT(*)",
        "count_column": f"COUNT({col})",
        "count_distinct_unit": "COUNT(DISTINCT <privacy unit>)",
        "count_distinct": f"COUNT(DISTINCT {col})",
        "sum": f"SUM({col})",
        "sum_squares": f"the sum of squares of {col} (behind VAR/STDDEV)",
        "quantile": f"the quantile of {col}",
    }.get(p.kind, f"the aggregate of {col}")


def _noise_signature(plan: QueryPlan, *, cell_targets: bool = False) -> str:
    """SHA-256 of what a plan noises: table, filter, grouping, primitives, policy digest.

    Post-processing (outputs, their order and names, HAVING, ORDER BY, LIMIT) is
    left out: plans equal here are answered from the same noisy primitives. With
    ``cell_targets`` (a ``{"ci95": w}`` budget) the aggregate outputs enter too: the
    noise scales are then calibrated for those released cells (an AVG's sum gets less
    noise than a bare SUM's at the same ``w``), so noise calibrated for one set of
    outputs must not answer another.
    """
    body: dict[str, Any] = {
        "dataset": plan.dataset, "table": plan.table, "where": plan.where,
        "group_by": list(plan.group_by), "policy": getattr(plan, "policy_digest", ""),
        "primitives": sorted(_primitive_sig(p) for p in plan.primitives),
    }
    if getattr(plan, "computed_keys", ()):  # what a computed key means is part of what is noised
        body["computed_keys"] = [dataclasses.asdict(k) for k in plan.computed_keys]
    if cell_targets:
        body["cells"] = sorted(f"{o.function}:{o.column or ''}" for o in plan.outputs if isinstance(o, AggregateOutput))
    payload = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "noise:" + hashlib.sha256(payload.encode()).hexdigest()


def _plain(v: Any) -> Any:
    """A JSON-ready cell of an exact public answer (NaN/±inf → None; dates as ISO text)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return v.isoformat() if hasattr(v, "isoformat") else str(v)


def _array(values: list) -> np.ndarray:
    """A stored JSON list back as a NumPy vector (ints stay ints; text keys as objects)."""
    arr = np.asarray(values)
    return arr if arr.dtype.kind in "iufb" else np.asarray(values, dtype=object)


def fingerprint_key(settings: Settings, store: ReleaseStore) -> bytes:
    """The secret that keys published data fingerprints.

    A plain hash of the source files would be a deterministic, noiseless function
    of the data: an adversary who knows every row but one could test candidates
    against it. Keyed with a secret (HMAC-SHA-256) the published version is
    pseudorandom to anyone without the key. The key is ``DPGATE_FINGERPRINT_KEY``
    if set; otherwise it lives in the release store, next to the ledger, so that
    every replica sharing a (PostgreSQL) ledger shares it — and with it data
    versions and cached releases. The first process to start stores a random key
    (atomically: concurrent first starts all read the one stored); a key kept in
    ``$DPGATE_HOME/fingerprint.key`` by earlier versions is adopted, so published
    versions do not change.

    Raises:
        LedgerError: the store cannot be read or written.
    """
    if settings.fingerprint_key:
        return settings.fingerprint_key.encode()
    legacy = settings.home / "fingerprint.key"
    candidate = secrets.token_hex(32)
    try:
        text = legacy.read_text().strip()
        if text:
            candidate = text
    except OSError:
        pass
    return store.shared_secret("fingerprint_key", candidate).encode()


def _published_version(version: str, key: bytes) -> str:
    """A policy-declared version as is; a source fingerprint as ``fp-`` + HMAC(key, fingerprint)."""
    if not version.startswith("sha256:"):
        return version
    return "fp-" + hmac.new(key, version.encode(), hashlib.sha256).hexdigest()[:24]


def _relabel(accuracy: Mapping[str, Any], names: list[str], labels: list[str]) -> dict[str, Any]:
    mapping = dict(zip(names, labels))
    return {mapping.get(k, k): v for k, v in accuracy.items()}


def _rename(doc: dict[str, Any], display: list[str]) -> dict[str, Any]:
    """Serve a stored release under this request's output names (post-processing, free)."""
    old = doc.get("columns", [])
    if len(old) != len(display) or old == display:
        return doc
    mapping = dict(zip(old, display))
    doc["columns"] = list(display)
    if isinstance(doc.get("accuracy"), dict):
        doc["accuracy"] = {mapping.get(k, k): v for k, v in doc["accuracy"].items()}
    return doc


def _check_derived_outputs(plan: QueryPlan, policy: DatasetPolicy) -> None:
    """Refuse, before the charge, a select-list expression that post-processing cannot evaluate.

    Each :class:`~dpgate.sql.plan.DerivedOutput` is checked by
    :func:`dpgate.postprocess.check_postprocess_expression` on zero rows with the types its
    inputs can have (group keys: their type; aggregates: int and float), so that a charged
    release never fails in post-processing.

    Raises:
        UnsupportedQuery: an unsupported or non-deterministic construct, or a type error.
    """
    derived = [o for o in plan.outputs if isinstance(o, DerivedOutput)]
    if not derived:
        return
    table = policy.table(plan.table)
    keys: dict[str, str] = {}
    for o in plan.outputs:
        if isinstance(o, KeyOutput):
            computed = plan.computed_key(o.column)
            keys[o.name] = computed.type if computed is not None else table.column(o.column).type
    labels = {o.name: o.label or o.name for o in plan.outputs}
    try:
        for value_type in ("int", "float"):
            types = {**{o.name: value_type for o in plan.outputs if isinstance(o, AggregateOutput)}, **keys}
            for o in derived:
                check_postprocess_expression(o.expression, types)
    except UnsupportedQuery as e:
        raise _in_analyst_terms(e, labels) from None


def _in_analyst_terms(e: UnsupportedQuery, labels: Mapping[str, str]) -> UnsupportedQuery:
    """``e`` with the plan's output names (``"g0"``, ``"count"``) replaced by the titles the
    analyst gave them (``bin``, ``COUNT(*)``): internal names never reach a message."""
    def title(m: re.Match) -> str:
        name = m.group(1).replace('""', '"')
        return labels.get(name, m.group(0))

    quoted = re.compile(r'"((?:[^"]|"")+)"')
    details = {k: quoted.sub(title, v) if isinstance(v, str) else v for k, v in e.details.items()}
    return UnsupportedQuery(quoted.sub(title, e.message), details)

