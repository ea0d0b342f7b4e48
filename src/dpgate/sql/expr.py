"""Typed row-expression IR: every row expression's type, nullability and value range.

The binder (:mod:`dpgate.sql.bind`) turns a sqlglot expression into an :class:`Expr`
tree after resolving its names against the table policy. Each node carries, computed in
one place (:func:`dpgate.sql.bind.Binder.bind`) and **only from the policy's declared
bounds, never from data**:

* ``type`` — ``int``, ``float``, ``text``, ``bool``, ``date``, ``timestamp`` or ``null``
  (DuckDB semantics: ``/`` is a double division, ``+ - *`` of two ints is an int);
  a date's range is in days since 1970-01-01, a timestamp's in microseconds since then
  (:func:`dpgate.sql.temporal.temporal_ordinal`); a date part (``EXTRACT(year FROM d)``) is an
  int whose range follows from the column's declared ISO bounds (year) or the calendar;
* ``range`` — an :class:`Interval` of exact rationals that contains every non-NULL value
  the expression can take when each numeric column is first clamped to its declared
  ``[lower, upper]`` (NaN/±inf become NULL), or None when no finite range follows from
  the policy (a column with fewer than two bounds, a text value, …); booleans have the
  range [0, 1];
* ``nullable`` — whether the value can be NULL;
* ``node`` — the canonical sqlglot expression (declared column names, double-quoted).

API for other planner modules (the keys helper uses it for computed group keys)::

    from dpgate.sql.bind import bind_row_expression
    e = bind_row_expression(node, scope)      # node: sqlglot AST over one table's columns
    e.type, e.range, e.nullable               # as above; e.range.lo / e.range.hi are Fractions
    e.sql()                                    # a fresh sqlglot expression (canonical)
    e.text()                                   # its DuckDB SQL text
    e.unbounded()                              # the first sub-expression whose range is unknown
    value_sql(e, ref)                          # the executable per-row value: numeric columns
                                               # clamped to their bounds, NaN/±inf → NULL

``scope`` is any object with ``resolve(column_node) -> declared name``,
``column_policy(name) -> ColumnPolicy`` and ``is_unit(name) -> bool`` (the planner's
``_Scope`` is one).

Interval rules (``[a, b] ∘ [c, d]``; Moore, *Interval Analysis*, 1966, ch. 2; every rule
below is the image of a function monotone in each argument on the box, so the result is
the hull of the corner values): ``+``: [a+c, b+d]; ``-``: [a−d, b−c]; ``*``: hull of the
four products; ``/``: only when 0 ∉ [c, d], hull of the four quotients; unary minus,
ABS, FLOOR, CEIL, ROUND, CAST: monotone (ABS: folded at 0); LEAST/GREATEST: per-argument
monotone, but DuckDB skips NULL arguments, so a nullable argument widens the far side;
CASE/IF/COALESCE: the hull of the branches that can be taken; a boolean used as a number:
[0, 1]. Soundness is checked by a property test (``tests/test_expr_properties.py``)
that evaluates random trees in DuckDB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Callable, Iterator

from sqlglot import exp

from dpgate import limits
from dpgate.rendered import same_type, set_type
from dpgate.sql.temporal import date_part_of, temporal_sql

DIALECT = "duckdb"
#: Largest |value| of an integer-typed expression (a BIGINT never overflows inside it).
MAX_INT = 2**63 - 1
#: Largest |value| of a float-typed expression's range (:data:`dpgate.limits.MAX_ABS_BOUND`).
MAX_FLOAT = Fraction(int(limits.MAX_ABS_BOUND))


@dataclass(frozen=True)
class Interval:
    """A closed interval ``[lo, hi]`` of exact rationals (lo ≤ hi)."""

    lo: Fraction
    hi: Fraction

    def __post_init__(self) -> None:
        if self.lo > self.hi:  # pragma: no cover - construction bug
            raise ValueError(f"empty interval [{self.lo}, {self.hi}]")

    @classmethod
    def of(cls, lo: int | float | Fraction, hi: int | float | Fraction) -> "Interval":
        """``[lo, hi]`` from numbers (floats as their shortest decimal, as written in a policy)."""
        return cls(_frac(lo), _frac(hi))

    @classmethod
    def point(cls, v: int | float | Fraction) -> "Interval":
        """The one-point interval ``[v, v]``."""
        f = _frac(v)
        return cls(f, f)

    @classmethod
    def hull_of(cls, values: list[Fraction]) -> "Interval":
        """Smallest interval holding every value of ``values`` (non-empty)."""
        return cls(min(values), max(values))

    def hull(self, other: "Interval") -> "Interval":
        """Smallest interval holding both."""
        return Interval(min(self.lo, other.lo), max(self.hi, other.hi))

    def contains(self, v: int | float | Fraction) -> bool:
        """True when ``v`` lies in the interval (exact comparison)."""
        return self.lo <= _frac(v) <= self.hi

    def contains_zero(self) -> bool:
        """True when 0 lies in the interval."""
        return self.lo <= 0 <= self.hi

    @property
    def magnitude(self) -> Fraction:
        """max(|lo|, |hi|)."""
        return max(abs(self.lo), abs(self.hi))

    def __add__(self, o: "Interval") -> "Interval":
        return Interval(self.lo + o.lo, self.hi + o.hi)

    def __sub__(self, o: "Interval") -> "Interval":
        return Interval(self.lo - o.hi, self.hi - o.lo)

    def __mul__(self, o: "Interval") -> "Interval":
        return Interval.hull_of([a * b for a in (self.lo, self.hi) for b in (o.lo, o.hi)])

    def __truediv__(self, o: "Interval") -> "Interval":
        if o.contains_zero():
            raise ZeroDivisionError("the divisor's range contains 0")
        return Interval.hull_of([a / b for a in (self.lo, self.hi) for b in (o.lo, o.hi)])

    def __neg__(self) -> "Interval":
        return Interval(-self.hi, -self.lo)

    def abs(self) -> "Interval":
        """Range of ``|x|``."""
        if self.lo >= 0:
            return self
        if self.hi <= 0:
            return -self
        return Interval(Fraction(0), self.magnitude)

    def map_monotone(self, f: Callable[[Fraction], Fraction]) -> "Interval":
        """Image under a non-decreasing function ``f``."""
        return Interval(f(self.lo), f(self.hi))

    def to_floats(self) -> tuple[float, float]:
        """(lo, hi) as doubles rounded outward."""
        return _float_down(self.lo), _float_up(self.hi)

    def __str__(self) -> str:
        return f"[{_show(self.lo)}, {_show(self.hi)}]"


def _frac(v: int | float | Fraction | Decimal) -> Fraction:
    if isinstance(v, Fraction):
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("not a finite number")
        return Fraction(repr(v))
    return Fraction(v)


def _float_down(v: Fraction) -> float:
    f = float(v)
    return math.nextafter(f, -math.inf) if Fraction(f) > v else f


def _float_up(v: Fraction) -> float:
    f = float(v)
    return math.nextafter(f, math.inf) if Fraction(f) < v else f


def _show(v: Fraction) -> str:
    if v.denominator == 1:
        return str(v.numerator)
    return f"{float(v):.6g}"


def round_half_away(v: Fraction) -> Fraction:
    """DuckDB's ROUND(x) of a number: to the nearest integer, halves away from zero."""
    n = math.floor(abs(v) + Fraction(1, 2))
    return Fraction(n if v >= 0 else -n)


