"""Rule ``comma_joins``: ``FROM a, b WHERE a.k = b.k AND …`` → ``FROM a JOIN b ON a.k = b.k WHERE …``
(issue 21 item 3). Fixtures: ``tests/fixtures/rules/comma_joins.sql``.
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.rules.base import from_clause, real_args


def _is_comma(join: exp.Join) -> bool:
    """True for a comma join (``FROM a, b``): a JOIN without kind, side, method, ON or USING."""
    return not (real_args(join) - {"this"})


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    """The operands of a chain of ANDs (parentheses looked through), in order, iteratively."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, exp.And):
            stack.append(n.expression)
            stack.append(n.this)
        else:
            out.append(n)
    return out


def _names(item: exp.Expression) -> set[str]:
    """The names a FROM item answers to (its alias, else its table name), casefolded."""
    if item.alias:
        return {item.alias.casefold()}
    return {item.name.casefold()} if isinstance(item, exp.Table) else set()


def _target(cond: exp.Expression, names: list[set[str]], comma: list[bool]) -> int | None:
    """The FROM position whose ON receives ``cond`` (a column equality), or None to keep it in WHERE.

    A side qualified by a FROM item is at that item's position; an unqualified side could be any
    table, so it counts as the last comma-joined one (the join rewrite moves each equality to the
    ON of the later table it compares, once the columns are resolved). Kept in WHERE: an equality
    whose sides name one item (a row filter), an unknown qualifier, a later explicit JOIN.
    """
    if not (isinstance(cond, exp.EQ) and isinstance(cond.this, exp.Column) and isinstance(cond.expression, exp.Column)):
        return None
    last_comma = max(i for i, c in enumerate(comma) if c)
    positions = []
    for side in (cond.this, cond.expression):
        if side.args.get("db") is not None or side.args.get("catalog") is not None or isinstance(side.this, exp.Star):
            return None
        qual = side.args.get("table")
        if qual is None:
            positions.append(None)
            continue
        hits = [i for i, n in enumerate(names) if qual.name.casefold() in n]
        if len(hits) != 1:
            return None
        positions.append(hits[0])
    known = [p for p in positions if p is not None]
    if len(known) == 2 and known[0] == known[1]:
        return None
    target = max(known) if len(known) == 2 else last_comma
    if known and max(known) > target:
        return None
    return target if comma[target] else None


def comma_joins(stmt: exp.Select) -> exp.Select:
    """``FROM a, b, c WHERE a.k = b.k AND b.u = c.u AND a.x > 1`` → ``FROM a JOIN b ON a.k = b.k
    JOIN c ON b.u = c.u WHERE a.x > 1``.

    A comma join is an INNER JOIN whose condition is written in WHERE: for inner joins the two
    mean the same on every row (NULLs included: a NULL comparison drops the row either way), and a
    LEFT JOIN after them never null-extends the tables they compare. The rule moves WHERE's
    top-level equalities of two columns (``Column = Column``) into the ON of the comma-joined
    table they connect, so that the join rewrite (:mod:`dpgate.sql.joins`) checks them like any
    written ON: types, the unit graph, LEFT-join placement. Equalities with an unqualified side
    go to the last comma-joined table (the rule has no schema), and every comma join before the
    last one that received an equality gets ``ON TRUE`` if it received none; the join rewrite
    resolves the columns, lists the tables so that each has an equality with one before it (a
    spanning order of the equality graph: the order the analyst lists them in does not matter),
    moves each equality to the ON of the later table it compares and drops ``ON TRUE``, so the
    plan (and its hash) is that of the query written with JOIN … ON. A comma-joined table after
    every equality stays a comma join: a cross join, refused by the join rewrite (as is a graph in
    several parts). Only the statement's
    own FROM is rewritten (not subqueries); other conjuncts and the order of the rest are kept.
    """
    frm = from_clause(stmt)
    joins = stmt.args.get("joins") or []
    if frm is None or not any(_is_comma(j) for j in joins) or stmt.args.get("where") is None:
        return stmt
    items = [frm.this] + [j.this for j in joins]
    comma = [False] + [_is_comma(j) for j in joins]
    names = [_names(i) for i in items]
    kept, moved = [], {}
    for cond in _conjuncts(stmt.args["where"].this):
        target = _target(cond, names, comma)
        if target is None:
            kept.append(cond)
            continue
        moved.setdefault(target, []).append(cond)
    if not moved:
        return stmt
    stmt = stmt.copy()
    last_moved = max(moved)
    new_joins = []
    for i, join in enumerate(stmt.args["joins"], start=1):
        join = join.copy()
        if i in moved:
            join.set("on", exp.and_(*[c.copy() for c in moved[i]]))
        elif comma[i] and i < last_moved:
            join.set("on", exp.true())
        new_joins.append(join)
    stmt.set("joins", new_joins)
    rest = kept[0].copy() if len(kept) == 1 else exp.and_(*[c.copy() for c in kept]) if kept else None
    stmt.set("where", exp.Where(this=rest) if rest is not None else None)
    return stmt
