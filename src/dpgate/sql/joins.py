"""Joins: protected tables of one population joined on the privacy unit, and public tables
joined on declared columns (issue 12 item 2), planned as one *joined table*.

A query whose FROM joins declared tables is rewritten, before the planner sees it, into a
query over a single virtual table whose rows are the join's rows — the view of its source node
(:class:`~dpgate.sql.sources.JoinSource`, carried by the plan):

* its columns are the joined tables' declared columns, named ``<column>`` when that name
  is unique among the joined tables and ``<table>_<column>`` otherwise (``<table>_2_…``
  for the second occurrence of a table in a self-join); every privacy-unit column of a
  protected table is the one unit column of the joined table (they are equal on every
  joined row: the tables are joined on it);
* its privacy unit is that column (None when every table is public: the joined table is
  then public, and the query is answered exactly for free);
* k and m are the largest of the protected tables' (a join never truncates more than a
  query on its largest table alone; privacy does not depend on the choice, because the
  caps are enforced on the joined rows and the sensitivity derived from them).

The bounding rewrite (:mod:`dpgate.sql.bound`, :mod:`dpgate.sql.quantile`) then runs on the
joined rows exactly as on one table, so the caps apply **after** the join: however one
unit's rows multiply through the join (a unit with 3 checkouts and 2 member rows has 6
joined rows; a public row matching many protected rows), the unit still adds at most m rows
to at most k groups, and the sensitivity is the one of a single table (Wilson et al. 2020
§3; the same argument as Tumult Analytics' truncation after a private join). Every joined
row carries the unit of its protected rows, which is what makes "one unit's rows" well
defined after the join.

**The unit graph** (issue 19 item 1; :class:`UnitGraph`). Its nodes are the protected table
occurrences of the FROM, its edges the unit equalities between two of them (a public table is
never an edge: two protected rows that meet through a public row may belong to two units).
Every protected occurrence must reach the first one (whose unit is the joined table's unit)
through edges, so that on every joined row all protected rows present carry the same unit. An
edge carried by the ON of an INNER JOIN holds on every joined row; one carried by the ON of a
LEFT JOIN holds only where the LEFT-joined table has a row, so it links that table to the one
before it and not the other way round (:meth:`UnitGraph.unconnected`). The graph is built and
checked once, when the join's source node is built: a :class:`~dpgate.sql.sources.JoinSource` always
has a connected one.

**Types of join equalities** (issue 19 item 2; :class:`JoinCondition`). The two sides of each
equality are of one type family: numbers (int, float: compared as numbers), text, bool,
date, timestamp — a date is never compared with a timestamp (the implicit cast of a date to a
timestamp fails for dates outside the timestamp range: an error that would depend on the data).
Every engine exposes a declared non-unit column with its declared type, so the equality runs
without an implicit cast. A privacy unit is exposed *as stored*: a unit the policy declares
``int`` is an exact integer on every engine (the loads refuse anything else), and two int units
are compared as they are; a unit declared ``text``, or whose type the policy does not declare
(kept as stored: its ids are compared by their text), is compared through ``CAST(… AS
VARCHAR)`` on both sides, which can neither fail nor merge two ids, whatever each source stores
(an integer column, text, an enum). An int unit is never joined to a text (or undeclared)
unit: '7', '07', '+7' and ' 7' are four units of a text table and would all meet unit 7.
(DuckDB and PostgreSQL compare two such units as integers when their load found both stored as
integers: the text of an integer is canonical, so the joined rows are the same and the join
hashes no strings; :mod:`dpgate.engines.unit_joins`.)

**Path tables** (issue 21 item 1). A table whose unit is a foreign-key path is joined as its
:class:`~dpgate.sql.sources.UnitPathSource` (its rows with the unit attached, :mod:`dpgate.sql.unit_paths`),
and the equality of its path's first hop with the hop's target (``lineitem.l_orderkey =
orders.o_orderkey``, the key declared unique) is an edge of the unit graph: the line's unit is
attached through exactly the order it meets (:func:`_is_hop`; checked against the path again by
the node).

**Extra keys and filters** (issue 21 items 2, 3). Besides the unit equality, two protected
tables may be joined on equalities of other columns (*extra keys*: typed like every equality,
never edges of the unit graph, so they only restrict which rows of one unit meet). An INNER
JOIN's other conjuncts (``a.v < b.w``, ``o.d < DATE '…'``) only filter rows and are moved to
WHERE; comma joins arrive here as JOIN … ON (rule :mod:`dpgate.sql.rules.comma_joins`).
Inner joins are one join graph: the tables are listed in a spanning order of their equalities
before anything is checked (:func:`_spanning_order`; a valid written order is kept). A LEFT
JOIN's ON may filter the LEFT-joined table's own rows (:func:`_left_filters`).

Refused, with the reason: protected tables connected only by extra keys (one row would then
mix two units), a unit compared with a non-unit column, cross joins or joins without ON/USING
(or, in a comma join, an equality in WHERE), a join whose ON compares nothing of the table it
joins with a table before it, non-equality conditions in a LEFT JOIN's ON, a filter in an ON
naming a later table, a LEFT JOIN ON condition naming an earlier table other than by an
equality, equalities of columns of different types, RIGHT/FULL joins, a
protected table not connected to the first one by unit equalities (only through a public
table, or only through a LEFT JOIN that may leave it out), a condition in a LEFT JOIN that
compares two earlier tables (or one that would move into a LEFT JOIN's ON), a reference to
the privacy unit of a LEFT-joined table outside ON (it is NULL where that table has no row,
the joined rows' unit is not), record-level tables and per-unit subqueries joined to others. Tables of other datasets (hence other
populations) are unknown to the query's dataset and refused as such.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy, quote_identifier as q
from dpgate.render import nodes as sqln

from dpgate.sql.sources import (  # noqa: F401 - re-exported (the source nodes' types live there)
    _FAMILIES,
    JOIN_MARK,
    JoinColumn,
    JoinCondition,
    JoinSource,
    Occurrence,
    Source,
    TableSource,
    UnitGraph,
    VirtualTable,
    with_table,
)


def _refuse(message: str, node: exp.Expression | None = None) -> UnsupportedQuery:
    details = {"construct": node.sql(dialect="duckdb")[:200]} if node is not None else {}
    return UnsupportedQuery(message, details)


@dataclass
class _Source:
    table: TablePolicy
    alias: str  # canonical alias: the table name, then name_2, name_3 …
    names: set[str]  # how the query refers to it (alias or table name), casefolded
    side: str  # "" for the FROM table and inner joins, "LEFT"
    written: str = ""  # how the query names it (its alias, else the table name), for messages
    #: what it reads: the declared table, or a path table's rows with their unit attached
    #: (:class:`~dpgate.sql.sources.UnitPathSource`; ``table`` is then its view under the table's name)
    node: Source | None = None

    @property
    def label(self) -> str:
        """``checkouts (c2)``, or ``checkouts`` when the query uses the table's name."""
        return self.table.name if self.written.casefold() == self.table.name.casefold() \
            else f"{self.table.name} ({self.written})"


