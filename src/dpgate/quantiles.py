"""Quantile arithmetic: the candidate grid, the scores and the rank error (pure; no noise).

A DP quantile (``MEDIAN``, ``PERCENTILE_CONT/DISC``, ``QUANTILE_CONT/DISC``,
``APPROX_QUANTILE``, and ``MIN``/``MAX`` as the 0- and 1-quantiles) is released
with the exponential mechanism over a public grid of candidates (Smith 2011,
"Privacy-preserving statistical estimation with optimal convergence rates",
STOC 2011, §3), exactly as OpenDP's ``make_private_quantile`` does it:

* **Grid.** The candidates are the policy's clamp ``[lower, upper]`` at the
  column's ``resolution``: ``lower, lower + s, …, upper`` with stride
  ``s = resolution`` — or, when that would be more than
  :data:`MAX_CANDIDATES` (10 000) candidates, ``s`` = the smallest multiple of
  the resolution that keeps at most 10 000 (the last candidate is ``upper``).
  Bounds and grid come from the policy only, never from the data.
* **Data.** Each bounded value (NULL/NaN/±inf dropped, clamped to the bounds) is
  rounded to its nearest candidate, and each privacy unit keeps at most m
  values per group and at most k groups (:mod:`dpgate.sql.quantile`).
* **Scores.** With α = num/den (the quantile as an exact fraction), for candidate
  c with ``lt`` values below it and ``gt`` above it, the integer score is
  ``|(den − num)·lt − num·gt|`` = den·|(1 − α)·lt − α·gt| (smaller is better):
  OpenDP's ``make_quantile_score_candidates`` score, up to the common factor den
  (a test pins the equality). Adding or removing one value moves every score by
  at most ``max(num, den − num)``; one unit adds or removes at most m values of a
  group, so the score sensitivity is Δ∞ = m·max(num, den − num).
* **Selection.** OpenDP's report-noisy-max (:func:`dpgate.mechanisms.selection.noisy_argmin`)
  picks the candidate; Gumbel noise under zCDP is the exponential mechanism
  (P[c] ∝ exp(−score(c)/(den·s_r)) for the rank scale ``s_r``), exponential noise
  under pure DP.

**Rank error.** Write ``target(c) = α·(n − eq(c))`` with ``eq(c)`` the values
rounded to c; the score in ranks is ``|lt(c) − target(c)|``. For both noise
distributions, a candidate whose rank score exceeds the best candidate's by t
beats the best one with probability at most ``exp(−t/s_r)`` (Gumbel:
1/(1 + e^{t/s}); exponential: e^{−t/s}), so by a union bound over the C
candidates (Dwork & Roth 2014, Theorem 3.11, for the exponential mechanism)::

    P[ |lt(v) − target(v)| > OPT + s_r·ln(C/β) ] ≤ β

``rank_error95`` is ``r = s_r·ln(C/0.05)``: with probability ≥ 95 % the
released value v has between ``α·n − r − OPT`` and ``α·n + r + OPT`` values
below it (up to ties at v), where OPT ≤ the number of values within one grid
step of the true quantile. It says nothing about clamping: values outside the
bounds count at the bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from dpgate.policy import ColumnPolicy

#: Most candidates of one quantile's grid (the stride grows beyond that).
MAX_CANDIDATES = 10_000
#: Most (group, candidate) cells one quantile may score (groups × candidates).
MAX_CELLS = 20_000_000
#: Largest denominator of a quantile written as a decimal (0.000001 steps).
MAX_DENOMINATOR = 10**6
#: Confidence of the reported rank error.
CONFIDENCE = 0.95


def alpha_fraction(alpha: float | str) -> tuple[int, int]:
    """The quantile ``alpha`` (in [0, 1]) as an exact fraction ``(num, den)``, den ≤ 10^6.

    Read from its decimal text, so ``0.9`` is 9/10, not the binary double.

    Raises:
        ValueError: outside [0, 1], not finite, or finer than 10^-6.
    """
    try:
        frac = Fraction(str(alpha))
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"the quantile must be a number in [0, 1], got {alpha!r}") from None
    if not 0 <= frac <= 1:
        raise ValueError(f"the quantile must be in [0, 1], got {alpha}")
    if frac.denominator > MAX_DENOMINATOR:
        raise ValueError(f"the quantile {alpha} is finer than 10^-6; round it")
    return frac.numerator, frac.denominator


@dataclass(frozen=True)
class Grid:
    """The candidate values of one column, in fixed-point units of its resolution.

    Attributes:
        lo, hi: the clamp ``[lower, upper]`` in units of ``resolution`` (ints).
        stride: distance between neighbouring candidates, in units of ``resolution``.
        resolution: the column's resolution (column units per fixed-point unit).
    """

    lo: int
    hi: int
    stride: int
    resolution: float

    @property
    def size(self) -> int:
        """Number of candidates C: ``lo, lo + stride, …`` and finally ``hi``."""
        return -(-(self.hi - self.lo) // self.stride) + 1

    @property
    def step(self) -> float:
        """Distance between neighbouring candidates in column units (decimal-exact)."""
        return float(decimal_values(self.stride, self.resolution))

    def value(self, index: np.ndarray | int) -> np.ndarray:
        """Candidate value(s) in column units for index(es) in [0, C), decimal-exact.

        Each value is ``fp·resolution`` computed exactly (the resolution read as the
        decimal the policy wrote, e.g. 0.1 = 1/10) and rounded once to the nearest
        double, so that ``252003`` steps of 0.1 print as ``25200.3``, not
        ``25200.300000000003``. Rounding a released candidate to the policy's own
        resolution is post-processing of a public grid value: no privacy change.
        """
        fp = np.minimum(self.lo + np.asarray(index, dtype=np.int64) * self.stride, self.hi)
        return decimal_values(fp, self.resolution)

    def describe(self) -> dict:
        """JSON form for explain and the release (bounds and step decimal-exact)."""
        lower, upper, step = decimal_values(np.array([self.lo, self.hi, self.stride], dtype=np.int64),
                                            self.resolution).tolist()
        return {"lower": lower, "upper": upper, "step": step, "candidates": self.size}


def decimal_values(fp: np.ndarray | int, resolution: float) -> np.ndarray:
    """``fp × resolution`` as the doubles nearest the exact decimal products.

    Args:
        fp: integer multiples of ``resolution`` (any shape; |fp| ≤ 2**62).
        resolution: the column's resolution, read as its shortest decimal text
            (``repr``; what the policy file wrote).

    Returns:
        float64 array of ``fp``'s shape. With ``resolution = p/q`` in lowest terms,
        ``(fp·p)/q`` is one correctly rounded IEEE division when ``fp·p`` and ``q``
        are exact doubles (< 2**53); otherwise each value is rounded from the exact
        :class:`fractions.Fraction`.
    """
    res = Fraction(repr(float(resolution)))
    p, q = res.numerator, res.denominator
    arr = np.asarray(fp, dtype=np.int64)
    biggest = int(np.max(np.abs(arr))) if arr.size else 0
    if biggest * abs(p) < 2**53 and q < 2**53:
        return (arr * p).astype(np.float64) / float(q)
    flat = [float(int(v) * res) for v in arr.ravel().tolist()]
    return np.asarray(flat, dtype=np.float64).reshape(arr.shape)


def grid_for(col: ColumnPolicy) -> Grid:
    """The candidate grid of a bounded numeric column (see the module docstring).

    Raises:
        ValueError: the column has no bounds or no resolution.
    """
    if not col.bounded or col.resolution is None:
        raise ValueError(f"column {col.name!r} has no bounds")
    lo, hi = col.fixed_point_bounds
    span = hi - lo
    stride = max(1, -(-span // (MAX_CANDIDATES - 1)))
    return Grid(lo, hi, stride, float(col.resolution))


def scores(hist: np.ndarray, num: int, den: int) -> np.ndarray:
    """Integer scores ``|(den − num)·lt − num·gt|`` of every candidate from its histogram.

    Args:
        hist: int64 counts of values rounded to each candidate (length C).
        num, den: the quantile α = num/den.

    Returns:
        int64 scores (length C), smaller is better.
    """
    h = np.asarray(hist, dtype=np.int64)
    below = np.cumsum(h) - h
    above = int(h.sum()) - below - h
    return np.abs((den - num) * below - num * above)


def score_sensitivity(num: int, den: int, m: int) -> int:
    """Δ∞ of the integer scores when one unit adds or removes up to m values: m·max(num, den − num)."""
    return int(m) * max(int(num), int(den) - int(num))


def rank_error(rank_scale: float, candidates: int, beta: float = 1 - CONFIDENCE) -> float:
    """Rank half-width r = s_r·ln(C/β) holding with probability ≥ 1 − β (module docstring)."""
    return float(rank_scale) * math.log(int(candidates) / beta)
