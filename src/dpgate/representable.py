"""Representability before the charge: no admitted query can overflow on any data (issue 9
item 1, issue 19 item 4).

:func:`check_representable` is the one pre-charge check of :mod:`dpgate.limits` that reads a
plan: every path that charges (a noisy release, quantiles, partition selection, top-k
selection) and explain call it, before any data is read. It reads only the plan and the policy.
"""

from __future__ import annotations

from dpgate import limits
from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy
from dpgate.sensitivity import primitive_linf
from dpgate.sql.plan import QueryPlan
from dpgate.sql.sources import PerUnitSource, Source, plan_source

__all__ = ["check_representable"]


def check_representable(plan: QueryPlan, policy: DatasetPolicy) -> None:
    """Refuse, before the charge, a query that some data could make overflow.

    Two rules, both from the plan and the policy only:

    1. **Columns.** Every bounded numeric column of the table the plan reads satisfies
       :func:`dpgate.limits.range_problem` (|bound| ≤ 1e100, ≤ 2^62 resolution steps, an int
       column inside the 64-bit integers). Declared columns do by the policy load; the columns
       the planner derives do not by construction: a per-unit subquery's ``SUM(x)`` ranges over
       ``k·m·[min(lo, 0), max(hi, 0)]`` (:mod:`dpgate.sql.per_unit`) and is computed as a
       BIGINT, so beyond 2^62 steps or 2^63 − 1 some data would make it fail after the charge
       (an error on D, a release on a neighbour D′). Refused, naming the inner aggregate.
    2. **Primitives.** Every primitive's per-unit, per-group bound
       (:func:`dpgate.sensitivity.primitive_linf`, integer units) is at most 2^62
       (:data:`dpgate.limits.MAX_STEPS`): then no partial, group sum or rescaling in the
       bounded query can leave DuckDB's 128-bit integers on any data (the argument is in
       :mod:`dpgate.limits`). The policy loader enforces it for sums (m·max|bound|/resolution);
       what remains is the sum of squares of VAR/STDDEV, m·max(lower², upper²)/resolution².

    Raises:
        UnsupportedQuery: naming the column or aggregate, its bound and what to change
            (``details``: ``column``, ``bound``, ``max``, ``charged: false``; ``primitive`` for
            rule 2; ``aggregate`` and ``inner_bound`` (k·m) for a per-unit column).
    """
    from dpgate.sql.parse import nothing_charged

    try:
        _check(plan, policy)
    except UnsupportedQuery as e:
        raise nothing_charged(e) from None


def _check(plan: QueryPlan, policy: DatasetPolicy) -> None:
    table = policy.table(plan.table)
    _check_columns(plan_source(plan, policy))
    for p in plan.primitives:
        if p.kind == "quantile":  # a candidate index; nothing is summed (dpgate.quantiles)
            continue
        linf = primitive_linf(p, policy, plan.table, plan)
        if linf > limits.MAX_STEPS:
            what = ("its sum of squares (VAR/STDDEV), m·max(lower², upper²)/resolution²"
                    if p.kind == "sum_squares" else f"its {p.kind.replace('_', ' ')}")
            raise UnsupportedQuery(
                f"one unit may add up to {linf:.3g} to {what} of column {p.column!r} per group, "
                "more than 2^62: the exact aggregate could overflow on some data; coarsen the "
                f"column's resolution, tighten its bounds or lower max_rows_per_unit "
                f"(now {table.max_rows_per_unit})",
                {"column": p.column, "primitive": p.kind, "bound": str(linf),
                 "max": str(limits.MAX_STEPS)},
            )


def _check_columns(source: Source) -> None:
    table = source.table
    # a per-unit source's derived columns: label → "SUM(x): [lo, hi]"
    derived = dict(source.ranges) if isinstance(source, PerUnitSource) else {}
    for name, col in table.columns.items():
        if col.type not in ("int", "float") or not col.bounded or col.resolution is None:
            continue
        lo, hi = col.fixed_point_bounds
        problem = limits.range_problem(col.type, col.lower, col.upper, max(abs(lo), abs(hi)))
        if problem is None:
            continue
        details = {"column": name, "bound": str(max(abs(col.lower), abs(col.upper))),
                   "max": str(limits.MAX_INT if col.type == "int" else limits.MAX_ABS_BOUND)}
        if name in derived:
            inner = source.inner.table
            details.update(aggregate=derived[name].split(":")[0], inner_bound=source.inner_bound)
            raise UnsupportedQuery(
                f"the per-unit column {name!r} = {derived[name]} ranges {problem}: its range grows "
                f"with the k·m = {inner.max_groups_per_unit} × {inner.max_rows_per_unit} = "
                f"{source.inner_bound} rows a unit keeps, and on some data the inner aggregate would "
                f"overflow after the charge. Lower max_groups_per_unit or max_rows_per_unit of table "
                f"{inner.name!r}, tighten the column's bounds, or use COUNT, AVG, MIN or MAX "
                "(whose ranges do not grow with k·m)",
                details)
        raise UnsupportedQuery(  # pragma: no cover - the policy loader refuses these
            f"column {name!r} of table {table.name!r} has bounds {problem}", details)
