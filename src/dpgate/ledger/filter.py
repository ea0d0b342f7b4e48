"""The filter: budget curves, exact running totals, and the decision on each charge.

Analysts choose each query after seeing earlier answers, so "add the costs,
convert to (ε, δ), compare with the cap" is not a proven rule. The ledger uses
*privacy filters* with the budget curve fixed when the cap is set
(:mod:`dpgate.ledger.caps`):

* **Rényi filter** (Feldman & Zrnic, "Individual Privacy Accounting via a
  Rényi Filter", NeurIPS 2021, arXiv:2008.11193, Thm. 3.1; restated among the
  filters of Whitehouse, Ramdas, Rogers & Wu, "Fully-Adaptive Composition in
  Differential Privacy", ICML 2023, arXiv:2203.05481): at a fixed order α, if
  every adaptively chosen mechanism is (α, ε_i(α))-RDP given the past and the
  interaction stops before Σε_i(α) would exceed a budget B(α) fixed in
  advance, the whole interaction is (α, B(α))-RDP. It holds order by order, so
  the ledger admits a charge iff the spent curve plus the request stays
  ``≤ B(α) = α·ρ_B`` at every *checked* order (:attr:`BudgetCurve.checked`):
  the grid orders up to α_cap (caps of rule ``"alpha_cap"``), or every finite
  grid order and α* (legacy caps). B(α) = ∞ at every other order.
* **zCDP filter** — while a scope's history and the request are all ρ-costs
  (``Cost.kind`` "zcdp" or "gaussian"): admit iff ``Σρ + ρ_req ≤ ρ_B``. A
  ρ-cost is (α, αρ)-RDP at every α > 1, so this is the Rényi filter at every
  checked order at once (the zCDP filter of Whitehouse et al. 2023).
* **Selection δ** — a charge may also spend δ_q (private partition selection,
  approximate zCDP): admit only if Σδ_q + δ_req ≤ the scope's selection δ. The
  δ parts add up by the union bound, which holds under adaptivity.

* **Gaussian-DP filter** — for a population whose cap fixes ``composition = "gdp"``
  (:mod:`dpgate.ledger.caps`): every charge must carry a μ-GDP claim
  (:attr:`dpgate.accounting.Cost.gdp_bound`: dpgate's discrete Gaussian with the μ of
  :func:`dpgate.accounting.discrete_gaussian_mu`, a continuous Gaussian, √(2ρ), or a pure
  ε-DP charge, :func:`dpgate.accounting.pure_dp_mu`) and spend no selection δ; admit iff ``Σμ_i² + μ_req² ≤ μ_B²`` with μ_B² = share × μ_cap². Smith &
  Thakurta 2022 ("Fully adaptive composition for Gaussian differential privacy",
  arXiv:2210.17520, Thm. 1.2): adaptively chosen μ_i-GDP mechanisms stopped before Σμ_i²
  exceeds μ² form a μ-GDP interaction; μ_cap is the largest μ whose exact conversion
  (Dong, Roth & Su 2022, Cor. 2.13) meets the cap's (ε, δ − selection δ), so the cap holds
  exactly, with no RDP conversion's slack (ρ-equivalent μ_cap²/2 is ~13 % above the Rényi
  ρ_cap at ε = 4, δ = 5e-7). A consumer's filter against share × μ_cap² only refuses more
  (an extra refusal is a choice the analyst could have made), so the population's filter
  alone carries the guarantee.

  **Why the rule is fixed per population, before its first charge.** Taking, per charge,
  whichever of two valid filters admits the history is *not* a filter: after seeing earlier
  outputs an analyst can choose the continuation (more Gaussians under the GDP budget, or a
  Laplace/RDP charge under the Rényi budget) whose conditional privacy loss is worst given
  what was seen, and the mixture of the two continuations can exceed δ at the cap's ε even
  though each alone meets it. Example (computed in ``tests/test_ledger_gdp.py``): at ε = 4,
  δ − selection δ = 5e-7, a Gaussian of ρ = 0.7·ρ_cap, then — given its output's privacy loss —
  either the Gaussian that exhausts μ_cap (the GDP filter admits it) or randomised response
  at the largest ε' the Rényi filter admits after it (ε' ≈ 0.42), whichever adds more to δ(ε):
  δ(4) = 5.00046e-7 > 5e-7, while the Gaussian continuation alone gives exactly 5e-7. The same holds for "GDP while
  every charge is Gaussian, then the Rényi filter from the first non-Gaussian charge on, if it
  admits the history": the switch time is chosen from the outputs. A rule fixed before any
  output of the population exists is a data-independent choice between two valid filters,
  hence valid. So a ``"gdp"`` population refuses (as :class:`~dpgate.errors.InvalidBudget`)
  a charge without a GDP claim — a DP-SGD curve, a top-k selection, an external zCDP charge,
  a partition selection's δ — and the cap's composition can change only while the population has no charge.
  Totals keep Σμ² exactly (:attr:`Totals.gdp`, in 2**-1074 units; each μ² rounded up).

At a legacy cap's α* (off the grid) a ρ-cost contributes α*·ρ and an RDP curve
``c`` (known at grid orders only) the smaller of two valid bounds on D_α*:
(i) ``c(α₂)``, α₂ the next grid order ≥ α*, since Rényi divergence is
non-decreasing in its order (van Erven & Harremoës 2014, "Rényi Divergence and
Kullback-Leibler Divergence", Thm. 3); (ii) the chord
``[λ(α₁−1)c(α₁) + (1−λ)(α₂−1)c(α₂)] / (α*−1)`` with α₁ < α* < α₂ the
bracketing grid orders and α* = λα₁ + (1−λ)α₂, since (α−1)·D_α is convex in α
(ibid., §III). Both bounds are linear in ``c``, so they apply to summed totals.

Per consumer the same rule runs against ``share × B(α)`` (and share × the
selection δ); a charge must pass both its consumer's filter and its
population's. A relative tolerance of :data:`TOLERANCE` (1e-12) lets
exactly-fitting charges through (e.g. 100 charges of ρ = 0.001 against
ρ_cap = 0.1); the guarantee then holds with ρ_cap·(1 + 1e-12), far below any
reported digit.

Every ρ, δ and curve value is summed exactly, in binary fixed point (every
finite double is an integer multiple of 2**-1074), so that a ledger's spend is
the correctly rounded sum of its entries (``math.fsum``) however many charges
it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from dpgate import accounting
from dpgate.accounting import ORDERS, Cost
from dpgate.errors import BudgetExhausted, DpgateError, InvalidBudget
from dpgate.ledger.caps import CapSpec, ledger_epsilon
from dpgate.ledger.validation import TOLERANCE, json_float

__all__ = [
    "TOLERANCE",
    "BudgetCurve",
    "Totals",
    "Decision",
    "filter_decision",
    "charge_epsilon",
    "charge_statement",
    "rho_epsilon",
    "exhausted_error",
    "Refusal",
    "check_charge",
]

_ORDERS = np.asarray(ORDERS, dtype=float)
_FINITE = np.isfinite(_ORDERS)
_FINITE_ORDERS = _ORDERS[_FINITE]
_GRID_ORDERS = frozenset(float(a) for a in ORDERS)

_KIND_BITS = {"zcdp": 1, "gaussian": 2, "rdp": 4}

# --------------------------------------------------------------------------------------
# exact fixed-point sums
# --------------------------------------------------------------------------------------

# A sum of doubles is exact as an integer count of 2**-1074 units (Python ints are
# unbounded); int / int true division is correctly rounded, i.e. what ``math.fsum``
# returns. ``None`` stands for +inf.
_FIX_BITS = 1074
_FIX_ONE = 1 << _FIX_BITS


def _fix(x: float) -> int | None:
    if math.isinf(x):
        return None
    n, d = float(x).as_integer_ratio()
    return n << (_FIX_BITS - (d.bit_length() - 1))


def _unfix(n: int | None) -> float:
    return math.inf if n is None else n / _FIX_ONE


@lru_cache(maxsize=4096)
def _cost_fixed(cost: Cost) -> tuple[int, tuple[int | None, ...] | None]:
    """(ρ, curve) of a cost in fixed point: (ρ, None) for ρ-costs, (0, curve) for RDP curves."""
    if cost.is_zcdp:
        return _fix(cost.rho), None  # type: ignore[arg-type,return-value]
    return 0, tuple(_fix(v) for v in cost.curve)  # type: ignore[union-attr]


@lru_cache(maxsize=4096)
def _mu2_fixed(mu: float) -> int:
    """μ² in fixed point, rounded up (the float product may round down by half an ulp)."""
    return _fix(math.nextafter(mu * mu, math.inf))  # type: ignore[return-value]


def _gdp_add(total: int | None, cost: Cost, selection_delta: float) -> int | None:
    """Σμ² plus the cost's GDP claim; None (no account) once a charge has none or spends δ."""
    mu = cost.gdp_bound
    if total is None or mu is None or selection_delta > 0.0:
        return None
    return total + _mu2_fixed(mu)


