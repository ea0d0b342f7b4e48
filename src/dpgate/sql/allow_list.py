"""The planner's allow-list of statement structure: which SELECT clauses and which nodes
may appear in a statement once the rewrite rules (:mod:`dpgate.sql.rules`, CTEs inlined,
derived tables merged, joins and per-unit subqueries turned into one table) have run.

Anything outside it is refused with a message naming the construct (and quoting it), before
any name is resolved. Row-level expressions have their own allow-list in the binder
(:mod:`dpgate.sql.bind`).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.sql.bind import real_args, snippet, unsupported

#: Most syntax-tree nodes in one query (planning cost stays bounded).
MAX_NODES = 20_000

SELECT_ARGS = {"expressions", "from_", "from", "where", "group", "having", "order", "limit", "offset"}


SELECT_ARG_NAMES = {
    "with_": "WITH (common table expressions)",
    "distinct": "SELECT DISTINCT",
    "joins": "JOIN",
    "laterals": "LATERAL",
    "qualify": "QUALIFY",
    "windows": "WINDOW clauses",
    "sample": "USING SAMPLE / TABLESAMPLE",
    "into": "SELECT INTO",
    "pivots": "PIVOT",
    "prewhere": "PREWHERE",
    "connect": "CONNECT BY",
    "locks": "FOR UPDATE",
    "settings": "SETTINGS",
    "exclude": "EXCLUDE",
    "kind": "SELECT AS STRUCT/VALUE",
}


STRUCTURAL = {
    exp.Subquery: "subqueries are not supported here (a WHERE IN/EXISTS subquery reads public tables, or one protected "
                  "table correlated within the outer row's privacy unit: otherwise it would decide one unit's rows by "
                  "other units' rows)",
    exp.Select: "subqueries are not supported here (a WHERE IN/EXISTS subquery reads public tables, or one protected "
                "table correlated within the outer row's privacy unit: otherwise it would decide one unit's rows by "
                "other units' rows)",
    exp.Exists: "subqueries (EXISTS) are not supported here (an EXISTS reads public tables correlated on one equality, "
                "or one protected table correlated within the outer row's privacy unit, as an AND-ed condition of "
                "WHERE)",
    exp.Join: "JOIN is not supported",
    exp.Lateral: "LATERAL is not supported",
    exp.Unnest: "UNNEST is not supported",
    exp.Window: "window functions (OVER …) are not supported",
    exp.With: "WITH (common table expressions) is not supported",
    exp.CTE: "WITH (common table expressions) is not supported",
    exp.SetOperation: "set operations (UNION / INTERSECT / EXCEPT) are not supported",
    exp.Placeholder: "query parameters are not supported",
    exp.Parameter: "query parameters are not supported",
    exp.TableSample: "TABLESAMPLE / USING SAMPLE is not supported",
}


def check_structure(stmt: exp.Select) -> None:
    """Refuse every SELECT clause outside the allow-list (window, QUALIFY, …) with a message naming it.

    Raises: UnsupportedQuery, before anything is executed.
    """
    for key in real_args(stmt) - SELECT_ARGS:
        name = SELECT_ARG_NAMES.get(key, key.upper())
        raise unsupported(f"{name} is not supported", stmt.args[key] if isinstance(
            stmt.args[key], exp.Expression) else None)
    for node in stmt.walk():
        if node is stmt:
            continue
        for cls, message in STRUCTURAL.items():
            if isinstance(node, cls):
                raise unsupported(f"{message}: {snippet(node)}", node)
        if isinstance(node, exp.Command):  # pragma: no cover - defensive
            raise unsupported("commands are not supported", node)



def check_size(stmt: exp.Expression) -> None:
    """Refuse a statement of more than :data:`MAX_NODES` syntax nodes.

    Raises:
        UnsupportedQuery: the statement is larger.
    """
    if sum(1 for _ in stmt.walk()) > MAX_NODES:
        raise UnsupportedQuery(f"the query is too large (more than {MAX_NODES} syntax nodes)")
