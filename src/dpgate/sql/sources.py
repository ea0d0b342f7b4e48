"""The source tree of a plan (issue 20 step 2; DESIGN.md "Compile once"): what the FROM reads.

One frozen node per kind of source, built once by the rewrite that recognises it and carried by
the plan (:attr:`dpgate.sql.plan.QueryPlan.source`, left out of the canonical form and the hash)::

    Source = TableSource(table)                          a declared table
           | JoinSource(tables, conditions) → unit_edges  a join (dpgate.sql.joins)
           | PerUnitSource(inner, ranges)                 a per-unit subquery over a TableSource or a
                                                          JoinSource (dpgate.sql.per_unit)
           | UnitPathSource(table, steps)                 a unit through foreign keys (dpgate.sql.unit_paths)
           | SemiJoinSource(outer, semi_joins)            EXISTS / IN within the unit (dpgate.sql.semi_join_source)

Each node checks its own invariants in its constructor, so a node that could not be valid
cannot be built: a :class:`JoinSource`'s unit graph is connected and each later table is
compared with one before it (:class:`UnitGraph`), its equalities are of one type family
(:class:`JoinCondition`); a :class:`PerUnitSource` reads one protected table and is one row per
unit; a :class:`UnitPathSource` is a chain of hops to unique keys (:class:`PathStep`).

Every node exposes what the consumers of a plan need:

* :attr:`Source.table`: its :class:`~dpgate.policy.TablePolicy` view (columns with types and
  bounds — a per-unit column's derived range —, privacy unit, k and m, key tuples); for a
  virtual source a :class:`VirtualTable` named by the canonical name (the marked string
  ``JOIN …``, ``PER UNIT …``, ``UNIT PATH …``: what ``QueryPlan.table`` and the plan hash
  serialise, and never parsed back);
* :meth:`Source.rows`: the rows as a sqlglot tree (None for a declared table), and
  :meth:`Source.relation`: the FROM item (a table reference or that subquery);
* :meth:`Source.describe`: explain's ``join`` / ``per_unit`` section.

:func:`plan_source` and :func:`plan_policy` are how a consumer reads a plan's source (and the
policy that declares its view, for the code that looks tables up by ``plan.table``). A plan
without a source (only :meth:`~dpgate.sql.plan.QueryPlan.from_dict` builds one) over a
declared table gets its :class:`TableSource`; over a virtual table it is refused
(:class:`SourceMissing`): compile its SQL again — a name is never parsed back into a source.

Adding a construct that reads rows in a new way = one node class here (its fields, its
``__post_init__`` checks, ``table``/``rows``/``describe``), built by the rewrite that
recognises it and returned to :func:`dpgate.sql.compile.rewrite`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlglot import exp

from dpgate import limits
from dpgate.errors import Internal, UnsupportedQuery
from dpgate.policy import DatasetPolicy, TablePolicy, quote_identifier as q
from dpgate.policy.tables import UNIT_PATH_KEY_TYPES
from dpgate.render import nodes as sqln

__all__ = ["JOIN_MARK", "PER_UNIT_MARK", "UNIT_PATH_MARK", "JoinColumn", "JoinCondition", "UnitGraph",
           "VirtualTable", "Source", "TableSource", "Occurrence", "JoinSource", "PerUnitSource", "PathStep",
           "UnitPathSource", "SourceMissing", "plan_source", "plan_policy", "with_table"]

#: Marks a joined table's name (never a declared table name: it contains spaces).
JOIN_MARK = "JOIN "
#: Marks a per-unit table's name.
PER_UNIT_MARK = "PER UNIT "
#: Marks a unit-path table's name.
UNIT_PATH_MARK = "UNIT PATH "


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
    #: the equality is the first hop of one side's unit path (``lineitem.l_orderkey =
    #: orders.o_orderkey``): that side's unit is attached through the other side's row, so the
    #: two rows have one unit (checked by :class:`JoinSource` against the path; issue 21 item 1)
    hop: bool = False

    def __post_init__(self) -> None:
        self.check_types()

    @property
    def units_compared(self) -> bool:
        """True for an equality of two protected tables' privacy units."""
        return self.left.protected and self.right.protected and self.left.unit and self.right.unit

    @property
    def unit_edge(self) -> bool:
        """True for an edge of the unit graph: an equality of two protected tables' privacy units,
        or a unit path's first hop (:attr:`hop`).

        An equality of two other columns of protected tables is an *extra key* (issue 21 item 2):
        it restricts which rows meet and is no edge; a unit compared with another column is
        refused before a condition is built (:mod:`dpgate.sql.joins`).
        """
        return self.units_compared or self.hop

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
        if self.units_compared and self.left.table != self.right.table and self.left.type == "text":
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
        if self.units_compared and self.left.table != self.right.table and self.left.type == "text":
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
        if len(self.tables) > limits.MAX_PROTECTED_OCCURRENCES:
            raise UnsupportedQuery(
                f"the join reads {len(self.tables)} protected table occurrences, more than "
                f"{limits.MAX_PROTECTED_OCCURRENCES}: each one multiplies a unit's joined rows (a unit with r rows in "
                f"each of c occurrences has r^c joined rows before the caps apply), so the query could run past the "
                f"timeout after the charge; join fewer protected tables, or aggregate per unit in a subquery first",
                {"reason": "too_many_protected_occurrences", "occurrences": len(self.tables)})
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




