"""Conversions of ρ-zCDP and RDP curves to (ε, δ), the cap's ρ, and curve checks.

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx, log_ndtr

from dpgate.accounting.orders import CONVERSIONS, Conversion, ORDERS, _curve, _delta, _nonneg, _orders, _positive


# --------------------------------------------------------------------------------------


def _tv_within_delta(divergence: float, delta: float) -> bool:
    """True if KL <= ``divergence`` already gives (0, δ)-DP.

    D_α >= KL for α >= 1 ([vEH14] Thm. 3) and the Bretagnolle–Huber inequality
    TV <= √(1 − e^{−KL}) (Bretagnolle & Huber 1979) give (0, δ)-DP when
    1 − e^{−D_α} <= δ². dp-accounting's ``compute_epsilon`` applies the same rule.
    """
    return delta > 0 and -math.expm1(-divergence) <= delta * delta


def zcdp_epsilon_simple(rho: float, delta: float) -> float:
    """(ε, δ) of total ρ-zCDP by the simple conversion ε = ρ + 2√(ρ·ln(1/δ)).

    [BS16] Prop. 1.3.

    Args:
        rho: total (composed) ρ >= 0.
        delta: δ in [0, 1).

    Returns:
        ε >= 0; ``math.inf`` if δ = 0 and ρ > 0; 0 if ρ = 0.

    Raises:
        ValueError: NaN/negative/infinite ρ; δ outside [0, 1).
    """
    r = _nonneg("rho", rho)
    d = _delta(delta)
    if r == 0:
        return 0.0
    if d == 0:
        return math.inf
    return r + 2.0 * math.sqrt(r * -math.log(d))


def _cks_objective(x: float, rho: float, log_inv_delta: float) -> float:
    """[CKS20] Cor. 13 bound at α = 1 + x, written stably in x = α − 1 > 0."""
    # αρ + log(1 − 1/α) + (log(1/δ) − log α)/(α − 1), with log(1−1/α) = −log1p(1/x).
    return (1.0 + x) * rho - math.log1p(1.0 / x) + (log_inv_delta - math.log1p(x)) / x


def zcdp_epsilon_tight(rho: float, delta: float) -> float:
    """(ε, δ) of total ρ-zCDP by the tight conversion of [CKS20] Prop. 12 / Cor. 13.

    ρ-zCDP is (α, αρ)-RDP for all α > 1, hence (ε, δ)-DP with::

        ε = inf_{α>1}  αρ + ( log(1/δ) + (α−1)·log(1 − 1/α) − log α ) / (α − 1)

    (the same as [BBG+20] Thm. 21 applied to the curve αρ). The infimum is over
    continuous α. Writing x = α − 1 the objective is
    f(x) = (1+x)ρ − log(1+1/x) + (L − log(1+x))/x with L = log(1/δ), and
    f'(x) = ρ − (L − log(1+x))/x², so the minimiser is the unique root of the
    increasing function g(x) = ρx² + log(1+x) − L on (0, √(L/ρ)]; it is found
    by ``brentq`` to machine precision (robust for ρ from 1e-300 to 1e300,
    monotone in δ). The result is also capped by :func:`zcdp_epsilon_simple`
    (both are valid bounds) and clamped at 0; and it is 0 when
    1 − e^{−ρ} <= δ² (KL <= ρ and the Bretagnolle–Huber inequality give
    total variation <= δ, i.e. (0, δ)-DP).

    Args:
        rho: total (composed) ρ >= 0.
        delta: δ in [0, 1).

    Returns:
        ε >= 0; ``math.inf`` if δ = 0 and ρ > 0; 0 if ρ = 0.

    Raises:
        ValueError: NaN/negative/infinite ρ; δ outside [0, 1).
    """
    r = _nonneg("rho", rho)
    d = _delta(delta)
    if r == 0:
        return 0.0
    if d == 0:
        return math.inf
    if _tv_within_delta(r, d):  # KL <= ρ for ρ-zCDP
        return 0.0
    L = -math.log(d)
    simple = r + 2.0 * math.sqrt(r * L)
    x = _cks_argmin(r, L)
    if x is None:  # extreme ρ where the root cannot be bracketed: the simple bound
        return max(simple, 0.0)
    tight = _cks_objective(x, r, L)
    return max(0.0, min(tight, simple))


def _cks_argmin(rho: float, log_inv_delta: float) -> float | None:
    """x* = α* − 1 > 0 minimising the [CKS20] Cor. 13 objective: root of ρx² + log(1+x) = L."""
    r, L = rho, log_inv_delta

    def g(x: float) -> float:
        return r * x * x + math.log1p(x) - L

    hi = 2.0 * math.sqrt(L / r)  # g(hi) >= 3L > 0 (and the root lies below √(L/ρ))
    if L <= 0 or hi == 0.0 or not math.isfinite(hi) or g(hi) <= 0.0:
        return None
    x = brentq(g, 0.0, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps, maxiter=500)  # g(0) = −L < 0
    return x if x > 0.0 else hi


def zcdp_optimal_order(rho: float, delta: float) -> float:
    """The RDP order α* at which the [CKS20] Cor. 13 conversion of ρ-zCDP is tightest.

    α* = 1 + x* where x* is the unique positive root of ρx² + log(1 + x) = log(1/δ)
    (the stationarity condition of the objective in :func:`zcdp_epsilon_tight`),
    found by ``brentq``. Useful to fix one order for a zCDP/Rényi filter.

    Args:
        rho: total ρ > 0.
        delta: δ in (0, 1).

    Returns:
        α* > 1 (``math.inf`` only if ρ is so small that the root overflows).

    Raises:
        ValueError: ρ not > 0 or not finite; δ not in (0, 1).
    """
    r = _positive("rho", rho)
    d = _delta(delta)
    if d == 0:
        raise ValueError("delta must be > 0 (at δ = 0 no finite order converts ρ-zCDP)")
    x = _cks_argmin(r, -math.log(d))
    if x is None:
        return math.inf if r < 1.0 else 1.0 + 2.0 * math.sqrt(-math.log(d) / r)
    return 1.0 + x


def gaussian_epsilon_exact(rho: float, delta: float) -> float:
    """Exact (ε, δ) of a composition of continuous Gaussian mechanisms with total ρ.

    A composition of Gaussian mechanisms with total ρ is μ-Gaussian DP with
    μ = √(2ρ) ([DRS22] Cor. 3.3), and a Gaussian mechanism with Δ/σ = μ is
    (ε, δ)-DP exactly for ([BW18] Thm. 8; [DRS22] Cor. 2.13)::

        δ(ε) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2)

    δ(ε) is decreasing in ε; it is inverted with ``brentq`` in log-space
    (``scipy.special.log_ndtr``). Valid only for the *continuous* Gaussian
    (use :func:`zcdp_epsilon_tight` for discrete Gaussian releases).

    Args:
        rho: total (composed) ρ >= 0.
        delta: δ in [0, 1).

    Returns:
        ε >= 0 (0 when δ(0) <= δ already); ``math.inf`` if δ = 0 and ρ > 0.

    Raises:
        ValueError: NaN/negative/infinite ρ; δ outside [0, 1).
    """
    r = _nonneg("rho", rho)
    d = _delta(delta)
    if r == 0:
        return 0.0
    if d == 0:
        return math.inf
    mu = math.sqrt(2.0 * r)
    log_target = math.log(d)

    def log_delta(eps: float) -> float:
        mid = -eps / mu
        l1 = float(log_ndtr(mid + mu / 2.0))
        # diff = log(e^ε Φ(mid − μ/2) / Φ(mid + μ/2)) = ε − (log Φ(mid + μ/2) − log Φ(mid − μ/2))
        diff = eps - _log_ndtr_increment(mid, mu)
        if diff >= 0.0:  # rounding at the far tail: δ(ε) is 0 to working precision
            return -math.inf
        return l1 + math.log(-math.expm1(diff))

    if log_delta(0.0) <= log_target:
        return 0.0
    hi = zcdp_epsilon_tight(r, d) or 1e-300
    while log_delta(hi) > log_target:  # pragma: no cover - exact <= tight in theory
        hi *= 2.0
    eps = brentq(lambda e: log_delta(e) - log_target, 0.0, hi, xtol=1e-16 * hi, rtol=1e-14)
    # brentq's answer is within its tolerance of the root on either side; step up until
    # δ(ε) <= δ so the result is a valid (upper) bound, never more than `hi`.
    step = 1e-14 * eps + 1e-16 * hi
    while log_delta(eps) > log_target and eps < hi:
        eps = min(hi, eps + step)
        step *= 2.0
    return max(0.0, eps)


def _log_ndtr_increment(mid: float, width: float) -> float:
    """log Φ(mid + width/2) − log Φ(mid − width/2), accurate also when width is tiny.

    For width <= 0.1 it integrates d/dx log Φ(x) = φ(x)/Φ(x) = √(2/π) / erfcx(−x/√2)
    (no cancellation, no overflow) over the interval with 32-point
    Gauss–Legendre; the integrand is analytic on a scale ~1, so this is exact to
    rounding. Direct subtraction of two ``log_ndtr`` values would lose every
    digit for tiny μ.
    """
    if width > 0.1:
        return float(log_ndtr(mid + width / 2.0)) - float(log_ndtr(mid - width / 2.0))
    t, w = np.polynomial.legendre.leggauss(32)
    x = mid + 0.5 * width * t
    h = math.sqrt(2.0 / math.pi) / erfcx(-x / math.sqrt(2.0))
    return 0.5 * width * float(np.dot(w, h))


def _rdp_prepare(curve, delta, orders):
    a = _orders(orders)
    c = _curve(curve, a)
    d = _delta(delta)
    return a, c, d


def rdp_epsilon_basic(curve: Sequence[float], delta: float, orders: Sequence[float] = ORDERS) -> float:
    """(ε, δ) of a total RDP curve by [Mir17] Prop. 3: ε = min_α ε(α) + log(1/δ)/(α − 1).

    At α = ∞ the curve value is a pure-DP ε ([Mir17] Def. 3/Prop. 3 with
    D_∞) and is a candidate for every δ (also δ = 0).

    Args:
        curve: total (composed) ε(α) at ``orders``.
        delta: δ in [0, 1).
        orders: the curve's ascending orders α > 1 (default :data:`ORDERS`).

    Returns:
        ε >= 0 (``math.inf`` if no order gives a finite bound).

    Raises:
        ValueError: bad curve (length, NaN, negative), orders or δ.
    """
    a, c, d = _rdp_prepare(curve, delta, orders)
    fin = np.isfinite(a)
    best = float(np.min(c[~fin])) if (~fin).any() else math.inf
    if d > 0 and fin.any():
        with np.errstate(invalid="ignore", over="ignore"):
            cand = c[fin] + (-math.log(d)) / (a[fin] - 1.0)
        cand = cand[~np.isnan(cand)]
        if cand.size:
            best = min(best, float(np.min(cand)))
    if not (c > 0).any():
        return 0.0
    return max(0.0, best)


def rdp_epsilon_tight(curve: Sequence[float], delta: float, orders: Sequence[float] = ORDERS) -> float:
    """(ε, δ) of a total RDP curve by [BBG+20] Thm. 21 (= [CKS20] Prop. 12).

    ::

        ε = min_α  ε(α) + log((α−1)/α) − (log δ + log α)/(α − 1)

    over the grid's finite orders; at α = ∞ the curve value (pure ε) is a
    δ-independent candidate. Clamped at 0, and 0 when 1 − e^{−min ε(α)} <= δ²
    (Bretagnolle–Huber, as in dp-accounting). Never larger than
    :func:`rdp_epsilon_basic` at the same orders.

    Args:
        curve: total (composed) ε(α) at ``orders``.
        delta: δ in [0, 1).
        orders: the curve's ascending orders α > 1 (default :data:`ORDERS`).

    Returns:
        ε >= 0 (``math.inf`` if no order gives a finite bound, e.g. δ = 0
        and no finite α = ∞ value).

    Raises:
        ValueError: bad curve (length, NaN, negative), orders or δ.
    """
    a, c, d = _rdp_prepare(curve, delta, orders)
    if _tv_within_delta(float(np.min(c)), d):
        return 0.0
    fin = np.isfinite(a)
    best = float(np.min(c[~fin])) if (~fin).any() else math.inf
    if d > 0 and fin.any():
        af = a[fin]
        with np.errstate(invalid="ignore", over="ignore"):
            cand = c[fin] - np.log1p(1.0 / (af - 1.0)) + (-math.log(d) - np.log(af)) / (af - 1.0)
        cand = cand[~np.isnan(cand)]
        if cand.size:
            best = min(best, float(np.min(cand)))
    if not (c > 0).any():
        return 0.0
    return max(0.0, best)


def zcdp_epsilon(rho: float, delta: float, conversion: Conversion = "tight") -> float:
    """ε of total ρ at δ by the named conversion: "simple" ([BS16] Prop. 1.3),
    "tight" ([CKS20] Cor. 13) or "exact" (continuous Gaussians only; [BW18] Thm. 8).

    Raises:
        ValueError: unknown ``conversion`` or bad ρ/δ.
    """
    if conversion == "simple":
        return zcdp_epsilon_simple(rho, delta)
    if conversion == "tight":
        return zcdp_epsilon_tight(rho, delta)
    if conversion == "exact":
        return gaussian_epsilon_exact(rho, delta)
    raise ValueError(f"conversion must be one of {', '.join(CONVERSIONS)}, got {conversion!r}")


def rho_for_cap(epsilon: float, delta: float, conversion: Conversion = "tight") -> float:
    """Largest total ρ whose (ε, δ) conversion stays within the cap (ε, δ).

    * "simple": closed form ρ = (√(ln(1/δ) + ε) − √(ln(1/δ)))², the inverse of
      [BS16] Prop. 1.3.
    * "tight": inverse of [CKS20] Cor. 13 (:func:`zcdp_epsilon_tight`) by ``brentq``.
    * "exact": inverse of [BW18] Thm. 8 (:func:`gaussian_epsilon_exact`) by ``brentq``;
      only valid for a ledger of continuous Gaussian releases.

    The result satisfies ``zcdp_epsilon(result, delta, conversion) <= epsilon``
    (after the root finder, the feasible side is kept) and is within ~1e-12
    relative of the true supremum.

    Args:
        epsilon: cap ε > 0 (total).
        delta: cap δ in (0, 1); with δ = 0 only ρ = 0 meets a finite cap, so 0 is returned.
        conversion: "simple", "tight" or "exact".

    Returns:
        ρ_cap >= 0 (total for the population).

    Raises:
        ValueError: ε not > 0 or not finite; δ outside [0, 1); unknown conversion.
    """
    e = _positive("epsilon", epsilon)
    d = _delta(delta)
    if conversion not in CONVERSIONS:
        raise ValueError(f"conversion must be one of {', '.join(CONVERSIONS)}, got {conversion!r}")
    if d == 0:
        return 0.0
    L = -math.log(d)
    # (√(L+ε) − √L)², written without cancellation as ε² / (√(L+ε) + √L)²
    simple = e * e / (math.sqrt(L + e) + math.sqrt(L)) ** 2
    if conversion == "simple":
        while simple > 0 and zcdp_epsilon_simple(simple, d) > e:  # rounding guard
            simple = math.nextafter(simple, 0.0)
        return simple

    def conv(r: float) -> float:
        return zcdp_epsilon(r, d, conversion)

    lo = simple  # tight <= simple and exact <= tight, so these are feasible
    while lo > 0 and conv(lo) > e:  # pragma: no cover - rounding guard
        lo *= 1 - 1e-12
    hi = max(lo * 2.0, 1e-300)
    while conv(hi) <= e:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:  # pragma: no cover
            return lo
    # conv is continuous and increasing in ρ: find the crossing, then keep the feasible side.
    r = brentq(lambda x: conv(x) - e, lo, hi, xtol=1e-300, rtol=1e-13)
    step = 1e-13 * r
    while r > lo and conv(r) > e:
        r = max(lo, r - step)
        step *= 2.0
    return r


# --------------------------------------------------------------------------------------
# the ledger currency
# --------------------------------------------------------------------------------------


#: Relative slack allowed when checking that a claimed curve is non-decreasing (float noise
#: of an external accountant's arithmetic).
_MONOTONE_RTOL = 1e-9


def check_nondecreasing(curve: Sequence[float], orders: Sequence[float]) -> None:
    """Refuse an RDP curve that decreases in α: no mechanism has one.

    Rényi divergence is non-decreasing in its order ([vEH14] Thm. 3), so a true RDP
    curve ε(α) of any mechanism is non-decreasing. A claimed curve that decreases is
    wrong at one order at least, and the ledger cannot tell which claim to trust: a
    conservative mapping that believed the smaller value would under-charge. Equal
    values, +inf and float noise up to a relative 1e-9 are accepted.

    Args:
        curve: ε(α) at ``orders``, as given by the caller.
        orders: ascending orders (``math.inf`` allowed).

    Raises:
        ValueError: the first order where the curve decreases, with both values.
    """
    c = np.asarray(tuple(curve), dtype=float)
    a = np.asarray(tuple(orders), dtype=float)
    for i in range(1, c.size):
        if c[i] < c[i - 1] - _MONOTONE_RTOL * max(abs(c[i - 1]), 1e-300) and math.isfinite(c[i - 1]):
            raise ValueError(
                f"the curve decreases from ε = {c[i - 1]:.6g} at order {a[i - 1]:g} to ε = {c[i]:.6g} at "
                f"order {a[i]:g}; an RDP curve is non-decreasing in the order (Rényi divergence is), so "
                "one of these values is wrong: check the accountant's output"
            )


def curve_on_grid(curve: Sequence[float], orders: Sequence[float]) -> np.ndarray:
    """Map an RDP curve known at the caller's ``orders`` onto :data:`ORDERS`, conservatively.

    Rényi divergence is non-decreasing in its order ([vEH14] Thm. 3), so a mechanism that
    is (β, ε(β))-RDP is (α, ε(β))-RDP for every α ≤ β. Each ledger order α therefore takes
    the caller's value at the smallest caller order β ≥ α (the smallest such value if
    several follow: a suffix minimum); a ledger order above the caller's largest finite
    order gets ``+inf`` ("no claim") unless the caller gave the pure-ε order ∞. At
    α = ∞ the ledger takes the caller's value at ∞, if any, else ``+inf``.

    Args:
        curve: ε(β) ≥ 0 at the caller's ``orders`` (+inf allowed), total for the charge.
        orders: the caller's ascending orders β > 1 (``math.inf`` allowed, last).

    Returns:
        ε(α) at :data:`ORDERS` (a new float array; equal to ``curve`` if ``orders`` is the grid).

    Raises:
        ValueError: bad orders (not ascending, ≤ 1, NaN), a curve of another length, NaN or
            negative values, a curve that decreases (:func:`check_nondecreasing`).
    """
    b = _orders(orders)
    c = _curve(curve, b)
    check_nondecreasing(c, b)
    grid = np.asarray(ORDERS)
    env = np.minimum.accumulate(c[::-1])[::-1]  # env[i] = min over caller orders ≥ b[i]
    idx = np.searchsorted(b, grid, side="left")
    out = np.full(grid.shape, math.inf)
    ok = idx < b.size
    out[ok] = env[idx[ok]]
    return out


def _check_grid(orders: Sequence[float]) -> None:
    a = _orders(orders)
    if a.shape != (len(ORDERS),) or not np.array_equal(a, np.asarray(ORDERS)):
        raise ValueError(
            "orders must be the ledger's grid accounting.ORDERS; evaluate your accountant "
            "at ORDERS (a curve on another grid cannot be compared with the budget)"
        )


