"""Rule ``or_equalities_to_in``: ``x = 1 OR x = 2 OR x IN (3, 4)`` → ``x IN (1, 2, 3, 4)`` (same
column, literals only). Fixtures: ``tests/fixtures/rules/or_equalities_to_in.sql``.
"""

from __future__ import annotations

from sqlglot import exp

def _or_operands(node: exp.Expression) -> list[exp.Expression]:
    """The operands of a chain of ORs (parentheses looked through), iteratively."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        while isinstance(n, exp.Paren):
            n = n.this
        if isinstance(n, exp.Or):
            stack.append(n.expression)
            stack.append(n.this)
        else:
            out.append(n)
    return out


def _equality(node: exp.Expression) -> tuple[exp.Column, list[exp.Expression]] | None:
    """(column, values) of ``col = literal`` (either side) or ``col IN (literals…)``."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.EQ):
        a, b = node.this, node.expression
        if isinstance(b, exp.Column) and isinstance(a, (exp.Literal, exp.Neg)):
            a, b = b, a
        if isinstance(a, exp.Column) and isinstance(b, (exp.Literal, exp.Neg)):
            return a, [b]
    if (isinstance(node, exp.In) and isinstance(node.this, exp.Column) and node.expressions
            and not (set(node.args) - {"this", "expressions"} & {k for k, v in node.args.items() if v})
            and all(isinstance(e, (exp.Literal, exp.Neg)) for e in node.expressions)):
        return node.this, list(node.expressions)
    return None


def or_equalities_to_in(stmt: exp.Select) -> exp.Select:
    """``x = 1 OR x = 2 OR x IN (3, 4)`` → ``x IN (1, 2, 3, 4)`` (same column, literals only).

    The two mean the same for every row, NULLs included (both are NULL when ``x`` is NULL,
    else true iff ``x`` equals one of the values). Long lists of values written as ORs nest
    one level per term in the syntax tree; as an IN list they do not, so a 1,000-value OR
    plans like the IN it means. Runs without recursion. Other ORs are left alone.
    """
    def chains(tree: exp.Expression):
        for n in tree.walk():
            if isinstance(n, exp.Or) and not isinstance(n.parent, exp.Or) and not (
                    isinstance(n.parent, exp.Paren) and isinstance(n.parent.parent, exp.Or)):
                operands = _or_operands(n)
                parts = [_equality(o) for o in operands]
                if any(p is None for p in parts):
                    continue
                columns = {(p[0].name.casefold(), p[0].table.casefold(), p[0].db.casefold())
                           for p in parts}
                if len(columns) == 1:
                    yield n, parts

    if next(chains(stmt), None) is None:
        return stmt  # nothing to rewrite (the input is returned unmodified)
    stmt = stmt.copy()
    for top, parts in list(chains(stmt)):
        values = [v.copy() for _, vals in parts for v in vals]
        replacement = exp.In(this=parts[0][0].copy(), expressions=values)
        if top is stmt:  # pragma: no cover - a statement is never an OR
            continue
        top.replace(replacement)
    return stmt