def _fix_text(n: int | None) -> str:
    return "inf" if n is None else format(n, "x")


def _fix_parse(s: str) -> int | None:
    return None if s == "inf" else int(s, 16)


# --------------------------------------------------------------------------------------
# budget curve
# --------------------------------------------------------------------------------------


@lru_cache(maxsize=1024)
def _star_weights(alpha_star: float) -> tuple[int, float | None, float | None]:
    """(i2, w1, w2): ORDERS[i2] is the first grid order ≥ α*; the chord bound at α* is
    w1·c(ORDERS[i2−1]) + w2·c(ORDERS[i2]) (None when α* is on the grid, below the first
    order, or beyond the last finite order)."""
    i2 = int(np.searchsorted(_ORDERS, alpha_star, side="left"))
    if i2 == 0 or i2 >= len(ORDERS) or not math.isfinite(_ORDERS[i2]) or _ORDERS[i2] == alpha_star:
        return i2, None, None
    a1, a2 = float(_ORDERS[i2 - 1]), float(_ORDERS[i2])
    lam = (a2 - alpha_star) / (a2 - a1)
    return i2, lam * (a1 - 1.0) / (alpha_star - 1.0), (1.0 - lam) * (a2 - 1.0) / (alpha_star - 1.0)


@lru_cache(maxsize=1024)
def _checked_mask(alpha_cap: float | None) -> np.ndarray:
    """Which finite grid orders a budget checks: all (legacy), else those ≤ α_cap."""
    mask = np.ones(_FINITE_ORDERS.shape, dtype=bool) if alpha_cap is None else _FINITE_ORDERS <= alpha_cap
    mask.flags.writeable = False
    return mask


