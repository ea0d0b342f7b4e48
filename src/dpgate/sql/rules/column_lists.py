"""Rule ``column_lists``: a column list on a CTE or a derived table's alias —
``WITH t (s, n) AS (SELECT sex, COUNT(*) …)``, ``FROM (SELECT …) AS t (s, n)`` — moved into the
query's SELECT items as aliases (``SELECT sex AS s, COUNT(*) AS n``), which mean the same.
Fixtures: ``tests/fixtures/rules/column_lists.sql``.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.rules.base import refuse, snippet


def _targets(tree: exp.Expression) -> list[tuple[exp.Expression, exp.TableAlias]]:
    out = []
    for node in tree.find_all(exp.CTE, exp.Subquery):
        alias = node.args.get("alias")
        if isinstance(alias, exp.TableAlias) and alias.args.get("columns"):
            out.append((node, alias))
    return out


def column_lists(stmt: exp.Select) -> exp.Select:
    """Move every CTE / derived-table column list into its SELECT as aliases.

    Raises:
        UnsupportedQuery: the body is not a plain SELECT, selects ``*``, or has a different
            number of items than the list names.
    """
    if not _targets(stmt):
        return stmt
    stmt = stmt.copy()
    for node, alias in _targets(stmt):
        body, names = node.this, list(alias.args["columns"])
        if not isinstance(body, exp.Select):
            raise refuse(f"a column list ({snippet(alias)}) needs a plain SELECT", node)
        items = list(body.expressions)
        if any(isinstance(i, exp.Star) or (isinstance(i, exp.Column) and isinstance(i.this, exp.Star))
               for i in items):
            raise refuse(f"a column list ({snippet(alias)}) over SELECT * is not supported: "
                         "name the columns with AS inside the query", node)
        if len(items) != len(names):
            raise refuse(f"the column list {snippet(alias)} names {len(names)} columns, the query "
                         f"selects {len(items)}", node)
        body.set("expressions", [exp.alias_(i.unalias() if isinstance(i, exp.Alias) else i, n.copy())
                                 for i, n in zip(items, names)])
        alias.set("columns", None)
    return stmt
