"""Name resolution of the analyst's statement against the policy: the query's scope.

One :class:`QueryScope` per planned statement, built from the policy's table that FROM names
(:func:`resolve_from`): every column reference (``t.age``, ``dataset.t.age``, ``AGE``) resolves
through it, case-insensitively, to a declared column or the privacy unit; an unknown table,
alias, dataset or column is refused with the name quoted. :func:`refuse_unit_path_tables` is
the hook of tables whose unit is a foreign-key path (issue 21).

Imports flow one way: the compiler (:mod:`dpgate.sql.compile`) and the per-unit rewrite
(:mod:`dpgate.sql.per_unit`) import this module; it imports neither of them, nor joins or
the bounding module.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy
from dpgate.sql.bind import real_args, snippet, unsupported

@dataclass
class QueryScope:
    """Name resolution of one query: the dataset policy, the table read and the qualifiers (table name, alias) its columns may carry."""
    policy: DatasetPolicy
    table: TablePolicy
    qualifiers: set[str]

    def resolve(self, node: exp.Column) -> str:
        """Declared column name (or the unit column's name) that ``node`` refers to."""
        if isinstance(node.this, exp.Star):
            raise unsupported("SELECT * is not supported: name group keys and aggregates", node)
        if node.args.get("catalog") is not None:
            raise UnknownTable(f"unknown table reference in {snippet(node)!r}",
                               {"column": snippet(node)})
        db = node.args.get("db")
        if db is not None and db.name.casefold() != self.policy.name.casefold():
            raise UnknownTable(f"unknown dataset {db.name!r} in {snippet(node)!r}",
                               {"dataset": db.name})
        tbl = node.args.get("table")
        if tbl is not None and tbl.name.casefold() not in self.qualifiers:
            raise UnknownTable(
                f"unknown table or alias {tbl.name!r} in {snippet(node)!r}", {"table": tbl.name}
            )
        col = self.table.find_column(node.name)
        if col is not None:
            return col.name
        unit = self.table.privacy_unit
        if unit is not None and node.name.casefold() == unit.casefold():
            return unit
        raise UnknownColumn(
            f"table {self.table.name!r} declares no column {node.name!r}",
            {"table": self.table.name, "column": node.name},
        )

    def is_unit(self, name: str) -> bool:
        """True when ``name`` is the table's privacy unit column (case-insensitive)."""
        unit = self.table.privacy_unit
        return unit is not None and name.casefold() == unit.casefold()

    def declared(self, node: exp.Column) -> ColumnPolicy:
        """The declared column for ``node`` (UnknownColumn for an undeclared unit column)."""
        name = self.resolve(node)
        col = self.table.find_column(name)
        if col is None:
            raise UnknownColumn(
                f"the privacy unit column {name!r} is not declared in the policy's columns; "
                f"it can only be used in COUNT(DISTINCT {name}) and COUNT({name})",
                {"table": self.table.name, "column": name},
            )
        return col


def resolve_from(stmt: exp.Select, policy: DatasetPolicy) -> tuple[TablePolicy, set[str]]:
    """The declared table a SELECT's FROM names and its qualifiers.

    Raises: UnsupportedQuery (no FROM, not one table), UnknownTable.
    """
    frm = stmt.args.get("from_") or stmt.args.get("from")
    if frm is None:
        raise UnsupportedQuery("a FROM clause naming one declared table is required")
    tbl = frm.this
    if isinstance(tbl, (exp.Subquery, exp.Select)):
        raise unsupported("subqueries in FROM are not supported", tbl)
    if not isinstance(tbl, exp.Table) or not isinstance(tbl.this, exp.Identifier):
        inner = tbl.this if isinstance(tbl, exp.Table) else tbl
        raise unsupported(
            f"table functions such as {snippet(inner)} are not supported: name a declared table",
            inner,
        )
    extra = real_args(tbl) - {"this", "db", "alias"}
    if extra:
        raise unsupported(
            f"table modifiers ({', '.join(sorted(extra))}) are not supported in {snippet(tbl)}",
            tbl,
        )
    db = tbl.args.get("db")
    if db is not None and db.name.casefold() != policy.name.casefold():
        raise UnknownTable(
            f"unknown dataset {db.name!r}: this query runs on dataset {policy.name!r}",
            {"dataset": db.name},
        )
    table = policy.table(tbl.name)
    qualifiers = {table.name.casefold()}
    alias = tbl.args.get("alias")
    if alias is not None:
        if real_args(alias) - {"this"}:
            raise unsupported("column aliases on the table are not supported", alias)
        qualifiers.add(alias.name.casefold())
    return table, qualifiers


def refuse_unit_path_tables(stmt: exp.Expression, policy: DatasetPolicy) -> None:
    """Refuse a query that reads a table whose privacy unit is a foreign-key path (issue 21 hook).

    Run once per query, after the CTEs are inlined and before any other rewrite, over every
    table the statement names (FROM, JOIN, subqueries): such a table has no unit column of its
    own (:attr:`~dpgate.policy.TablePolicy.unit_path`). The one place the planner joins along
    the path is the statement's own FROM (:func:`dpgate.sql.unit_paths.rewrite_unit_paths`,
    which calls this for every other place).

    Raises:
        UnsupportedQuery: ``details = {"reason": "unit_path", "table", "unit_path", "construct"}``.
    """
    for node in stmt.find_all(exp.Table):
        if not isinstance(node.this, exp.Identifier):
            continue
        table = policy.tables.get(node.name) or next(
            (t for t in policy.tables.values() if t.name.casefold() == node.name.casefold()), None)
        if table is not None and table.unit_path is not None:
            raise UnsupportedQuery(
                f"table {table.name!r} reaches its privacy unit through foreign keys ({table.unit_path}): "
                "the gateway attaches the unit by joining along the path when the table is read in the "
                "query's own FROM (joined or not, or in a FROM subquery that only filters and projects) or "
                "in an EXISTS/IN correlated within one unit (issue 21); inside a per-unit subquery, or read where no "
                "unit can be attached, it is not supported yet",
                {"reason": "unit_path", "table": table.name, "unit_path": table.unit_path.to_list(),
                 "construct": snippet(node)})

