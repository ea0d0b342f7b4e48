"""Privacy units through foreign keys (issue 21 item 1, the planner side): a *unit-path table*.

A table whose policy declares ``privacy_unit = { path = ["l_orderkey -> orders.o_orderkey",
"o_custkey"] }`` has no unit column of its own. A query reading it is rewritten, before the
other rules, into a query over one virtual table whose rows are the path table's rows with the
unit attached (the view of its :class:`~dpgate.sql.sources.UnitPathSource`, carried by the plan)::

    SELECT "orders"."o_custkey" AS "o_custkey", "lineitem"."l_orderkey" AS "l_orderkey", …
    FROM "tpch"."lineitem" AS "lineitem"
    JOIN "tpch"."orders" AS "orders" ON "lineitem"."l_orderkey" = "orders"."o_orderkey"
    WHERE "orders"."o_custkey" IS NOT NULL

* **One unit per row.** Every hop is an INNER join of the foreign key to a key declared
  ``unique = true`` in the table it reaches (checked when the policy loads, and on the data by
  every engine's load: :mod:`dpgate.policy.tables`), so each row of the path table meets at
  most one row of each table along the path, hence at most one unit. A row whose path breaks
  (a NULL or dangling foreign key) meets none and is dropped, as is a row whose path ends in a
  NULL unit: such rows belong to no unit and are released by no query (the same rule as a
  NULL unit column). :class:`~dpgate.sql.sources.PathStep` and
  :class:`~dpgate.sql.sources.UnitPathSource` check this once, when the node is built (a key not declared unique, two key types, a broken chain or a table visited
  twice raise there).
* **Bounding after the join.** The bounding rewrite (:mod:`dpgate.sql.bound`) runs on these
  rows exactly as on a table carrying its unit: the path table's own k and m and column
  bounds. Since one unit's rows of the path table are exactly the rows that reach it, adding or
  removing one unit (with its orders and lineitems) changes at most that unit's rows, and the
  sensitivity is that of one table with those k and m (Wilson et al. 2020, "Differentially
  private SQL with bounded user contribution", PoPETs 2020(2), §3; Dwork & Roth 2014, Def. 3.1).
  Removing only an intermediate row (an order) removes the lines that reached it: they belong
  to the order's unit, so that is still a change of one unit's rows.
* **Columns.** The virtual table exposes the path table's declared columns (same names,
  same types and bounds) and the unit column (named as the path's last element, with a
  leading ``_`` while that name is taken). The intermediate tables contribute only their key
  and unit columns to the join: none of their other columns becomes readable.

**Joined by the analyst.** A path table in a join's FROM is left to :mod:`dpgate.sql.joins`: its
occurrence reads the :class:`~dpgate.sql.sources.UnitPathSource` (the rows with their unit) and
may be joined to the target of its path's first hop on that hop (``lineitem.l_orderkey =
orders.o_orderkey``: the line's unit is attached through exactly that order, so the two rows
have one unit — an edge of the unit graph, :attr:`~dpgate.sql.sources.JoinCondition.hop`), on
the unit, or to public tables; anything else leaves the unit graph disconnected and is refused
(``unit_path_join``, naming the hop).

Refused (before any charge; ``details.reason``): a path table joined off its path
(``unit_path_join``), a path table inside a subquery, IN/EXISTS or a per-unit subquery
(``unit_path``). Cycles never reach the planner (refused at load).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy, TablePolicy
from dpgate.render import nodes as sqln
from dpgate.sql.resolve import refuse_unit_path_tables, resolve_from
from dpgate.sql.unit_semi_joins import in_semi_join
from dpgate.sql.sources import (  # noqa: F401 - PathStep re-exported (the source nodes live there)
    UNIT_PATH_MARK,
    PathStep,
    TableSource,
    UnitPathSource,
    VirtualTable,
    with_table,
)

__all__ = ["UNIT_PATH_MARK", "PathStep", "UnitPathSource", "build_source", "rewrite_unit_paths"]


def _refuse(message: str, reason: str, node: exp.Expression | None = None, table: TablePolicy | None = None
            ) -> UnsupportedQuery:
    details: dict = {"reason": reason}
    if table is not None:
        details["table"] = table.name
        details["unit_path"] = table.unit_path.to_list()
    if node is not None:
        details["construct"] = " ".join(node.sql(dialect="duckdb").split())[:80]
    return UnsupportedQuery(message, details)


def build_source(table: TablePolicy, policy: DatasetPolicy) -> UnitPathSource:
    """The :class:`~dpgate.sql.sources.UnitPathSource` of a declared table whose unit is a foreign-key path.

    Raises:
        UnsupportedQuery: the path does not hold on this policy (see :class:`~dpgate.sql.sources.PathStep`).
    """
    up = table.unit_path
    steps, here = [], table
    for hop in up.hops:
        target = policy.table(hop.table)
        steps.append(PathStep(here, here.find_column(hop.column).name, target, target.find_column(hop.key).name))
        here = target
    unit = up.unit
    taken = {c.casefold() for c in table.columns}
    while unit.casefold() in taken:
        unit = "_" + unit
    items = [sqln.alias(sqln.col(here.privacy_unit, here.name), unit)]
    items += [sqln.alias(sqln.col(c, table.name), c) for c in table.columns]
    joins = [exp.Join(this=sqln.table(s.target.name, s.target.dataset, s.target.name), on=s.on()) for s in steps]
    tree = sqln.select(items, sqln.table(table.name, table.dataset, table.name), joins=joins,
                       where=sqln.not_null(sqln.col(here.privacy_unit, here.name)))
    view = VirtualTable(
        name=UNIT_PATH_MARK + table.name, dataset=policy.name, source="", privacy_unit=unit,
        max_groups_per_unit=table.max_groups_per_unit, max_rows_per_unit=table.max_rows_per_unit,
        columns=table.columns, path=table.path, public=False, join_sql=tree.sql(dialect="duckdb"),
        join_tree=tree, private_truncation=table.private_truncation)
    return UnitPathSource(path_table=TableSource(table), steps=tuple(steps), view=view)


def _path_table(node: exp.Table, policy: DatasetPolicy) -> TablePolicy | None:
    if not isinstance(node.this, exp.Identifier):
        return None
    table = policy.tables.get(node.name) or next(
        (t for t in policy.tables.values() if t.name.casefold() == node.name.casefold()), None)
    return table if table is not None and table.unit_path is not None else None


def _mergeable(sub: exp.Subquery) -> bool:
    """A derived table the rule merge_derived_tables merges: a SELECT without GROUP BY, aggregates,
    DISTINCT, LIMIT, HAVING, windows or subqueries of its own (a per-unit subquery stays one)."""
    inner = sub.this
    return (isinstance(inner, exp.Select) and not inner.find(exp.AggFunc, exp.Window, exp.Subquery)
            and not any(inner.args.get(k) for k in ("group", "having", "distinct", "limit", "offset", "qualify")))


def rewrite_unit_paths(stmt: exp.Select, policy: DatasetPolicy
                       ) -> tuple[exp.Select, DatasetPolicy, UnitPathSource | None]:
    """Rewrite a SELECT whose FROM is a path table into one over its
    :class:`~dpgate.sql.sources.UnitPathSource`'s view.

    Returns ``(stmt, policy, None)`` unchanged when no table of the statement has a unit path;
    else the statement reading the unit-path table (same alias; qualified references keep
    working), the policy with its view added and the source node.

    Raises:
        UnsupportedQuery: a path table read anywhere but the statement's own FROM or JOIN items
            (``reason = "unit_path"``); nothing is charged. A join is planned by
            :mod:`dpgate.sql.joins` (returned unchanged here).
    """
    frm = stmt.args.get("from_") or stmt.args.get("from")
    # a path table inside a protected EXISTS / IN is the semi-join hook's (dpgate.sql.unit_semi_joins)
    found = [(n, t) for n in stmt.find_all(exp.Table)
             if (t := _path_table(n, policy)) is not None and not in_semi_join(n)]
    if not found:
        return stmt, policy, None
    if frm is not None and isinstance(frm.this, exp.Subquery) and _mergeable(frm.this):
        # a derived table that only filters and projects a join (TPC-H Q7–Q9 on the spec's layout):
        # merged first (rule merge_derived_tables, which the statement rules apply anyway), so its
        # path tables are the query's own FROM and JOIN items
        from dpgate.sql.rules import merge_derived_tables

        return rewrite_unit_paths(merge_derived_tables(stmt), policy)
    node, table = found[0]
    if stmt.args.get("joins"):
        # a join (issue 21 item 1): each path table of the FROM is a UnitPathSource of the join
        # (sql.joins), joined to the others on its path's first hop or on the unit; anywhere else refused
        for n, _ in found:
            if n.parent is not frm and not isinstance(n.parent, exp.Join):
                refuse_unit_path_tables(n, policy)
        return stmt, policy, None
    if frm is None or node.parent is not frm or len(found) > 1:
        refuse_unit_path_tables(stmt, policy)  # in a subquery, IN/EXISTS, or read twice
    resolve_from(stmt, policy)  # another dataset's qualifier, table modifiers: refused as for any table
    source = build_source(table, policy)
    built_table = source.table
    stmt = stmt.copy()
    frm = stmt.args.get("from_") or stmt.args.get("from")
    new = exp.Table(this=exp.Identifier(this=built_table.name, quoted=True))
    alias = frm.this.args.get("alias")
    qualifiers = [alias.name] if alias is not None else []
    new.set("alias", exp.TableAlias(this=exp.Identifier(this=qualifiers[0] if qualifiers else table.name,
                                                        quoted=True)))
    frm.set("this", new)
    return stmt, with_table(policy, built_table), source