@dataclass(frozen=True, eq=False)
class Expr:
    """One bound row expression (see the module docstring).

    Attributes:
        kind: ``column``, ``literal``, ``null``, ``add``, ``sub``, ``mul``, ``div``,
            ``neg``, ``abs``, ``floor``, ``ceil``, ``round``, ``least``, ``greatest``,
            ``coalesce``, ``case``, ``cast``, ``extract`` (a date part, an int), ``predicate`` (any boolean condition, kept
            as its sqlglot node) or ``other`` (a text or other non-numeric value kept
            as its sqlglot node; not usable as a bounded value).
        type: ``int``, ``float``, ``text``, ``bool`` or ``null``.
        node: the canonical sqlglot expression of this node.
        args: operands (for ``case``: condition, result, condition, result, …, else).
        range: value range (:class:`Interval`) or None when unbounded / not numeric.
        nullable: True when the value can be NULL.
        column: the declared column name (``kind == "column"``).
        bounds: the column's declared clamp (``kind == "column"``), or None.
    """

    kind: str
    type: str
    node: exp.Expression
    args: tuple["Expr", ...] = ()
    range: Interval | None = None
    nullable: bool = True
    column: str | None = None
    bounds: Interval | None = None

    def sql(self) -> exp.Expression:
        """A fresh copy of the canonical sqlglot expression."""
        return self.node.copy()

    def text(self) -> str:
        """The canonical DuckDB SQL text."""
        return self.node.sql(dialect=DIALECT, comments=False)

    def walk(self) -> Iterator["Expr"]:
        """This node and all operands, depth first."""
        yield self
        for a in self.args:
            yield from a.walk()

    def columns(self) -> set[str]:
        """Declared column names referenced anywhere (conditions included)."""
        return {c.name for c in self.node.find_all(exp.Column)}

    def unbounded(self) -> "Expr | None":
        """The innermost numeric sub-expression without a range, or None when bounded."""
        if self.kind == "predicate":
            return None
        for a in (() if self.kind == "other" else self._value_args()):
            bad = a.unbounded()
            if bad is not None:
                return bad
        if self.range is None and self.type != "null":
            return self
        return None

    def _value_args(self) -> tuple["Expr", ...]:
        if self.kind == "case":
            conds = self.args[:-1][0::2]
            return tuple(a for a in self.args if not any(a is c for c in conds))
        return self.args


