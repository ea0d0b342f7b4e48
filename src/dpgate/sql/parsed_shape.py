"""The shape DuckDB's parser gives a canonical text, built from the compiler's own tree (no parse).

A plan's canonical texts (WHERE, HAVING, computed keys, derived outputs, aggregated expressions)
are generated from the compiler's trees (``tree.sql(dialect="duckdb")``); downstream code used
to parse those texts back. :class:`~dpgate.sql.plan.PlanTrees` hands it trees instead, and
:func:`parsed_shape` makes each tree the one ``sqlglot.parse_one(tree.sql("duckdb"),
read="duckdb")`` would give, so that what runs is exactly what ran when the text was parsed
(same engine renderings, same post-processing semantics):

* ``AND`` / ``OR`` / ``NOT`` regions are rebuilt with the parser's precedence and left-deep
  association from the text they generate. The generator adds no parentheses: a tree
  ``And(Or(a, b), c)`` (a simplifier's output) is written ``a OR b AND c``, which reads back as
  ``a OR (b AND c)`` — the text (what the plan hash covers) is what holds;
* an ``IF`` is the ``CASE`` it is written as; a typed division (read from an integer-division
  dialect) is DuckDB's ``/``; ``VARCHAR`` is ``TEXT``; ``TRY_CAST`` and ``||`` carry ``safe``; an
  ``EXTRACT`` part is the name the generator writes (``DOW`` → ``DAYOFWEEK``).

Any other operator the generator would write without the parentheses its tree needs (``Mul(Add(a,
b), c)`` is written ``a + b * c``; ``Sub(a, Sub(b, c))`` ``a - b - c``) is :func:`ambiguous`: the
compiler then parses the canonical text instead (none of the 400 corpus queries does).

tests/test_plan_trees.py checks ``parsed_shape(t) == parse_one(t.sql("duckdb"))`` over the
golden, corpus-like and random trees that are not :func:`ambiguous`.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import map_date_part

__all__ = ["ambiguous", "parsed_shape", "shaped"]

_CONNECTIVES = (exp.And, exp.Or, exp.Not)


def parsed_shape(tree: exp.Expression) -> exp.Expression:
    """A copy of ``tree`` in the shape DuckDB's parser gives its DuckDB text (module docstring)."""
    return _shape(tree.copy())


#: sqlglot's parser levels (parser.py: disjunction … unary); higher binds tighter.
_LEVELS: dict[type, int] = {
    exp.Or: 1, exp.And: 2, exp.Not: 3,
    exp.EQ: 4, exp.NEQ: 4, exp.NullSafeEQ: 4,
    exp.GT: 5, exp.GTE: 5, exp.LT: 5, exp.LTE: 5,
    exp.Is: 6, exp.In: 6, exp.Between: 6, exp.Like: 6, exp.ILike: 6,
    exp.DPipe: 7, exp.BitwiseAnd: 7, exp.BitwiseOr: 7, exp.BitwiseXor: 7,
    exp.Add: 8, exp.Sub: 8,
    exp.Mul: 9, exp.Div: 9, exp.IntDiv: 9, exp.Mod: 9,
    exp.Neg: 10,
}
_ATOM = 99


def _level(node: exp.Expression | None) -> int:
    return _ATOM if node is None else _LEVELS.get(type(node), _ATOM)


def ambiguous(tree: exp.Expression) -> bool:
    """True when the DuckDB text of ``tree`` reads back with another operator structure than the
    tree's outside AND/OR/NOT regions (which :func:`parsed_shape` rebuilds exactly): an operand
    of an infix operator that binds less tightly than it (or, on the right, as tightly), with no
    parentheses; an operand of a unary minus that is an infix operator."""
    for node in tree.walk():
        level = _level(node)
        if level == _ATOM:
            continue
        if isinstance(node, exp.Neg):
            if _level(node.this) < _ATOM:
                return True
            continue
        if isinstance(node, _CONNECTIVES):
            children = [node.this] if isinstance(node, exp.Not) else [node.this, node.expression]
            if any(not isinstance(c, _CONNECTIVES) and _level(c) <= 3 for c in children):
                return True  # not a connective yet as loose (none today)
            continue
        left, right = node.this, node.args.get("expression")
        if isinstance(node, (exp.In, exp.Between, exp.Is, exp.Like, exp.ILike)):
            right = None  # their other operands are delimited (lists, AND-bounds, keywords)
        if _level(left) < level or (right is not None and _level(right) <= level):
            return True
    return False


