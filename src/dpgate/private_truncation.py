"""The DP choice of a query's per-unit row cap m for a ``max_rows_per_unit = { private = true, … }`` table
(issue 22 item 4).

The method is a DP quantile of per-unit row counts (the alternative the issue names next to R2T's
race to the top), the same estimator as :mod:`dpgate.private_bounds` on another element:

* **Per-unit element.** The query's rows — its source after the unit path's and the analyst's joins
  (one unit's rows multiply there), its WHERE and key filters — are grouped by (unit, group keys);
  each unit contributes **one** element, its largest row count over its groups (its total row count
  without GROUP BY). The element depends only on that unit's rows, so adding or removing one unit
  adds or removes at most one element (symmetric distance 1), however many rows it has: a customer
  with 10,000 lines is one element, snapped to the top candidate.
* **Candidates** (public, from the policy only): m ∈ {1, 2, 4, …, 2^j, outer} with 2^j < outer —
  ⌈log2 outer⌉ + 1 of them (the geometric grid of R2T, Dong et al., SIGMOD 2022). Each element is
  snapped up to the smallest candidate ≥ it (a row-wise map: the distance is unchanged).
* **Score and selection** as :mod:`dpgate.private_bounds`: OpenDP's
  ``make_quantile_score_candidates`` score at α = ``quantile`` (Δ∞ = max(num, den − num) for one
  element per unit) and OpenDP's ``make_noisy_max`` with Gumbel noise of scale s — the exponential
  mechanism, ε = 2Δ∞/s-DP, ε-bounded-range and hence ρ = ε²/8-zCDP (Cesar & Rogers 2021,
  Lemma 3.2); the charged cost is OpenDP's privacy map (:func:`dpgate.mechanisms.selection.noisy_max_cost`).
* **Prior** μ_i ∝ 8^(−i) = m_i^(−3) (McSherry & Talwar 2007's base measure; the public score shift
  ``round(3 ln 2 · s · i)``, :data:`PRIOR_SLOPE`): every candidate above all the data scores the
  same, and the noise of the query grows like m, so the mean squared error over those tied
  candidates is Σ μ_i·m_i² — finite only for a prior decaying faster than m^(−2) (private bounds'
  2^(−i) per √2 step is m^(−2): on the TPC-H total revenue it chose m = 1024 in 2 of 30 trials
  and lost to the hand-set m; docs/DESIGN_NOTES.md "Private truncation"). A data-independent shift:
  Δ∞ and the privacy map are unchanged.
* **Use.** The chosen m is a DP release. The query is then bounded with it exactly as with a
  policy's m (at most m rows per unit and group, after the joins): its sensitivity is the usual
  bounded one with that m, and clamping to a DP output is post-processing; the two charges compose
  sequentially (Bun & Steinke 2016, Lemma 2.3; adaptively through the ledger's filter).

**Rank error** (Dwork & Roth 2014 Thm. 3.11 with the base measure, as :func:`dpgate.private_bounds.rank_error95`):
P[score > OPT + t] ≤ e^(−t/s)·Σ_j μ_j/μ_best ≤ e^(−t/s)·(8/7)·8^(C−1), so with probability ≥ 95 % the
chosen candidate's rank score is within ``r95 = s/den · (ln((8/7)/0.05) + (C − 1)·ln 8)`` units of
the best one's, whatever the data (:func:`rank_error95`).
"""

from __future__ import annotations

import math

import numpy as np

from dpgate import prior_choice
from dpgate.private_bounds import BoundsGrid, BoundsNoise, Measure

__all__ = ["PRIOR_SLOPE", "candidates", "grid", "calibrate", "min_share", "choose", "penalties", "rank_error95"]

#: The prior's decay per candidate (a doubling of m), in units of the Gumbel scale: μ_i ∝ e^(−λ·i) = 8^(−i).
PRIOR_SLOPE = 3.0 * math.log(2.0)


def candidates(outer: int) -> tuple[int, ...]:
    """The public candidates of m: 1, 2, 4, …, the largest power of 2 below ``outer``, then ``outer``.

    Raises:
        ValueError: ``outer`` < 1.
    """
    outer = int(outer)
    if outer < 1:
        raise ValueError(f"outer must be ≥ 1 (got {outer})")
    out, c = [], 1
    while c < outer:
        out.append(c)
        c *= 2
    out.append(outer)
    return tuple(out)


def grid(outer: int) -> BoundsGrid:
    """The candidates as a :class:`~dpgate.private_bounds.BoundsGrid` (origin 0, resolution 1):
    ``grid.bounds(i)[1]`` is candidate i's m."""
    cs = candidates(outer)
    return BoundsGrid(0, cs[-1], 0, cs, 1.0)


def rank_error95(rank_scale: float, candidates: int) -> float:
    """r95 = s_r·(ln((8/7)/0.05) + (C − 1)·ln 8) for rank scale s_r = s/den (module docstring)."""
    return float(rank_scale) * prior_choice.rank_factor(candidates, PRIOR_SLOPE)


def penalties(noise: BoundsNoise) -> np.ndarray:
    """The public score shifts ``round(λ·s·i)``, λ = :data:`PRIOR_SLOPE` (int64, one per candidate)."""
    return prior_choice.penalties(noise, PRIOR_SLOPE)


def calibrate(name: str, outer: int, quantile: float, measure: Measure, share: float) -> BoundsNoise:
    """Scale and cost of the choice at ``share`` (ρ for ``"zcdp"``, ε for ``"pure"``):
    :func:`dpgate.prior_choice.calibrate` over :func:`grid` with λ = :data:`PRIOR_SLOPE`.

    Raises:
        InvalidBudget: a share so small that the scale is not finite.
    """
    return prior_choice.calibrate(name, grid(outer), quantile, measure, share, PRIOR_SLOPE, (
        f"the budget is too small for the private truncation of {name!r}",
        {"table": name, "reason": "private_truncation_budget"}))


def min_share(outer: int, quantile: float, measure: Measure, max_rank_error: float) -> float:
    """The smallest share whose choice has a 95 % rank error ≤ ``max_rank_error`` units
    (:func:`dpgate.prior_choice.min_share` over the candidates of ``outer``)."""
    return prior_choice.min_share(len(candidates(outer)), quantile, measure, max_rank_error, PRIOR_SLOPE)


def choose(noise: BoundsNoise, hist) -> int:
    """The m chosen by OpenDP's noisy max on the quantile scores of the histogram of snapped per-unit
    elements (int64 counts, one per candidate) plus :func:`penalties`.

    Raises:
        ValueError: the histogram does not have one cell per candidate.
    """
    return int(noise.grid.distances[prior_choice.choose_index(noise, hist, PRIOR_SLOPE)])