# --- the nodes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class VirtualTable(TablePolicy):
    """The :class:`~dpgate.policy.TablePolicy` view of a virtual source (a join, a per-unit
    subquery, a unit path): its columns, unit, k and m, named by the source's canonical name.

    Only its :class:`Source` builds one. Attributes (besides :class:`TablePolicy`'s):
        join_sql: the rows as DuckDB SQL (the text renderings read it through :attr:`relation`).
        join_tree: the same rows as a sqlglot tree (equal to the parse of ``join_sql``).
        per_unit: its rows are one per unit, kept by the row-choosing hash (engines read the flag).
    """

    join_sql: str = ""
    join_tree: exp.Select | None = field(default=None, compare=False, repr=False)
    per_unit: bool = False

    @property
    def relation(self) -> str:
        """The rows as a parenthesised subquery (used where a table name would be)."""
        return f"({self.join_sql})"


class Source:
    """A node of the source tree (module docstring). Subclasses are frozen dataclasses."""

    @property
    def table(self) -> TablePolicy:  # pragma: no cover - every node defines it
        """The node's TablePolicy view (a declared table, or a :class:`VirtualTable`)."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        """The canonical name (``QueryPlan.table``)."""
        return self.table.name

    def rows(self) -> exp.Select | None:
        """The source's rows as a fresh sqlglot tree; None for a declared table."""
        tree = getattr(self.table, "join_tree", None)
        return None if tree is None else tree.copy()

    def relation(self, alias: str | None = None) -> exp.Expression:
        """The FROM item: ``"<dataset>"."<table>" [AS alias]``, or the rows as a subquery."""
        rows = self.rows()
        if rows is None:
            return sqln.table(self.table.name, self.table.dataset, alias)
        if alias is None:
            return exp.Paren(this=rows)
        return sqln.subquery(rows, alias)

    @property
    def canonical_from(self) -> str:
        """The FROM of the plan's canonical SQL (part of the release record, not of the hash)."""
        return q(self.name)

    @property
    def unit_unique_possible(self) -> bool:
        """Whether the engine's "one row per unit" load check may skip the per-unit step: only for
        a declared table (a join or a path can give one unit several rows even then)."""
        return False

    def describe(self) -> dict[str, Any]:
        """Explain's description of where bounding happens (empty for a declared table)."""
        return {}


