"""The planner's static type of every node of a plan's row expressions (issue 20 step 3).

:func:`annotate` runs once, when the plan's trees are built (:func:`dpgate.sql.compile._plan_trees`,
the inner WHERE of a per-unit subquery): each node of a WHERE, computed key or aggregated value
gets its type in ``meta`` (:func:`dpgate.rendered.set_type`), which the renderer keeps on the
nodes it builds from them and the engines without DuckDB's ``TRY`` read
(:class:`~dpgate.engines.predicates.PredicateRewriter`) — they no longer re-derive types from
the columns of the tables a query reads.

The types follow DuckDB (the engine whose semantics every engine reproduces): ``int``, ``float``,
``text``, ``bool``, ``date``, ``timestamp``, ``null``, or ``?`` for a value of no type the
engines compute with (mixed operands, an unknown function; engines refuse what needs one).
``date_trunc`` and ``date ± INTERVAL`` are timestamps, a date part is an integer, ``/`` a double,
``FLOOR``/``CEIL``/``ROUND`` keep their argument's type (the rewrite spells them so). Columns take
their declared type in the plan's table (a joined or per-unit table's own columns included).

Computed keys are typed here rather than by the binder (:mod:`dpgate.sql.bind`): their domain is
enumerated, and they admit constructs the binder refuses in WHERE and aggregates (``//``, ``%``,
``SUBSTRING``). tests/test_node_types.py checks that, on every node the binder binds, the two agree.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.rendered import TYPE, type_of
from dpgate.sql.temporal import date_part

__all__ = ["annotate", "column_types_of"]

_INT_CASTS = (exp.DataType.Type.BIGINT, exp.DataType.Type.INT, exp.DataType.Type.SMALLINT)
_FLOAT_CASTS = (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT)
_TEXT_CASTS = (exp.DataType.Type.VARCHAR, exp.DataType.Type.TEXT)
_TIMESTAMP_CASTS = (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ, exp.DataType.Type.DATETIME)
_SAME_AS_ARGUMENT = (exp.Neg, exp.Abs, exp.Sign, exp.Floor, exp.Ceil, exp.Round, exp.Nullif)
_TEXT = (exp.Lower, exp.Upper, exp.Trim, exp.Concat, exp.DPipe, exp.Substring)
_BOOL = (exp.Predicate, exp.Connector, exp.Not, exp.StartsWith, exp.EndsWith, exp.Contains, exp.Boolean)


def column_types_of(columns: Mapping[str, object]) -> Callable[[str], str]:
    """Declared column name (any case) → its declared type (``?`` when undeclared), from a table's
    ``columns`` (name → :class:`~dpgate.policy.ColumnPolicy`)."""
    folded = {name.casefold(): getattr(col, "type", "?") for name, col in columns.items()}
    return lambda name: folded.get(name.casefold(), "?")


def annotate(tree: exp.Expression, column_type: Callable[[str], str]) -> exp.Expression:
    """Record the static type of every node of ``tree`` (in place; returns ``tree``).

    Children first (a breadth-first walk, reversed), so each node reads its operands' types;
    no recursion (trees as deep as the planner admits).
    """
    for node in reversed(list(tree.walk(bfs=True))):
        if isinstance(node, (exp.Identifier, exp.DataType, exp.Var, exp.DataTypeParam)):
            continue
        node.meta[TYPE] = _type(node, column_type)
    return tree


def _t(node: exp.Expression | None) -> str:
    return "?" if node is None else (type_of(node) or "?")


def _join(a: str, b: str) -> str:
    """The common type of two operands of arithmetic or a choice (``?`` when none)."""
    if a == "null":
        return b
    if b == "null":
        return a
    if a == b and a in ("int", "date", "timestamp"):
        return a
    if a in ("int", "float") and b in ("int", "float"):
        return "float"
    return "?"


def _choice(types: list[str]) -> str:
    """The type of CASE / COALESCE / GREATEST / LEAST over branches of these types."""
    out = "null"
    for t in types:
        out = t if out == "null" else (out if t in (out, "null") else _join(out, t))
    return out


def _is_date_part(node: exp.Expression) -> bool:
    try:
        return date_part(node) is not None
    except UnsupportedQuery:
        return False


def _cast_type(node: exp.Cast) -> str:
    to = node.args.get("to")
    kind = to.this if isinstance(to, exp.DataType) else None
    if kind in _INT_CASTS:
        return "int"
    if kind in _FLOAT_CASTS:
        return "float"
    if kind in _TEXT_CASTS:
        return "text"
    if kind == exp.DataType.Type.BOOLEAN:
        return "bool"
    if kind == exp.DataType.Type.DATE:
        return "date"
    return "timestamp" if kind in _TIMESTAMP_CASTS else "?"


def _type(node: exp.Expression, column_type: Callable[[str], str]) -> str:  # noqa: PLR0911 - one rule a line
    if isinstance(node, (exp.Paren, exp.Try)):
        return _t(node.this)
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        return "timestamp"
    if _is_date_part(node):
        return "int"
    if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.expression, exp.Interval):
        return "timestamp"
    if isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs") or []]
        if node.args.get("default") is not None:
            branches.append(node.args["default"])
        return _choice([_t(b) for b in branches])
    if isinstance(node, exp.Column):
        return column_type(node.name)
    if isinstance(node, exp.Literal):
        return "text" if node.is_string else ("int" if re.fullmatch(r"-?\d+", node.this) else "float")
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, exp.Cast):  # TRY_CAST too
        return _cast_type(node)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
        return _join(_t(node.this), _t(node.expression))
    if isinstance(node, _SAME_AS_ARGUMENT):
        return _t(node.this)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        return _choice([_t(a) for a in [node.this, *node.expressions]])
    if isinstance(node, exp.Div):
        return "float"
    if isinstance(node, (exp.IntDiv, exp.Mod)):
        return "int" if _t(node.this) == "int" else "?"
    if isinstance(node, _TEXT):
        return "text"
    if isinstance(node, exp.Length):
        return "int"
    if isinstance(node, _BOOL):
        return "bool"
    return "?"

