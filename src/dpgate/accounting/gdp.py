"""Gaussian differential privacy (μ-GDP): the exact (ε, δ) of μ, a cap's μ, the discrete Gaussian's μ.

Part of :mod:`dpgate.accounting` (see its docstring for conventions). μ is dimensionless (the
mean shift, in standard deviations, of the Gaussian pair N(0, 1) vs N(μ, 1) that the
mechanism's trade-off function dominates).

* **Exact conversion** ([DRS22] Cor. 2.13): μ-GDP ⟺ (ε, δ_μ(ε))-DP for every ε ≥ 0 with
  ``δ_μ(ε) = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)`` (:func:`gdp_delta`); no RDP conversion is
  tighter for a Gaussian history, since this one is exact.
* **Composition** ([DRS22] Cor. 3.3): μ_i-GDP mechanisms compose to √(Σμ_i²)-GDP, and
  under full adaptivity (the privacy parameters chosen from the past outputs) the
  *filter* "stop before Σμ_i² would exceed μ²" is μ-GDP ([ST22] Thm. 1.2).
* **The discrete Gaussian** (what dpgate samples, through OpenDP) is not exactly GDP:
  :func:`discrete_gaussian_unit_mu` gives a μ that dominates its trade-off function for a
  unit shift, with the proof argument in its docstring; :func:`discrete_gaussian_mu` the
  μ of a release of several integer vectors with L2 sensitivities Δ₂ and scales σ.

References
----------
[DRS22] J. Dong, A. Roth, W. Su. Gaussian Differential Privacy. JRSS-B 2022 (arXiv:1905.02383).
[ST22]  A. Smith, A. Thakurta. Fully Adaptive Composition for Gaussian Differential Privacy.
        2022 (arXiv:2210.17520).
[CKS20] C. Canonne, G. Kamath, T. Steinke. The Discrete Gaussian for Differential Privacy.
        NeurIPS 2020 (arXiv:2004.00010).
[KOV15] P. Kairouz, S. Oh, P. Viswanath. The Composition Theorem for Differential Privacy. ICML 2015.
"""

from __future__ import annotations

import math
from typing import Iterable

from scipy.optimize import brentq
from scipy.special import erfinv, log_ndtr, ndtri

from dpgate.accounting.conversions import gaussian_epsilon_exact
from dpgate.accounting.orders import _delta, _nonneg, _positive

__all__ = [
    "DISCRETE_GAUSSIAN_MIN_SIGMA",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu_for_cap",
    "discrete_gaussian_unit_mu",
    "discrete_gaussian_mu",
    "pure_dp_mu",
]

#: The smallest scale σ (integer units) for which :func:`discrete_gaussian_unit_mu` claims a μ:
#: below it a primitive's charge has no GDP bound here (it is ρ ≥ 1/2 for a shift of one unit).
DISCRETE_GAUSSIAN_MIN_SIGMA = 1.0

#: Relative safety margin on the discrete Gaussian's μ (covers the float error of ``erfinv``
#: and of the products; the proven bound is smaller than the margin by far more than that).
_MU_MARGIN = 1e-9


