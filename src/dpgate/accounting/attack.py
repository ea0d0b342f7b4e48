"""Hypothesis-testing views of a guarantee: attack curves (TPR at FPR) and periods.

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from dpgate.accounting.composition import max_true_positive_rate
from dpgate.accounting.conversions import rdp_epsilon_tight, zcdp_epsilon, zcdp_epsilon_tight
from dpgate.accounting.orders import Conversion, ORDERS, _count, _curve, _nonneg, _orders, _positive, _real


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