@dataclass(frozen=True)
class BudgetCurve:
    """The budget of one scope: B(α) = α·rho at the checked orders, and a selection δ.

    Attributes:
        rho: the scope's ρ (ρ_cap for a population, share × ρ_cap for a consumer).
        alpha_star: the order that proves the cap (α_cap, or a legacy cap's α*); always checked.
        alpha_cap: the largest grid order checked (None: a legacy cap, every finite order).
        selection_delta: the scope's δ for partition selection (share × the cap's).
        mu2: the scope's Gaussian-DP budget μ_B² (share × μ_cap²) when the cap composes in
            Gaussian DP, else None (the Rényi/zCDP filter).
    """

    rho: float
    alpha_star: float
    alpha_cap: float | None = None
    selection_delta: float = 0.0
    mu2: float | None = None

    @classmethod
    def of(cls, cap: CapSpec, share: float = 1.0) -> "BudgetCurve":
        """The budget of a population (``share`` 1) or of a consumer with ``share`` of it."""
        mu2 = share * cap.mu_cap * cap.mu_cap if cap.gdp else None
        return cls(share * cap.rho_cap, cap.alpha_star, cap.alpha_cap, share * cap.selection_delta, mu2)

    @property
    def gdp(self) -> bool:
        """True if this scope is held to the Gaussian-DP filter."""
        return self.mu2 is not None

    @property
    def mask(self) -> np.ndarray:
        """Boolean mask over the finite grid orders: True where the filter checks."""
        return _checked_mask(self.alpha_cap)

    @property
    def checked(self) -> tuple[float, ...]:
        """The checked orders, ascending (finite grid orders and α*)."""
        return tuple(sorted(set(_FINITE_ORDERS[self.mask].tolist()) | {self.alpha_star}))

    def star_bound(self, curve: np.ndarray) -> float:
        """A valid upper bound at α* on the Rényi divergence of anything whose RDP curve at
        ``ORDERS`` is ``curve``: the minimum of the value at the next grid order α₂ ≥ α*
        (monotonicity) and the chord of (α−1)·c(α) between the bracketing grid orders
        (convexity; see the module docstring). Linear in ``curve`` up to the min.
        """
        i2, w1, w2 = _star_weights(self.alpha_star)
        if i2 >= len(ORDERS):  # pragma: no cover - ORDERS ends with inf
            return math.inf
        mono = float(curve[i2])
        if w1 is None:
            return mono
        c1 = float(curve[i2 - 1])
        if math.isinf(c1) or math.isinf(mono):
            return mono
        return min(mono, w1 * c1 + w2 * mono)  # type: ignore[operator]


