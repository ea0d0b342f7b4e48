"""Privacy accounting: zCDP, Rényi-DP curves, conversions to (ε, δ), composition helpers.

Pure functions only (no I/O, no state, no randomness). This module fixes the
ledger's currency:

* Gaussian releases cost ρ (zero-concentrated DP, Bun & Steinke 2016); ρ adds
  under (adaptive) composition.
* Anything else costs a Rényi-DP (RDP) curve ε(α) on the fixed order grid
  :data:`ORDERS` (Mironov 2017); curves add order by order.

A :class:`Cost` is the cost of one charge. ``cost_epsilon`` reports it as
(ε, δ)-DP with the tightest conversion valid for its kind.

Conventions used by every function here:

* ρ and ε are in nats (natural logarithms); δ is a probability in [0, 1).
* "per release" vs "total" is stated in each docstring; every conversion takes
  the *total* (composed) ρ or curve. Never convert per release and sum the ε's
  (that is the 30.0-vs-3.97 mistake: see DESIGN.md, Accounting).
* Reported ε is never negative, is non-increasing in δ, and δ = 0 with ρ > 0
  gives ``math.inf`` at once.
* Invalid arguments (NaN, negative, zero where not allowed, wrong grid) raise
  :class:`ValueError` whose message names the argument. Callers that face the
  user (HTTP, CLI) turn it into a :class:`dpgate.errors.InvalidBudget` or
  :class:`dpgate.errors.InvalidRequest`.

References
----------
[BS16]  M. Bun, T. Steinke. Concentrated Differential Privacy: Simplifications,
        Extensions, and Lower Bounds. TCC 2016 (arXiv:1605.02065).
[Mir17] I. Mironov. Rényi Differential Privacy. CSF 2017 (arXiv:1702.07476).
[CKS20] C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential
        Privacy. NeurIPS 2020 (arXiv:2004.00010).
[BBG+20] B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato. Hypothesis Testing
        Interpretations and Rényi Differential Privacy. AISTATS 2020 (arXiv:1905.09982).
[BW18]  B. Balle, Y.-X. Wang. Improving the Gaussian Mechanism for Differential
        Privacy: Analytical Calibration and Optimal Denoising. ICML 2018.
[DRS22] J. Dong, A. Roth, W. Su. Gaussian Differential Privacy. JRSS-B 2022.
[DRV10] C. Dwork, G. Rothblum, S. Vadhan. Boosting and Differential Privacy. FOCS 2010.
[DR14]  C. Dwork, A. Roth. The Algorithmic Foundations of Differential Privacy. 2014.
[Vad17] S. Vadhan. The Complexity of Differential Privacy. 2017.
[BBG18] B. Balle, G. Barthe, M. Gaboardi. Privacy Amplification by Subsampling:
        Tight Analyses via Couplings and Divergences. NeurIPS 2018.
[LQS12] N. Li, W. Qardaji, D. Su. On Sampling, Anonymization, and Differential
        Privacy. ASIACCS 2012.
[KOV15] P. Kairouz, S. Oh, P. Viswanath. The Composition Theorem for Differential
        Privacy. ICML 2015.
[WZ10]  L. Wasserman, S. Zhou. A Statistical Framework for Differential Privacy.
        JASA 2010.
[vEH14] T. van Erven, P. Harremoës. Rényi Divergence and Kullback-Leibler
        Divergence. IEEE Trans. Inf. Theory 2014.
[MTZ19] I. Mironov, K. Talwar, L. Zhang. Rényi Differential Privacy of the Sampled
        Gaussian Mechanism. 2019 (arXiv:1908.10530).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, get_args

import numpy as np
from scipy.optimize import brentq
from scipy.special import erfcx, log_ndtr

__all__ = [
    "ORDERS",
    "SEED_ORDERS",
    "CONVERSIONS",
    "Cost",
    "gaussian_rho",
    "gaussian_sigma",
    "gaussian_rdp",
    "laplace_rdp",
    "pure_dp_rdp",
    "zcdp_epsilon_simple",
    "zcdp_epsilon_tight",
    "zcdp_optimal_order",
    "gaussian_epsilon_exact",
    "rdp_epsilon_basic",
    "rdp_epsilon_tight",
    "zcdp_epsilon",
    "cost_epsilon",
    "rho_for_cap",
    "basic_composition",
    "advanced_composition",
    "group_privacy",
    "group_privacy_rho",
    "poisson_subsampling_epsilon",
    "curve_on_grid",
    "max_true_positive_rate",
    "DP_SGD_SAMPLERS",
    "poisson_subsampled_gaussian_rdp",
    "dp_sgd_rdp",
    "dp_sgd_cost",
    "dp_attack_curve",
    "gdp_mu",
    "gdp_true_positive_rate",
    "rdp_true_positive_rate",
    "zcdp_true_positive_rate",
    "rdp_attack_curve",
    "zcdp_attack_curve",
    "periods_epsilon",
]

#: The order grid of the worked example (seed); a subset of :data:`ORDERS`.
SEED_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0,
    48.0, 64.0, 128.0, 256.0,
)  # fmt: skip

#: The ledger's RDP order grid: ascending, every order > 1, a superset of
#: :data:`SEED_ORDERS`, dense near 1 (large budgets), high orders up to 1024
#: (small budgets, pure-DP-like mechanisms) and ``math.inf`` last (the pure-ε
#: limit, D_∞). Changing it invalidates stored curves: never edit in place.
ORDERS: tuple[float, ...] = (
    1.01, 1.05, 1.1, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0,
    10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0, 64.0, 80.0, 96.0, 128.0,
    160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 640.0, 768.0, 1024.0, math.inf,
)  # fmt: skip

CostKind = Literal["zcdp", "gaussian", "rdp"]
Conversion = Literal["simple", "tight", "exact"]
#: Names accepted by :func:`rho_for_cap` (and the CLI): ρ-zCDP → (ε, δ) conversions.
CONVERSIONS: tuple[str, ...] = get_args(Conversion)


# --------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


def _nonneg(name: str, value: Any, *, allow_inf: bool = False) -> float:
    v = _real(name, value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v!r}")
    if math.isinf(v) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {v!r}")
    return v


def _positive(name: str, value: Any) -> float:
    v = _nonneg(name, value)
    if v == 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return v


def _delta(value: Any, name: str = "delta") -> float:
    v = _real(name, value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {v!r}")
    return v


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


def _orders(orders: Iterable[float]) -> np.ndarray:
    try:
        a = np.asarray(tuple(orders), dtype=float)
    except (TypeError, ValueError):
        raise ValueError("orders must be a sequence of real numbers") from None
    if a.ndim != 1 or a.size == 0:
        raise ValueError("orders must be a non-empty one-dimensional sequence")
    if np.isnan(a).any() or (a <= 1.0).any():
        raise ValueError("orders must all be > 1 (RDP order α > 1; use math.inf for pure ε)")
    if (np.diff(a) <= 0).any():
        raise ValueError("orders must be strictly ascending")
    return a


def _curve(curve: Iterable[float], orders: np.ndarray, name: str = "curve") -> np.ndarray:
    try:
        c = np.asarray(tuple(curve), dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of real numbers") from None
    if c.ndim != 1 or c.shape != orders.shape:
        raise ValueError(
            f"{name} must have one value per order: got {c.size} values for {orders.size} orders"
        )
    if np.isnan(c).any():
        raise ValueError(f"{name} must not contain NaN")
    if (c < 0).any():
        raise ValueError(f"{name} must be non-negative (RDP ε(α) >= 0)")
    return c


# --------------------------------------------------------------------------------------
# per-mechanism costs
# --------------------------------------------------------------------------------------


def gaussian_rho(l2_sensitivity: float, sigma: float) -> float:
    """ρ of one Gaussian release: ρ = Δ2² / (2σ²), per release.

    Holds for the continuous Gaussian ([BS16] Prop. 1.6) and the discrete
    Gaussian with the same σ (the σ parameter of N_Z(0, σ²); [CKS20] Thm. 4).

    Args:
        l2_sensitivity: Δ2 >= 0, in the same units as the noise.
        sigma: noise scale σ > 0 (same units).

    Returns:
        ρ (zCDP) of this one release.

    Raises:
        ValueError: NaN, negative or infinite Δ2; σ not > 0 or not finite.
    """
    d = _nonneg("l2_sensitivity", l2_sensitivity)
    s = _positive("sigma", sigma)
    return d * d / (2.0 * s * s)


def gaussian_sigma(l2_sensitivity: float, rho: float) -> float:
    """σ giving a Gaussian release of cost ρ: σ = Δ2 / √(2ρ) (inverse of :func:`gaussian_rho`).

    [BS16] Prop. 1.6; [CKS20] Thm. 4 for the discrete Gaussian.

    Args:
        l2_sensitivity: Δ2 > 0.
        rho: this release's ρ > 0 (per release, not a total).

    Returns:
        σ, in the units of Δ2.

    Raises:
        ValueError: Δ2 or ρ not > 0, NaN or infinite.
    """
    d = _positive("l2_sensitivity", l2_sensitivity)
    r = _positive("rho", rho)
    return d / math.sqrt(2.0 * r)


def gaussian_rdp(rho: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP curve of ρ-zCDP (e.g. a Gaussian mechanism): ε(α) = α·ρ.

    ρ-zCDP is by definition (α, αρ)-RDP for every α > 1 ([BS16] Def. 1.1); for
    the Gaussian mechanism with ρ = Δ2²/(2σ²) this is [Mir17] Prop. 7. At
    α = ∞ the value is ∞ when ρ > 0 (no pure-DP guarantee) and 0 when ρ = 0.

    Args:
        rho: total ρ >= 0 (per release or composed: the curve is linear in ρ).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ρ or orders.
    """
    r = _nonneg("rho", rho)
    a = _orders(orders)
    with np.errstate(invalid="ignore"):
        out = a * r
    return np.where(np.isinf(a), math.inf if r > 0 else 0.0, out)


