"""The query pipeline of the gateway, without HTTP or CLI.

One query (see the design's "Data flow of one query")::

    policy → parse/plan → release cache lookup
        hit  → stored release, cost 0, cached = true
        miss → sensitivity + calibration → ledger.charge (before any data access)
             → bounded SQL in DuckDB → noise (OpenDP) → post-processing → store release

A query that fails validation, planning or calibration costs nothing. Once the
charge is written it stays, whatever happens after (execution error, timeout,
noise or storage failure): charges are never refunded.

Identical concurrent requests are *single-flight*: a per-cache-key lock in this
process, and the ledger's ``release_key`` across processes, give one charge and
one release.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from dpgate import accounting
from dpgate.engines import EngineOptions, EngineSet
from dpgate.errors import (
    Conflict,
    DpgateError,
    ExecutionError,
    InvalidBudget,
    UnknownDataset,
    UnknownPopulation,
)
from dpgate.ledger import Ledger, open_ledger
from dpgate.mechanisms import calibrate, ci95_halfwidth, sample, sigma_for_ci95
from dpgate.policy import DatasetPolicy, load_policies
from dpgate.postprocess import finalize
from dpgate.releases import Release, ReleaseStore, SqliteReleaseStore, cache_key
from dpgate.sensitivity import sensitivities
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_sql, bounded_sql_template
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import QueryPlan

#: Mechanism names accepted in requests and policies.
MECHANISMS = ("gaussian", "laplace")
#: How long a request waits for a release another process is computing (seconds).
PENDING_RELEASE_WAIT_S = 60.0


@dataclass(frozen=True)
class QueryBudget:
    """The budget a query asks for; at most one field is set (none: the policy's default).

    Attributes:
        rho: total zCDP ρ of this release (summed over its noisy primitives).
        epsilon: a standalone (ε, δ) guarantee for this release at the cap's δ,
            turned into ρ by the tight zCDP conversion (Canonne–Kamath–Steinke
            2020); for the Laplace mechanism the pure ε of the release.
        ci95: target 95 % interval half-width of each noisy primitive, in the
            primitive's output units (rows for counts, column units for sums).

    Raises:
        InvalidBudget: more than one field set, or a value that is not a finite
            positive number.
    """

    rho: float | None = None
    epsilon: float | None = None
    ci95: float | None = None

    def __post_init__(self) -> None:
        given = {k: v for k, v in (("rho", self.rho), ("epsilon", self.epsilon), ("ci95", self.ci95)) if v is not None}
        if len(given) > 1:
            raise InvalidBudget("give at most one of rho, epsilon, ci95", {"given": sorted(given)})
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidBudget(f"budget {name} must be a number", {"field": name})
            if not math.isfinite(value) or value <= 0:
                raise InvalidBudget(f"budget {name} must be a finite positive number", {"field": name})
            if value > 1e6:
                raise InvalidBudget(f"budget {name} is implausibly large (> 1e6)", {"field": name})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


class Gateway:
    """The in-process gateway: policies, the DuckDB engine, the ledger and the release store.

    Build it with :meth:`open` (which loads policies and data) or inject the
    parts (tests). All public methods return JSON-ready dicts and raise
    :class:`~dpgate.errors.DpgateError` subclasses. Thread-safe.

    Args:
        policies: dataset name → policy.
        engine: a loaded :class:`~dpgate.engines.EngineSet` (one engine per dataset).
        data_versions: dataset name → published data version (from ``EngineSet.load``,
            keyed by :func:`_published_version`); None for a live source whose version
            comes from ``version_sql`` per query, or is unknown (release cache off).
        salt_source: draws the secret that picks each unit's k groups (default: 63 bits
            from the OS CSPRNG; tests pass a constant to compare engines).
        ledger: the budget ledger.
        releases: the release store (same backend as the ledger).
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
    ) -> None:
        self.policies = dict(policies)
        self.engine = engine
        self.data_versions = dict(data_versions)
        self._salt_source = salt_source or (lambda: secrets.randbits(63))
        # keys published data fingerprints; a gateway built without one keys them per process
        self._fingerprint_key = fingerprint_key or secrets.token_bytes(32)
        self.ledger = ledger
        self.release_store = releases
        self._flights: dict[str, threading.Lock] = {}
        self._failed: set[str] = set()  # cache keys whose charged computation failed here
        self._flights_lock = threading.Lock()
        for policy in self.policies.values():
            ledger.ensure_population(
                policy.population,
                epsilon=policy.budget.epsilon,
                delta=policy.budget.delta,
                allocations=dict(policy.allocations),
            )

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
            ledger = open_ledger(settings.resolved_ledger_url())
        except BaseException:
            engine.close()
            raise
        store = open_release_store(ledger)
        key = _fingerprint_key(settings)
        versions = {name: None if v is None else _published_version(v, key) for name, v in versions.items()}
        return cls(policies, engine, versions, ledger, store, fingerprint_key=key, salt_source=salt_source)

    def close(self) -> None:
        """Close the release store, the ledger and the engine."""
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
            raise UnknownDataset(f"unknown dataset {dataset!r}", {"dataset": dataset}) from None

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
        The cap shown is the ledger's current one (after any recorded change).
        Raises :class:`UnknownDataset`.
        """
        policy = self.policy(name)
        report = self.ledger.spend(policy.population).to_dict()
        tables = {tname: table.to_dict() for tname, table in policy.tables.items()}
        return {
            "name": policy.name,
            "population": policy.population,
            "data_version": self.data_versions.get(name),
            **self._serving(name),
            "cap": report["cap"],
            "policy_cap": {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta},
            "allocations": dict(policy.allocations),
            "default_mechanism": policy.budget.mechanism,
            "default_query_rho": policy.budget.default_query_rho,
            "tables": tables,
        }

    def budget(self, dataset: str) -> dict[str, Any]:
        """Spend report of ``dataset``'s population: ρ and ε at the cap's δ, per allocation."""
        policy = self.policy(dataset)
        report = self.ledger.spend(policy.population).to_dict()
        report["dataset"] = dataset
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
        return f"unversioned:{uuid.uuid4().hex}"

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

    # ----------------------------------------------------------------- planning

    def _plan(self, dataset: str, sql: str) -> tuple[DatasetPolicy, QueryPlan]:
        policy = self.policy(dataset)
        if not isinstance(sql, str) or not sql.strip():
            from dpgate.errors import InvalidSql

            raise InvalidSql("the SQL text is empty")
        return policy, parse_query(sql, policy)

    def _mechanism(self, policy: DatasetPolicy, mechanism: str | None) -> str:
        mech = mechanism or policy.budget.mechanism
        if mech not in MECHANISMS:
            raise InvalidBudget(f"unknown mechanism {mech!r}; use one of {', '.join(MECHANISMS)}",
                                {"mechanism": mech})
        return mech

    @staticmethod
    def _resolve_budget(policy: DatasetPolicy, mech: str, budget: QueryBudget | None) -> dict[str, Any]:
        """The budget as it enters the cache key: ``{ci95}``, ``{rho}`` or ``{epsilon[, delta]}``.

        Cheap (no calibration), so that a cache hit does no privacy arithmetic.
        """
        budget = budget or QueryBudget()
        if budget.ci95 is not None:
            return {"ci95": float(budget.ci95)}
        if budget.epsilon is not None:
            if mech == "gaussian":  # a standalone (ε, δ) guarantee at the cap's δ
                return {"epsilon": float(budget.epsilon), "delta": policy.budget.delta}
            return {"epsilon": float(budget.epsilon)}
        rho = budget.rho if budget.rho is not None else policy.budget.default_query_rho
        return {"rho": float(rho)}

    def _calibrate(self, policy: DatasetPolicy, plan: QueryPlan, mech: str, resolved: Mapping[str, Any]):
        """Return (calibration, sensitivities) for a resolved budget (see :meth:`_resolve_budget`)."""
        sens = sensitivities(plan, policy)
        pairs = {pid: (s.l1, s.l2) for pid, s in sens.items()}
        if "ci95" in resolved:
            scales = {p.id: sigma_for_ci95(mech, resolved["ci95"] / _output_unit(policy, plan, p.id))
                      for p in plan.primitives}
            return calibrate(pairs, mechanism=mech, scales=scales), sens
        if mech == "gaussian":
            rho = (accounting.rho_for_cap(resolved["epsilon"], resolved["delta"], "tight")
                   if "epsilon" in resolved else resolved["rho"])
            return calibrate(pairs, mechanism=mech, rho=rho), sens
        # laplace: pure ε; a ρ budget buys ε = √(2ρ) (ε-DP ⇒ ε²/2-zCDP, Bun–Steinke 2016 Prop. 1.4)
        eps = resolved["epsilon"] if "epsilon" in resolved else math.sqrt(2.0 * resolved["rho"])
        return calibrate(pairs, mechanism=mech, epsilon=eps), sens

    # ----------------------------------------------------------------- explain

    def explain(self, dataset: str, sql: str, *, budget: QueryBudget | None = None,
                mechanism: str | None = None) -> dict[str, Any]:
        """Plan, bounded SQL (salt hidden), sensitivities and cost of a query.

        Reads no data and charges nothing. Raises the same errors as :meth:`query`
        before its charge.
        """
        policy, plan = self._plan(dataset, sql)
        mech = self._mechanism(policy, mechanism)
        resolved = self._resolve_budget(policy, mech, budget)
        cal, sens = self._calibrate(policy, plan, mech, resolved)
        delta = policy.budget.delta
        return {
            "dataset": dataset,
            "canonical_sql": plan.canonical_sql,
            "plan_hash": plan.plan_hash,
            "plan": plan.canonical_dict(),
            "bounded_sql": bounded_sql_template(plan, policy),
            "sensitivity": {pid: {"l1": s.l1, "l2": s.l2, "linf": s.linf} for pid, s in sens.items()},
            "mechanism": cal.mechanism,
            "noise_scales": dict(cal.scales),
            "budget": resolved,
            "cost": {
                "rho": cal.rho,
                "epsilon": cal.epsilon,
                "epsilon_at_delta": accounting.cost_epsilon(cal.cost, delta),
                "delta": delta,
            },
        }

    # ----------------------------------------------------------------- query

    def _flight(self, key: str) -> threading.Lock:
        with self._flights_lock:
            lock = self._flights.get(key)
            if lock is None:
                lock = self._flights[key] = threading.Lock()
            return lock

    def query(self, dataset: str, sql: str, *, consumer: str, budget: QueryBudget | None = None,
              mechanism: str | None = None) -> dict[str, Any]:
        """Answer ``sql`` on ``dataset`` with a DP release, charged to ``consumer``'s allocation.

        Args:
            dataset: dataset name (policy).
            sql: the analyst's SQL text (never executed as such).
            consumer: the allocation that pays (from the principal, not the request).
            budget: the release's budget (None: the policy's ``default_query_rho``).
            mechanism: ``"gaussian"`` (discrete Gaussian, zCDP) or ``"laplace"``
                (discrete Laplace, pure ε); None: the policy's default.
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
        policy, plan = self._plan(dataset, sql)
        mech = self._mechanism(policy, mechanism)
        resolved = self._resolve_budget(policy, mech, budget)
        version = self._data_version(dataset)
        # Two keys: ``noise_key`` names the noisy primitives (what is charged and noised:
        # table, filter, grouping, primitives, bounds, budget, mechanism, data version);
        # ``key`` names this exact query, post-processing (outputs, HAVING, ORDER BY,
        # LIMIT) included. Queries that differ only in post-processing share one charge.
        noise_key = cache_key(_noise_signature(plan), version, mech, resolved)
        key = cache_key(plan.plan_hash, version, mech, resolved)
        display = [o.label or o.name for o in plan.outputs if not o.hidden]

        with self._flight(noise_key):
            hit = self.release_store.find(key) or self.release_store.find(noise_key)
            if hit is not None:
                return self._serve(hit, policy, plan, key, display)
            # Calibrate and bind the rewrite before charging (reads no data): a query
            # DuckDB refuses whatever the data costs nothing.
            cal, _ = self._calibrate(policy, plan, mech, resolved)
            self.engine.check(bounded_sql(plan, policy, salt=0))
            # A key whose charged computation failed in this process is charged afresh
            # (the failed charge stays; nothing is refunded) instead of waiting for it.
            release_key = (noise_key if noise_key not in self._failed
                           else f"{noise_key}:retry:{uuid.uuid4().hex}")
            receipt = self.ledger.charge(
                policy.population, consumer, cal.cost,
                purpose=f"query on {dataset}: {plan.canonical_sql}"[:500],
                release_key=release_key,
                metadata={"dataset": dataset, "plan_hash": plan.plan_hash, "data_version": version},
            )
            if receipt.duplicate:  # another process charged these primitives: wait for its release
                return self._serve(self._await_release(noise_key), policy, plan, key, display)
            # ---- the charge is written; from here on nothing refunds it ----
            try:
                release = self._compute(policy, plan, cal, resolved, receipt, noise_key, version)
                stored = self.release_store.put(release)
            except BaseException:
                self._failed.add(noise_key)
                raise
            self._failed.discard(noise_key)
            if stored.release_id != release.release_id:  # lost a race to another process
                return self._serve(stored, policy, plan, key, display)
            return stored.to_dict(cached=False)

    def _serve(self, hit: Release, policy: DatasetPolicy, plan: QueryPlan, key: str,
               display: list[str]) -> dict[str, Any]:
        """Serve a stored release for ``plan`` at no cost.

        The same query (same plan hash) gets the stored release under this request's
        column labels. A query that differs only in post-processing gets a new release
        derived from the stored noisy primitives (post-processing: free, Dwork & Roth
        2014 Prop. 2.1), stored under its own key and pointing at the release it was
        derived from.
        """
        if hit.plan_hash == plan.plan_hash:
            return _rename(hit.to_dict(cached=True), display)
        noisy = hit.body["noisy"]
        ids = {_primitive_sig(p): p.id for p in plan.primitives}
        keys = {c: _array(v) for c, v in noisy["keys"].items()}
        values = {ids[s]: _array(v) for s, v in noisy["values"].items()}
        scales = {ids[s]: float(v) for s, v in noisy["scales"].items()}
        halfwidths = {ids[s]: float(v) for s, v in noisy["halfwidths"].items()}
        table = finalize(plan, policy, keys, values, scales, halfwidths, mechanism=hit.body["mechanism"])
        labels = [o.label or o.name for o in plan.outputs if not o.hidden]
        body = dict(hit.body)
        release_id = "rel_" + uuid.uuid4().hex[:24]
        created = _now()
        body.update({
            "release_id": release_id,
            "columns": labels,
            "rows": [list(r) for r in table.rows],
            "accuracy": _relabel(table.accuracy, list(table.columns), labels),
            "created_at": created,
            "plan_hash": plan.plan_hash,
            "canonical_sql": plan.canonical_sql,
            "noise_scales": scales,
            "derived_from": hit.release_id,
        })
        stored = self.release_store.put(Release(release_id, key, policy.name, plan.plan_hash, created, body))
        return _rename(stored.to_dict(cached=True), display)

    def _await_release(self, key: str) -> Release:
        deadline = time.monotonic() + PENDING_RELEASE_WAIT_S
        while time.monotonic() < deadline:
            hit = self.release_store.find(key)
            if hit is not None:
                return hit
            time.sleep(0.05)
        raise Conflict("an identical query was charged by another process but its release is not"
                       " stored (it may have failed); retry with a different budget",
                       {"cache_key": key})

    def _compute(self, policy: DatasetPolicy, plan: QueryPlan, cal, resolved: Mapping[str, Any],
                 receipt, key: str, version: str) -> Release:
        salt = self._salt_source()
        try:
            values = self.engine.execute(bounded_sql(plan, policy, salt=salt))
        except DpgateError:
            raise
        except Exception as exc:  # noqa: BLE001 - no data in the message
            raise ExecutionError("executing the bounded query failed; the charge stays",
                                 {"charge_id": receipt.charge_id}) from exc
        del salt
        keys = {k: values[k] for k in plan.group_by}
        noisy = sample(cal, {p.id: values[p.id] for p in plan.primitives})
        halfwidths = {pid: ci95_halfwidth(cal.mechanism, s) for pid, s in cal.scales.items()}
        sig = {p.id: _primitive_sig(p) for p in plan.primitives}
        table = finalize(plan, policy, keys, noisy, cal.scales, halfwidths, mechanism=cal.mechanism)
        delta = policy.budget.delta
        table_policy = policy.table(plan.table)
        release_id = "rel_" + uuid.uuid4().hex[:24]
        created = _now()
        body = {
            "release_id": release_id,
            "dataset": policy.name,
            "table": plan.table,
            "columns": [o.label or o.name for o in plan.outputs if not o.hidden],
            "rows": [list(r) for r in table.rows],
            "accuracy": _relabel(table.accuracy, list(table.columns),
                                 [o.label or o.name for o in plan.outputs if not o.hidden]),
            "charge": {
                "charge_id": receipt.charge_id,
                "rho": receipt.rho,
                "epsilon_at_delta": receipt.epsilon_at_delta,
                "delta": delta,
                "consumer": receipt.consumer,
            },
            "cached": False,
            "data_version": version,
            "created_at": created,
            "plan_hash": plan.plan_hash,
            "canonical_sql": plan.canonical_sql,
            "mechanism": cal.mechanism,
            "noise_scales": dict(cal.scales),
            "budget": dict(resolved),
            "bounds": {
                "privacy_unit": table_policy.privacy_unit,
                "max_groups_per_unit": table_policy.max_groups_per_unit,
                "max_rows_per_unit": table_policy.max_rows_per_unit,
                "columns": {
                    c: {"lower": col.lower, "upper": col.upper, "resolution": col.resolution}
                    for c, col in table_policy.columns.items() if col.bounded
                },
            },
            # the noisy primitives themselves (DP outputs), so that queries differing only
            # in post-processing are answered from them for free; not served to clients
            "noisy": {
                "keys": {c: np.asarray(v).tolist() for c, v in keys.items()},
                "values": {sig[pid]: [int(x) for x in np.asarray(v).tolist()] for pid, v in noisy.items()},
                "scales": {sig[pid]: float(s) for pid, s in cal.scales.items()},
                "halfwidths": {sig[pid]: float(h) for pid, h in halfwidths.items()},
            },
            "guarantee": {
                "population": policy.population,
                "privacy_unit": table_policy.privacy_unit or "record",
                "cap": {"epsilon": policy.budget.epsilon, "delta": delta},
            },
        }
        return Release(release_id, key, policy.name, plan.plan_hash, created, body)

    # ----------------------------------------------------------------- releases

    def release(self, release_id: str) -> dict[str, Any]:
        """A stored release (free); raises :class:`~dpgate.errors.NotFound`."""
        return self.release_store.get(release_id).to_dict(cached=True)

    def releases(self, dataset: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Stored releases, newest first (free); ``dataset`` must exist if given."""
        if dataset is not None:
            self.policy(dataset)
        return [r.to_dict(cached=True) for r in self.release_store.list(dataset, limit=limit)]

    # ----------------------------------------------------------------- ledger

    def charge_external(self, population: str, consumer: str, *, curve: list[float] | None = None,
                        orders: list[float] | None = None, rho: float | None = None, kind: str = "rdp",
                        purpose: str, actor: str) -> dict[str, Any]:
        """Charge a cost computed by an external accountant (e.g. a DP-SGD run).

        Args:
            population, consumer: who pays.
            curve: RDP ε(α) at ``orders`` (default: the ledger's
                :data:`~dpgate.accounting.ORDERS`; any other grid is refused) for
                ``kind = "rdp"``.
            rho: total ρ for ``kind = "zcdp"`` or ``"gaussian"`` (continuous Gaussian).
            purpose, actor: recorded with the charge.
        Raises:
            InvalidBudget: malformed cost. UnknownPopulation / UnknownConsumer.
            BudgetExhausted: it does not fit (nothing written).
        """
        if population not in self.ledger.populations():
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        try:
            if kind == "rdp":
                if curve is None:
                    raise ValueError("curve is required for kind 'rdp'")
                grid = tuple(float(a) for a in orders) if orders is not None else accounting.ORDERS
                cost = accounting.Cost.rdp(list(curve), orders=grid)
            elif kind in ("zcdp", "gaussian"):
                if rho is None:
                    raise ValueError(f"rho is required for kind {kind!r}")
                cost = accounting.Cost.zcdp(rho) if kind == "zcdp" else accounting.Cost.continuous_gaussian(rho)
            else:
                raise ValueError("kind must be 'rdp', 'zcdp' or 'gaussian'")
        except ValueError as exc:
            raise InvalidBudget(str(exc), {"kind": kind}) from None
        receipt = self.ledger.charge(population, consumer, cost, purpose=purpose,
                                     metadata={"actor": actor, "external": True})
        return receipt.to_dict()

    def ledger_entries(self, population: str | None = None, *, limit: int | None = None) -> list[dict[str, Any]]:
        """Ledger charges (oldest first), optionally of one population."""
        return self.ledger.entries(population, limit=limit)

    def ledger_events(self, population: str | None = None) -> list[dict[str, Any]]:
        """Governance events (cap and allocation changes) with who, when, old, new and reason."""
        return self.ledger.events(population)

    def set_cap(self, population: str, *, epsilon: float, delta: float, actor: str, reason: str) -> dict[str, Any]:
        """Record a cap change as a governance event (never an edit); returns the event."""
        if population not in self.ledger.populations():
            raise UnknownPopulation(f"unknown population {population!r}", {"population": population})
        return self.ledger.set_cap(population, epsilon=epsilon, delta=delta, actor=actor, reason=reason)


def open_release_store(ledger: Ledger) -> ReleaseStore:
    """The release store living in the same backend as ``ledger``."""
    if hasattr(ledger, "release_store"):
        return ledger.release_store()
    connect = getattr(ledger, "connect", None)
    if connect is None:
        raise ExecutionError("this ledger backend has no release store")
    return SqliteReleaseStore(connect)


def _output_unit(policy: DatasetPolicy, plan: QueryPlan, primitive_id: str) -> float:
    """Size of one integer unit of a primitive in output units (1 for counts)."""
    p = plan.primitive(primitive_id)
    if p.kind in ("sum", "sum_squares"):
        res = policy.table(plan.table).column(p.column).resolution or 1.0
        return res if p.kind == "sum" else res * res
    return 1.0


def _primitive_sig(p) -> str:
    """A primitive's identity independent of its id: ``kind:column``."""
    return f"{p.kind}:{p.column or ''}"


def _noise_signature(plan: QueryPlan) -> str:
    """SHA-256 of what a plan noises: table, filter, grouping, primitives, policy digest.

    Post-processing (outputs, their order and names, HAVING, ORDER BY, LIMIT) is
    left out: plans equal here are answered from the same noisy primitives.
    """
    payload = json.dumps({
        "dataset": plan.dataset, "table": plan.table, "where": plan.where,
        "group_by": list(plan.group_by), "policy": getattr(plan, "policy_digest", ""),
        "primitives": sorted(_primitive_sig(p) for p in plan.primitives),
    }, sort_keys=True, separators=(",", ":"))
    return "noise:" + hashlib.sha256(payload.encode()).hexdigest()


def _array(values: list) -> np.ndarray:
    """A stored JSON list back as a NumPy vector (ints stay ints; text keys as objects)."""
    arr = np.asarray(values)
    return arr if arr.dtype.kind in "iufb" else np.asarray(values, dtype=object)


def _fingerprint_key(settings: Settings) -> bytes:
    """The secret that keys published data fingerprints (``DPGATE_FINGERPRINT_KEY`` or a file).

    A plain hash of the source files would be a deterministic, noiseless function
    of the data: an adversary who knows every row but one could test candidates
    against it. Keyed with a secret (HMAC-SHA-256) the published version is
    pseudorandom to anyone without the key. Replicas sharing a ledger should share
    the key (set ``DPGATE_FINGERPRINT_KEY``) so that they share cached releases.
    """
    if settings.fingerprint_key:
        return settings.fingerprint_key.encode()
    path = settings.home / "fingerprint.key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


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
