"""A DP choice among ordered candidates with a public geometric prior: the mechanism private
truncation's row cap (:mod:`dpgate.private_truncation`) and its per-unit sum clamps
(:mod:`dpgate.private_sum_clamp`) share, each with its own prior slope λ.

The score of candidate i is the quantile score of the per-unit histogram (:func:`dpgate.quantiles.scores`,
McKenna & Sheldon's ``make_quantile_score_candidates``) shifted by the public penalty ``round(λ·s·i)``;
OpenDP's noisy max (:func:`dpgate.mechanisms.selection.noisy_argmin`) selects. A public shift leaves
Δ∞ unchanged, so the cost is the exponential mechanism's: scale s = 2Δ∞/ε, ρ = ε²/8 (Cesar & Rogers
2021, Lemma 3.2, ε-DP implies ε²/8-zCDP for the exponential mechanism), widened until OpenDP's privacy
map is ≤ the share (:func:`~dpgate.mechanisms.selection.noisy_max_within`). Its 95 % rank error is at
most s_r·(ln((1/(1 − e^−λ))/0.05) + (C − 1)·λ) for C candidates and rank scale s_r = s/den (the
Gumbel tail of the noisy max plus the prior's worst shift).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpgate.errors import InvalidBudget
from dpgate.mechanisms import selection as selection_mechanisms
from dpgate.private_bounds import BoundsGrid, BoundsNoise, Measure
from dpgate.quantiles import alpha_fraction, score_sensitivity, scores

__all__ = ["calibrate", "choose_index", "min_share", "penalties", "rank_factor"]


def rank_factor(size: int, slope: float, beta: float = 0.05) -> float:
    """F = ln((1/(1 − e^−λ))/β) + (C − 1)·λ: the 1 − β rank error in rank scales, C = ``size``."""
    return math.log(1.0 / (1.0 - math.exp(-slope)) / beta) + (int(size) - 1) * slope


def penalties(noise: BoundsNoise, slope: float) -> np.ndarray:
    """The public score shifts ``round(λ·s·i)`` (int64, one per candidate)."""
    return np.rint(slope * noise.scale * np.arange(noise.grid.size)).astype(np.int64)


def calibrate(name: str, g: BoundsGrid, quantile: float, measure: Measure, share: float, slope: float,
              refusal: tuple[str, dict[str, Any]]) -> BoundsNoise:
    """Scale and cost of the choice at ``share`` (ρ for ``"zcdp"``, ε for ``"pure"``).

    Raises:
        InvalidBudget: ``refusal`` (message, details), when the share is so small that the scale is
            not finite.
    """
    num, den = alpha_fraction(repr(float(quantile)))
    delta_inf = score_sensitivity(num, den, 1)  # one element per unit
    eps = math.sqrt(8.0 * share) if measure == "zcdp" else float(share)
    scale = 2.0 * delta_inf / eps if eps > 0 else math.inf
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidBudget(*refusal)
    scale, mapped = selection_mechanisms.noisy_max_within(measure, scale, delta_inf, share)
    return BoundsNoise(name, g, num, den, measure, delta_inf, scale, mapped,
                       float(scale / den) * rank_factor(g.size, slope))


def min_share(size: int, quantile: float, measure: Measure, max_rank_error: float, slope: float) -> float:
    """The smallest share whose choice over ``size`` candidates has a 95 % rank error ≤
    ``max_rank_error`` units: ε = 2Δ∞·F/(den·r), ρ = ε²/8."""
    num, den = alpha_fraction(repr(float(quantile)))
    eps = 2.0 * score_sensitivity(num, den, 1) * rank_factor(size, slope) / (den * float(max_rank_error))
    return eps * eps / 8.0 if measure == "zcdp" else eps


def choose_index(noise: BoundsNoise, hist: Any, slope: float) -> int:
    """The index of the candidate OpenDP's noisy max selects on the shifted scores of ``hist``
    (int64 counts of the per-unit elements, one per candidate).

    Raises:
        ValueError: the histogram does not have one cell per candidate.
    """
    h = np.asarray(hist, dtype=np.int64)
    if h.shape != (noise.grid.size,):
        raise ValueError(f"the histogram has {h.shape} cells, the grid {noise.grid.size} candidates")
    shifted = scores(h, noise.num, noise.den) + penalties(noise, slope)  # a public shift: Δ∞ unchanged
    return int(selection_mechanisms.noisy_argmin(noise.measure, noise.scale, shifted))