def laplace_rdp(epsilon: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP curve of one continuous Laplace release with ε = Δ1/b ([Mir17] Prop. 6).

    For α > 1::

        ε(α) = 1/(α−1) · log( α/(2α−1) · e^{(α−1)ε} + (α−1)/(2α−1) · e^{−αε} )

    evaluated in log-space (``logaddexp``) so α = 1024 does not overflow; at
    α = ∞ it is ε (pure DP). Each value is also capped at ε.

    Args:
        epsilon: ε = Δ1/b >= 0 of one release (per release).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ε or orders.
    """
    e = _nonneg("epsilon", epsilon)
    a = _orders(orders)
    out = np.empty_like(a)
    fin = np.isfinite(a)
    af = a[fin]
    if e == 0:
        return np.zeros_like(a)
    log_terms = np.logaddexp(
        np.log(af) - np.log(2 * af - 1) + (af - 1) * e,
        np.log(af - 1) - np.log(2 * af - 1) - af * e,
    )
    out[fin] = np.minimum(np.maximum(log_terms / (af - 1), 0.0), e)
    out[~fin] = e
    return out


def pure_dp_rdp(epsilon: float, orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Worst-case RDP curve of any ε-DP mechanism (e.g. the discrete Laplace), per release.

    Every ε-DP pair of output distributions has its privacy region inside that
    of binary randomized response with parameter ε ([KOV15] Thm. 2.1), so it is
    a post-processing of randomized response (Blackwell's theorem; [KOV15]
    Sec. 2 — randomized response is the "dominating pair" of pure ε-DP), and
    Rényi divergence obeys data processing ([vEH14] Thm. 9). Hence the
    randomized response curve is the tightest bound valid for every ε-DP
    mechanism::

        ε(α) = 1/(α−1) · log( (e^{αε} + e^{(1−α)ε}) / (1 + e^ε) )

    (log-space). It is additionally capped by ε ([Mir17] Prop. 3's D_∞ bound)
    and by α·ε²/2 ([BS16] Prop. 3.3: ε-DP ⇒ ε²/2-zCDP); the minimum of the three
    is returned. At α = ∞ the value is ε.

    Args:
        epsilon: ε >= 0 of the mechanism (per release).
        orders: ascending orders α > 1 (``math.inf`` allowed).

    Returns:
        float array, ε(α) at each order.

    Raises:
        ValueError: bad ε or orders.
    """
    e = _nonneg("epsilon", epsilon)
    a = _orders(orders)
    out = np.empty_like(a)
    fin = np.isfinite(a)
    af = a[fin]
    if e == 0:
        return np.zeros_like(a)
    rr = (np.logaddexp(af * e, (1 - af) * e) - np.logaddexp(0.0, e)) / (af - 1)
    quad = af * e * e / 2.0
    # Where αε is tiny the log-space difference above cancels to (near) zero, which
    # would under-charge; there use the valid upper bound αε²/2 itself (its relative
    # slack over the RR curve is O((αε)²)).
    rr = np.where(af * e < 1e-4, quad, rr)
    out[fin] = np.maximum(np.minimum(np.minimum(rr, e), quad), 0.0)
    out[~fin] = e
    return out


# --------------------------------------------------------------------------------------
# conversions to (ε, δ)
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


@dataclass(frozen=True)
class Cost:
    """The cost of one charge in the ledger currency (ρ for Gaussians, else an RDP curve).

    Fields:
        kind: "zcdp" — our own discrete Gaussian releases (ρ-zCDP, [CKS20] Thm. 4);
            "gaussian" — continuous Gaussian mechanisms declared by an external
            consumer (ρ; eligible for exact Gaussian-DP reporting, [BW18]);
            "rdp" — a general RDP curve at :data:`ORDERS`.
        rho: ρ >= 0 for "zcdp"/"gaussian", else ``None``.
        curve: ε(α) at :data:`ORDERS` (tuple of floats >= 0, +inf allowed meaning
            "no claim at that order", at least one finite value) for "rdp",
            else ``None``.

    Composition (``+``): ρ adds ([BS16] Lemma 2.3) and RDP curves add order by
    order ([Mir17] Prop. 1), also under adaptive composition. zcdp+zcdp → zcdp,
    gaussian+gaussian → gaussian, zcdp+gaussian → zcdp (no longer eligible for
    exact Gaussian reporting), anything + rdp → rdp (ρ converted to α·ρ).
    ``sum(costs)`` works (0 is the identity).

    Raises (on construction):
        ValueError: invalid kind, ρ or curve (message names the field).
    """

    kind: CostKind
    rho: float | None = None
    curve: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind in ("zcdp", "gaussian"):
            if self.curve is not None:
                raise ValueError(f"curve must be None for a {self.kind!r} cost")
            object.__setattr__(self, "rho", _nonneg("rho", self.rho))
        elif self.kind == "rdp":
            if self.rho is not None:
                raise ValueError("rho must be None for an 'rdp' cost (give the curve)")
            if self.curve is None:
                raise ValueError("curve is required for an 'rdp' cost")
            c = _curve(self.curve, np.asarray(ORDERS))
            if not np.isfinite(c).any():
                raise ValueError("curve must be finite at one order at least")
            object.__setattr__(self, "curve", tuple(float(v) for v in c))
        else:
            raise ValueError(f"kind must be 'zcdp', 'gaussian' or 'rdp', got {self.kind!r}")

    # -- constructors ------------------------------------------------------------------

    @classmethod
    def zcdp(cls, rho: float) -> "Cost":
        """ρ-zCDP cost of our discrete Gaussian release(s); ``rho`` total for this charge.

        Raises:
            ValueError: ρ NaN, negative or infinite.
        """
        return cls("zcdp", rho=rho)

    @classmethod
    def continuous_gaussian(cls, rho: float) -> "Cost":
        """Cost of continuous Gaussian mechanism(s) with total ρ = Σ Δ2²/(2σ²).

        Reported with the exact Gaussian-DP conversion ([BW18] Thm. 8) while the
        ledger history contains only such costs.

        Raises:
            ValueError: ρ NaN, negative or infinite.
        """
        return cls("gaussian", rho=rho)

    @classmethod
    def rdp(cls, curve: Sequence[float], orders: Sequence[float] = ORDERS) -> "Cost":
        """A general RDP cost: ε(α) at the ledger's grid (e.g. from a DP-SGD accountant).

        Args:
            curve: ε(α) >= 0, one value per order (+inf allowed, at least one finite).
            orders: must equal :data:`ORDERS` (given to make the grid explicit).

        Raises:
            ValueError: orders differ from :data:`ORDERS`; wrong length; NaN or negative values.
        """
        _check_grid(orders)
        return cls("rdp", curve=tuple(np.asarray(tuple(curve), dtype=float).tolist()))

    @classmethod
    def rdp_on_orders(cls, curve: Sequence[float], orders: Sequence[float]) -> "Cost":
        """An RDP cost computed at the caller's own ``orders`` (e.g. Opacus' or dp-accounting's
        grid), mapped onto :data:`ORDERS` by :func:`curve_on_grid` (conservatively: each ledger
        order takes the value at the next caller order above it; +inf beyond the last).

        Raises:
            ValueError: bad orders or curve (see :func:`curve_on_grid`); no finite value
                left on the ledger's grid.
        """
        return cls("rdp", curve=tuple(curve_on_grid(curve, orders).tolist()))

    @classmethod
    def pure(cls, epsilon: float) -> "Cost":
        """Cost of any ε-DP mechanism (e.g. the discrete Laplace): the worst-case RDP curve.

        Curve from :func:`pure_dp_rdp` (randomized response, [KOV15] Thm. 2.1;
        capped by ε and αε²/2, [BS16] Prop. 3.3). ``epsilon`` is the total ε of the charge.

        Raises:
            ValueError: ε NaN, negative or infinite.
        """
        return cls("rdp", curve=tuple(pure_dp_rdp(epsilon).tolist()))

    @classmethod
    def laplace(cls, epsilon: float) -> "Cost":
        """Cost of one continuous Laplace release with ε = Δ1/b ([Mir17] Prop. 6).

        Raises:
            ValueError: ε NaN, negative or infinite.
        """
        return cls("rdp", curve=tuple(laplace_rdp(epsilon).tolist()))

    # -- views -------------------------------------------------------------------------

    @property
    def is_zcdp(self) -> bool:
        """True for "zcdp" and "gaussian" costs (a ρ describes them fully)."""
        return self.kind in ("zcdp", "gaussian")

    def curve_at(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        """ε(α) of this cost at ``orders`` (float array, a fresh copy).

        zcdp/gaussian: α·ρ ([BS16] Def. 1.1), ∞ at α = ∞ when ρ > 0. rdp: the
        stored values at grid orders; at an order α off the grid, the smallest
        stored value at a grid order β >= α (a valid upper bound since Rényi
        divergence is non-decreasing in its order, [vEH14] Thm. 3), ∞ if none.

        Raises:
            ValueError: bad orders.
        """
        if self.is_zcdp:
            return gaussian_rdp(self.rho, orders)  # type: ignore[arg-type]
        a = _orders(orders)
        grid = np.asarray(ORDERS)
        c = np.asarray(self.curve, dtype=float)
        # suffix minimum: env[i] = min_{j >= i} c[j]
        env = np.minimum.accumulate(c[::-1])[::-1]
        idx = np.searchsorted(grid, a, side="left")
        out = np.full(a.shape, math.inf)
        ok = idx < grid.size
        out[ok] = env[idx[ok]]
        exact = ok.copy()
        exact[ok] = grid[idx[ok]] == a[ok]
        out[exact] = c[idx[exact]]
        return out

    def rho_bound(self, max_order: float | None = None) -> float:
        """The smallest ρ' with ε(α) <= α·ρ' at every finite order α of :data:`ORDERS`
        (with ``max_order``: at every grid order α <= ``max_order`` only).

        For zcdp/gaussian costs this is ρ itself. Used to state an RDP charge in
        ρ units: over the whole grid it may be ∞ (a curve that makes no claim at
        high orders, such as a DP-SGD run's); over the orders a cap checks
        (``max_order`` = the cap's α_cap, see ``docs/DESIGN_NOTES.md``) it is the
        share of the budget α·ρ_cap that the filter sees the charge use.

        Args:
            max_order: the largest order to include (None: every finite order).
        """
        if self.is_zcdp:
            return float(self.rho)  # type: ignore[arg-type]
        a = np.asarray(ORDERS)
        keep = np.isfinite(a) if max_order is None else (np.isfinite(a) & (a <= max_order))
        if not keep.any():
            return math.inf
        return float(np.max(np.asarray(self.curve)[keep] / a[keep]))

    def epsilon(self, delta: float) -> float:
        """Shorthand for :func:`cost_epsilon` ``(self, delta)``."""
        return cost_epsilon(self, delta)

    # -- composition -------------------------------------------------------------------

    def __add__(self, other: object) -> "Cost":
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
            return self
        if not isinstance(other, Cost):
            return NotImplemented
        if self.is_zcdp and other.is_zcdp:
            kind = "gaussian" if self.kind == other.kind == "gaussian" else "zcdp"
            return Cost(kind, rho=float(self.rho) + float(other.rho))  # type: ignore[arg-type]
        total = self.curve_at(ORDERS) + other.curve_at(ORDERS)
        return Cost("rdp", curve=tuple(total.tolist()))

    def __radd__(self, other: object) -> "Cost":
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other == 0:
            return self
        return NotImplemented

    # -- serialisation -----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form: {"kind", "rho"} or {"kind", "orders", "curve"}.

        Infinite curve values and the order ∞ are written as the string "inf"
        (strict JSON has no infinity). Round-trips exactly with :meth:`from_dict`.
        """
        if self.is_zcdp:
            return {"kind": self.kind, "rho": float(self.rho)}  # type: ignore[arg-type]
        enc = lambda v: "inf" if math.isinf(v) else float(v)  # noqa: E731
        return {
            "kind": "rdp",
            "orders": [enc(a) for a in ORDERS],
            "curve": [enc(v) for v in self.curve],  # type: ignore[union-attr]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Cost":
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: unknown kind, missing fields, a curve on another grid, bad values.
        """
        if not isinstance(data, Mapping):
            raise ValueError("cost must be a mapping")
        kind = data.get("kind")
        if kind in ("zcdp", "gaussian"):
            if "rho" not in data:
                raise ValueError("rho is required for a zcdp/gaussian cost")
            return cls(kind, rho=data["rho"])
        if kind == "rdp":
            dec = lambda v: math.inf if v in ("inf", "Infinity", "+inf") else v  # noqa: E731
            if "curve" not in data or not isinstance(data["curve"], (list, tuple)):
                raise ValueError("curve (a list) is required for an rdp cost")
            orders = data.get("orders", ORDERS)
            if not isinstance(orders, (list, tuple)):
                raise ValueError("orders must be a list")
            return cls.rdp([dec(v) for v in data["curve"]], [dec(a) for a in orders])
        raise ValueError(f"kind must be 'zcdp', 'gaussian' or 'rdp', got {kind!r}")


def cost_epsilon(cost: Cost, delta: float) -> float:
    """ε at δ of a (composed) cost, by the tightest conversion valid for its kind.

    "zcdp" → [CKS20] Cor. 13 (:func:`zcdp_epsilon_tight`); "gaussian" → exact
    Gaussian DP ([BW18] Thm. 8, :func:`gaussian_epsilon_exact`); "rdp" →
    [BBG+20] Thm. 21 on :data:`ORDERS` (:func:`rdp_epsilon_tight`).

    Raises:
        ValueError: ``cost`` not a Cost; δ outside [0, 1).
    """
    if not isinstance(cost, Cost):
        raise ValueError(f"cost must be a Cost, got {type(cost).__name__}")
    if cost.kind == "zcdp":
        return zcdp_epsilon_tight(cost.rho, delta)  # type: ignore[arg-type]
    if cost.kind == "gaussian":
        return gaussian_epsilon_exact(cost.rho, delta)  # type: ignore[arg-type]
    return rdp_epsilon_tight(cost.curve, delta, ORDERS)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# (ε, δ) helpers
# --------------------------------------------------------------------------------------


def basic_composition(guarantees: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Basic composition of (ε_i, δ_i)-DP mechanisms: (Σε_i, Σδ_i) ([DR14] Thm. 3.16).

    Args:
        guarantees: iterable of per-release (ε_i, δ_i) pairs (ε_i >= 0, δ_i in [0, 1)).

    Returns:
        (total ε, total δ); δ capped at 1.

    Raises:
        ValueError: a bad ε_i or δ_i.
    """
    eps = 0.0
    dlt = 0.0
    for i, pair in enumerate(guarantees):
        try:
            e, d = pair
        except (TypeError, ValueError):
            raise ValueError(f"guarantees[{i}] must be an (epsilon, delta) pair") from None
        eps += _nonneg(f"guarantees[{i}].epsilon", e)
        dlt += _delta(d, f"guarantees[{i}].delta")
    return eps, min(dlt, 1.0)


def advanced_composition(epsilon: float, delta: float, k: int, delta_prime: float) -> tuple[float, float]:
    """Advanced composition of k adaptive (ε, δ)-DP mechanisms ([DRV10] Thm. III.3).

    ε' = √(2k·ln(1/δ'))·ε + k·ε·(e^ε − 1), total δ = k·δ + δ'.
    (The result is never worse than basic composition k·ε is *not* enforced;
    callers compare.)

    Args:
        epsilon: per-mechanism ε >= 0.
        delta: per-mechanism δ in [0, 1).
        k: number of mechanisms >= 1.
        delta_prime: slack δ' in (0, 1).

    Returns:
        (ε', δ_total) with δ_total capped at 1.

    Raises:
        ValueError: bad argument (named).
    """
    e = _nonneg("epsilon", epsilon)
    d = _delta(delta)
    n = _count("k", k)
    dp = _delta(delta_prime, "delta_prime")
    if dp == 0:
        raise ValueError("delta_prime must be > 0")
    eps = math.sqrt(2.0 * n * -math.log(dp)) * e + n * e * math.expm1(e)
    return eps, min(1.0, n * d + dp)


def group_privacy(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(ε, δ) guarantee for groups of k privacy units: (k·ε, k·e^{(k−1)ε}·δ).

    [DR14] Thm. 2.2 (pure case, k·ε) and its approximate-DP form [Vad17] Lemma 2.2.

    Args:
        epsilon: per-unit ε >= 0.
        delta: per-unit δ in [0, 1).
        k: group size >= 1.

    Returns:
        (k·ε, min(1, k·e^{(k−1)ε}·δ)).

    Raises:
        ValueError: bad argument (named).
    """
    e = _nonneg("epsilon", epsilon)
    d = _delta(delta)
    n = _count("k", k)
    if d == 0:
        return n * e, 0.0
    log_d = math.log(n) + (n - 1) * e + math.log(d)
    return n * e, (1.0 if log_d >= 0 else math.exp(log_d))


def group_privacy_rho(rho: float, k: int) -> float:
    """ρ-zCDP for groups of k units: k²·ρ ([BS16] Prop. 1.9).

    Raises:
        ValueError: bad ρ or k.
    """
    return _count("k", k) ** 2 * _nonneg("rho", rho)


def poisson_subsampling_epsilon(epsilon: float, q: float) -> float:
    """ε after Poisson subsampling with rate q: ln(1 + q·(e^ε − 1)).

    [BBG18] Thm. 10 (and [LQS12] Thm. 1); the δ of an (ε, δ) mechanism becomes q·δ.

    Args:
        epsilon: ε >= 0 of the mechanism run on the sample.
        q: sampling probability in [0, 1].

    Returns:
        amplified ε >= 0.

    Raises:
        ValueError: bad ε or q.
    """
    e = _nonneg("epsilon", epsilon)
    p = _real("q", q)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {p!r}")
    return math.log1p(p * math.expm1(e))


def max_true_positive_rate(epsilon: float, delta: float, false_positive_rate: float) -> float:
    """Largest power (true positive rate) of any test for "unit x is in the data" at a given
    false positive rate, against an (ε, δ)-DP release.

    The (ε, δ)-DP privacy region ([KOV15] Thm. 2.1, after [WZ10] Sec. 2) gives
    TPR <= e^ε·FPR + δ and TPR <= 1 − e^{−ε}·(1 − δ − FPR); the minimum of both
    and 1 is returned (the first face binds for small FPR).

    Args:
        epsilon: total ε >= 0 (``math.inf`` allowed: returns 1).
        delta: total δ in [0, 1).
        false_positive_rate: FPR in [0, 1].

    Returns:
        TPR bound in [0, 1].

    Raises:
        ValueError: bad argument (named).
    """
    e = _nonneg("epsilon", epsilon, allow_inf=True)
    d = _delta(delta)
    f = _real("false_positive_rate", false_positive_rate)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
    if math.isinf(e):
        return 1.0  # no guarantee at all
    if f == 0.0:
        return d  # TPR ≤ e^ε·0 + δ, for any finite ε
    a = math.exp(e) * f + d if e < 700.0 else math.inf  # e^ε overflows a double above ~709.78
    b = 1.0 - math.exp(-e) * (1.0 - d - f)
    return max(0.0, min(1.0, a, b))


# --------------------------------------------------------------------------------------
# DP-SGD: the Poisson-subsampled Gaussian mechanism (issue 23)
# --------------------------------------------------------------------------------------

#: Batch samplers a DP-SGD run may declare. Only ``"poisson"`` (each example joins each batch
#: independently with probability q) is amplified by subsampling here; the others are
#: charged as the full-data Gaussian at every step (:func:`dp_sgd_rdp`).
DP_SGD_SAMPLERS: tuple[str, ...] = ("poisson", "shuffle", "fixed_batches", "with_replacement")

#: Most terms of the fractional-order series of :func:`poisson_subsampled_gaussian_rdp`.
_MAX_SERIES_TERMS = 1000


def _log_add(a: float, b: float) -> float:
    """log(e^a + e^b) without overflow."""
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    hi, lo = (a, b) if a >= b else (b, a)
    return hi + math.log1p(math.exp(lo - hi))


def _log_abs_binom(n: float, k: int) -> float:
    """log |C(n, k)| for real n ≥ 0 and integer k ≥ 0 (the generalised binomial coefficient)."""
    from scipy.special import gammaln

    return float(gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0))


def _log_a_integer(q: float, sigma: float, alpha: int) -> float:
    """log A_α of the sampled Gaussian for an integer order α ≥ 2 ([MTZ19] Sec. 3.3, integer α):
    A_α = Σ_{k=0}^{α} C(α, k) (1 − q)^{α−k} q^k exp((k² − k) / (2σ²))."""
    log_q, log_1mq = math.log(q), math.log1p(-q)
    total = -math.inf
    for k in range(alpha + 1):
        term = _log_abs_binom(alpha, k) + k * log_q + (alpha - k) * log_1mq + (k * k - k) / (2.0 * sigma * sigma)
        total = _log_add(total, term)
    return total


def _log_half_erfc(x: float) -> float:
    """log(erfc(x) / 2) = log Φ(−√2·x), accurate in both tails."""
    return float(log_ndtr(-x * math.sqrt(2.0)))


def _log_a_fractional(q: float, sigma: float, alpha: float) -> float:
    """log A_α of the sampled Gaussian for a fractional order α > 1 ([MTZ19] Sec. 3.3).

    A_α = A₀ + A₁ split at z₀ = σ²·log(1/q − 1) + 1/2, each an infinite series in the
    generalised binomial coefficients C(α, i) (which alternate in sign for i > α). As in
    dp-accounting (``_compute_log_a_frac``), the terms are added in absolute value, which can
    only overstate A_α (a valid upper bound on the RDP); the series stops when both parts'
    terms are decreasing and below e^-30 of the running total. If it has not converged after
    :data:`_MAX_SERIES_TERMS` terms the order makes no claim (+∞).
    """
    log_q, log_1mq = math.log(q), math.log1p(-q)
    z0 = sigma * sigma * math.log(1.0 / q - 1.0) + 0.5
    root2_sigma = math.sqrt(2.0) * sigma
    a0 = a1 = -math.inf
    last0 = last1 = -math.inf
    for i in range(_MAX_SERIES_TERMS):
        coef = _log_abs_binom(alpha, i)
        j = alpha - i
        s0 = coef + i * log_q + j * log_1mq + (i * i - i) / (2.0 * sigma * sigma) \
            + _log_half_erfc((i - z0) / root2_sigma)
        s1 = coef + j * log_q + i * log_1mq + (j * j - j) / (2.0 * sigma * sigma) \
            + _log_half_erfc((z0 - j) / root2_sigma)
        a0, a1 = _log_add(a0, s0), _log_add(a1, s1)
        total = _log_add(a0, a1)
        if s0 < last0 and s1 < last1 and max(s0, s1) < total - 30.0:
            return total
        last0, last1 = s0, s1
    return math.inf


def poisson_subsampled_gaussian_rdp(q: float, noise_multiplier: float,
                                    orders: Sequence[float] = ORDERS) -> np.ndarray:
    """RDP curve ε(α) of ONE step of the Poisson-subsampled Gaussian mechanism.

    Each unit joins the batch independently with probability ``q``; the batch's sum of
    (clipped, L2 ≤ C) contributions gets Gaussian noise of standard deviation
    ``noise_multiplier``·C. Under add/remove-one-unit neighbours its RDP is
    ε(α) = log(A_α)/(α − 1) — Mironov, Talwar & Zhang, "Rényi Differential Privacy of the
    Sampled Gaussian Mechanism" (2019, arXiv:1908.10530), Sec. 3.3: the closed sum for
    integer α (:func:`_log_a_integer`), the two-part erfc series for fractional α
    (:func:`_log_a_fractional`). The same formulas as dp-accounting's RDP accountant
    (``_compute_rdp_poisson_subsampled_gaussian``), used as the oracle in the tests.

    Special cases: q = 0 → 0; q = 1 → α/(2σ²) (the Gaussian mechanism); α = ∞ → ∞ (no
    claim: the subsampled Gaussian is not ε-DP for any finite ε).

    Args:
        q: sampling probability in [0, 1] (per step).
        noise_multiplier: σ/C > 0 (noise standard deviation over the clipping norm).
        orders: ascending orders α > 1 (default :data:`ORDERS`; ``math.inf`` allowed).

    Returns:
        ε(α) ≥ 0 at ``orders`` for one step (float array; +∞ where no claim is made).

    Raises:
        ValueError: q outside [0, 1], σ not finite and > 0, bad orders.
    """
    p = _real("q", q)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {p!r}")
    sigma = _positive("noise_multiplier", noise_multiplier)
    a = _orders(orders)
    out = np.empty(a.shape)
    for idx, alpha in enumerate(a.tolist()):
        if p == 0.0:
            out[idx] = 0.0
        elif math.isinf(alpha):
            out[idx] = math.inf
        elif p == 1.0:
            out[idx] = alpha / (2.0 * sigma * sigma)
        elif float(alpha).is_integer():
            out[idx] = _log_a_integer(p, sigma, int(alpha)) / (alpha - 1.0)
        else:
            out[idx] = _log_a_fractional(p, sigma, alpha) / (alpha - 1.0)
    return np.maximum(out, 0.0)


def dp_sgd_rdp(q: float, noise_multiplier: float, steps: int, sampler: str,
               orders: Sequence[float] = ORDERS) -> np.ndarray:
    """Total RDP curve of a DP-SGD run: ``steps`` Gaussian steps, amplified only for Poisson sampling.

    * ``"poisson"``: steps × :func:`poisson_subsampled_gaussian_rdp` (q, σ) — RDP composes
      additively ([Mir17] Prop. 1), so T steps cost T·ε₁(α).
    * ``"shuffle"``, ``"fixed_batches"``, ``"with_replacement"``: no amplification. The
      amplification-by-subsampling theorems assume each unit is in each batch independently
      with probability q; a shuffled or fixed partition into batches (or sampling with
      replacement) is not that, and no proof for them is implemented here. Every step is
      charged as the Gaussian mechanism on the full data: steps·α/(2σ²) ([Mir17] Cor. 3),
      i.e. ρ = steps/(2σ²). This assumes one unit changes each step's clipped sum by at most
      C (for ``with_replacement``: a unit drawn twice into one batch is clipped once, per
      unit, not per draw; otherwise its sensitivity is larger and this charge is too small).

    Args:
        q: sampling rate (batch size / dataset size) in [0, 1]; ignored without amplification.
        noise_multiplier: σ/C > 0.
        steps: number of noisy gradient steps (integer ≥ 1).
        sampler: one of :data:`DP_SGD_SAMPLERS`.
        orders: as :func:`poisson_subsampled_gaussian_rdp`.

    Returns:
        ε(α) at ``orders`` for the whole run.

    Raises:
        ValueError: unknown sampler or a bad argument (named).
    """
    if sampler not in DP_SGD_SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(DP_SGD_SAMPLERS)}, got {sampler!r}")
    n = _count("steps", steps)
    if sampler == "poisson":
        return n * poisson_subsampled_gaussian_rdp(q, noise_multiplier, orders)
    p = _real("q", q)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {p!r}")
    sigma = _positive("noise_multiplier", noise_multiplier)
    return gaussian_rdp(n / (2.0 * sigma * sigma), orders)


