"""How a ``rho``/``epsilon`` budget is split over a query's noisy primitives (issue 22 item 5).

A release of n noisy primitives with budget ρ may give primitive i any ρ_i ≥ 0 with Σ ρ_i = ρ:
by composition ([BS16] Lemma 2.3; pure ε: [DR14] Thm. 3.16) the release costs ρ whatever the
split. The split only moves accuracy between primitives, so it is chosen to minimise the error
of the *released outputs*, using only data-independent quantities (policy bounds, resolution,
the sensitivities from k and m) — never data.

**Objective.** Each output o (COUNT, SUM, AVG, VAR_POP, STDDEV_POP) has, to first order (the
delta method), a noise variance V_o = Σ_i a_oi·Var(Z_i) over its primitives i, where Z_i is the
primitive's noise in integer units: discrete Gaussian Var(Z_i) ≤ σ_i² = Δ_i²/(2ρ_i) ([CKS20]
Thm. 4 calibration; the discrete Gaussian's variance is below σ², [CKS20] Cor. 18); discrete
Laplace Var(Z_i) ≈ 2b_i² = 2Δ_i²/ε_i². Outputs have different units, so each is measured
relative to its variance under the equal split, V_o(ρ/n, …) ∝ Σ_i a_oi·Δ_i², and the split
minimises

    F(ρ) = Σ_o V_o(ρ) / Σ_j a_oj Δ_j²  =  Σ_i c_i·Δ_i²/ρ_i  (up to a constant),
    c_i = Σ_o a_oi / Σ_j a_oj Δ_j²,

summed over the outputs that use i: **a primitive shared by several outputs counts once**, with
the sum of their weights. For a single output F is its own variance; for several, their mean
inflation relative to the equal split, so F(optimal) ≤ F(equal) = n·(number of outputs) always.

**Gaussian (ρ).** Minimise Σ c_i Δ_i²/ρ_i subject to Σ ρ_i = ρ: the Lagrangian gives
−c_i Δ_i²/ρ_i² + λ = 0, so ρ_i = ρ·√c_i Δ_i / Σ_j √c_j Δ_j (convex, hence the minimum), and
F = (Σ_i √c_i Δ_i)²/ρ, against n·Σ c_i Δ_i²/ρ for the equal split (≥ by Cauchy–Schwarz).

**Laplace (ε).** Minimise Σ c_i Δ_i²/ε_i² subject to Σ ε_i = ε: −2c_i Δ_i²/ε_i³ + λ = 0, so
ε_i ∝ (c_i Δ_i²)^{1/3}.

**Coefficients a_oi** (output units, u_i = the primitive's unit: 1 for counts, the resolution r
for a sum, r² for a sum of squares; N the group's count, dropped since it scales all of an
output's terms alike):

* COUNT, SUM: a = u² on its one primitive (a lone primitive's weight does not matter).
* AVG = S/N: Var ≈ (σ_S² + (S/N)²·σ_N²)/N², so a_S = u_S², a_N = E[μ²].
* VAR_POP = Q/N − (S/N)²: the gradient (1/N, −2μ/N, (2μ² − q)/N) with μ = S/N, q = Q/N gives
  a_Q = u_Q², a_S = 4E[μ²]·u_S², a_N = E[(2μ² − q)²]. STDDEV_POP = √VAR scales the variance's
  error by 1/(2√v), the same factor for all three terms: the same split.

**The data-independent μ.** The mean of the group is not known before the release. The worst
case |μ| ≤ B = max(|lo|, |hi|) makes the AVG split *equal*: the sum's sensitivity is B·Δ_N
(:mod:`dpgate.sensitivity`, the sum is of raw clamped values), so √c_S Δ_S = B·Δ_N = √c_N Δ_N —
the equal split is minimax-optimal for AVG. dpgate instead minimises the variance *averaged
over a uniform design prior* on the ratios within their bounds: μ ~ U[lo, hi] and
q ~ U[q_lo, q_hi] (q_lo = 0 when lo ≤ 0 ≤ hi, else min(lo², hi²); q_hi = max(lo², hi²)),
independent, so E[μ²] = (lo² + lo·hi + hi²)/3 and E[(2μ² − q)²] = 4E[μ⁴] − 4E[μ²]E[q] + E[q²]
with E[u^k] = (b^{k+1} − a^{k+1})/((k+1)(b − a)) for u ~ U[a, b]. Bounds are declared wide in
practice (a mean near a bound is rare), and the prior is a function of the policy only.
Example: bounds [0, 100], m = k = 1 (Δ_S = 100, Δ_N = 1 in output units): E[μ²] = 10⁴/3,
ρ_S : ρ_N = 100 : 100/√3 = √3 : 1, i.e. ρ_S = ρ(3 − √3)/2 ≈ 0.634ρ, ρ_N = ρ(√3 − 1)/2 ≈
0.366ρ. At a mean at the bound the AVG's variance is then (1/0.634 + 1/0.366)/4 ≈ 1.077× the
equal split's (the price of not being minimax); at a mean of a tenth of the bound it is ≈ 0.79×.

Primitives that no output weighs (none today: every noisy primitive belongs to an aggregate
output), and weights that overflow a float (bounds near ±1.8e308, where E[μ⁴] has no float),
make the whole query fall back to the equal split, so no primitive is ever starved.

References: [BS16] Bun & Steinke, TCC 2016; [DR14] Dwork & Roth 2014; [CKS20] Canonne, Kamath
& Steinke, NeurIPS 2020.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from dpgate.postprocess.calibration import CellTarget

__all__ = ["RULE", "output_coefficients", "predicted_variance", "split_weights"]

#: The split's name in explain documents.
RULE = "optimal"

_COUNTS = ("count", "count_column", "count_distinct_unit", "count_distinct")


def _moment(a: float, b: float, k: int) -> float:
    """E[u^k] for u ~ U[a, b] (a ≤ b; a point mass when a == b)."""
    if b - a <= 0:
        return a ** k
    return (b ** (k + 1) - a ** (k + 1)) / ((k + 1) * (b - a))


def _mean_priors(bounds: tuple[float, float]) -> tuple[float, float]:
    """(E[μ²], E[(2μ² − q)²]) under the uniform design priors of the module docstring."""
    lo, hi = bounds
    m2, m4 = _moment(lo, hi, 2), _moment(lo, hi, 4)
    q_lo = 0.0 if lo <= 0.0 <= hi else min(lo * lo, hi * hi)
    q_hi = max(lo * lo, hi * hi)
    q1, q2 = _moment(q_lo, q_hi, 1), _moment(q_lo, q_hi, 2)
    return m2, max(0.0, 4.0 * m4 - 4.0 * m2 * q1 + q2)


def output_coefficients(target: CellTarget, units: Mapping[str, float]) -> dict[str, float]:
    """An output's a_oi: primitive id → its weight in the output's first-order noise variance.

    Args:
        target: the output (function, primitives in :data:`dpgate.sql.plan.FUNCTION_PRIMITIVES`
            order, bounds for the ratios).
        units: primitive id → output units per integer step.

    Returns:
        primitive id → a_oi ≥ 0 (output units² per integer unit² of noise variance); empty for
        an output whose form is not one of the module docstring's (it then weighs nothing).
    """
    f, prims = target.function, target.primitives
    if f in _COUNTS or f == "sum":
        return {prims[0]: units[prims[0]] ** 2} if len(prims) == 1 else {}
    if target.bounds is None:
        return {}
    try:
        m2, n_coef = _mean_priors(target.bounds)
    except OverflowError:  # bounds near the float limit: no weight, the query splits equally
        return {}
    if f == "avg" and len(prims) == 2:
        s, n = prims
        return {s: units[s] ** 2, n: m2 * units[n] ** 2}
    if f in ("var_pop", "stddev_pop") and len(prims) == 3:
        q, s, n = prims
        return {q: units[q] ** 2, s: 4.0 * m2 * units[s] ** 2, n: n_coef * units[n] ** 2}
    return {}


def split_weights(targets: Sequence[CellTarget], sensitivities: Mapping[str, float],
                  units: Mapping[str, float]) -> dict[str, float] | None:
    """The c_i of the module docstring: primitive id → weight, or None for the equal split.

    Args:
        targets: the query's aggregate outputs (hidden ones included).
        sensitivities: primitive id → the mechanism's d_in (Δ2 Gaussian, Δ1 Laplace), integer
            units, ≥ 0 (0: exact, not split).
        units: primitive id → output units per integer step.

    Returns:
        c_i > 0 for every primitive of positive sensitivity, or None when some such primitive
        has no positive weight (then :func:`dpgate.mechanisms.calibrate` splits equally).
    """
    weights: dict[str, float] = {}
    for t in targets:
        a = {p: v for p, v in output_coefficients(t, units).items() if sensitivities.get(p, 0.0) > 0}
        norm = math.fsum(v * sensitivities[p] ** 2 for p, v in a.items())
        if not norm > 0 or not math.isfinite(norm):
            continue
        for p, v in a.items():
            weights[p] = weights.get(p, 0.0) + v / norm
    noisy = [p for p, d in sensitivities.items() if d > 0]
    if not noisy or any(not weights.get(p, 0.0) > 0 or not math.isfinite(weights[p]) for p in noisy):
        return None
    return {p: weights[p] for p in noisy}


def predicted_variance(targets: Sequence[CellTarget], sensitivities: Mapping[str, float],
                       units: Mapping[str, float], shares: Mapping[str, float], *,
                       gaussian: bool = True) -> dict[str, float]:
    """Each output's prior-averaged first-order noise variance at ``shares`` (times N², output units²).

    Var(Z_i) = Δ_i²/(2ρ_i) (Gaussian) or 2Δ_i²/ε_i² (Laplace); a primitive of share 0 and
    sensitivity 0 contributes nothing. For comparing splits (tests, explain), not a reported ±.
    """
    out: dict[str, float] = {}
    for t in targets:
        total = 0.0
        for p, a in output_coefficients(t, units).items():
            d = sensitivities.get(p, 0.0)
            if d > 0:
                total += a * (d * d / (2.0 * shares[p]) if gaussian else 2.0 * d * d / shares[p] ** 2)
        out[t.name] = total
    return out
