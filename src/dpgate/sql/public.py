"""Exact SQL for queries that read public tables only (``public = true`` in the policy).

A public table has no privacy unit and nothing to protect, so a query over it alone is
answered exactly and costs nothing (DESIGN.md, policy format). The SQL is still generated
from the validated plan — the analyst's text never reaches the engine — with the same
semantics as the DP path where they can differ: group keys come from the data (the public
table's own values), aggregates are DuckDB's exact ones (``QUANTILE_CONT`` for quantiles,
``MIN``/``MAX`` for the extremes, the population variance for ``VAR*``/``STDDEV*``), and
HAVING, ORDER BY and LIMIT run on the exact values. Without ORDER BY, rows come in
group-key order.
"""

from __future__ import annotations

from dpgate.policy import DatasetPolicy, quote_identifier as q
from dpgate.sql.bound import _where
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan

_SRC = "__dpg_src"
_EXACT = {
    "count": "COUNT(*)",
    "count_column": "COUNT({c})",
    "sum": "SUM({c})",
    "avg": "AVG({c})",
    "var_pop": "VAR_POP({c})",
    "stddev_pop": "STDDEV_POP({c})",
    "min": "MIN({c})",
    "max": "MAX({c})",
}


def reads_public_only(plan: QueryPlan, policy: DatasetPolicy) -> bool:
    """True when every table the plan reads is declared ``public = true``."""
    return policy.table(plan.table).public


def exact_sql(plan: QueryPlan, policy: DatasetPolicy) -> str:
    """DuckDB SQL of the exact answer of a public-only plan; columns named by output names.

    Raises:
        ValueError: the plan reads a protected table.
    """
    table = policy.table(plan.table)
    if not table.public:
        raise ValueError(f"table {table.name!r} is not public")
    col = lambda c: f"{q(_SRC)}.{q(c)}"  # noqa: E731
    items = []
    for o in plan.outputs:
        if isinstance(o, KeyOutput):
            items.append(f"{col(o.column)} AS {q(o.name)}")
            continue
        if isinstance(o, DerivedOutput):
            continue  # computed in the outer SELECT from the others' names
        assert isinstance(o, AggregateOutput)
        if o.function == "quantile":
            alpha = plan.primitive(o.primitives[0]).alpha
            expr = f"QUANTILE_CONT({col(o.column)}, {alpha!r})"
        else:
            expr = _EXACT[o.function].format(c=col(o.column) if o.column else "")
        items.append(f"{expr} AS {q(o.name)}")
    inner = f"SELECT {', '.join(items)} FROM {table.relation} AS {q(_SRC)}"
    where = _where(plan)
    if where is not None:
        inner += f" WHERE {where}"
    if plan.group_by:
        inner += " GROUP BY " + ", ".join(col(c) for c in plan.group_by)
    visible = [f"({o.expression}) AS {q(o.name)}" if isinstance(o, DerivedOutput) else q(o.name)
               for o in plan.visible_outputs]
    outer = f"SELECT {', '.join(visible)} FROM ({inner}) AS __dpg_exact"
    if plan.having:
        outer += f" WHERE {plan.having}"
    order = [f"{q(i.output)}{' DESC' if i.descending else ''} NULLS {'FIRST' if i.nulls_first else 'LAST'}"
             for i in plan.order_by]
    keys = [q(o.name) for o in plan.outputs if isinstance(o, KeyOutput)]
    if order or keys:
        outer += " ORDER BY " + ", ".join(order + keys)
    if plan.limit is not None:
        outer += f" LIMIT {plan.limit}"
    return outer
