"""(ε, δ) composition helpers: basic, advanced, group privacy, subsampling, attack bounds.

Part of :mod:`dpgate.accounting` (see its docstring for conventions and references).
"""

from __future__ import annotations

import math
from typing import Iterable


from dpgate.accounting.orders import _count, _delta, _nonneg, _real


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


