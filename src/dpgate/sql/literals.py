"""Numeric literals and IN lists in canonical form: the exact value as written, one spelling.

:func:`number` reads a literal (refusing non-finite and out-of-range ones), :func:`exact_number`
its exact decimal value, :func:`canonical_number_text` its one canonical text (``1.0`` → ``1``,
``1e2`` → ``100``) and :func:`canonicalize_literals` applies that to a tree, sorting and
deduplicating IN lists. Plan hashes are computed over this form.
"""

from __future__ import annotations

import math
import re
from decimal import MAX_EMAX, MIN_EMIN, Decimal, InvalidOperation, localcontext
from fractions import Fraction

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.sql.messages import DIALECT, real_args, unsupported

_INT_RE = re.compile(r"^\d+$")


def number(lit: exp.Literal) -> int | float:
    """The value of a numeric literal (int when written as digits), refusing non-finite ones."""
    text = str(lit.this)
    try:
        value: int | float = int(text) if _INT_RE.match(text) else float(text)
    except ValueError:
        raise unsupported(f"numeric literal {text} is not a number", lit) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise unsupported(f"numeric literal {text} is not a finite number", lit)
    if isinstance(value, int) and value >= 2**63:
        raise unsupported(f"integer literal {text} is outside the 64-bit range", lit)
    return value


def exact_number(lit: exp.Literal) -> Fraction:
    """The exact value of a numeric literal as written (a decimal text, never a double)."""
    number(lit)  # the same refusals
    try:
        return Fraction(Decimal(str(lit.this)))
    except (InvalidOperation, ValueError):  # pragma: no cover - number() refused it
        raise unsupported(f"numeric literal {lit.this} is not a number", lit) from None


def canonical_number_text(text: str) -> str:
    """The canonical text of a numeric literal with exactly the same value.

    Integers stay integers of any size (``9007199254740993``); a decimal keeps its digits
    (trailing zeros dropped, exponent spelled out: ``1.50`` → ``1.5``, ``1e2`` → ``100``,
    ``0.1000000000000000000001`` unchanged); a decimal with an integer value becomes the
    integer (``2.0`` → ``2``).
    """
    with localcontext() as ctx:  # exact: enough digits for every digit of the text
        ctx.prec = max(28, 2 * len(text) + 10)
        ctx.Emax, ctx.Emin = MAX_EMAX, MIN_EMIN
        return _canonical_number_text(text)


def _canonical_number_text(text: str) -> str:
    d = Decimal(text)
    if d == d.to_integral_value() and abs(d) < 2**63:
        return str(int(d))
    sign, digits, exponent = d.normalize().as_tuple()
    s = "".join(map(str, digits))
    if "e" in text.lower() or d == d.to_integral_value():
        adjusted = exponent + len(s) - 1
        mantissa = s[0] + ("." + s[1:] if len(s) > 1 else "")
        return ("-" if sign else "") + f"{mantissa}e{adjusted}"
    if -exponent >= len(s):
        s = "0." + "0" * (-exponent - len(s)) + s
    else:
        s = s[:exponent] + "." + s[exponent:]
    return ("-" if sign else "") + s


def canonicalize_literals(tree: exp.Expression) -> exp.Expression:
    """Normalise numeric literals (``1.0`` → ``1``; the value never changes), sort and
    deduplicate IN lists and turn a one-element IN into ``=``, in place."""

    def canonical(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Literal) and not node.is_string:
            number(node)
            text = canonical_number_text(str(node.this))
            return node if text == node.this else exp.Literal.number(text)
        return node

    def fix(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.In) and node.expressions:
            items = {}
            for e in node.expressions:
                e = canonical(e)
                key = (f"{'s' if e.is_string else 'n'}:{e.this}" if isinstance(e, exp.Literal)
                       else e.sql(dialect=DIALECT))
                items.setdefault(key, e)
            if len(items) == 1:  # x IN (v) is x = v, NULLs included
                return exp.EQ(this=node.this, expression=next(iter(items.values())))
            node.set("expressions", [items[k] for k in sorted(items)])  # one set: linear
            return node
        return canonical(node)

    return tree.transform(fix, copy=False)



