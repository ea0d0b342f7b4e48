"""Noise scales for a ``{"ci95": w}`` budget: every *released cell* meets the half-width.

The inverse of the accuracy the release reports (:mod:`dpgate.postprocess.release`): given
a target 95 % half-width ``w`` (output units), choose each noisy primitive's scale so that
each aggregate cell's reported ``ci95`` is at most ``w``, at the least privacy cost.

* **COUNT, SUM** (one primitive): the largest scale whose exact 95 % half-width is ≤ ``w``
  (:func:`dpgate.mechanisms.sigma_for_ci95`, in the primitive's integer units). Exact.
* **AVG = S / C**: the count C is not known before the release, so the target cannot be met
  exactly; the request must state the count it expects per group (``expected_count`` = n,
  an assumption of the analyst, never read from the data). With output-unit half-widths
  h_S, h_C of the parts, the release reports the interval arithmetic of
  (S ± h_S)/(C ± h_C) clipped to [L, U]; at C = n and any value in [L, U] its half-width is
  at most (h_S + M·h_C)/(n − h_C) with M = max(|L|, |U|), h_S and h_C the parts'
  half-widths at 97.5 % each (the release builds its 95 % box from them,
  :func:`dpgate.postprocess.accuracy.ratio_part_alpha`; 98.33 % for VAR/STDDEV's three parts) (the far corner
  (S + h_S)/(n − h_C) − S/n = (h_S·n + S·h_C)/(n(n − h_C)), and |S/n| ≤ M; clipping only
  narrows it). The scales are chosen so that this bound is ≤ ``w``: the reported ``ci95``
  is ≤ ``w`` when the noisy count is n, wider for smaller counts, narrower for larger ones.
* **VAR_POP** = Q/C − (S/C)²: with e1 = (h_S + M·h_C)/(n − h_C) and
  e2 = (h_Q + M₂·h_C)/(n − h_C), M₂ = max(L², U²), the reported half-width at C = n is at
  most e2 + 2M·e1 + e1² (the square's range on [μ − e1, μ + e1] with |μ| ≤ M).
* **STDDEV_POP** = √VAR: the half-width of √ on an interval of half-width H around a variance
  v is at most √H (attained as v → 0), so the target is the variance bound ≤ ``w²``: a
  worst case over the unknown variance, expensive for small ``w``; ask for the variance's
  half-width instead if the standard deviation is known to be large.

Each ratio target is met by scales s_i = t·d_i along the cost-optimal direction of its
linearised constraint Σ a_i·h_i ≤ R with h_i ∝ s_i: minimising Σ c_i/s_i^r (discrete
Gaussian: ρ_i = Δ_i²/(2 s_i²), r = 2; discrete Laplace: ε_i = Δ_i/s_i, r = 1) gives
d_i = (c_i/a_i)^{1/(r+1)} (Lagrange); t is then the largest value (bisection) for which the
exact bound above, with the exact discrete half-widths, is ≤ ``w``; the slack the integer
half-widths leave is then given to each part in turn (costliest first). A primitive shared by
several cells takes the smallest scale any of them needs; every bound is monotone in each
scale, so all targets hold. Costs are the mechanisms' own (:func:`dpgate.mechanisms.calibrate`
with these scales).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from dpgate.errors import InvalidBudget

_COUNTS = ("count", "count_column", "count_distinct_unit", "count_distinct")
_RATIOS = ("avg", "var_pop", "stddev_pop")


@dataclass(frozen=True)
class CellTarget:
    """One released aggregate cell whose 95 % half-width a ``{ci95}`` budget constrains.

    Attributes:
        name: the output's name (reported).
        function: ``count``, ``count_column``, ``count_distinct_unit``, ``sum``, ``avg``,
            ``var_pop`` or ``stddev_pop``.
        primitives: its primitive ids in :data:`dpgate.sql.plan.FUNCTION_PRIMITIVES` order:
            (p,) for counts and sums, (sum, count) for AVG, (sum_squares, sum, count) for
            VAR_POP/STDDEV_POP.
        bounds: the column's [lower, upper] (output units), required for the ratios.
    """

    name: str
    function: str
    primitives: tuple[str, ...]
    bounds: tuple[float, float] | None = None


@dataclass(frozen=True)
class Ci95Scales:
    """Result of :func:`scales_for_ci95`.

    Attributes:
        scales: primitive id → σ (discrete Gaussian) or b (discrete Laplace), integer units.
        predicted: cell name → the largest 95 % half-width the release will report for the
            cell when the noisy count is the expected one (the exact half-width for counts
            and sums), output units.
        rules: cell name → how the target was applied (for explain and the release).
    """

    scales: dict[str, float]
    predicted: dict[str, float]
    rules: dict[str, str] = field(default_factory=dict)

    def describe(self, halfwidth: float, expected_count: float | None) -> dict[str, Any]:
        """JSON-ready: the target, the stated count, each cell's rule and ``ci95_at_most`` (:attr:`predicted`)."""
        d: dict[str, Any] = {"ci95": halfwidth, "applies_to": "each released cell"}
        if expected_count is not None:
            d["expected_count"] = expected_count
        d["cells"] = {name: {"rule": self.rules[name], "ci95_at_most": self.predicted[name]}
                      for name in self.rules}
        return d