def _sources(stmt: exp.Select, policy: DatasetPolicy) -> list[tuple[_Source, exp.Join | None]]:
    frm = stmt.args.get("from_") or stmt.args.get("from")
    items = [(frm.this, None)] + [(j.this, j) for j in stmt.args.get("joins") or []]
    out: list[tuple[_Source, exp.Join | None]] = []
    seen: dict[str, int] = {}
    for node, join in items:
        if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
            raise _refuse("only declared tables can be joined (no subqueries or table functions in a JOIN)", node)
        if set(k for k, v in node.args.items() if v) - {"this", "db", "alias"}:
            raise _refuse(f"table modifiers are not supported in {node.sql()}", node)
        db = node.args.get("db")
        if db is not None and db.name.casefold() != policy.name.casefold():
            raise UnknownTable(f"unknown dataset {db.name!r}: tables of another dataset (another population) "
                               f"cannot be joined; this query runs on dataset {policy.name!r}",
                               {"dataset": db.name})
        table = policy.table(node.name)
        if isinstance(table, VirtualTable):  # a per-unit subquery (sql/per_unit.py) in a join
            raise _refuse("a per-unit subquery cannot be joined to other tables (nor contain a join): it "
                          "aggregates one declared table per unit", node)
        node_source: Source = TableSource(table)
        if table.unit_path is not None:  # issue 21 item 1: the unit attached along its path first
            from dpgate.sql.unit_paths import build_source

            node_source = build_source(table, policy)
            table = dataclasses.replace(node_source.table, name=table.name)
        seen[table.name] = seen.get(table.name, 0) + 1
        alias = table.name if seen[table.name] == 1 else f"{table.name}_{seen[table.name]}"
        names = {node.alias.casefold()} if node.alias else {table.name.casefold()}
        side = ""
        if join is not None:
            side = (join.args.get("side") or "").upper()
            kind = (join.args.get("kind") or "").upper()
            if side in ("RIGHT", "FULL"):
                raise _refuse(f"{side} JOIN is not supported: write it as a LEFT JOIN with the tables swapped", join)
            if kind == "CROSS" or not (join.args.get("on") or join.args.get("using")):
                raise _refuse("cross joins are not supported: every join needs ON or USING, and every table "
                              "of a comma join an equality in WHERE with a table before it (a cross join of "
                              "protected tables would pair different units' rows; one of public tables is "
                              "refused too)", join)
            if join.args.get("method") or kind not in ("", "INNER", "OUTER"):
                raise _refuse(f"{join.sql()[:60]}: only INNER and LEFT joins are supported", join)
        out.append((_Source(table, alias, names, side, node.alias or node.name, node_source), join))
    return out


