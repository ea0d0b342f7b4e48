"""What the rewrite rules share: the refusal of a construct (quoted), the set arguments of a
node, the FROM clause of a SELECT, the names of clauses, and the subquery nesting limit."""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnsupportedQuery

CLAUSE_NAMES = {
    "group": "GROUP BY",
    "having": "HAVING",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "distinct": "SELECT DISTINCT",
    "joins": "JOIN",
    "laterals": "LATERAL",
    "qualify": "QUALIFY",
    "windows": "WINDOW",
    "with_": "WITH",
    "sample": "TABLESAMPLE",
}


#: Most nested derived tables / CTEs merged into one query.
MAX_DEPTH = 32


def snippet(node: exp.Expression, limit: int = 80, dialect: str = "duckdb") -> str:
    """A short SQL rendering of ``node`` for messages (at most ``limit`` characters; no data: the analyst's own text)."""
    try:
        text = node.sql(dialect=dialect, comments=False)
    except Exception:  # pragma: no cover - sqlglot cannot render some fragments
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def refuse(message: str, node: exp.Expression) -> UnsupportedQuery:
    """An UnsupportedQuery naming the construct ``node``."""
    return UnsupportedQuery(message, {"construct": snippet(node)})


def real_args(node: exp.Expression) -> set[str]:
    """The names of ``node``'s arguments that are set (not None/False/empty)."""
    return {k for k, v in node.args.items() if v not in (None, False, [], "")}


def from_clause(stmt: exp.Select) -> exp.From | None:
    """The FROM clause of ``stmt`` (sqlglot names it ``from_`` or ``from``), or None."""
    return stmt.args.get("from_") or stmt.args.get("from")