def scales_for_ci95(
    targets: Sequence[CellTarget],
    sensitivities: Mapping[str, float],
    units: Mapping[str, float],
    *,
    mechanism: str,
    halfwidth: float,
    expected_count: float | None = None,
) -> Ci95Scales:
    """Noise scales such that each cell's reported 95 % half-width is ≤ ``halfwidth``.

    See the module docstring for the rule of each aggregate and its derivation.

    Args:
        targets: the released aggregate cells.
        sensitivities: primitive id → the mechanism's d_in (Δ2 for the discrete Gaussian,
            Δ1 for the discrete Laplace), integer units, > 0.
        units: primitive id → output units per integer step (1 for counts, the resolution
            for sums, resolution² for sums of squares).
        mechanism: ``"gaussian"``/``"discrete_gaussian"`` or ``"laplace"``/``"discrete_laplace"``.
        halfwidth: the target w > 0, output units.
        expected_count: the number of (non-NULL, bounded) rows the analyst expects per
            group, n > 1; required when a target is an AVG, VAR or STDDEV.

    Returns:
        :class:`Ci95Scales`.

    Raises:
        InvalidBudget: a ratio target without ``expected_count``; a non-finite or
            non-positive half-width or count; a ratio target without bounds.
    """
    from dpgate.mechanisms import ci95_halfwidth, ci_halfwidth, mechanism_name, sigma_for_ci95
    from dpgate.postprocess.accuracy import ratio_part_alpha

    mech = mechanism_name(mechanism)
    w = float(halfwidth)
    if not math.isfinite(w) or w <= 0:
        raise InvalidBudget("ci95 must be a finite positive number", {"field": "ci95"})
    ratios = [t for t in targets if t.function in _RATIOS]
    if ratios and expected_count is None:
        names = ", ".join(sorted({t.function.upper() for t in ratios}))
        raise InvalidBudget(
            f"a ci95 budget for {names} needs the number of rows you expect per group: the count is "
            "only known after the release, and the half-width of a ratio depends on it. Add "
            '"expected_count": n to the budget (an assumption, never read from the data), or give '
            "rho or epsilon instead",
            {"field": "expected_count", "functions": sorted({t.function for t in ratios})},
        )
    n = None
    if expected_count is not None:
        n = float(expected_count)
        if not math.isfinite(n) or n <= 1:
            raise InvalidBudget("expected_count must be a finite number > 1", {"field": "expected_count"})
    gaussian = mech == "discrete_gaussian"

    def h95(pid: str, scale: float) -> float:
        """Output-unit 95 % half-width of primitive ``pid`` at integer-unit ``scale``."""
        return units[pid] * ci95_halfwidth(mech, scale)

    def part_h(k: int) -> Callable[[str, float], float]:
        """Half-width of one of a ratio cell's k parts, at 1 − 0.05/k as the release reports it."""
        alpha = ratio_part_alpha(k)
        return lambda pid, scale: 0.0 if scale == 0 else units[pid] * ci_halfwidth(mech, scale, alpha)

    scales: dict[str, float] = {}
    predicted: dict[str, float] = {}
    rules: dict[str, str] = {}
    wanted: dict[str, list[float]] = {}
    for t in targets:
        if t.function in _COUNTS or t.function == "sum":
            (pid,) = t.primitives
            s = sigma_for_ci95(mech, w / units[pid])
            wanted.setdefault(pid, []).append(s)
            rules[t.name] = _rule(t.function, w, n)
            continue
        if t.bounds is None:
            raise InvalidBudget(f"{t.function} of a column without bounds has no half-width")
        lower, upper = float(t.bounds[0]), float(t.bounds[1])
        big = max(abs(lower), abs(upper))
        big2 = big * big
        assert n is not None
        if t.function == "avg":
            s_id, c_id = t.primitives
            weights = {s_id: 1.0, c_id: big + w}

            def bound(hs: Mapping[str, float], s_id=s_id, c_id=c_id) -> float:
                return _ratio_bound(hs[s_id], hs[c_id], big, n)

            limit = w
        else:
            q_id, s_id, c_id = t.primitives
            weights = {q_id: 1.0, s_id: 2.0 * big, c_id: big2 + 2.0 * big2}

            def bound(hs: Mapping[str, float], q_id=q_id, s_id=s_id, c_id=c_id) -> float:
                e1 = _ratio_bound(hs[s_id], hs[c_id], big, n)
                e2 = _ratio_bound(hs[q_id], hs[c_id], big2, n)
                return e2 + 2.0 * big * e1 + e1 * e1

            limit = w if t.function == "var_pop" else w * w
        rules[t.name] = _rule(t.function, w, n)
        found = _solve(t.primitives, weights, bound, limit, sensitivities, units, gaussian,
                       part_h(len(t.primitives)))
        for pid, s in found.items():
            wanted.setdefault(pid, []).append(s)
    for pid, options in wanted.items():
        scales[pid] = min(options)
    for t in targets:
        h = h95 if t.function in _COUNTS or t.function == "sum" else part_h(len(t.primitives))
        hs = {pid: h(pid, scales[pid]) for pid in t.primitives}
        if t.function in _COUNTS or t.function == "sum":
            predicted[t.name] = hs[t.primitives[0]]
            continue
        lower, upper = float(t.bounds[0]), float(t.bounds[1])  # type: ignore[index]
        big = max(abs(lower), abs(upper))
        assert n is not None
        if t.function == "avg":
            predicted[t.name] = min(_ratio_bound(hs[t.primitives[0]], hs[t.primitives[1]], big, n), upper - lower)
        else:
            q_id, s_id, c_id = t.primitives
            e1 = _ratio_bound(hs[s_id], hs[c_id], big, n)
            e2 = _ratio_bound(hs[q_id], hs[c_id], big * big, n)
            var = min(e2 + 2.0 * big * e1 + e1 * e1, (upper - lower) ** 2 / 4.0)
            predicted[t.name] = var if t.function == "var_pop" else min(math.sqrt(var), (upper - lower) / 2.0)
    return Ci95Scales(scales, predicted, rules)


