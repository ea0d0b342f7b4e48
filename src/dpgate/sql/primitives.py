"""The noisy primitive kinds as classes (issue 20 step 7): one frozen class per kind.

A :class:`~dpgate.sql.plan.Primitive` carries its kind as a string (``"count"``, ``"sum"``…):
that string is what the canonical plan serialises, so plan hashes do not depend on this module.
Everything that used to branch on the string asks the kind's class instead
(:func:`primitive_kind`):

* :meth:`PrimitiveKindBase.row_value` — what the bounded query's rows CTE carries for it (nothing,
  a presence flag, a fixed-point value, the raw value);
* :meth:`PrimitiveKindBase.per_unit` — its per-(unit, group) fragment: the group aggregate and the
  clipped partial of Wilson et al. 2020, "Differentially private SQL with bounded user
  contribution", PoPETs 2020(2), §3 (:mod:`dpgate.render.bounded` assembles them);
* :meth:`PrimitiveKindBase.linf` and :meth:`PrimitiveKindBase.sensitivity` — one unit's largest
  change of one group (Δ∞) and of the vector over k_eff groups (Δ1 = k_eff·Δ∞, Δ2 = √k_eff·Δ∞ for
  a k_eff-sparse change; :mod:`dpgate.sensitivity`);
* :meth:`PrimitiveKindBase.exact` — the unbounded aggregate (exact answers of public tables, tests);
* :meth:`PrimitiveKindBase.output_unit` / :meth:`PrimitiveKindBase.finalise` — the noisy integer in
  output units (post-processing, Dwork & Roth 2014, Prop. 2.1: costs nothing).

Every method is abstract in :class:`PrimitiveKindBase`, so a kind that forgets one cannot be
instantiated: the registry :data:`PRIMITIVE_KINDS` builds one of each at import, and
``tests/test_primitives.py`` checks that it covers :data:`~dpgate.sql.plan.PrimitiveKind`.

Units: ``m`` is ``max_rows_per_unit``; ``lo``/``hi`` the column's clamp in fixed-point steps of its
resolution (:attr:`~dpgate.policy.ColumnPolicy.fixed_point_bounds`; 0 for kinds that read no
bounds); sensitivities are exact integers in the primitive's units (rows, units, steps, steps²).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Mapping

from sqlglot import exp

from dpgate.render import nodes as n

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from dpgate.policy import ColumnPolicy

#: What the rows CTE carries for a primitive's column: nothing, ``v IS NOT NULL`` as 1/NULL
#: (``present``), the clamped fixed-point value (``fixed_point``), the raw value (``raw``).
RowValue = Literal["none", "present", "fixed_point", "raw"]


@dataclass(frozen=True)
class PerUnit:
    """A primitive's fragment of the bounded query.

    Attributes:
        row: the group-level aggregate over the rows (used as is when no per-unit step is needed).
        clip: the per-(unit, group) partial clipped to its Δ∞, summed per group; None when the
            group aggregate is ``row`` even with a per-unit step (COUNT(DISTINCT unit): one partial
            per unit and group is worth 1).
    """

    row: exp.Expression
    clip: exp.Expression | None


def m_rows_worth(total, count, m: int) -> exp.Case:
    """m rows' worth of a unit's partial (builders: fresh nodes)::

        CASE WHEN count > m AND total < 0 THEN -((2 * -total * m + count) // (2 * count))
             WHEN count > m THEN (2 * total * m + count) // (2 * count)
             ELSE total END

    A unit with c > m values in a group adds m rows' worth: m × its mean, rounded to the nearest
    fixed-point step (half away from zero; exact integer arithmetic, the division's numerator never
    negative, so every engine's integer division — DuckDB's ``//``, PostgreSQL's ``DIV``, Spark's
    ``DIV`` — gives the same floor), so that AVG = Σ sums / Σ min(c, m) weighs every unit's rows
    consistently. Truncating instead (``(total·m) // c``, before 2026-12-03) biased sums of small
    values down by half a step per heavy unit: a SUM of a 0/1 expression lost ~⅓ of its heavy
    units' worth (trial finding). The partial is then clipped to ``m·[min(lo, 0), max(hi, 0)]``,
    so the rounding cannot move it beyond the bound its sensitivity is derived from.
    """
    def half_away(t: exp.Expression) -> exp.Expression:  # (2·t·m + c) // (2·c) for t ≥ 0
        return exp.IntDiv(this=exp.Paren(this=exp.Add(
            this=exp.Mul(this=exp.Mul(this=n.num(2), expression=t), expression=n.num(m)), expression=count())),
            expression=exp.Paren(this=exp.Mul(this=n.num(2), expression=count())))

    over = lambda: exp.GT(this=count(), expression=n.num(m))  # noqa: E731
    negative = exp.If(this=exp.And(this=over(), expression=exp.LT(this=total(), expression=n.num(0))),
                      true=exp.Neg(this=exp.Paren(this=half_away(exp.Paren(this=exp.Neg(this=total()))))))
    positive = exp.If(this=over(), true=half_away(total()))
    return exp.Case(ifs=[negative, positive], default=total())


class PrimitiveKindBase(ABC):
    """One noisy primitive kind (abstract: every method must be given by a kind)."""

    #: the kind string serialised in the canonical plan (never changes: plan hashes read it)
    kind: ClassVar[str]
    #: True when the sensitivity reads the column's clamp (``lo``/``hi``)
    bounded: ClassVar[bool] = False
    #: True when adding a unit's rows never lowers the value, whatever the bounds (counts;
    #: a sum is monotone only when its clamp has one sign: dpgate.selection)
    monotone: ClassVar[bool] = False

    def counts_units(self, one_row: bool) -> bool:
        """True when the bounded value per group is the group's number of distinct units (so the
        threshold mechanism's own noisy unit count can be released for it: dpgate.sql.partition_selection);
        ``one_row``: each unit adds at most one row per group (m = 1 or record-level)."""
        return False

    @property
    @abstractmethod
    def row_value(self) -> RowValue:
        """What the rows CTE carries for this primitive's column."""

    @abstractmethod
    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit | None:
        """The fragment over the rows CTE's value column ``value`` (None: built in its own CTEs)."""

    @abstractmethod
    def linf(self, m: int, lo: int, hi: int) -> int:
        """Δ∞: the most one unit changes one group's value (integer units)."""

    @abstractmethod
    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """The unbounded aggregate of ``column`` (the privacy unit for COUNT(DISTINCT unit); ``alpha``
        for a quantile)."""

    @abstractmethod
    def output_unit(self, resolution: float | None) -> float:
        """Size of one integer unit in output units (1 for counts)."""

    def sensitivity(self, k_eff: int, m: int, lo: int = 0, hi: int = 0) -> tuple[int, float, int]:
        """(Δ1, Δ2, Δ∞) of the vector over ``k_eff`` groups: k_eff·Δ∞, √(k_eff·Δ∞²), Δ∞.

        Source: a k_eff-sparse change with entries ≤ Δ∞ has ‖·‖₁ ≤ k_eff·Δ∞ and ‖·‖₂ ≤ √k_eff·Δ∞
        (Wilson et al. 2020 §3). Δ2 is a float here; :mod:`dpgate.sensitivity` rounds it up.
        """
        linf = self.linf(m, lo, hi)
        return k_eff * linf, math.sqrt(k_eff * linf * linf), linf

    def per_unit_clamped(self, value: str | None, m: int, lo: int, hi: int, tau: int) -> PerUnit | None:
        """The fragment with the per-unit partial also clipped to [−τ, τ] (SUM only).

        Raises:
            ValueError: a kind without a per-unit sum clamp.
        """
        raise ValueError(f"primitive kind {self.kind!r} has no per-unit sum clamp")

    def linf_clamped(self, m: int, lo: int, hi: int, tau: int) -> int:
        """Δ∞ with the per-unit sum clamp τ (SUM only).

        Raises:
            ValueError: a kind without a per-unit sum clamp.
        """
        raise ValueError(f"primitive kind {self.kind!r} has no per-unit sum clamp")

    def finalise(self, noisy: "np.ndarray", column: "ColumnPolicy | None") -> "np.ndarray":
        """The noisy integers in output units (``column``: the primitive's column policy, if any)."""
        import numpy as np

        resolution = column.resolution if column is not None else None
        return np.asarray(noisy).astype(np.float64) * self.output_unit(resolution)


class _Count(PrimitiveKindBase):
    """Common to counts: integer units are rows (or units), Δ∞ = m unless said otherwise."""

    monotone: ClassVar[bool] = True

    def linf(self, m: int, lo: int, hi: int) -> int:
        """Δ∞ = m: a unit adds at most m rows to one group (Wilson et al. 2020 §3, contribution bounding)."""
        return m

    def output_unit(self, resolution: float | None) -> float:
        """1.0: a count's integer unit is one row (or one unit)."""
        return 1.0


@dataclass(frozen=True)
class Count(_Count):
    """COUNT(*): rows, at most m per unit and group (partial clipped to [0, m])."""

    kind: ClassVar[str] = "count"
    row_value: ClassVar[RowValue] = "none"

    def counts_units(self, one_row: bool) -> bool:
        """True when ``one_row`` (≤ 1 row per unit and group): the count of rows is the count of units."""
        return one_row  # with ≤ 1 row per unit and group, rows are units

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit:
        """``COUNT(*)`` per (unit, group), clipped to ``LEAST(COUNT(*), m)``; ``value``, ``lo``, ``hi`` unused."""
        return PerUnit(n.count(), n.least(n.count(), n.num(m)))

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``COUNT(*)`` (``column`` and ``alpha`` unused)."""
        return n.count()


@dataclass(frozen=True)
class CountColumn(_Count):
    """COUNT(col): non-NULL (finite) values, at most m per unit and group."""

    kind: ClassVar[str] = "count_column"
    row_value: ClassVar[RowValue] = "present"

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit:
        """``COUNT(value)`` per (unit, group), clipped to ``LEAST(COUNT(value), m)``; ``lo``/``hi`` unused."""
        return PerUnit(n.count(n.col(value)), n.least(n.count(n.col(value)), n.num(m)))

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``COUNT(column)``: the non-NULL values."""
        return n.count(column)


@dataclass(frozen=True)
class CountDistinctUnit(_Count):
    """COUNT(DISTINCT unit): a unit is one partial per group, Δ∞ = 1."""

    kind: ClassVar[str] = "count_distinct_unit"
    row_value: ClassVar[RowValue] = "none"

    def counts_units(self, one_row: bool) -> bool:
        """True: the bounded value per group is its number of distinct units."""
        return True

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit:
        """One partial (``COUNT(*)``) per (unit, group), not clipped: the unit counts once."""
        return PerUnit(n.count(), None)

    def linf(self, m: int, lo: int, hi: int) -> int:
        """Δ∞ = 1: removing a unit removes it from each group it is in, once."""
        return 1

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``COUNT(DISTINCT column)`` (``column`` is the privacy unit)."""
        return n.count(exp.Distinct(expressions=[column]))


@dataclass(frozen=True)
class CountDistinct(_Count):
    """COUNT(DISTINCT col), col not the unit: a unit keeps ≤ m distinct values per group (issue 11);
    removing it removes at most those m from the group's set (others' choices do not move)."""

    kind: ClassVar[str] = "count_distinct"
    row_value: ClassVar[RowValue] = "raw"
    monotone: ClassVar[bool] = False  # not a selection utility (dpgate.sql.selection_query)

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> None:
        """None: built in its own CTEs (a unit keeps ≤ m distinct values per group; dpgate.render.bounded)."""
        return None  # its own CTEs (dpgate.render.bounded), joined to the groups

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``COUNT(DISTINCT column)``."""
        return n.count(exp.Distinct(expressions=[column]))


@dataclass(frozen=True)
class Sum(PrimitiveKindBase):
    """SUM(col) in fixed-point steps: partial clipped to m·[min(lo, 0), max(hi, 0)], Δ∞ = m·max(|lo|, |hi|)."""

    kind: ClassVar[str] = "sum"
    bounded: ClassVar[bool] = True
    row_value: ClassVar[RowValue] = "fixed_point"

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit:
        """``SUM(value)`` per (unit, group) in fixed-point steps, m rows' worth, clipped to
        ``m·[min(lo, 0), max(hi, 0)]`` (``lo``/``hi``: the clamp in steps; NULL partials add 0)."""
        return self._clipped(value, m, *self.partial_range(m, lo, hi))

    @staticmethod
    def partial_range(m: int, lo: int, hi: int, tau: int | None = None) -> tuple[int, int]:
        """The per-(unit, group) partial's range in steps: ``m·[min(lo, 0), max(hi, 0)]``, intersected
        with ``[−τ, τ]`` when a per-unit sum clamp τ ≥ 0 is given (issue 22 item 4)."""
        a, b = m * min(lo, 0), m * max(hi, 0)
        if tau is None:
            return a, b
        if tau < 0:
            raise ValueError(f"a per-unit sum clamp is ≥ 0 (got {tau})")
        return max(a, -tau), min(b, tau)

    @staticmethod
    def _clipped(value: str | None, m: int, a: int, b: int) -> PerUnit:
        # COALESCE: a partial whose values are all NULL adds 0 (LEAST/GREATEST skip NULL)
        worth = m_rows_worth(lambda: exp.Sum(this=n.col(value)), lambda: n.count(n.col(value)), m)
        clip = n.least(n.greatest(n.coalesce0(worth), n.num(a)), n.num(b))
        return PerUnit(exp.Sum(this=n.col(value)), clip)

    def per_unit_clamped(self, value: str | None, m: int, lo: int, hi: int, tau: int) -> PerUnit:
        """As :meth:`per_unit`, the partial clipped to ``m·[min(lo, 0), max(hi, 0)] ∩ [−τ, τ]``: the
        per-unit total contribution bounded by τ (the contribution bound of Wilson et al. 2020 §3 on
        the partial's value instead of its rows; τ chosen privately, :mod:`dpgate.private_sum_clamp`)."""
        return self._clipped(value, m, *self.partial_range(m, lo, hi, tau))

    def linf(self, m: int, lo: int, hi: int) -> int:
        """Δ∞ = m·max(|lo|, |hi|) in steps: m clamped values of one unit in one group."""
        return m * max(abs(lo), abs(hi))

    def linf_clamped(self, m: int, lo: int, hi: int, tau: int) -> int:
        """Δ∞ = max(|a|, |b|) ≤ min(τ, m·max(|lo|, |hi|)) for the partial's range [a, b]
        (:meth:`partial_range`): removing a unit removes its partial, which lies in [a, b]."""
        a, b = self.partial_range(m, lo, hi, tau)
        return max(abs(a), abs(b))

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``SUM(column)``."""
        return exp.Sum(this=column)

    def output_unit(self, resolution: float | None) -> float:
        """The column's resolution (one fixed-point step), or 1.0 for an integer column."""
        return 1.0 if resolution is None else float(resolution)


@dataclass(frozen=True)
class SumSquares(PrimitiveKindBase):
    """Σ v² in steps²: partial clipped to [0, m·max(lo², hi²)] (the parser checked |v| ≤ 2**31)."""

    kind: ClassVar[str] = "sum_squares"
    bounded: ClassVar[bool] = True
    row_value: ClassVar[RowValue] = "fixed_point"

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> PerUnit:
        """``SUM(value·value)`` per (unit, group) in steps², m rows' worth, clipped to
        ``[0, m·max(lo², hi²)]``."""
        sq = lambda: exp.Sum(this=exp.Mul(this=n.col(value), expression=n.col(value)))  # noqa: E731
        worth = m_rows_worth(sq, lambda: n.count(n.col(value)), m)
        return PerUnit(sq(), n.least(n.coalesce0(worth), n.num(m * max(lo * lo, hi * hi))))

    def linf(self, m: int, lo: int, hi: int) -> int:
        """Δ∞ = m·max(lo², hi²) in steps²: m clamped squares of one unit in one group."""
        return m * max(lo * lo, hi * hi)

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``SUM(column * column)``."""
        return exp.Sum(this=exp.Mul(this=column, expression=column.copy()))

    def output_unit(self, resolution: float | None) -> float:
        """The resolution squared (one step²), or 1.0 for an integer column."""
        r = 1.0 if resolution is None else float(resolution)
        return r * r


@dataclass(frozen=True)
class Quantile(PrimitiveKindBase):
    """An α-quantile: the index of a candidate on the column's grid, chosen by the exponential
    mechanism (:mod:`dpgate.quantiles`, its own histogram query and utility sensitivity)."""

    kind: ClassVar[str] = "quantile"
    row_value: ClassVar[RowValue] = "none"

    def per_unit(self, value: str | None, m: int, lo: int, hi: int) -> None:
        """None: the quantile's histogram query is built by dpgate.render.histogram."""
        return None  # dpgate.render.histogram builds its query

    def linf(self, m: int, lo: int, hi: int) -> int:
        """Raises ValueError: a quantile is not a noisy sum (its utility's sensitivity is in dpgate.quantiles)."""
        raise ValueError("unknown primitive kind 'quantile'")  # not a noisy sum: dpgate.quantiles

    def exact(self, column: exp.Expression | None, alpha: float | None = None) -> exp.Expression:
        """``QUANTILE_CONT(column, alpha)`` (``alpha`` in [0, 1])."""
        return exp.func("QUANTILE_CONT", column, n.num(repr(alpha)), dialect="duckdb")

    def output_unit(self, resolution: float | None) -> float:
        """1.0: the released value is read off the column's grid by :meth:`finalise`."""
        return 1.0

    def finalise(self, noisy: "np.ndarray", column: "ColumnPolicy | None") -> "np.ndarray":
        """The chosen candidate indices ``noisy`` (integers, any shape) as values of the column's grid
        (:func:`dpgate.quantiles.grid_for`), same shape."""
        import numpy as np

        from dpgate.quantiles import grid_for

        return grid_for(column).value(np.asarray(noisy))


#: One instance per kind, by kind string (instantiating checks every abstract method is given).
PRIMITIVE_KINDS: Mapping[str, PrimitiveKindBase] = {
    c.kind: c() for c in (Count, CountColumn, CountDistinctUnit, CountDistinct, Sum, SumSquares, Quantile)}


def sum_clamp(table: object, primitive: object) -> int | None:
    """The per-unit sum clamp τ (fixed-point steps) that ``table`` (a source's table policy) holds for
    ``primitive``, or None: only a SUM under a private-truncation choice has one (issue 22 item 4)."""
    pt = getattr(table, "private_truncation", None)
    if pt is None or getattr(primitive, "kind", None) != "sum":
        return None
    return pt.sum_clamp(getattr(primitive, "column", None))


def fragment(kind: PrimitiveKindBase, value: str | None, m: int, lo: int, hi: int, tau: int | None
             ) -> PerUnit | None:
    """``kind.per_unit(…)``, or its clamped form when a per-unit sum clamp ``tau`` applies."""
    return kind.per_unit(value, m, lo, hi) if tau is None else kind.per_unit_clamped(value, m, lo, hi, tau)


def linf_of(kind: PrimitiveKindBase, m: int, lo: int, hi: int, tau: int | None) -> int:
    """``kind.linf(…)``, or its clamped form when a per-unit sum clamp ``tau`` applies."""
    return kind.linf(m, lo, hi) if tau is None else kind.linf_clamped(m, lo, hi, tau)


def primitive_kind(kind: str) -> PrimitiveKindBase:
    """The class instance of a primitive kind string.

    Raises:
        ValueError: an unknown kind (a plan built by a newer version, or a bug).
    """
    try:
        return PRIMITIVE_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown primitive kind {kind!r}") from None