def dp_sgd_cost(q: float, noise_multiplier: float, steps: int, sampler: str) -> Cost:
    """The ledger :class:`Cost` of a DP-SGD run described by its parameters (:func:`dp_sgd_rdp`).

    ``"poisson"``: an RDP curve on :data:`ORDERS`. Any other sampler: a continuous Gaussian
    of total ρ = steps/(2σ²) (``Cost.continuous_gaussian``: the same curve α·ρ, and eligible
    for exact Gaussian-DP reporting, since DP-SGD adds continuous Gaussian noise).

    Raises:
        ValueError: as :func:`dp_sgd_rdp`.
    """
    curve = dp_sgd_rdp(q, noise_multiplier, steps, sampler)
    if sampler == "poisson":
        return Cost.rdp(curve.tolist())
    return Cost.continuous_gaussian(_count("steps", steps) / (2.0 * float(noise_multiplier) ** 2))


# --------------------------------------------------------------------------------------
# membership-attack bounds (issue 23: choosing a cap)
# --------------------------------------------------------------------------------------


def dp_attack_curve(epsilon: float, delta: float, false_positive_rates: Sequence[float]) -> np.ndarray:
    """:func:`max_true_positive_rate` at each FPR: the (ε, δ)-DP region's upper face,
    TPR ≤ min(1, e^ε·FPR + δ, 1 − e^−ε·(1 − δ − FPR)) ([KOV15] Thm. 2.1).

    Raises:
        ValueError: bad ε, δ or an FPR outside [0, 1].
    """
    return np.asarray([max_true_positive_rate(epsilon, delta, f) for f in false_positive_rates])


