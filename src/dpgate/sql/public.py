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

import itertools

import numpy as np

from dpgate.rendered import mark
from dpgate.policy import DatasetPolicy, quote_identifier as q
from dpgate.sql.bound import _where
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan

_SRC = "__dpg_src"
_EXACT = {
    "count": "COUNT(*)",
    "count_column": "COUNT({c})",
    "count_distinct": "COUNT(DISTINCT {c})",
    "sum": "SUM({c})",
    "avg": "AVG({c})",
    "var_pop": "VAR_POP({c})",
    "stddev_pop": "STDDEV_POP({c})",
    "min": "MIN({c})",
    "max": "MAX({c})",
}


#: Most rows a public table read row by row may release (``SELECT a, b FROM genres``): the
#: release is stored and served like any other, so it stays a table, not a data export.
MAX_PUBLIC_ROWS = 100_000


def reads_rows(plan: QueryPlan) -> bool:
    """True for a row-by-row read (no GROUP BY, no aggregate): only a public table allows it."""
    return not plan.group_by and not plan.primitives


def reads_public_only(plan: QueryPlan, policy: DatasetPolicy) -> bool:
    """True when every table the plan reads is declared ``public = true``."""
    return policy.table(plan.table).public


def releases_public_keys_only(plan: QueryPlan, policy: DatasetPolicy) -> bool:
    """True for a keys-only plan over a protected table (``SELECT educ FROM pums GROUP BY
    educ``): no primitive, every group key with a policy-given domain (public keys, a
    computed key's domain, a joined public table's values). Its release is that domain,
    which is a function of the policy alone: it costs nothing (docs/DESIGN_NOTES.md, "SQL")."""
    return not plan.primitives and bool(plan.group_by) and not policy.table(plan.table).public \
        and not plan.selected_keys


def public_key_columns(plan: QueryPlan, policy: DatasetPolicy) -> dict[str, np.ndarray]:
    """Group-key column → one value per row: every combination of the keys' public values
    (declared keys in policy order, the first key varying slowest; several columns of one
    public table: the tuples that occur in it, :meth:`QueryPlan.key_domain`), the rows a
    keys-only release holds before HAVING / ORDER BY / LIMIT.

    Raises:
        ValueError: a group key has no public keys (a selected key: not a keys-only plan).
    """
    table = policy.table(plan.table)
    blocks = plan.key_domain(table)
    rows = []
    for combo in itertools.product(*[[v if len(pos) > 1 else (v,) for v in values] for pos, values in blocks]):
        row: list = [None] * len(plan.group_by)
        for (pos, _), values in zip(blocks, combo):
            for i, v in zip(pos, values):
                row[i] = v
        rows.append(row)
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(plan.group_by):
        column = np.empty(len(rows), dtype=object)
        column[:] = [r[i] for r in rows]
        out[name] = column
    return out


def exact_sql(plan: QueryPlan, policy: DatasetPolicy) -> str:
    """DuckDB SQL of the exact answer of a public-only plan; columns named by output names.

    Raises:
        ValueError: the plan reads a protected table.
    """
    table = policy.table(plan.table)
    if not table.public:
        raise ValueError(f"table {table.name!r} is not public")
    def col(c: str) -> str:  # a computed key (an aggregated expression) is its expression over the row
        computed = plan.computed_key(c)
        if computed is None and plan.derived(c) is not None:
            return f"({c})"
        return f"{q(_SRC)}.{q(c)}" if computed is None else f"({computed.expression})"
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
    def sort_key(name: str) -> str:  # a hidden ORDER BY expression is computed where it sorts
        o = plan.output(name)
        return f"({o.expression})" if isinstance(o, DerivedOutput) and o.hidden else q(name)

    order = [f"{sort_key(i.output)}{' DESC' if i.descending else ''} NULLS {'FIRST' if i.nulls_first else 'LAST'}"
             for i in plan.order_by]
    keys = [q(o.name) for o in plan.outputs if isinstance(o, KeyOutput)]
    if order or keys:
        outer += " ORDER BY " + ", ".join(order + keys)
    limit = plan.limit
    if reads_rows(plan) and (limit is None or limit > MAX_PUBLIC_ROWS):
        limit = MAX_PUBLIC_ROWS + 1  # one more, so that the caller can tell it was cut
    if limit is not None:
        outer += f" LIMIT {limit}"
    return outer


def exact_query(plan: QueryPlan, policy: DatasetPolicy):
    """:func:`exact_sql` as a sqlglot tree (what the gateway hands the engine; tests/test_render_trees.py
    checks it equals the parse of :func:`exact_sql`).

    Raises:
        ValueError: the plan reads a protected table.
    """
    from dpgate.render.exact import exact_tree

    limit = plan.limit
    if reads_rows(plan) and (limit is None or limit > MAX_PUBLIC_ROWS):
        limit = MAX_PUBLIC_ROWS + 1
    return mark(exact_tree(plan, policy, limit), unit_unique=False, per_unit=False)


def key_values_query(table, column: str, limit: int):
    """``SELECT DISTINCT "c" AS v FROM <table> WHERE "c" IS NOT NULL ORDER BY v LIMIT limit`` as a
    tree (a public table's key list)."""
    from sqlglot import exp

    from dpgate.render import nodes as n

    tree = n.select([exp.Alias(this=n.col(column), alias=n.ident("v", quoted=False))], n.table(table.name, table.dataset),
                    where=n.not_null(n.col(column)), order=[exp.column("v")])
    tree.set("distinct", exp.Distinct())
    tree.set("limit", exp.Limit(expression=n.num(limit)))
    return mark(tree, unit_unique=False, per_unit=False)


def key_tuples_query(table, columns: list[str], limit: int):
    """``SELECT DISTINCT "a", "b" FROM <table> LIMIT limit`` as a tree (the key tuples of a public
    table)."""
    from sqlglot import exp

    from dpgate.render import nodes as n

    tree = n.select([n.col(c) for c in columns], n.table(table.name, table.dataset))
    tree.set("distinct", exp.Distinct())
    tree.set("limit", exp.Limit(expression=n.num(limit)))
    return mark(tree, unit_unique=False, per_unit=False)
