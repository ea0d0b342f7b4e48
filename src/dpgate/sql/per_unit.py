"""Per-unit subqueries (two-level aggregation, issue 11 item 3), planned as one *per-unit table*.

An analyst's query of the form ::

    SELECT COUNT(*) FROM (
        SELECT member_id, COUNT(*) AS n, SUM(x) AS s FROM t WHERE … GROUP BY member_id
    ) AS u WHERE n > 10

is rewritten, before the planner sees it, into a query over one virtual table whose rows are
the inner query's rows (the view of its :class:`~dpgate.sql.sources.PerUnitSource`, carried by the plan): one row per privacy unit,
columns the inner aggregates (``n``, ``s``), each with a range derived from the policy
(never from data). The outer query is then planned as any query over a table whose unit
is unique (k = 1, m = 1).

**Bounding of the inner level.** Before the inner aggregates, each unit keeps at most
``k·m`` of its (filtered) rows — the most a unit may contribute to one query of the table
(m rows in each of k groups; Wilson et al. 2020, "Differentially private SQL with bounded
user contribution", PoPETs 2020(2), §3). The rows kept are those with the smallest
``hash`` of the unit and the values of the columns the inner aggregates read: the choice depends
only on the unit's own rows, so adding or removing one unit changes no other unit's row.

**The row choice on every engine** (issue 21 item 9). Each engine computes the hash as md5 of
its parts' text (:func:`dpgate.engines.hashing.portable_group_hash`), so the parts are chosen to
have the same bytes on DuckDB, PostgreSQL and Spark, never NULL, and one-to-one on values
(:func:`_hash_parts`): an int or bool as its decimal text, a text as ``<length>.<text>``, NULL as
``n``; a float, date or timestamp by its ``dense_rank`` among the unit's rows, NULLs last (the text
of a double is ``1e+300`` on DuckDB, ``1.0E300`` on Spark, and ``1.0`` is ``1`` on PostgreSQL; their
order is IEEE's on all three, NaN greatest). Rows that tie agree on every column the aggregates
read, so which of them is kept changes no aggregate: every engine computes the same per-unit
rows, and the bounded answer before noise is the same vector for the same salt. Aggregated values are clamped to the
column's ``[lo, hi]`` (non-finite values are NULL). Hence, with ``c = k·m``:

=====================  =========================================  ========
inner aggregate        derived range                              type
=====================  =========================================  ========
``COUNT(*)``           ``[1, c]`` (a unit in the table has a row)  int
``COUNT(x)``           ``[0, c]``                                 int
``COUNT(DISTINCT x)``  ``[0, c]`` (all-NULL rows count 0)          int
``SUM(x)``             ``[c·min(lo, 0), c·max(hi, 0)]``           x's type
``AVG(x)``             ``[lo, hi]``                               float
``MIN(x)``/``MAX(x)``  ``[lo, hi]``                               x's type
=====================  =========================================  ========

A derived range must satisfy the limits of a declared column (:func:`dpgate.limits.range_problem`:
at most 2^62 resolution steps, an int inside 64 bits, as each value is computed as a BIGINT):
a ``SUM`` whose ``k·m·[lo, hi]`` does not is refused before the charge
(:func:`dpgate.representable.check_representable`), never computed and dropped or failed on
some data. An ``AVG`` of an int column gets the finer step ``resolution / 1000`` only while
its bounds stay within 2^62 such steps. The inner WHERE is rendered total, by the rule of the
outer WHERE (:func:`dpgate.sql.expr.total_sql`).

(an aggregate of a column without declared bounds has no range: the outer query may use it
only inside an expression the interval arithmetic of :mod:`dpgate.sql.expr` bounds, e.g.
``LEAST(GREATEST(s, 0), 100)``, or it is refused as any unbounded column is).

**Sensitivity.** Removing one unit removes exactly one row of the per-unit table and
changes no other row (the inner level is a function of each unit's own rows), so the
per-unit table is a table of unique units: k = m = 1 for the outer level. An outer
COUNT moves by at most 1, an outer SUM of a value with derived range ``[a, b]`` by at most
``max(|a|, |b|)`` (the usual bounded-contribution sensitivity, Wilson et al. 2020 §4.1;
Dwork & Roth 2014, Def. 3.1 for L1 sensitivity), and the planner's derivations
(:mod:`dpgate.sensitivity`) apply unchanged to the derived ranges.

**Joins in the inner query** (issue 21 item 4; TPC-H Q13). An inner FROM that joins is
rewritten by the statement rules and the join rewrite (:func:`_inner_join`) into a
:class:`~dpgate.sql.sources.JoinSource`, checked where it is built (protected tables joined on
the unit, public tables on declared columns), and the per-unit table reads its joined rows: the
bounding above runs on them (c = k·m with k, m the largest of the joined tables', the rows
chosen by the hash of the unit's own joined rows), so the sensitivity argument is unchanged. A
LEFT JOIN keeps a unit without matches as one row with NULLs (``COUNT(o_orderkey)`` = 0).

Refused (nothing charged): an inner query grouped by anything but the privacy unit, an
inner column neither grouped nor aggregated, an outer query naming the unit, inner
HAVING/DISTINCT/LIMIT, an inner join that is not a valid join on the unit (it pairs two
units' rows) or reads public tables only, a per-unit subquery on a record-level or public table.
"""

