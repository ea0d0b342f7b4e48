"""Rule ``group_by_all``: ``SELECT a, b, COUNT(*) … GROUP BY ALL`` → ``… GROUP BY a, b`` (DuckDB's
GROUP BY ALL: every SELECT item that contains no aggregate). Fixtures:
``tests/fixtures/rules/group_by_all.sql``.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.rules.base import refuse

#: Aggregates sqlglot reads as anonymous functions (:data:`dpgate.sql.aggregates.ANON_AGGREGATES`).
_ANON_AGGREGATES = frozenset({"mean", "var", "varp", "stdevp", "std"})


def _aggregated(node: exp.Expression) -> bool:
    return any(isinstance(n, (exp.AggFunc, exp.Window)) or (
        isinstance(n, exp.Anonymous) and str(n.name).lower() in _ANON_AGGREGATES) for n in node.walk())


def group_by_all(stmt: exp.Select) -> exp.Select:
    """Spell out GROUP BY ALL as the SELECT items without aggregates (aliases dropped), in SELECT
    order, in every SELECT of the statement.

    Items without a column (constants) are left out: a constant does not split groups. A
    ``SELECT *`` next to GROUP BY ALL is refused (the key list would depend on the schema).
    The result plans exactly as the query written with its keys (same plan hash).

    Raises:
        UnsupportedQuery: GROUP BY ALL with ``*`` in the SELECT list, or with other grouping
            items (``GROUP BY ALL, x``).
    """
    def targets(tree: exp.Expression):
        return [s for s in tree.find_all(exp.Select)
                if isinstance(s.args.get("group"), exp.Group) and s.args["group"].args.get("all")]

    if not targets(stmt):
        return stmt
    stmt = stmt.copy()
    for select in targets(stmt):
        group = select.args["group"]
        if any(v for k, v in group.args.items() if k != "all"):
            raise refuse("GROUP BY ALL cannot be combined with other grouping items", group)
        keys = []
        for item in select.expressions:
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                raise refuse("GROUP BY ALL with SELECT * is not supported: list the columns", item)
            value = item.unalias() if isinstance(item, exp.Alias) else item
            if _aggregated(value) or value.find(exp.Column) is None:
                continue
            keys.append(value.copy())
        select.set("group", exp.Group(expressions=keys) if keys else None)
    return stmt
