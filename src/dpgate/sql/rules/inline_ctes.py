"""Rule ``inline_ctes``: ``WITH r AS (SELECT …) SELECT … FROM r`` → the CTE's query as a derived
table in FROM (CTEs referring to earlier CTEs included; unused CTEs dropped, since nothing of
them runs). Fixtures: ``tests/fixtures/rules/inline_ctes.sql``.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.rules.base import real_args, refuse, snippet

def inline_ctes(stmt: exp.Select) -> exp.Select:
    """Replace references to common table expressions by the CTEs' queries.

    A CTE name shadows a table of the same name (as in SQL). ``WITH RECURSIVE``, column
    lists (``WITH r(a, b) AS …``) and CTEs that are not a plain SELECT are refused.

    Raises:
        UnsupportedQuery: a CTE form that cannot be inlined (quoted in the message).
    """
    with_ = stmt.args.get("with_") or stmt.args.get("with")
    if with_ is None:
        return stmt
    if with_.args.get("recursive"):
        raise refuse("WITH RECURSIVE is not supported", with_)
    stmt = stmt.copy()
    stmt.set("with_", None)
    stmt.set("with", None)
    bodies: dict[str, exp.Expression] = {}
    for cte in with_.expressions:
        alias = cte.args.get("alias")
        name = cte.alias
        if alias is not None and alias.args.get("columns"):
            raise refuse(f"column lists on a CTE ({snippet(alias)}) are not supported: "
                          "rename the columns with AS inside the CTE", cte)
        if real_args(cte) - {"this", "alias"}:
            raise refuse(f"the CTE {name!r} uses options that are not supported", cte)
        body = cte.this
        if not isinstance(body, exp.Select):
            raise refuse(f"the CTE {name!r} must be a plain SELECT", body)
        # Earlier CTEs are visible inside later ones.
        bodies[name.casefold()] = _substitute_ctes(body.copy(), bodies)
    return _substitute_ctes(stmt, bodies)


def _substitute_ctes(stmt: exp.Select, bodies: dict[str, exp.Expression]) -> exp.Select:
    def visit(node: exp.Expression) -> exp.Expression:
        if (isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier)
                and node.args.get("db") is None and node.name.casefold() in bodies):
            alias = node.args.get("alias")
            name = alias.name if alias is not None else node.name
            return exp.Subquery(this=bodies[node.name.casefold()].copy(),
                                alias=exp.TableAlias(this=exp.to_identifier(name)))
        return node

    return stmt.transform(visit, copy=False)