from __future__ import annotations

from typing import Any
from fractions import Fraction
from types import MappingProxyType

from sqlglot import exp

from dpgate import limits
from dpgate.errors import UnsupportedQuery
from dpgate.policy import ColumnPolicy, DatasetPolicy, TablePolicy, quote_identifier as q
from dpgate.render import nodes as sqln
from dpgate.sql.sources import PER_UNIT_MARK, JoinSource, PerUnitSource, Source, TableSource, VirtualTable, with_table
_INNER_ARGS = {"expressions", "from_", "from", "where", "group", "joins"}
_AGGS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}


def _refuse(message: str, node: exp.Expression | None = None) -> UnsupportedQuery:
    details = {}
    if node is not None:
        details["construct"] = " ".join(node.sql(dialect="duckdb").split())[:80]
    return UnsupportedQuery(message, details)


def _from(stmt: exp.Select) -> exp.From | None:
    return stmt.args.get("from_") or stmt.args.get("from")


def _is_per_unit(stmt: exp.Select) -> exp.Subquery | None:
    frm = _from(stmt)
    if frm is None or not isinstance(frm.this, exp.Subquery):
        return None
    inner = frm.this.this
    if isinstance(inner, exp.Select) and (inner.args.get("group") or inner.find(exp.AggFunc)):
        return frm.this
    return None


def _num(v: float, ctype: str):
    return int(v) if ctype == "int" else float(v)


def _range_text(col: ColumnPolicy) -> str:
    if not col.bounded:
        return "unbounded"
    return f"[{_num(col.lower, col.type)}, {_num(col.upper, col.type)}]"


def _inner_join(inner: exp.Select, policy: DatasetPolicy
                ) -> tuple[exp.Select, DatasetPolicy, JoinSource | None]:
    """An inner query with a join (issue 21 item 4), rewritten to read its joined rows: the
    statement rules (comma joins, …) then the join rewrite (:func:`dpgate.sql.joins.rewrite_joins`),
    whose :class:`~dpgate.sql.sources.JoinSource` checks the join once, where it is built: its
    protected tables connected by unit equalities (a join that pairs two units is refused there),
    public tables on declared columns. ``(inner, policy, None)`` when the inner query has no join."""
    from dpgate.sql.joins import rewrite_joins
    from dpgate.sql.rules import apply_statement_rules

    if not inner.args.get("joins"):
        return inner, policy, None
    inner, policy, joined = rewrite_joins(apply_statement_rules(inner), policy)
    if joined is not None and joined.table.public:
        raise _refuse("a per-unit subquery must read a protected table: this join reads public tables only "
                      "(it has no privacy unit to group by)", inner)
    return inner, policy, joined