# --------------------------------------------------------------------------------------
# totals
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Totals:
    """Exact running totals of one scope (a population, or one consumer of it).

    Attributes:
        charges: number of charges.
        kinds: bit set of the cost kinds charged (1 zcdp, 2 gaussian, 4 rdp).
        rho: exact Σρ of the ρ-costs ("zcdp"/"gaussian"), in 2**-1074 units.
        curve: exact Σ of the RDP curves (kind "rdp") at ``ORDERS``, in 2**-1074
            units (None entries are +inf), or None if no RDP curve was charged.
        selection: exact Σδ_q spent on partition selection, in 2**-1074 units.
        gdp: exact Σμ_i² of the charges' GDP claims (each μ² rounded up), in 2**-1074 units,
            or None once a charge without a GDP claim (or spending selection δ) was added
            (no Gaussian-DP account; also totals stored before schema version 6).

    The spent curve is ``S(α) = α·Σρ + Σcurve(α)``.
    """

    charges: int = 0
    kinds: int = 0
    rho: int = 0
    curve: tuple[int | None, ...] | None = None
    selection: int = 0
    gdp: int | None = 0

    # -- arithmetic --------------------------------------------------------------------

    def add(self, cost: Cost, selection_delta: float = 0.0) -> "Totals":
        """These totals plus one charge of ``cost`` spending ``selection_delta`` (exact)."""
        kinds = self.kinds | _KIND_BITS[cost.kind]
        sel = self.selection + (_fix(selection_delta) or 0) if selection_delta else self.selection
        gdp = _gdp_add(self.gdp, cost, selection_delta)
        rho, curve = _cost_fixed(cost)
        if curve is None:
            return Totals(self.charges + 1, kinds, self.rho + rho, self.curve, sel, gdp)
        if self.curve is None:
            return Totals(self.charges + 1, kinds, self.rho, curve, sel, gdp)
        return Totals(self.charges + 1, kinds, self.rho,
                      tuple(None if a is None or b is None else a + b for a, b in zip(self.curve, curve)), sel, gdp)

    @property
    def gdp_mu2(self) -> float | None:
        """Σμ_i² of the GDP claims as a float (correctly rounded exact sum), None without an account."""
        return None if self.gdp is None else _unfix(self.gdp)

    @property
    def zcdp_only(self) -> bool:
        """True if nothing but ρ-costs were charged (the zCDP filter applies)."""
        return not self.kinds & _KIND_BITS["rdp"]

    @property
    def rho_value(self) -> float:
        """Σρ of the ρ-costs as a float (correctly rounded exact sum)."""
        return _unfix(self.rho)

    @property
    def selection_value(self) -> float:
        """Σδ_q spent on partition selection as a float (correctly rounded exact sum)."""
        return _unfix(self.selection)

    def curve_values(self) -> np.ndarray:
        """Σcurve(α) of the RDP costs at ``ORDERS`` (zeros if none); a read-only array."""
        return self._curve_floats

    @cached_property
    def _curve_floats(self) -> np.ndarray:
        if self.curve is None:
            out = np.zeros(len(ORDERS))
        else:
            out = np.asarray([_unfix(v) for v in self.curve], dtype=float)
        out.flags.writeable = False
        return out

    def spent_curve(self) -> np.ndarray:
        """S(α) = α·Σρ + Σcurve(α) at ``ORDERS`` (∞ at α = ∞ if Σρ > 0)."""
        r = self.rho_value
        with np.errstate(invalid="ignore"):
            base = np.where(_FINITE, _ORDERS * r, math.inf if r > 0 else 0.0)
        return base + self.curve_values()

    def spent_at(self, budget: BudgetCurve) -> float:
        """A bound on the spend at α*: α*·Σρ + ``budget.star_bound`` (Σcurve)."""
        extra = 0.0 if self.curve is None else budget.star_bound(self.curve_values())
        return budget.alpha_star * self.rho_value + extra

    def spent_cost(self) -> Cost | None:
        """The composed cost of everything charged (None if nothing): zcdp-only → ``Cost.zcdp``,
        continuous-Gaussian-only → ``Cost.continuous_gaussian``, else ``Cost.rdp`` of S(α)."""
        if self.charges == 0:
            return None
        if self.zcdp_only:
            if self.kinds == _KIND_BITS["gaussian"]:
                return Cost.continuous_gaussian(self.rho_value)
            return Cost.zcdp(self.rho_value)
        return Cost("rdp", curve=tuple(self.spent_curve().tolist()))

    def rho_equivalent(self, budget: BudgetCurve) -> float:
        """The spend in ρ units: Σρ for zcdp-only histories, else the smallest ρ' with
        S(α) ≤ α·ρ' at every order the budget checks. In a Gaussian-DP scope: the share of
        μ_B² spent, times the scope's ρ (so that spent/remaining ρ keep their ratio to the cap)."""
        if budget.gdp and self.gdp is not None:
            return _unfix(self.gdp) / budget.mu2 * budget.rho if budget.mu2 else 0.0  # type: ignore[operator]
        if self.zcdp_only:
            return self.rho_value
        mask = budget.mask
        s = self.spent_curve()[_FINITE][mask] / _FINITE_ORDERS[mask]
        grid = float(np.max(s)) if s.size else 0.0
        return max(grid, self.spent_at(budget) / budget.alpha_star)

    @property
    def continuous_gaussian_only(self) -> bool:
        """Whether every charge composed is a continuous Gaussian (``Cost.kind`` "gaussian")."""
        return self.charges > 0 and self.kinds == _KIND_BITS["gaussian"]

    def spent_epsilon(self, budget: BudgetCurve, delta: float) -> tuple[float, str]:
        """ε at ``delta`` of everything composed, and the conversion used.

        A Gaussian-DP scope (``budget.gdp``) with a GDP account: the exact ε of √(Σμ²)-GDP
        ([DRS22] Cor. 2.13, :func:`dpgate.accounting.gdp_epsilon`): ``"gdp"``. Otherwise:

        Always the ledger's rule (:func:`dpgate.ledger.caps.ledger_epsilon`: [BBG+20] Thm. 21 at
        the grid's orders, the best one), for a legacy cap also at its α* (whichever is
        smaller; its ρ_cap was fixed by the continuous [CKS20] conversion at α*, which the grid
        alone can overstate by up to ~1 %): ``"ledger"``; ``"none"`` and 0 when nothing was
        charged. With the spend equal to the cap's ρ_cap this gives back the cap's ε.
        """
        cost = self.spent_cost()
        if cost is None:
            return 0.0, "none"
        if budget.gdp and self.gdp is not None:
            return accounting.gdp_epsilon(math.sqrt(_unfix(self.gdp)), delta), "gdp"
        eps = ledger_epsilon(cost, delta)
        if budget.alpha_star not in _GRID_ORDERS:  # a legacy cap: its ρ_cap was fixed at α*
            at_star = self.spent_at(budget)
            if math.isfinite(at_star) and at_star > 0:
                eps = min(eps, accounting.rdp_epsilon_tight([at_star], delta, orders=[budget.alpha_star]))
        return eps, "ledger"

    # -- storage -----------------------------------------------------------------------

    def to_row(self) -> tuple[int, int, str, str | None, str | None, str | None]:
        """``(charges, kinds, rho_text, curve_text, selection_text, gdp_text)`` for storage (hex
        fixed point, exact; ``selection_text`` None when no δ was spent; ``gdp_text`` None
        without a GDP account)."""
        curve = None if self.curve is None else ",".join(_fix_text(v) for v in self.curve)
        return self.charges, self.kinds, _fix_text(self.rho), curve, \
            (_fix_text(self.selection) if self.selection else None), \
            (None if self.gdp is None else _fix_text(self.gdp))

    @classmethod
    def from_row(cls, charges: int, kinds: int, rho: str, curve: str | None,
                 selection: str | None = None, gdp: str | None = None) -> "Totals":
        """Inverse of :meth:`to_row` (a row without ``gdp_text``, or NULL: no GDP account)."""
        c = None if curve is None else tuple(_fix_parse(s) for s in curve.split(","))
        if c is not None and len(c) != len(ORDERS):
            raise ValueError("stored curve totals do not match accounting.ORDERS")
        r = _fix_parse(rho)
        if r is None:
            raise ValueError("stored rho total is infinite")
        sel = 0 if selection is None else _fix_parse(selection)
        if sel is None:
            raise ValueError("stored selection delta total is infinite")
        g = None if gdp is None else _fix_parse(gdp)
        return cls(int(charges), int(kinds), r, c, sel, g)


