"""Semi-joins over protected tables (issue 21 item 5): ``[NOT] EXISTS (SELECT … FROM t WHERE
t.k = o.k AND …)`` and ``o.k IN (SELECT t.k FROM t [WHERE …] [GROUP BY t.k [HAVING …]])``, answered
when the correlation keeps the subquery inside the outer row's own privacy unit.

Two steps of the compiler (:func:`dpgate.sql.compile.rewrite`):

1. :func:`extract_semi_joins`, after the statement rules: each AND-ed condition of WHERE that is an
   EXISTS, NOT EXISTS or IN subquery reading a protected table is taken out of WHERE (the rules
   before it leave such subqueries alone: :func:`in_semi_join`).
2. :func:`attach_semi_joins`, after the join rewrite: the outer source (a declared table, a unit path
   or a join) becomes a :class:`~dpgate.sql.semi_join_source.SemiJoinSource` — the outer rows
   filtered by the subqueries — whose construction checks the property (module docstring there):
   every subquery is correlated by at least one :class:`~dpgate.sql.semi_join_source.UnitLink`.

An ``IN`` is the EXISTS it means in a WHERE: ``x IN (SELECT c FROM t WHERE w GROUP BY c HAVING h)``
is TRUE exactly when ``EXISTS (SELECT 1 FROM t WHERE w AND t.c = x GROUP BY t.c HAVING h)`` is (a
top-level condition keeps only TRUE rows, so IN's NULL and FALSE both drop the row). ``NOT IN`` is
refused: it is NULL for every row as soon as one inner row of *any* unit has a NULL ``c``.

The subquery's other conditions (``l3.l_suppkey <> l1.l_suppkey``, ``l_commitdate <
l_receiptdate``) are bound like a WHERE (:func:`dpgate.sql.bind.plan_where_tree`: declared columns,
types, the function allow-list), over the inner table's columns and the outer row's; a HAVING
compares ``SUM``/``COUNT``/``AVG``/``MIN``/``MAX`` of inner columns with numbers. The privacy units
appear only in the correlation's equalities.

Refused (``UnsupportedQuery``, ``details.reason = "semi_join"``, before anything is charged): an
EXISTS/IN over a protected table that is not an AND-ed condition of WHERE (under OR, in SELECT or
HAVING), uncorrelated or correlated on columns that do not prove one unit (see
:class:`~dpgate.sql.semi_join_source.UnitLink`), a subquery that joins, nests another subquery,
groups (an EXISTS; an IN by other than its selected column), limits or reads a public table with a
protected one, ``NOT IN``, and an outer source that is public or a per-unit subquery.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy
from dpgate.render import nodes as sqln
from dpgate.sql.bind import plan_where_tree
from dpgate.sql.resolve import QueryScope, resolve_from
from dpgate.sql.semi_join_source import SEMI_JOIN_MARK, SemiJoin, SemiJoinSource, UnitLink, refusal
from dpgate.sql.sources import JoinSource, Source, TableSource, UnitPathSource, VirtualTable, with_table

__all__ = ["attach_semi_joins", "extract_semi_joins", "in_semi_join", "Pending"]

_OUTER = "__dpg_outer"
_AGGREGATES = (exp.Sum, exp.Count, exp.Avg, exp.Min, exp.Max)
_COMPARISONS = (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)


@dataclass(frozen=True)
class Pending:
    """A semi-join taken out of WHERE: the subquery (EXISTS form), NOT, and the text written."""

    select: exp.Select
    negated: bool
    text: str


def _text(node: exp.Expression) -> str:
    return " ".join(node.sql(dialect="duckdb").split())[:200]


def _subquery(node: exp.Expression) -> exp.Select | None:
    """The SELECT of an ``EXISTS`` or of an ``IN (SELECT …)`` node, else None."""
    if isinstance(node, exp.Exists):
        return node.this if isinstance(node.this, exp.Select) else None
    if isinstance(node, exp.In) and node.args.get("query") is not None:
        q = node.args["query"]
        q = q.this if isinstance(q, exp.Subquery) else q
        return q if isinstance(q, exp.Select) else None
    return None


def _reads_protected(select: exp.Select, policy: DatasetPolicy) -> bool:
    for t in select.find_all(exp.Table):
        table = policy.tables.get(t.name) or next(
            (v for v in policy.tables.values() if v.name.casefold() == t.name.casefold()), None)
        if table is not None and not table.public:
            return True
    return False


def in_semi_join(node: exp.Expression) -> bool:
    """True for a node inside an EXISTS or an ``IN (SELECT …)`` subquery (the rules and the unit-path
    hook leave those to this module)."""
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Exists) or (isinstance(parent, exp.In) and node is parent.args.get("query")):
            return True
        node, parent = parent, parent.parent
    return False


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def extract_semi_joins(stmt: exp.Select, policy: DatasetPolicy) -> tuple[exp.Select, list[Pending]]:
    """Take each protected EXISTS / NOT EXISTS / IN subquery out of WHERE's AND-ed conditions.

    Returns the statement (a copy when changed) and the subqueries in the order written.

    Raises:
        UnsupportedQuery: ``NOT IN`` over a protected table, or such a subquery elsewhere than an
            AND-ed condition of WHERE.
    """
    where = stmt.args.get("where")
    if where is None:
        _refuse_elsewhere(stmt, policy)
        return stmt, []
    kept, pending = [], []
    for cond in _conjuncts(where.this):
        negated, node = False, cond
        while isinstance(node, exp.Paren):
            node = node.this
        if isinstance(node, exp.Not):
            negated, node = True, node.this
            while isinstance(node, exp.Paren):
                node = node.this
        select = _subquery(node)
        if select is None or not _reads_protected(select, policy):
            kept.append(cond)
            continue
        if isinstance(node, exp.In):
            if negated:
                raise refusal("NOT IN over a protected table is not supported: it is NULL for every row as soon as "
                              "one row of any unit has a NULL value, so other units' rows would decide it; write "
                              "NOT EXISTS (SELECT … WHERE t.c = o.c)", _text(cond))
            select = _in_as_exists(node, select)
        pending.append(Pending(select.copy(), negated, _text(cond)))
    if not pending:
        _refuse_elsewhere(stmt, policy)
        return stmt, []
    stmt = stmt.copy()
    stmt.set("where", exp.Where(this=exp.and_(*[c.copy() for c in kept])) if kept else None)
    _refuse_elsewhere(stmt, policy)
    return stmt, pending


def _refuse_elsewhere(stmt: exp.Select, policy: DatasetPolicy) -> None:
    for node in stmt.find_all(exp.Exists, exp.In):
        select = _subquery(node)
        if select is not None and _reads_protected(select, policy) and not in_semi_join(node):
            raise refusal("an EXISTS or IN subquery over a protected table is supported as one of WHERE's AND-ed "
                          "conditions only (not under OR or NOT, nor in SELECT or HAVING)", _text(node))


def _in_as_exists(node: exp.In, select: exp.Select) -> exp.Select:
    """``x IN (SELECT c FROM t …)`` → ``SELECT c FROM t WHERE … AND c = x …`` (module docstring)."""
    items = select.expressions
    if len(items) != 1 or not isinstance(items[0].unalias(), exp.Column):
        raise refusal("an IN subquery over a protected table must select one column of it", _text(node))
    c = items[0].unalias()
    group = select.args.get("group")
    if group is not None and (len(group.expressions) != 1 or not isinstance(group.expressions[0], exp.Column)
                              or group.expressions[0].name.casefold() != c.name.casefold()):
        raise refusal("an IN subquery over a protected table may group only by the column it selects", _text(node))
    select = select.copy()
    x = node.this.copy()
    if not isinstance(x, exp.Column):
        raise refusal("an IN over a protected table must compare a column of the outer query", _text(node))
    x.meta["semi_join_outer"] = True  # the outer query's column, whatever the inner table declares
    eq = exp.EQ(this=c.copy(), expression=x)
    where = select.args.get("where")
    select.set("where", exp.Where(this=exp.and_(where.this.copy(), eq) if where is not None else eq))
    return select


# --- the outer rows' columns ----------------------------------------------------------------


@dataclass(frozen=True)
class _OuterColumn:
    qualifier: str  # how the query names its table (alias or table name), casefolded
    table: TablePolicy  # the declared table (a path table for a unit path)
    column: str  # the declared column (or the unit)
    view_column: str  # the outer view's column
    linkable: bool  # its rows carry the outer row's unit (a protected table, not LEFT-joined)


def _outer_columns(source: Source, qualifiers: set[str]) -> list[_OuterColumn]:
    if isinstance(source, JoinSource):
        occurrences = {o.alias: o for o in source.tables}
        out = []
        for item in source.view.join_tree.expressions:
            col, name = item.this, item.alias
            o = occurrences[col.table]
            out.append(_OuterColumn(o.written.casefold(), _declared(o.source), col.name, name,
                                    o.protected and o.side != "LEFT"))
        for o in source.tables:  # every protected table's unit is the joined rows' unit
            t = _declared(o.source)
            if o.protected and t.privacy_unit is not None and not any(
                    c.qualifier == o.written.casefold() and c.column == t.privacy_unit for c in out):
                out.append(_OuterColumn(o.written.casefold(), t, t.privacy_unit, source.view.privacy_unit,
                                        o.side != "LEFT"))
        return out
    t = _declared(source)
    names = list(t.columns) + ([t.privacy_unit] if t.privacy_unit and t.privacy_unit not in t.columns else [])
    return [_OuterColumn(q, t, c, c, not t.public) for q in qualifiers for c in names]


def _declared(source: Source) -> TablePolicy:
    return source.path_table.table if isinstance(source, UnitPathSource) else source.table


# --- building the node ----------------------------------------------------------------------


def attach_semi_joins(stmt: exp.Select, policy: DatasetPolicy, source: Source | None, pending: list[Pending]
                      ) -> tuple[exp.Select, DatasetPolicy, Source | None]:
    """The statement over the :class:`~dpgate.sql.semi_join_source.SemiJoinSource` of ``source``
    (None: the declared table of its FROM) filtered by ``pending``; unchanged without ``pending``.

    Raises:
        UnsupportedQuery: the property cannot be proven (module docstring), naming the subquery.
        UnknownTable, UnknownColumn: undeclared names in a subquery.
    """
    if not pending:
        return stmt, policy, source
    table, qualifiers = resolve_from(stmt, policy)
    if source is None:
        source = TableSource(table)
    if source.table is not table:
        raise refusal("an EXISTS or IN over a protected table cannot filter this FROM", pending[0].text)
    outer = _outer_columns(source, {q.casefold() for q in qualifiers} if not isinstance(source, JoinSource) else set())
    semis = tuple(_semi_join(p, i, policy, outer, source) for i, p in enumerate(pending, 1))
    node = _node(source, semis, policy)
    stmt = stmt.copy()
    frm = stmt.args.get("from_") or stmt.args.get("from")
    new = exp.Table(this=exp.Identifier(this=node.view.name, quoted=True))
    alias = frm.this.alias or (frm.this.name if not isinstance(source, JoinSource) else "")
    if alias:
        new.set("alias", exp.TableAlias(this=exp.Identifier(this=alias, quoted=True)))
    frm.set("this", new)
    return stmt, with_table(policy, node.view), node


def _node(source: Source, semis: tuple[SemiJoin, ...], policy: DatasetPolicy) -> SemiJoinSource:
    t = source.table
    names = list(t.columns) + ([t.privacy_unit] if t.privacy_unit and t.privacy_unit not in t.columns else [])
    items = [sqln.alias(sqln.col(c, _OUTER), c) for c in names]
    tree = sqln.select(items, source.relation(_OUTER), where=sqln.conjunction([s.tree() for s in semis]))
    name = SEMI_JOIN_MARK + source.name + " WHERE " + " AND ".join(s.tree().sql(dialect="duckdb") for s in semis)
    view = VirtualTable(
        name=name, dataset=policy.name, source="", privacy_unit=t.privacy_unit,
        max_groups_per_unit=t.max_groups_per_unit, max_rows_per_unit=t.max_rows_per_unit, columns=t.columns,
        path=t.path, public=False, join_sql=tree.sql(dialect="duckdb"), join_tree=tree, key_tuples=t.key_tuples)
    return SemiJoinSource(outer=source, semi_joins=semis, view=view)


def _inner_table(select: exp.Select, policy: DatasetPolicy, text: str) -> tuple[TablePolicy, set[str]]:
    extra = {k for k, v in select.args.items() if v} - {"expressions", "from", "from_", "where", "group", "having",
                                                         "distinct"}
    if extra:
        raise refusal(f"a subquery over a protected table reads one declared table and filters it (WHERE); "
                      f"{', '.join(sorted(extra))} is not supported there", text)
    if any(s is not select for s in select.find_all(exp.Select)):
        raise refusal("a subquery over a protected table cannot contain another subquery", text)
    frm = select.args.get("from_") or select.args.get("from")
    node = frm.this if frm is not None else None
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier) or \
            set(k for k, v in node.args.items() if v) - {"this", "db", "alias"}:
        raise refusal("a subquery over a protected table reads one declared table (no join, no subquery)", text)
    db = node.args.get("db")
    if db is not None and db.name.casefold() != policy.name.casefold():
        raise UnknownTable(f"unknown dataset {db.name!r} in the subquery: tables of another dataset (another "
                           "population) cannot be read here", {"dataset": db.name})
    table = policy.table(node.name)
    if table.public:
        raise refusal("a subquery reads a protected table and a public one: not supported", text)
    return table, {(node.alias or node.name).casefold()}


def _semi_join(p: Pending, index: int, policy: DatasetPolicy, outer: list[_OuterColumn], source: Source
               ) -> SemiJoin:
    select = p.select
    inner, names = _inner_table(select, policy, p.text)
    alias = f"__dpg_semi_{index}"
    if select.args.get("having") is not None and select.args.get("group") is None:
        raise refusal("a subquery over a protected table may use HAVING only with GROUP BY its selected column",
                      p.text)
    if select.args.get("group") is not None and not _grouped_in(select):
        raise refusal("an EXISTS over a protected table cannot group its rows: filter them in WHERE", p.text)

    def resolve(col: exp.Column) -> tuple[str, str, _OuterColumn | None]:
        """("inner" | "outer", declared column, outer column)."""
        qual = col.args.get("table")
        if not col.meta.get("semi_join_outer") and (qual is None or qual.name.casefold() in names):
            found = inner.find_column(col.name)
            name = found.name if found is not None else (
                inner.privacy_unit if inner.privacy_unit and col.name.casefold() == inner.privacy_unit.casefold()
                else None)
            if name is not None:
                return "inner", name, None
            if qual is not None:
                raise UnknownColumn(f"table {inner.name!r} declares no column {col.name!r}",
                                    {"table": inner.name, "column": col.name})
        hits = [o for o in outer if o.column.casefold() == col.name.casefold()
                and (qual is None or o.qualifier == qual.name.casefold())]
        if not hits:
            raise UnknownColumn(f"no table of the query declares a column {col.sql()!r} (in the subquery "
                                f"{p.text[:80]})", {"column": col.sql()})
        if len({h.view_column for h in hits}) > 1:
            raise refusal(f"column {col.name!r} in the subquery is ambiguous: qualify it with its table", p.text)
        return "outer", hits[0].column, hits[0]

    where = select.args.get("where")
    links, rest, why = [], [], None
    for cond in (_conjuncts(where.this) if where is not None else []):
        link = _link(cond, resolve, inner, source)
        if isinstance(link, UnitLink):
            links.append((link, cond))
            continue
        why = why or link
        rest.append(cond)
    if not links:
        raise why if why is not None else refusal(
            "the subquery over a protected table is not correlated with the outer row: it would decide every "
            "outer row by all units' rows; correlate it on the privacy unit (or a key that determines it)", p.text)
    condition = _condition(select, alias, links, rest, resolve, (inner, outer), policy, source, p.text)
    return SemiJoin(inner=inner, links=tuple(k for k, _ in links), negated=p.negated, condition=condition,
                    text=p.text)


def _grouped_in(select: exp.Select) -> bool:
    """True when the subquery is an IN's: grouped by the one column it selects."""
    group = select.args["group"].expressions
    return len(select.expressions) == 1 and len(group) == 1 and isinstance(group[0], exp.Column) \
        and group[0].name.casefold() == select.expressions[0].unalias().name.casefold()