def _inner_table(inner: exp.Select, policy: DatasetPolicy) -> tuple[TablePolicy, Any]:
    """The protected table a per-unit subquery reads and its scope; refuses anything but ``GROUP BY unit``."""
    from dpgate.sql.resolve import QueryScope as _Scope  # the planner's name resolution (imports flow resolve → here)

    for key in sorted(k for k, v in inner.args.items() if v not in (None, False, [], "")
                      and k not in _INNER_ARGS):
        raise _refuse(f"{key.upper()} inside a per-unit subquery is not supported: the inner "
                      "query may filter (WHERE), group by the privacy unit and aggregate", inner)
    frm = _from(inner)
    if frm is None or not isinstance(frm.this, exp.Table) or not isinstance(frm.this.this, exp.Identifier):
        raise _refuse("a per-unit subquery must read one declared table", inner)
    tbl = frm.this
    table = policy.table(tbl.name)
    if table.public or table.record_level:
        raise _refuse(f"table {table.name!r} has no privacy unit column: a per-unit subquery groups "
                      "by the privacy unit", inner)
    quals = {table.name.casefold()} | ({tbl.alias.casefold()} if tbl.alias else set())
    scope = _Scope(policy, table, quals)
    group = inner.args.get("group")
    keys = group.expressions if group is not None else []
    if len(keys) != 1 or not isinstance(keys[0], exp.Column) or not scope.is_unit(scope.resolve(keys[0])):
        raise _refuse(f"the inner query of a per-unit subquery may only GROUP BY the privacy unit "
                      f"({table.privacy_unit}): each of its rows must be one unit", group or inner)
    return table, scope


def _value_column(kind: str, col: ColumnPolicy, label: str, c: int) -> ColumnPolicy:
    """The per-unit column of ``kind``(``col``) over at most ``c`` rows of one unit, with its range."""
    if kind == "sum":
        lo = hi = None
        if col.bounded:  # in exact fixed-point steps, so the bounds stay multiples of the step
            flo, fhi = col.fixed_point_bounds
            step = Fraction(repr(col.resolution)) if col.type == "float" else Fraction(col.resolution)
            lo, hi = (c * min(flo, 0) * step, c * max(fhi, 0) * step)
            lo, hi = (int(lo), int(hi)) if col.type == "int" else (float(lo), float(hi))
        return ColumnPolicy(label, col.type, lo, hi, col.resolution)
    if kind == "avg":
        # an average of ints is a float: finer fixed-point step for the outer SUM,
        # unless the bounds would then span more than 2^62 steps (dpgate.limits)
        res = col.resolution
        if col.type == "int" and col.bounded and 1000 * max(map(abs, col.fixed_point_bounds)) <= limits.MAX_STEPS:
            res = col.resolution / 1000
        return ColumnPolicy(label, "float", col.lower, col.upper, res)
    return ColumnPolicy(label, col.type, col.lower, col.upper, col.resolution)


