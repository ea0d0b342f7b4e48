"""Aggregate calls of the SELECT list, HAVING and ORDER BY → :class:`Agg` (function, column
or derived value, α for quantiles).

The allow-list of aggregates: COUNT(*), COUNT(<literal>), COUNT(<unit>), COUNT(col),
COUNT(DISTINCT col), APPROX_COUNT_DISTINCT, SUM, AVG/MEAN, VAR_POP and aliases, STDDEV_POP and
aliases, ``agg(x) FILTER (WHERE p)`` (as ``agg(CASE WHEN p THEN x END)``), ``COUNT_IF(p)`` (as
``COUNT(CASE WHEN p THEN 1 END)``), an aggregate of a
row expression (bound by :mod:`dpgate.sql.bind`, its range the clamp) and the quantiles of
:mod:`dpgate.sql.quantile` (MEDIAN, PERCENTILE_*, QUANTILE_*, MIN, MAX). Anything else is
refused with the call quoted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dpgate.policy import MAX_SQUARED_STEPS, quote_identifier
from dpgate.sql.bind import (
    AGGREGATES,
    canonical_value,
    derived_value,
    only_args,
    real_args,
    snippet,
    unbounded_message,
    unsupported,
)
from dpgate.sql.plan import DerivedValue
from dpgate.sql.quantile import QUANTILE_FUNCTIONS, is_quantile_call, quantile_call, quantile_sql
from dpgate.sql.resolve import QueryScope

NUMERIC = ("int", "float")

AGG_FUNCTION = {
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Variance: "var_pop",
    exp.VariancePop: "var_pop",
    exp.Stddev: "stddev_pop",
    exp.StddevPop: "stddev_pop",
    exp.StddevSamp: "stddev_pop",
}


AGG_SQL = {
    "count": "COUNT(*)",
    "count_column": "COUNT({c})",
    "count_distinct_unit": "COUNT(DISTINCT {c})",
    "count_distinct": "COUNT(DISTINCT {c})",
    "sum": "SUM({c})",
    "avg": "AVG({c})",
    "var_pop": "VAR_POP({c})",
    "stddev_pop": "STDDEV_POP({c})",
}


#: Aggregates sqlglot reads as anonymous functions, by lower-case name: MEAN (DuckDB),
#: VAR (T-SQL, SmartNoise), VARP and STDEVP (T-SQL's population forms), STD (MySQL's population
#: standard deviation; issue 21 item 7).
ANON_AGGREGATES = {"mean": "avg", "var": "var_pop", "varp": "var_pop", "stdevp": "stddev_pop",
                   "std": "stddev_pop"}


@dataclass(frozen=True)
class Agg:
    """One aggregate of the SELECT list as planned: the function (``count``, ``sum``, ``avg``, quantiles …), its declared column (None for COUNT(*)), a quantile's α, an aggregated expression's derived value."""
    function: str
    column: str | None
    alpha: float | None = None  # quantiles only (dpgate.sql.quantile)
    derived: DerivedValue | None = None  # an aggregated expression (dpgate.sql.bind)
    #: the declared columns the aggregated expression reads (from its bound tree: not parsed again)
    derived_columns: frozenset[str] = frozenset()
    #: the aggregated expression's canonical tree (its SQL is ``column``)
    derived_tree: exp.Expression | None = field(default=None, compare=False)


def unparen(node: exp.Expression) -> exp.Expression:
    """``node`` without enclosing parentheses (``((SUM(x)))`` → ``SUM(x)``)."""
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def is_aggregate_call(node: exp.Expression) -> bool:
    """True if ``node`` is a call of an aggregate function the planner knows (sqlglot node or an anonymous alias)."""
    if isinstance(node, AGGREGATES):
        return True
    if isinstance(node, exp.Anonymous) and node.name.lower() in ANON_AGGREGATES:
        return True
    if isinstance(node, exp.Filter):  # agg(x) FILTER (WHERE p)
        return is_aggregate_call(node.this) and not is_quantile_call(node.this)
    return is_quantile_call(node)  # quantiles hook (dpgate.sql.quantile)


def quantile_aggregate(node: exp.Expression, scope: QueryScope) -> Agg:
    """(quantile|min|max, column, α) of a quantile aggregate over a bounded numeric column."""
    function, arg, alpha = quantile_call(node)
    if isinstance(arg, exp.Distinct):
        raise unsupported(f"{snippet(node)}: DISTINCT is not supported in quantiles", node)
    if not isinstance(arg, exp.Column):
        raise unsupported(
            f"expressions inside aggregates are not supported: {snippet(node)} "
            "(the argument must be a bare declared column)", node)
    name = scope.resolve(arg)
    if scope.is_unit(name):
        raise unsupported(f"{snippet(node)}: aggregating the privacy unit column is not allowed", node)
    col = scope.table.column(name)
    if col.type not in NUMERIC:
        raise unsupported(f"{snippet(node)}: column {name!r} is {col.type}, not numeric", node)
    if not col.bounded and not scope.table.public:
        raise unsupported(
            f"{snippet(node)}: column {name!r} has no bounds in the policy (a DP quantile, "
            "minimum or maximum picks from candidates spanning [lower, upper]: declare them)", node)
    return Agg(function, name, float(alpha))


def is_constant(node: exp.Expression) -> bool:
    """True if ``node`` is a literal constant (through parentheses and unary minus)."""
    if isinstance(node, exp.Paren):
        return is_constant(node.this)
    if isinstance(node, exp.Neg):
        return is_constant(node.this)
    return isinstance(node, (exp.Literal, exp.Null, exp.Boolean))


def aggregate(node: exp.Expression, scope: QueryScope) -> Agg:
    """Map an aggregate call to (function, column or derived value), refusing anything outside
    the subset. ``agg(x) FILTER (WHERE p)`` is ``agg(CASE WHEN p THEN x END)``; COUNT(*) with a
    FILTER counts the rows where p holds."""
    if isinstance(node, exp.Filter):
        return filtered_aggregate(node, scope)
    if isinstance(node, exp.CountIf):
        return count_if_aggregate(node, scope)
    if is_quantile_call(node):
        return quantile_aggregate(node, scope)
    table = scope.table
    if isinstance(node, exp.Count):
        only_args(node, {"this", "big_int"})
        arg = node.this
        if arg is None or isinstance(arg, exp.Star):
            if isinstance(arg, exp.Star) and real_args(arg):
                raise unsupported(f"{snippet(node)} is not supported", node)
            return Agg("count", None)
        if isinstance(arg, exp.Distinct):
            items = arg.expressions
            if len(items) == 1 and isinstance(items[0], exp.Column):
                if scope.is_unit(scope.resolve(items[0])):
                    return Agg("count_distinct_unit", None)
                # issue 11: any other declared column; each unit adds at most m distinct values
                # per group (sql/bound.py)
                return Agg("count_distinct", scope.declared(items[0]).name)
            raise unsupported(
                f"{snippet(node)}: COUNT(DISTINCT …) takes one bare declared column", node)
        if isinstance(arg, exp.Literal) or (isinstance(arg, exp.Neg) and is_constant(arg)):
            return Agg("count", None)
        if isinstance(arg, (exp.Null,)):
            raise unsupported("COUNT(NULL) is 0 on any data: there is nothing to release "
                               "(nothing was charged)", node)
        if isinstance(arg, exp.Column):
            name = scope.resolve(arg)
            if scope.is_unit(name):
                return Agg("count", None)  # rows with a NULL unit are dropped
            return Agg("count_column", name)
        return expression_aggregate("count_column", arg, node, scope)
    if isinstance(node, exp.ApproxDistinct):  # APPROX_COUNT_DISTINCT: the DP estimate of COUNT(DISTINCT)
        only_args(node, {"this"})
        arg = node.this
        if isinstance(arg, exp.Column):
            if scope.is_unit(scope.resolve(arg)):
                return Agg("count_distinct_unit", None)
            return Agg("count_distinct", scope.declared(arg).name)
        raise unsupported(f"{snippet(node)} takes one bare declared column", node)
    if isinstance(node, exp.Anonymous):
        function = ANON_AGGREGATES[node.name.lower()]
        if len(node.expressions) != 1:
            raise unsupported(f"{snippet(node)} takes exactly one column", node)
        arg = node.expressions[0]
    else:
        only_args(node, {"this"})
        function = AGG_FUNCTION[type(node)]
        arg = node.this
    if isinstance(arg, exp.Distinct):
        raise unsupported(
            f"{snippet(node)}: DISTINCT inside SUM/AVG/VAR/STDDEV is not supported: the set of distinct values is shared by all privacy units, so "
            "contribution bounding cannot cap what one unit adds to it (write it without "
            "DISTINCT; COUNT(DISTINCT <privacy unit>) is supported)",
            node,
        )
    if not isinstance(arg, exp.Column):
        return expression_aggregate(function, arg, node, scope)
    name = scope.resolve(arg)
    if scope.is_unit(name):
        raise unsupported(
            f"{snippet(node)}: aggregating the privacy unit column is not allowed "
            f"(only COUNT(DISTINCT {name}))",
            node,
        )
    col = table.column(name)
    if col.type not in NUMERIC:
        raise unsupported(f"{snippet(node)}: column {name!r} is {col.type}, not numeric", node)
    if table.public:  # public tables hook: answered exactly, nothing to bound
        return Agg(function, name)
    if not col.bounded:
        raise unsupported(
            f"{snippet(node)}: column {name!r} has no bounds in the policy "
            "(declare lower and upper to SUM/AVG/VAR/STDDEV it)",
            node,
        )
    if function in ("var_pop", "stddev_pop") and max(map(abs, col.fixed_point_bounds)) > (
        MAX_SQUARED_STEPS
    ):
        raise unsupported(
            f"{snippet(node)}: the clamp of {name!r} spans more than 2**31 steps of its "
            "resolution, so its squares would overflow 64-bit integers (the policy needs a "
            "coarser resolution)",
            node,
        )
    return Agg(function, name)


def check_squares(function: str, bounds: tuple[int, int], name: str, node: exp.Expression) -> None:
    """Refuse VAR/STDDEV of a column whose clamp spans more than 2**31 fixed-point steps (its squares would overflow 64-bit integers).

    Raises: UnsupportedQuery, before the charge.
    """
    if function in ("var_pop", "stddev_pop") and max(map(abs, bounds)) > MAX_SQUARED_STEPS:
        raise unsupported(
            f"{snippet(node)}: the clamp of {name!r} spans more than 2**31 steps of its "
            "resolution, so its squares would overflow 64-bit integers (the policy needs a "
            "coarser resolution)",
            node,
        )


def filtered_aggregate(node: exp.Filter, scope: QueryScope) -> Agg:
    """``agg(x) FILTER (WHERE p)`` as the aggregate of ``CASE WHEN p THEN x END``."""
    inner, where = node.this, node.args.get("expression")
    if not is_aggregate_call(inner) or not isinstance(where, exp.Where):
        raise unsupported(f"FILTER is only supported on an aggregate: {snippet(node)}", node)
    cond = where.this
    if isinstance(inner, exp.Count):
        only_args(inner, {"this", "big_int"})
        arg = inner.this
        if isinstance(arg, exp.Distinct):
            raise unsupported(f"COUNT(DISTINCT …) with FILTER is not supported: {snippet(node)}",
                               node)
        if arg is None or isinstance(arg, exp.Star) or is_constant(arg) and not isinstance(
                arg, exp.Null):
            value: exp.Expression = exp.Literal.number(1)
        elif isinstance(arg, exp.Column) and scope.is_unit(scope.resolve(arg)):
            value = exp.Literal.number(1)
        else:
            value = arg.copy()
        case = exp.Case(ifs=[exp.If(this=cond.copy(), true=value)])
        return expression_aggregate("count_column", case, node, scope)
    if isinstance(inner, exp.Anonymous):
        function = ANON_AGGREGATES[inner.name.lower()]
        if len(inner.expressions) != 1:
            raise unsupported(f"{snippet(inner)} takes exactly one column", inner)
        arg = inner.expressions[0]
    else:
        only_args(inner, {"this"})
        function = AGG_FUNCTION.get(type(inner))
        if function is None:  # a trial: COUNT_IF(…) FILTER (…), APPROX_COUNT_DISTINCT … FILTER were a KeyError
            raise unsupported(f"FILTER is not supported on {snippet(inner)}: put the condition in the "
                              "aggregate (COUNT_IF(a AND b)) or in WHERE", node)
        arg = inner.this
    if isinstance(arg, exp.Distinct):
        raise unsupported(f"{snippet(node)}: DISTINCT is only supported in COUNT(DISTINCT "
                           "<privacy unit>)", node)
    case = exp.Case(ifs=[exp.If(this=cond.copy(), true=arg.copy())])
    return expression_aggregate(function, case, node, scope)


def count_if_aggregate(node: exp.CountIf, scope: QueryScope) -> Agg:
    """``COUNT_IF(cond)`` (DuckDB, BigQuery, Spark, Snowflake): the rows where ``cond`` is true, as
    ``COUNT(CASE WHEN cond THEN 1 END)`` — the ``count_column`` primitive over that 0/1 value, so
    a NULL or false ``cond`` is not counted and the sensitivity is COUNT(*)'s (Δ∞ = m per unit and
    group; :class:`dpgate.sql.primitives.CountColumn`). Same plan as ``COUNT(*) FILTER (WHERE cond)``.

    Raises: UnsupportedQuery when ``cond`` is missing, DISTINCT, or not a boolean row expression
    over declared columns (before the charge).
    """
    only_args(node, {"this"})
    cond = node.this
    if cond is None or isinstance(cond, (exp.Star, exp.Distinct)):
        raise unsupported(f"{snippet(node)}: COUNT_IF takes one boolean condition over declared "
                          "columns", node)
    e, _ = canonical_value(cond, scope)
    if e.type != "bool":
        raise unsupported(f"{snippet(node)}: the condition of COUNT_IF is a value of type {e.type}, not a "
                          "boolean (write COUNT_IF(x > 0), or COUNT(x) for the non-NULL values)", node)
    case = exp.Case(ifs=[exp.If(this=cond.copy(), true=exp.Literal.number(1))])
    return expression_aggregate("count_column", case, node, scope)


def expression_aggregate(function: str, arg: exp.Expression, node: exp.Expression,
                          scope: QueryScope) -> Agg:
    """An aggregate of a row expression: bind it, derive its range from the policy's bounds,
    and make the range the clamp of the per-row value (the sensitivity follows from it)."""
    if any(isinstance(n, exp.Column) and isinstance(n.this, exp.Star) for n in arg.walk()):
        raise unsupported(f"{snippet(node)} is not supported", node)
    if isinstance(arg, exp.Star):
        raise unsupported(f"{snippet(node)} is not supported", node)
    e, tree = canonical_value(arg, scope)
    if e.kind == "column" and e.type != "bool":
        # A spelling of a bare column (``(x)``, ``x + 0`` after simplification).
        col = scope.table.column(e.column)
        if function == "count_column":
            return Agg("count_column", col.name)
        if col.type in NUMERIC and col.bounded:
            check_squares(function, col.fixed_point_bounds, col.name, node)
            return Agg(function, col.name)
    if e.type not in ("int", "float", "bool"):
        raise unsupported(
            f"{snippet(node)}: the argument is a value of type {e.type}; aggregates take numbers "
            "(booleans count as 0/1)", node)
    if e.unbounded() is not None or e.range is None:
        raise unsupported(unbounded_message(e, node), node)
    d = derived_value(e, tree)
    text = e.text()
    value = DerivedValue(text, d.type, d.lower, d.upper, d.resolution, str(e.range))
    check_squares(function, value.column_policy().fixed_point_bounds, text, node)
    return Agg(function, text, derived=value,
               derived_columns=frozenset(c.name for c in e.node.find_all(exp.Column)), derived_tree=e.node)


def aggregate_sql(function: str, column: str | None, scope: QueryScope, alpha: float | None = None) -> str:
    """The canonical SQL text of one aggregate (DuckDB dialect; the unit column for COUNT(DISTINCT unit))."""
    if function in QUANTILE_FUNCTIONS:
        return quantile_sql(function, alpha, quote_identifier(column))
    if function == "count_distinct_unit":
        column = scope.table.privacy_unit
    if column and column not in scope.table.columns and column != scope.table.privacy_unit:
        return AGG_SQL[function].format(c=column)  # a derived value: canonical SQL text
    return AGG_SQL[function].format(c=quote_identifier(column) if column else "")


def aggregate_label(agg: Agg, scope: QueryScope) -> str:
    """The default display label of an aggregate (its canonical call, e.g. ``COUNT(*)``, ``SUM(x)``)."""
    if agg.function in QUANTILE_FUNCTIONS:
        return quantile_sql(agg.function, agg.alpha, agg.column)
    col = agg.column if agg.function != "count_distinct_unit" else scope.table.privacy_unit
    return AGG_SQL[agg.function].format(c=col or "")

