"""Virtual tables of the FROM — a join's rows (:class:`JoinedTable`, with its checked
:class:`UnitGraph` and typed :class:`JoinCondition` equalities) — and the registry of what
planning built (:func:`remember`, :func:`recalled`).

The types the join rewrite (:mod:`dpgate.sql.joins`) and the per-unit subquery
(:mod:`dpgate.sql.per_unit`) build on, in a module of their own so that both import it and
neither imports the other at module level (the first piece of issue 20 step 2's source tree).
The rules these types enforce are described in :mod:`dpgate.sql.joins`.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy, TablePolicy, quote_identifier as q
from dpgate.render import nodes as sqln

__all__ = ["JOIN_MARK", "JoinColumn", "JoinCondition", "UnitGraph", "JoinedTable", "remember", "recalled"]

#: Marks a joined table's name (never a declared table name: it contains spaces).
JOIN_MARK = "JOIN "


#: Type families of join equalities: two columns compare only within one family.
_FAMILIES = {"int": "number", "float": "number", "text": "text", "bool": "bool", "date": "date",
             "timestamp": "timestamp"}


@dataclass(frozen=True)
class JoinColumn:
    """One side of a join equality: a column of one table occurrence of the FROM.

    Attributes:
        alias: the occurrence's canonical alias (``checkouts``, ``checkouts_2`` …).
        written: how the query names the occurrence (its alias, else the table name).
        table: the declared table.
        column: the declared column (or the privacy unit column).
        type: the declared type; ``"text"`` for a privacy unit whose type the policy does not
            declare (it is kept as stored, and its ids compare by their text).
        declared: False for such an undeclared unit.
        unit: the column is the table's privacy unit.
        protected: the table is protected (not public).
    """

    alias: str
    written: str
    table: str
    column: str
    type: str
    declared: bool
    unit: bool
    protected: bool

    @property
    def label(self) -> str:
        """``alias.column`` as the analyst wrote it (for messages)."""
        return f"{self.written}.{self.column}"

    def describe(self) -> str:
        """``c.member_id (int, the privacy unit of checkouts)`` — for messages."""
        what = self.type if self.declared else "type not declared: its ids are kept as stored and compared as text"
        if self.unit:
            what = f"the privacy unit of {self.table}, {what}"
        return f"{self.label} ({what})"


@dataclass(frozen=True)
class JoinCondition:
    """One equality of a join, ``left = right``, its sides in FROM order (module docstring).

    Built only with both sides of one type family (checked at construction, before any
    charge); :meth:`sql` renders it so that no implicit cast can fail or merge two ids.

    Raises:
        UnsupportedQuery: (at construction) the two sides' types differ, naming both columns.
    """

    left: JoinColumn
    right: JoinColumn

    def __post_init__(self) -> None:
        self.check_types()

    @property
    def unit_edge(self) -> bool:
        """True for an equality of two protected tables' privacy units (an edge of the unit graph).

        An equality of two other columns of protected tables is an *extra key* (issue 21 item 2):
        it restricts which rows meet and is no edge; a unit compared with another column is
        refused before a condition is built (:mod:`dpgate.sql.joins`).
        """
        return self.left.protected and self.right.protected and self.left.unit and self.right.unit

    def check_types(self) -> None:
        """Refuse sides of different type families (int/float, text, bool, date, timestamp)."""
        a, b = self.left, self.right
        if _FAMILIES[a.type] == _FAMILIES[b.type]:
            return
        if a.unit and b.unit:
            why = ("two tables' privacy units join only when the policy gives both the same type "
                   "({ type = \"int\" } in both tables, or { type = \"text\" } in both): compared as "
                   "integers, the text ids '7', '07', '+7' and ' 7' (four units) would all meet unit 7")
        elif {a.type, b.type} == {"date", "timestamp"}:
            why = ("a date is not compared with a timestamp: the implicit cast of a date to a timestamp "
                   "fails for dates outside the timestamp range")
        else:
            why = ("the two sides of a join equality must have the same type (int and float compare as "
                   "numbers; text, bool, date and timestamp only with their own type): the implicit cast "
                   "would fail on some values, or make different values equal")
        raise UnsupportedQuery(
            f"the join condition {a.label} = {b.label} compares {a.describe()} with {b.describe()}; {why}",
            {"construct": f"{a.label} = {b.label}", "left": a.label, "left_type": a.type,
             "right": b.label, "right_type": b.type})

    def tree(self) -> exp.EQ:
        """:meth:`sql` as a sqlglot tree (as DuckDB's parser builds it)."""
        a, b = sqln.col(self.left.column, self.left.alias), sqln.col(self.right.column, self.right.alias)
        if self.unit_edge and self.left.table != self.right.table and self.left.type == "text":
            return exp.EQ(this=sqln.cast(a, "VARCHAR"), expression=sqln.cast(b, "VARCHAR"))
        return exp.EQ(this=a, expression=b)

    def sql(self) -> str:
        """The equality in DuckDB SQL over the occurrences' canonical aliases.

        Two different tables' text (or undeclared) units compare as ``CAST(… AS VARCHAR)``:
        each side may be stored as text, an integer or an enum, and the text form is total and
        one-to-one on every type, so the comparison can neither fail nor merge ids.
        """
        a = f"{q(self.left.alias)}.{q(self.left.column)}"
        b = f"{q(self.right.alias)}.{q(self.right.column)}"
        if self.unit_edge and self.left.table != self.right.table and self.left.type == "text":
            return f"CAST({a} AS VARCHAR) = CAST({b} AS VARCHAR)"
        return f"{a} = {b}"


@dataclass(frozen=True)
class UnitGraph:
    """The unit graph of a join (module docstring; issue 19 item 1).

    Nodes are the protected table occurrences, edges the unit equalities between two of them;
    public tables are not in the graph. Built once per joined table and checked at
    construction: a :class:`UnitGraph` is always connected.

    Attributes:
        tables: ``(alias, label)`` of each protected occurrence in FROM order; the first one's
            unit is the joined table's unit (``label``: ``checkouts (c2)`` for messages).
        optional: aliases of the occurrences joined with LEFT JOIN (they may be missing from a
            joined row).
        edges: ``(earlier alias, later alias)`` per unit equality; the later table's ON holds it.

    Raises:
        UnsupportedQuery: (at construction) a protected occurrence is not connected, naming it.
    """

    tables: tuple[tuple[str, str], ...]
    optional: frozenset[str] = frozenset()
    edges: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        self.check_connected()

    def unconnected(self) -> tuple[str, str] | None:
        """The first protected occurrence that does not reach the first one, or None.

        An edge ``(a, b)`` says "where b has a row, a has one with the same unit"; when b is
        joined INNER it has a row on every joined row, so it also says the converse. A table
        reaches the first one when a chain of such implications leads there: then, on every
        joined row, its row (if any) has the unit of the first table's row.
        """
        if not self.tables:
            return None
        implies: dict[str, set[str]] = {alias: set() for alias, _ in self.tables}
        for a, b in self.edges:
            implies[b].add(a)
            if b not in self.optional:
                implies[a].add(b)
        reached = {self.tables[0][0]}
        grown = True
        while grown:
            grown = False
            for alias, targets in implies.items():
                if alias not in reached and targets & reached:
                    reached.add(alias)
                    grown = True
        return next(((a, label) for a, label in self.tables if a not in reached), None)

    def check_connected(self) -> None:
        """Refuse a protected occurrence not connected to the first one (see :meth:`unconnected`)."""
        bad = self.unconnected()
        if bad is None:
            return
        alias, label = bad
        undirected = {a: set() for a, _ in self.tables}
        for a, b in self.edges:
            undirected[a].add(b)
            undirected[b].add(a)
        seen, todo = {self.tables[0][0]}, [self.tables[0][0]]
        while todo:
            for n in undirected[todo.pop()] - seen:
                seen.add(n)
                todo.append(n)
        how = ("its unit equalities are in the ON of a LEFT JOIN, which links the LEFT-joined table to the "
               "tables before it only (where the LEFT-joined table has no row, the others' units are not "
               "compared)" if alias in seen else
               "joined only through a public table, on columns other than the privacy unit, or not at all, its rows "
               "would meet other units' rows (an equality of other columns only restricts which rows meet)")
        raise UnsupportedQuery(
            f"protected table {label} must be joined to the other protected tables on the privacy unit: "
            f"{how}; add an equality of the privacy units to its ON",
            {"table": label, "construct": label})


@dataclass(frozen=True)
class JoinedTable(TablePolicy):
    """A :class:`TablePolicy` whose rows are a join of declared tables (module docstring).

    Attributes (besides :class:`TablePolicy`'s):
        join_sql: the DuckDB subquery producing the joined rows, columns named as declared here.
        sources: the declared tables joined, in FROM order.
        unit_graph: the join's unit graph (connected: checked when it is built), or None for a
            per-unit table.
        conditions: the join's equalities (their types checked when they are built).
    """

    join_sql: str = ""
    sources: tuple[str, ...] = ()
    unit_graph: UnitGraph | None = None
    conditions: tuple[JoinCondition, ...] = ()
    #: ``join_sql`` as a sqlglot tree (equal to its parse; engines receive copies of it).
    join_tree: exp.Select | None = field(default=None, compare=False, repr=False)

    @property
    def per_unit(self) -> bool:
        """True for a per-unit subquery's table (:class:`dpgate.sql.per_unit.PerUnitTable`)."""
        return False

    @property
    def relation(self) -> str:
        """The joined rows as a parenthesised subquery (used where a table name would be)."""
        return f"({self.join_sql})"


#: id(policy) → (weak reference to it, {virtual table name → the policy with that table}): what
#: planning built, so that :func:`policy_for` finds it without parsing the name again (issue 20
#: step 2 replaces the name by a source tree carried by the plan). At most 64 policies.
_BUILT: dict[int, tuple[weakref.ref, dict[str, DatasetPolicy]]] = {}
_BUILT_LOCK = threading.Lock()
#: Virtual tables remembered per policy (the oldest is forgotten first; it is then parsed again).
_PER_POLICY = 256


def remember(policy: DatasetPolicy, name: str, built: DatasetPolicy) -> None:
    """Record that planning over ``policy`` built the virtual table ``name`` (into ``built``)."""
    with _BUILT_LOCK:
        entry = _BUILT.get(id(policy))
        if entry is None or entry[0]() is not policy:
            while len(_BUILT) >= 64:
                _BUILT.pop(next(iter(_BUILT)), None)
            entry = (weakref.ref(policy), {})
            _BUILT[id(policy)] = entry
        names = entry[1]
        names.pop(name, None)
        while len(names) >= _PER_POLICY:
            names.pop(next(iter(names)), None)
        names[name] = built


def recalled(policy: DatasetPolicy, name: str) -> DatasetPolicy | None:
    """The policy :func:`remember` recorded for (this very ``policy`` object, ``name``), or None."""
    with _BUILT_LOCK:
        entry = _BUILT.get(id(policy))
        if entry is None or entry[0]() is not policy:
            return None
        return entry[1].get(name)


def with_table(policy: DatasetPolicy, table: TablePolicy) -> DatasetPolicy:
    """``policy`` with the virtual table ``table`` (a join, per-unit or unit-path table) added under
    its name; ``policy`` itself is unchanged (frozen)."""
    import dataclasses
    from types import MappingProxyType

    tables = dict(policy.tables)
    tables[table.name] = table
    return dataclasses.replace(policy, tables=MappingProxyType(tables))


def planned_with(policy: DatasetPolicy, table: TablePolicy) -> DatasetPolicy:
    """:func:`with_table`, recorded by :func:`remember` so that the plan's ``policy_for`` finds it."""
    built = with_table(policy, table)
    remember(policy, table.name, built)
    return built

