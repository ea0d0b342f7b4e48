"""The nesting limits of the planner, checked without recursion before anything recurses:
expressions (:data:`MAX_NESTING`), syntax-tree depth (:data:`MAX_TREE_DEPTH`, long AND/OR chains)
and nested subqueries (:data:`~dpgate.sql.rules.base.MAX_DEPTH`), with the one refusal
:func:`nesting_refusal` for all three. :func:`check_nesting` is a rule of
:data:`dpgate.sql.rules.RULES` (a check: it returns nothing and refuses).
"""

from __future__ import annotations

from sqlglot import exp

from dpgate.errors import UnsupportedQuery
from dpgate.sql.rules.base import MAX_DEPTH

#: Deepest nesting of expressions the planner accepts (:func:`expression_depth`). Measured
#: (tests/test_plan_clauses.py): sqlglot's recursive-descent parser spends ~25 Python frames per
#: level of nesting, and the planner parses its own canonical SQL again, where every arithmetic
#: operator and ABS is wrapped in ``TRY(…)`` (two levels per level): from a shallow caller the
#: first failure is at 20 nested ``ABS(…)`` in a WHERE (the costliest construct; 42 parentheses,
#: 39 chained ``+``). 12 leaves room for a caller 300 frames deep (an HTTP server's stack).
MAX_NESTING = 12


#: Longest path of the syntax tree (:func:`tree_depth`): a chain of n AND/OR conditions is n
#: levels, each cheap (~3 frames); the first failure from a caller 300 frames deep is at ~225.
MAX_TREE_DEPTH = 200


#: What to do about each kind of nesting (the end of :func:`nesting_refusal`'s message).
_NESTING_HINTS = {
    "expressions": ("each parenthesis, function call and operator around another is one level; "
                    "compute less in one expression"),
    "conditions": "a chain of n AND/OR conditions nests n levels: write a list of values as IN (…)",
    "subqueries": "write the filters of nested subqueries or CTEs as one WHERE",
}


def nesting_refusal(kind: str, limit: int, depth: int | None = None) -> UnsupportedQuery:
    """The one refusal for a query nested deeper than the planner accepts, wherever it is found
    (the parser's recursion, :func:`check_nesting`, :func:`merge_derived_tables`, the planner).

    Args:
        kind: ``"expressions"`` (:func:`expression_depth`: operators, function calls,
            parentheses), ``"conditions"`` (:func:`tree_depth`: chains of AND/OR) or
            ``"subqueries"``.
        limit: the limit that was exceeded (:data:`MAX_NESTING`, :data:`MAX_TREE_DEPTH` or
            :data:`MAX_DEPTH`).
        depth: the measured depth, or None where only "more than the limit" is known.

    Returns:
        An :class:`UnsupportedQuery` "the query nests <kind> <depth> levels deep; the planner
        accepts at most <limit> (<hint>)" with ``details = {"reason": "nesting", "kind",
        "depth", "max"}``.
    """
    levels = f"{depth} levels" if depth is not None else f"more than {limit} levels"
    return UnsupportedQuery(
        f"the query nests {kind} {levels} deep; the planner accepts at most {limit} "
        f"({_NESTING_HINTS[kind]})",
        {"reason": "nesting", "kind": kind, "depth": depth, "max": limit},
    )


#: Nodes of the query's structure (clauses, names, subqueries): they add no expression level
#: (nested subqueries have their own limit, :data:`MAX_DEPTH`).
_STRUCTURE = (exp.Query, exp.From, exp.Where, exp.Group, exp.Having, exp.Order, exp.Ordered,
              exp.Limit, exp.Offset, exp.Subquery, exp.Table, exp.TableAlias, exp.Identifier,
              exp.Alias, exp.Join, exp.With, exp.CTE, exp.Star, exp.Column, exp.Literal,
              exp.DataType, exp.Var, exp.Null, exp.Boolean, exp.Distinct, exp.Qualify)