def _column_names(sources: list[_Source]) -> dict[tuple[str, str], str]:
    """(canonical alias, declared column) → the joined table's column name."""
    counts: dict[str, int] = {}
    for s in sources:
        for c in s.table.columns:
            if s.table.privacy_unit is not None and c.casefold() == s.table.privacy_unit.casefold():
                continue
            counts[c.casefold()] = counts.get(c.casefold(), 0) + 1
    out: dict[tuple[str, str], str] = {}
    used = {c.casefold() for s in sources for c in s.table.columns if counts.get(c.casefold(), 0) == 1}
    for s in sources:
        for c in s.table.columns:
            if counts.get(c.casefold(), 0) == 1:
                out[(s.alias, c)] = c
                continue
            name = f"{s.alias}_{c}"
            while name.casefold() in used:  # a trial: b.y renamed b_y met c's own column b_y (one read the other)
                name += "_"
            used.add(name.casefold())
            out[(s.alias, c)] = name
    return out


def _is_unit(s: _Source, column: str) -> bool:
    """True if ``column`` is the privacy unit of source ``s``'s (protected) table."""
    return s.table.privacy_unit is not None and column.casefold() == s.table.privacy_unit.casefold()


@dataclass
class _JoinScope:
    """The FROM of one join: its sources in order, the names they answer to, the joined columns' names."""

    pairs: list[tuple[_Source, exp.Join | None]]
    sources: list[_Source]
    protected: list[_Source]
    names: dict[tuple[str, str], str]
    by_name: dict[str, _Source]
    unit_name: str | None
    #: the INNER JOINs' ON conjuncts that only restrict rows (:func:`_equalities`), moved to WHERE
    filters: list[exp.Expression] = field(default_factory=list)
    #: a LEFT JOIN's ON conjuncts naming only the LEFT-joined table (canonical alias → conjuncts):
    #: they choose which of its rows may match (:func:`_left_filters`)
    left_filters: dict[str, list[exp.Expression]] = field(default_factory=dict)

    @classmethod
    def of(cls, stmt: exp.Select, policy: DatasetPolicy) -> "_JoinScope":
        """The sources of ``stmt``'s FROM (tables, aliases, joined column names, the unit's name).

        Raises: UnsupportedQuery (a record-level table joined, an alias used twice), UnknownTable.
        """
        pairs = _sources(stmt, policy)
        sources = [s for s, _ in pairs]
        protected = [s for s in sources if not s.table.public]
        if any(s.table.record_level for s in protected) and len(sources) > 1:
            raise _refuse("a record-level table (no privacy unit) cannot be joined: its rows have no unit to join on")
        names = _column_names(sources)
        by_name: dict[str, _Source] = {}
        for s in sources:
            for n in s.names:
                if n in by_name:
                    raise _refuse(f"the table name or alias {n!r} is used twice: give each joined table its own alias")
                by_name[n] = s
        unit_name = None
        if protected:
            unit_name = protected[0].table.privacy_unit
            taken = {v.casefold() for v in names.values()}
            while unit_name.casefold() in taken:
                unit_name = "_" + unit_name
        return cls(pairs, sources, protected, names, by_name, unit_name)

    def resolve(self, col: exp.Column) -> tuple[_Source, str]:
        """The source and declared column a (possibly qualified) column reference names."""
        qual = col.args.get("table")
        if col.args.get("catalog") is not None:
            raise UnknownTable(f"unknown table reference in {col.sql()!r}", {"column": col.sql()})
        if qual is not None:
            s = self.by_name.get(qual.name.casefold())
            if s is None:
                raise UnknownTable(f"unknown table or alias {qual.name!r} in {col.sql()!r}", {"table": qual.name})
            found = _find(s, col.name)
            if found is None:
                raise UnknownColumn(f"table {s.table.name!r} declares no column {col.name!r}",
                                    {"table": s.table.name, "column": col.name})
            return s, found
        hits = [(s, f) for s in self.sources if (f := _find(s, col.name)) is not None]
        if not hits:
            raise UnknownColumn(f"no joined table declares a column {col.name!r}", {"column": col.name})
        if len(hits) > 1 and not all(_is_unit(s, f) for s, f in hits):
            raise _refuse(f"column {col.name!r} is ambiguous in this join: qualify it with its table or alias", col)
        # the unit's name in several tables: the first table that stores it, before a path table that
        # has it attached (``o_custkey`` is orders' column; lineitem's through its unit path)
        stored = [h for h in hits if getattr(h[0].node, "steps", None) is None]
        return (stored or hits)[0]

    def side(self, s: _Source, column: str) -> JoinColumn:
        """One side of a join equality, typed from the policy."""
        col = s.table.find_column(column)
        return JoinColumn(alias=s.alias, written=s.written, table=s.table.name, column=column,
                          type=col.type if col is not None else "text", declared=col is not None,
                          unit=_is_unit(s, column), protected=not s.table.public)


