"""Accuracy of derived cells (:func:`propagate_accuracy`).

A released cell
is exact (keys, constants), *linear* in noisy primitives (a count or a sum is
its primitive; ``a·X + b`` and ``X ± Y`` stay linear), or known only by a 95 %
interval (AVG, VAR, STDDEV). With Z_p the noise of primitive p (discrete
Gaussian N_Z(0, σ_p²) or discrete Laplace with scale b_p, independent across
primitives, [CKS20]), a derived cell gets:

* **one primitive, a·X + b**: ``ci95 = |a|·t_p`` with t_p the primitive's exact
  95 % half-width (:func:`dpgate.mechanisms.ci95_halfwidth`); *exact*
  (``approximate: false``): the interval maps one to one. Counts clamped at 0
  keep this coverage (clamping moves the value toward any true count ≥ 0).
* **several primitives, Σ a_p·X_p + b, all discrete Gaussian**: the variances
  add, Var(Σ a_p Z_p) = Σ a_p² Var(Z_p) ≤ Σ a_p² σ_p² (independence; the
  discrete Gaussian's variance is at most σ², [CKS20] §2); ``sigma`` =
  √(Σ a_p² σ_p²) and ``ci95 = 1.95996·sigma`` by the normal approximation
  (a sum of independent discrete Gaussians is not itself one): *approximate*
  (``approximate: true``, ``method: "normal"``). Rows where a count was clamped
  at 0 use the union bound below instead.
* **several primitives with discrete Laplace noise**: no closed form; ``ci95`` =
  Σ |a_p|·t_p(0.05/k) where t_p(α) is the primitive's exact (1 − α) half-width
  and k the number of primitives: by the union (Bonferroni) bound all k parts
  lie in their intervals with probability ≥ 95 %, so the coverage is *at least*
  95 % (``approximate: false``, ``method: "union_bound"``); ``sd`` =
  √(Σ a_p² Var(Z_p)) with Var = 2q/(1 − q)², q = e^{−1/b} (exact, [GRS12]).
* **anything else** (products and ratios of noisy cells, POWER, SQRT, ROUND, …
  and any expression over AVG/VAR/STDDEV): interval arithmetic over the parts'
  intervals (each linear cell v ± t, each AVG/VAR/STDDEV cell its own ≥ 95 %
  interval, built from its parts at 1 − 0.05/k' each: :func:`ratio_part_alpha`);
  if all k primitives involved lie in their intervals (probability
  ≥ 1 − 0.05·k, union bound: each primitive misses with probability ≤ 0.05) the
  true value of the expression lies in the
  computed range, so ``coverage`` = 1 − 0.05·k is stated, ``approximate: true``,
  ``method: "interval"``; ``ci95`` is the largest distance from the released
  value to an end of the range. It covers the noise only, not clamping bias.
* **omitted** (``ci95: null`` with a ``reason``) when no honest interval exists:
  a comparison or CASE over noisy values, a denominator whose interval contains
  0, a logarithm whose interval reaches 0, or so many primitives that the union
  bound says nothing (k ≥ 20).

References: [DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential
Privacy, 2014. [BS16] M. Bun, T. Steinke, Concentrated Differential Privacy, TCC 2016.
[CKS20] C. Canonne, G. Kamath, T. Steinke, The Discrete Gaussian for Differential
Privacy, NeurIPS 2020. [GRS12] A. Ghosh, T. Roughgarden, M. Sundararajan,
Universally Utility-Maximizing Privacy Mechanisms, SIAM J. Comput. 2012.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
from sqlglot import exp

from dpgate.postprocess.expressions import (
    Vector,
    _as_tree,
    _cast_target,
    _cells_of,
    _Evaluator,
    _round_half_away,
    _snippet,
    _trunc_digits,
)

_Z975 = statistics.NormalDist().inv_cdf(0.975)

#: Miss probability of every reported interval (``ci95``): 5 %.
MISS = 0.05


def ratio_part_alpha(parts: int) -> float:
    """Miss probability of each part's interval in the box of an AVG (2 parts: sum, count) or
    VAR_POP/STDDEV_POP (3 parts: sum of squares, sum, count) cell: ``0.05 / parts``.

    By the union (Bonferroni) bound all parts then lie in their intervals with probability
    ≥ 1 − parts·(0.05/parts) = 95 %, and whenever they do the true ratio lies in the box: the
    cell's ``ci95`` is a 95 % interval as labelled (97.5 % per part for AVG, 98.33 % for VAR).
    """
    return MISS / parts

#: Largest number of primitives an interval-arithmetic accuracy may depend on (coverage 1 − 0.05·k > 0).
MAX_INTERVAL_PARTS = 19


@dataclass(frozen=True)
class PrimitiveNoise:
    """The noise of one noisy primitive, in the output units of the cells that use it.

    Attributes:
        mechanism: ``"discrete_gaussian"`` or ``"discrete_laplace"``.
        scale: σ (discrete Gaussian) or b (discrete Laplace), output units.
        ci95: the exact 95 % half-width of the noise, output units
            (:func:`dpgate.mechanisms.ci95_halfwidth` × ``unit``).
        unit: output units per integer step of the primitive (1 for counts, the
            column's resolution for sums, resolution² for sums of squares).
    """

    mechanism: str
    scale: float
    ci95: float
    unit: float = 1.0

    @property
    def gaussian(self) -> bool:
        """True for the discrete Gaussian."""
        return "gaussian" in self.mechanism

    def halfwidth(self, alpha: float) -> float:
        """Exact (1 − α) half-width of the noise in output units
        (:func:`dpgate.mechanisms.ci_halfwidth` on the integer scale)."""
        from dpgate.mechanisms import ci_halfwidth

        if alpha == 0.05:
            return self.ci95
        if self.scale == 0:  # an exact primitive (sensitivity 0): no noise at any level
            return 0.0
        return self.unit * ci_halfwidth(self.mechanism, self.scale / self.unit, alpha)

    def variance(self) -> float:
        """Variance bound of the noise in output units²: σ² for the discrete Gaussian (an
        upper bound, [CKS20] §2), 2q/(1 − q)² with q = e^{−1/b} for the discrete Laplace
        (exact, [GRS12])."""
        s = self.scale / self.unit
        if self.gaussian:
            return self.scale**2
        one_minus_q = -math.expm1(-1.0 / s)
        q = 1.0 - one_minus_q
        return self.unit**2 * 2.0 * q / (one_minus_q * one_minus_q)


@dataclass(frozen=True, eq=False)
class CellNoise:
    """How a released cell depends on the noise (input to :func:`propagate_accuracy`).

    A cell without noise (group keys, constants) has no ``CellNoise``. Otherwise:

    * **linear** (counts, sums): cell = exact value + Σ_p ``linear[p]``·Z_p, with Z_p
      the noise of primitive p (:class:`PrimitiveNoise`); build with
      :meth:`of_primitive`;
    * **interval** (AVG, VAR, STDDEV): known only by a per-row 95 %-box interval
      ``[lo, hi]`` (each of its ``parts`` in its own 95 % interval ⇒ the true value
      in ``[lo, hi]``); build with :meth:`of_interval`.

    Attributes:
        linear: primitive id → coefficient, or None for an interval cell.
        lo, hi: per-row interval ends (interval cells), else None.
        parts: ids of the primitives the cell depends on.
        clamped: per-row booleans, True where a count was clamped at 0 (or None).
    """

    linear: Mapping[str, float] | None = None
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    parts: frozenset[str] = frozenset()
    clamped: np.ndarray | None = None

    @classmethod
    def of_primitive(cls, primitive_id: str, *, coefficient: float = 1.0,
                     clamped: np.ndarray | None = None) -> "CellNoise":
        """A cell equal to ``coefficient`` × one noisy primitive (a count or a sum)."""
        return cls(linear={primitive_id: float(coefficient)}, parts=frozenset({primitive_id}), clamped=clamped)

    @classmethod
    def of_interval(cls, lo: np.ndarray, hi: np.ndarray, parts: Iterable[str]) -> "CellNoise":
        """A cell known by its per-row interval ``[lo, hi]`` over ``parts``' 95 % intervals."""
        return cls(lo=np.asarray(lo, dtype=np.float64), hi=np.asarray(hi, dtype=np.float64),
                   parts=frozenset(parts))


@dataclass(frozen=True, eq=False)
class CellAccuracy:
    """The accuracy of a derived cell (output of :func:`propagate_accuracy`).

    Attributes:
        entry: the release's accuracy entry without ``ci95``/``ci95_rows``:
            ``mechanism``, ``sigma`` (discrete Gaussian, one primitive or σ² added) or
            ``scale`` (discrete Laplace, one primitive) or ``sd`` (several Laplace
            primitives), ``approximate``, ``method`` (``exact``, ``normal``,
            ``union_bound``, ``interval`` or ``omitted``), ``coverage`` (the stated
            coverage: 0.95, or 1 − 0.05·k for interval arithmetic), ``reason`` (omitted).
        ci_rows: per-row 95 % half-width (NaN where the value is NULL), or None
            when omitted.
    """

    entry: dict[str, Any]
    ci_rows: np.ndarray | None

    def to_dict(self, rows: np.ndarray | None = None) -> dict[str, Any]:
        """The accuracy entry for the released ``rows`` (indices; default all):
        ``ci95`` = the largest half-width over them (None if omitted or all NULL), plus
        ``ci95_rows`` (one per released row, None at NULL values) when the entry is
        approximate or the widths differ by row."""
        n = len(self.ci_rows) if self.ci_rows is not None else 0
        return _accuracy_entry(self.entry, self.ci_rows, np.arange(n) if rows is None else rows)


def _accuracy_entry(entry: Mapping[str, Any], ci_rows: np.ndarray | None, rows: np.ndarray) -> dict[str, Any]:
    d = dict(entry)
    if ci_rows is None:
        d.setdefault("ci95", None)
        return d
    if "ci95" in d and not d.get("approximate"):
        return d
    kept = ci_rows[np.asarray(rows, dtype=np.int64)]
    finite = kept[np.isfinite(kept)]
    d["ci95"] = float(finite.max()) if finite.size else None
    if d.get("approximate") or finite.size != kept.size or (finite.size and finite.min() != finite.max()):
        d["ci95_rows"] = [float(v) if math.isfinite(v) else None for v in kept]
    return d


class _NotLinear(Exception):
    pass


class _NoInterval(Exception):
    pass


def _noisy_refs(node: exp.Expression, noise: Mapping[str, CellNoise]) -> set[str]:
    return {c.name for c in node.find_all(exp.Column) if c.name in noise}


class _Linear:
    """Coefficients of Σ_p a_p·Z_p of an expression linear in the noise (else _NotLinear)."""

    def __init__(self, ev: _Evaluator, noise: Mapping[str, CellNoise]) -> None:
        self.ev = ev
        self.noise = noise
        self.clamped = np.zeros(ev.n, dtype=bool)

    def exact(self, node: exp.Expression) -> np.ndarray:
        """Values of an exact (noise-free) numeric sub-expression, NaN for NULL."""
        return self.ev.num(node).as_float()

    def lin(self, node: exp.Expression) -> dict[str, np.ndarray]:
        """Coefficient per primitive of the noise of ``node`` (raises _NotLinear)."""
        n = self.ev.n
        if not _noisy_refs(node, self.noise):
            return {}
        if isinstance(node, exp.Column):
            cn = self.noise[node.name]
            if cn.linear is None:
                raise _NotLinear
            if cn.clamped is not None:
                self.clamped |= cn.clamped
            return {p: np.full(n, a, dtype=np.float64) for p, a in cn.linear.items()}
        if isinstance(node, exp.Paren):
            return self.lin(node.this)
        if isinstance(node, exp.Neg):
            return {p: -a for p, a in self.lin(node.this).items()}
        if isinstance(node, (exp.Add, exp.Sub)):
            left, right = self.lin(node.this), self.lin(node.expression)
            sign = -1.0 if isinstance(node, exp.Sub) else 1.0
            out = dict(left)
            for p, a in right.items():
                out[p] = out.get(p, 0.0) + sign * a
            return out
        if isinstance(node, exp.Mul):
            left, right = self.lin(node.this), self.lin(node.expression)
            if left and right:
                raise _NotLinear
            if left:
                factor = self.exact(node.expression)
                return {p: a * factor for p, a in left.items()}
            factor = self.exact(node.this)
            return {p: a * factor for p, a in right.items()}
        if isinstance(node, exp.Div):
            if self.ev.ev(node).type == "int":  # integer division truncates: not linear
                raise _NotLinear
            if _noisy_refs(node.expression, self.noise):
                raise _NotLinear
            left = self.lin(node.this)
            with np.errstate(all="ignore"):
                factor = 1.0 / self.exact(node.expression)
            factor = np.where(np.isfinite(factor), factor, np.nan)
            return {p: a * factor for p, a in left.items()}
        if isinstance(node, (exp.Cast, exp.TryCast)):
            target, scale = _cast_target(node.args["to"], node)
            if target == "float" and scale is None:
                return self.lin(node.this)
        raise _NotLinear


def _monotone(fn: Callable[[np.ndarray], np.ndarray], lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, b = fn(lo), fn(hi)
    return np.minimum(a, b), np.maximum(a, b)


class _Intervals:
    """Interval arithmetic over the parts' 95 % intervals (raises _NoInterval with a reason)."""

    def __init__(self, ev: _Evaluator, noise: Mapping[str, CellNoise],
                 primitives: Mapping[str, PrimitiveNoise]) -> None:
        self.ev = ev
        self.noise = noise
        self.primitives = primitives

    def iv(self, node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        """Per-row interval [lo, hi] of ``node`` (raises _NoInterval with a reason)."""
        if not _noisy_refs(node, self.noise):
            v = self.ev.ev(node)
            if v.type not in ("int", "float", "bool", "null"):
                raise _NoInterval(f"{_snippet(node)} is not a number")
            f = v.as_float()
            return f, f
        with np.errstate(all="ignore"):
            return self._iv(node)

    def _iv(self, node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(node, exp.Column):
            cn = self.noise[node.name]
            if cn.linear is not None:
                v = self.ev.ev(node).as_float()
                width = sum(abs(a) * self.primitives[p].ci95 for p, a in cn.linear.items())
                return v - width, v + width
            return cn.lo, cn.hi
        if isinstance(node, exp.Paren):
            return self.iv(node.this)
        if isinstance(node, exp.Neg):
            lo, hi = self.iv(node.this)
            return -hi, -lo
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv)):
            (a, b), (c, d) = self.iv(node.this), self.iv(node.expression)
            if isinstance(node, exp.Add):
                return a + c, b + d
            if isinstance(node, exp.Sub):
                return a - d, b - c
            if isinstance(node, exp.Mul):
                corners = np.stack([a * c, a * d, b * c, b * d])
                return corners.min(axis=0), corners.max(axis=0)
            if np.any((c <= 0) & (d >= 0)):
                raise _NoInterval(f"the 95 % interval of the denominator of {_snippet(node)} contains 0")
            corners = np.stack([a / c, a / d, b / c, b / d])
            lo, hi = corners.min(axis=0), corners.max(axis=0)
            if isinstance(node, exp.IntDiv) or self.ev.ev(node).type == "int":
                return np.trunc(lo), np.trunc(hi)
            return lo, hi
        if isinstance(node, exp.Pow):
            return self._pow(node)
        if isinstance(node, exp.Sqrt):
            lo, hi = self.iv(node.this)
            return np.sqrt(np.maximum(lo, 0.0)), np.sqrt(np.maximum(hi, 0.0))
        if isinstance(node, (exp.Cbrt, exp.Exp)):
            fn = np.cbrt if isinstance(node, exp.Cbrt) else np.exp
            return _monotone(fn, *self.iv(node.this))
        if isinstance(node, (exp.Ln, exp.Log)):
            if isinstance(node, exp.Log) and node.expression is not None:
                if _noisy_refs(node.this, self.noise):
                    raise _NoInterval(f"{_snippet(node)} has a noisy base")
                base = self.ev.num(node.this).as_float()
                arg = node.expression
            else:
                base = np.full(self.ev.n, math.e if isinstance(node, exp.Ln) else 10.0)
                arg = node.this
            lo, hi = self.iv(arg)
            if np.any(lo <= 0):
                raise _NoInterval(f"the 95 % interval of the argument of {_snippet(node)} reaches 0")
            return _monotone(lambda x: np.log(x) / np.log(base), lo, hi)
        if isinstance(node, (exp.Round, exp.Trunc)):
            d = self.ev._digits(node.args.get("decimals"))
            if d is None:
                raise _NoInterval(f"{_snippet(node)} is NULL (its number of decimals is NULL)")
            fn = _round_half_away if isinstance(node, exp.Round) else _trunc_digits
            return _monotone(lambda x: fn(x, d), *self.iv(node.this))
        if isinstance(node, (exp.Floor, exp.Ceil, exp.Sign)):
            fn = {exp.Floor: np.floor, exp.Ceil: np.ceil, exp.Sign: np.sign}[type(node)]
            return _monotone(fn, *self.iv(node.this))
        if isinstance(node, exp.Abs):
            lo, hi = self.iv(node.this)
            straddle = (lo <= 0) & (hi >= 0)
            return (np.where(straddle, 0.0, np.minimum(np.abs(lo), np.abs(hi))),
                    np.maximum(np.abs(lo), np.abs(hi)))
        if isinstance(node, (exp.Greatest, exp.Least)):
            ends = [self.iv(e) for e in [node.this, *node.expressions]]
            los, his = np.stack([e[0] for e in ends]), np.stack([e[1] for e in ends])
            if isinstance(node, exp.Greatest):
                return np.nanmax(los, axis=0), np.nanmax(his, axis=0)
            return np.nanmin(los, axis=0), np.nanmin(his, axis=0)
        if isinstance(node, (exp.Cast, exp.TryCast)):
            target, scale = _cast_target(node.args["to"], node)
            if target == "float":
                if scale is None:
                    return self.iv(node.this)
                return _monotone(lambda x: _round_half_away(x, scale), *self.iv(node.this))
            if target == "int":
                return _monotone(np.rint, *self.iv(node.this))
        what = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__.upper()
        raise _NoInterval(f"{what} over noisy values has no 95 % interval ({_snippet(node)})")

    def _pow(self, node: exp.Pow) -> tuple[np.ndarray, np.ndarray]:
        (a, b), (c, d) = self.iv(node.this), self.iv(node.expression)
        if np.all(a > 0):  # x^y = e^{y ln x} is monotone in each argument for x > 0: corners
            corners = np.stack([np.power(a, c), np.power(a, d), np.power(b, c), np.power(b, d)])
            return corners.min(axis=0), corners.max(axis=0)
        if not np.array_equal(c, d, equal_nan=True):
            raise _NoInterval(f"{_snippet(node)}: a noisy exponent of a base whose interval reaches 0")
        e = c
        integer = np.isfinite(e) & (e == np.round(e))
        if not np.all(integer | np.isnan(e)):
            raise _NoInterval(f"{_snippet(node)}: a fractional power of a value whose interval reaches below 0")
        even = np.fmod(e, 2) == 0
        straddle = (a <= 0) & (b >= 0)
        if np.any((e < 0) & straddle):
            raise _NoInterval(f"{_snippet(node)}: a negative power of a value whose interval contains 0")
        pa, pb = np.power(a, e), np.power(b, e)
        lo, hi = np.minimum(pa, pb), np.maximum(pa, pb)
        lo = np.where(even & straddle & (e > 0), 0.0, lo)
        return lo, hi


def propagate_accuracy(expr: exp.Expression | str, cells: Mapping[str, Any], noise: Mapping[str, CellNoise],
                       primitives: Mapping[str, PrimitiveNoise], *, value: Vector | None = None,
                       rows: int | None = None, dialect: str = "duckdb") -> CellAccuracy | None:
    """The 95 % accuracy of a post-processing expression over released cells.

    See the module docstring, part B, for each rule (exact for one primitive;
    σ² adds with a normal quantile for several discrete Gaussians; a union bound
    for several discrete Laplaces; interval arithmetic with coverage 1 − 0.05·k
    otherwise; omitted with a reason when no honest interval exists).

    Args:
        expr: the expression (sqlglot, or SQL text in ``dialect``).
        cells: cell name → values (as for :func:`evaluate`).
        noise: cell name → :class:`CellNoise` for the noisy cells (keys and
            constants have none).
        primitives: primitive id → :class:`PrimitiveNoise` for every primitive the
            noisy cells name.
        value: the expression's values if already evaluated.
        rows, dialect: as for :func:`evaluate`.

    Returns:
        A :class:`CellAccuracy`, or None when the expression involves no noisy cell
        (it is exact: keys and constants only).

    Raises:
        ExpressionError: as for :func:`evaluate`.
        KeyError: a noisy cell names a primitive missing from ``primitives``.
    """
    tree = _as_tree(expr, dialect)
    vectors, n = _cells_of(cells, rows)
    refs = _noisy_refs(tree, noise)
    if not refs:
        return None
    ev = _Evaluator(vectors, n)
    if value is None:
        value = ev.ev(tree)
    parts = frozenset().union(*(noise[r].parts for r in refs))
    mechanisms = {primitives[p].mechanism for p in parts}
    mechanism = next(iter(mechanisms)) if len(mechanisms) == 1 else "mixed"
    null = ~value.valid
    linear = _Linear(ev, noise)
    try:
        coefs = linear.lin(tree)
    except _NotLinear:
        coefs = None
    if coefs is not None:
        return _linear_accuracy(coefs, linear.clamped, null, primitives, mechanism, n)
    try:
        lo, hi = _Intervals(ev, noise, primitives).iv(tree)
        if len(parts) > MAX_INTERVAL_PARTS:
            raise _NoInterval(f"it depends on {len(parts)} noisy primitives; the union bound over "
                              "their 95 % intervals gives no coverage")
        v = value.as_float()
        with np.errstate(invalid="ignore"):
            ci = np.maximum(hi - v, v - lo)
        if np.any(~np.isfinite(ci[~null])):
            raise _NoInterval("its interval is unbounded")
    except _NoInterval as e:
        return CellAccuracy({"mechanism": mechanism, "approximate": True, "method": "omitted",
                             "reason": f"no honest 95 % interval: {e}"}, None)
    ci = np.where(null, np.nan, np.maximum(ci, 0.0))
    coverage = round(1.0 - 0.05 * len(parts), 10)
    return CellAccuracy({"mechanism": mechanism, "approximate": True, "method": "interval",
                         "coverage": coverage}, ci)


def _linear_accuracy(coefs: Mapping[str, np.ndarray], clamped: np.ndarray, null: np.ndarray,
                     primitives: Mapping[str, PrimitiveNoise], mechanism: str, n: int) -> CellAccuracy:
    active = {p: np.nan_to_num(np.abs(a), nan=0.0) for p, a in coefs.items()}
    active = {p: a for p, a in active.items() if np.any(a[~null] > 0)}
    k = len(active)
    if k == 0:  # the noise cancels (X − X, 0·X): exact
        return CellAccuracy({"mechanism": mechanism, "approximate": False, "method": "exact",
                             "coverage": 1.0}, np.where(null, np.nan, 0.0))
    if k == 1:
        (p, a), = active.items()
        prim = primitives[p]
        key = "sigma" if prim.gaussian else "scale"
        scale = a * prim.scale
        entry = {"mechanism": prim.mechanism, key: float(np.max(scale[~null])) if np.any(~null) else prim.scale,
                 "approximate": False, "method": "exact", "coverage": 0.95}
        return CellAccuracy(entry, np.where(null, np.nan, a * prim.ci95))
    union = sum(a * primitives[p].halfwidth(0.05 / k) for p, a in active.items())
    sd = np.sqrt(sum(a * a * primitives[p].variance() for p, a in active.items()))
    sd_max = float(np.max(sd[~null])) if np.any(~null) else float(sd.max())
    if all(primitives[p].gaussian for p in active):
        ci = np.where(clamped, union, _Z975 * sd)
        entry = {"mechanism": mechanism, "sigma": sd_max, "approximate": True, "method": "normal",
                 "coverage": 0.95}
    else:
        ci = union
        entry = {"mechanism": mechanism, "sd": sd_max, "approximate": False, "method": "union_bound",
                 "coverage": 0.95}
    return CellAccuracy(entry, np.where(null, np.nan, ci))


