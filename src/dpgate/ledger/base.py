"""The privacy-budget ledger: contract and backend-independent logic.

A *population* (the people one budget protects) has a *cap* (ε, δ), fixed into
a budget curve when the cap is set, and *allocations*: named consumers, each
with a share of the population's budget. Every *charge* is one append-only
entry, written before the mechanism runs and never refunded. Cap and
allocation changes are recorded *governance events*, never edits.

This module holds everything a storage backend (``sqlite.py``, ``postgres.py``)
shares, so that the decisions and reports are the same whatever stores the
rows:

* the :class:`Ledger` protocol and its result types (:class:`ChargeReceipt`,
  :class:`SpendReport`, :class:`VerifyReport`);
* input validation (caps, allocations, costs) raising dpgate errors;
* :class:`BudgetCurve` and :class:`Totals` with the *filter decision*
  (:func:`filter_decision`): the zCDP filter and the Rényi filter;
* exact running totals (every ρ and curve value is summed exactly, in binary
  fixed point, so that a ledger's spend equals the correctly rounded sum of its
  entries — ``math.fsum`` — however many charges it holds);
* the spend report, the refusal details, the canonical serialisation and the
  SHA-256 hash chain, and :class:`Replay`, which recomputes the whole state from
  the entries for :meth:`Ledger.verify`;
* the steps of a charge every SQL backend runs inside its write transaction
  (:func:`prepare_charge`, :func:`allocation_share`, :func:`check_charge`,
  :func:`new_charge_entry`, :func:`new_event_entry`), the stored column
  layout (:data:`CHARGE_COLUMNS`, :data:`EVENT_COLUMNS`,
  :data:`POPULATION_COLUMNS`) and the comparison of stored derived state with
  the replay (:func:`stored_state_problems`); the SQL that runs them on the
  common table layout is :class:`dpgate.ledger.sql.SqlLedger`.

Budget enforcement (adaptive composition)
-----------------------------------------
Analysts choose each query after seeing earlier answers, so "add the costs,
convert to (ε, δ), compare with the cap" is not a proven rule. The ledger
uses *privacy filters* instead, with the budget curve fixed when the cap is
set:

* ``ρ_cap = accounting.rho_for_cap(ε, δ, "tight")`` — the largest ρ whose
  tight zCDP conversion ([CKS20] Cor. 13) meets the cap — and the budget
  curve ``B(α) = α·ρ_cap``.
* **Rényi filter** (Feldman & Zrnic, "Individual Privacy Accounting via a
  Rényi Filter", NeurIPS 2021, arXiv:2008.11193, §3; restated among the
  filters of Whitehouse, Ramdas, Rogers & Wu, "Fully-Adaptive Composition in
  Differential Privacy", ICML 2023, arXiv:2203.05481): at a fixed order α, if
  every adaptively chosen mechanism is (α, ε_i(α))-RDP given the past and
  the interaction stops before Σε_i(α) would exceed a budget B(α) fixed in
  advance, the whole interaction is (α, B(α))-RDP. It holds order by order.
* **zCDP filter** — while a scope's history and the request are all ρ-costs
  (``Cost.kind`` "zcdp" or "gaussian"): admit iff ``Σρ + ρ_req ≤ ρ_cap``.
  A ρ-cost is (α, αρ)-RDP at *every* α > 1, so this is the Rényi filter with
  B(α) = α·ρ_cap at every order at once: the interaction is ρ_cap-zCDP
  (the zCDP privacy filter of Whitehouse et al. 2023).
* **Rényi filter on the grid** — otherwise: admit iff the spent curve plus
  the request stays ``≤ B(α)`` at every finite order of ``accounting.ORDERS``
  *and* at the order ``α*`` where the tight conversion of ρ_cap attains its
  optimum; the interaction is (α, B(α))-RDP at every checked order.

  Why ``α*``: the cap is met by ρ_cap through the *continuous* optimum of the
  conversion; on the grid alone, ``B`` converts to an ε up to ~0.7 % above
  the cap (grid gap). Checking ``α*`` as well restores the published cap for
  mixed histories: the interaction is then (α*, α*·ρ_cap)-RDP and therefore
  (ε_cap, δ)-DP by [BBG+20] Thm. 21. At ``α*`` a ρ-cost contributes ``α*·ρ``
  and an RDP curve ``c`` (known at grid orders only) the smaller of two valid
  bounds on D_α*: (i) ``c(α₂)``, α₂ the next grid order ≥ α*, since Rényi
  divergence is non-decreasing in its order (van Erven & Harremoës 2014,
  "Rényi Divergence and Kullback-Leibler Divergence", Thm. 3); (ii) the chord
  ``[λ(α₁−1)c(α₁) + (1−λ)(α₂−1)c(α₂)] / (α*−1)`` with α₁ < α* < α₂ the
  bracketing grid orders and α* = λα₁ + (1−λ)α₂, since (α−1)·D_α =
  log E_Q[(dP/dQ)^α] is convex in α (a log-moment generating function; ibid.,
  §III). Both bounds are linear in ``c``, so they apply to the summed totals,
  and Σ min ≤ min Σ keeps the check valid. The extra order only ever refuses
  more than the grid rule; it binds for curves that grow like α·ρ (e.g. a
  Gaussian stated as a curve), which can use ~99 % of ρ_cap instead of 100 %.
  A curve that is ``+inf`` (no claim) at a finite grid order can never fit and
  is refused as invalid. ``B(∞) = ∞``: the pure-ε order never binds.

Per consumer the same rule runs against ``share × B(α)``; a charge must pass
both its consumer's filter and its population's. A relative tolerance of
:data:`TOLERANCE` (1e-12) lets exactly-fitting charges through (e.g. 100
charges of ρ = 0.001 against ρ_cap = 0.1); the guarantee then holds with
ρ_cap·(1 + 1e-12), a difference far below any reported digit.

Reported ε ("ε used so far at the cap's δ") uses the tightest conversion
valid for what was composed: [CKS20] for histories of discrete Gaussian
(zCDP) charges, the exact Gaussian-DP conversion ([BW18] Thm. 8) for
histories of continuous Gaussians only (Σρ_i ≤ ρ_cap is then also the
Gaussian-DP filter Σμ_i² ≤ μ², μ = √(2ρ), of Smith & Thakurta, "Fully
Adaptive Composition for Gaussian Differential Privacy", arXiv:2210.17520),
and [BBG+20] Thm. 21 on the RDP curve otherwise (at the grid and at α*,
whichever is smaller). See :mod:`dpgate.accounting` for the formulas.

References: [CKS20] Canonne, Kamath, Steinke 2020 (arXiv:2004.00010);
[BBG+20] Balle, Barthe, Gaboardi, Hsu, Sato 2020 (arXiv:1905.09982);
[BW18] Balle & Wang 2018.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property, lru_cache
from typing import Any, Iterable, Iterator, Mapping, Protocol, runtime_checkable

import numpy as np
from scipy.optimize import minimize_scalar

from dpgate import accounting
from dpgate.accounting import ORDERS, Cost
from dpgate.errors import (
    BudgetExhausted,
    DpgateError,
    InvalidBudget,
    InvalidRequest,
    PolicyError,
    UnknownConsumer,
    UnknownPopulation,
)

__all__ = [
    "TOLERANCE",
    "GENESIS_HASH",
    "Ledger",
    "ChargeReceipt",
    "ConsumerSpend",
    "SpendReport",
    "VerifyReport",
    "CapSpec",
    "BudgetCurve",
    "Totals",
    "Decision",
    "filter_decision",
    "validate_cap",
    "validate_allocations",
    "validate_cost",
    "validate_name",
    "optimal_order",
    "canonical_json",
    "entry_hash",
    "utc_now",
    "build_spend_report",
    "exhausted_error",
    "charge_epsilon",
    "iter_sorted_entries",
    "Replay",
    "CHARGE_COLUMNS",
    "EVENT_COLUMNS",
    "POPULATION_COLUMNS",
    "ChargeRequest",
    "Refusal",
    "validate_text",
    "validate_limit",
    "validate_governance",
    "validate_population",
    "unknown_population",
    "allocation_share",
    "population_from_row",
    "prepare_charge",
    "check_charge",
    "new_charge_entry",
    "new_event_entry",
    "charge_entry",
    "event_entry",
    "display_charge",
    "display_event",
    "receipt_from_entry",
    "cap_change_result",
    "stored_state_problems",
]

#: Relative tolerance of the filter comparisons (exactly-fitting charges are admitted).
TOLERANCE = 1e-12

#: ``prev_hash`` of the first entry of a ledger (64 zeros).
GENESIS_HASH = "0" * 64

#: The finite orders of the ledger grid, as an array (the pure-ε order ∞ never binds).
_ORDERS = np.asarray(ORDERS, dtype=float)
_FINITE = np.isfinite(_ORDERS)
_FINITE_ORDERS = _ORDERS[_FINITE]

_KIND_BITS = {"zcdp": 1, "gaussian": 2, "rdp": 4}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$")


# --------------------------------------------------------------------------------------
# exact fixed-point sums
# --------------------------------------------------------------------------------------

# Every finite double is an integer multiple of 2**-1074, so a sum of doubles is
# exact as an integer count of 2**-1074 units (Python ints are unbounded). The
# float of such a sum (int / int true division is correctly rounded in Python) is
# the correctly rounded exact sum, i.e. what ``math.fsum`` returns. ``None``
# stands for +inf.
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


def _fix_text(n: int | None) -> str:
    return "inf" if n is None else format(n, "x")


def _fix_parse(s: str) -> int | None:
    return None if s == "inf" else int(s, 16)


# --------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------


def utc_now() -> str:
    """The current time as an ISO-8601 UTC string with microseconds (``…Z``)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def canonical_json(obj: Any) -> str:
    """The canonical serialisation hashed by the chain: sorted keys, no spaces, UTF-8.

    Floats are written with Python's shortest round-trip ``repr`` (so a value
    read back from the store serialises identically); ``inf`` as ``Infinity``.
    """
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def entry_hash(entry: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of an entry's canonical serialisation (every field but ``hash``).

    The entry includes ``prev_hash`` (the previous entry's hash, or
    :data:`GENESIS_HASH`), so the entries form a hash chain: editing, inserting
    or dropping an entry changes every later hash.
    """
    body = {k: v for k, v in entry.items() if k != "hash"}
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def _json_float(x: float) -> float | str:
    """A float for a JSON report: ``"inf"`` for infinity (strict JSON has none)."""
    return "inf" if math.isinf(x) else float(x)


def validate_name(value: Any, what: str, error: type[DpgateError] = InvalidRequest) -> str:
    """Check a population or consumer name: 1–128 characters ``[A-Za-z0-9._:@/+-]``,
    starting with a letter or digit.

    Raises:
        ``error`` (default :class:`~dpgate.errors.InvalidRequest`): not such a string.
    """
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise error(
            f"{what} must be 1-128 characters of letters, digits and ._:@/+- "
            f"starting with a letter or digit, got {value!r}",
            {what: repr(value)},
        )
    return value


# --------------------------------------------------------------------------------------
# caps and allocations
# --------------------------------------------------------------------------------------


def optimal_order(rho: float, delta: float) -> float:
    """The order α* > 1 at which the tight conversion of ρ-zCDP to (ε, δ) is smallest.

    Minimises ``accounting.rdp_epsilon_tight([α·ρ], δ, orders=[α])`` — [BBG+20]
    Thm. 21 at the single order α, which for the curve α·ρ is the objective of
    [CKS20] Cor. 13 — over α − 1 ∈ [1e-9, 1e12] (bounded Brent on log(α − 1)).

    Args:
        rho: ρ_cap > 0 (total).
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


@dataclass(frozen=True)
class CapSpec:
    """A population's cap, fixed into its budget curve when set.

    Attributes:
        epsilon: cap ε (total, the published guarantee) at ``delta``.
        delta: cap δ in (0, 1).
        rho_cap: ρ of the budget curve B(α) = α·ρ_cap (total for the population).
        alpha_star: the order where the tight conversion of ρ_cap is optimal
            (also checked by the Rényi filter; see the module docstring).
        rho_stated: True if the cap was stated directly in ρ (then ``epsilon`` is
            the tight conversion of ``rho_cap`` at ``delta``).
    """

    epsilon: float
    delta: float
    rho_cap: float
    alpha_star: float
    rho_stated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """``{epsilon, delta, rho_cap, alpha_star, rho_stated}`` (JSON-serialisable)."""
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "rho_cap": self.rho_cap,
            "alpha_star": self.alpha_star,
            "rho_stated": self.rho_stated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CapSpec":
        """Inverse of :meth:`to_dict`."""
        return cls(float(data["epsilon"]), float(data["delta"]), float(data["rho_cap"]),
                   float(data["alpha_star"]), bool(data.get("rho_stated", False)))

    def same_cap(self, other: "CapSpec") -> bool:
        """True if ``other`` states the same cap (same (ε, δ), or same (ρ_cap, δ) if stated in ρ)."""
        if self.rho_stated != other.rho_stated or self.delta != other.delta:
            return False
        return self.rho_cap == other.rho_cap if self.rho_stated else self.epsilon == other.epsilon


def _real(value: Any, what: str, error: type[DpgateError]) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{what} must be a number, got {value!r}", {what: repr(value)})
    v = float(value)
    if math.isnan(v):
        raise error(f"{what} must not be NaN", {what: "NaN"})
    return v


def validate_cap(
    epsilon: float | None,
    delta: float,
    *,
    rho_cap: float | None = None,
    error: type[DpgateError] = InvalidBudget,
) -> CapSpec:
    """Validate a cap and fix it into a budget curve.

    Exactly one of ``epsilon`` and ``rho_cap`` is given. With ``epsilon``:
    ``ρ_cap = accounting.rho_for_cap(ε, δ, "tight")`` ([CKS20] Cor. 13
    inverted). With ``rho_cap`` (the budget stated directly in ρ): ε is recorded
    as ``accounting.zcdp_epsilon_tight(ρ_cap, δ)``, the (ε, δ) it corresponds to.

    Args:
        epsilon: cap ε > 0, finite (total), or None.
        delta: cap δ in (0, 1) (δ = 0 admits no Gaussian release at all).
        rho_cap: budget in ρ > 0, finite (total), or None.
        error: the error class to raise (``PolicyError`` for policy files).

    Returns:
        The :class:`CapSpec`.

    Raises:
        ``error`` (default :class:`~dpgate.errors.InvalidBudget`): both or neither of
        ``epsilon``/``rho_cap``; ε or ρ not finite and > 0; δ not in (0, 1).
    """
    d = _real(delta, "delta", error)
    if not 0.0 < d < 1.0:
        raise error(f"the cap's delta must be in (0, 1), got {d!r}", {"delta": d})
    if (epsilon is None) == (rho_cap is None):
        raise error("state the cap as exactly one of epsilon and rho_cap", {})
    if rho_cap is not None:
        r = _real(rho_cap, "rho_cap", error)
        if not (0.0 < r < math.inf):
            raise error(f"rho_cap must be finite and > 0, got {r!r}", {"rho_cap": _json_float(r)})
        e = accounting.zcdp_epsilon_tight(r, d)
        return CapSpec(e, d, r, optimal_order(r, d), rho_stated=True)
    e = _real(epsilon, "epsilon", error)
    if not (0.0 < e < math.inf):
        raise error(f"the cap's epsilon must be finite and > 0, got {e!r}", {"epsilon": _json_float(e)})
    r = accounting.rho_for_cap(e, d, "tight")
    if not r > 0.0:
        raise error(f"the cap (epsilon={e!r}, delta={d!r}) admits no spending (rho_cap = 0)",
                    {"epsilon": e, "delta": d})
    return CapSpec(e, d, r, optimal_order(r, d))


def validate_allocations(
    allocations: Mapping[str, float] | Iterable[tuple[str, float]] | None,
    error: type[DpgateError] = PolicyError,
) -> dict[str, float]:
    """Validate allocations: consumer name → share in [0, 1], shares summing to ≤ 1.

    An empty mapping means an *open* population: any consumer may charge and is
    held only to the population's budget.

    Args:
        allocations: mapping (or pairs) consumer → share of the population's budget.
        error: the error class to raise (default :class:`~dpgate.errors.PolicyError`).

    Returns:
        A plain dict, sorted by consumer name.

    Raises:
        ``error``: a bad name, a share not a finite number in [0, 1], a duplicate
        consumer, or shares summing past 1 (``math.fsum``, tolerance 1e-12).
    """
    if allocations is None:
        return {}
    items = list(allocations.items()) if isinstance(allocations, Mapping) else list(allocations)
    out: dict[str, float] = {}
    for item in items:
        try:
            name, share = item
        except (TypeError, ValueError):
            raise error("allocations must map consumer names to shares", {}) from None
        validate_name(name, "consumer", error)
        s = _real(share, f"allocation share of {name!r}", error)
        if not 0.0 <= s <= 1.0:
            raise error(f"allocation share of consumer {name!r} must be in [0, 1], got {s!r}",
                        {"consumer": name, "share": _json_float(s)})
        if name in out:
            raise error(f"consumer {name!r} is allocated twice", {"consumer": name})
        out[name] = s
    total = math.fsum(out.values())
    if total > 1.0 + TOLERANCE:
        raise error(f"allocations sum to {total!r}, more than 1 (the whole budget)",
                    {"sum": total, "allocations": out})
    return dict(sorted(out.items()))


def validate_cost(cost: Any) -> Cost:
    """Check that ``cost`` is a usable :class:`~dpgate.accounting.Cost` for a charge.

    Re-checks what ``Cost`` validates on construction (a frozen dataclass can
    still be built around its checks) and refuses costs the filter can never
    admit.

    Raises:
        InvalidBudget: not a Cost; unknown kind; ρ NaN, negative, infinite or 0;
            a curve of the wrong length, NaN or negative values, all zero, or
            ``+inf`` at a finite order (no budget curve B(α) = α·ρ_cap admits it).
    """
    if not isinstance(cost, Cost):
        raise InvalidBudget(f"a charge needs an accounting.Cost, got {type(cost).__name__}", {})
    if cost.kind in ("zcdp", "gaussian"):
        r = cost.rho
        if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or r < 0 or math.isinf(r):
            raise InvalidBudget(f"rho must be a finite number >= 0, got {r!r}", {"rho": repr(r)})
        if r == 0:
            raise InvalidBudget("a charge must cost something (rho > 0); post-processing needs no charge",
                                {"rho": 0.0})
        return cost
    if cost.kind != "rdp":
        raise InvalidBudget(f"unknown cost kind {cost.kind!r}", {"kind": repr(cost.kind)})
    c = cost.curve
    if not isinstance(c, tuple) or len(c) != len(ORDERS):
        raise InvalidBudget(f"an RDP curve needs one value per order of accounting.ORDERS ({len(ORDERS)})", {})
    arr = np.asarray(c, dtype=float)
    if np.isnan(arr).any() or (arr < 0).any():
        raise InvalidBudget("an RDP curve must be non-negative and not NaN", {})
    bad = np.isinf(arr) & _FINITE
    if bad.any():
        alpha = float(_ORDERS[np.argmax(bad)])
        raise InvalidBudget(
            f"the RDP curve is infinite at order {alpha}: no budget curve can admit it "
            "(give a finite bound at every finite order)",
            {"order": alpha},
        )
    if not (arr > 0).any():
        raise InvalidBudget("a charge must cost something (the curve is zero)", {})
    return cost


# --------------------------------------------------------------------------------------
# budget curve, totals, filter decision
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetCurve:
    """The budget curve of one scope: B(α) = α·rho at the checked orders.

    Attributes:
        rho: the scope's ρ (ρ_cap for a population, share × ρ_cap for a consumer).
        alpha_star: the extra order checked by the Rényi filter (the population's α*).
    """

    rho: float
    alpha_star: float

    def star_bound(self, curve: np.ndarray) -> float:
        """A valid upper bound at α* on the Rényi divergence of anything whose RDP curve
        at ``ORDERS`` is ``curve`` (see the module docstring): the minimum of the value at
        the next grid order α₂ ≥ α* (monotonicity) and the chord of (α−1)·c(α) between the
        bracketing grid orders α₁ < α* < α₂ (convexity). Linear in ``curve`` up to the min.
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


@dataclass(frozen=True)
class Totals:
    """Exact running totals of one scope (a population, or one consumer of it).

    Attributes:
        charges: number of charges.
        kinds: bit set of the cost kinds charged (1 zcdp, 2 gaussian, 4 rdp).
        rho: exact Σρ of the ρ-costs ("zcdp"/"gaussian"), in 2**-1074 units.
        curve: exact Σ of the RDP curves (kind "rdp") at ``ORDERS``, in 2**-1074
            units (None entries are +inf), or None if no RDP curve was charged.

    The spent curve is ``S(α) = α·Σρ + Σcurve(α)``.
    """

    charges: int = 0
    kinds: int = 0
    rho: int = 0
    curve: tuple[int | None, ...] | None = None

    # -- arithmetic --------------------------------------------------------------------

    def add(self, cost: Cost) -> "Totals":
        """These totals plus one charge of ``cost`` (exact)."""
        kinds = self.kinds | _KIND_BITS[cost.kind]
        rho, curve = _cost_fixed(cost)
        if curve is None:
            return Totals(self.charges + 1, kinds, self.rho + rho, self.curve)
        if self.curve is None:
            return Totals(self.charges + 1, kinds, self.rho, curve)
        return Totals(self.charges + 1, kinds, self.rho,
                      tuple(None if a is None or b is None else a + b for a, b in zip(self.curve, curve)))

    @property
    def zcdp_only(self) -> bool:
        """True if nothing but ρ-costs were charged (the zCDP filter applies)."""
        return not self.kinds & _KIND_BITS["rdp"]

    @property
    def rho_value(self) -> float:
        """Σρ of the ρ-costs as a float (correctly rounded exact sum)."""
        return _unfix(self.rho)

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
        S(α) ≤ α·ρ' at every checked order (finite grid orders and α*)."""
        if self.zcdp_only:
            return self.rho_value
        s = self.spent_curve()[_FINITE] / _FINITE_ORDERS
        return float(max(np.max(s), self.spent_at(budget) / budget.alpha_star))

    # -- storage -----------------------------------------------------------------------

    def to_row(self) -> tuple[int, int, str, str | None]:
        """``(charges, kinds, rho_text, curve_text)`` for storage (hex fixed point, exact)."""
        curve = None if self.curve is None else ",".join(_fix_text(v) for v in self.curve)
        return self.charges, self.kinds, _fix_text(self.rho), curve

    @classmethod
    def from_row(cls, charges: int, kinds: int, rho: str, curve: str | None) -> "Totals":
        """Inverse of :meth:`to_row`."""
        c = None if curve is None else tuple(_fix_parse(s) for s in curve.split(","))
        if c is not None and len(c) != len(ORDERS):
            raise ValueError("stored curve totals do not match accounting.ORDERS")
        r = _fix_parse(rho)
        if r is None:
            raise ValueError("stored rho total is infinite")
        return cls(int(charges), int(kinds), r, c)


@dataclass(frozen=True)
class Decision:
    """The filter's answer for one scope.

    Attributes:
        ok: True if the request fits.
        rule: ``"zcdp"`` (zCDP filter on ρ) or ``"renyi"`` (Rényi filter on curves).
        binding_order: for a refusal by the Rényi filter, the order α where the
            spent curve plus the request most exceeds B(α) (relative); else None.
    """

    ok: bool
    rule: str
    binding_order: float | None = None


def filter_decision(spent: Totals, request: Cost, budget: BudgetCurve, after: Totals | None = None) -> Decision:
    """Decide whether ``request`` fits one scope's budget (zCDP filter or Rényi filter).

    zCDP filter (history and request all ρ-costs): admit iff
    Σρ + ρ_req ≤ ρ_B·(1 + TOLERANCE) — the Rényi filter at every α > 1 at once
    (Feldman & Zrnic 2021, §3; the zCDP filter of Whitehouse et al. 2023).
    Rényi filter (otherwise): admit iff S(α) + R(α) ≤ α·ρ_B·(1 + TOLERANCE) at every
    finite order of ``ORDERS`` and at α* (RDP curves bounded there by
    :meth:`BudgetCurve.star_bound`) — Feldman & Zrnic 2021, §3 (Rényi filter);
    Whitehouse et al. 2023 (fully adaptive composition).
    B(∞) = ∞, so the pure-ε order never binds.

    Args:
        spent: the scope's totals before the request.
        request: the requested cost (validated by :func:`validate_cost`).
        budget: the scope's budget curve.
        after: ``spent.add(request)`` if the caller has it already (saves work).

    Returns:
        A :class:`Decision`.
    """
    slack = 1.0 + TOLERANCE
    if spent.zcdp_only and request.is_zcdp:
        total = _unfix(spent.rho + _fix(request.rho))  # type: ignore[operator]
        return Decision(total <= budget.rho * slack, "zcdp")
    if after is None:
        after = spent.add(request)
    s = after.spent_curve()[_FINITE]
    lim = _FINITE_ORDERS * budget.rho * slack
    over = s > lim
    star_s = after.spent_at(budget)
    star_lim = budget.alpha_star * budget.rho * slack
    if not over.any() and star_s <= star_lim:
        return Decision(True, "renyi")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(lim > 0, s / lim, np.where(s > 0, math.inf, 0.0))
    star_ratio = star_s / star_lim if star_lim > 0 else (math.inf if star_s > 0 else 0.0)
    i = int(np.argmax(ratio))
    order = budget.alpha_star if star_ratio > ratio[i] else float(_FINITE_ORDERS[i])
    return Decision(False, "renyi", order)


# --------------------------------------------------------------------------------------
# result types
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChargeReceipt:
    """What :meth:`Ledger.charge` returns.

    Attributes:
        charge_id: ``chg_`` + 24 hex characters.
        population, consumer: who was charged.
        cost: the charged :class:`~dpgate.accounting.Cost` (this charge alone).
        rho: the cost's ρ, or for an RDP curve the smallest ρ' with
            curve(α) ≤ α·ρ' at every finite grid order (``Cost.rho_bound``).
        epsilon_at_delta: this charge alone as ε at the cap's δ
            (``accounting.cost_epsilon``; never to be summed across charges).
        created_at: ISO-8601 UTC timestamp of the entry.
        duplicate: True if ``release_key`` had already been charged and this is
            the stored receipt (nothing new was charged).
        delta: the cap's δ at which ``epsilon_at_delta`` is stated.
        release_key: the single-flight key given with the charge, or None.
        seq: the entry's position in the ledger's hash chain.
    """

    charge_id: str
    population: str
    consumer: str
    cost: Cost
    rho: float
    epsilon_at_delta: float
    created_at: str
    duplicate: bool = False
    delta: float | None = None
    release_key: str | None = None
    seq: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (``cost`` via ``Cost.to_dict``; ∞ as ``"inf"``)."""
        return {
            "charge_id": self.charge_id,
            "population": self.population,
            "consumer": self.consumer,
            "cost": self.cost.to_dict(),
            "rho": _json_float(self.rho),
            "epsilon_at_delta": _json_float(self.epsilon_at_delta),
            "delta": self.delta,
            "created_at": self.created_at,
            "duplicate": self.duplicate,
            "release_key": self.release_key,
            "seq": self.seq,
        }


@dataclass(frozen=True)
class ConsumerSpend:
    """One consumer's part of a :class:`SpendReport` (ρ totals, ε at the cap's δ).

    Attributes:
        name: consumer name.
        share: its allocation share (None for a consumer of an open population,
            or one whose allocation was since removed: 0 then).
        cap_rho: share × ρ_cap.
        spent_rho, spent_epsilon: its spend (ρ units as in :class:`SpendReport`).
        remaining_rho, remaining_epsilon: the largest zCDP charge it can still
            make (bounded by its own and the population's remaining ρ; ≥ 0), and
            that charge's ε alone.
        charges: number of its charges.
    """

    name: str
    share: float | None
    cap_rho: float
    spent_rho: float
    spent_epsilon: float
    remaining_rho: float
    remaining_epsilon: float
    charges: int

    def to_dict(self) -> dict[str, Any]:
        """``{share, cap_rho, spent_rho, spent_epsilon, remaining_rho, remaining_epsilon, charges}``."""
        return {
            "share": self.share,
            "cap_rho": self.cap_rho,
            "spent_rho": _json_float(self.spent_rho),
            "spent_epsilon": _json_float(self.spent_epsilon),
            "remaining_rho": self.remaining_rho,
            "remaining_epsilon": _json_float(self.remaining_epsilon),
            "charges": self.charges,
        }


@dataclass(frozen=True)
class SpendReport:
    """Spent and remaining budget of one population (and each consumer).

    Attributes:
        population: the population.
        epsilon, delta, rho_cap: the current cap ((ε, δ) and its ρ; totals).
        spent_rho: ρ spent (Σρ for ρ-only histories; for histories with RDP
            curves the smallest ρ' with S(α) ≤ α·ρ' at every checked order).
        spent_epsilon: ε of everything composed, at the cap's δ, by the tightest
            valid conversion (``conversion`` names it).
        remaining_rho: ρ_cap − spent_rho, clamped at 0: the largest zCDP charge
            that still fits the population.
        remaining_epsilon: the ε (at δ) of one zCDP charge of ``remaining_rho``
            (ε is not additive: spent + remaining ε ≠ cap ε in general).
        charges: number of charges.
        conversion: ``"none"`` (nothing spent), ``"zcdp"`` ([CKS20]), ``"gaussian"``
            (exact Gaussian DP, [BW18]) or ``"rdp"`` ([BBG+20] Thm. 21).
        consumers: consumer name → :class:`ConsumerSpend` (allocated consumers and
            any that charged).
        allocations: the current allocations (empty: open population).
    """

    population: str
    epsilon: float
    delta: float
    rho_cap: float
    spent_rho: float
    spent_epsilon: float
    remaining_rho: float
    remaining_epsilon: float
    charges: int
    conversion: str
    consumers: Mapping[str, ConsumerSpend] = field(default_factory=dict)
    allocations: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{population, cap {epsilon, delta, rho}, spent {rho, epsilon}, remaining {rho,
        epsilon}, charges, conversion, consumers {name: {...}}}``."""
        return {
            "population": self.population,
            "cap": {"epsilon": self.epsilon, "delta": self.delta, "rho": self.rho_cap},
            "spent": {"rho": _json_float(self.spent_rho), "epsilon": _json_float(self.spent_epsilon)},
            "remaining": {"rho": self.remaining_rho, "epsilon": _json_float(self.remaining_epsilon)},
            "charges": self.charges,
            "conversion": self.conversion,
            "consumers": {k: v.to_dict() for k, v in self.consumers.items()},
        }


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`Ledger.verify`.

    Attributes:
        ok: True if no problem was found.
        problems: one sentence per problem (empty if ok).
        entries: number of entries in the hash chain (charges + events).
        head: hash of the last entry (:data:`GENESIS_HASH` if empty) — record it
            elsewhere to detect a rewrite of the whole chain later.
        charges, events: how many of each.
    """

    ok: bool
    problems: list[str]
    entries: int
    head: str
    charges: int = 0
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``{ok, problems, entries, head, charges, events}``."""
        return {"ok": self.ok, "problems": list(self.problems), "entries": self.entries,
                "head": self.head, "charges": self.charges, "events": self.events}


# --------------------------------------------------------------------------------------
# reports and refusals (pure)
# --------------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _cost_eps(cost: Cost, delta: float) -> float:
    return accounting.cost_epsilon(cost, delta)


def charge_epsilon(cost: Cost, delta: float) -> float:
    """ε at δ of one charge alone (``accounting.cost_epsilon``, memoised)."""
    return _cost_eps(cost, delta)


def _spent_epsilon(totals: Totals, budget: BudgetCurve, delta: float) -> tuple[float, str]:
    cost = totals.spent_cost()
    if cost is None:
        return 0.0, "none"
    eps = accounting.cost_epsilon(cost, delta)
    if cost.kind == "rdp":
        at_star = totals.spent_at(budget)
        if math.isfinite(at_star) and at_star > 0:
            eps = min(eps, accounting.rdp_epsilon_tight([at_star], delta, orders=[budget.alpha_star]))
        return eps, "rdp"
    return eps, cost.kind


def _rho_epsilon(rho: float, delta: float) -> float:
    return accounting.zcdp_epsilon_tight(rho, delta) if rho > 0 else 0.0


def build_spend_report(
    population: str,
    cap: CapSpec,
    allocations: Mapping[str, float],
    population_totals: Totals,
    consumer_totals: Mapping[str, Totals],
) -> SpendReport:
    """Build a :class:`SpendReport` from a population's cap, allocations and totals (pure).

    Args:
        population: name.
        cap: the current cap.
        allocations: the current allocations (empty: open population).
        population_totals: the population's totals.
        consumer_totals: consumer → totals (consumers that charged).

    Returns:
        The report (ε at ``cap.delta``; remaining never negative).
    """
    pb = BudgetCurve(cap.rho_cap, cap.alpha_star)
    p_spent = population_totals.rho_equivalent(pb)
    p_eps, conversion = _spent_epsilon(population_totals, pb, cap.delta)
    p_rem = max(0.0, cap.rho_cap - p_spent)
    consumers: dict[str, ConsumerSpend] = {}
    names = list(allocations) + sorted(n for n in consumer_totals if n not in allocations)
    for name in names:
        t = consumer_totals.get(name, Totals())
        if allocations:
            share: float | None = allocations.get(name, 0.0)
            c_rho = share * cap.rho_cap  # type: ignore[operator]
        else:
            share, c_rho = None, cap.rho_cap
        cb = BudgetCurve(c_rho, cap.alpha_star)
        spent = t.rho_equivalent(cb)
        eps, _ = _spent_epsilon(t, cb, cap.delta)
        rem = max(0.0, min(c_rho - spent, p_rem))
        consumers[name] = ConsumerSpend(name, share, c_rho, spent, eps, rem,
                                        _rho_epsilon(rem, cap.delta), t.charges)
    return SpendReport(population, cap.epsilon, cap.delta, cap.rho_cap, p_spent, p_eps, p_rem,
                       _rho_epsilon(p_rem, cap.delta), population_totals.charges, conversion,
                       consumers, dict(allocations))


def exhausted_error(
    population: str,
    consumer: str,
    scope: str,
    request: Cost,
    spent: Totals,
    budget: BudgetCurve,
    cap_epsilon: float | None,
    delta: float,
    decision: Decision,
) -> BudgetExhausted:
    """The :class:`~dpgate.errors.BudgetExhausted` for a refused charge (pure).

    ``details``: population, consumer, scope ("population" or "consumer"), delta,
    rule, binding_order, and requested / spent / cap / remaining, each
    ``{rho, epsilon}`` with ε at the cap's δ (requested: the charge alone;
    remaining: one zCDP charge of the remaining ρ; cap: the published ε for a
    population, the ε of share × ρ_cap for a consumer).
    """
    req_rho = request.rho_bound()
    req_eps = charge_epsilon(request, delta)
    spent_rho = spent.rho_equivalent(budget)
    spent_eps, _ = _spent_epsilon(spent, budget, delta)
    rem = max(0.0, budget.rho - spent_rho)
    cap_eps = cap_epsilon if cap_epsilon is not None else _rho_epsilon(budget.rho, delta)
    who = f"consumer {consumer!r} of population {population!r}" if scope == "consumer" \
        else f"population {population!r}"
    message = (
        f"privacy budget exhausted for {who}: the charge needs rho={req_rho:.6g} "
        f"(epsilon={req_eps:.4g} alone at delta={delta:g}) but only rho={rem:.6g} remains "
        f"(epsilon={_rho_epsilon(rem, delta):.4g}); nothing was charged"
    )
    details = {
        "population": population,
        "consumer": consumer,
        "scope": scope,
        "delta": delta,
        "rule": decision.rule,
        "binding_order": decision.binding_order,
        "requested": {"rho": _json_float(req_rho), "epsilon": _json_float(req_eps)},
        "spent": {"rho": _json_float(spent_rho), "epsilon": _json_float(spent_eps)},
        "cap": {"rho": budget.rho, "epsilon": _json_float(cap_eps)},
        "remaining": {"rho": rem, "epsilon": _json_float(_rho_epsilon(rem, delta))},
    }
    return BudgetExhausted(message, details)


# --------------------------------------------------------------------------------------
# replay (verification)
# --------------------------------------------------------------------------------------


@dataclass
class _PopState:
    cap: CapSpec
    allocations: dict[str, float]


class Replay:
    """Recompute a ledger's state from its entries, in chain order, and report problems.

    Feed every chain entry (charge and event dicts as stored, each with
    ``type``, ``seq``, ``prev_hash`` and ``hash``) in ``seq`` order to
    :meth:`feed`; then compare :attr:`populations` and :attr:`totals` with the
    backend's stored state. Checks: consecutive ``seq`` from 1; each
    ``prev_hash`` is the previous entry's hash; each hash recomputes; events
    are well-formed; every charge names a population that existed, a consumer
    it allocated, a valid cost matching its ``kind``/``rho`` columns, and fitted
    both filters when it was written.

    Attributes:
        problems: sentences describing what is wrong.
        populations: name → {"cap": CapSpec, "allocations": dict}.
        totals: (population, consumer or "") → :class:`Totals`.
        head: hash of the last entry fed.
        count, charges, events: entries fed.
    """

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._pops: dict[str, _PopState] = {}
        self.totals: dict[tuple[str, str], Totals] = {}
        self.head = GENESIS_HASH
        self.count = 0
        self.charges = 0
        self.events = 0
        self.release_keys: set[tuple[str, str]] = set()

    @property
    def populations(self) -> dict[str, dict[str, Any]]:
        """name → ``{"cap": CapSpec, "allocations": dict}`` as replayed."""
        return {n: {"cap": s.cap, "allocations": dict(s.allocations)} for n, s in self._pops.items()}

    def feed(self, entry: Mapping[str, Any]) -> None:
        """Check and apply one entry (see the class docstring)."""
        self.count += 1
        seq = entry.get("seq")
        where = f"entry seq={seq}"
        if seq != self.count:
            self.problems.append(f"{where}: expected seq {self.count} (entries missing or reordered)")
        if entry.get("prev_hash") != self.head:
            self.problems.append(f"{where}: prev_hash does not match the previous entry's hash "
                                 "(an entry was removed, inserted or edited)")
        if entry_hash(entry) != entry.get("hash"):
            self.problems.append(f"{where}: hash mismatch (the entry was edited)")
        self.head = str(entry.get("hash"))
        try:
            if entry.get("type") == "event":
                self.events += 1
                self._event(entry, where)
            elif entry.get("type") == "charge":
                self.charges += 1
                self._charge(entry, where)
            else:
                self.problems.append(f"{where}: unknown entry type {entry.get('type')!r}")
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            self.problems.append(f"{where}: malformed entry ({exc})")

    def _event(self, e: Mapping[str, Any], where: str) -> None:
        pop = e["population"]
        new = json.loads(e["new"])
        kind = e["kind"]
        if kind == "population_created":
            if pop in self._pops:
                self.problems.append(f"{where}: population {pop!r} created twice")
            self._pops[pop] = _PopState(CapSpec.from_dict(new["cap"]), dict(new["allocations"]))
            return
        state = self._pops.get(pop)
        if state is None:
            self.problems.append(f"{where}: event for unknown population {pop!r}")
            return
        old = json.loads(e["old"]) if e.get("old") else None
        if kind == "cap_changed":
            if old is not None and CapSpec.from_dict(old) != state.cap:
                self.problems.append(f"{where}: the event's old cap is not the cap in force")
            state.cap = CapSpec.from_dict(new)
        elif kind == "allocations_changed":
            if old is not None and dict(old["allocations"]) != state.allocations:
                self.problems.append(f"{where}: the event's old allocations are not those in force")
            state.allocations = dict(new["allocations"])
        else:
            self.problems.append(f"{where}: unknown event kind {kind!r}")

    def _charge(self, c: Mapping[str, Any], where: str) -> None:
        pop, consumer = c["population"], c["consumer"]
        cost = Cost.from_dict(json.loads(c["cost"]))
        if cost.kind != c["kind"]:
            self.problems.append(f"{where}: kind column {c['kind']!r} differs from the cost's {cost.kind!r}")
        if cost.rho_bound() != c["rho"]:
            self.problems.append(f"{where}: rho column {c['rho']!r} differs from the cost's {cost.rho_bound()!r}")
        state = self._pops.get(pop)
        if state is None:
            self.problems.append(f"{where}: charge for unknown population {pop!r}")
            return
        if c.get("release_key") is not None:
            key = (pop, c["release_key"])
            if key in self.release_keys:
                self.problems.append(f"{where}: release_key charged twice")
            self.release_keys.add(key)
        if state.allocations and consumer not in state.allocations:
            self.problems.append(f"{where}: charge for consumer {consumer!r} without an allocation")
            share = 0.0
        else:
            share = state.allocations.get(consumer, 1.0) if state.allocations else 1.0
        pt = self.totals.get((pop, ""), Totals())
        ct = self.totals.get((pop, consumer), Totals())
        cap = state.cap
        try:
            validate_cost(cost)
        except DpgateError as exc:
            self.problems.append(f"{where}: invalid cost ({exc.message})")
        else:
            if not filter_decision(pt, cost, BudgetCurve(cap.rho_cap, cap.alpha_star)).ok:
                self.problems.append(f"{where}: charge exceeded population {pop!r}'s budget when written")
            if not filter_decision(ct, cost, BudgetCurve(share * cap.rho_cap, cap.alpha_star)).ok:
                self.problems.append(f"{where}: charge exceeded consumer {consumer!r}'s budget when written")
        self.totals[(pop, "")] = pt.add(cost)
        self.totals[(pop, consumer)] = ct.add(cost)


def iter_sorted_entries(*streams: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """Merge entry streams (each ascending by ``seq``) into one ascending stream."""
    import heapq

    return heapq.merge(*streams, key=lambda e: e["seq"])


# --------------------------------------------------------------------------------------
# stored entries and the steps every SQL backend shares
# --------------------------------------------------------------------------------------

#: Columns of a stored charge, in storage order (every SQL backend uses these names).
CHARGE_COLUMNS: tuple[str, ...] = (
    "seq", "charge_id", "population", "consumer", "kind", "rho", "epsilon_at_delta", "delta",
    "cost", "purpose", "release_key", "metadata", "created_at", "prev_hash", "hash",
)  # fmt: skip

#: Columns of a stored governance event, in storage order.
EVENT_COLUMNS: tuple[str, ...] = (
    "seq", "event_id", "population", "kind", "actor", "reason", "old", "new", "created_at",
    "prev_hash", "hash",
)  # fmt: skip

#: Columns of a stored population (the cap and allocations in force), in storage order.
POPULATION_COLUMNS: tuple[str, ...] = ("epsilon", "delta", "rho_cap", "alpha_star", "rho_stated", "allocations")


def validate_text(value: Any, what: str, *, optional: bool = False, limit: int = 10_000) -> str | None:
    """Check a free-text field (purpose, release key, actor, reason).

    Args:
        value: the text.
        what: its name, for the error.
        optional: None is allowed (and returned).
        limit: maximum length in characters.

    Returns:
        ``value`` unchanged (None if optional and None).

    Raises:
        InvalidRequest: not a string, blank, longer than ``limit``, containing a NUL
            character (which PostgreSQL text cannot store) or not encodable as UTF-8
            (a lone surrogate: the hash chain hashes UTF-8).
    """
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value \
            or not _utf8(value):
        raise InvalidRequest(f"{what} must be a non-empty string of at most {limit} characters "
                             "(UTF-8, without NUL characters)", {what: repr(value)[:200]})
    return value


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_limit(limit: Any) -> int | None:
    """Check an ``entries(limit=…)`` argument: None or a positive integer. Raises InvalidRequest."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidRequest(f"limit must be a positive integer, got {limit!r}", {})
    return limit


def validate_governance(actor: Any, reason: Any) -> None:
    """Check the actor and reason of a cap change (non-empty; ≤ 200 and ≤ 2000 characters).

    Raises:
        InvalidRequest: either is blank, too long or not a string.
    """
    validate_text(actor, "actor", limit=200)
    validate_text(reason, "reason", limit=2000)


def validate_population(
    name: Any,
    epsilon: float | None,
    delta: float,
    allocations: Mapping[str, float] | Iterable[tuple[str, float]] | None,
    actor: Any,
    reason: Any,
    rho_cap: float | None,
) -> tuple[CapSpec, dict[str, float]]:
    """Validate the arguments of :meth:`Ledger.ensure_population` (policy input).

    Returns:
        ``(cap, allocations)``: the cap fixed into its budget curve and the allocations as a
        sorted dict.

    Raises:
        PolicyError: invalid name, cap, allocations, actor or reason.
    """
    validate_name(name, "population", PolicyError)
    cap = validate_cap(epsilon, delta, rho_cap=rho_cap, error=PolicyError)
    allocs = validate_allocations(allocations, PolicyError)
    if not isinstance(actor, str) or not actor.strip() or not isinstance(reason, str) or not reason.strip():
        raise PolicyError("actor and reason must be non-empty strings", {})
    return cap, allocs


def unknown_population(name: str) -> UnknownPopulation:
    """The :class:`~dpgate.errors.UnknownPopulation` error for ``name``."""
    return UnknownPopulation(f"no population {name!r} in the ledger", {"population": name})


def allocation_share(population: str, consumer: str, allocations: Mapping[str, float]) -> float:
    """The share of the population's budget that ``consumer`` may spend.

    Returns:
        Its allocation share, or 1.0 for any consumer of an open population (no allocations).

    Raises:
        UnknownConsumer: the population allocates nothing to ``consumer``.
    """
    if not allocations:
        return 1.0
    try:
        return allocations[consumer]
    except KeyError:
        raise UnknownConsumer(
            f"population {population!r} has no allocation for consumer {consumer!r}",
            {"population": population, "consumer": consumer},
        ) from None


@lru_cache(maxsize=1024)
def _cost_json_rho(cost: Cost) -> tuple[str, float]:
    """The stored (canonical JSON, ρ or ρ-bound) of a cost (memoised: costs repeat)."""
    return canonical_json(cost.to_dict()), cost.rho_bound()


@lru_cache(maxsize=256)
def _parse_allocations(text: str) -> tuple[tuple[str, float], ...]:
    return tuple(json.loads(text).items())


def population_from_row(row: Iterable[Any]) -> tuple[CapSpec, dict[str, float]]:
    """``(cap, allocations)`` from a stored population row in :data:`POPULATION_COLUMNS` order."""
    epsilon, delta, rho_cap, alpha_star, rho_stated, allocations = row
    return CapSpec(epsilon, delta, rho_cap, alpha_star, bool(rho_stated)), dict(_parse_allocations(allocations))


@dataclass(frozen=True)
class ChargeRequest:
    """A validated charge, ready to be checked and stored (see :func:`prepare_charge`).

    Attributes:
        population, consumer: who pays.
        cost: the validated cost.
        purpose: the stored description.
        release_key: the single-flight key or None.
        metadata_json: the metadata's canonical JSON text (sorted keys, no NaN/∞).
        cost_json: the cost's canonical JSON text (``Cost.to_dict``).
        rho: the cost's ρ (or ρ-bound of an RDP curve), stored in the ``rho`` column.
    """

    population: str
    consumer: str
    cost: Cost
    purpose: str
    release_key: str | None
    metadata_json: str
    cost_json: str
    rho: float


def prepare_charge(
    population: Any,
    consumer: Any,
    cost: Any,
    *,
    purpose: Any,
    release_key: Any = None,
    metadata: Any = None,
) -> ChargeRequest:
    """Validate the arguments of :meth:`Ledger.charge` before any store access.

    Raises:
        InvalidRequest: bad population or consumer name, purpose (non-empty, ≤ 10000
            characters), release_key (non-empty, ≤ 512), or metadata (not a mapping,
            not JSON-serialisable, NaN or ∞).
        InvalidBudget: invalid cost (:func:`validate_cost`).
    """
    validate_name(population, "population")
    validate_name(consumer, "consumer")
    cost = validate_cost(cost)
    validate_text(purpose, "purpose")
    validate_text(release_key, "release_key", optional=True, limit=512)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise InvalidRequest("metadata must be a mapping", {})
    try:  # the canonical serialisation, refusing NaN and infinity
        meta_json = json.dumps(dict(metadata or {}), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"metadata must be JSON-serialisable without NaN or infinity: {exc}",
                             {}) from None
    if not _utf8(meta_json):
        raise InvalidRequest("metadata must be valid Unicode (no lone surrogates)", {})
    cost_json, rho = _cost_json_rho(cost)
    return ChargeRequest(population, consumer, cost, purpose, release_key, meta_json, cost_json, rho)


@dataclass(frozen=True)
class Refusal:
    """A charge refused by one scope's filter; :meth:`error` builds the BudgetExhausted.

    Built inside the store's write transaction, raised after it (the ε conversions
    of the error details need not hold the lock).
    """

    population: str
    consumer: str
    scope: str
    request: Cost
    spent: Totals
    budget: BudgetCurve
    cap_epsilon: float | None
    delta: float
    decision: Decision

    def error(self) -> BudgetExhausted:
        """The :class:`~dpgate.errors.BudgetExhausted` to raise (see :func:`exhausted_error`)."""
        return exhausted_error(self.population, self.consumer, self.scope, self.request, self.spent,
                               self.budget, self.cap_epsilon, self.delta, self.decision)


def check_charge(
    request: ChargeRequest,
    cap: CapSpec,
    share: float,
    population_totals: Totals,
    consumer_totals: Totals,
) -> tuple[Totals, Totals, Refusal | None]:
    """Run the consumer's filter, then the population's (:func:`filter_decision`).

    The consumer's budget curve is share × B(α), the population's B(α) = α·ρ_cap
    (both with the population's α*); a charge must pass both.

    Returns:
        ``(population_totals_after, consumer_totals_after, refusal)``: the totals with
        the charge added, and None if it fits or the first scope that refuses.
    """
    cost = request.cost
    pt_after, ct_after = population_totals.add(cost), consumer_totals.add(cost)
    cb = BudgetCurve(share * cap.rho_cap, cap.alpha_star)
    dc = filter_decision(consumer_totals, cost, cb, ct_after)
    if not dc.ok:
        return pt_after, ct_after, Refusal(request.population, request.consumer, "consumer", cost,
                                           consumer_totals, cb, None, cap.delta, dc)
    pb = BudgetCurve(cap.rho_cap, cap.alpha_star)
    dp = filter_decision(population_totals, cost, pb, pt_after)
    if not dp.ok:
        return pt_after, ct_after, Refusal(request.population, request.consumer, "population", cost,
                                           population_totals, pb, cap.epsilon, cap.delta, dp)
    return pt_after, ct_after, None


def new_charge_entry(
    request: ChargeRequest,
    *,
    seq: int,
    prev_hash: str,
    epsilon_at_delta: float,
    delta: float,
) -> dict[str, Any]:
    """A new charge entry (a dict with :data:`CHARGE_COLUMNS`, ``type`` and its ``hash``).

    Args:
        request: the validated charge.
        seq: its position in the hash chain (the head's ``seq`` + 1).
        prev_hash: the head's hash (:data:`GENESIS_HASH` for the first entry).
        epsilon_at_delta: the charge alone as ε at the cap's δ.
        delta: the cap's δ.
    """
    entry: dict[str, Any] = {
        "type": "charge",
        "seq": seq,
        "charge_id": "chg_" + secrets.token_hex(12),
        "population": request.population,
        "consumer": request.consumer,
        "kind": request.cost.kind,
        "rho": request.rho,
        "epsilon_at_delta": epsilon_at_delta,
        "delta": delta,
        "cost": request.cost_json,
        "purpose": request.purpose,
        "release_key": request.release_key,
        "metadata": request.metadata_json,
        "created_at": utc_now(),
        "prev_hash": prev_hash,
    }
    entry["hash"] = entry_hash(entry)
    return entry


def new_event_entry(
    population: str,
    kind: str,
    actor: str,
    reason: str,
    old: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    *,
    seq: int,
    prev_hash: str,
) -> dict[str, Any]:
    """A new governance event entry (a dict with :data:`EVENT_COLUMNS`, ``type`` and its ``hash``).

    Args:
        population: the population concerned.
        kind: ``population_created``, ``cap_changed`` or ``allocations_changed``.
        actor, reason: who and why.
        old, new: the values before (None on creation) and after, stored as canonical JSON.
        seq, prev_hash: the chain position and the head's hash.
    """
    entry: dict[str, Any] = {
        "type": "event",
        "seq": seq,
        "event_id": "evt_" + secrets.token_hex(12),
        "population": population,
        "kind": kind,
        "actor": actor,
        "reason": reason,
        "old": None if old is None else canonical_json(old),
        "new": canonical_json(new),
        "created_at": utc_now(),
        "prev_hash": prev_hash,
    }
    entry["hash"] = entry_hash(entry)
    return entry


def charge_entry(row: Iterable[Any]) -> dict[str, Any]:
    """A stored charge row (:data:`CHARGE_COLUMNS` order) as a chain entry dict (``type`` "charge")."""
    d = dict(zip(CHARGE_COLUMNS, row))
    d["type"] = "charge"
    return d


def event_entry(row: Iterable[Any]) -> dict[str, Any]:
    """A stored event row (:data:`EVENT_COLUMNS` order) as a chain entry dict (``type`` "event")."""
    d = dict(zip(EVENT_COLUMNS, row))
    d["type"] = "event"
    return d


def display_charge(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A charge entry for :meth:`Ledger.entries`: ``cost`` and ``metadata`` parsed, ∞ as ``"inf"``."""
    d = dict(entry)
    d["cost"] = json.loads(d["cost"])
    d["metadata"] = json.loads(d["metadata"])
    if math.isinf(d["epsilon_at_delta"]):
        d["epsilon_at_delta"] = "inf"
    return d


def display_event(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An event entry for :meth:`Ledger.events`: ``old`` and ``new`` parsed."""
    d = dict(entry)
    d["old"] = json.loads(d["old"]) if d["old"] is not None else None
    d["new"] = json.loads(d["new"])
    return d


def receipt_from_entry(entry: Mapping[str, Any], *, duplicate: bool, cost: Cost | None = None) -> ChargeReceipt:
    """The :class:`ChargeReceipt` of a stored (or just written) charge entry."""
    return ChargeReceipt(
        charge_id=entry["charge_id"],
        population=entry["population"],
        consumer=entry["consumer"],
        cost=cost if cost is not None else Cost.from_dict(json.loads(entry["cost"])),
        rho=entry["rho"],
        epsilon_at_delta=entry["epsilon_at_delta"],
        created_at=entry["created_at"],
        duplicate=duplicate,
        delta=entry["delta"],
        release_key=entry["release_key"],
        seq=entry["seq"],
    )


def cap_change_result(
    population: str,
    old: CapSpec,
    new: CapSpec,
    event: Mapping[str, Any] | None,
    actor: str,
    reason: str,
) -> dict[str, Any]:
    """The return value of :meth:`Ledger.set_cap` (``event`` None: the cap was unchanged)."""
    if event is None:
        return {"population": population, "changed": False, "old": old.to_dict(), "new": old.to_dict(),
                "event_id": None, "actor": actor, "reason": reason, "created_at": None}
    return {"population": population, "changed": True, "old": old.to_dict(), "new": new.to_dict(),
            "event_id": event["event_id"], "actor": actor, "reason": reason,
            "created_at": event["created_at"]}


def stored_state_problems(
    replay: Replay,
    *,
    head: tuple[int, str] | None,
    populations: Mapping[str, Iterable[Any]],
    totals: Mapping[tuple[str, str], Iterable[Any]],
    triggers: Iterable[str],
    required_triggers: Iterable[str],
    versions: Iterable[int],
    required_versions: Iterable[int],
) -> list[str]:
    """Compare a backend's stored derived state with a :class:`Replay` of its entries.

    Args:
        replay: the replay of every entry (fed already).
        head: the stored chain head ``(seq, hash)``, or None if missing.
        populations: name → stored row in :data:`POPULATION_COLUMNS` order.
        totals: (population, consumer or "") → stored ``Totals.to_row()`` tuple.
        triggers: names of the append-only triggers present (and enabled).
        required_triggers: the names that must be present.
        versions: the schema migration versions recorded.
        required_versions: the versions this dpgate applies.

    Returns:
        The replay's problems followed by one sentence per difference (empty: consistent).
    """
    problems = list(replay.problems)
    if head is None:
        problems.append("the chain head row is missing")
    elif (head[0], head[1]) != (replay.count, replay.head):
        problems.append(
            f"the chain head (seq {head[0]}, {head[1][:12]}…) does not match the last entry "
            f"(seq {replay.count}, {replay.head[:12]}…): entries were removed or added"
        )
    present = set(triggers)
    for name in required_triggers:
        if name not in present:
            problems.append(f"append-only trigger {name!r} is missing")
    recorded = set(versions)
    for version in required_versions:
        if version not in recorded:
            problems.append(f"schema migration {version} is not recorded")
    replayed = replay.populations
    for name in sorted(set(populations) | set(replayed)):
        if name not in replayed:
            problems.append(f"population {name!r} has no population_created event")
            continue
        if name not in populations:
            problems.append(f"population {name!r} was created by an event but is missing")
            continue
        row = tuple(populations[name])
        cap = CapSpec(row[0], row[1], row[2], row[3], bool(row[4]))
        if cap != replayed[name]["cap"]:
            problems.append(f"population {name!r}: the cap in force differs from its events")
        try:
            allocs = dict(json.loads(row[5]))
        except (ValueError, TypeError):
            allocs = None
        if allocs != replayed[name]["allocations"]:
            problems.append(f"population {name!r}: the allocations in force differ from its events")
    for key in sorted(set(totals) | set(replay.totals)):
        label = f"population {key[0]!r}" + (f" consumer {key[1]!r}" if key[1] else "")
        want = replay.totals.get(key)
        got = totals.get(key)
        if want is None or got is None or tuple(got) != want.to_row():
            problems.append(f"{label}: the stored spend totals differ from the sum of its entries")
    return problems


# --------------------------------------------------------------------------------------
# the protocol
# --------------------------------------------------------------------------------------


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
    ) -> None:
        """Create population ``name`` if absent; if its cap or allocations differ, record
        governance events (``cap_changed``, ``allocations_changed``), never edits.

        Args:
            name: population name.
            epsilon: cap ε > 0 (total), or None when ``rho_cap`` is given.
            delta: cap δ in (0, 1).
            allocations: consumer → share in [0, 1], summing to ≤ 1 (empty: any
                consumer may charge, held to the population's budget only).
            actor, reason: recorded with any event.
            rho_cap: the budget stated directly in ρ (instead of ε).

        Raises:
            PolicyError: invalid cap, allocations or name; nothing written.
            LedgerError: the store failed.
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
    ) -> dict[str, Any]:
        """Record a cap change (governance event). Lowering it below the spend is allowed:
        every later charge is refused.

        Returns:
            ``{population, changed, old, new, event_id, actor, reason, created_at}``
            with ``old``/``new`` as ``{epsilon, delta, rho_cap, alpha_star, rho_stated}``.

        Raises:
            InvalidBudget: invalid cap. InvalidRequest: empty actor or reason.
            UnknownPopulation: no such population. LedgerError: store failure.
        """
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

        Raises:
            InvalidBudget: invalid cost. InvalidRequest: bad purpose, key or metadata.
            UnknownPopulation, UnknownConsumer: not found.
            BudgetExhausted: the consumer's or the population's filter refuses.
            LedgerError: store failure.
        """
        ...

    def spend(self, population: str) -> SpendReport:
        """The population's spend report (read-only). Raises UnknownPopulation."""
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