# --------------------------------------------------------------------------------------
# the decision
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """The filter's answer for one scope.

    Attributes:
        ok: True if the request fits.
        rule: ``"zcdp"`` (zCDP filter on ρ), ``"renyi"`` (Rényi filter on curves),
            ``"gdp"`` (Gaussian-DP filter on Σμ²), ``"gdp_claim"`` (a Gaussian-DP scope
            refuses a charge without a GDP claim) or ``"selection_delta"`` (the selection δ
            would be exceeded). For ``"gdp"`` refusals ``spent_at``/``request_at``/
            ``budget_at`` are Σμ², μ_req² and μ_B².
        binding_order: for a refusal by the Rényi filter, the checked order α where the
            spent curve plus the request most exceeds B(α) (relative); else None.
        spent_at, request_at, budget_at: at ``binding_order``: what was spent, what the
            request costs and B(α) (a refusal by the Rényi filter only).
    """

    ok: bool
    rule: str
    binding_order: float | None = None
    spent_at: float | None = None
    request_at: float | None = None
    budget_at: float | None = None


def filter_decision(spent: Totals, request: Cost, budget: BudgetCurve, after: Totals | None = None,
                    selection_delta: float = 0.0) -> Decision:
    """Decide whether ``request`` (spending ``selection_delta`` of selection δ) fits one
    scope's budget: the selection δ, then the zCDP filter or the Rényi filter.

    zCDP filter (history and request all ρ-costs): admit iff
    Σρ + ρ_req ≤ ρ_B·(1 + TOLERANCE) — the Rényi filter at every α > 1 at once
    (Feldman & Zrnic 2021, Thm. 3.1; the zCDP filter of Whitehouse et al. 2023).
    Rényi filter (otherwise): admit iff S(α) + R(α) ≤ α·ρ_B·(1 + TOLERANCE) at every
    checked order (:attr:`BudgetCurve.checked`; RDP curves bounded at an off-grid α* by
    :meth:`BudgetCurve.star_bound`) — Feldman & Zrnic 2021, Thm. 3.1, one fixed-order
    filter per checked order. Selection δ: Σδ_q + δ_req ≤ δ_B·(1 + TOLERANCE) (union bound).

    Args:
        spent: the scope's totals before the request.
        request: the requested cost (validated by :func:`~dpgate.ledger.validation.validate_cost`).
        budget: the scope's budget.
        after: ``spent.add(request, selection_delta)`` if the caller has it already.
        selection_delta: δ_q the request spends on partition selection (≥ 0).

    Returns:
        A :class:`Decision`.
    """
    slack = 1.0 + TOLERANCE
    if budget.gdp:
        return _gdp_decision(spent, request, budget, selection_delta, slack)
    if selection_delta > 0.0:
        total = _unfix(spent.selection + _fix(selection_delta))  # type: ignore[operator]
        if total > budget.selection_delta * slack:
            return Decision(False, "selection_delta")
    if spent.zcdp_only and request.is_zcdp:
        total = _unfix(spent.rho + _fix(request.rho))  # type: ignore[operator]
        return Decision(total <= budget.rho * slack, "zcdp")
    if after is None:
        after = spent.add(request, selection_delta)
    mask = budget.mask
    orders = _FINITE_ORDERS[mask]
    s = after.spent_curve()[_FINITE][mask]
    lim = orders * budget.rho * slack
    star_s = after.spent_at(budget)
    star_lim = budget.alpha_star * budget.rho * slack
    if not (s > lim).any() and star_s <= star_lim:
        return Decision(True, "renyi")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lim > 0, s / lim, np.where(s > 0, math.inf, 0.0))
    star_ratio = star_s / star_lim if star_lim > 0 else (math.inf if star_s > 0 else 0.0)
    req = Totals().add(request)
    if ratio.size and ratio.max() >= star_ratio:
        i = int(np.argmax(ratio))
        alpha = float(orders[i])
        j = int(np.flatnonzero(_FINITE)[np.flatnonzero(mask)[i]])
        return Decision(False, "renyi", alpha, float(spent.spent_curve()[j]), float(req.spent_curve()[j]),
                        alpha * budget.rho)
    return Decision(False, "renyi", budget.alpha_star, spent.spent_at(budget), req.spent_at(budget),
                    budget.alpha_star * budget.rho)


