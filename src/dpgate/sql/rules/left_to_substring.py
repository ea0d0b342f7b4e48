"""Rule ``left_to_substring``: ``LEFT(s, n)`` → ``SUBSTRING(s, 1, n)`` for a non-negative integer
literal ``n`` (the two are equal for every string, NULL included), so that a LEFT key over a
column with public keys is enumerated from its public keys like a SUBSTRING key
(:mod:`dpgate.sql.keys`). Fixtures: ``tests/fixtures/rules/left_to_substring.sql``.
"""

from __future__ import annotations

import re

from sqlglot import exp

_DIGITS = re.compile(r"^\d{1,9}$")


def _rewritable(node: exp.Expression) -> bool:
    n = node.args.get("expression")
    return (isinstance(node, exp.Left) and isinstance(n, exp.Literal) and not n.is_string
            and bool(_DIGITS.match(str(n.this))))


def left_to_substring(stmt: exp.Select) -> exp.Select:
    """``LEFT(s, n)`` → ``SUBSTRING(s, 1, n)``, ``n`` a non-negative integer literal.

    A negative or computed ``n`` is left alone (DuckDB's ``LEFT(s, -1)`` drops the last
    character, SUBSTRING's length would not): the planner then refuses LEFT as a function it
    does not know, with a message that quotes it.
    """
    if not any(_rewritable(n) for n in stmt.find_all(exp.Left)):
        return stmt
    stmt = stmt.copy()
    for node in list(stmt.find_all(exp.Left)):
        if _rewritable(node):
            node.replace(exp.Substring(this=node.this, start=exp.Literal.number(1),
                                       length=node.args["expression"]))
    return stmt
