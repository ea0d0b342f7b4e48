"""Sensitivity of each noisy primitive of a plan, under add/remove-one-privacy-unit.

Neighbouring datasets differ in all the rows of one privacy unit (user-level DP);
for a record-level table, in one row. The bounded SQL of
:mod:`dpgate.sql.bound` follows the per-(unit, partition) aggregate-then-clip
operator of Wilson et al. 2020, "Differentially private SQL with bounded user
contribution", PoPETs 2020(2), §3 (system model: at most C_u partitions per user,
per-partition clamped partial aggregates, and the user-level DP proof); see also
Amin, Kulesza, Muñoz Medina, Vassilvitskii 2019, "Bounding user contributions: a
bias–variance trade-off in differential privacy", ICML (choice of the bounds). It
guarantees, for every unit:

* it adds to at most ``k_eff = min(k, G)`` groups, where k is
  ``max_groups_per_unit`` and G the number of public-key combinations (G = 1 when
  ungrouped) — a unit contributes only through its kept per-(unit, group) partials;
* to each such group it adds a partial bounded per primitive (``linf`` below).

Hence, for the vector of one primitive over all groups, the change caused by one
unit has at most ``k_eff`` non-zero coordinates, each at most ``linf`` in absolute
value, so (elementary: ‖x‖₁ ≤ s·‖x‖∞ and ‖x‖₂ ≤ √s·‖x‖∞ for an s-sparse x):

    Δ∞ = linf,   Δ1 = k_eff · linf,   Δ2 = √k_eff · linf.

Per-group bounds, in the primitive's integer units (lo, hi: the column's clamp in
fixed-point units of its resolution, :attr:`~dpgate.policy.ColumnPolicy.fixed_point_bounds`;
m = ``max_rows_per_unit``):

=====================  =========================================================
primitive              linf (one unit, one group)
=====================  =========================================================
count                  m             (partial row count clipped to [0, m])
count_column           m             (partial non-NULL count clipped to [0, m])
count_distinct_unit    1             (a unit is one partial per group)
count_distinct         m             (a unit keeps ≤ m distinct values of the column per group;
                                      removing it removes at most those from the group's set)
sum                    m·max(|lo|, |hi|)   (partial clipped to [m·min(lo,0), m·max(hi,0)])
sum_squares            m·max(lo², hi²)     (partial clipped to [0, m·max(lo², hi²)])
sum, clamp τ           min(τ, m·max(|lo|, |hi|))  (partial also clipped to [−τ, τ]; a τ
                                      chosen privately under private truncation)
=====================  =========================================================

With k = 1 every unit touches one group only: the groups are disjoint and the
whole GROUP BY is one release whose L1/L2 sensitivity equals the per-group bound
(parallel composition). Record-level tables: k = m = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from dpgate.policy import DatasetPolicy
from dpgate.sql.plan import Primitive, QueryPlan
from dpgate.sql.primitives import linf_of, primitive_kind, sum_clamp


@dataclass(frozen=True)
class Sensitivity:
    """Sensitivity of one primitive's vector over all released groups.

    All values are in the primitive's integer units (rows, units, resolution steps,
    or resolution² steps) and rounded *up* to the next float when not exactly
    representable, so they never understate the true bound.

    Attributes:
        l1: Δ1, the largest L1 change of the vector by adding/removing one unit
            (calibrates the (discrete) Laplace mechanism).
        l2: Δ2, the largest L2 change (calibrates the (discrete) Gaussian mechanism).
        linf: Δ∞, the largest change of any one group's value.
        groups: k_eff, the most groups one unit can change.
    """

    l1: float
    l2: float
    linf: float
    groups: int = 1

    def to_dict(self) -> dict[str, float]:
        """JSON-serialisable ``{"l1", "l2", "linf", "groups"}``."""
        return {"l1": self.l1, "l2": self.l2, "linf": self.linf, "groups": self.groups}


def _float_up(value: int | Fraction) -> float:
    """Smallest float ≥ value."""
    f = float(value)
    if Fraction(f) < value:
        f = math.nextafter(f, math.inf)
    return f


def _sqrt_up(value: int) -> float:
    """Smallest float whose square is ≥ the integer ``value``."""
    r = math.sqrt(value)
    while Fraction(r) ** 2 < value:
        r = math.nextafter(r, math.inf)
    return r


def primitive_linf(primitive: Primitive, policy: DatasetPolicy, table: str,
                   plan: QueryPlan | None = None) -> int:
    """Exact per-group bound (integer units) of one unit's contribution to ``primitive``.

    For a primitive over an aggregated expression, ``plan`` supplies its derived clamp
    (:class:`~dpgate.sql.plan.DerivedValue`, from the policy's bounds by interval arithmetic).

    Raises:
        UnknownTable, UnknownColumn: the primitive does not match the policy.
        ValueError: a sum over a column without bounds (the parser refuses those).
    """
    t = policy.table(table)
    kind = primitive_kind(primitive.kind)  # the formulas: dpgate.sql.primitives, table above
    lo = hi = 0
    if kind.bounded:
        col = plan.column_policy(t, primitive.column) if plan is not None else t.column(primitive.column)
        lo, hi = col.fixed_point_bounds
    # a SUM under a private per-unit sum clamp τ: Δ∞ = min(τ, m·max(|lo|, |hi|)) (primitives.Sum.linf_clamped)
    return linf_of(kind, t.max_rows_per_unit, lo, hi, sum_clamp(t, primitive))


def max_groups_changed(plan: QueryPlan, policy: DatasetPolicy) -> int:
    """k_eff = min(k, number of public-key combinations): groups one unit can change.

    With privately selected keys (issue 11) the key domain is unbounded: k_eff = k.
    """
    t = policy.table(plan.table)
    if plan.selected_keys:
        return t.max_groups_per_unit
    return min(t.max_groups_per_unit, plan.key_combinations(t))


def sensitivities(plan: QueryPlan, policy: DatasetPolicy) -> dict[str, Sensitivity]:
    """Δ1, Δ2 and Δ∞ of every primitive of ``plan``, keyed by primitive id.

    Formulas (module docstring; Wilson et al. 2020 §3): with k_eff =
    :func:`max_groups_changed` and linf = :func:`primitive_linf`,
    Δ1 = k_eff·linf, Δ2 = √k_eff·linf, Δ∞ = linf.

    Raises:
        UnknownTable, UnknownColumn: the plan does not match the policy.
    """
    k_eff = max_groups_changed(plan, policy)
    out: dict[str, Sensitivity] = {}
    for p in plan.primitives:
        linf = primitive_linf(p, policy, plan.table, plan)
        out[p.id] = Sensitivity(
            l1=_float_up(k_eff * linf),
            l2=_sqrt_up(k_eff * linf * linf),
            linf=_float_up(linf),
            groups=k_eff,
        )
    return out