def _gdp_decision(spent: Totals, request: Cost, budget: BudgetCurve, selection_delta: float,
                  slack: float) -> Decision:
    """The Gaussian-DP filter (module docstring): Σμ² + μ_req² ≤ μ_B²·(1 + TOLERANCE)."""
    mu = request.gdp_bound
    if mu is None or selection_delta > 0.0 or spent.gdp is None:
        return Decision(False, "gdp_claim")
    need = _mu2_fixed(mu)
    total = _unfix(spent.gdp + need)
    if total <= budget.mu2 * slack:  # type: ignore[operator]
        return Decision(True, "gdp")
    return Decision(False, "gdp", None, _unfix(spent.gdp), _unfix(need), budget.mu2)


# --------------------------------------------------------------------------------------
# conversions used in refusals and reports
# --------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _cost_eps(cost: Cost, delta: float) -> float:
    return ledger_epsilon(cost, delta)


def charge_epsilon(cost: Cost, delta: float) -> float:
    """ε at δ of one charge alone by the ledger's rule (:func:`dpgate.ledger.caps.ledger_epsilon`,
    memoised)."""
    return _cost_eps(cost, delta)


def charge_statement(cost: Cost, delta: float, gdp: bool = False) -> tuple[float, float]:
    """The (ε, δ) a receipt states for one charge made at ``delta`` (the cap's δ less its selection δ).

    A pure-ε charge states its ε at δ = 0; in a Gaussian-DP population (``gdp``) another charge
    with a GDP claim μ states the exact ε of μ-GDP at ``delta`` ([DRS22] Cor. 2.13). Otherwise:

    A cost with a finite pure-ε value (its curve at α = ∞: a discrete Laplace release, an ε-DP
    mechanism) states that ε at δ = 0 for its own part; any other cost states the ledger's ε
    (:func:`charge_epsilon`) at ``delta``, the δ it was charged at.
    """
    pure = float(cost.curve_at((math.inf,))[0])
    if math.isfinite(pure):
        return pure, 0.0
    mu = cost.gdp_bound if gdp else None
    if mu is not None:
        return accounting.gdp_epsilon(mu, delta), delta
    return charge_epsilon(cost, delta), delta


def rho_epsilon(rho: float, delta: float) -> float:
    """ε at δ of one zCDP charge of ``rho`` by the ledger's rule; 0 for ρ ≤ 0."""
    return ledger_epsilon(rho, delta) if rho > 0 else 0.0


def _g(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x:.4g}"