def ci95_rules(targets: Sequence[CellTarget], halfwidth: float, expected_count: float | None) -> dict[str, Any]:
    """How a ``{ci95}`` budget applies to each cell (cheap: no calibration), for the release.

    Returns ``{"ci95", "applies_to", "expected_count"?, "cells": {name: {"rule"}}}``.
    """
    w = float(halfwidth)
    d: dict[str, Any] = {"ci95": w, "applies_to": "each released cell"}
    if expected_count is not None:
        d["expected_count"] = float(expected_count)
    d["cells"] = {t.name: {"rule": _rule(t.function, w, expected_count)} for t in targets}
    return d


def _rule(function: str, w: float, n: float | None) -> str:
    if function in _COUNTS or function == "sum":
        return "exact: the noise's 95 % half-width"
    at = f"interval arithmetic at expected_count = {n:g}" if n is not None else "interval arithmetic"
    if function == "avg":
        return (f"{at}: the reported ci95 is ≤ {w:g} when the noisy count is that large "
                "(wider for smaller counts)")
    if function == "var_pop":
        return f"{at} (the variance's interval from the parts' intervals)"
    return (f"{at}, worst case over the unknown variance: the variance's half-width ≤ {w:g}² "
            "(√ of an interval of half-width H moves by at most √H)")


def _ratio_bound(h_num: float, h_count: float, big: float, n: float) -> float:
    """Bound on the reported half-width of X/C at C = n: (h_X + big·h_C)/(n − h_C) (∞ if n − h_C < 1)."""
    denom = n - h_count
    if denom < 1.0:
        return math.inf
    return (h_num + big * h_count) / denom


def _solve(primitives: Sequence[str], weights: Mapping[str, float], bound: Callable[[Mapping[str, float]], float],
           limit: float, sensitivities: Mapping[str, float], units: Mapping[str, float], gaussian: bool,
           h: Callable[[str, float], float]) -> dict[str, float]:
    """Scales t·d_i (integer units) with the largest t such that ``bound(half-widths) ≤ limit``."""
    r = 2.0 if gaussian else 1.0
    direction = {}
    for pid in primitives:
        delta_out = float(sensitivities[pid]) * units[pid]
        cost = (delta_out ** 2 / 2.0) if gaussian else delta_out
        d_out = (max(cost, 1e-300) / weights[pid]) ** (1.0 / (r + 1.0))
        direction[pid] = d_out / units[pid]  # integer units

    def ok(t: float) -> bool:
        return bound({pid: h(pid, t * direction[pid]) for pid in primitives}) <= limit

    # Below t = 1e-6 / max d every scale is ≤ 1e-6: every half-width is 0 and the bound holds.
    t = _largest(ok, 1e-6 / max(direction.values()))
    scales = {pid: t * direction[pid] for pid in primitives}
    # Half-widths are integers: the bound usually has slack at t. Give it to each part in turn,
    # costliest first (coordinate ascent; the bound stays ≤ limit at every step).
    for pid in sorted(primitives, key=lambda p: -(sensitivities[p] / scales[p]) ** r):
        def ok_alone(f: float, pid=pid) -> bool:
            trial = dict(scales, **{pid: scales[pid] * f})
            return bound({p: h(p, trial[p]) for p in primitives}) <= limit

        scales[pid] *= _largest(ok_alone, 1.0)
    return scales


def _largest(ok: Callable[[float], bool], lo: float) -> float:
    """The largest x ≥ ``lo`` with ``ok(x)`` (to 1e-12 relative), for ``ok`` true up to a point and
    false after it, given ``ok(lo)``: doubling, then bisection on a log scale."""
    hi = lo * 2.0
    while ok(hi) and hi < 1e300:
        lo, hi = hi, hi * 2.0
    while hi / lo > 1.0 + 1e-12:
        mid = math.sqrt(lo * hi)
        if mid <= lo or mid >= hi:
            break
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
