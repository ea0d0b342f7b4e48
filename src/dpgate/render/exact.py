"""The exact answer of a public-only plan as a sqlglot tree (issue 20 step 4).

The statement of :func:`dpgate.sql.public.exact_sql` built node by node:
``sqlglot.parse_one(exact_sql(...), read="duckdb")`` equals :func:`exact_tree`
(tests/test_render_trees.py). WHERE, HAVING, computed keys and derived outputs are the plan's own
trees (:class:`~dpgate.sql.plan.PlanTrees`): nothing is parsed here.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.policy import DatasetPolicy
from dpgate.render import nodes as n
from dpgate.render.bounded import row_tree
from dpgate.sql.plan import AggregateOutput, DerivedOutput, KeyOutput, QueryPlan
from dpgate.sql.sources import plan_source

_SRC = "__dpg_src"
_FUNCTIONS = {"count_column": "COUNT", "sum": "SUM", "avg": "AVG", "var_pop": "VAR_POP",
              "stddev_pop": "STDDEV_POP", "min": "MIN", "max": "MAX"}


def exact_tree(plan: QueryPlan, policy: DatasetPolicy, limit: int | None) -> exp.Select:
    """The exact answer's SELECT (``limit``: the LIMIT :func:`exact_sql` computed, or None)."""

    def src(c: str) -> exp.Expression:  # a computed key is its expression over the row (a trial: was g0)
        computed = plan.computed_key(c)
        if computed is None and plan.derived(c) is not None:  # an aggregated expression (SUM(a * b))
            return exp.Paren(this=plan.value_tree(c))
        return n.col(c, _SRC) if computed is None else exp.Paren(this=plan.key_tree(computed))
    items: list[exp.Expression] = []
    for o in plan.outputs:
        if isinstance(o, KeyOutput):
            items.append(n.alias(src(o.column), o.name))
            continue
        if isinstance(o, DerivedOutput):
            continue
        assert isinstance(o, AggregateOutput)
        if o.function == "quantile":
            alpha = plan.primitive(o.primitives[0]).alpha
            node = exp.func("QUANTILE_CONT", src(o.column), n.num(repr(alpha)), dialect="duckdb")
        elif o.function == "count":
            node = n.count()
        elif o.function == "count_distinct":
            node = exp.Count(this=exp.Distinct(expressions=[src(o.column)]), big_int=True)
        else:
            node = exp.func(_FUNCTIONS[o.function], src(o.column), dialect="duckdb")
        items.append(n.alias(node, o.name))
    where = row_tree(plan.where_tree()) if plan.where is not None else None
    inner = n.select(items, plan_source(plan, policy).relation(_SRC), where=where, group=[src(c) for c in plan.group_by])
    visible = [n.alias(exp.Paren(this=plan.derived_tree(o)), o.name) if isinstance(o, DerivedOutput) else n.col(o.name)
               for o in plan.visible_outputs]
    outer = n.select(visible, exp.Subquery(this=inner, alias=exp.TableAlias(this=n.ident("__dpg_exact", quoted=False))),
                     where=plan.having_tree() if plan.having else None)

    def sort_key(name: str) -> exp.Expression:
        o = plan.output(name)
        return exp.Paren(this=plan.derived_tree(o)) if isinstance(o, DerivedOutput) and o.hidden else n.col(name)

    order = [exp.Ordered(this=sort_key(i.output), desc=True if i.descending else None, nulls_first=bool(i.nulls_first))
             for i in plan.order_by]
    order += [exp.Ordered(this=n.col(o.name), nulls_first=False) for o in plan.outputs if isinstance(o, KeyOutput)]
    if order:
        outer.set("order", exp.Order(expressions=order))
    if limit is not None:
        outer.set("limit", exp.Limit(expression=n.num(limit)))
    return outer