def exhausted_error(
    population: str,
    consumer: str,
    scope: str,
    request: Cost,
    spent: Totals,
    budget: BudgetCurve,
    cap: CapSpec,
    decision: Decision,
    selection_delta: float = 0.0,
) -> BudgetExhausted:
    """The :class:`~dpgate.errors.BudgetExhausted` for a refused charge (pure).

    The message is one short sentence in the terms of the rule that refused: what is needed
    and what the payer has left of what (zCDP filter: "needs ρ 5; left for analysts: ρ 0.113 of
    0.1179 (40% of the cap's ρ 0.2947); nothing was charged"; Rényi filter: ε(α) at
    the binding order; selection: δ). The long account (the order that failed, what is spent
    there, B(α), the excess, why that order is checked) is ``details["explanation"]``, and every
    figure is a field.

    ``details``: population, consumer, scope ("population" or "consumer"), delta, rule,
    binding_order, alpha_cap, and requested / spent / cap / remaining, each
    ``{rho, epsilon}`` with ε at the cap's δ less its selection δ, by the ledger's conversion
    (requested: the charge alone, its ρ the
    smallest ρ' with curve(α) ≤ α·ρ' at the checked orders; remaining: one zCDP charge
    of the remaining ρ; cap: the published ε for a population, the ε of share × ρ_cap
    for a consumer); for the Rényi filter ``order`` = ``{alpha, request, spent, budget,
    excess}`` (RDP ε values at that order); for the selection δ ``selection`` =
    ``{requested, spent, cap, remaining}``; ``explanation``: the whole account in words.
    """
    delta = cap.delta
    d_rho = cap.rho_delta
    req_rho = Totals().add(request).rho_equivalent(budget)
    req_eps = charge_epsilon(request, d_rho)
    spent_rho = spent.rho_equivalent(budget)
    spent_eps, _ = spent.spent_epsilon(budget, d_rho)
    rem = max(0.0, budget.rho - spent_rho)
    cap_eps = cap.epsilon if scope == "population" else rho_epsilon(budget.rho, d_rho)
    who = f"consumer {consumer!r} of population {population!r}" if scope == "consumer" \
        else f"population {population!r}"
    share = "" if scope == "population" else " (its share of the population's)"
    # the lead sentence: what is needed, who pays, what they have left of what
    payer = f"left for {consumer}" if scope == "consumer" else f"left for population {population}"
    of_what = (f" ({budget.rho / cap.rho_cap:.0%} of the cap's ρ {_s(cap.rho_cap)})"
               if scope == "consumer" and cap.rho_cap > 0 else "")
    details: dict[str, Any] = {
        "population": population,
        "consumer": consumer,
        "scope": scope,
        "delta": delta,
        "rule": decision.rule,
        "binding_order": decision.binding_order,
        "alpha_cap": cap.alpha_star if cap.alpha_cap is None else cap.alpha_cap,
        "requested": {"rho": json_float(req_rho), "epsilon": json_float(req_eps)},
        "spent": {"rho": json_float(spent_rho), "epsilon": json_float(spent_eps)},
        "cap": {"rho": budget.rho, "epsilon": json_float(cap_eps)},
        "remaining": {"rho": rem, "epsilon": json_float(rho_epsilon(rem, d_rho))},
    }
    if decision.rule == "selection_delta":
        used = spent.selection_value
        left = max(0.0, budget.selection_delta - used)
        details["selection"] = {"requested": selection_delta, "spent": used, "cap": budget.selection_delta,
                                "remaining": left}
        if budget.selection_delta <= 0.0:
            message = ("partition selection is not available: the cap reserves no δ for selecting keys "
                       "(selection_delta = 0; adopt a policy that reserves some with `dpgate caps apply`); "
                       "nothing was charged")
            details["explanation"] = (
                f"partition selection is not available for {who}: its cap reserves no delta for selecting keys "
                "(selection_delta = 0; adopt a policy with selection_delta through `dpgate caps apply`)")
        else:
            message = (f"needs δ {_s(selection_delta)} for partition selection; {payer}: δ {_s(left)} of "
                       f"{_s(budget.selection_delta)}; nothing was charged")
            details["explanation"] = (
                f"partition selection budget exhausted for {who}: selecting keys needs delta = "
                f"{selection_delta:.3g} but only {left:.3g} of the selection delta "
                f"{budget.selection_delta:.3g}{share} remains")
        return BudgetExhausted(message, details)
    if decision.rule == "gdp_claim":
        why = ("it spends δ on partition selection" if selection_delta > 0.0 else
               "its cost has no Gaussian-DP claim (a DP-SGD curve, a top-k selection or an external zCDP "
               "charge)")
        message = (f"population {population} composes in Gaussian DP (its cap's composition is \"gdp\"), and this "
                   f"charge cannot be composed there: {why}; nothing was charged")
        details["explanation"] = (
            f"{who} admits only charges with a mu-GDP claim (dpgate's discrete Gaussian releases, continuous "
            "Gaussians, pure-epsilon charges), fixed before its first charge so that the Gaussian-DP filter stays valid under "
            f"adaptive composition (Smith & Thakurta 2022); {why}")
        return BudgetExhausted(message, details)
    if decision.rule == "gdp":
        s2, r2, b2 = decision.spent_at, decision.request_at, decision.budget_at
        assert s2 is not None and r2 is not None and b2 is not None
        left = max(0.0, b2 - s2)
        details["gdp"] = {"requested_mu": math.sqrt(r2), "spent_mu": math.sqrt(s2), "mu_budget": math.sqrt(b2),
                          "remaining_mu": math.sqrt(left)}
        message = (f"needs μ {_s(math.sqrt(r2))} (Gaussian DP); {payer}: μ {_s(math.sqrt(left))} of "
                   f"{_s(math.sqrt(b2))}{of_what}; nothing was charged")
        details["explanation"] = (
            f"privacy budget exhausted for {who}: the charge is mu = {math.sqrt(r2):.6g}-GDP but mu^2 = {s2:.6g} "
            f"of the budget mu^2 = {b2:.6g}{share} is spent, so only mu = {math.sqrt(left):.6g} remains "
            "(Gaussian-DP filter, Smith & Thakurta 2022: mu_i^2 add up)")
        return BudgetExhausted(message, details)
    if decision.rule == "renyi":
        a, s, r, b = (decision.binding_order, decision.spent_at, decision.request_at, decision.budget_at)
        assert a is not None and s is not None and r is not None and b is not None
        excess = s + r - b
        details["order"] = {"alpha": a, "request": json_float(r), "spent": json_float(s),
                            "budget": b, "excess": json_float(excess)}
        left = max(0.0, b - s)
        proof = (f"the cap (epsilon = {cap.epsilon:.4g}, delta = {delta:.3g}) is proven at Rényi order "
                 f"alpha_cap = {details['alpha_cap']:g}, and every grid order up to it is checked"
                 if cap.alpha_cap is not None else
                 f"this population's cap (epsilon = {cap.epsilon:.4g}, delta = {delta:.3g}) was fixed "
                 "before dpgate checked only the orders up to alpha_cap, so every order is checked; "
                 "`dpgate caps apply` or a new cap re-fixes it")
        if math.isinf(r):
            message = (f"the charge's RDP curve makes no claim at Rényi order α = {a:g} (ε(α) = ∞), an order the "
                       f"cap checks: give ε(α) at every order up to alpha_cap = {details['alpha_cap']:g}; "
                       "nothing was charged")
            details["explanation"] = (
                f"the charge does not fit {who}: its RDP curve makes no claim at order alpha = {a:g} "
                f"(epsilon(alpha) = ∞), an order the budget checks; {proof}. Give epsilon(alpha) at every "
                "order up to alpha_cap")
        else:
            pct = f" ({excess / left:.0%} more than what is left)" if left > 0 else ""
            # a zCDP request (rho, or a budget converted to rho) is read in rho first: epsilon(alpha) = rho·alpha
            as_rho = (f"ρ {_s(req_rho)}, i.e. " if request.rho is not None and math.isfinite(req_rho)
                      and req_rho > 0 else "")
            message = (f"needs {as_rho}ε(α) {_s(r)} at Rényi order α = {a:g}; {payer} there: {_s(left)} of "
                       f"{_s(b)}; nothing was charged")
            lead = (f"the charge needs rho = {req_rho:.6g} (epsilon(alpha) = rho·alpha, Bun & Steinke 2016 "
                    f"Def. 1.1); " if as_rho else "")
            details["explanation"] = (
                f"privacy budget exhausted for {who}: {lead}at Rényi order alpha = {a:g} the charge costs "
                f"epsilon(alpha) = {_g(r)}, but {_g(s)} of the budget B(alpha) = {_g(b)}{share} is already spent "
                f"there, so only {_g(left)} remains: over by {_g(excess)}{pct}. {proof[0].upper()}{proof[1:]}")
        return BudgetExhausted(message, details)
    message = f"needs ρ {_s(req_rho)}; {payer}: ρ {_s(rem)} of {_s(budget.rho)}{of_what}; nothing was charged"
    eps_part = f" (epsilon = {req_eps:.4g} on its own at delta = {d_rho:.3g})" if req_eps > 0 else ""
    left_part = f" (epsilon = {rho_epsilon(rem, d_rho):.4g} as one more charge)" if rem > 0 else ""
    details["explanation"] = (
        f"privacy budget exhausted for {who}: the charge needs rho = {req_rho:.6g}{eps_part} but only "
        f"rho = {rem:.6g} of the budget rho = {budget.rho:.6g}{share} remains{left_part}")
    return BudgetExhausted(message, details)


