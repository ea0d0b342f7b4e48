"""Governance and store operations of the gateway: caps, populations, external charges, searches,
stored releases and dashboard pins (split from :mod:`dpgate.service`, issue 20 step 6).

Module functions act on a ledger and the policies (``dpgate caps apply``, ``dpgate budget``, the
gateway's start); :class:`AdminOperations` and :class:`StoreOperations` are the
:class:`~dpgate.pipeline.gateway.Gateway` methods that read or charge the ledger outside a query
and read the release store. None of them runs a query.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from typing import Any, Mapping

from dpgate import accounting
from dpgate.budget_views import budget_cohort_views, dataset_budget_views
from dpgate.cohorts import population_cohorts
from dpgate.errors import InvalidRequest, NotFound, UnknownPopulation
from dpgate.ledger import Ledger
from dpgate.ledger.base import FINITE_ORDERS, PolicyDrift
from dpgate.policy import DatasetPolicy
from dpgate.releases import ReleaseStore
from dpgate.settings import Settings

__all__ = ["AdminOperations", "DatasetViews", "StoreOperations", "apply_policies", "check_population_moves",
           "ensure_populations", "fingerprint_key", "population_policies", "published_version"]


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
    # the population's filter (issue 22 item 1), fixed before its first charge
    args["composition"] = getattr(policy.budget, "composition", "renyi")
    cohorts = getattr(policy, "cohorts", None)
    if cohorts is not None:  # issue 23: one budget per cohort
        args["cohort_column"] = cohorts.column
    return args


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


def published_version(version: str, key: bytes) -> str:
    """A policy-declared version as is; a source fingerprint as ``fp-`` + HMAC(key, fingerprint)."""
    if not version.startswith("sha256:"):
        return version
    return "fp-" + hmac.new(key, version.encode(), hashlib.sha256).hexdigest()[:24]


_published_version = published_version  # the former private name (engines' docstrings cite it)


class DatasetViews:
    """The published guarantee and spend of each dataset (free: they read the ledger and the engine's
    description). Mixed into the gateway; needs ``policy``, ``ledger``, ``engine``, ``data_versions``.
    """

    ledger: Ledger
    engine: Any
    data_versions: dict[str, str | None]

    def policy(self, dataset: str) -> DatasetPolicy:  # pragma: no cover - the gateway's
        """The dataset's policy (the gateway's :meth:`~dpgate.pipeline.gateway.Gateway.policy`; raises UnknownDataset)."""
        raise NotImplementedError

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

    def policy_drift(self, dataset: str) -> PolicyDrift:
        """How ``dataset``'s policy file differs from the cap and allocations the ledger enforces
        (read live, so a change by an admin or another replica shows at once).

        Raises:
            UnknownDataset: no such dataset. PolicyError: the file's cap is invalid.
        """
        policy = self.policy(dataset)
        return ensure_populations(self.ledger, {dataset: policy})[policy.population]


class StoreOperations:
    """Stored releases and dashboard pins (free: they read the release store only).

    Mixed into the gateway; needs ``policy(dataset)`` and ``release_store``.
    """

    release_store: ReleaseStore

    def policy(self, dataset: str) -> DatasetPolicy:  # pragma: no cover - the gateway's
        """The dataset's policy (the gateway's :meth:`~dpgate.pipeline.gateway.Gateway.policy`; raises UnknownDataset)."""
        raise NotImplementedError

    def release(self, release_id: str) -> dict[str, Any]:
        """A stored release (free); raises :class:`~dpgate.errors.NotFound`."""
        return self.release_store.get(release_id).to_dict(cached=True)

    def releases(self, dataset: str | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Stored releases, newest first (free); ``dataset`` must exist if given."""
        if dataset is not None:
            self.policy(dataset)
        return [r.to_dict(cached=True) for r in self.release_store.list(dataset, limit=limit)]

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



class AdminOperations:
    """Charges outside a query, searches and cap governance (issue 15, 23).

    Mixed into the gateway; needs ``ledger``, ``policies`` and ``searches``.
    """

    ledger: Ledger
    policies: dict[str, DatasetPolicy]

    @property
    def searches(self):
        """The search records (:class:`dpgate.searches.Searches`), opened on first use in the
        ledger's database (issue 15)."""
        if getattr(self, "_searches", None) is None:
            from dpgate.searches import Searches, open_search_store

            self._searches = Searches(self.ledger, open_search_store(self.ledger))
        return self._searches

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
