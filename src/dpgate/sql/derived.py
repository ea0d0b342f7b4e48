"""A bounded aggregated value: the clamp and fixed-point resolution that the range of an
aggregate's argument (from the policy's bounds, by the binder's interval analysis) gives,
and the message that explains why a value has no bounds.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from sqlglot import exp

from dpgate import limits
from dpgate.sql.expr import Expr
from dpgate.sql.messages import snippet, unsupported

NUMERIC = ("int", "float")


@dataclass(frozen=True)
class Derived:
    """The clamp and fixed-point resolution of an aggregated expression."""

    type: str
    lower: float
    upper: float
    resolution: float


def derived_value(e: Expr, node: exp.Expression) -> Derived:
    """The published clamp ``[lower, upper]`` and resolution of a bounded expression.

    Integer-valued expressions (int or bool type): ``[lo, hi]`` itself, resolution 1.
    Float expressions: the range (rounded outward to doubles at every node, so that the
    double rounding of each operation cannot leave it) rounded outward to a multiple of
    ``resolution`` = the power of ten 10^(⌊log10 max|bound|⌋ − 6) (about 7 significant
    digits, as the policy's float default; at least 1e-100), so that the bounds are exact
    multiples of the resolution (:attr:`dpgate.policy.ColumnPolicy.fixed_point_bounds`).

    Raises:
        UnsupportedQuery: the range is unknown or too wide to represent (naming ``node``).
    """
    r = e.range
    if r is None:  # pragma: no cover - callers check unbounded() first
        raise unsupported(f"{snippet(node)} has no bounds", node)
    if e.type in ("int", "bool"):
        lo, hi = math.floor(r.lo), math.ceil(r.hi)
        if max(abs(lo), abs(hi)) > limits.MAX_STEPS:
            raise unsupported(f"the range {r} of {snippet(node)} is wider than 2**62", node)
        return Derived("int", int(lo), int(hi), 1.0)  # ints: exact beyond 2**53
    big = r.magnitude
    if big == 0:
        return Derived("float", 0.0, 0.0, 1.0)
    lo, hi = r.lo, r.hi  # already outward-rounded to doubles at every node (_fit)
    e10 = max(Decimal(float(big)).adjusted() - 6, -100)
    res = Fraction(10) ** e10
    slo, shi = math.floor(lo / res), math.ceil(hi / res)
    dec = lambda s: float(Decimal(s).scaleb(e10))  # noqa: E731
    return Derived("float", dec(slo), dec(shi), float(Decimal(1).scaleb(e10)))


def unquoted(node: exp.Expression) -> exp.Expression:
    """A copy with plain identifiers (messages quote the analyst's spelling, not ours)."""
    def fix(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Identifier) and n.quoted and re.fullmatch(r"[A-Za-z_]\w*", n.name):
            return exp.to_identifier(n.name, quoted=False)
        return n
    return node.transform(fix, copy=True)


def unbounded_message(e: Expr, node: exp.Expression) -> str:
    """Why the value of an aggregate argument has no derived bounds (naming the sub-expression)."""
    bad = e.unbounded() or e
    what = snippet(unquoted(bad.node))
    if bad.kind == "column":
        why = (f"column {bad.column!r} has no bounds in the policy (declare lower and upper)"
               if bad.type in NUMERIC else f"column {bad.column!r} is {bad.type}, not numeric")
    elif bad.kind == "literal":
        why = f"a literal beyond ±{limits.MAX_ABS_BOUND:g}, the largest magnitude a bound may have"
    elif bad.type == "int" and bad.args and all(a.range is not None for a in bad.args):
        why = "it can overflow 64-bit integers for values inside the policy's bounds"
    elif bad.type == "float" and bad.args and all(a.range is not None for a in bad.args):
        why = f"its range exceeds ±{limits.MAX_ABS_BOUND:g} for values inside the policy's bounds"
    elif bad.type not in NUMERIC + ("bool",):
        why = f"it is a value of type {bad.type}, not a number"
    else:
        why = "no bounds follow from the policy"
    return (f"{snippet(node)}: the sub-expression {what} is unbounded ({why}); every value "
            "inside an aggregate needs bounds derived from the policy")