def value_sql(e: Expr, ref: Callable[[str], exp.Expression]) -> exp.Expression:
    """The executable per-row value of a bounded numeric expression (DuckDB), its root typed with
    ``e``'s type (:func:`dpgate.rendered.set_type`; a condition's 0/1 value is an int): engines read
    it where they spell a date part of the value.

    See :func:`_value_sql`.
    """
    return set_type(_value_sql(e, ref), "int" if e.type == "bool" else e.type)


def _value_sql(e: Expr, ref: Callable[[str], exp.Expression]) -> exp.Expression:
    """The executable per-row value of a bounded numeric expression (DuckDB).

    Every numeric column in a value position is replaced by its clamp
    ``CASE WHEN <finite> THEN LEAST(GREATEST(v, lower), upper) END`` (NaN/±inf and NULL
    give NULL), so the value lies in ``e.range``; conditions (CASE WHEN …, boolean
    operands) read the raw columns and are wrapped in ``TRY`` (an overflow in a
    condition makes it NULL, never an error). Division is done in doubles.

    Args:
        e: a bound expression whose ``range`` is not None.
        ref: declared column name → the sqlglot expression reading it (qualified).
    """
    k = e.kind
    if k == "column":
        v = ref(e.column)
        if e.bounds is None:
            return v
        lo, hi = e.bounds.lo, e.bounds.hi
        if e.type in ("date", "timestamp"):  # clamped to the declared [lower, upper]
            clamp = exp.Least(this=exp.Greatest(this=v.copy(), expressions=[temporal_sql(lo, e.type)],
                                                ignore_nulls=True),
                              expressions=[temporal_sql(hi, e.type)], ignore_nulls=True)
            return exp.Case(ifs=[exp.If(this=exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())),
                                        true=clamp)])
        guard = (exp.func("isfinite", v.copy()) if e.type == "float"
                 else exp.Not(this=exp.Is(this=v.copy(), expression=exp.Null())))
        clamp = exp.Least(this=exp.Greatest(this=v.copy(), expressions=[_num(lo, e.type)],
                                            ignore_nulls=True),
                          expressions=[_num(hi, e.type)], ignore_nulls=True)
        return exp.Case(ifs=[exp.If(this=guard, true=clamp)])
    if e.type == "bool":
        p = condition_sql(e, ref)
        return exp.Case(ifs=[exp.If(this=p, true=exp.Literal.number(1)),
                             exp.If(this=exp.Not(this=exp.Paren(this=p.copy())),
                                    true=exp.Literal.number(0))])
    if k == "literal" and e.type == "float":  # a DOUBLE, never a DECIMAL (no overflow error)
        return exp.Cast(this=exp.Literal.string(e.node.this), to=exp.DataType.build("double"))
    if k in ("literal", "null"):
        return e.sql()
    a = [value_sql(x, ref) for x in e.args]
    if k in ("add", "sub", "mul"):
        cls = {"add": exp.Add, "sub": exp.Sub, "mul": exp.Mul}[k]
        return exp.Paren(this=cls(this=a[0], expression=a[1]))
    if k == "div":
        dbl = exp.DataType.build("double")
        return exp.Paren(this=exp.Div(this=exp.Cast(this=a[0], to=dbl),
                                      expression=exp.Cast(this=a[1], to=dbl.copy())))
    if k == "neg":
        return exp.Neg(this=exp.Paren(this=a[0]))
    if k == "extract":  # a date part of the clamped date/timestamp
        return exp.Extract(this=exp.var(date_part_of(e.node).upper()), expression=a[0])
    if k in ("abs", "floor", "ceil"):
        return {"abs": exp.Abs, "floor": exp.Floor, "ceil": exp.Ceil}[k](this=a[0])
    if k == "round":
        return exp.Round(this=a[0])
    if k == "other" and e.node.key == "round":  # ROUND(x, d)
        return exp.Round(this=a[0], decimals=e.node.args["decimals"].copy())
    if k in ("least", "greatest"):
        cls = exp.Least if k == "least" else exp.Greatest
        return cls(this=a[0], expressions=a[1:], ignore_nulls=True)
    if k == "coalesce":
        return exp.Coalesce(this=a[0], expressions=a[1:])
    if k == "cast":
        # An integer cast runs as BIGINT: DuckDB's (and PostgreSQL's) INTEGER is 32 bits, so
        # arithmetic on CAST(x AS INTEGER) would overflow in INT32 (an error after the charge
        # that depends on the data) although the planner admits its 64-bit range. The binder
        # admits an INTEGER cast only when its input's range fits 32 bits, so the value is the same.
        to = e.node.args["to"].copy()
        if e.type == "int":
            to = exp.DataType.build("bigint")
        return exp.TryCast(this=a[0], to=to)
    if k == "case":
        ifs = []
        conds = e.args[:-1]
        for i in range(0, len(conds), 2):
            ifs.append(exp.If(this=condition_sql(conds[i], ref), true=a[i + 1]))
        return exp.Case(ifs=ifs, default=a[-1])
    raise ValueError(f"{e.text()} is not a bounded numeric expression")  # pragma: no cover