def _unparen(item: exp.Expression) -> exp.Expression:
    """A select item without its alias and enclosing parentheses."""
    node = item.unalias()
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _inner_aggregate(item: exp.Expression, scope: Any, table: TablePolicy, c: int, taken: set[str]
                     ) -> tuple[str, ColumnPolicy, str, exp.Expression] | None:
    """One select item of the inner query: None for the unit, else (label, column, SQL text, tree)."""
    unit = table.privacy_unit
    src = lambda name: f"{q('__dpg_src')}.{q(name)}"  # noqa: E731
    srct = lambda name: sqln.col(name, "__dpg_src")  # noqa: E731
    node = _unparen(item)
    if isinstance(node, exp.Column):
        if scope.is_unit(scope.resolve(node)):
            return None
        raise _refuse(f"{node.name} is neither grouped nor aggregated in the per-unit subquery", node)
    kind = _AGGS.get(type(node))
    if kind is None:
        raise _refuse("the inner query of a per-unit subquery may select the unit and COUNT, SUM, "
                      "AVG, MIN, MAX of declared columns", node)
    label = item.alias if isinstance(item, exp.Alias) else None
    if not label:
        raise _refuse("name each aggregate of a per-unit subquery with AS (the outer query refers "
                      "to it by that name)", node)
    if label.casefold() == unit.casefold() or label.casefold() in taken:
        raise _refuse(f"the per-unit subquery's column name {label!r} is used twice or names the unit", item)
    arg = node.this
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        if kind != "count" or len(arg.expressions) != 1:
            raise _refuse("DISTINCT in a per-unit subquery: only COUNT(DISTINCT column)", node)
        arg = arg.expressions[0]
    if isinstance(arg, exp.Star):
        if kind != "count":
            raise _refuse(f"{kind.upper()}(*) is not an aggregate", node)
        return label, ColumnPolicy(label, "int", 1, c, 1), f"COUNT(*) AS {q(label)}", sqln.alias(sqln.count(), label)
    if not isinstance(arg, exp.Column):
        raise _refuse("aggregates in a per-unit subquery take a declared column (compute "
                      "expressions in the outer query)", node)
    name = scope.resolve(arg)
    if scope.is_unit(name):
        raise _refuse("aggregating the privacy unit inside a per-unit subquery is not supported", node)
    col = table.column(name)
    if kind == "count":
        tree = sqln.alias(sqln.count(exp.Distinct(expressions=[srct(name)]) if distinct else srct(name)), label)
        return (label, ColumnPolicy(label, "int", 0, c, 1),
                f"COUNT({'DISTINCT ' if distinct else ''}{src(name)}) AS {q(label)}", tree)
    if col.type not in ("int", "float"):
        raise _refuse(f"{kind.upper()} of the {col.type} column {name!r} is not supported", node)
    v = src(name)
    vt: exp.Expression = srct(name)
    # a value is aggregated when it is a number (NULL, and for floats NaN/±inf, are left out, as
    # SQL's aggregates leave NULL out); the clamp is guarded by that CASE, because LEAST/GREATEST
    # skip NULL arguments: unguarded, a NULL became the lower bound (trial finding, 2026-12-03)
    if col.type == "float":
        cond, cond_t = f"isfinite({v})", sqln.anonymous("isfinite", srct(name))
    else:
        cond, cond_t = f"{v} IS NOT NULL", sqln.not_null(srct(name))
    if col.bounded:
        v = f"CASE WHEN {cond} THEN LEAST(GREATEST({v}, {_num(col.lower, col.type)}), {_num(col.upper, col.type)}) END"
        vt = sqln.case_when(cond_t, sqln.least(sqln.greatest(vt, sqln.num(_num(col.lower, col.type))),
                                               sqln.num(_num(col.upper, col.type))))
    elif col.type == "float":
        v = f"CASE WHEN {cond} THEN {v} END"
        vt = sqln.case_when(cond_t, vt)
    derived = _value_column(kind, col, label, c)
    cast = "DOUBLE" if derived.type == "float" else "BIGINT"
    return (label, derived, f"CAST({kind.upper()}({v}) AS {cast}) AS {q(label)}",
            sqln.alias(sqln.cast(_AGG_NODES[kind](this=vt), cast), label))