def gdp_mu(rho: float) -> float:
    """μ of a composition of *continuous* Gaussian mechanisms with total ρ: μ = √(2ρ).

    One Gaussian mechanism with sensitivity Δ and noise σ is μ = Δ/σ Gaussian DP
    ([DRS22] Thm. 2.7) and has ρ = Δ²/(2σ²) ([BS16] Prop. 1.6); μ-GDP mechanisms compose to
    √(Σμ_i²)-GDP ([DRS22] Cor. 3.3), so Σρ_i = ρ gives μ = √(2ρ). Not valid for the discrete
    Gaussian (use :func:`zcdp_true_positive_rate`).

    Raises:
        ValueError: ρ NaN, negative or infinite.
    """
    return math.sqrt(2.0 * _nonneg("rho", rho))


def gdp_true_positive_rate(mu: float, false_positive_rate: float) -> float:
    """Largest TPR of any membership test at a given FPR against a μ-GDP release:
    TPR = Φ(Φ⁻¹(FPR) + μ), i.e. 1 − G_μ(FPR) for the trade-off function
    G_μ(α) = Φ(Φ⁻¹(1 − α) − μ) of testing N(0, 1) against N(μ, 1) ([DRS22] Sec. 2.3, Def. 2.6).
    Tight: the Gaussian mechanism attains it.

    Args:
        mu: μ ≥ 0 (``math.inf``: returns 1 for FPR > 0).
        false_positive_rate: FPR in [0, 1].

    Raises:
        ValueError: bad argument (named).
    """
    from scipy.stats import norm

    m = _nonneg("mu", mu, allow_inf=True)
    f = _real("false_positive_rate", false_positive_rate)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
    if f == 0.0:
        return 0.0
    if f == 1.0 or math.isinf(m):
        return 1.0
    return float(norm.cdf(norm.ppf(f) + m))


