"""Rule ``unwrap_select_star``: ``SELECT * FROM (SELECT …) AS t`` (or ``WITH t AS (…) SELECT *
FROM t``) with no other clause → the inner query, whose rows and columns it returns unchanged
(column lists on the alias were moved into the inner SELECT by :mod:`.column_lists`).
Fixtures: ``tests/fixtures/rules/unwrap_select_star.sql``.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.rules.base import from_clause, real_args
from dpgate.sql.rules.inline_ctes import inline_ctes


def _inner(stmt: exp.Select) -> exp.Select | None:
    """The derived table's query when ``stmt`` is only ``SELECT * FROM (query) [AS t]``."""
    if real_args(stmt) - {"expressions", "from_", "from"} or len(stmt.expressions) != 1:
        return None
    if not isinstance(stmt.expressions[0], exp.Star) or real_args(stmt.expressions[0]):
        return None
    source = from_clause(stmt)
    sub = source.this if source is not None else None
    if not isinstance(sub, exp.Subquery) or not isinstance(sub.this, exp.Select):
        return None
    alias = sub.args.get("alias")
    if real_args(sub) - {"this", "alias"} or (alias is not None and alias.args.get("columns")):
        return None
    return sub.this


def unwrap_select_star(stmt: exp.Select) -> exp.Select:
    """The inner query of ``SELECT * FROM (query)``, repeatedly; other statements unchanged.

    Sound because the outer query selects every column of every row of the inner one, in
    order, under the inner names: the release is the inner query's. What the inner query
    does is then planned (and refused) as if written alone — ``SELECT * FROM (SELECT * FROM t)``
    is ``SELECT * FROM t``, refused as raw rows.
    """
    tree = inline_ctes(stmt) if (stmt.args.get("with_") or stmt.args.get("with")) else stmt
    inner = _inner(tree)
    if inner is None:
        return stmt
    while inner is not None:
        tree, inner = inner, _inner(inner)
    return tree.copy()