def _link(cond: exp.Expression, resolve, inner: TablePolicy, source: Source):
    """The :class:`UnitLink` an equality of an inner and an outer column is, else the refusal saying why
    it proves nothing (None for a condition that is no such equality)."""
    if not (isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) and isinstance(cond.expression, exp.Column)):
        return None
    (ka, ca, oa), (kb, cb, ob) = resolve(cond.this), resolve(cond.expression)
    if {ka, kb} != {"inner", "outer"}:
        return None
    i_col, o = (ca, ob) if ka == "inner" else (cb, oa)
    if not o.linkable:
        return refusal(f"the correlation {_text(cond)} compares a column of {o.table.name}, whose rows do not carry "
                       "the outer row's privacy unit (a public or LEFT-joined table)", _text(cond))
    try:
        return UnitLink(o.table, o.column, inner, i_col)
    except UnsupportedQuery as e:  # the refusal saying what would prove it
        return e


def _scope_table(inner: TablePolicy, outer: list[_OuterColumn], source: Source, policy: DatasetPolicy
                 ) -> tuple[QueryScope, dict[str, tuple[str, str]]]:
    """A one-table scope whose columns are the inner table's and the outer rows' under unique names,
    and the map back (name → (``"inner"``/``"outer"``, column))."""
    columns: dict[str, ColumnPolicy] = {}
    back: dict[str, tuple[str, str]] = {}
    for c, col in inner.columns.items():
        columns[f"__dpg_i_{c}"] = dataclasses.replace(col, name=f"__dpg_i_{c}")
        back[f"__dpg_i_{c}"] = ("inner", c)
    for o in outer:
        col = source.table.find_column(o.view_column)
        if col is not None:
            name = f"__dpg_o_{o.view_column}"
            columns[name] = dataclasses.replace(col, name=name)
            back[name] = ("outer", o.view_column)
    view = VirtualTable(name="SEMI JOIN SCOPE", dataset=policy.name, source="", privacy_unit=None,
                        max_groups_per_unit=1, max_rows_per_unit=1,
                        columns=MappingProxyType(columns), public=True)
    return QueryScope(policy, view, set()), back


