"""Caps: a population's published (ε, δ) fixed into the budget curve its filter enforces.

When a cap is set (a population is created, an admin changes the cap, or
``dpgate caps apply`` adopts a policy file's values) it is fixed once into a
:class:`CapSpec`:

* **ρ_cap and α_cap on the ledger's grid** (rule ``"alpha_cap"``, every cap set
  by this version). For each finite order α of :data:`dpgate.accounting.ORDERS`
  let ρ_α be the largest ρ whose RDP→(ε, δ) conversion *at that single order*
  meets the cap::

      ε_cap = α·ρ_α + log((α−1)/α) − (log δ_ρ + log α)/(α − 1)

  ([BBG+20] Thm. 21, the conversion :func:`dpgate.accounting.rdp_epsilon_tight`
  uses; δ_ρ = δ − ``selection_delta``). Then ρ_cap = max_α ρ_α and α_cap is the
  order attaining it. The budget curve is B(α) = α·ρ_cap for the grid orders
  α ≤ α_cap; each of them is a fixed-order Rényi filter (Feldman & Zrnic,
  "Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021,
  arXiv:2008.11193, Thm. 3.1), so an adaptively chosen sequence of charges
  admitted by the filter is (α_cap, α_cap·ρ_cap)-RDP, which converts to
  exactly the published (ε, δ_ρ) at α_cap alone. Orders above α_cap are not
  checked (B(α) = ∞ there): a curve that explodes only at high orders (a
  subsampled Gaussian, DP-SGD) is not refused for nothing.

  A cap stated directly in ρ (``rho_cap``) takes α_cap = the grid order where
  the single-order conversion of α·ρ_cap is smallest and publishes that ε.

* **Legacy caps** (rule ``"legacy"``, ``alpha_cap`` None): caps fixed by dpgate
  before this rule. ρ_cap is the largest ρ whose *continuous* tight zCDP
  conversion ([CKS20] Cor. 13) meets the cap, α* the order where that
  conversion is attained, and the filter checks every finite grid order plus
  α*. Such populations keep their cap and rule (their charges were admitted by
  it, and :meth:`~dpgate.ledger.sql.SqlLedger.verify` replays them by it) until a
  governance event sets a new cap.

* **Gaussian-DP composition** (``composition = "gdp"``, opt-in per population, for caps
  stated in ε): the population's charges are composed in μ-GDP instead (Dong, Roth & Su
  2022; the filter of Smith & Thakurta 2022): μ_cap = :func:`dpgate.accounting.gdp_mu_for_cap`
  (ε, δ_ρ) is the largest μ whose *exact* conversion ([DRS22] Cor. 2.13) meets the cap, and
  the filter admits a charge iff Σμ_i² stays ≤ μ_cap² (:mod:`dpgate.ledger.filter`). Only
  charges with a GDP claim are admitted there (:attr:`dpgate.accounting.Cost.gdp_bound`).
  The rule is fixed per population before its first charge (why: the module docstring of
  :mod:`dpgate.ledger.filter`); ``"renyi"`` (the default) is the rule above.

Partition selection (approximate zCDP, design "Accounting"): a cap may reserve
``selection_delta`` of its δ; the δ_q spent by selecting queries add up against
it (a union bound), and ρ_cap is fixed at δ − selection_delta.

References: [BBG+20] Balle, Barthe, Gaboardi, Hsu, Sato 2020 (arXiv:1905.09982);
[CKS20] Canonne, Kamath, Steinke 2020 (arXiv:2004.00010).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from scipy.optimize import minimize_scalar

from dpgate import accounting
from dpgate.accounting import ORDERS
from dpgate.errors import DpgateError, InvalidBudget, PolicyError
from dpgate.ledger.validation import json_float, real, validate_allocations, validate_name

__all__ = [
    "CapSpec",
    "FINITE_ORDERS",
    "optimal_order",
    "order_epsilon",
    "order_rho",
    "fix_epsilon_cap",
    "fix_rho_cap",
    "ledger_epsilon",
    "ledger_rho",
    "LEDGER_RULE",
    "LEDGER_RULE_DOC",
    "LEDGER_RULE_DIFFERENCE",
    "CONVERSION_NOTE",
    "validate_cap",
    "legacy_cap",
    "validate_population",
    "POPULATION_COLUMNS",
    "population_from_row",
    "COMPOSITIONS",
    "GDP_MIGRATION",
    "new_composition",
]

#: The composition rules a cap may fix: the Rényi/zCDP filter (default) or the Gaussian-DP filter.
COMPOSITIONS: tuple[str, ...] = ("renyi", "gdp")

#: Schema migration 6 (both backends): the population's composition rule (NULL: ``"renyi"``)
#: and the exact Σμ² of a scope's Gaussian-DP account (NULL: no GDP account — a charge without
#: a GDP claim, or totals written before this version).
GDP_MIGRATION: tuple[int, str, tuple[str, ...]] = (
    6,
    "Gaussian-DP composition: the population's composition rule, the totals' sum of mu squared",
    (
        "ALTER TABLE populations ADD COLUMN composition TEXT",
        "ALTER TABLE spend_totals ADD COLUMN gdp TEXT",
    ),
)

#: The finite orders of the ledger grid (the pure-ε order ∞ never binds: B(∞) = ∞).
FINITE_ORDERS: tuple[float, ...] = tuple(a for a in ORDERS if math.isfinite(a))


def optimal_order(rho: float, delta: float) -> float:
    """The order α* > 1 at which the tight conversion of ρ-zCDP to (ε, δ) is smallest.

    Minimises ``accounting.rdp_epsilon_tight([α·ρ], δ, orders=[α])`` — [BBG+20]
    Thm. 21 at the single order α, which for the curve α·ρ is the objective of
    [CKS20] Cor. 13 — over α − 1 ∈ [1e-9, 1e12] (bounded Brent on log(α − 1)).
    Used by legacy caps (α*) and to report where a zCDP history is best converted.

    Args:
        rho: ρ > 0 (total).
        delta: δ in (0, 1).

    Returns:
        α* (a float > 1).
    """

    def _objective(t: float) -> float:
        a = 1.0 + math.exp(t)
        return accounting.rdp_epsilon_tight([a * rho], delta, orders=[a])

    res = minimize_scalar(_objective, bounds=(math.log(1e-9), math.log(1e12)), method="bounded",
                          options={"xatol": 1e-10})
    return 1.0 + math.exp(float(res.x))


def order_epsilon(value: float, delta: float, alpha: float) -> float:
    """ε at δ of something (α, ``value``)-RDP, by [BBG+20] Thm. 21 at the single order α.

    Args:
        value: the RDP ε(α) (total).
        delta: δ in (0, 1).
        alpha: a finite order > 1.
    """
    return accounting.rdp_epsilon_tight([value], delta, orders=[alpha])


def order_rho(epsilon: float, delta: float, alpha: float) -> float:
    """The largest ρ with ``order_epsilon(α·ρ, δ, α) ≤ ε`` (0 if none is positive).

    Solves [BBG+20] Thm. 21 at one order for the RDP value:
    α·ρ = ε − log((α−1)/α) + (log δ + log α)/(α − 1); then steps down by ulps until the
    conversion (as :func:`dpgate.accounting.rdp_epsilon_tight` computes it) meets ε.

    Args:
        epsilon: ε > 0 (total, the cap's).
        delta: δ in (0, 1) (the part of the cap's δ available to ρ).
        alpha: a finite order > 1.
    """
    value = epsilon - math.log1p(-1.0 / alpha) + (math.log(delta) + math.log(alpha)) / (alpha - 1.0)
    if not value > 0.0:
        return 0.0
    rho = value / alpha
    while rho > 0.0 and order_epsilon(alpha * rho, delta, alpha) > epsilon:
        rho = math.nextafter(rho, 0.0)
    return rho


@lru_cache(maxsize=256)
def fix_epsilon_cap(epsilon: float, delta: float) -> tuple[float, float]:
    """(ρ_cap, α_cap) of a cap (ε, δ): ρ_cap = max over the finite grid orders α of
    :func:`order_rho` (ε, δ, α), α_cap the smallest order attaining it.

    Returns:
        ``(rho_cap, alpha_cap)``; ρ_cap is 0 when no order admits spending.
    """
    best = (0.0, FINITE_ORDERS[-1])
    for alpha in FINITE_ORDERS:
        r = order_rho(epsilon, delta, alpha)
        if r > best[0]:
            best = (r, alpha)
    return best


@lru_cache(maxsize=256)
def fix_rho_cap(rho: float, delta: float) -> tuple[float, float]:
    """(ε, α_cap) of a budget stated in ρ: the finite grid order where the single-order
    conversion of α·ρ at δ is smallest, and that ε ([BBG+20] Thm. 21)."""
    best = (math.inf, FINITE_ORDERS[-1])
    for alpha in FINITE_ORDERS:
        e = order_epsilon(alpha * rho, delta, alpha)
        if e < best[0]:
            best = (e, alpha)
    return best


#: The one conversion every surface uses between ρ (or a ledger cost) and (ε, δ): the cap rule's.
LEDGER_RULE = ("the ledger's rule: Balle et al. 2020 Thm. 21 at each order of the ledger's RDP grid, "
               "the best order (α_cap for the cap), at δ less the δ reserved for partition selection")
#: Where the README explains it (and why it differs from the textbook conversion).
LEDGER_RULE_DOC = "README.md#one-conversion-the-ledgers"
#: One sentence on the difference from the textbook conversion, for every surface that shows ε.
LEDGER_RULE_DIFFERENCE = (
    "the ledger converts at the orders of its RDP grid and at δ minus the δ reserved for partition "
    "selection, so its ε for a ρ is a little larger (and its ρ for a cap a little smaller) than the "
    "textbook zCDP conversion of Canonne, Kamath & Steinke 2020 at the full δ")


#: The one line the command line prints under a table of ε figures.
CONVERSION_NOTE = (f"ε: the ledger's one conversion (its cap rule); {LEDGER_RULE_DIFFERENCE} "
                   "(README: \"One conversion: the ledger's\")")


def ledger_epsilon(cost: "accounting.Cost | float", delta: float) -> float:
    """ε at ``delta`` of a total cost — or of a total ρ — by the ledger's rule (:data:`LEDGER_RULE`).

    The curve ε(α) (α·ρ for a ρ, [BS16] Def. 1.1) is converted at each order of
    :data:`dpgate.accounting.ORDERS` by [BBG+20] Thm. 21 and the smallest value is kept
    (:func:`dpgate.accounting.rdp_epsilon_tight`); the order ∞ gives a pure-ε curve its own ε.
    For a ρ this is the exact inverse of :func:`ledger_rho` (the cap rule): ``ledger_epsilon(ρ_cap,
    cap.rho_delta) == cap.epsilon`` up to rounding. Callers pass the δ a charge is made at,
    :attr:`CapSpec.rho_delta` (δ less the selection δ).

    Args:
        cost: a :class:`~dpgate.accounting.Cost` (total, composed) or a total ρ ≥ 0.
        delta: δ in [0, 1).

    Returns:
        ε ≥ 0 (0 for ρ = 0).
    """
    if isinstance(cost, accounting.Cost):
        curve = cost.curve_at(ORDERS)
    else:
        rho = float(cost)
        if rho <= 0.0:
            return 0.0
        curve = accounting.gaussian_rdp(rho, ORDERS)
    return accounting.rdp_epsilon_tight(curve, delta, ORDERS)


def ledger_rho(epsilon: float, delta: float) -> float:
    """The largest total ρ whose ledger conversion (:func:`ledger_epsilon`) at ``delta`` is at most
    ``epsilon``: the cap rule's ρ_cap (:func:`fix_epsilon_cap`). A request's ε becomes this ρ.

    Args:
        epsilon: ε > 0 (total for what it pays: a cap, or one release).
        delta: δ in (0, 1) (the cap's δ less its selection δ).

    Raises:
        InvalidBudget: ε so small that no order of the grid admits a ρ > 0 at ``delta``
            (ε ≤ min over α of log(1 − 1/α) − (log δ + log α)/(α − 1), [BBG+20] Thm. 21).
    """
    rho = fix_epsilon_cap(float(epsilon), float(delta))[0]
    if not rho > 0.0:
        floor = min(math.log1p(-1.0 / a) - (math.log(delta) + math.log(a)) / (a - 1.0) for a in FINITE_ORDERS)
        raise InvalidBudget(
            f"budget epsilon = {epsilon!r} is too small: at delta = {delta:g} the ledger's conversion buys no "
            f"rho > 0 for an epsilon at or below about {floor:.4g}; name a larger epsilon or a rho budget",
            {"field": "epsilon", "epsilon": json_float(float(epsilon)), "delta": delta})
    return rho


@dataclass(frozen=True)
class CapSpec:
    """A population's cap, fixed into its budget curve when set (see the module docstring).

    Attributes:
        epsilon: cap ε (total, the published guarantee) at ``delta``.
        delta: cap δ in (0, 1) (total, selection δ included).
        rho_cap: ρ of the budget curve B(α) = α·ρ_cap (total for the population).
        alpha_star: the order whose Rényi filter proves the cap: α_cap for caps of
            rule ``"alpha_cap"``; for legacy caps the continuous optimum α* (checked
            besides every finite grid order).
        rho_stated: True if the cap was stated directly in ρ (then ``epsilon`` is the
            conversion of ``rho_cap`` at ``delta``).
        alpha_cap: the largest grid order the filter checks (None: a legacy cap).
        selection_delta: the part of ``delta`` reserved for partition selection
            (δ_q of selecting queries add up against it); ρ_cap is fixed at
            ``delta − selection_delta``.
        composition: ``"renyi"`` (the Rényi/zCDP filter) or ``"gdp"`` (the Gaussian-DP
            filter against :attr:`mu_cap`; a cap stated in ε only).
    """

    epsilon: float
    delta: float
    rho_cap: float
    alpha_star: float
    rho_stated: bool = False
    alpha_cap: float | None = None
    selection_delta: float = 0.0
    composition: str = "renyi"

    @property
    def gdp(self) -> bool:
        """True if the population composes in Gaussian DP (``composition == "gdp"``)."""
        return self.composition == "gdp"

    @property
    def mu_cap(self) -> float:
        """The Gaussian-DP filter's μ: the largest μ with δ_μ(ε) ≤ δ − selection δ, exactly
        ([DRS22] Cor. 2.13, :func:`dpgate.accounting.gdp_mu_for_cap`); 0 for a ``"renyi"`` cap."""
        return _mu_cap(self.epsilon, self.rho_delta) if self.gdp else 0.0

    def rho_checked(self, cost: accounting.Cost) -> float:
        """A charge in ρ units as this cap's filter sees it (display only; nothing stored).

        A zCDP/Gaussian cost is its ρ. An RDP curve (a DP-SGD run) is the smallest ρ' with
        ε(α) ≤ α·ρ' at every order the filter checks: the grid orders α ≤ α_cap
        (:meth:`dpgate.accounting.Cost.rho_bound` with ``max_order = α_cap``), or every
        finite grid order for a legacy cap. The ``rho`` column of the ledger stores the
        bound over every finite order, which is ∞ for a curve that makes no claim at
        high orders; this is the figure the cap check compared with α·ρ_cap.
        """
        return float(cost.rho_bound(max_order=self.alpha_cap))

    @property
    def rule(self) -> str:
        """``"alpha_cap"`` (orders ≤ α_cap checked) or ``"legacy"`` (every finite order and α*)."""
        return "legacy" if self.alpha_cap is None else "alpha_cap"

    @property
    def rho_delta(self) -> float:
        """The δ at which ρ_cap converts to the cap's ε (δ − selection_delta)."""
        return self.delta - self.selection_delta

    @property
    def checked_orders(self) -> tuple[float, ...]:
        """The orders whose Rényi filters the population's charges must pass (ascending)."""
        if self.alpha_cap is None:
            return tuple(sorted(set(FINITE_ORDERS) | {self.alpha_star}))
        return tuple(a for a in FINITE_ORDERS if a <= self.alpha_cap)

    def to_dict(self) -> dict[str, Any]:
        """``{epsilon, delta, rho_cap, alpha_star, rho_stated[, alpha_cap][, selection_delta]}``
        (JSON-serialisable). ``alpha_cap`` is absent for legacy caps and ``selection_delta``
        when 0, so that events written before these fields existed hash as they were."""
        out: dict[str, Any] = {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho_cap": self.rho_cap,
            "alpha_star": self.alpha_star,
            "rho_stated": self.rho_stated,
        }
        if self.alpha_cap is not None:
            out["alpha_cap"] = self.alpha_cap
        if self.selection_delta:
            out["selection_delta"] = self.selection_delta
        if self.gdp:
            out["composition"] = self.composition
        return out

    def public(self) -> dict[str, Any]:
        """The cap as published with a release or a dataset: ``{epsilon, delta, rho, alpha_cap,
        selection_delta, rule}`` (``alpha_cap`` is α* for a legacy cap), and ``composition`` and
        ``mu_cap`` for a Gaussian-DP population."""
        out = {"epsilon": self.epsilon, "delta": self.delta, "rho": self.rho_cap,
               "alpha_cap": self.alpha_star if self.alpha_cap is None else self.alpha_cap,
               "selection_delta": self.selection_delta, "rule": self.rule}
        if self.gdp:
            out["composition"] = self.composition
            out["mu_cap"] = self.mu_cap
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CapSpec":
        """Inverse of :meth:`to_dict`."""
        alpha_cap = data.get("alpha_cap")
        return cls(float(data["epsilon"]), float(data["delta"]), float(data["rho_cap"]),
                   float(data["alpha_star"]), bool(data.get("rho_stated", False)),
                   None if alpha_cap is None else float(alpha_cap), float(data.get("selection_delta", 0.0)),
                   str(data.get("composition", "renyi")))

    def same_cap(self, other: "CapSpec") -> bool:
        """True if ``other`` states the same cap under the same rule: same (ε, δ) (or same
        (ρ_cap, δ) if stated in ρ), same selection δ, and both legacy or both not."""
        if self.rho_stated != other.rho_stated or self.delta != other.delta \
                or self.selection_delta != other.selection_delta or self.rule != other.rule \
                or self.composition != other.composition:
            return False
        return self.rho_cap == other.rho_cap if self.rho_stated else self.epsilon == other.epsilon

    def same_values(self, other: "CapSpec") -> bool:
        """True if ``other`` states the same (ε, δ) (or (ρ, δ)) and selection δ, whatever the rule
        (used to tell drift of the values from a legacy rule)."""
        if self.rho_stated != other.rho_stated or self.delta != other.delta \
                or self.selection_delta != other.selection_delta:
            return False
        return self.rho_cap == other.rho_cap if self.rho_stated else self.epsilon == other.epsilon


def validate_cap(
    epsilon: float | None,
    delta: float,
    *,
    rho_cap: float | None = None,
    selection_delta: float | None = None,
    error: type[DpgateError] = InvalidBudget,
    composition: str | None = None,
) -> CapSpec:
    """Validate a cap and fix it into a budget curve (rule ``"alpha_cap"``).

    Exactly one of ``epsilon`` and ``rho_cap`` is given. With ``epsilon``:
    (ρ_cap, α_cap) = :func:`fix_epsilon_cap` (ε, δ − selection_delta). With
    ``rho_cap`` (the budget stated in ρ): (ε, α_cap) = :func:`fix_rho_cap`.

    Args:
        epsilon: cap ε > 0, finite (total), or None.
        delta: cap δ in (0, 1) (δ = 0 admits no Gaussian release at all).
        rho_cap: budget in ρ > 0, finite (total), or None.
        selection_delta: the part of δ reserved for partition selection, in [0, δ)
            (None or 0: none).
        error: the error class to raise (``PolicyError`` for policy files).
        composition: ``"renyi"`` (None: the default) or ``"gdp"`` (a cap stated in ε only).

    Returns:
        The :class:`CapSpec`.

    Raises:
        ``error`` (default :class:`~dpgate.errors.InvalidBudget`): both or neither of
        ``epsilon``/``rho_cap``; ε or ρ not finite and > 0; δ not in (0, 1);
        selection δ not in [0, δ); a cap that admits no spending.
    """
    d = real(delta, "delta", error)
    if not 0.0 < d < 1.0:
        raise error(f"the cap's delta must be in (0, 1), got {d!r}", {"delta": d})
    sel = 0.0 if selection_delta is None else real(selection_delta, "selection_delta", error)
    if not 0.0 <= sel < d:
        raise error(f"selection_delta must be in [0, delta) = [0, {d:g}), got {sel!r}",
                    {"selection_delta": json_float(sel), "delta": d})
    d_rho = d - sel
    comp = "renyi" if composition is None else composition
    if comp not in COMPOSITIONS:
        raise error(f"composition must be one of {', '.join(COMPOSITIONS)}, got {composition!r}",
                    {"composition": repr(composition)})
    if (epsilon is None) == (rho_cap is None):
        raise error("state the cap as exactly one of epsilon and rho_cap", {})
    if comp == "gdp" and rho_cap is not None:
        raise error("Gaussian-DP composition needs the cap stated in epsilon (a rho_cap is a zCDP budget)",
                    {"composition": comp})
    if rho_cap is not None:
        r = real(rho_cap, "rho_cap", error)
        if not (0.0 < r < math.inf):
            raise error(f"rho_cap must be finite and > 0, got {r!r}", {"rho_cap": json_float(r)})
        e, a_cap = fix_rho_cap(r, d_rho)
        return CapSpec(e, d, r, a_cap, True, a_cap, sel)
    e = real(epsilon, "epsilon", error)
    if not (0.0 < e < math.inf):
        raise error(f"the cap's epsilon must be finite and > 0, got {e!r}", {"epsilon": json_float(e)})
    r, a_cap = fix_epsilon_cap(e, d_rho)
    if not r > 0.0:
        raise error(f"the cap (epsilon={e!r}, delta={d!r}) admits no spending (rho_cap = 0)",
                    {"epsilon": e, "delta": d})
    return CapSpec(e, d, r, a_cap, False, a_cap, sel, comp)


@lru_cache(maxsize=256)
def _mu_cap(epsilon: float, delta: float) -> float:
    return accounting.gdp_mu_for_cap(epsilon, delta)


def new_composition(population: str, old: CapSpec, composition: str | None, rho_stated: bool,
                    has_charges: Callable[[], bool]) -> str:
    """The composition of a changed cap (:meth:`Ledger.set_cap`): ``composition``, or None to keep
    the current one (``"renyi"`` for a cap stated in ρ). A change is refused once the population
    has a charge: a switch chosen after outputs were seen is not a valid filter
    (:mod:`dpgate.ledger.filter`).

    Raises:
        InvalidBudget: the composition would change and ``has_charges()``.
    """
    comp = composition if composition is not None else ("renyi" if rho_stated else old.composition)
    if comp != old.composition and has_charges():
        raise InvalidBudget(
            f"population {population!r} has charges: its composition rule ({old.composition}) is fixed "
            f"before its first charge and cannot become {comp!r}",
            {"population": population, "composition": old.composition})
    return comp


def legacy_cap(epsilon: float | None, delta: float, *, rho_cap: float | None = None) -> CapSpec:
    """A cap fixed by the legacy rule (continuous [CKS20] ρ_cap, α*, every order checked).

    Only to read and test ledgers written before the ``"alpha_cap"`` rule; new caps use
    :func:`validate_cap`. Arguments as :func:`validate_cap` (no selection δ).

    Raises:
        InvalidBudget: as :func:`validate_cap`.
    """
    base = validate_cap(epsilon, delta, rho_cap=rho_cap)
    if rho_cap is not None:
        e = accounting.zcdp_epsilon_tight(base.rho_cap, base.delta)
        return CapSpec(e, base.delta, base.rho_cap, optimal_order(base.rho_cap, base.delta), True)
    r = accounting.rho_for_cap(base.epsilon, base.delta, "tight")
    return CapSpec(base.epsilon, base.delta, r, optimal_order(r, base.delta))


def validate_population(
    name: Any,
    epsilon: float | None,
    delta: float,
    allocations: Mapping[str, float] | Iterable[tuple[str, float]] | None,
    actor: Any,
    reason: Any,
    rho_cap: float | None,
    selection_delta: float | None = None,
    composition: str | None = None,
) -> tuple[CapSpec, dict[str, float]]:
    """Validate policy input for a population (:meth:`Ledger.ensure_population`,
    :meth:`Ledger.apply_policy`).

    Returns:
        ``(cap, allocations)``: the cap fixed into its budget curve and the allocations as a
        sorted dict.

    Raises:
        PolicyError: invalid name, cap, allocations, actor or reason.
    """
    validate_name(name, "population", PolicyError)
    cap = validate_cap(epsilon, delta, rho_cap=rho_cap, selection_delta=selection_delta, error=PolicyError,
                       composition=composition)
    allocs = validate_allocations(allocations, PolicyError)
    if not isinstance(actor, str) or not actor.strip() or not isinstance(reason, str) or not reason.strip():
        raise PolicyError("actor and reason must be non-empty strings", {})
    return cap, allocs


#: Columns of a stored population (the cap and allocations in force), in storage order;
#: ``alpha_cap`` (NULL: a legacy cap) and ``selection_delta`` came with schema version 2,
#: ``composition`` (NULL: ``"renyi"``) with version 6 (:data:`GDP_MIGRATION`).
POPULATION_COLUMNS: tuple[str, ...] = (
    "epsilon", "delta", "rho_cap", "alpha_star", "rho_stated", "allocations", "alpha_cap", "selection_delta",
    "composition",
)  # fmt: skip


@lru_cache(maxsize=256)
def _parse_allocations(text: str) -> tuple[tuple[str, float], ...]:
    return tuple(json.loads(text).items())


def population_from_row(row: Iterable[Any]) -> tuple[CapSpec, dict[str, float]]:
    """``(cap, allocations)`` from a stored population row in :data:`POPULATION_COLUMNS` order."""
    epsilon, delta, rho_cap, alpha_star, rho_stated, allocations, alpha_cap, selection_delta, composition = row
    cap = CapSpec(epsilon, delta, rho_cap, alpha_star, bool(rho_stated),
                  None if alpha_cap is None else float(alpha_cap), float(selection_delta or 0.0),
                  composition or "renyi")
    return cap, dict(_parse_allocations(allocations))