@dataclass(frozen=True)
class TableSource(Source):
    """A declared table of the policy."""

    declared: TablePolicy

    def __post_init__(self) -> None:
        if isinstance(self.declared, VirtualTable):
            raise Internal("a TableSource reads a declared table, not a virtual one")

    @property
    def table(self) -> TablePolicy:
        """The declared table."""
        return self.declared

    @property
    def unit_unique_possible(self) -> bool:
        """True: the load may find one row per unit in a declared table."""
        return True


@dataclass(frozen=True)
class Occurrence:
    """One table occurrence of a join's FROM.

    Attributes:
        alias: its canonical alias (``checkouts``, ``checkouts_2`` …).
        label: ``checkouts (c2)`` for messages.
        source: what it reads (a declared table; :class:`UnitGraph` only sees whether it is protected).
        side: ``""`` (the FROM table or an INNER JOIN) or ``"LEFT"``.
        written: how the query names it (its alias, else the table name), for messages.
    """

    alias: str
    label: str
    source: Source
    side: str = ""
    written: str = ""

    @property
    def protected(self) -> bool:
        """The occurrence reads a protected table."""
        return not self.source.table.public

    @property
    def declared(self) -> str:
        """The declared table it reads (a unit path's path table)."""
        return self.source.path_table.table.name if isinstance(self.source, UnitPathSource) else self.source.table.name


def _max_caps(tables: tuple[Occurrence, ...]) -> tuple[int, int]:
    protected = [o.source.table for o in tables if o.protected]
    return (max((t.max_groups_per_unit for t in protected), default=1),
            max((t.max_rows_per_unit for t in protected), default=1))


@dataclass(frozen=True)
class JoinSource(Source):
    """A join of declared tables (:mod:`dpgate.sql.joins`), checked when it is built.

    Attributes:
        tables: the occurrences in FROM order; the first protected one's unit is the join's unit.
        conditions: the join's equalities (typed :class:`JoinCondition`; left side earlier).
        view: the :class:`VirtualTable` of the joined rows.
        unit_graph: (derived at construction) the :class:`UnitGraph` of the unit equalities.

    Raises:
        UnsupportedQuery: (at construction) a condition of two types, a table after the first
            not compared with one before it (a cross join), a protected table not connected to
            the first one by unit equalities.
        Internal: the view does not match the tables (k, m, unit, public).
    """

    tables: tuple[Occurrence, ...]
    conditions: tuple[JoinCondition, ...]
    view: VirtualTable
    #: the LEFT-joined occurrences whose ON also filters their own rows (TPC-H Q13's ``o_comment NOT
    #: LIKE …``): a filter of one table's rows, never an edge of the unit graph
    left_filters: tuple[str, ...] = ()
    unit_graph: UnitGraph = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        position = {o.alias: i for i, o in enumerate(self.tables)}
        if any(a not in position or self.tables[position[a]].side != "LEFT" for a in self.left_filters):
            raise Internal("a join's own-row filter belongs to a LEFT-joined occurrence")
        for c in self.conditions:
            c.check_types()
            if c.left.alias not in position or c.right.alias not in position \
                    or position[c.left.alias] >= position[c.right.alias]:
                raise Internal(f"join condition {c.left.label} = {c.right.label}: not an earlier and a later table")
        for o in self.tables[1:]:
            if not any(c.right.alias == o.alias for c in self.conditions):
                raise UnsupportedQuery(
                    f"the ON of JOIN {o.label} compares no column of {o.written or o.alias} with a table before it: "
                    "it would be a cross join (every join needs an equality with the tables before it; inner "
                    "joins are reordered so, a LEFT JOIN keeps its place)", {})
        by_alias = {o.alias: o for o in self.tables}
        for c in self.conditions:
            if c.hop:
                _check_hop(c, by_alias[c.left.alias], by_alias[c.right.alias])
        protected = [o for o in self.tables if o.protected]
        try:
            graph = UnitGraph(  # refuses a protected table not connected
                tables=tuple((o.alias, o.label) for o in protected),
                optional=frozenset(o.alias for o in protected if o.side == "LEFT"),
                edges=self.unit_edges)
        except UnsupportedQuery as e:
            raise _path_join_hint(e, self.tables) from None
        object.__setattr__(self, "unit_graph", graph)
        k, m = _max_caps(self.tables)
        v = self.view
        if (v.public != (not protected) or (v.privacy_unit is None) != (not protected)
                or (v.max_groups_per_unit, v.max_rows_per_unit) != (k, m) or not v.name.startswith(JOIN_MARK)):
            raise Internal("a join's view does not match its tables (unit, k, m, public, name)")

    @property
    def unit_edges(self) -> tuple[tuple[str, str], ...]:
        """``(earlier alias, later alias)`` of each unit equality (the unit graph's edges)."""
        return tuple((c.left.alias, c.right.alias) for c in self.conditions if c.unit_edge)

    @property
    def table(self) -> VirtualTable:
        """The joined rows' view."""
        return self.view

    @property
    def canonical_from(self) -> str:
        """The join as the canonical SQL writes it (the canonical name without its mark)."""
        return self.view.name[len(JOIN_MARK):]

    def describe(self) -> dict[str, Any]:
        """``{"join": {"tables", "join_sql", "privacy_unit", "bounding"}}``."""
        v = self.view
        return {"join": {
            "tables": [o.declared for o in self.tables], "join_sql": v.join_sql,
            "privacy_unit": v.privacy_unit,
            "bounding": (f"after the join, on the joined rows: at most k = {v.max_groups_per_unit} "
                         f"groups and m = {v.max_rows_per_unit} rows per unit and group, values clamped")}}