def _condition(select: exp.Select, alias: str, links, rest, resolve, tables, policy: DatasetPolicy,
               source: Source, text: str) -> exp.Select:
    """``SELECT 1 FROM inner AS alias WHERE links AND rest [GROUP BY … HAVING …]`` over ``__dpg_outer``."""
    inner, outer = tables

    def renamed(node: exp.Expression) -> exp.Expression:
        if not isinstance(node, exp.Column):
            return node
        kind, column, o = resolve(node)
        t = inner if kind == "inner" else o.table
        if t.privacy_unit is not None and column.casefold() == t.privacy_unit.casefold():
            raise refusal(f"the privacy unit ({column}) may appear in the subquery's correlation equalities only",
                          text)
        if kind == "outer":
            return exp.column(f"__dpg_o_{o.view_column}", quoted=True)
        return exp.column(f"__dpg_i_{column}", quoted=True)

    conds = []
    for link, cond in links:
        o_view = next(o.view_column for o in _outer_candidates(cond, resolve))
        a, b = sqln.col(link.inner_column, alias), sqln.col(o_view, _OUTER)
        if link.proof == "unit" and (inner.find_column(link.inner_column) is None
                                     or inner.find_column(link.inner_column).type == "text"):
            # two tables' text (or undeclared) units compare by their text, as in a join
            # (dpgate.sql.sources.JoinCondition.sql): total and one-to-one on every stored type
            a, b = sqln.cast(a, "VARCHAR"), sqln.cast(b, "VARCHAR")
        conds.append(exp.EQ(this=a, expression=b))
    if rest:
        scope, back = _scope_table(inner, outer, source, policy)
        bound = plan_where_tree(exp.and_(*[c.copy() for c in rest]).transform(renamed), scope)
        if bound is not None:
            def qualify(node: exp.Expression) -> exp.Expression:
                if isinstance(node, exp.Column) and node.name in back:
                    kind, column = back[node.name]
                    return sqln.col(column, alias if kind == "inner" else _OUTER)
                return node
            conds.append(bound.transform(qualify))
    tree = sqln.select([exp.Literal.number(1)], sqln.table(inner.name, policy.name, alias),
                       where=sqln.conjunction(conds))
    if select.args.get("group") is not None:
        column = resolve(select.args["group"].expressions[0])[1]
        tree.set("group", exp.Group(expressions=[sqln.col(column, alias)]))
        if select.args.get("having") is not None:
            tree.set("having", exp.Having(this=_having(select.args["having"].this, resolve, alias, text)))
    return tree