def _shape(node: exp.Expression) -> exp.Expression:
    if isinstance(node, _CONNECTIVES):
        tokens: list[exp.Expression | str] = []
        _tokens(node, tokens)
        out, i = _disjunction(tokens, 0)
        assert i == len(tokens)
        return out
    for key, value in list(node.args.items()):
        if isinstance(value, exp.Expression):
            node.set(key, _shape(value))
        elif isinstance(value, list):
            node.set(key, [_shape(v) if isinstance(v, exp.Expression) else v for v in value])
    return _node(node)


def _node(node: exp.Expression) -> exp.Expression:
    """One node's own differences from the parsed shape (its children are done)."""
    if isinstance(node, exp.If) and not isinstance(node.parent, exp.Case):
        case = exp.Case(ifs=[exp.If(this=node.this, true=node.args.get("true"))])
        if node.args.get("false") is not None:
            case.set("default", node.args["false"])
        return case
    if isinstance(node, exp.Div) and node.args.get("typed"):
        node.set("typed", False)
    elif isinstance(node, (exp.TryCast, exp.DPipe)):
        node.set("safe", True)
    elif isinstance(node, exp.DataType) and node.this == exp.DataType.Type.VARCHAR and not node.expressions:
        node.set("this", exp.DataType.Type.TEXT)
    elif isinstance(node, exp.Extract) and isinstance(node.this, exp.Var):
        node.set("this", map_date_part(node.this, "duckdb"))
    return node


def _tokens(node: exp.Expression, out: list[exp.Expression | str]) -> None:
    """The infix sequence the generator writes for a connective region (atoms shaped)."""
    if isinstance(node, exp.Not):
        out.append("NOT")
        _tokens(node.this, out)
    elif isinstance(node, (exp.And, exp.Or)):
        _tokens(node.this, out)
        out.append("AND" if isinstance(node, exp.And) else "OR")
        _tokens(node.expression, out)
    else:
        out.append(_shape(node))


def _disjunction(tokens: list, i: int) -> tuple[exp.Expression, int]:
    left, i = _conjunction(tokens, i)
    while i < len(tokens) and _is(tokens[i], "OR"):
        right, i = _conjunction(tokens, i + 1)
        left = exp.Or(this=left, expression=right)
    return left, i


def _conjunction(tokens: list, i: int) -> tuple[exp.Expression, int]:
    left, i = _negation(tokens, i)
    while i < len(tokens) and _is(tokens[i], "AND"):
        right, i = _negation(tokens, i + 1)
        left = exp.And(this=left, expression=right)
    return left, i


def _negation(tokens: list, i: int) -> tuple[exp.Expression, int]:
    token = tokens[i]
    if isinstance(token, str):
        assert token == "NOT", token
        inner, i = _negation(tokens, i + 1)
        return exp.Not(this=inner), i
    return token, i + 1


def _is(token: exp.Expression | str, word: str) -> bool:
    return isinstance(token, str) and token == word


def shaped(tree: exp.Expression) -> exp.Expression:
    """``tree`` in the shape DuckDB's parser gives its canonical text
    (:func:`parsed_shape`); an :func:`ambiguous`
    tree (its text reads back otherwise: none in the corpus) is its text parsed, since the text is
    what the plan hash covers and what ran before the plan carried trees."""
    if ambiguous(tree):
        return sqlglot.parse_one(tree.sql(dialect="duckdb", comments=False), read="duckdb")
    return parsed_shape(tree)
