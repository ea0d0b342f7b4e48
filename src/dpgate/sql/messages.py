"""Refusal messages of the planner: the construct quoted as the analyst wrote it.

:data:`SOURCE` holds the SQL text being planned (set by :func:`dpgate.sql.parse.parse_query`)
so that :func:`snippet` can quote a function call exactly as written; :func:`unsupported`
builds the :class:`~dpgate.errors.UnsupportedQuery` whose ``details["construct"]`` names it.
A message never contains data.
"""

from __future__ import annotations

from contextvars import ContextVar

from sqlglot import exp

from dpgate.errors import UnsupportedQuery

#: The dialect of SQL generated from the plan (and of quoted constructs by default).
DIALECT = "duckdb"


#: The SQL text being planned (so that messages can quote a function call as written).
SOURCE: ContextVar[str | None] = ContextVar("dpgate_sql_source", default=None)


def as_written(node: exp.Expression) -> str | None:
    """A function call exactly as the analyst wrote it, from the source text, or None.

    sqlglot records where a function's name starts; the call runs to the matching closing
    parenthesis (quotes respected). Other nodes carry no position and are rendered.
    """
    source = SOURCE.get()
    start = node.meta.get("start") if isinstance(node, exp.Func) else None
    if source is None or not isinstance(start, int) or not 0 <= start < len(source):
        return None
    depth, quote, i = 0, None, start
    while i < len(source):
        ch = source[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return source[start:i + 1]
        elif depth == 0 and not (ch.isalnum() or ch in "_. "):
            return None
        i += 1
    return None


def snippet(node: exp.Expression, limit: int = 80, dialect: str = DIALECT) -> str:
    """The construct as SQL text (the analyst's own construct; never data).

    A function call is quoted as written (``COUNT(DISTINCT a, b)``, not DuckDB's rewrite of
    it; see :func:`as_written`); anything else is rendered by sqlglot in ``dialect``.
    """
    try:
        text = as_written(node) or node.sql(dialect=dialect, comments=False)
    except Exception:  # pragma: no cover - sqlglot cannot render some fragments
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unsupported(message: str, node: exp.Expression | None = None) -> UnsupportedQuery:
    """An UnsupportedQuery whose details name the construct."""
    details = {"construct": snippet(node)} if node is not None else {}
    return UnsupportedQuery(message, details)


def real_args(node: exp.Expression) -> set[str]:
    """Names of the arguments of ``node`` that are set."""
    return {k for k, v in node.args.items() if v not in (None, False, [], "")}


def only_args(node: exp.Expression, allowed: set[str]) -> None:
    """Refuse ``node`` when it uses an argument outside ``allowed`` (an option we don't check)."""
    extra = real_args(node) - allowed
    if extra:
        raise unsupported(f"{snippet(node)} uses options that are not supported", node)