_Equality = tuple[tuple[_Source, str], tuple[_Source, str]]


def _equalities(scope: _JoinScope, s: _Source, join: exp.Join) -> tuple[list[_Equality], list[exp.Expression]]:
    """The column equalities of one JOIN's USING or ON, and the ON's row filters (INNER joins only).

    An INNER JOIN's ON conjunct that is not an equality of columns of two different tables
    (``a.x < b.y``, ``o.o_orderdate < DATE '1995-03-15'``, ``l.a = l.b``) only restricts the joined
    rows, exactly as in WHERE (a later LEFT JOIN never null-extends the tables it compares): it is
    returned as a filter, and :func:`rewrite_joins` moves it to WHERE. ``ON TRUE`` adds nothing. A
    LEFT JOIN's ON decides which rows match, so there only equalities of columns are accepted.
    """
    sources = scope.sources
    eqs: list[_Equality] = []
    filters: list[exp.Expression] = []
    if join.args.get("using"):
        for ident in join.args["using"]:
            right = (s, _find(s, ident.name) or "")
            lefts = [(o, f) for o in sources[: sources.index(s)] if (f := _find(o, ident.name)) is not None]
            if not right[1] or len(lefts) != 1:
                raise _refuse(f"USING ({ident.name}) must name a column of the joined table and of exactly "
                              "one table before it", join)
            eqs.append((lefts[0], right))
        return eqs, filters
    for cond in _conjuncts(join.args["on"]):
        if s.side == "" and isinstance(cond, exp.Boolean) and cond.this is True:
            continue  # ON TRUE (the comma_joins rule's placeholder): no condition
        pair = None
        if isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) and isinstance(cond.expression, exp.Column):
            pair = (scope.resolve(cond.this), scope.resolve(cond.expression))
        if s.side == "" and (pair is None or pair[0][0] is pair[1][0]):
            _check_filter_scope(scope, s, cond)
            filters.append(cond)
            continue
        if pair is None:
            involved = {r[0].alias for c in cond.find_all(exp.Column) for r in [scope.resolve(c)]}
            if involved == {s.alias}:  # a filter on the LEFT-joined table's own rows (TPC-H Q13)
                scope.left_filters.setdefault(s.alias, []).append(cond)
                continue
            if any(not by_alias(sources, a).table.public for a in involved):
                raise _refuse(f"non-equi join conditions on protected tables are not supported in the ON of "
                              f"LEFT JOIN {s.label} ({cond.sql()}): a LEFT JOIN's ON decides which rows match, "
                              "and only equalities of columns are accepted there (join on the privacy unit with "
                              "=; filter rows in WHERE, or in the ON of an INNER JOIN)", cond)
            raise _refuse(f"the ON of LEFT JOIN {s.label} accepts equalities of columns only ({cond.sql()}): a "
                          "LEFT JOIN's ON decides which rows match; put row filters in WHERE", cond)
        eqs.append(pair)
    return eqs, filters


def _check_filter_scope(scope: _JoinScope, s: _Source, cond: exp.Expression) -> None:
    """Refuse a filter in the ON of ``s`` that names a table joined after ``s`` (not in scope there)."""
    position = scope.sources.index(s)
    for c in cond.find_all(exp.Column):
        if isinstance(c.this, exp.Star):
            continue
        t, _ = scope.resolve(c)
        if scope.sources.index(t) > position:
            raise _refuse(f"the ON of JOIN {s.label} names {c.sql()}, a column of {t.written}, which is joined "
                          "after it: write the condition in WHERE or in the ON of the later table", cond)


