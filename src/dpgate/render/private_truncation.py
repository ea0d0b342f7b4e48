"""The per-unit row-count histogram of a private-truncation choice as a sqlglot tree (issue 22 item 4).

One statement over the query's own rows (step 1 of its bounded query: the source after its joins
and unit path, its WHERE and key filters; :func:`dpgate.render.bounded.rows_tree`), built from
generated names and the plan only::

    WITH "__dpg_rows"  AS (<the query's rows: __dpg_u, __dpg_g0, …>),
         "__dpg_cells" AS (SELECT __dpg_u, COUNT(*) AS c FROM "__dpg_rows" GROUP BY __dpg_u, __dpg_g0, …),
         "__dpg_units" AS (SELECT MAX(c) AS c FROM "__dpg_cells" GROUP BY __dpg_u)
    SELECT CASE WHEN c <= m_0 THEN 0 … ELSE C − 1 END AS "__dpg_b", COUNT(*) AS "__dpg_n"
    FROM "__dpg_units" GROUP BY 1

Each unit's element is its largest row count over its groups (:mod:`dpgate.private_truncation`).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.policy import TablePolicy
from dpgate.private_bounds import BoundsGrid
from dpgate.render import nodes as n
from dpgate.render.bounded import rows_and_values, rows_tree
from dpgate.render.private_bounds import BIN, COUNT
from dpgate.rendered import mark
from dpgate.sql.plan import Primitive, QueryPlan
from dpgate.sql.primitives import primitive_kind

__all__ = ["counts_tree", "totals_tree", "BIN", "COUNT"]

_PREFIX = "__dpg_"


def counts_tree(plan: QueryPlan, table: TablePolicy, join_tree: exp.Expression | None, grid: BoundsGrid
                ) -> exp.Select:
    """The histogram statement of the plan's per-unit largest row count per group over ``grid``'s candidates."""
    rows, g = rows_tree(plan, table, join_tree)
    u, c = n.col(_PREFIX + "u"), n.col("c")
    cells = n.select([u.copy(), n.alias(exp.Count(this=exp.Star()), "c")], n.table(_PREFIX + "rows"),
                     group=[u.copy()] + [n.col(x) for x in g])
    units = n.select([n.alias(exp.Max(this=c.copy()), "c")], n.table(_PREFIX + "cells"), group=[u.copy()])
    return _binned(rows, cells, units, grid)


def _binned(rows: exp.Select, cells: exp.Select, units: exp.Select, grid: BoundsGrid) -> exp.Select:
    """The per-unit elements of ``units`` (column ``c``) binned over ``grid``'s candidates."""
    c = n.col("c")
    ifs = [exp.If(this=exp.LTE(this=c.copy(), expression=n.num(m)), true=n.num(i))
           for i, m in enumerate(grid.distances[:-1])]
    case = exp.Case(ifs=ifs, default=n.num(grid.size - 1)) if ifs else n.num(0)
    inner = n.select([n.alias(case, BIN)], n.table(_PREFIX + "units"))
    final = n.select([n.col(BIN), n.alias(exp.Count(this=exp.Star()), COUNT)],
                     n.subquery(inner, _PREFIX + "bins"), group=[n.col(BIN)])
    tree = n.with_ctes([(_PREFIX + "rows", rows), (_PREFIX + "cells", cells), (_PREFIX + "units", units)], final)
    # the rows are step 1 of the bounded query (every row with its unit): never the unit-unique fast path
    return mark(tree, unit_unique=False, per_unit=False)


def totals_tree(plan: QueryPlan, table: TablePolicy, join_tree: exp.Expression | None, primitive: Primitive,
                grid: BoundsGrid) -> exp.Select:
    """The histogram statement of a SUM's per-unit element for its per-unit sum clamp
    (:mod:`dpgate.private_sum_clamp`): per (unit, group) the partial the bounded query computes
    without τ (m = the table's, the query's outer m), each unit's largest |partial|, binned over
    ``grid``'s candidates::

        WITH "__dpg_rows"  AS (<the query's rows>),
             "__dpg_cells" AS (SELECT __dpg_u, <clipped partial> AS c FROM "__dpg_rows" GROUP BY __dpg_u, __dpg_g0, …),
             "__dpg_units" AS (SELECT MAX(ABS(c)) AS c FROM "__dpg_cells" GROUP BY __dpg_u)
        SELECT CASE WHEN c <= τ_0 THEN 0 … ELSE C − 1 END AS "__dpg_b", COUNT(*) AS "__dpg_n" …

    Raises:
        ValueError: ``primitive`` is not a SUM.
    """
    if primitive.kind != "sum":
        raise ValueError(f"a per-unit sum clamp is chosen for a SUM, not {primitive.kind!r}")
    rows, g, value_of = rows_and_values(plan, table, join_tree)
    lo, hi = plan.column_policy(table, primitive.column).fixed_point_bounds
    clip = primitive_kind("sum").per_unit(value_of[primitive.column], table.max_rows_per_unit, lo, hi).clip
    u, c = n.col(_PREFIX + "u"), n.col("c")
    cells = n.select([u.copy(), n.alias(clip, "c")], n.table(_PREFIX + "rows"),
                     group=[u.copy()] + [n.col(x) for x in g])
    units = n.select([n.alias(exp.Max(this=exp.Abs(this=c.copy())), "c")], n.table(_PREFIX + "cells"),
                     group=[u.copy()])
    return _binned(rows, cells, units, grid)
