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
* **Score, prior, selection** exactly as :mod:`dpgate.private_bounds`: OpenDP's
  ``make_quantile_score_candidates`` score at α = ``quantile`` (Δ∞ = max(num, den − num) for one
  element per unit), the public base measure 2^(−i) (McSherry & Talwar 2007), and OpenDP's
  ``make_noisy_max`` with Gumbel noise of scale s — the exponential mechanism, ε = 2Δ∞/s-DP,
  ε-bounded-range and hence ρ = ε²/8-zCDP (Cesar & Rogers 2021, Lemma 3.2); the charged cost is
  OpenDP's privacy map (:func:`dpgate.mechanisms.selection.noisy_max_cost`).
* **Use.** The chosen m is a DP release. The query is then bounded with it exactly as with a
  policy's m (at most m rows per unit and group, after the joins): its sensitivity is the usual
  bounded one with that m, and clamping to a DP output is post-processing; the two charges compose
  sequentially (Bun & Steinke 2016, Lemma 2.3; adaptively through the ledger's filter).

**Rank error** as in :func:`dpgate.private_bounds.rank_error95`: with probability ≥ 95 % the chosen
candidate's rank score is within ``s/den · (ln 40 + (C − 1)·ln 2)`` units of the best one's.
"""

from __future__ import annotations

import math

from dpgate.errors import InvalidBudget
from dpgate.mechanisms import selection as selection_mechanisms
from dpgate.private_bounds import BoundsGrid, BoundsNoise, Measure, rank_error95
from dpgate.private_bounds import choose as _choose
from dpgate.quantiles import alpha_fraction, score_sensitivity

__all__ = ["candidates", "grid", "calibrate", "min_share", "choose"]


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


def _factor(size: int) -> float:
    return math.log(2.0 / 0.05) + (size - 1) * math.log(2.0)


def calibrate(name: str, outer: int, quantile: float, measure: Measure, share: float) -> BoundsNoise:
    """Scale and cost of the choice at ``share`` (ρ for ``"zcdp"``, ε for ``"pure"``); as
    :func:`dpgate.private_bounds.calibrate` (scale 2Δ∞/ε, ε = √(8ρ), widened until OpenDP's map ≤ share).

    Raises:
        InvalidBudget: a share so small that the scale is not finite.
    """
    g = grid(outer)
    num, den = alpha_fraction(repr(float(quantile)))
    delta_inf = score_sensitivity(num, den, 1)  # one element per unit
    eps = math.sqrt(8.0 * share) if measure == "zcdp" else float(share)
    scale = 2.0 * delta_inf / eps if eps > 0 else math.inf
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidBudget(f"the budget is too small for the private truncation of {name!r}",
                            {"table": name, "reason": "private_truncation_budget"})
    mapped = selection_mechanisms.noisy_max_cost(measure, scale, delta_inf)
    for _ in range(64):
        if mapped <= share:
            break
        scale = math.nextafter(scale, math.inf)
        mapped = selection_mechanisms.noisy_max_cost(measure, scale, delta_inf)
    return BoundsNoise(name, g, num, den, measure, delta_inf, scale, mapped, rank_error95(scale / den, g.size))


def min_share(outer: int, quantile: float, measure: Measure, max_rank_error: float) -> float:
    """The smallest share whose choice has a 95 % rank error ≤ ``max_rank_error`` units:
    ε = 2Δ∞·F/(den·r) with F = ln 40 + (C − 1)·ln 2, ρ = ε²/8."""
    num, den = alpha_fraction(repr(float(quantile)))
    eps = 2.0 * score_sensitivity(num, den, 1) * _factor(len(candidates(outer))) / (den * float(max_rank_error))
    return eps * eps / 8.0 if measure == "zcdp" else eps


def choose(noise: BoundsNoise, hist) -> int:
    """The m chosen by OpenDP's noisy max over the histogram of snapped per-unit elements
    (int64 counts, one per candidate; :func:`dpgate.private_bounds.choose`)."""
    _, (_, m) = _choose(noise, hist)
    return int(m)
