"""The per-unit histogram of a private-bounds estimate as a sqlglot tree (issue 22 item 3).

One statement over the whole table (no WHERE: the estimate is shared by every later query on the
data version), built from generated names and the policy only::

    WITH "__dpg_rows" AS (SELECT <unit> AS u, ABS(<fixed-point clamp to outer> − o) AS d
                          FROM "<dataset>"."<table>" AS "__dpg_src" WHERE <unit> IS NOT NULL),
         "__dpg_units" AS (SELECT MAX(d) AS d FROM "__dpg_rows" GROUP BY u)
    SELECT CASE WHEN d <= c_0 THEN 0 … ELSE C − 1 END AS "__dpg_b", COUNT(*) AS "__dpg_n"
    FROM "__dpg_units" WHERE d IS NOT NULL GROUP BY 1

The value is the bounding rewrite's own fixed-point clamp (NULL for NULL, NaN, ±inf), so each
unit's element is the largest distance of its rows from ``o`` (:mod:`dpgate.private_bounds`).
A record-level table skips the per-unit step (each row is its unit).
"""

from __future__ import annotations

import dataclasses

from sqlglot import exp

from dpgate.rendered import mark
from dpgate.policy import ColumnPolicy, TablePolicy
from dpgate.private_bounds import BoundsGrid
from dpgate.render import nodes as n
from dpgate.render.bounded import _fixed_point

__all__ = ["histogram_tree", "BIN", "COUNT"]

_PREFIX = "__dpg_"
_SRC = _PREFIX + "src"
#: Result columns: the candidate index and the number of units snapped to it.
BIN, COUNT = _PREFIX + "b", _PREFIX + "n"


def histogram_tree(table: TablePolicy, col: ColumnPolicy, grid: BoundsGrid) -> exp.Select:
    """The histogram statement of ``col`` (clamped to its outer range) on ``table``'s candidates ``grid``."""
    assert col.private_bounds is not None
    lo, hi = col.private_bounds.outer
    outer = dataclasses.replace(col, lower=lo, upper=hi)
    ref = lambda: n.col(col.name, _SRC)  # noqa: E731
    dist = exp.Abs(this=exp.Sub(this=_fixed_point(outer, ref), expression=n.num(grid.origin)))
    src = n.table(table.name, table.dataset, _SRC)
    d = n.col("d")
    if table.privacy_unit is None:  # record level: each row is its own unit
        units: exp.Expression = n.select([n.alias(dist, "d")], src)
    else:
        unit = n.col(table.privacy_unit, _SRC)
        rows = n.select([n.alias(unit, "u"), n.alias(dist, "d")], src, where=n.not_null(unit.copy()))
        units = n.select([n.alias(exp.Max(this=d.copy()), "d")], n.subquery(rows, _PREFIX + "rows"),
                         group=[n.col("u")])
    ifs = [exp.If(this=exp.LTE(this=d.copy(), expression=n.num(c)), true=n.num(i))
           for i, c in enumerate(grid.distances[:-1])]
    case = exp.Case(ifs=ifs, default=n.num(grid.size - 1)) if ifs else n.num(0)
    inner = n.select([n.alias(case, BIN)], n.subquery(units, _PREFIX + "units"), where=n.not_null(d.copy()))
    return mark(n.select([n.col(BIN), n.alias(exp.Count(this=exp.Star()), COUNT)],
                         n.subquery(inner, _PREFIX + "bins"), group=[n.col(BIN)]), unit_unique=False, per_unit=False)