def _first_hop(o: Occurrence) -> "PathStep | None":
    return o.source.steps[0] if isinstance(o.source, UnitPathSource) else None


def _check_hop(c: JoinCondition, left: Occurrence, right: Occurrence) -> None:
    """A condition marked :attr:`JoinCondition.hop` is one side's first hop to the other side's table."""
    for path, target, fk, key in ((left, right, c.left, c.right), (right, left, c.right, c.left)):
        step = _first_hop(path)
        if (step is not None and fk.column == step.column and target.declared == step.target.name
                and key.column == step.key):
            return
    raise UnsupportedQuery(f"the join condition {c.left.label} = {c.right.label} is not the first hop of a unit path",
                           {"reason": "unit_path_join", "construct": f"{c.left.label} = {c.right.label}"})


def _path_join_hint(e: UnsupportedQuery, tables: tuple[Occurrence, ...]) -> UnsupportedQuery:
    """The unit graph's refusal, naming the path a unit-path table may be joined along."""
    paths = [(o, _first_hop(o)) for o in tables if _first_hop(o) is not None]
    if not paths:
        return e
    hints = "; ".join(f"{o.written or o.alias}.{s.column} = {s.target.name}.{s.key} (the first hop of its unit "
                      f"path)" for o, s in paths)
    return UnsupportedQuery(f"{e.message}; a table whose privacy unit is a foreign-key path joins on {hints}",
                            {**e.details, "reason": "unit_path_join"})