def gdp_delta(mu: float, epsilon: float) -> float:
    """δ at ``epsilon`` of a μ-GDP mechanism, exactly ([DRS22] Cor. 2.13).

    ``δ = Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)``, computed from ``log Φ`` (no cancellation in the
    far tail). Equal to the [BW18] analytic Gaussian's δ with ρ = μ²/2.

    Args:
        mu: μ ≥ 0 (total, composed).
        epsilon: ε ≥ 0.

    Returns:
        δ in [0, 1) (0 for μ = 0).

    Raises:
        ValueError: μ or ε NaN or negative.
    """
    m = _nonneg("mu", mu)
    e = _nonneg("epsilon", epsilon, allow_inf=True)
    if m == 0.0 or math.isinf(e):
        return 0.0
    if math.isinf(m):
        return 1.0
    la = float(log_ndtr(-e / m + m / 2.0))
    lb = float(log_ndtr(-e / m - m / 2.0))
    diff = e + lb - la  # log(e^ε Φ(b) / Φ(a)) < 0
    if diff >= 0.0:  # pragma: no cover - rounding at the edge
        return 0.0
    return max(0.0, math.exp(la) * -math.expm1(diff))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε with ``gdp_delta(μ, ε) ≤ δ``: the exact (ε, δ) of a μ-GDP history.

    This is :func:`dpgate.accounting.gaussian_epsilon_exact` at ρ = μ²/2 (the [BW18] analytic
    Gaussian, the same curve as [DRS22] Cor. 2.13).

    Args:
        mu: μ ≥ 0 (total).
        delta: δ in [0, 1).

    Raises:
        ValueError: μ NaN or negative; δ outside [0, 1).
    """
    m = _nonneg("mu", mu)
    return gaussian_epsilon_exact(m * m / 2.0, delta)


def gdp_mu_for_cap(epsilon: float, delta: float) -> float:
    """The largest μ whose exact conversion meets the cap: ``gdp_delta(μ, ε) ≤ δ``.

    δ_μ(ε) is increasing in μ (G_μ decreases pointwise in μ: a larger shift is easier to
    test), so the root of δ_μ(ε) = δ is unique; Brent's method on it, then steps down by ulps until
    :func:`gdp_delta` (as computed) is at most δ.

    Args:
        epsilon: ε > 0 (the cap's, total).
        delta: δ in (0, 1) (the part of the cap's δ the Gaussian charges may use).

    Returns:
        μ_cap > 0.

    Raises:
        ValueError: ε not finite and > 0; δ not in (0, 1).
    """
    e = _positive("epsilon", epsilon)
    d = _delta(delta)
    if math.isinf(e) or d <= 0.0:
        raise ValueError("epsilon must be finite and delta in (0, 1)")
    lo, hi = 0.5, 1.0
    while gdp_delta(hi, e) < d:
        hi *= 2.0
    while lo > 1e-300 and gdp_delta(lo, e) > d:
        lo /= 2.0
    mu = brentq(lambda m: math.log(max(gdp_delta(m, e), 1e-320)) - math.log(d), lo, hi, xtol=1e-15,
                rtol=4.5 * 2.220446049250313e-16)
    while mu > 0.0 and gdp_delta(mu, e) > d:
        mu = math.nextafter(mu, 0.0)
    return float(mu)


def discrete_gaussian_unit_mu(sigma: float) -> float:
    """A μ that dominates the trade-off function of N_Z(0, σ²) vs N_Z(k, σ²) per unit of |k|.

    Claim: for every integer k, T(N_Z(0, σ²), N_Z(k, σ²)) ≥ G_{|k|·μ₁(σ)} with
    ``μ₁(σ) = 2·Φ⁻¹(1/2 + 1/(2√(2π)·σ)) = 2√2·erfinv(1/(√(2π)·σ))`` (times 1 + 1e-9), for
    σ ≥ :data:`DISCRETE_GAUSSIAN_MIN_SIGMA`. μ₁(σ)·σ − 1 ≈ 1/(24σ²) (5·10⁻⁴ at σ = 9).

    Argument (N_Z the discrete Gaussian of [CKS20] Def. 1; F its CDF; X ~ N_Z(0, σ²)):

    1. *Vertices.* The likelihood ratio of N_Z(k, σ²) to N_Z(0, σ²) is monotone in x, so the
       Neyman–Pearson tests are thresholds "x ≥ c" (randomised at c) and the trade-off
       function is the piecewise-linear interpolation of the points
       (α_c, β_c) = (P[X ≥ c], P[X < c − k]), c ∈ Z. G_μ is convex, so a chord between two
       points on or above it stays above it: T ≥ G_μ iff every vertex is, i.e. iff
       Φ⁻¹(F(c−1)) − Φ⁻¹(F(c−1−k)) ≤ μ for every c (G_μ(α) = Φ(Φ⁻¹(1−α) − μ), [DRS22]
       Sec. 2.4).
    2. *Telescoping.* With D(m) = Φ⁻¹(F(m)) − Φ⁻¹(F(m−1)), the k-step difference is a sum of
       k increments, so μ = k·sup_m D(m) suffices.
    3. *The central increment.* By symmetry F(−1) = 1 − F(0), so D(0) = 2Φ⁻¹(F(0)) with
       F(0) = (1 + p(0))/2 and p(0) = 1/Σ_x e^{−x²/(2σ²)} ≤ 1/(√(2π)σ) (Poisson summation:
       Σ_x e^{−x²/(2σ²)} = √(2π)σ·(1 + 2Σ_{j≥1} e^{−2π²σ²j²}) ≥ √(2π)σ). Φ⁻¹ is increasing,
       so D(0) ≤ μ₁(σ) (proven).
    4. *Every other increment is smaller*: sup_m D(m) = D(0). This step is checked
       numerically, not proven: ``tests/test_accounting_gdp.py`` sums the pmf in log space (support
       ±(40σ + 40), beyond which the mass is below e⁻⁸⁰⁰) for σ on a grid in [1, 40] and at
       random σ in [1, 30], checks every vertex whose α and β exceed e⁻⁷⁰⁰ (for k = 1, 2, 3),
       and finds the maximum at the centre each time (equal to μ₁(σ) to 1e-7). The far tail
       (α or β below e⁻⁷⁰⁰) is not checked; the asymptotic argument that follows covers it. An
       asymptotic expansion of the tail (log P[X > m] = −(m+1)²/(2σ²) − log(√(2π)σ) + …)
       gives D(m) − 1/σ ≈ σ(log(m/σ²) − 1)/m², at most ≈ 0.025/σ³ (at m ≈ 4.5σ²) against
       D(0) − 1/σ ≈ 0.042/σ³, and → 0 as m → ∞, so the maximum stays at the centre for
       large σ too.

    For σ ≥ 1 the bound is monotone: σ·μ₁(σ) = Φ⁻¹(1/2 + t)/(√(2π)·t) with t = 1/(2√(2π)σ)
    is increasing in t (Φ⁻¹ is convex on [1/2, 1) and 0 at 1/2), i.e. decreasing in σ.

    Args:
        sigma: the discrete Gaussian's scale σ (integer units), > 0.

    Returns:
        μ₁(σ), or ``math.inf`` for σ < :data:`DISCRETE_GAUSSIAN_MIN_SIGMA` (no claim).

    Raises:
        ValueError: σ NaN or ≤ 0.
    """
    s = _positive("sigma", sigma)
    if s < DISCRETE_GAUSSIAN_MIN_SIGMA:
        return math.inf
    if math.isinf(s):
        return 0.0
    return float(2.0 * math.sqrt(2.0) * erfinv(1.0 / (math.sqrt(2.0 * math.pi) * s))) * (1.0 + _MU_MARGIN)


def discrete_gaussian_mu(primitives: Iterable[tuple[float, float]]) -> float:
    """μ of one release that adds N_Z(0, σ_i²) noise to integer vectors of L2 sensitivity Δ₂_i.

    ``μ = √(Σ_i (Δ₂_i·μ₁(σ_i))²)`` with μ₁ = :func:`discrete_gaussian_unit_mu`; a primitive
    with Δ₂ = 0 is exact and contributes 0. Why: a primitive's neighbouring shift is an integer
    vector v with ‖v‖₂ ≤ Δ₂ (its coordinates are noised independently); coordinate j is the
    pair of :func:`discrete_gaussian_unit_mu` with k = v_j, so it is |v_j|·μ₁-GDP, and GDP
    composes exactly over independent coordinates and primitives ([DRS22] Thm. 3.2 — composition
    is monotone in the trade-off functions — and Cor. 3.3: G_a ⊗ G_b = G_√(a²+b²)), giving
    ‖v‖₂·μ₁ ≤ Δ₂·μ₁ per primitive. This is the multivariate case as a product of 1-D pairs
    (the noise is i.i.d. per coordinate, [CKS20] Sec. 2), not the 1-D bound applied to Δ₂.

    Args:
        primitives: (Δ₂, σ) pairs in integer units (Δ₂ ≥ 0; σ > 0 where Δ₂ > 0).

    Returns:
        μ ≥ 0, or ``math.inf`` if a noisy primitive has σ < :data:`DISCRETE_GAUSSIAN_MIN_SIGMA`.

    Raises:
        ValueError: a negative or NaN Δ₂, or σ ≤ 0 with Δ₂ > 0.
    """
    total = 0.0
    for l2, sigma in primitives:
        d = _nonneg("l2_sensitivity", l2)
        if d == 0.0:
            continue
        m = d * discrete_gaussian_unit_mu(sigma)
        if math.isinf(m):
            return math.inf
        total += m * m
    return math.sqrt(total) * (1.0 + _MU_MARGIN)


def pure_dp_mu(epsilon: float) -> float:
    """The smallest μ such that every ε-DP mechanism is μ-GDP: ``μ = 2·Φ⁻¹(e^ε/(1 + e^ε))``.

    Every ε-DP pair's trade-off function is ≥ f_ε(α) = max(0, 1 − e^ε·α, e^{−ε}(1 − α))
    ([DRS22] Sec. 2.3, the (ε, 0) trade-off function; randomised response's, [KOV15] Thm. 2.1), which is
    piecewise linear with one vertex at α = β = 1/(1 + e^ε). G_μ is convex with G_μ(0) = 1 and
    G_μ(1) = 0, so f_ε ≥ G_μ iff the vertex is above it: Φ(Φ⁻¹(1 − α) − μ) ≤ α, i.e.
    μ ≥ Φ⁻¹(1 − α) − Φ⁻¹(α) = 2Φ⁻¹(e^ε/(1 + e^ε)). Randomised response attains it, so no smaller
    μ is valid for every ε-DP mechanism. (Times 1 + 1e-9 against rounding.)

    Args:
        epsilon: ε ≥ 0 (pure, total for the charge).

    Returns:
        μ ≥ 0 (∞ for ε = ∞).

    Raises:
        ValueError: ε NaN or negative.
    """
    e = _nonneg("epsilon", epsilon, allow_inf=True)
    if math.isinf(e):
        return math.inf
    # e^ε/(1+e^ε) = 1/(1+e^−ε); Φ⁻¹ of it from the small tail 1/(1+e^ε) (no cancellation)
    return float(-2.0 * ndtri(1.0 / (1.0 + math.exp(e)))) * (1.0 + _MU_MARGIN) if e < 700 else math.inf