def _check_equality(scope: _JoinScope, s: _Source, join: exp.Join, a: _Source, ca: str, b: _Source, cb: str
                    ) -> tuple[_Source, str, _Source, str]:
    """Refuse an equality that would pair two units or label units; return it with the earlier table first."""
    if a.alias == b.alias:
        raise _refuse(f"a join condition must compare two different tables ({a.alias}.{ca} = {b.alias}.{cb})")
    if not a.table.public and not b.table.public:
        # an equality of two units is an edge of the unit graph; one of two other columns is an
        # extra key (it only restricts which rows of one unit meet: the unit graph, built from the
        # unit equalities alone, must still connect the tables); a unit compared with another
        # column is neither
        if _is_unit(a, ca) != _is_unit(b, cb):
            what = ("a self-join" if a.table.name == b.table.name else "a join of protected tables")
            unit, other = ((a, ca), (b, cb)) if _is_unit(a, ca) else ((b, cb), (a, ca))
            raise _refuse(
                f"{what} compares the privacy unit {unit[0].written}.{unit[1]} with {other[0].written}.{other[1]}, "
                f"which is not a privacy unit: join protected tables on the privacy unit "
                f"({a.table.name}.{a.table.privacy_unit} = {b.table.name}.{b.table.privacy_unit}), plus "
                "equalities of other columns if needed; a joined row must not combine rows of two different "
                "units", join)
    else:
        # a public table joined on the privacy unit would turn the unit into a group key
        # (a public row per unit id: one released cell per person), which grouping by the
        # unit itself is refused for
        for t, c, other in ((a, ca, b), (b, cb, a)):
            if not t.table.public and _is_unit(t, c):
                raise _refuse(
                    f"a public table ({other.table.name}) cannot be joined on the privacy unit "
                    f"({t.alias}.{c}): its columns would then label units, and releasing values per "
                    "unit is refused; join public tables on other columns", join)
    if scope.sources.index(a) > scope.sources.index(b):  # canonical: the earlier table first
        a, ca, b, cb = b, cb, a, ca
    # The equality is placed in the ON of its later table (below). That keeps the query's
    # meaning unless a LEFT JOIN is involved: a LEFT JOIN's condition on two earlier
    # tables decides matches, not rows, and an inner condition moved into a LEFT JOIN's
    # ON would stop filtering rows.
    if b is not s and (s.side == "LEFT" or b.side == "LEFT"):
        where = (f"the ON of LEFT JOIN {s.label}" if s.side == "LEFT"
                 else f"the ON of JOIN {s.label} (it would move into the ON of LEFT JOIN {b.label})")
        raise _refuse(f"the condition {a.written}.{ca} = {b.written}.{cb} in {where} does not compare "
                      f"{s.written} with a table before it: write each condition in the ON of the "
                      "later table it compares", join)
    return a, ca, b, cb


def _conditions(scope: _JoinScope) -> tuple[list[tuple[_Source, str, _Source, str]], list[JoinCondition]]:
    """Every join equality (checked, deduplicated, canonical order) and its typed form."""
    conditions: list[tuple[_Source, str, _Source, str]] = []
    typed: list[JoinCondition] = []
    for s, join in scope.pairs[1:]:
        eqs, filters = _equalities(scope, s, join)
        scope.filters.extend(filters)
        for (a, ca), (b, cb) in eqs:
            a, ca, b, cb = _check_equality(scope, s, join, a, ca, b, cb)
            cond = JoinCondition(scope.side(a, ca), scope.side(b, cb),  # checks the two sides' types
                                 hop=_is_hop(a, ca, b, cb) or _is_hop(b, cb, a, ca))
            if (a, ca, b, cb) not in conditions:
                conditions.append((a, ca, b, cb))
                typed.append(cond)
    return conditions, typed  # a table compared with none before it: refused by JoinSource


def _left_filters(scope: _JoinScope, policy: DatasetPolicy) -> dict[str, exp.Expression]:
    """Each LEFT-joined table's own ON filter, bound over its declared columns (canonical alias →
    the canonical predicate tree, unqualified; :func:`dpgate.sql.bind.plan_where_tree`).

    ``a LEFT JOIN b ON a.u = b.u AND b.x NOT LIKE '%y%'`` keeps every row of ``a`` and matches only
    the rows of ``b`` the filter keeps: it is ``a LEFT JOIN (SELECT * FROM b WHERE …) ON a.u = b.u``.
    The filter reads one row of ``b`` and nothing else, so it decides nothing about another unit's
    rows, and the unit graph (built from the equalities) is unchanged. It is typed and bound like a
    WHERE (the privacy unit refused in it, as there) and rendered total (``TRY``), so it cannot fail
    on some data after the charge.

    Raises:
        UnsupportedQuery, UnknownColumn: as a WHERE over that table would.
    """
    from dpgate.sql.bind import plan_where_tree
    from dpgate.sql.node_types import annotate, column_types_of
    from dpgate.sql.resolve import QueryScope

    out: dict[str, exp.Expression] = {}
    for alias, conds in scope.left_filters.items():
        s = by_alias(scope.sources, alias)
        tree = plan_where_tree(exp.and_(*[c.copy() for c in conds], copy=False),
                               QueryScope(policy, s.table, set(s.names)))
        if tree is not None:  # each node typed once, here (the engines read the types: sql.node_types)
            out[alias] = annotate(tree, column_types_of(s.table.columns))
    return out


