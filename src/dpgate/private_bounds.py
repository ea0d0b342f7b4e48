"""The DP estimate of a tight clamp for a ``bounds = "private"`` column (issue 22 item 3).

Anchor: Tumult Analytics' ``get_bounds`` (a noisy search over a geometric grid of candidate
magnitudes; the upper bound a high quantile of the magnitudes). Here the search is one DP
quantile, OpenDP's exponential mechanism over a public geometric grid:

* **Per-unit contributions.** Write ``o`` for the point of the outer range ``[lo, hi]`` nearest
  0 (0 when lo < 0 < hi, else lo or hi) and ``d(v) = |clamp(v, lo, hi) − o|`` in fixed-point steps
  of the column's resolution. Each privacy unit contributes **one** element: the largest ``d`` of
  its rows (NULL, NaN and ±inf dropped as in every bounded query; a unit without a value
  contributes nothing; a record-level table's rows are its units). Adding or removing one unit
  adds or removes at most one element (symmetric distance 1), whatever its number of rows.
* **Candidates** (public, from the policy only): distances ``⌈r^k⌉`` = 1, 2, 3, 4, 6, 8, 12, 16, … steps with
  ratio r = √2 (:data:`RATIO`), then ``D = max(hi − o, o − lo)``; each element is snapped up to
  the smallest candidate ≥ it (a row-wise map: the symmetric distance is unchanged).
* **Score.** OpenDP's ``make_quantile_score_candidates`` score of the snapped elements,
  ``|(den − num)·#{x < c} − num·#{x > c}|`` for α = num/den (:func:`dpgate.quantiles.scores`;
  tests pin it to OpenDP's own scorer). One element moves every score by at most
  Δ∞ = max(num, den − num).
* **Prior.** Before the selection each candidate's score gets a public penalty
  ``pen_i = round(ln 2 · s · i)`` (i its index): the exponential mechanism with base measure
  μ_i ∝ 2^(−i) (McSherry & Talwar 2007 define it with a base measure). The penalty does not depend
  on the data, so the shifted scores have the same sensitivity Δ∞ and the same privacy map; it
  stops the many empty candidates above the data (every one of them scores the same) from
  outweighing the right one together — on PUMS it removes the draws that landed near the outer top
  (docs/DESIGN_NOTES.md "Private bounds").
* **Selection.** OpenDP's ``make_noisy_max`` with Gumbel noise of scale ``s`` on the negated
  shifted scores — the exponential mechanism, ε = 2Δ∞/s-DP, which is
  ε-bounded-range and hence ρ = ε²/8-zCDP (Cesar & Rogers 2021, "Bounding, Concentrating, and
  Truncating", ALT, Lemma 3.2) — the charged cost is read back from OpenDP's privacy map
  (:func:`dpgate.mechanisms.selection.noisy_max_cost`). Under pure DP the same sampler is charged
  ε = 2Δ∞/s.
* **Clamp.** For the chosen distance u: ``[max(lo, o − u), min(hi, o + u)]`` — ``[lo, lo + u]`` for
  a non-negative outer range (the lower bound stays ``lo``), symmetric ``[−u, u]`` (cut to the
  outer range) around 0 otherwise, as ``get_bounds`` does.

**When it is informative.** Without the prior, every candidate above all the data scores
(1 − α)·n ranks worse than the best (n units) and ~2·log2(outer/resolution) of them share the
mechanism's mass; with it their total weight is at most that of the first one above the data. The
estimate is still only as good as (1 − α)·n is large against the rank scale s/den: small
populations want a lower ``quantile`` (default 0.99; Tumult's ``get_bounds`` threshold is 0.95).
``[budget] private_bounds_max_rank_error`` refuses a share whose worst-case ``r95`` (below) exceeds it.

The estimate is a DP release of its own; clamping later queries to it is post-processing, and
its charge composes sequentially with theirs (Bun & Steinke 2016, Lemma 2.3; under adaptivity
through the ledger's filter). **Rank error**: as in Dwork & Roth 2014 Thm. 3.11 with the base
measure, P[score > OPT + t] ≤ e^(−t/s)·Σ_j μ_j/μ_best ≤ e^(−t/s)·2·2^(C−1), so with probability
≥ 95 % the chosen candidate's rank score exceeds the best one's by at most
``r95 = s/den · (ln(2/0.05) + (C − 1)·ln 2)`` units, whatever the data (:func:`rank_error95`):
a worst case (the best candidate the largest); near a best candidate of index i* the factor is
i*·ln 2, and candidates above the best are only made less likely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from dpgate.errors import InvalidBudget
from dpgate.mechanisms import selection as selection_mechanisms
from dpgate.policy import ColumnPolicy
from dpgate.quantiles import alpha_fraction, decimal_values, score_sensitivity, scores

__all__ = ["RATIO", "BoundsGrid", "BoundsNoise", "grid_of", "calibrate", "min_share", "choose", "penalties",
           "rank_error95"]

#: Ratio of neighbouring candidate distances (2 candidates per doubling; Tumult's get_bounds uses powers of 2).
RATIO = 2.0 ** 0.5
Measure = Literal["zcdp", "pure"]


@dataclass(frozen=True)
class BoundsGrid:
    """The public candidates of one column's estimate, in fixed-point steps of ``resolution``.

    Attributes:
        lo, hi: the outer range in steps. origin: ``o`` in steps (module docstring).
        distances: the candidate distances from ``o`` in steps, strictly increasing, the last D.
        resolution: the column's resolution (column units per step).
    """

    lo: int
    hi: int
    origin: int
    distances: tuple[int, ...]
    resolution: float

    @property
    def size(self) -> int:
        """Number of candidates C."""
        return len(self.distances)

    def bounds(self, index: int) -> tuple[float, float]:
        """The clamp ``[max(lo, o − u), min(hi, o + u)]`` (column units) of candidate ``index``."""
        u = self.distances[int(index)]
        fp = np.array([max(self.lo, self.origin - u), min(self.hi, self.origin + u)], dtype=np.int64)
        a, b = decimal_values(fp, self.resolution).tolist()
        return float(a), float(b)

    def describe(self) -> dict[str, Any]:
        """``{candidates, ratio, smallest, largest}`` (column units) for explain and the release."""
        near = decimal_values(np.array([self.distances[0], self.distances[-1]], dtype=np.int64), self.resolution)
        return {"candidates": self.size, "ratio": RATIO, "smallest_reach": float(near[0]),
                "largest_reach": float(near[1]),
                "origin": float(decimal_values(np.array([self.origin], dtype=np.int64), self.resolution)[0])}


def grid_of(col: ColumnPolicy) -> BoundsGrid:
    """The candidate grid of a ``bounds = "private"`` column over its outer range.

    Raises:
        ValueError: the column declares no private bounds.
    """
    if col.private_bounds is None or col.resolution is None:
        raise ValueError(f"column {col.name!r} has no private bounds")
    res = Fraction(repr(float(col.resolution)))
    lo, hi = (int(Fraction(repr(float(v))) / res) for v in col.private_bounds.outer)
    origin = min(max(0, lo), hi)
    reach = max(hi - origin, origin - lo)
    out: list[int] = []
    k = 0
    while True:  # ⌈√2^k⌉ in exact integers: 1, 2, 2, 3, 4, 6, 8, 12, 16, …, 2^j, ⌈2^j·√2⌉, …
        step = 1 if k == 0 else math.isqrt(2**k - 1) + 1
        if step >= reach:
            break
        if not out or step > out[-1]:
            out.append(step)
        k += 1
    out.append(reach)
    return BoundsGrid(lo, hi, origin, tuple(out), float(col.resolution))


@dataclass(frozen=True)
class BoundsNoise:
    """The calibrated estimate of one column's clamp.

    Attributes:
        column: the column. grid: the candidates. num, den: the quantile α = num/den.
        measure: ``"zcdp"`` (charged ρ) or ``"pure"`` (charged ε). score_sensitivity: Δ∞.
        scale: Gumbel scale on the integer scores. cost: OpenDP's privacy map at Δ∞ (ρ or ε).
        rank_error95: r95 = scale/den · (ln(2/0.05) + (C − 1)·ln 2), in privacy units (:func:`rank_error95`).
    """

    column: str
    grid: BoundsGrid
    num: int
    den: int
    measure: Measure
    score_sensitivity: int
    scale: float
    cost: float
    rank_error95: float

    def describe(self) -> dict[str, Any]:
        """JSON form (explain and the estimate's release)."""
        return {"column": self.column, "quantile": self.num / self.den, "measure": self.measure,
                "mechanism": "exponential mechanism (OpenDP make_noisy_max, Gumbel noise) on "
                             "make_quantile_score_candidates scores, base measure 2^-i over the candidates",
                "score_sensitivity": self.score_sensitivity, "score_scale": self.scale,
                "rho" if self.measure == "zcdp" else "epsilon": self.cost,
                "rank_error95": self.rank_error95, "grid": self.grid.describe()}


def _scale_for(measure: Measure, share: float, delta_inf: int) -> float:
    eps = math.sqrt(8.0 * share) if measure == "zcdp" else share  # ρ = ε²/8 (Cesar & Rogers 2021)
    return 2.0 * delta_inf / eps if eps > 0 else math.inf


def calibrate(col: ColumnPolicy, measure: Measure, share: float) -> BoundsNoise:
    """Scale and cost of the estimate at ``share`` (ρ for ``"zcdp"``, ε for ``"pure"``).

    The scale is 2Δ∞/ε with ε = √(8ρ) (or ε = share), widened by ulps until OpenDP's privacy map
    is ≤ ``share``; the cost is that map's value (what the ledger is charged).

    Raises:
        InvalidBudget: a share so small that the scale is not finite.
    """
    grid = grid_of(col)
    assert col.private_bounds is not None
    num, den = alpha_fraction(repr(col.private_bounds.quantile))
    delta_inf = score_sensitivity(num, den, 1)  # one element per unit
    scale = _scale_for(measure, share, delta_inf)
    if not math.isfinite(scale) or scale <= 0:
        raise InvalidBudget(f"the budget is too small for the private bounds of {col.name!r}",
                            {"column": col.name, "reason": "private_bounds_budget"})
    scale, mapped = selection_mechanisms.noisy_max_within(measure, scale, delta_inf, share)
    return BoundsNoise(col.name, grid, num, den, measure, delta_inf, scale, mapped,
                       rank_error95(scale / den, grid.size))


def _rank_factor(candidates: int, beta: float = 0.05) -> float:
    return math.log(2.0 / beta) + (int(candidates) - 1) * math.log(2.0)


def rank_error95(rank_scale: float, candidates: int) -> float:
    """r95 = s_r·(ln(2/0.05) + (C − 1)·ln 2) for rank scale s_r = s/den (module docstring)."""
    return float(rank_scale) * _rank_factor(candidates)


def penalties(noise: "BoundsNoise") -> np.ndarray:
    """The public score penalties ``round(ln 2 · s · i)`` of the prior μ_i ∝ 2^(−i) (int64, one per candidate)."""
    return np.rint(math.log(2.0) * noise.scale * np.arange(noise.grid.size)).astype(np.int64)


def min_share(col: ColumnPolicy, measure: Measure, max_rank_error: float) -> float:
    """The smallest share (ρ or ε) whose estimate has a 95 % rank error ≤ ``max_rank_error`` units.

    From r95 = (2Δ∞/ε)/den · F with F = ln(2/0.05) + (C − 1)·ln 2: ε = 2Δ∞·F/(den·r), ρ = ε²/8.
    """
    grid = grid_of(col)
    assert col.private_bounds is not None
    num, den = alpha_fraction(repr(col.private_bounds.quantile))
    eps = 2.0 * score_sensitivity(num, den, 1) * _rank_factor(grid.size) / (den * float(max_rank_error))
    return eps * eps / 8.0 if measure == "zcdp" else eps


def choose(noise: BoundsNoise, hist: np.ndarray) -> tuple[int, tuple[float, float]]:
    """The candidate index chosen by OpenDP's noisy max on the histogram's scores plus :func:`penalties`, and its clamp.

    Args:
        noise: the calibration. hist: int64 counts of the snapped per-unit elements, one per candidate.
    """
    h = np.asarray(hist, dtype=np.int64)
    if h.shape != (noise.grid.size,):
        raise ValueError(f"the histogram has {h.shape} cells, the grid {noise.grid.size} candidates")
    shifted = scores(h, noise.num, noise.den) + penalties(noise)  # a public shift: Δ∞ unchanged
    index = selection_mechanisms.noisy_argmin(noise.measure, noise.scale, shifted)
    return index, noise.grid.bounds(index)