def _s(x: float) -> str:
    """A budget figure in a message: 4 significant digits (∞ as ∞)."""
    return "∞" if math.isinf(x) else f"{x:.4g}"


@dataclass(frozen=True)
class Refusal:
    """A charge refused by one scope's filter; :meth:`error` builds the error to raise.

    Built inside the store's write transaction, raised after it (the ε conversions
    of the error details need not hold the lock).
    """

    population: str
    consumer: str
    scope: str
    request: Cost
    spent: Totals
    budget: BudgetCurve
    cap: CapSpec
    decision: Decision
    selection_delta: float = 0.0

    def error(self) -> DpgateError:
        """The :class:`~dpgate.errors.BudgetExhausted` (see :func:`exhausted_error`), or an
        :class:`~dpgate.errors.InvalidBudget` for a curve with no claim (∞) at a checked order."""
        err = exhausted_error(self.population, self.consumer, self.scope, self.request, self.spent,
                              self.budget, self.cap, self.decision, self.selection_delta)
        if self.decision.rule == "renyi" and self.decision.request_at is not None \
                and math.isinf(self.decision.request_at):
            return InvalidBudget(err.message, err.details)
        if self.decision.rule == "gdp_claim":
            return InvalidBudget(err.message, err.details)
        return err


def check_charge(
    population: str,
    consumer: str,
    cost: Cost,
    cap: CapSpec,
    share: float,
    population_totals: Totals,
    consumer_totals: Totals,
    selection_delta: float = 0.0,
) -> tuple[Totals, Totals, Refusal | None]:
    """Run the consumer's filter and the population's (:func:`filter_decision`).

    The consumer's budget is ``BudgetCurve.of(cap, share)``, the population's
    ``BudgetCurve.of(cap)``; a charge must pass both. The consumer's runs first unless it
    holds the whole budget (share 1), so that a refusal names the scope that binds.

    Returns:
        ``(population_totals_after, consumer_totals_after, refusal)``: the totals with
        the charge added, and None if it fits or the first scope that refuses.
    """
    pt_after = population_totals.add(cost, selection_delta)
    ct_after = consumer_totals.add(cost, selection_delta)
    cb, pb = BudgetCurve.of(cap, share), BudgetCurve.of(cap)
    # a consumer holding the whole budget (an open population, or a share of 1) can only be
    # refused where the population is: name the population then
    scopes = [("population", population_totals, pb, pt_after), ("consumer", consumer_totals, cb, ct_after)]
    if share < 1.0:
        scopes.reverse()
    for scope, totals, budget, after in scopes:
        decision = filter_decision(totals, cost, budget, after, selection_delta)
        if not decision.ok:
            return pt_after, ct_after, Refusal(population, consumer, scope, cost, totals, budget, cap, decision,
                                               selection_delta)
    return pt_after, ct_after, None