def _qualified(tree: exp.Expression, alias: str, *, quoted: bool) -> exp.Expression:
    """A canonical predicate whose columns read ``alias``'s columns (quoted, or in canonical form)."""
    if quoted:
        from dpgate.sql.expr import total_sql

        return total_sql(tree, lambda name: exp.column(name, table=alias, quoted=True))
    return tree.transform(lambda n: exp.column(_ident(n.name), table=_ident(alias)) if isinstance(n, exp.Column) else n)


def _is_hop(path: _Source, column: str, target: _Source, key: str) -> bool:
    """``path.column = target.key`` is the first hop of ``path``'s unit path (issue 21 item 1):
    ``path``'s rows get their unit through the one ``target`` row they reach, so the two rows of a
    joined row have one unit (an edge of the unit graph; :class:`~dpgate.sql.sources.JoinSource`
    checks it against the path again)."""
    steps = getattr(path.node, "steps", None)
    return bool(steps) and steps[0].column == column and steps[0].target.name == target.table.name \
        and steps[0].key == key


def _ident(name: str) -> str:
    """A name in the canonical form: bare when it is a plain lower-case identifier, else quoted."""
    return name if name.isidentifier() and name == name.lower() else q(name)


def _joined_table(scope: _JoinScope, policy: DatasetPolicy, conditions: list[tuple[_Source, str, _Source, str]],
                  typed: list[JoinCondition]) -> JoinSource:
    """The join's source node: its view (the joined rows' columns, unit, k, m) and, checked when the
    node is built, its unit graph and conditions (:class:`~dpgate.sql.sources.JoinSource`)."""
    pairs, sources, protected, names = scope.pairs, scope.sources, scope.protected, scope.names
    columns: dict[str, ColumnPolicy] = {}
    select = []
    for s in sources:
        for c, col in s.table.columns.items():
            if _is_unit(s, c):
                continue
            v = names[(s.alias, c)]
            columns[v] = dataclasses.replace(col, name=v)
            select.append(f"{q(s.alias)}.{q(c)} AS {q(v)}")
    if protected:
        first = protected[0]
        select.insert(0, f"{q(first.alias)}.{q(first.table.privacy_unit)} AS {q(scope.unit_name)}")
    own = _left_filters(scope, policy)
    from_sql = f"{pairs[0][0].table.relation} AS {q(pairs[0][0].alias)}"
    for s, _join in pairs[1:]:
        on = [c.sql() for (a, ca, b, cb), c in zip(conditions, typed) if b is s]
        if s.alias in own:
            on.append(_qualified(own[s.alias], s.alias, quoted=True).sql(dialect="duckdb"))
        from_sql += (f" {'LEFT ' if s.side == 'LEFT' else ''}JOIN {s.table.relation} AS {q(s.alias)} "
                     f"ON {' AND '.join(on)}")
    join_tree = _join_tree(pairs, conditions, typed, sources, names, protected, scope.unit_name, _is_unit, own)
    canonical = JOIN_MARK + " ".join(
        [_ident(pairs[0][0].table.name)
         + (f" AS {_ident(pairs[0][0].alias)}" if pairs[0][0].alias != pairs[0][0].table.name else "")]
        + [f"{'LEFT ' if s.side == 'LEFT' else ''}JOIN {_ident(s.table.name)}"
           + (f" AS {_ident(s.alias)}" if s.alias != s.table.name else "")
           + " ON " + " AND ".join([f"{_ident(a.alias)}.{_ident(ca)} = {_ident(b.alias)}.{_ident(cb)}"
                                    for a, ca, b, cb in conditions if b is s]
                                   + ([_qualified(own[s.alias], s.alias, quoted=False).sql(dialect="duckdb")]
                                      if s.alias in own else []))
           for s, _ in pairs[1:]])
    k = max((s.table.max_groups_per_unit for s in protected), default=1)
    m = max((s.table.max_rows_per_unit for s in protected), default=1)
    view = VirtualTable(
        name=canonical, dataset=policy.name, source="", privacy_unit=scope.unit_name,
        max_groups_per_unit=k, max_rows_per_unit=m, columns=MappingProxyType(columns),
        path=pairs[0][0].table.path, public=not protected, join_sql=f"SELECT {', '.join(select)} FROM {from_sql}",
        join_tree=join_tree,
        private_truncation=next((s.table.private_truncation for s in protected  # issue 22 item 4: shown in releases
                                 if s.table.private_truncation is not None), None),
        # several columns of one public table joined: the combinations that occur in it (issue 19)
        key_tuples=tuple(kt.renamed({c: names[(s.alias, c)] for c in kt.columns})
                         for s in sources if s.table.public for kt in s.table.key_tuples))
    return JoinSource(  # refuses a cross join and a protected table not connected by unit equalities
        tables=tuple(Occurrence(s.alias, s.label, s.node, s.side, s.written) for s in sources),
        conditions=tuple(typed), view=view, left_filters=tuple(sorted(own)))