def build_source(inner: exp.Select, policy: DatasetPolicy) -> PerUnitSource:
    """The :class:`~dpgate.sql.sources.PerUnitSource` of a per-unit subquery's inner SELECT.

    In named steps: the table and its scope (:func:`_inner_table`), each aggregate with its
    per-unit range (:func:`_inner_aggregate`, :func:`_value_column`), the inner WHERE (bound
    like an outer one), the per-unit table's SQL and tree.

    Raises:
        UnsupportedQuery: the inner query is not a per-unit aggregation (module docstring).
        UnknownTable, UnknownColumn: undeclared names.
    """
    from dpgate.sql.bind import plan_where_tree
    from dpgate.sql.node_types import annotate, column_types_of
    from dpgate.sql.parsed_shape import shaped
    from dpgate.sql.rules import check_nesting

    check_nesting(inner)  # the outer statement's check no longer sees the inner query
    written = inner
    inner, policy, joined = _inner_join(inner, policy)
    table, scope = _inner_table(inner, policy)
    reads: Source = joined if joined is not None else TableSource(table)
    unit = table.privacy_unit
    c = table.max_groups_per_unit * table.max_rows_per_unit
    columns: dict[str, ColumnPolicy] = {}
    items: list[exp.Expression] = [sqln.alias(sqln.col(unit, "__dpg_src"), unit)]  # the same select list, as trees
    ranges = []
    for item in inner.expressions:
        found = _inner_aggregate(item, scope, table, c, {k.casefold() for k in columns})
        if found is None:
            continue
        label, columns[label], _text, tree = found
        items.append(tree)
        ranges.append((label, f"{_unparen(item).sql(dialect='duckdb')}: {_range_text(columns[label])}"))
    if not columns:
        raise _refuse("a per-unit subquery must compute at least one aggregate", inner)
    where_node = inner.args.get("where")
    where_tree = plan_where_tree(where_node.this if where_node is not None else None, scope)
    if where_tree is not None:  # the text's own shape, each node typed (sql.node_types)
        where_tree = annotate(shaped(where_tree), column_types_of(table.columns))
    # the inner WHERE obeys the outer WHERE's totality rule (sql.bound.row_tree): a row on which
    # it would raise is filtered out, never an error after the charge
    join_tree = _join_tree(table, reads, items, where_tree, c)
    view = VirtualTable(
        name=PER_UNIT_MARK + written.sql(dialect="duckdb"), dataset=policy.name, source="",
        privacy_unit=unit, max_groups_per_unit=1, max_rows_per_unit=1,
        columns=MappingProxyType(columns), path=table.path, public=False, join_sql=join_tree.sql(dialect="duckdb"),
        join_tree=join_tree,
        per_unit=True)
    return PerUnitSource(inner=reads, ranges=tuple(ranges), view=view)


#: The inner aggregates' nodes (COUNT is built apart).
_AGG_NODES = {"sum": exp.Sum, "avg": exp.Avg, "min": exp.Min, "max": exp.Max}


#: The alias of the joined rows a per-unit subquery over a join reads.
_JOINED = "__dpg_joined"


def _hash_parts(table: TablePolicy, items: list[exp.Expression]) -> tuple[list[exp.Expression], list[exp.Expression]]:
    """The arguments of the row-choosing hash and the rank columns they read (module docstring,
    "the row choice on every engine").

    Returns ``(parts, ranks)``: ``parts`` is the unit, then one never-NULL part per declared column
    the inner aggregates read, in declaration order — the decimal text of an int or bool
    (``'n'`` for NULL), ``<length>.<text>`` of a text (``'n'`` for NULL) — or, for any other type
    (float, date, timestamp), the column's ``dense_rank`` among the unit's rows (NULLs last): the
    text of a double differs between engines (``1e+300`` / ``1.0E300``; ``1`` on PostgreSQL), its
    order does not. ``ranks`` are the ``… AS "__dpg_h<i>"`` window items computing those ranks.
    """
    unit = table.privacy_unit
    used = {c.name.casefold() for item in items for c in item.find_all(exp.Column)} - {unit.casefold()}
    parts: list[exp.Expression] = [sqln.col(unit)]
    ranks: list[exp.Expression] = []
    missing = exp.Literal.string("n")
    for name, col in table.columns.items():
        if name.casefold() not in used:
            continue
        ref = sqln.col(name)
        if col.type in ("int", "bool"):
            parts.append(exp.Coalesce(this=sqln.cast(ref, "VARCHAR"), expressions=[missing.copy()]))
        elif col.type == "text":
            text = exp.DPipe(this=exp.DPipe(this=sqln.cast(exp.Length(this=ref), "VARCHAR"),
                                            expression=exp.Literal.string(".")), expression=ref.copy())
            parts.append(exp.Coalesce(this=text, expressions=[missing.copy()]))
        else:
            rank = exp.Window(this=exp.DenseRank(), partition_by=[sqln.col(unit)], order=exp.Order(
                expressions=[exp.Ordered(this=ref, nulls_first=False)]), over="OVER")
            label = f"__dpg_h{len(ranks)}"
            ranks.append(sqln.alias(rank, label))
            parts.append(sqln.col(label))
    return parts, ranks


