"""Canonical rewrites of row-expression trees: declared column names, sqlglot's simplifier,
searched CASE for IF / simple CASE, and CAST read as TRY_CAST in row predicates.

Pure tree → tree functions (no policy, no binding); the binder (:mod:`dpgate.sql.bind`)
binds their results.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.simplify import simplify

from dpgate.sql.messages import DIALECT


def canonical_columns(tree: exp.Expression, rename: Callable[[exp.Column], str]) -> exp.Expression:
    """A copy of ``tree`` whose columns are the declared names, double-quoted, unqualified."""

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return exp.column(rename(node), quoted=True)
        return node

    return tree.transform(fix, copy=True)


def simplify_tree(tree: exp.Expression) -> exp.Expression:
    """sqlglot's ``simplify`` on a copy (the tree itself when sqlglot cannot simplify it)."""
    try:
        out = simplify(tree.copy(), dialect=DIALECT)
    except (SqlglotError, RecursionError, ValueError, TypeError):  # pragma: no cover
        return tree
    return out


def searched_case(tree: exp.Expression) -> exp.Expression:
    """``IF(c, a, b)`` → ``CASE WHEN c THEN a ELSE b END``; ``CASE x WHEN v …`` →
    ``CASE WHEN x = v …`` (one spelling per meaning)."""

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.If) and not isinstance(node.parent, exp.Case) and (
                node.args.get("true") is not None):
            return exp.Case(ifs=[exp.If(this=node.this, true=node.args["true"])],
                            default=node.args.get("false"))
        if isinstance(node, exp.Anonymous) and node.name.lower() == "if" and len(node.expressions) == 3:
            c, a, b = node.expressions
            return exp.Case(ifs=[exp.If(this=c, true=a)], default=b)
        if isinstance(node, exp.Case) and node.this is not None:
            operand = node.this
            ifs = [exp.If(this=exp.EQ(this=operand.copy(), expression=i.this), true=i.args["true"])
                   for i in node.args["ifs"]]
            return exp.Case(ifs=ifs, default=node.args.get("default"))
        return node

    return tree.transform(fix, copy=False)


def cast_as_try_cast(node: exp.Expression) -> exp.Expression:
    """A copy of the row predicate ``node`` with every ``CAST(x AS t)`` (and ``x::t``) read as
    ``TRY_CAST(x AS t)``.

    A per-row CAST that fails on some row (``CAST(educ AS INTEGER)`` of a text ``'n/a'``)
    would make the bounded query raise *after* the charge, and whether it raises depends
    on the data. Under TRY semantics such a row's value is NULL, so the comparison is
    unknown and the row is filtered out (DESIGN_NOTES, "SQL"). The target types are those
    of TRY_CAST; other targets stay refused by the binder, and so does a cast of a constant
    (nothing per row about it; write the literal).
    """

    def fix(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast) and n.this.find(exp.Column) \
                and not any(n.args.get(k) for k in ("format", "action", "default")):
            return exp.TryCast(this=n.this, to=n.args["to"])
        return n

    return node.copy().transform(fix, copy=False)