def _depths(stmt: exp.Expression, weight) -> int:
    """Longest root-to-node path of ``stmt``, each node adding ``weight(node)`` (no recursion)."""
    depth_of = {id(stmt): weight(stmt)}
    deepest = 0
    for node in stmt.walk():
        d = depth_of.get(id(node), 0)
        deepest = max(deepest, d)
        for child in node.iter_expressions():
            depth_of[id(child)] = d + weight(child)
    return deepest


def expression_depth(stmt: exp.Expression, *, parentheses: bool = True) -> int:
    """The nesting of expressions: the most operators, function calls and parentheses on one
    path, the query's structure (:data:`_STRUCTURE`: clauses, names, literals, subqueries) not
    counted, and a chain of the same AND/OR counted once (``a AND b AND c`` is one level:
    sqlglot parses and renders such chains without recursing per link).

    ``((age > 1))`` is 3 (two parentheses and the comparison), ``ABS(ABS(age)) > 3`` is 3,
    ``a > 1 AND b > 1 AND c > 1`` is 2. Measured without recursion.

    Args:
        parentheses: count parentheses (the analyst's text: the parser recurses on each). False
            for a tree the rules built (:func:`merge_derived_tables` wraps what it substitutes
            in parentheses, which the canonical SQL drops: the parser never reads them).
    """
    def weight(node: exp.Expression) -> int:
        if isinstance(node, _STRUCTURE):
            return 0
        if not parentheses and isinstance(node, exp.Paren):
            return 0
        if isinstance(node, exp.Connector):
            parent = node.parent
            while not parentheses and isinstance(parent, exp.Paren):
                parent = parent.parent
            if type(parent) is type(node):
                return 0
        return 1

    return _depths(stmt, weight)


def tree_depth(stmt: exp.Expression) -> int:
    """The longest path of the syntax tree, every node counted (a chain of n ANDs is n levels)."""
    return _depths(stmt, lambda node: 1)


def parser_nesting_refusal(sql: str, dialect: str) -> UnsupportedQuery:
    """The refusal when sqlglot's parser itself ran out of recursion (before any tree exists).

    The SQL's tokens (read without recursion) tell which limit: more than :data:`MAX_DEPTH`
    nested ``(SELECT …)`` is the subquery limit, with its depth; anything else is more than
    :data:`MAX_NESTING` levels of expressions (every query within the limits parses).
    """
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType

    try:
        tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    except Exception:  # noqa: BLE001 - the tokens only choose the message
        tokens = []
    stack: list[bool] = []  # one entry per open parenthesis: does it open a subquery?
    deepest = 0
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.L_PAREN:
            nxt = tokens[i + 1].token_type if i + 1 < len(tokens) else None
            stack.append(nxt in (TokenType.SELECT, TokenType.WITH))
            deepest = max(deepest, sum(stack))
        elif tok.token_type == TokenType.R_PAREN and stack:
            stack.pop()
    if deepest > MAX_DEPTH:
        return nesting_refusal("subqueries", MAX_DEPTH, deepest)
    return nesting_refusal("expressions", MAX_NESTING)


def check_nesting(stmt: exp.Expression, *, parentheses: bool = True) -> None:
    """Refuse a tree nested deeper than the planner can process, with a clear message: more
    than :data:`MAX_NESTING` levels of expressions (:func:`expression_depth`) or a syntax tree
    deeper than :data:`MAX_TREE_DEPTH` (:func:`tree_depth`: long AND/OR chains).

    Every query within both limits is planned (measured in tests/test_plan_clauses.py, from a
    caller 300 frames deep). Measured without recursion.

    Args:
        parentheses: as for :func:`expression_depth` (False after the rules rewrote the tree).

    Raises:
        UnsupportedQuery: naming the depth and the limit.
    """
    depth = expression_depth(stmt, parentheses=parentheses)
    if depth > MAX_NESTING:
        raise nesting_refusal("expressions", MAX_NESTING, depth)
    if parentheses:  # merging adds AND links and parentheses the parser never reads
        depth = tree_depth(stmt)
        if depth > MAX_TREE_DEPTH:
            raise nesting_refusal("conditions", MAX_TREE_DEPTH, depth)

