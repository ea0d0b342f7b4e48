"""Semi-joins with public tables: ``x IN (SELECT c FROM public_table …)`` and ``[NOT] EXISTS``
correlated on a public table (issue 21 item 5).

A public table holds nothing to protect (``public = true``), so a subquery that reads public tables
only is a *public* query: its exact answer is a list of values that depends on no privacy unit.
``WHERE region IN (SELECT region FROM regions WHERE zone = 'north')`` is therefore the row filter
``WHERE region IN ('eu', …)``: every row is kept or dropped by its own values and public data, so
the bounded aggregate's sensitivity is that of the query with the literal list (a row filter never
moves a unit's contribution bound). This module finds such subqueries in the statement's WHERE
(:func:`public_subqueries`), rewrites a correlated ``EXISTS`` into the ``IN`` it means
(:func:`exists_as_in`) and puts the values in their place (:func:`inline_values`). The values are
computed by the caller (the pipeline: the subquery planned as a public-only query and executed
exactly, SQL generated from its plan — the analyst's text never reaches the engine); this module
reads no data.

* ``x [NOT] IN (SELECT c FROM …)`` becomes ``x [NOT] IN (v1, …, vn)`` with the subquery's distinct
  values, sorted (so the plan hash does not depend on the engine's row order), NULL included (a
  float NaN read as NULL, as the gateway reads NaN everywhere): SQL's three-valued IN over a subquery is the IN over its values' list. An empty
  answer becomes ``FALSE`` (``NOT … IN`` of it ``TRUE``).
* ``EXISTS (SELECT … FROM p WHERE p.c = o.x AND rest)`` (exactly one equality between an inner
  column and an outer expression; every other condition on the inner tables only) becomes
  ``(o.x IS NOT NULL AND o.x IN (SELECT p.c FROM p WHERE rest AND p.c IS NOT NULL))``, which is
  TRUE or FALSE exactly where EXISTS is (never NULL), so ``NOT EXISTS`` is its negation.

Refused (``UnsupportedQuery``, ``details.reason = "semi_join"``, before anything is read): a
subquery selecting other than one column, an EXISTS correlated on
zero or several equalities or on an unqualified outer column, and (in the pipeline) an answer of
more than :data:`MAX_VALUES` values or of values that are not text, integers, finite floats or
booleans. An IN subquery or EXISTS over a protected table is left in place: the planner answers it
when its correlation keeps it inside the outer row's unit (:mod:`dpgate.sql.unit_semi_joins`) and
refuses it otherwise.

* A scalar subquery over public tables in WHERE or HAVING (``HAVING SUM(x) > (SELECT SUM(x) * 0.01
  FROM partsupp …)``, TPC-H Q11; :func:`public_scalars`) is a public constant: its one value (NULL
  for no row) replaces it (:func:`inline_scalar`); more rows, or a correlated one, are refused.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.policy import DatasetPolicy

__all__ = ["MAX_VALUES", "exists_as_in", "inline_scalar", "inline_values", "public_scalars", "public_subqueries",
           "resolve_semi_joins"]

#: Most values one public IN subquery may answer (the literal list enters the plan).
MAX_VALUES = 10_000


def _refusal(message: str, node: exp.Expression) -> UnsupportedQuery:
    return UnsupportedQuery(message, {"construct": node.sql(dialect="duckdb")[:200], "reason": "semi_join"})


def _inner_tables(select: exp.Select) -> list[exp.Table]:
    return [t for t in select.find_all(exp.Table) if t.find_ancestor(exp.Select) is select]


def _cte_names(select: exp.Expression) -> set[str]:
    """Names the statement's WITH defines: they shadow a policy table of the same name."""
    root = select
    while root.parent is not None:
        root = root.parent
    return {cte.alias_or_name.casefold() for cte in root.find_all(exp.CTE)}


def _reads_public_only(select: exp.Select, policy: DatasetPolicy) -> bool:
    tables = list(select.find_all(exp.Table))
    shadowed = _cte_names(select)  # a trial: WITH pub AS (… protected …) … IN (SELECT g FROM pub) read the table
    return bool(tables) and all(t.name in policy.tables and policy.tables[t.name].public
                                and t.name.casefold() not in shadowed for t in tables)


