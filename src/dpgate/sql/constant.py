"""Plans whose answer is the same on every dataset (:func:`refuse_constant_plan`): a WHERE that no
row can satisfy, whatever the data, by SQL's three-valued logic. The gateway refuses them before
any charge: every aggregate is 0, so there is nothing to release."""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.sql.plan import QueryPlan

__all__ = ["refuse_constant_plan"]


def refuse_constant_plan(plan: QueryPlan) -> None:
    """Refuse a plan whose answer is the same on every dataset (a WHERE that is always false
    or NULL after constant folding): every aggregate is 0, so there is nothing to release
    and nothing should be charged — the same rule as ``COUNT(NULL)``.

    The planner still plans such queries (the bounding rewrite is defined for them); the
    gateway calls this before any charge.

    Raises:
        UnsupportedQuery: the WHERE clause can select no row, or the HAVING is always false.
    """
    if plan.having is not None and plan.having.upper() in ("FALSE", "NULL"):
        raise UnsupportedQuery(  # a trial: HAVING FALSE released no row, charged
            "the query releases no row on any data (a HAVING that is always false): there is "
            "nothing to release (nothing was charged)", {"construct": "HAVING"})
    if plan.where is not None and (plan.where.upper() in ("FALSE", "NULL")
                                   or _never_true(plan.where_tree()) is not None):
        raise UnsupportedQuery(
            "the WHERE clause is always false, so every aggregate is 0 on any data: there is "
            "nothing to release (nothing was charged)",
            {"construct": f"WHERE {plan.where}"},
        )


_COMPARISON_NODES = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _never_true(node: exp.Expression) -> str | None:
    """``"null"`` (NULL on every row), ``"false"`` (FALSE on every row) or ``"not true"`` (one
    of them on each row) for a canonical WHERE predicate that no row can satisfy whatever the
    data, by SQL's three-valued logic: a comparison with a NULL literal (``x = NULL``,
    ``x IN (NULL)``) is NULL, ``NOT NULL`` is NULL, ``x NOT IN (…, NULL)`` is never TRUE, an ``AND`` with such a conjunct and an
    ``OR`` of such disjuncts select nothing. None when some row might satisfy it."""
    if isinstance(node, exp.Paren):
        return _never_true(node.this)
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, exp.Boolean):
        return None if node.this else "false"
    if isinstance(node, _COMPARISON_NODES) and (isinstance(node.left, exp.Null) or isinstance(node.right, exp.Null)):
        return "null"
    if (isinstance(node, exp.In) and node.expressions
            and all(isinstance(e, exp.Null) for e in node.expressions)):
        return "null"
    if isinstance(node, exp.Not):
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, exp.In) and any(isinstance(e, exp.Null) for e in inner.expressions):
            return "not true"  # x IN (…, NULL) is TRUE or NULL, never FALSE: its NOT is never TRUE
        return "null" if _never_true(node.this) == "null" else None
    if isinstance(node, exp.And):
        parts = [_never_true(node.left), _never_true(node.right)]
        if "false" in parts:
            return "false"
        return "not true" if any(parts) else None
    if isinstance(node, exp.Or):
        parts = [_never_true(node.left), _never_true(node.right)]
        if all(parts):
            return parts[0] if parts[0] == parts[1] else "not true"
    return None
