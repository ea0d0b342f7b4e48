"""Rule ``merge_derived_tables``: ``SELECT … FROM (SELECT <projections> FROM t [WHERE p]) AS s
[WHERE q] …`` → ``SELECT … FROM t AS s WHERE p AND q …`` with every reference to a projected
name replaced by its expression (nested derived tables merge inside out).

A derived table is merged only when it filters, projects and computes row expressions over
one table or over a join of tables: its own GROUP BY, aggregates, DISTINCT, LIMIT, HAVING,
window functions and the like are refused with a reason (per-unit subqueries are a separate
feature: issue 12). Inlining is what SQL means: a derived table without those clauses is
exactly the filtered projection of its FROM (ISO/IEC 9075-2, §7.6), so the rewrite changes no
answer.

A derived table over a join (issue 21 item 4: TPC-H Q7–Q9 write ``FROM (SELECT … FROM a, b, c
WHERE …) AS shipping``) merges into an outer query that reads it alone (no join of its own):
the outer query's FROM becomes the derived table's FROM and joins, its WHERE is the inner
WHERE AND the outer one (the outer WHERE filters the joined rows either way, LEFT joins
included), and the inner columns keep their qualifiers (each names one of the join's tables).
The merged query is then checked like any join (:mod:`dpgate.sql.joins`, after the comma-join
rule): the merge adds no way to pair rows the flat query would not. Refused: a ``*`` in such a
derived table (its columns would be every joined table's) and an outer query that joins the
derived table to other tables.
Fixtures: ``tests/fixtures/rules/merge_derived_tables.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from dpgate.errors import UnknownColumn
from dpgate.sql.rules.base import CLAUSE_NAMES, MAX_DEPTH, from_clause, real_args, refuse, snippet
from dpgate.sql.rules.inline_ctes import inline_ctes
from dpgate.sql.rules.nesting import nesting_refusal

#: SELECT arguments a mergeable derived table may have.
_MERGEABLE_ARGS = {"expressions", "from_", "from", "where", "joins"}


def merge_derived_tables(stmt: exp.Select, _depth: int = 0) -> exp.Select:
    """Merge a derived table in FROM (and, recursively, the ones inside it) into the query.

    The outer query's references to the derived table's output names (qualified by its
    alias or not) become the projected expressions (parenthesised unless they are a
    column or a constant), ``*`` passes the table's columns through, the two WHERE
    clauses are joined with AND, and the base table takes the derived table's alias.
    A released column keeps the title it had (``SELECT a FROM (SELECT age AS a …)``
    releases a column titled ``a``).

    Raises:
        UnsupportedQuery: the derived table does more than filter/project one table
            (GROUP BY, aggregates, DISTINCT, LIMIT, JOIN, …), or the nesting is deeper
            than :data:`~dpgate.sql.rules.base.MAX_DEPTH`.
        UnknownColumn: the outer query names a column the derived table does not project.
    """
    frm = from_clause(stmt)
    if frm is None or not isinstance(frm.this, exp.Subquery):
        return stmt
    if _depth >= MAX_DEPTH:
        raise nesting_refusal("subqueries", MAX_DEPTH)
    sub = frm.this
    if real_args(sub) - {"this", "alias"}:
        raise refuse(f"{snippet(sub)}: options on a subquery are not supported", sub)
    inner = sub.this
    if isinstance(inner, exp.Subquery):  # ((SELECT …)) AS s
        inner = inner.unnest()
    if not isinstance(inner, exp.Select):
        raise refuse(f"{snippet(inner)} in FROM: only a plain SELECT can be a subquery", inner)
    inner = inline_ctes(inner)
    inner = merge_derived_tables(inner, _depth + 1)
    _check_mergeable(inner)
    alias_node = sub.args.get("alias")
    if alias_node is not None and alias_node.args.get("columns"):
        raise refuse(f"column lists on a subquery alias ({snippet(alias_node)}) are not "
                     "supported: rename the columns with AS inside the subquery", alias_node)
    alias = alias_node.name if alias_node is not None else None
    if inner.args.get("joins"):
        return _merge_join(stmt, inner, sub, alias)
    base = from_clause(inner).this.copy()
    derived = _Derived.of(inner, base, sub, alias)
    out = stmt.copy()
    _substitute_outer(out, derived)
    table = base.copy()
    table.set("alias", exp.TableAlias(this=exp.to_identifier(alias)) if alias else None)
    out.set("from_", exp.From(this=table))
    out.set("from", None)
    inner_where = inner.args.get("where")
    if inner_where is not None:
        cond = inner_where.this.transform(derived.unqualify, copy=True)
        outer_where = out.args.get("where")
        if outer_where is not None:
            cond = exp.and_(exp.Paren(this=cond), exp.Paren(this=outer_where.this))
        out.set("where", exp.Where(this=cond))
    return out


def _merge_join(stmt: exp.Select, inner: exp.Select, sub: exp.Subquery, alias: str | None) -> exp.Select:
    """Merge a derived table over a join (module docstring): the outer query reads the join."""
    if stmt.args.get("joins"):
        raise refuse(f"{snippet(sub)}: a subquery with joins that is itself joined to other tables is not "
                     "supported: write one join of the tables", sub)
    derived = _Derived(sub, alias, set())  # inner columns keep their qualifiers
    for item in inner.expressions:
        derived.add_projection(item)
    if derived.star:
        raise refuse(f"{snippet(sub)}: SELECT * in a subquery with joins is not supported: name its "
                     "columns (with AS where two tables share a name)", sub)
    if real_args(stmt) <= {"expressions", "from_", "from"} and len(stmt.expressions) == 1 and (
            isinstance(stmt.expressions[0], exp.Star)):
        return inner.copy()  # SELECT * FROM (the join) with no other clause is the join's query
    out = stmt.copy()
    if any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
           for e in out.expressions):
        raise refuse(f"SELECT * over {snippet(sub)} is not supported: name the columns", sub)
    _substitute_outer(out, derived)
    out.set("from_", exp.From(this=from_clause(inner).this.copy()))
    out.set("from", None)
    out.set("joins", [j.copy() for j in inner.args["joins"]])
    inner_where = inner.args.get("where")
    if inner_where is not None:
        cond = inner_where.this.copy()
        outer_where = out.args.get("where")
        if outer_where is not None:
            cond = exp.and_(exp.Paren(this=cond), exp.Paren(this=outer_where.this))
        out.set("where", exp.Where(this=cond))
    return out


@dataclass
class _Derived:
    """A mergeable derived table: its projections over the base table (unqualified), whether it
    projects ``*``, and the qualifiers by which the outer query refers to it."""

    sub: exp.Subquery
    alias: str | None
    inner_quals: set[str]
    projections: dict[str, exp.Expression] = field(default_factory=dict)
    star: bool = False

    @classmethod
    def of(cls, inner: exp.Select, base: exp.Table, sub: exp.Subquery, alias: str | None) -> "_Derived":
        """The derived table ``sub`` (alias ``alias``) over ``base``, ready to take its projections."""
        inner_quals = {base.name.casefold()}
        if base.args.get("alias") is not None:
            inner_quals.add(base.alias.casefold())
        derived = cls(sub, alias, inner_quals)
        for item in inner.expressions:
            derived.add_projection(item)
        return derived

    def unqualify(self, node: exp.Expression) -> exp.Expression:
        """Inner expressions are rewritten over the base table with no qualifier."""
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            tbl = node.args.get("table")
            if tbl is not None and node.args.get("db") is None and tbl.name.casefold() in self.inner_quals:
                return exp.column(node.this.copy())
        return node

    def add_projection(self, item: exp.Expression) -> None:
        """Record one projection of the derived table (a star, a column or an aliased expression).

        Raises: UnsupportedQuery (a star with modifiers, an unnamed expression).
        """
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column)
                                          and isinstance(item.this, exp.Star)):
            if real_args(item) - {"this", "table"}:
                raise refuse(f"{snippet(item)} with modifiers is not supported in a subquery",
                             item)
            self.star = True
            return
        name = item.alias_or_name
        if not name:
            raise refuse(f"{snippet(item)} in a subquery needs a name (AS …)", item)
        body = item.unalias().transform(self.unqualify, copy=True)
        if name.casefold() in self.projections:
            raise refuse(f"the subquery projects two columns named {name!r}", item)
        self.projections[name.casefold()] = body

    def replace(self, node: exp.Expression, aliases: set[str], shadow: bool = True) -> exp.Expression:
        """An outer reference to the derived table → the projected expression."""
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return node
        tbl = node.args.get("table")
        quals = {self.alias.casefold()} if self.alias else set()
        if node.args.get("db") is not None or (tbl is not None and tbl.name.casefold() not in quals):
            return node  # not ours: the planner's scope check names it
        key = node.name.casefold()
        if key in self.projections:
            if shadow and tbl is None and key in aliases:
                return node  # an output alias of the outer query (ORDER BY / HAVING)
            body = self.projections[key].copy()
            if not isinstance(body, (exp.Column, exp.Literal, exp.Null, exp.Boolean)):
                body = exp.Paren(this=body)
            return body
        if self.star:
            return exp.column(node.this.copy())
        if tbl is None and key in aliases:
            return node  # an output alias of the outer query
        raise UnknownColumn(
            f"the subquery {self.alias or snippet(self.sub, 40)!r} has no column {node.name!r}",
            {"table": self.alias, "column": node.name},
        )


def _substitute_outer(out: exp.Select, derived: _Derived) -> None:
    """Replace the outer query's references to the derived table, in place."""
    outer_aliases = {e.alias.casefold() for e in out.expressions if isinstance(e, exp.Alias)}
    items = []
    for item in out.expressions:
        if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star):
            new = derived.replace(item, set())
            if new is not item and not (isinstance(new, exp.Column) and new.name == item.name):
                new = exp.alias_(new, item.name, quoted=item.this.args.get("quoted"))
            items.append(new)
        else:
            new = item.transform(lambda n: derived.replace(n, set()), copy=True)
            if not isinstance(item, exp.Alias) and new != item:
                # Keep the analyst's title (``SUM(t)``, not ``SUM(tokens)``).
                new = exp.alias_(new, snippet(item, 200), quoted=True)
            items.append(new)
    out.set("expressions", items)
    # In WHERE and GROUP BY the subquery's columns come before the outer query's aliases; in
    # HAVING and ORDER BY the aliases come first (as in DuckDB and PostgreSQL).
    for key in ("where", "group", "having", "order"):
        if out.args.get(key) is not None:
            shadow = key in ("having", "order")
            out.set(key, out.args[key].transform(
                lambda n: derived.replace(n, outer_aliases, shadow), copy=True))


def _check_mergeable(inner: exp.Select) -> None:
    for key in sorted(real_args(inner) - _MERGEABLE_ARGS):
        what = CLAUSE_NAMES.get(key, key.upper())
        raise refuse(
            f"{what} inside a subquery is not supported: a subquery may only filter (WHERE), "
            "project and compute row expressions over one table or a join",
            inner,
        )
    frm = from_clause(inner)
    if frm is None:
        raise refuse("a subquery needs a FROM clause naming one table", inner)
    if not isinstance(frm.this, exp.Table):
        raise refuse(f"{snippet(frm.this)} in a subquery's FROM: name one table", frm.this)
    for join in inner.args.get("joins") or []:
        if not isinstance(join.this, exp.Table):
            raise refuse(f"{snippet(join.this)} joined in a subquery: only declared tables can be joined",
                         join.this)
    for node in inner.expressions:
        agg = node.find(exp.AggFunc)
        if agg is not None:
            raise refuse(
                f"aggregates inside a subquery ({snippet(agg)}) are not supported: a "
                "subquery may only filter, project and compute row expressions over one table",
                agg,
            )
        if node.find(exp.Window) is not None:
            raise refuse("window functions inside a subquery are not supported", node)
