"""The DP choice of a SUM's per-unit sum clamp τ under private truncation (issue 22 item 4).

A table declared ``max_rows_per_unit = { private = true, outer = N }`` has its row cap m chosen
privately (:mod:`dpgate.private_truncation`). A SUM over it is bounded by m too — each unit's
partial clipped to ``m·[min(L, 0), max(U, 0)]`` — and that worst case (m heaviest rows, each at the
column's bound) is what sets a SUM's noise. Here each SUM of the query also chooses τ, the per-unit
**total** contribution: the partial is clipped to ``[−τ, τ]`` as well, and the SUM's sensitivity is
τ (Δ∞; Δ1 = k_eff·τ, Δ2 = √k_eff·τ as for any per-group bound, Wilson et al. 2020 §3).

* **Per-unit element.** Over the query's own rows (the bounded query's step 1: after the unit path's
  and the analyst's joins, the WHERE, the key filters), per (unit, group) the SUM's partial as the
  bounded query computes it with m = the query's outer m (each row's fixed-point value clamped to
  [L, U], NULL/NaN/±inf left out, the partial clipped to ``m·[min(L, 0), max(U, 0)]``); each unit's
  element is its largest |partial| over its groups. It depends only on that unit's rows, so adding
  or removing one unit adds or removes one element (symmetric distance 1), however large its total.
* **Candidates** (public, from the policy only): ``B·s`` for s in the √2-geometric integers
  1, 2, 3, 4, 6, 8, 12, 16, 23, … below m, then ``m·B`` — B = max(|L|, |U|) in fixed-point steps
  (one row at the bound), m·B the bound the SUM has without τ. Each element is snapped up to the
  smallest candidate ≥ it (a row-wise map: the distance is unchanged).
* **Score and selection** as the row cap's: OpenDP's ``make_quantile_score_candidates`` score at
  α = the table's ``quantile`` (Δ∞ = max(num, den − num) for one element per unit) and OpenDP's
  ``make_noisy_max`` with Gumbel noise of scale s — the exponential mechanism, ε = 2Δ∞/s-DP,
  ρ = ε²/8-zCDP (Cesar & Rogers 2021, Lemma 3.2); the charged cost is OpenDP's privacy map
  (:func:`dpgate.mechanisms.selection.noisy_max_within`).
* **Prior** μ_i ∝ 2^(−1.5·i) ≈ τ_i^(−3) on the √2 grid (the row cap's argument: all candidates above
  the data tie and the SUM's noise grows like τ, so the mean squared error over those tied
  candidates is Σ μ_i·τ_i², finite only for a prior decaying faster than τ^(−2)); a public score
  shift ``round(1.5 ln 2 · s · i)``: Δ∞ and the privacy map are unchanged.
* **Use.** τ is a DP release; the query is then bounded with it (post-processing of the choice) and
  its SUM's sensitivity is τ; the charges compose sequentially (Bun & Steinke 2016, Lemma 2.3).

**Rank error** (Dwork & Roth 2014 Thm. 3.11 with the base measure): with probability ≥ 95 % the
chosen candidate's rank score is within ``r95 = s/den · (ln((1/(1 − 2^−1.5))/0.05) + (C − 1)·1.5 ln 2)``
units of the best one's, whatever the data (:func:`rank_error95`).
"""

from __future__ import annotations

import math

import numpy as np

from dpgate import prior_choice
from dpgate.private_bounds import BoundsGrid, BoundsNoise, Measure

__all__ = ["PRIOR_SLOPE", "candidates", "grid", "calibrate", "min_share", "choose", "penalties", "rank_error95"]

#: The prior's decay per candidate (a √2 step of τ), in units of the Gumbel scale: μ_i ∝ 2^(−1.5·i).
PRIOR_SLOPE = 1.5 * math.log(2.0)


def candidates(row_bound: int, outer_m: int) -> tuple[int, ...]:
    """The public candidates of τ in fixed-point steps: ``row_bound·s`` for s = 1, 2, 3, 4, 6, 8, 12,
    16, … (⌈√2^k⌉, strictly increasing) below ``outer_m``, then ``outer_m·row_bound``.

    Args:
        row_bound: B = max(|L|, |U|) of the summed value in steps (≥ 0; 0 gives the one candidate 0).
        outer_m: the query's m before any choice (≥ 1).

    Raises:
        ValueError: ``outer_m`` < 1 or ``row_bound`` < 0.
    """
    b, m = int(row_bound), int(outer_m)
    if m < 1 or b < 0:
        raise ValueError(f"outer_m must be ≥ 1 and row_bound ≥ 0 (got {m}, {b})")
    if b == 0:
        return (0,)
    out: list[int] = []
    k = 0
    while True:  # ⌈√2^k⌉ in exact integers, as private bounds' grid
        s = 1 if k == 0 else math.isqrt(2**k - 1) + 1
        if s >= m:
            break
        if not out or s > out[-1]:
            out.append(s)
        k += 1
    out.append(m)
    return tuple(b * s for s in out)


def grid(row_bound: int, outer_m: int, resolution: float) -> BoundsGrid:
    """The candidates as a :class:`~dpgate.private_bounds.BoundsGrid` (origin 0, in steps of
    ``resolution``): ``grid.distances[i]`` is candidate i's τ in steps."""
    cs = candidates(row_bound, outer_m)
    return BoundsGrid(-cs[-1], cs[-1], 0, cs, float(resolution))


def rank_error95(rank_scale: float, size: int) -> float:
    """r95 = s_r·(ln((1/(1 − 2^−1.5))/0.05) + (C − 1)·1.5 ln 2) for rank scale s_r = s/den (module docstring)."""
    return float(rank_scale) * prior_choice.rank_factor(size, PRIOR_SLOPE)


def penalties(noise: BoundsNoise) -> np.ndarray:
    """The public score shifts ``round(λ·s·i)``, λ = :data:`PRIOR_SLOPE` (int64, one per candidate)."""
    return prior_choice.penalties(noise, PRIOR_SLOPE)


def calibrate(name: str, g: BoundsGrid, quantile: float, measure: Measure, share: float) -> BoundsNoise:
    """Scale and cost of the choice at ``share`` (ρ for ``"zcdp"``, ε for ``"pure"``):
    :func:`dpgate.prior_choice.calibrate` with λ = :data:`PRIOR_SLOPE`.

    Raises:
        InvalidBudget: a share so small that the scale is not finite.
    """
    return prior_choice.calibrate(name, g, quantile, measure, share, PRIOR_SLOPE, (
        f"the budget is too small for the private sum clamp of {name!r}",
        {"column": name, "reason": "private_sum_clamp_budget"}))


def min_share(size: int, quantile: float, measure: Measure, max_rank_error: float) -> float:
    """The smallest share whose choice over ``size`` candidates has a 95 % rank error ≤
    ``max_rank_error`` units (:func:`dpgate.prior_choice.min_share`)."""
    return prior_choice.min_share(size, quantile, measure, max_rank_error, PRIOR_SLOPE)


def choose(noise: BoundsNoise, hist) -> int:
    """τ (steps) chosen by OpenDP's noisy max on the quantile scores of the histogram of snapped
    per-unit elements (int64 counts, one per candidate) plus :func:`penalties`.

    Raises:
        ValueError: the histogram does not have one cell per candidate.
    """
    return int(noise.grid.distances[prior_choice.choose_index(noise, hist, PRIOR_SLOPE)])