def _outer_candidates(cond: exp.EQ, resolve) -> list[_OuterColumn]:
    return [o for side in (cond.this, cond.expression) if (o := resolve(side)[2]) is not None]


def _having(node: exp.Expression, resolve, alias: str, text: str) -> exp.Expression:
    """A HAVING of comparisons of aggregates of inner columns with numbers (AND, OR, NOT)."""
    def walk(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Paren):
            return exp.Paren(this=walk(n.this))
        if isinstance(n, (exp.And, exp.Or)):
            return type(n)(this=walk(n.this), expression=walk(n.expression))
        if isinstance(n, exp.Not):
            return exp.Not(this=walk(n.this))
        if isinstance(n, _COMPARISONS):
            return type(n)(this=operand(n.this), expression=operand(n.expression))
        raise refusal(f"the subquery's HAVING accepts comparisons of SUM, COUNT, AVG, MIN or MAX of its table's "
                      f"columns with numbers, not {_text(n)}", text)

    def number(lit: exp.Literal) -> exp.Literal:
        """A finite numeric literal (1e400 is +inf: refused, as in WHERE — house rule 7)."""
        try:
            finite = math.isfinite(float(lit.this))
        except ValueError:
            finite = False
        if not finite:
            raise refusal(f"numeric literal {lit.this} is not a finite number", text)
        return exp.Literal.number(lit.this)

    def operand(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Neg) and isinstance(n.this, exp.Literal) and n.this.is_number:
            return exp.Neg(this=number(n.this))
        if isinstance(n, exp.Literal) and n.is_number:
            return number(n)
        if isinstance(n, _AGGREGATES) and not n.args.get("distinct"):
            arg = n.this
            if isinstance(n, exp.Count) and isinstance(arg, exp.Star):
                return exp.Count(this=exp.Star())
            if isinstance(arg, exp.Column):
                kind, column, _ = resolve(arg)
                if kind == "inner":
                    return type(n)(this=sqln.col(column, alias))
        raise refusal(f"the subquery's HAVING accepts SUM, COUNT, AVG, MIN or MAX of one of its table's columns "
                      f"compared with a number, not {_text(n)}", text)

    return walk(node)
