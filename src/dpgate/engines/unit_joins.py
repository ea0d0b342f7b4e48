"""Join equalities of two integer-stored privacy units compared as integers (issue 25 item 5).

The planner compares the units of two different tables whose unit type the policy leaves as
text (or undeclared) through ``CAST(a.unit AS VARCHAR) = CAST(b.unit AS VARCHAR)``
(:meth:`dpgate.sql.sources.JoinCondition.tree`): it cannot know how each source stores its ids,
and the text form is total and one-to-one on every type. When the engine's load found both
unit columns stored as integers (:attr:`dpgate.engines.base.TableInfo.unit_integer`), the text
of an integer is its canonical decimal form (no leading zeros, no ``+``, one spelling per value),
so ``CAST(a AS VARCHAR) = CAST(b AS VARCHAR)`` holds exactly when ``a = b``, and both are NULL
when either side is NULL: :func:`integer_unit_joins` compares them as integers. The joined rows
are the same rows (a test compares them on random data); the join no longer builds two strings
per row and hashes them (about half of a 10M × 1M bounded join's time on DuckDB).

Only equalities of two plain columns of tables of the query's dataset, each that table's privacy
unit, are rewritten (a path table's attached unit is a derived column and stays as it is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from sqlglot import exp

from dpgate.errors import UnknownTable
from dpgate.policy import DatasetPolicy

if TYPE_CHECKING:
    from dpgate.engines.base import TableInfo

__all__ = ["integer_unit_joins"]


def _text_cast_column(node: exp.Expression) -> exp.Column | None:
    """``x`` of ``CAST(x AS VARCHAR)`` (sqlglot's TEXT) when x is a qualified column, else None."""
    if not (isinstance(node, exp.Cast) and node.to.is_type(exp.DataType.Type.VARCHAR, exp.DataType.Type.TEXT)):
        return None
    col = node.this
    return col if isinstance(col, exp.Column) and col.table else None


def _scope_tables(node: exp.Expression) -> dict[str, exp.Table]:
    """Alias → qualified table of the SELECT the equality ``node`` belongs to (FROM and JOINs)."""
    select = node.find_ancestor(exp.Select)
    if select is None:
        return {}
    items = [select.args.get("from_")] + list(select.args.get("joins") or [])
    out: dict[str, exp.Table] = {}
    for item in items:
        table = item.this if item is not None else None
        if isinstance(table, exp.Table) and table.db and isinstance(table.this, exp.Identifier):
            out[table.alias_or_name] = table
    return out


def integer_unit_joins(tree: exp.Expression, policy: DatasetPolicy, tables: Mapping[str, "TableInfo"]
                       ) -> exp.Expression:
    """Rewrite ``CAST(a.u AS VARCHAR) = CAST(b.u AS VARCHAR)`` to ``a.u = b.u`` where both are
    integer-stored privacy units (module docstring); the tree is changed in place and returned.

    Args:
        tree: the bounded query (DuckDB dialect) an engine is about to render.
        policy: the dataset's policy (which column is each table's privacy unit).
        tables: the engine's load state (:attr:`~dpgate.engines.base.TableInfo.unit_integer`).
    """
    def info(name: str) -> "TableInfo | None":
        return tables.get(name) or next((t for n, t in tables.items() if n.casefold() == name.casefold()), None)

    def integer_unit(col: exp.Column, scope: dict[str, exp.Table]) -> bool:
        table = scope.get(col.table)
        if table is None or table.db != policy.name:
            return False
        try:
            declared = policy.table(table.name)
        except UnknownTable:  # not a table of this dataset: leave the equality alone
            return False
        loaded = info(table.name)
        return bool(declared.privacy_unit and loaded is not None and loaded.unit_integer
                    and col.name.casefold() == declared.privacy_unit.casefold())

    for eq in list(tree.find_all(exp.EQ)):
        a, b = _text_cast_column(eq.this), _text_cast_column(eq.expression)
        if a is None or b is None:
            continue
        scope = _scope_tables(eq)
        if integer_unit(a, scope) and integer_unit(b, scope):
            eq.replace(exp.EQ(this=a.copy(), expression=b.copy()))
    return tree
