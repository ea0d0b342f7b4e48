"""The budget of one query: as requested (:class:`QueryBudget`) and as resolved (:class:`ResolvedBudget`).

A request names at most one of ρ, ε or a ``ci95`` half-width (and, for partition selection, a δ);
:func:`resolve` turns it into the frozen :class:`ResolvedBudget` that enters the release cache key,
the calibration and the release document (``budget``). Resolving is cheap (no calibration): a
cache hit does no privacy arithmetic. :func:`fit` states whether a cost fits what the ledger has
left (explain's ``cost.fits``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping

from dpgate import accounting, partition_selection
from dpgate.errors import InvalidBudget
from dpgate.ledger import Ledger
from dpgate.ledger.base import charge_statement, ledger_rho
from dpgate.policy import MECHANISMS, DatasetPolicy
from dpgate.sql.parse import nothing_charged
from dpgate.sql.plan import QueryPlan

__all__ = ["QueryBudget", "ResolvedBudget", "fit", "mechanism_of", "refuse_without_gdp_claim", "resolve",
           "resolve_selection", "stated"]


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
        try:
            self._validate()
        except InvalidBudget as e:  # a budget is checked before anything else: nothing was charged
            raise nothing_charged(e) from None

    def _validate(self) -> None:
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
            raise nothing_charged(InvalidBudget(
                "budget names none of rho, epsilon, ci95 (omit budget for the policy's default_query_rho)",
                {"given": []},
            ))
        return cls(**given)


@dataclass(frozen=True)
class ResolvedBudget:
    """The budget a release is calibrated for, cached under and documented with.

    Exactly one of ``ci95``, ``epsilon`` and ``rho`` is set (a selection query: ``epsilon`` or
    ``rho``). ``delta`` goes with a Gaussian ``epsilon`` only: the δ of the cap the ledger
    enforces (its ``rho_delta``), at which the standalone (ε, δ) guarantee is stated.
    ``expected_count`` goes with ``ci95`` (rows per group; AVG/VAR/STDDEV). ``selection_delta``
    is δ_q of private partition selection (:func:`resolve_selection`).

    :meth:`to_dict` is the document and cache-key form; its key order is fixed (ci95,
    expected_count, epsilon, delta, rho, selection_delta), so cache keys and stored documents
    are byte-identical to the former dict form.
    """

    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    ci95: float | None = None
    expected_count: float | None = None
    selection_delta: float | None = None

    _ORDER: ClassVar[tuple[str, ...]] = ("ci95", "expected_count", "epsilon", "delta", "rho", "selection_delta")

    def to_dict(self) -> dict[str, float]:
        """``{ci95[, expected_count]}``, ``{epsilon[, delta]}`` or ``{rho}``, then ``selection_delta``."""
        return {k: getattr(self, k) for k in self._ORDER if getattr(self, k) is not None}

    @property
    def is_ci95(self) -> bool:
        """True for an accuracy target (``ci95``) rather than a privacy budget."""
        return self.ci95 is not None

    def zcdp_rho(self) -> float:
        """ρ of a ρ or (Gaussian) ε budget: a standalone ε at its δ → ρ by the ledger's one
        conversion (its cap rule, :func:`dpgate.ledger.caps.ledger_rho`)."""
        if self.epsilon is not None:
            return ledger_rho(self.epsilon, self.delta)
        return float(self.rho)  # type: ignore[arg-type]

    def pure_epsilon(self) -> float:
        """Pure ε of an ε or ρ budget: a ρ budget buys ε = √(2ρ) (ε-DP ⇒ ε²/2-zCDP, Bun–Steinke
        2016 Prop. 1.4, so this ε costs at most ρ)."""
        if self.epsilon is not None:
            return self.epsilon
        return math.sqrt(2.0 * self.rho)  # type: ignore[operator]

    def with_selection_delta(self, delta: float | None) -> "ResolvedBudget":
        """This budget with δ_q (None: unchanged)."""
        return self if delta is None else replace(self, selection_delta=delta)


def mechanism_of(policy: DatasetPolicy, mechanism: str | None) -> str:
    """The request's mechanism, else the policy's default.

    Raises:
        InvalidBudget: not one of :data:`dpgate.policy.MECHANISMS`.
    """
    mech = mechanism or policy.budget.mechanism
    if not isinstance(mech, str) or mech not in MECHANISMS:
        raise InvalidBudget(f"unknown mechanism {mech!r}; use one of {', '.join(MECHANISMS)}",
                            {"mechanism": mech})
    return mech


def resolve(ledger: Ledger, policy: DatasetPolicy, mech: str, budget: QueryBudget | None) -> ResolvedBudget:
    """The budget as it enters the cache key: ``{ci95}``, ``{rho}`` or ``{epsilon[, delta]}``.

    Cheap (no calibration), so that a cache hit does no privacy arithmetic; a Gaussian
    ``{epsilon}`` is stated at the δ of the cap the ledger enforces (one ledger read).
    """
    budget = budget or QueryBudget()
    if budget.ci95 is not None:
        if budget.expected_count is not None:
            return ResolvedBudget(ci95=float(budget.ci95), expected_count=float(budget.expected_count))
        return ResolvedBudget(ci95=float(budget.ci95))
    if budget.epsilon is not None:
        if mech == "gaussian":  # a standalone (ε, δ) guarantee at the δ it is charged at
            return ResolvedBudget(epsilon=float(budget.epsilon), delta=ledger.cap(policy.population).rho_delta)
        return ResolvedBudget(epsilon=float(budget.epsilon))
    rho = budget.rho if budget.rho is not None else policy.budget.default_query_rho
    return ResolvedBudget(rho=float(rho))


def resolve_selection(ledger: Ledger, policy: DatasetPolicy, plan: QueryPlan, resolved: ResolvedBudget,
                      budget: QueryBudget | None) -> ResolvedBudget:
    """Issue 11: add ``selection_delta`` (δ_q) to the resolved budget of a selecting query
    (:func:`dpgate.partition_selection.selection_budget`; refusals cost nothing)."""
    requested = budget.delta if budget is not None else None
    if not plan.selected_keys and requested is None:
        return resolved
    cap = ledger.cap(policy.population).selection_delta if plan.selected_keys else 0.0
    return resolved.with_selection_delta(
        partition_selection.selection_budget(policy, plan, cap, requested, resolved.is_ci95))


def stated(cost: accounting.Cost, delta: float, gdp: bool = False) -> dict[str, float]:
    """``{epsilon_at_delta, delta}`` of a cost as its receipt will state it (the ledger's one
    conversion at the δ it is charged at; a pure-ε cost at δ = 0; in a Gaussian-DP population,
    ``gdp``, the exact ε of the cost's μ): :func:`dpgate.ledger.filter.charge_statement`."""
    eps, d = charge_statement(cost, delta, gdp)
    return {"epsilon_at_delta": eps, "delta": d}


def refuse_without_gdp_claim(ledger: Ledger, policy: DatasetPolicy, cost: accounting.Cost, consumer: str,
                             selection_delta: float = 0.0) -> None:
    """In a Gaussian-DP population (cap composition ``"gdp"``), refuse a charge the filter cannot
    compose — a cost without a μ-GDP claim (``Cost.gdp_bound`` None: a top-k selection, a DP-SGD
    curve, an external zCDP charge) or one spending partition selection's δ — *before* anything
    else happens (no statement rendered, nothing read, nothing charged), with the filter's own
    error (:class:`~dpgate.ledger.filter.Refusal`, rule ``"gdp_claim"``). A no-op elsewhere.

    Raises:
        InvalidBudget: as the ledger's charge would (:mod:`dpgate.ledger.filter`).
    """
    cap = ledger.cap(policy.population)
    if not cap.gdp or (cost.gdp_bound is not None and selection_delta <= 0.0):
        return
    from dpgate.ledger.filter import BudgetCurve, Decision, Refusal, Totals

    report = ledger.spend(policy.population)
    err = Refusal(policy.population, consumer, "population", cost, Totals(), BudgetCurve.of(cap), cap,
                  Decision(False, "gdp_claim"), selection_delta).error()
    # the refusal was built without the ledger's totals: state the population's spend from its report
    err.details["spent"] = {"rho": report.spent_rho, "epsilon": report.spent_epsilon}
    err.details["remaining"] = {"rho": report.remaining_rho, "epsilon": report.remaining_epsilon}
    raise err


def _fit_gdp(report: Any, cap: Any, cost: accounting.Cost, consumer: str | None,
             selection_delta: float) -> dict[str, Any]:
    """:func:`fit` in a Gaussian-DP population: the release's μ² against the Σμ² left
    (share × μ_cap² − spent, bounded by the population's), as the ledger's filter checks it
    (Smith & Thakurta 2022; :func:`dpgate.ledger.filter.filter_decision`)."""
    from dpgate.ledger.validation import TOLERANCE

    pop = f"population {report.population!r}"
    left, who, named = report.remaining_mu2, pop, None
    if consumer is not None and consumer in report.consumers:
        mine = report.consumers[consumer].remaining_mu2
        if mine is not None and mine <= left:
            left, who, named = mine, f"consumer {consumer!r}", consumer
    out: dict[str, Any] = {"filter": "gdp", "remaining_rho": report.remaining_rho, "consumer": named,
                           "population_remaining_rho": report.remaining_rho, "remaining_mu": math.sqrt(left),
                           "remaining_mu2": left, "population_remaining_mu2": report.remaining_mu2}
    mu = cost.gdp_bound
    if mu is None or selection_delta > 0.0:
        why = "it spends delta on partition selection" if selection_delta > 0.0 else \
            "its cost has no Gaussian-DP claim (a top-k selection, a DP-SGD curve or an external zCDP charge)"
        return {**out, "fits": False, "requested_mu": None, "refused": "invalid_budget",
                "message": f"{pop} composes in Gaussian DP (composition \"gdp\") and this release cannot be "
                           f"composed there: {why}; the query would be refused with invalid_budget"}
    need = mu * mu
    fits = bool(need <= left + TOLERANCE * cap.mu_cap * cap.mu_cap)
    verdict = "fits" if fits else "does NOT fit: the query would be refused with budget_exhausted"
    return {**out, "fits": fits, "requested_mu": mu,
            "message": f"this release is mu={mu:.6g}-GDP (mu^2={need:.6g}); {who} has mu^2={left:.6g} left "
                       f"(mu={math.sqrt(left):.6g}, Gaussian-DP filter: mu_i^2 add up): it {verdict}"}


def fit(ledger: Ledger, policy: DatasetPolicy, cost: accounting.Cost, consumer: str | None,
        scope: tuple[str, ...] | None = None, selection_delta: float = 0.0) -> dict[str, Any]:
    """Whether ``cost`` fits what is left (the ledger's spend report), as explain reports it:
    within the consumer's allocation (when ``consumer`` has one) *and* the population's cap,
    as the ledger's filter checks at run time. ``remaining_rho`` is the binding one (the
    smaller), ``consumer`` the allocation it names (None: the population's). With cohorts:
    against the cohort of ``scope`` (None: every declared cohort) with the least left.
    ``filter`` names the ledger's filter: ``"renyi"`` (ρ against the remaining ρ) or ``"gdp"``
    (a Gaussian-DP population: the release's μ² against the remaining Σμ², ``remaining_mu``;
    a cost without a GDP claim, or spending ``selection_delta``, does not fit and ``refused``
    says it would be ``invalid_budget``). Cohorts of a Gaussian-DP population are not
    distinguished here (the population's and the consumer's Σμ²)."""
    report = ledger.spend(policy.population)
    if report.gdp:
        return _fit_gdp(report, ledger.cap(policy.population), cost, consumer, selection_delta)
    if getattr(policy, "cohorts", None) is not None and ledger.cohort_column(policy.population):
        from dpgate.budget_views import cohort_remaining  # cohorts hook (issue 23)

        left, who = cohort_remaining(ledger, policy, consumer, scope or policy.cohorts.names)
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
    return {"fits": fits, "filter": "renyi", "remaining_rho": left, "consumer": named,
            "population_remaining_rho": report.remaining_rho,
            "message": f"this release costs rho={need:.6g}; {who} has rho={left:.6g} left: it {verdict}"}


def as_mapping(resolved: ResolvedBudget | Mapping[str, Any]) -> dict[str, Any]:
    """The dict form of a resolved budget (a mapping passes through): for the mechanism-side
    calibrators (:mod:`dpgate.quantile_release`) that take one."""
    return resolved.to_dict() if isinstance(resolved, ResolvedBudget) else dict(resolved)