#: δ' values of the (ε(δ'), δ') family :func:`zcdp_true_positive_rate` and
#: :func:`rdp_true_positive_rate` intersect (any δ' gives a valid bound; more only tightens).
_ATTACK_DELTAS: tuple[float, ...] = tuple(10.0 ** (-k / 4.0) for k in range(4, 4 * 16 + 1))


def _family_tpr(eps_of_delta: Callable[[float], float], f: float, upper: float) -> float:
    best = upper
    for d in _ATTACK_DELTAS:
        if d >= best:
            continue  # the bound is at least δ': no smaller δ' can help below it either
        best = min(best, max_true_positive_rate(eps_of_delta(d), d, f))
    return best


def _family_table(eps_of_delta: Callable[[float], float]) -> list[tuple[float, float]]:
    """(δ', ε(δ')) for every δ' of :data:`_ATTACK_DELTAS` (computed once for a whole curve)."""
    return [(d, eps_of_delta(d)) for d in _ATTACK_DELTAS]


def _table_tpr(table: Sequence[tuple[float, float]], f: float, upper: float) -> float:
    best = upper
    for d, e in table:
        if d < best:
            best = min(best, max_true_positive_rate(e, d, f))
    return best


def rdp_true_positive_rate(curve: Sequence[float], false_positive_rate: float,
                           orders: Sequence[float] = ORDERS) -> float:
    """An upper bound on the TPR of any membership test at a given FPR against a release
    whose (total) RDP curve is ``curve``.

    The minimum of two valid bounds:

    * Mironov's probability-preservation bound ([Mir17] Prop. 10): for an (α, ε(α))-RDP
      mechanism and any event E, P(E) ≤ (e^{ε(α)}·Q(E))^{(α−1)/α}; with E the test's
      rejection region, TPR ≤ min_α (e^{ε(α)}·FPR)^{(α−1)/α};
    * the intersection of the (ε(δ'), δ')-DP regions ([KOV15] Thm. 2.1) for δ' on a log grid
      (1e-1 … 1e-16), ε(δ') by the RDP conversion of [BBG+20] Thm. 21
      (:func:`rdp_epsilon_tight`): the mechanism satisfies every one of them at once.

    Args:
        curve: ε(α) ≥ 0 at ``orders`` (total; +∞ allowed).
        false_positive_rate: FPR in [0, 1].
        orders: ascending orders > 1 (default :data:`ORDERS`).

    Returns:
        TPR bound in [FPR, 1].

    Raises:
        ValueError: bad curve, orders or FPR.
    """
    a = _orders(orders)
    c = _curve(curve, a)
    f = _real("false_positive_rate", false_positive_rate)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
    if f == 0.0 or f == 1.0:
        return f
    best = 1.0
    for alpha, e in zip(a.tolist(), c.tolist()):
        if math.isinf(e):
            continue
        expo = 1.0 if math.isinf(alpha) else (alpha - 1.0) / alpha
        best = min(best, math.exp(min(0.0, expo * (e + math.log(f)))))
    fin = np.isfinite(a)
    if np.isfinite(c[fin]).any():
        best = _family_tpr(lambda d: rdp_epsilon_tight(c[fin], d, a[fin]), f, best)
    return max(f, best)


