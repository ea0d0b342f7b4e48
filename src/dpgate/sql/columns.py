"""What a column reference means to the binder: the scope names resolve in, and each
column's name, type and declared clamp (:class:`ColumnInfo`, from the policy only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.policy import ColumnPolicy, TablePolicy
from dpgate.sql.expr import Interval
from dpgate.sql.messages import snippet
from dpgate.sql.temporal import temporal_ordinal

NUMERIC = ("int", "float")
TEMPORAL = ("date", "timestamp")


class Scope(Protocol):
    """What the binder needs from the planner's scope."""

    def resolve(self, node: exp.Column) -> str:  # pragma: no cover - protocol
        """Declared column name (or the unit's name) of ``node``."""

    def is_unit(self, name: str) -> bool:  # pragma: no cover - protocol
        """True for the privacy unit column."""


@dataclass
class TableScope:
    """A scope over one table's declared columns (canonical names, no qualifiers)."""

    table: TablePolicy

    def resolve(self, node: exp.Column) -> str:
        """Declared column name of ``node`` (UnknownColumn otherwise)."""
        col = self.table.find_column(node.name)
        if col is not None:
            return col.name
        unit = self.table.privacy_unit
        if unit is not None and node.name.casefold() == unit.casefold():
            return unit
        raise UnknownColumn(f"table {self.table.name!r} declares no column {node.name!r}",
                            {"table": self.table.name, "column": node.name})

    def is_unit(self, name: str) -> bool:
        """True for the privacy unit column."""
        unit = self.table.privacy_unit
        return unit is not None and name.casefold() == unit.casefold()


@dataclass(frozen=True)
class ColumnInfo:
    """What a column reference means to the binder: its name, type and declared clamp."""

    name: str
    type: str
    bounds: Interval | None = None


def column_info(col: ColumnPolicy) -> ColumnInfo:
    """:class:`ColumnInfo` of a declared column (bounds only for bounded numeric columns)."""
    bounds = Interval.of(col.lower, col.upper) if col.bounded and col.type in NUMERIC else None
    if col.type in TEMPORAL and col.time_bounded:
        bounds = Interval(temporal_ordinal(col.time_lower), temporal_ordinal(col.time_upper))
    return ColumnInfo(col.name, col.type, bounds)


def row_column(scope: Any) -> Callable[[exp.Column], ColumnInfo]:
    """The column callback for row expressions of ``scope``'s table: the unit is refused."""
    table: TablePolicy = scope.table

    def info(node: exp.Column) -> ColumnInfo:
        name = scope.resolve(node)
        if scope.is_unit(name):
            raise UnsupportedQuery(
                f"the privacy unit column {name!r} may not appear in a row expression "
                f"({snippet(node.parent or node)}): it can only be counted, with "
                f"COUNT(DISTINCT {name}) or COUNT({name})",
                {"table": table.name, "column": name, "construct": snippet(node.parent or node)},
            )
        col = table.find_column(name)
        if col is None:  # pragma: no cover - resolve() raised already
            raise UnknownColumn(f"table {table.name!r} declares no column {name!r}",
                                {"table": table.name, "column": name})
        return column_info(col)

    return info