def exists_as_in(select: exp.Select, policy: DatasetPolicy) -> exp.Select:
    """``select`` with each ``EXISTS`` of its WHERE over public tables rewritten into the ``IN`` it
    means (module docstring). Other EXISTS are left for the planner's refusal, except those over
    public tables whose correlation cannot be read, which are refused here.

    Raises:
        UnsupportedQuery: an EXISTS over public tables not correlated on exactly one equality.
    """
    where = select.args.get("where")
    if where is None:
        return select
    for node in list(where.find_all(exp.Exists)):
        inner = node.this
        if not isinstance(inner, exp.Select) or not _reads_public_only(inner, policy):
            continue
        node.replace(_exists_to_in(node, inner, policy))
    return select


def _exists_to_in(node: exp.Exists, inner: exp.Select, policy: DatasetPolicy) -> exp.Expression:
    tables = _inner_tables(inner)
    names = {t.alias_or_name for t in tables} | {t.name for t in tables}
    columns = {c for t in tables for c in policy.tables[t.name].columns}
    conjuncts = list(inner.args["where"].this.flatten()) if inner.args.get("where") is not None and isinstance(
        inner.args["where"].this, exp.And) else ([inner.args["where"].this] if inner.args.get("where") else [])

    def outer(c: exp.Column) -> bool:
        if c.table:
            return c.table not in names
        if c.name not in columns:
            raise _refusal(f"column {c.name!r} in the EXISTS subquery is not a column of its tables: qualify a "
                           "correlated column with its table (o.x)", node)
        return False

    correlated, rest = [], []
    for c in conjuncts:
        (correlated if any(outer(col) for col in c.find_all(exp.Column)) else rest).append(c)
    if len(correlated) != 1 or not isinstance(correlated[0], exp.EQ):
        raise _refusal("EXISTS over a public table must be correlated on exactly one equality between one of its "
                       "columns and the outer query (WHERE p.key = o.key AND …)", node)
    left, right = correlated[0].this, correlated[0].expression
    if isinstance(left, exp.Column) and not outer(left) and not any(map(outer, right.find_all(exp.Column))):
        raise _refusal("the EXISTS equality must compare an inner column with the outer query", node)
    if isinstance(right, exp.Column) and not outer(right) and any(map(outer, left.find_all(exp.Column))):
        left, right = right, left
    if not (isinstance(left, exp.Column) and not outer(left)) or any(
            not outer(col) for col in right.find_all(exp.Column)):
        raise _refusal("the EXISTS equality must compare an inner column with an expression of the outer query", node)
    cond = exp.and_(*rest, exp.Not(this=exp.Is(this=left.copy(), expression=exp.Null()))) if rest else \
        exp.Not(this=exp.Is(this=left.copy(), expression=exp.Null()))
    source = inner.args.get("from_") or inner.args.get("from")
    sub = exp.select(left.copy())
    sub.set("from_" if "from_" in inner.args else "from", source.copy())
    for join in inner.args.get("joins") or []:
        sub.append("joins", join.copy())
    sub.set("where", exp.Where(this=cond))
    return exp.Paren(this=exp.and_(exp.Not(this=exp.Is(this=right.copy(), expression=exp.Null())),
                                   exp.In(this=right.copy(), query=exp.Subquery(this=sub))))


def public_subqueries(select: exp.Select, policy: DatasetPolicy) -> list[exp.In]:
    """The ``x IN (SELECT …)`` nodes of ``select``'s WHERE whose subquery reads public tables only.

    Raises:
        UnsupportedQuery: such a subquery selects other than exactly one column.
    """
    where = select.args.get("where")
    if where is None:
        return []
    out = []
    for node in where.find_all(exp.In):
        query = node.args.get("query")
        inner = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(inner, exp.Select) or not _reads_public_only(inner, policy):
            continue
        if len(inner.expressions) != 1 or isinstance(inner.expressions[0], exp.Star):
            raise _refusal("an IN subquery must select exactly one column", node)
        out.append(node)
    return out