def rdp_attack_curve(curve: Sequence[float], false_positive_rates: Sequence[float],
                     orders: Sequence[float] = ORDERS) -> np.ndarray:
    """:func:`rdp_true_positive_rate` at each FPR (the (ε(δ'), δ') family converted once).

    Raises:
        ValueError: as :func:`rdp_true_positive_rate`.
    """
    a = _orders(orders)
    c = _curve(curve, a)
    fin = np.isfinite(a)
    table = _family_table(lambda d: rdp_epsilon_tight(c[fin], d, a[fin])) if np.isfinite(c[fin]).any() else []
    out = []
    for fpr in false_positive_rates:
        f = _real("false_positive_rate", fpr)
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
        if f in (0.0, 1.0):
            out.append(f)
            continue
        best = 1.0
        for alpha, e in zip(a.tolist(), c.tolist()):
            if not math.isinf(e):
                expo = 1.0 if math.isinf(alpha) else (alpha - 1.0) / alpha
                best = min(best, math.exp(min(0.0, expo * (e + math.log(f)))))
        out.append(max(f, _table_tpr(table, f, best)))
    return np.asarray(out)


def zcdp_attack_curve(rho: float, false_positive_rates: Sequence[float]) -> np.ndarray:
    """:func:`zcdp_true_positive_rate` at each FPR (the (ε(δ'), δ') family converted once).

    Raises:
        ValueError: as :func:`zcdp_true_positive_rate`.
    """
    r = _nonneg("rho", rho)
    table = _family_table(lambda d: zcdp_epsilon_tight(r, d)) if r > 0 else []
    out = []
    for fpr in false_positive_rates:
        f = _real("false_positive_rate", fpr)
        if not 0.0 <= f <= 1.0:
            raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
        if f in (0.0, 1.0) or r == 0.0:
            out.append(f)
            continue
        log_f = math.log(f)
        alpha = max(1.0 + 1e-12, math.sqrt(-log_f / r))
        best = math.exp(min(0.0, (alpha - 1.0) * (r + log_f / alpha)))
        out.append(max(f, _table_tpr(table, f, best)))
    return np.asarray(out)