def total_sql(tree: exp.Expression, ref: Callable[[str], exp.Expression]) -> exp.Expression:
    """The **totality rule**: the executable form of a per-row expression over raw columns
    that can never raise, whatever the data.

    Every column node is replaced by ``ref(name)`` (on a copy), every non-constant
    ``+ - *``, unary minus and ABS is wrapped in ``TRY`` (:func:`guard_arithmetic`;
    idempotent, so an already canonical predicate is unchanged) and the whole expression in
    ``TRY(…)``: a row on which any part would raise (an overflow in ``ROUND(pages, -1)``, a
    failing cast) gets NULL — filtered out by a WHERE, the NULL group of a key — instead of
    failing the bounded query after the charge, an outcome that would depend on the data.
    Engines without ``TRY`` rewrite each ``TRY`` node into total operations
    (:class:`dpgate.engines.base.PredicateRewriter`) or refuse before the charge.

    Every place that renders a row predicate or a row expression over raw columns goes
    through this function: the outer WHERE (:mod:`dpgate.sql.bound`, shared by the quantile
    histogram, partition selection, top-k selection and the exact SQL of public tables), the
    inner WHERE of a per-unit subquery (:mod:`dpgate.sql.per_unit`), computed group keys and
    the conditions inside aggregated expressions (:func:`condition_sql`).

    Args:
        tree: a canonical sqlglot expression (declared column names); not modified.
        ref: declared column name → the sqlglot expression reading it.
    """
    def swap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column):
            return same_type(ref(node.name), node)  # the planner's type stays on the node
        return node

    inner = guard_arithmetic(tree.transform(swap))
    return same_type(exp.Try(this=inner), inner)

def row_sql(canonical: exp.Expression | str, qualifier: str | None = "__dpg_src") -> str:
    """A canonical row predicate or expression (its tree, ``plan.where_tree()`` /
    ``plan.key_tree(key)``, or DuckDB text over declared column names, parsed), rendered total by
    :func:`total_sql`: its columns read as ``"<qualifier>"."<column>"`` (unqualified when
    ``qualifier`` is None), the whole in ``TRY(…)``.
    (The bounded query's row source is named ``__dpg_src``: :mod:`dpgate.sql.bound`.)
    """
    import sqlglot

    tree = sqlglot.parse_one(canonical, read="duckdb") if isinstance(canonical, str) else canonical
    ref = lambda name: exp.column(name, table=qualifier, quoted=True)  # noqa: E731
    return total_sql(tree, ref).sql(dialect="duckdb")



def condition_sql(e: Expr, ref: Callable[[str], exp.Expression]) -> exp.Expression:
    """A boolean condition over raw columns, made total by :func:`total_sql`."""
    return total_sql(e.node, ref)


def _num(v: Fraction, type_: str) -> exp.Expression:
    if v.denominator == 1 and type_ == "int":
        return exp.Literal.number(str(v.numerator))
    return exp.Cast(this=exp.Literal.string(repr(float(v))), to=exp.DataType.build("double"))


# --- overflow guards ------------------------------------------------------------------------


_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Abs)


def guard_arithmetic(tree: exp.Expression) -> exp.Expression:
    """Wrap every non-constant ``+ - *``, unary minus and ABS in DuckDB's ``TRY(…)``.

    Integer and DECIMAL arithmetic raises on overflow (``abs(-2**63)``, ``age * 2``, a
    DECIMAL product beyond 38 digits); an error after the charge would be a failure the
    analyst paid for, and its occurrence would depend on the data. ``TRY`` turns it into
    NULL and leaves every other value (and its type) unchanged. Idempotent.
    """
    targets = [n for n in tree.walk() if isinstance(n, _ARITHMETIC) and n.find(exp.Column)
               and not isinstance(n.parent, exp.Try)]
    for node in targets:
        if node is tree:
            tree = same_type(exp.Try(this=node), node)
            continue
        wrapper = same_type(exp.Try(), node)
        node.replace(wrapper)
        wrapper.set("this", node)
    return tree