def _over_joined_table(stmt: exp.Select, scope: _JoinScope, canonical: str) -> exp.Select:
    """``stmt`` (a copy) rewritten to read the joined table: columns unqualified and renamed, titles kept."""
    sources, protected = scope.sources, scope.protected
    # an unqualified name that no joined table declares but a SELECT item is titled with
    # (GROUP BY binned_age) stays: the planner reads it as that item
    titles = {e.alias.casefold() for e in stmt.expressions if isinstance(e, exp.Alias)}

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.find_ancestor(exp.Select) is not None:
            return node  # inside a subquery: not the join's scope (the allow-list refuses subqueries)
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            if (node.args.get("table") is None and node.name.casefold() in titles
                    and not any(_find(s, node.name) is not None for s in sources)):
                return node
            s, c = scope.resolve(node)
            if _is_unit(s, c) and s.side == "LEFT" and s is not protected[0]:
                # the joined rows carry the first protected table's unit; this table's unit is
                # NULL where the LEFT JOIN found no row of it, so the two differ there
                raise _refuse(f"{s.written}.{c} is the privacy unit of a LEFT-joined table: the joined rows "
                              f"carry one unit (that of {protected[0].label}), and it is not NULL where "
                              f"{s.written} has no row; refer to another column of {s.written} (COUNT of it "
                              "counts the matched rows)", node)
            return exp.column(scope.unit_name if _is_unit(s, c) else scope.names[(s.alias, c)], quoted=True)
        return node

    # keep each select item's title as written (labels are not part of the plan hash)
    stmt.set("expressions", [e if isinstance(e, exp.Alias) or isinstance(e, exp.Star)
                             else exp.alias_(e, e.name if isinstance(e, exp.Column) else e.sql(dialect="duckdb")[:200],
                                             quoted=True)
                             for e in stmt.expressions])
    for key in list(stmt.args):
        if key in ("from", "from_", "joins"):
            continue
        value = stmt.args[key]
        if isinstance(value, exp.Expression):
            stmt.set(key, value.transform(rename))
        elif isinstance(value, list):
            stmt.set(key, [v.transform(rename) if isinstance(v, exp.Expression) else v for v in value])
    stmt.set("joins", None)
    stmt.set("from_" if "from_" in stmt.args else "from",
             exp.From(this=exp.Table(this=exp.Identifier(this=canonical, quoted=True))))
    return stmt


def rewrite_joins(stmt: exp.Select, policy: DatasetPolicy) -> tuple[exp.Select, DatasetPolicy, JoinSource | None]:
    """Rewrite a SELECT over a join into one over its :class:`~dpgate.sql.sources.JoinSource`'s view
    (module docstring).

    Returns ``(stmt, policy, None)`` unchanged when there is no join; else the rewritten
    statement (FROM the joined table, columns unqualified and renamed), the policy with the
    joined table's view added and the source node. In named steps: the sources
    (:class:`_JoinScope`), the checked equalities (:func:`_conditions`), the source node with its
    unit graph (:func:`_joined_table`), the statement over it (:func:`_over_joined_table`).

    Raises:
        UnsupportedQuery: a join outside the supported subset (the message says why).
        UnknownTable, UnknownColumn: undeclared tables, aliases or columns.
    """
    if not stmt.args.get("joins"):
        return stmt, policy, None
    stmt = stmt.copy()
    scope = _JoinScope.of(stmt, policy)
    reordered = _spanning_order(stmt, scope)
    if reordered is not None:  # inner joins listed with a table before its equalities: one join graph
        stmt, scope = reordered, _JoinScope.of(reordered, policy)
    conditions, typed = _conditions(scope)
    joined = _joined_table(scope, policy, conditions, typed)
    if scope.filters:  # an INNER JOIN's row filters mean the same in WHERE (see _equalities)
        where = stmt.args.get("where")
        parts = ([where.this] if where is not None else []) + [f.copy() for f in scope.filters]
        stmt.set("where", exp.Where(this=exp.and_(*parts, copy=False)))
    stmt = _over_joined_table(stmt, scope, joined.name)
    return stmt, with_table(policy, joined.table), joined


def _edges(stmt: exp.Select, scope: _JoinScope) -> set[frozenset[int]]:
    """The FROM positions each ON equality of two columns of two different tables connects."""
    position = {id(s): i for i, s in enumerate(scope.sources)}
    edges: set[frozenset[int]] = set()
    for _s, join in scope.pairs[1:]:
        for cond in _conjuncts(join.args["on"]):
            if isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) \
                    and isinstance(cond.expression, exp.Column):
                a, b = (position[id(scope.resolve(c)[0])] for c in (cond.this, cond.expression))
                if a != b:
                    edges.add(frozenset((a, b)))
    return edges