@dataclass(frozen=True)
class PerUnitSource(Source):
    """A per-unit subquery's rows: one per unit of its inner table (:mod:`dpgate.sql.per_unit`).

    Attributes:
        inner: what the inner query reads: a protected table, or a join (issue 21 item 4) whose
            :class:`JoinSource` was checked when built (its protected tables joined on the unit, so
            each joined row is one unit's; public tables on declared columns).
        ranges: ``(column, "SUM(x): [lo, hi]")`` per outer column: its derived range, for humans.
        view: the :class:`VirtualTable` of the per-unit rows (k = m = 1; columns the inner
            aggregates with their derived ranges).

    Raises:
        Internal: (at construction) the inner table is public or record-level, the view is not one
            row per unit of that unit, or the ranges do not name the view's columns.
    """

    inner: "TableSource | JoinSource"
    ranges: tuple[tuple[str, str], ...]
    view: VirtualTable

    def __post_init__(self) -> None:
        t, v = self.inner.table, self.view
        if not isinstance(self.inner, (TableSource, JoinSource)):
            raise Internal("a per-unit source reads a declared table or a join (a JoinSource, checked when built)")
        if t.public or t.record_level:
            raise Internal(f"a per-unit source reads a table with a privacy unit, not {t.name!r}")
        if (v.max_groups_per_unit, v.max_rows_per_unit) != (1, 1) or v.privacy_unit != t.privacy_unit \
                or not v.per_unit or not v.name.startswith(PER_UNIT_MARK):
            raise Internal("a per-unit source's view must be one row per unit (k = m = 1) of its inner unit")
        if [name for name, _ in self.ranges] != list(v.columns):
            raise Internal("a per-unit source's ranges name its columns, in order")

    @property
    def table(self) -> VirtualTable:
        """The per-unit rows' view."""
        return self.view

    @property
    def inner_bound(self) -> int:
        """k·m of the inner table: the rows each unit keeps before the inner aggregates."""
        return self.inner.table.max_groups_per_unit * self.inner.table.max_rows_per_unit

    def describe(self) -> dict[str, Any]:
        """``{"per_unit": {"table", "privacy_unit", "bounding", "columns", "inner_sql"}}``."""
        return {"per_unit": {
            "table": self.inner.table.name, "privacy_unit": self.view.privacy_unit,
            "bounding": (f"before the inner aggregates: at most k·m = {self.inner_bound} rows per unit "
                         "(values clamped); each unit is then one outer row (k = m = 1)"),
            "columns": {name: text for name, text in self.ranges},
            "inner_sql": self.view.join_sql}}


@dataclass(frozen=True)
class PathStep:
    """One hop of the join along a unit path: ``source.column = target.key`` (an INNER join).

    Attributes:
        source, target: the declared tables the hop leaves and reaches.
        column: the foreign key in ``source``; ``key``: the key of ``target`` it references.

    Raises:
        UnsupportedQuery: (at construction) ``key`` is not declared unique in ``target``, either
            column is undeclared, or their types differ or are not int/text (a row could then
            reach several units, or the equality cast).
    """

    source: TablePolicy
    column: str
    target: TablePolicy
    key: str

    def __post_init__(self) -> None:
        fk, key = self.source.find_column(self.column), self.target.find_column(self.key)
        what = f"{self.source.name}.{self.column} -> {self.target.name}.{self.key}"
        if fk is None or key is None:
            raise _path_refusal(f"the unit path step {what} names an undeclared column")
        if not key.unique:
            raise _path_refusal(f"the unit path step {what} reaches a key not declared unique: a row could reach "
                                "several units")
        if fk.type != key.type or fk.type not in UNIT_PATH_KEY_TYPES:
            raise _path_refusal(f"the unit path step {what} compares {fk.type} with {key.type}: both must be int "
                                "or both text")

    def on(self) -> exp.EQ:
        """``"source"."column" = "target"."key"`` (both declared, one type: no implicit cast)."""
        return exp.EQ(this=sqln.col(self.column, self.source.name), expression=sqln.col(self.key, self.target.name))


def _path_refusal(message: str) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"reason": "unit_path"})


