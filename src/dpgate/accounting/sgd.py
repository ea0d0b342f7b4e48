"""DP-SGD: the Rényi DP of the Poisson-subsampled Gaussian mechanism.

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.special import log_ndtr

from dpgate.accounting.cost import Cost
from dpgate.accounting.orders import ORDERS, _count, _orders, _positive, _real, gaussian_rdp


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
