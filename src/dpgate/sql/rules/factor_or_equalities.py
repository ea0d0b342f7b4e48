"""Rule ``factor_or_equalities``: ``(a.k = b.k AND x) OR (a.k = b.k AND y)`` → ``a.k = b.k AND (x OR y)``
(issue 21 item 3, TPC-H Q19). Fixtures: ``tests/fixtures/rules/factor_or_equalities.sql``.
"""

from __future__ import annotations

from sqlglot import exp


def _flatten(node: exp.Expression, kind: type[exp.Connector]) -> list[exp.Expression]:
    """The operands of a chain of ``kind`` (AND or OR; parentheses looked through), in order, iteratively."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, kind):
            stack.append(n.expression)
            stack.append(n.this)
        else:
            out.append(n)
    return out


def _equality_key(node: exp.Expression) -> frozenset[str] | None:
    """The two sides' text of a ``Column = Column`` equality (either order), else None."""
    if isinstance(node, exp.EQ) and isinstance(node.this, exp.Column) and isinstance(node.expression, exp.Column):
        return frozenset((node.this.sql(dialect="duckdb"), node.expression.sql(dialect="duckdb")))
    return None


def _factor(node: exp.Expression) -> list[exp.Expression] | None:
    """``node``, an OR whose every branch has the same column equalities among its conjuncts, as the
    conjuncts ``[equality, …, (rest OR rest …)]``; None when no equality is in every branch."""
    branches = [_flatten(b, exp.And) for b in _flatten(node, exp.Or)]
    if len(branches) < 2:
        return None
    common = [c for c in branches[0] if (key := _equality_key(c)) is not None
              and all(any(_equality_key(o) == key for o in b) for b in branches[1:])]
    keys = {_equality_key(c) for c in common}
    if not common:
        return None
    rests = [[c for c in b if _equality_key(c) not in keys] for b in branches]
    out = [c.copy() for c in dict((_equality_key(c), c) for c in common).values()]
    if any(not r for r in rests):  # a branch that is only the equalities: (E) OR (E AND y) is E
        return out
    ors = [exp.and_(*[c.copy() for c in r]) if len(r) > 1 else r[0].copy() for r in rests]
    return out + [exp.paren(exp.or_(*ors), copy=False)]


def factor_or_equalities(stmt: exp.Select) -> exp.Select:
    """Factor the column equalities common to every branch of an OR in WHERE out of it.

    ``WHERE (p_partkey = l_partkey AND p_brand = 'B12' …) OR (p_partkey = l_partkey AND …)`` →
    ``WHERE p_partkey = l_partkey AND ((p_brand = 'B12' …) OR (…))``: an equality present in every
    branch holds on every row the OR keeps, so it is implied by the WHERE and may stand beside it
    (A ∧ B) ∨ (A ∧ C) ≡ A ∧ (B ∨ C), which holds in SQL's three-valued (Kleene) logic as in
    Boolean logic, NULLs included. The join rewrite then sees the join's equality at the top level
    (rule :mod:`dpgate.sql.rules.comma_joins` moves it to the ON). Only equalities of two columns
    (``Column = Column``, compared as written, either order) are factored, in the order of the
    first branch, from the top-level conjuncts of WHERE that are ORs; an OR where one branch lacks
    the equality is left as it is (a comma join then stays a cross join, refused). Other
    conjuncts, the other clauses and subqueries are untouched.
    """
    where = stmt.args.get("where")
    if where is None or where.this.find(exp.Or) is None:
        return stmt
    conjuncts = _flatten(where.this, exp.And)
    out: list[exp.Expression] = []
    changed = False
    for c in conjuncts:
        factored = _factor(c) if isinstance(c, exp.Or) else None
        changed = changed or factored is not None
        out.extend(factored if factored is not None else [c.copy()])
    if not changed:
        return stmt
    stmt = stmt.copy()
    stmt.set("where", exp.Where(this=exp.and_(*out, copy=False) if len(out) > 1 else out[0]))
    return stmt