def _spanning_order(stmt: exp.Select, scope: _JoinScope) -> exp.Select | None:
    """``stmt`` with its inner-joined tables reordered so that each has an equality with one before
    it, or None when the written order already has that (or the FROM has a LEFT JOIN or USING).

    Inner joins (comma joins, whose equalities the rule :mod:`dpgate.sql.rules.comma_joins` moved
    to the ONs, and JOIN … ON) are one join graph: the same rows in any order. The order is a
    spanning order of the graph of the column equalities, deterministic: the first table as
    written, then repeatedly the first table in written order with an equality to one already
    placed, so a query whose order is already valid is left as it is (its plan and plan hash
    unchanged). Each ON conjunct moves to the ON of the latest table it names (one naming only
    the first table to the second's: for inner joins ON and WHERE mean the same). The join
    rewrite then checks the reordered join as any other (types, the unit graph).

    Raises:
        UnsupportedQuery: the graph is disconnected (a cross join between its parts), naming the parts.
    """
    pairs = scope.pairs
    if any(s.side for s, _ in pairs) or any(j.args.get("using") for _, j in pairs[1:]):
        return None
    edges = _edges(stmt, scope)
    n = len(pairs)
    if all(any(frozenset((i, j)) in edges for j in range(i)) for i in range(1, n)):
        return None
    order, placed = [0], {0}
    while len(order) < n:
        nxt = next((i for i in range(n) if i not in placed and any(frozenset((i, j)) in edges for j in placed)),
                   None)
        if nxt is None:
            parts = ", ".join(pairs[i][0].label for i in range(n) if i not in placed)
            raise _refuse(f"the joined tables form groups with no equality between them: "
                          f"{', '.join(pairs[i][0].label for i in order)} and {parts}: that would be a cross "
                          "join (a cross join of protected tables would pair different units' rows; one of "
                          "public tables is refused too); add the equality that joins them", stmt)
        order.append(nxt)
        placed.add(nxt)
    where_at = {i: k for k, i in enumerate(order)}
    position = {id(s): i for i, s in enumerate(scope.sources)}
    ons: dict[int, list[exp.Expression]] = {}
    for _s, join in pairs[1:]:
        for cond in _conjuncts(join.args["on"]):
            named = [where_at[position[id(scope.resolve(c)[0])]] for c in cond.find_all(exp.Column)
                     if not isinstance(c.this, exp.Star) and c.find_ancestor(exp.Select) is stmt]
            if not named:
                continue  # ON TRUE (the comma rule's placeholder)
            ons.setdefault(max(max(named), 1), []).append(cond.copy())
    frm = stmt.args.get("from_") or stmt.args.get("from")
    items = [(frm.this if i == 0 else pairs[i][1].this).copy() for i in order]
    out = stmt.copy()
    out.set("from_" if "from_" in out.args else "from", exp.From(this=items[0]))
    out.set("joins", [exp.Join(this=item, on=exp.and_(*ons[k], copy=False)) for k, item in enumerate(items[1:], 1)])
    return out


def _join_tree(pairs, conditions, typed, sources, names, protected, unit_name, is_unit, own) -> exp.Select:
    """The joined rows as a tree: the first protected table's unit, every other declared column
    (renamed), over the FROM with each later table's ON (a LEFT-joined table's own filter last)."""
    items = [sqln.alias(sqln.col(c, s.alias), names[(s.alias, c)])
             for s in sources for c in s.table.columns if not is_unit(s, c)]
    if protected:
        first = protected[0]
        items.insert(0, sqln.alias(sqln.col(first.table.privacy_unit, first.alias), unit_name))
    joins = []
    for s, _join in pairs[1:]:
        on = [c.tree() for (a, ca, b, cb), c in zip(conditions, typed) if b is s]
        if s.alias in own:
            on.append(_qualified(own[s.alias], s.alias, quoted=True))
        # no equality with an earlier table: a cross join, refused when the JoinSource is built
        joins.append(exp.Join(this=s.node.relation(s.alias), on=sqln.conjunction(on) if on else None,
                              side="LEFT" if s.side == "LEFT" else None))
    return sqln.select(items, pairs[0][0].node.relation(pairs[0][0].alias), joins=joins)


def by_alias(sources: list[_Source], alias: str) -> _Source:
    """The source with that canonical alias."""
    return next(s for s in sources if s.alias == alias)


def _find(s: _Source, name: str) -> str | None:
    col = s.table.find_column(name)
    if col is not None:
        return col.name
    if s.table.privacy_unit is not None and name.casefold() == s.table.privacy_unit.casefold():
        return s.table.privacy_unit
    return None


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Paren):
        return _conjuncts(node.this)
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]