def zcdp_true_positive_rate(rho: float, false_positive_rate: float) -> float:
    """An upper bound on the TPR of any membership test at a given FPR against a ρ-zCDP
    release (our discrete Gaussian releases; any history of ρ-costs).

    ρ-zCDP is (α, αρ)-RDP at every α > 1 ([BS16] Def. 1.1), so the two bounds of
    :func:`rdp_true_positive_rate` apply, evaluated in closed form: Mironov's bound
    TPR ≤ min_α exp((α−1)(ρ + log(FPR)/α)), minimised at α = √(log(1/FPR)/ρ) (if > 1), and the
    intersection of the (ε(δ'), δ') regions with ε(δ') the [CKS20] Cor. 13 conversion
    (:func:`zcdp_epsilon_tight`). This is the bound for discrete-Gaussian histories: the
    discrete Gaussian is ρ-zCDP ([CKS20] Thm. 4) but is not shown μ-GDP, so the tighter
    Gaussian trade-off curve (:func:`gdp_true_positive_rate`) is not claimed for it.

    Args:
        rho: total ρ ≥ 0.
        false_positive_rate: FPR in [0, 1].

    Raises:
        ValueError: bad argument (named).
    """
    r = _nonneg("rho", rho)
    f = _real("false_positive_rate", false_positive_rate)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"false_positive_rate must be in [0, 1], got {f!r}")
    if f == 0.0 or f == 1.0 or r == 0.0:
        return f
    log_f = math.log(f)
    alpha = max(1.0 + 1e-12, math.sqrt(-log_f / r))
    best = math.exp(min(0.0, (alpha - 1.0) * (r + log_f / alpha)))
    best = _family_tpr(lambda d: zcdp_epsilon_tight(r, d), f, best)
    return max(f, best)


def periods_epsilon(rho_per_period: float, periods: int, delta: float,
                    conversion: Conversion = "simple") -> float:
    """ε at δ lost by a unit present in every one of ``periods`` periods, when each period
    spends ``rho_per_period`` (what "renewing" a ρ budget every period really costs).

    Composition: n·ρ-zCDP ([BS16] Lemma 2.3), converted by ``conversion`` (default "simple",
    [BS16] Prop. 1.3, as the seed states the example: ρ 0.1 a month at δ 1e-6 is ε 2.45 a
    month, ε 9.34 after 12 months and 17.70 after 36; "tight" is [CKS20] Cor. 13, the
    conversion the ledger reports spend with).

    Raises:
        ValueError: bad argument (named).
    """
    n = _count("periods", periods)
    return zcdp_epsilon(n * _positive("rho_per_period", rho_per_period), delta, conversion)