# --- quoted numbers compared with numeric values (issue 21 item 7) ---------------------------

_QUOTED_INT_RE = re.compile(r"^\s*[+-]?\d+\s*$")
_QUOTED_FLOAT_RE = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between)


def _number_literal(lit: exp.Literal, type_: str, node: exp.Expression) -> exp.Expression:
    """The number a quoted literal compared with an int/float value means (DuckDB casts the
    string to the value's type); refused unless the text is a number of that type."""
    text = str(lit.this)
    pattern = _QUOTED_INT_RE if type_ == "int" else _QUOTED_FLOAT_RE
    if not pattern.match(text):
        article = "an" if type_ == "int" else "a"
        raise unsupported(f"the string {lit.sql(dialect=DIALECT)} compared with {article} {type_} value "
                          f"is not {article} {type_} literal: write the number without quotes", node)
    text = text.strip()
    negative = text.startswith("-")
    digits = text.lstrip("+-")
    out = exp.Literal.number(digits)
    number(out)  # the refusals of a number written without quotes (range, finiteness)
    return exp.Neg(this=out) if negative else out


def quoted_numbers(tree: exp.Expression, type_of) -> exp.Expression:
    """``int_col = '8'`` → ``int_col = 8``: string literals compared (=, <>, <, <=, >, >=, IN,
    BETWEEN) with an int or float value read as numbers, as DuckDB reads them (it casts the
    string to the other operand's type), so that the comparison means one thing on every
    engine and plans exactly as the unquoted query (same plan hash).

    Args:
        tree: a row expression (not modified; a copy is returned when something changes).
        type_of: the static type of a subtree (``Binder.type``), raising
            :class:`~dpgate.errors.UnsupportedQuery` for what it cannot type.

    Raises:
        UnsupportedQuery: a quoted text that is not a number of the compared type
            (``int_col = '8.5'``, ``int_col = '8a'``): DuckDB would compare differently or
            fail at run time, after the charge.
    """
    def quoted(n: exp.Expression) -> bool:
        return isinstance(n, exp.Literal) and n.is_string

    if not any(isinstance(n, _COMPARED) and any(quoted(c) for c in n.iter_expressions())
               for n in tree.walk()):
        return tree
    tree = tree.copy()
    for node in reversed(list(tree.walk())):  # children before parents
        if not isinstance(node, _COMPARED):
            continue
        operands = list(node.iter_expressions())
        strings = [o for o in operands if quoted(o)]
        others = [o for o in operands if not quoted(o)]
        if not strings or not others:
            continue
        try:
            types = {type_of(o) for o in others}
        except (UnsupportedQuery, UnknownColumn):
            continue  # the binder refuses it with its own message
        numeric = types & {"int", "float"}
        if not numeric or types - {"int", "float", "null"}:
            continue
        target = "float" if "float" in numeric else "int"
        for s in strings:
            s.replace(_number_literal(s, target, node))
    return tree


def text_slice_problem(node: exp.Expression) -> str | None:
    """Why ``SUBSTRING(s, start[, length])`` or ``LEFT(s, n)`` is refused, or None.

    Its position arguments must be integer literals, ``start ≥ 1`` and ``length, n ≥ 0``: then
    DuckDB, PostgreSQL and Spark give the same text for every string and none fails (PostgreSQL
    raises on a negative length; the engines read ``start ≤ 0`` and negative ``n`` differently;
    the engines' checks: :mod:`dpgate.engines.predicates`).
    """
    names = ("start", "length") if isinstance(node, exp.Substring) else ("expression",)
    extra = real_args(node) - {"this", *names}
    if extra:
        return "only SUBSTRING(text, start, length) and LEFT(text, n) are supported"
    for name in names:
        arg = node.args.get(name)
        if arg is None and name == "length":
            continue
        value = number(arg) if isinstance(arg, exp.Literal) and not arg.is_string else None
        low = 1 if name == "start" else 0
        if not isinstance(value, int) or isinstance(value, bool) or value < low or value > 2**31 - 1:
            what = "start" if name == "start" else "length"
            return (f"the {what} must be an integer literal in [{low}, 2147483647] (the engines agree and cannot "
                    "fail on any text only then)")
    return None
