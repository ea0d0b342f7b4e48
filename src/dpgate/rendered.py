"""What a rendered query carries from the planner to the engines (issue 20 steps 3 and 4).

The renderer (:mod:`dpgate.render`, :mod:`dpgate.sql.bound`, :mod:`dpgate.sql.quantile`,
:mod:`dpgate.sql.public`) hands every engine a sqlglot tree (``exp.Query``), never SQL text. Two
kinds of facts travel in the tree's ``meta`` (invisible to sqlglot's generators and optimizer, so
every engine's rendering is byte-identical to what it was without them; kept by ``copy()`` and
``transform``):

* **flags on the root** (:func:`mark`, :func:`flags`): ``unit_unique`` — the bounded query skips
  the per-unit aggregation, correct only where each unit has one row (engines refuse it on a
  table whose load did not find that); ``per_unit`` — the rows are a per-unit subquery's, kept by
  its row-choosing hash (:mod:`dpgate.sql.per_unit`; Spark refused it before issue 21 item 9). Every tree handed to an engine is marked; an unmarked
  tree is an internal error (:class:`~dpgate.errors.Internal`), never read as "no flag". Engines
  used to recognise these queries by generated names (``__dpg_unique_rows``, ``__dpg_rn``).
* **a type on the nodes of row expressions** (:func:`set_type`, :func:`type_of`): the planner's
  static type (``int``, ``float``, ``text``, ``bool``, ``date``, ``timestamp`` or ``null``, DuckDB
  semantics) of each node of the plan's row expressions (WHERE, computed keys, aggregated values;
  :func:`dpgate.sql.node_types.annotate`), propagated by the renderer onto the nodes it builds
  from them. Engines without DuckDB's ``TRY`` read it to make predicates total
  (:class:`~dpgate.engines.predicates.PredicateRewriter`) instead of re-deriving it.

The flags live on the tree rather than in a wrapper (``RenderedQuery(tree, …)``) because the tree
is what every caller already passes and transforms (proxy relations, engine rewrites); a wrapper
would have to be unwrapped and re-wrapped at each step. :func:`flags` makes them mandatory.

:func:`parse_generated` is the text → tree convenience for tests and tools (never the analyst's
text, never the gateway's path): the engines' API takes trees only.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from dpgate.errors import ExecutionError, Internal

__all__ = ["PER_UNIT", "TYPE", "TYPES", "UNIT_UNIQUE", "flags", "mark", "parse_generated", "same_type",
           "set_type", "type_of"]

#: Root meta key: the per-unit aggregation is skipped (one row per unit assumed).
UNIT_UNIQUE = "unit_unique"
#: Root meta key: the rows are a per-unit subquery's (kept by its row-choosing hash).
PER_UNIT = "per_unit"
#: Node meta key: the planner's static type of a row-expression node.
TYPE = "dpg_type"
#: The static types a node may carry.
TYPES = ("int", "float", "text", "bool", "date", "timestamp", "null")


def mark(tree: exp.Expression, *, unit_unique: bool, per_unit: bool) -> exp.Expression:
    """Set the root flags of a rendered query (both required); returns ``tree``."""
    tree.meta[UNIT_UNIQUE] = bool(unit_unique)
    tree.meta[PER_UNIT] = bool(per_unit)
    return tree


def flags(tree: exp.Expression) -> tuple[bool, bool]:
    """``(unit_unique, per_unit)`` of a rendered query.

    Raises:
        Internal: the tree was not marked by the renderer (a tree built elsewhere).
    """
    meta = tree.meta
    if UNIT_UNIQUE not in meta or PER_UNIT not in meta:
        raise Internal("an engine received a query tree without the renderer's flags (unit_unique, per_unit)")
    return bool(meta[UNIT_UNIQUE]), bool(meta[PER_UNIT])


def set_type(node: exp.Expression, type_: str) -> exp.Expression:
    """Record the planner's static type of ``node``; returns ``node``."""
    assert type_ in TYPES, type_
    node.meta[TYPE] = type_
    return node


def type_of(node: exp.Expression) -> str | None:
    """The planner's static type of ``node``, or None when it carries none."""
    meta = node._meta  # no empty dict created for the nodes without meta
    return None if meta is None else meta.get(TYPE)


def same_type(new: exp.Expression, old: exp.Expression) -> exp.Expression:
    """Give ``new`` the type of ``old`` (a node that replaces or wraps it), if it has one."""
    t = type_of(old)
    if t is not None:
        new.meta[TYPE] = t
    return new


def parse_generated(sql: str, *, unit_unique: bool = False, per_unit: bool = False) -> exp.Query:
    """DuckDB text of one generated SELECT as a marked tree (tests and tools; not the gateway's path).

    Raises:
        ExecutionError: it does not parse, or is not exactly one SELECT/WITH query.
    """
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except (SqlglotError, RecursionError, ValueError) as e:
        raise ExecutionError(f"the bounded SQL does not parse ({type(e).__name__})") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Query):
        raise ExecutionError("the engine executes exactly one SELECT statement")
    return mark(statements[0], unit_unique=unit_unique, per_unit=per_unit)