def _join_tree(table: TablePolicy, reads: Source, items: list[exp.Expression], where: exp.Expression | None,
               c: int) -> exp.Select:
    """The per-unit table's rows as a tree (its DuckDB text is ``join_sql``); ``reads`` is the
    declared table or the join it reads; ``where``: the inner WHERE's typed tree. Each unit keeps
    its first ``c`` rows in the order of :func:`_hash_parts`' hash."""
    from dpgate.render.bounded import row_tree

    unit = table.privacy_unit
    conditions: list[exp.Expression] = [sqln.not_null(sqln.col(unit))]
    if where is not None:
        conditions.append(exp.Paren(this=row_tree(where, None)))
    parts, ranks = _hash_parts(table, items)
    window = exp.Window(this=exp.RowNumber(), partition_by=[sqln.col(unit)], order=exp.Order(expressions=[
        exp.Ordered(this=sqln.anonymous("hash", *parts), nulls_first=False)]), over="OVER")
    relation = reads.relation(_JOINED) if isinstance(reads, JoinSource) else sqln.table(table.name, table.dataset)
    filtered = sqln.conjunction(conditions)
    if ranks:
        relation = sqln.subquery(sqln.select([exp.Star(), *ranks], relation, where=filtered), _RANKED)
        filtered = None
    rows = sqln.select([exp.Star(), sqln.alias(window, "__dpg_rn")], relation, where=filtered)
    return sqln.select(items, sqln.subquery(rows, "__dpg_src"),
                    where=exp.LTE(this=sqln.col("__dpg_rn"), expression=sqln.num(c)),
                    group=[sqln.col(unit, "__dpg_src")])


#: The alias of a per-unit subquery's filtered rows with their rank columns (:func:`_hash_parts`).
_RANKED = "__dpg_ranked"


def rewrite_per_unit(stmt: exp.Select, policy: DatasetPolicy
                     ) -> tuple[exp.Select, DatasetPolicy, PerUnitSource | None]:
    """Rewrite a query over a per-unit subquery into one over its :class:`~dpgate.sql.sources.PerUnitSource`.

    Returns ``(stmt, policy, None)`` unchanged when FROM is not a subquery that groups or
    aggregates; else the statement reading the per-unit table (same alias), the policy
    with its view added and the source node.

    Raises:
        UnsupportedQuery: outside the supported subset (module docstring), including any
            outer reference to the privacy unit.
    """
    sub = _is_per_unit(stmt)
    if sub is None:
        return stmt, policy, None
    inner = sub.this
    alias_node = sub.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise _refuse("column lists on a per-unit subquery's alias are not supported: name the "
                      "columns with AS inside it", alias_node)
    source = build_source(inner, policy)
    table = source.table
    stmt = stmt.copy()
    frm = _from(stmt)
    outer_nodes = [v for k, v in stmt.args.items() if k not in ("from", "from_")]
    inner_unit_names = {table.privacy_unit.casefold()} | {
        i.alias.casefold() for i in inner.expressions
        if isinstance(i, exp.Alias) and isinstance(i.this, exp.Column)}
    for value in outer_nodes:
        for tree in (value if isinstance(value, list) else [value]):
            if not isinstance(tree, exp.Expression):
                continue
            for col in tree.find_all(exp.Column):
                if col.name.casefold() in inner_unit_names:
                    raise _refuse("the outer query of a per-unit subquery never sees the privacy unit "
                                  f"({table.privacy_unit}): it aggregates the per-unit rows", col)
    new = exp.Table(this=exp.Identifier(this=table.name, quoted=True))
    if alias_node is not None:
        new.set("alias", exp.TableAlias(this=exp.Identifier(this=alias_node.name, quoted=True)))
    frm.set("this", new)
    return stmt, with_table(policy, table), source