@dataclass(frozen=True)
class UnitPathSource(Source):
    """A path table's rows with their unit attached by INNER joins along its foreign keys
    (:mod:`dpgate.sql.unit_paths`).

    Attributes:
        path_table: the declared table whose unit is a path.
        steps: the hops, in order (each checked by :class:`PathStep`).
        view: the :class:`VirtualTable` of the rows with their unit (the path table's k, m, columns).

    Raises:
        UnsupportedQuery: (at construction) no hop, the hops do not form a chain from the path
            table, the chain visits a table twice, or it ends at a table without a unit column.
    """

    path_table: TableSource
    steps: tuple[PathStep, ...]
    view: VirtualTable

    def __post_init__(self) -> None:
        if not self.steps:
            raise _path_refusal("a unit path has at least one hop")
        if self.steps[0].source.name != self.path_table.table.name:
            raise _path_refusal("the unit path's first hop does not leave the path table")
        seen = [self.steps[0].source.name]
        for a, b in zip(self.steps, self.steps[1:] + (None,)):
            if a.target.name in seen:
                raise _path_refusal(f"the unit path returns to table {a.target.name!r}")
            seen.append(a.target.name)
            if b is not None and b.source.name != a.target.name:
                raise _path_refusal("the unit path's hops do not form a chain")
        last = self.steps[-1].target
        if last.privacy_unit is None or last.unit_path is not None:
            raise _path_refusal(f"the unit path ends at {last.name!r}, which does not carry a unit column")
        t, v = self.path_table.table, self.view
        if (v.max_groups_per_unit, v.max_rows_per_unit) != (t.max_groups_per_unit, t.max_rows_per_unit) \
                or v.public or not v.name.startswith(UNIT_PATH_MARK):
            raise Internal("a unit-path source's view has its path table's k and m")

    @property
    def table(self) -> VirtualTable:
        """The rows-with-unit view."""
        return self.view

    @property
    def tables(self) -> tuple[str, ...]:
        """The declared tables read: the path table, then each hop's target."""
        return (self.path_table.table.name,) + tuple(s.target.name for s in self.steps)

    def describe(self) -> dict[str, Any]:
        """``{"join": {"tables", "join_sql", "privacy_unit", "bounding", "unit_path"}}`` (the rows
        are a join along the path; bounding happens after it)."""
        v = self.view
        return {"join": {
            "tables": list(self.tables), "join_sql": v.join_sql, "privacy_unit": v.privacy_unit,
            "bounding": (f"after the join, on the joined rows: at most k = {v.max_groups_per_unit} "
                         f"groups and m = {v.max_rows_per_unit} rows per unit and group, values clamped")}}


# --- reading a plan's source ---------------------------------------------------------------


class SourceMissing(Internal):
    """A plan over a virtual table without its source node (a deserialised plan): compile again."""


def plan_source(plan: Any, policy: DatasetPolicy) -> Source:
    """The plan's source node: ``plan.source``, else (a plan from :meth:`QueryPlan.from_dict`) the
    :class:`TableSource` of its declared table.

    Raises:
        SourceMissing: a plan over a virtual table (a join, a per-unit subquery, a unit path)
            without its source: its name is not parsed back; compile the plan's SQL again.
    """
    source = getattr(plan, "source", None)
    if source is not None:
        return source
    table = policy.tables.get(plan.table)
    if table is not None and not isinstance(table, VirtualTable):
        return TableSource(table)
    raise SourceMissing(
        f"the plan reads {plan.table!r}, a virtual table, and carries no source (a deserialised plan): "
        "compile its SQL again", {"table": plan.table})


def plan_policy(plan: Any, policy: DatasetPolicy) -> DatasetPolicy:
    """``policy`` declaring the plan's table: itself for a declared table, else with the plan's
    source view added under its canonical name (for the code that looks ``plan.table`` up).

    Raises:
        SourceMissing: as :func:`plan_source`.
    """
    source = plan_source(plan, policy)
    if isinstance(source, TableSource) or policy.tables.get(source.name) is source.table:
        return policy
    return with_table(policy, source.table)


def with_table(policy: DatasetPolicy, table: TablePolicy) -> DatasetPolicy:
    """``policy`` with the virtual table ``table`` added under its name; ``policy`` itself is
    unchanged (frozen)."""
    tables = dict(policy.tables)
    tables[table.name] = table
    return dataclasses.replace(policy, tables=MappingProxyType(tables))