def public_scalars(select: exp.Select, policy: DatasetPolicy) -> list[exp.Subquery]:
    """The scalar subqueries ``(SELECT agg FROM public_table …)`` of ``select``'s WHERE and HAVING
    (not an IN's or EXISTS's) whose subquery reads public tables only: each is a public constant.

    Raises:
        UnsupportedQuery: such a subquery selects other than exactly one column.
    """
    out = []
    for key in ("where", "having"):
        clause = select.args.get(key)
        if clause is None:
            continue
        for node in clause.find_all(exp.Subquery):
            inner = node.this
            if isinstance(node.parent, (exp.In, exp.Exists)) or not isinstance(inner, exp.Select) \
                    or not _reads_public_only(inner, policy):
                continue
            if len(inner.expressions) != 1 or isinstance(inner.expressions[0], exp.Star):
                raise _refusal("a scalar subquery must select exactly one column", node)
            columns = {c.casefold() for t in inner.find_all(exp.Table) for c in policy.tables[t.name].columns}
            outer = next((c for c in inner.find_all(exp.Column) if c.name.casefold() not in columns), None)
            if outer is not None:
                raise _refusal(f"a correlated scalar subquery (it reads {outer.sql()} of the outer query) is not "
                               "supported: a scalar subquery over public tables is answered once, exactly, and must "
                               "read its own tables only", node)
            out.append(node)
    return out


def inline_scalar(node: exp.Subquery, values: Sequence[Any]) -> None:
    """Replace the scalar subquery ``node`` (from :func:`public_scalars`) by its one value (NULL
    when it answers no row), as :func:`inline_values` writes values.

    Raises:
        UnsupportedQuery: more than one row, or a value :func:`inline_values` refuses.
    """
    if len(values) > 1:
        raise _refusal(f"the scalar subquery answers {len(values)} rows: it must answer at most one", node)
    probe = exp.In(this=exp.Null(), query=node.copy())
    inline_values(probe, list(values) or [None])
    node.replace(probe.expressions[0])


def inline_values(node: exp.In, values: Sequence[Any]) -> None:
    """Replace the subquery of ``node`` (from :func:`public_subqueries`) by its answer's values.

    Args:
        node: the IN node, changed in place.
        values: the subquery's exact answer (one column), in any order; at most :data:`MAX_VALUES`.

    Raises:
        UnsupportedQuery: more than :data:`MAX_VALUES` values, or a value that is not text, an
            integer, a finite float, a boolean or NULL.
    """
    distinct = dict.fromkeys(None if isinstance(v, float) and math.isnan(v) else v for v in values)
    if len(distinct) > MAX_VALUES:
        raise _refusal(f"the subquery answers more than {MAX_VALUES} distinct values: filter it further", node)
    literals: list[exp.Expression] = []
    for v in sorted(distinct, key=lambda v: (v is not None, type(v).__name__, v if v is not None else 0)):
        if v is None:
            literals.append(exp.Null())
        elif isinstance(v, bool):
            literals.append(exp.Boolean(this=v))
        elif isinstance(v, int):
            literals.append(exp.Literal.number(v))
        elif isinstance(v, float) and math.isfinite(v):
            literals.append(exp.Literal.number(repr(v)))
        elif isinstance(v, str):
            literals.append(exp.Literal.string(v))
        else:
            raise _refusal(f"the subquery answers a value of type {type(v).__name__}: only text, numbers and "
                           "booleans can be listed", node)
    if not literals:
        node.replace(exp.false())  # x IN (<no rows>) is FALSE for every x, NULL included
        return
    node.set("query", None)
    node.set("expressions", literals)


def resolve_semi_joins(select: exp.Select, policy: DatasetPolicy,
                       values_of: Callable[[exp.Select], Sequence[Any]] | None) -> exp.Select:
    """:func:`exists_as_in`, then each public IN subquery replaced by ``values_of(subquery)``.

    Args:
        select: the statement (changed in place and returned).
        values_of: the exact one-column answer of a public-only SELECT (the pipeline's); None
            leaves the subqueries for the planner's refusal.
    """
    if values_of is None or (select.args.get("where") is None and select.args.get("having") is None):
        return select
    exists_as_in(select, policy)
    for node in public_subqueries(select, policy):
        query = node.args["query"]
        inline_values(node, values_of(query.this if isinstance(query, exp.Subquery) else query))
    for node in public_scalars(select, policy):  # HAVING SUM(x) > (SELECT SUM(x) * 0.01 FROM public …)
        inline_scalar(node, values_of(node.this))
    return select
