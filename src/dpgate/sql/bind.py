"""The binder: sqlglot row expressions → the typed IR of :mod:`dpgate.sql.expr`.

Names resolve against the table policy (case-insensitively, through the planner's scope);
every node gets its type, nullability and value range in one place (:meth:`Binder.bind`).
The same binder checks WHERE predicates (executed by DuckDB), HAVING predicates (over
released outputs) and the arguments of aggregates; the clause decides what is allowed:

* ``WHERE``: the allow-list of :mod:`dpgate.sql.parse` (comparisons, IN, BETWEEN, LIKE,
  ``+ - *``, a fixed set of deterministic functions, TRY_CAST, and CAST of a column read as
  TRY_CAST by :func:`plan_where`); no division or CASE.
* ``aggregate`` (the argument of SUM/AVG/VAR/STDDEV/COUNT, or a computed key): the WHERE
  set plus CASE/IF, division (only when the divisor's range excludes 0), CAST to a numeric
  type, and boolean predicates used as 0/1. A value derived here must have a finite
  range; :func:`derived_value` turns that range into the clamp and the fixed-point
  resolution of the aggregated value.
* ``HAVING``: arithmetic, comparisons and CAST (TRY semantics) over outputs (post-processing).

The privacy unit column may not appear in any row expression: a predicate or a value
computed from it singles out units (``SUM(CASE WHEN pid = 42 THEN …)``).

Also here: the literal canonicalisation (numbers keep their exact value; ``IN`` lists
sorted and deduplicated). :func:`~dpgate.sql.expr.guard_arithmetic` (DuckDB ``TRY(…)`` around
every ``+ - *`` that reads a column) lives with the IR in :mod:`dpgate.sql.expr`, the message
helpers in :mod:`dpgate.sql.messages` and the date helpers in :mod:`dpgate.sql.temporal`
(re-exported here).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Decimal, InvalidOperation, localcontext
from fractions import Fraction
from typing import Any, Callable, Protocol

from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.simplify import simplify

from dpgate import limits
from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.policy import ColumnPolicy, TablePolicy
from dpgate.sql.expr import MAX_FLOAT, MAX_INT, Expr, Interval, guard_arithmetic, round_half_away
# the message helpers, date helpers and TRY guard moved out (sql.messages, sql.temporal, sql.expr:
# expr no longer imports this module); every name stays importable from here
from dpgate.sql.messages import SOURCE, as_written  # noqa: F401 - re-exported
from dpgate.sql.messages import DIALECT, only_args, real_args, snippet, unsupported
from dpgate.sql.temporal import TRUNC_UNITS, date_part_of, temporal_sql  # noqa: F401 - re-exported
from dpgate.sql.temporal import (
    NOW,
    NOW_NAMES,
    PART_FUNCS,
    PART_RANGES,
    check_interval,
    date_part,
    from_ordinal,
    temporal_ordinal,
    trunc_unit,
)

_PART_FUNCS = PART_FUNCS  # sql.keys reads it under this name

_NUMERIC = ("int", "float")
_TEMPORAL = ("date", "timestamp")
_INT_RE = re.compile(r"^\d+$")

#: The aggregate calls the planner knows (one list: sql.parse uses it too).
AGGREGATES = (
    exp.Count,
    exp.Sum,
    exp.Avg,
    exp.Variance,
    exp.VariancePop,
    exp.Stddev,
    exp.StddevPop,
    exp.StddevSamp,
    exp.ApproxDistinct,
)
_AGGREGATES = AGGREGATES
_ANON_AGGREGATES = {"mean": "avg", "var": "var_pop", "varp": "var_pop", "stdevp": "stddev_pop"}
_TRY_CAST_TYPES = {
    exp.DataType.Type.BIGINT: "int",
    exp.DataType.Type.INT: "int",
    exp.DataType.Type.DOUBLE: "float",
    exp.DataType.Type.VARCHAR: "text",
    exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.BOOLEAN: "bool",
}
#: CAST targets allowed inside aggregates (numeric only; the range decides overflow).
_CAST_TYPES = {
    exp.DataType.Type.BIGINT: "int",
    exp.DataType.Type.INT: "int",
    exp.DataType.Type.DOUBLE: "float",
    exp.DataType.Type.FLOAT: "float",
}
_COMPARISONS = (
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.NullSafeEQ,
    exp.NullSafeNEQ,
)
_HAVING_NODES = (
    exp.Paren, exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Neg, exp.Abs, exp.Add,
    exp.Sub, exp.Mul, exp.Div, exp.And, exp.Or, exp.Not, exp.Is, exp.In, exp.Between,
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Cast,
)
_BOOL = Interval.of(0, 1)


# --- messages ---------------------------------------------------------------------------------








def _check_typed_division(node: exp.Div, a: Expr, b: Expr) -> None:
    """Refuse ``a / b`` of two integers in a dialect where it is integer division.

    sqlglot marks ``/`` as ``typed`` when read from a dialect (PostgreSQL, T-SQL, Trino…)
    in which an integer divided by an integer is an integer truncated toward zero; dpgate
    runs DuckDB, where ``/`` is always a float division, so the query would answer another
    question (``age / 10`` as 3.7 instead of 3).

    Raises:
        UnsupportedQuery: both operands are integers and the dialect divides them as integers.
    """
    if node.args.get("typed") and a.type == "int" and b.type == "int":
        raise unsupported(
            f"{snippet(node)}: in this dialect an integer divided by an integer is an integer "
            "(truncated), which dpgate does not compute; write FLOOR(CAST(x AS DOUBLE) / 10) "
            "for integer bins, or CAST(x AS DOUBLE) / 10 for a fraction",
            node,
        )








def is_aggregate(node: exp.Expression) -> bool:
    """True for an aggregate call the planner knows (COUNT, SUM, AVG, MEAN, VAR…, STDDEV…)."""
    if isinstance(node, _AGGREGATES):
        return True
    if isinstance(node, exp.Filter):
        return is_aggregate(node.this)
    return isinstance(node, exp.Anonymous) and node.name.lower() in _ANON_AGGREGATES


# --- literals ---------------------------------------------------------------------------------


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


# --- the scope a binder resolves names in ------------------------------------------------------


class Scope(Protocol):
    """What the binder needs from the planner's scope."""

    def resolve(self, node: exp.Column) -> str:  # pragma: no cover - protocol
        """Declared column name (or the unit's name) of ``node``."""

    def is_unit(self, name: str) -> bool:  # pragma: no cover - protocol
        """True for the privacy unit column."""


@dataclass
class TableScope:
    """A scope over one table's declared columns (canonical names, no qualifiers)."""

    table: TablePolicy

    def resolve(self, node: exp.Column) -> str:
        """Declared column name of ``node`` (UnknownColumn otherwise)."""
        col = self.table.find_column(node.name)
        if col is not None:
            return col.name
        unit = self.table.privacy_unit
        if unit is not None and node.name.casefold() == unit.casefold():
            return unit
        raise UnknownColumn(f"table {self.table.name!r} declares no column {node.name!r}",
                            {"table": self.table.name, "column": node.name})

    def is_unit(self, name: str) -> bool:
        """True for the privacy unit column."""
        unit = self.table.privacy_unit
        return unit is not None and name.casefold() == unit.casefold()


@dataclass(frozen=True)
class ColumnInfo:
    """What a column reference means to the binder: its name, type and declared clamp."""

    name: str
    type: str
    bounds: Interval | None = None


def column_info(col: ColumnPolicy) -> ColumnInfo:
    """:class:`ColumnInfo` of a declared column (bounds only for bounded numeric columns)."""
    bounds = Interval.of(col.lower, col.upper) if col.bounded and col.type in _NUMERIC else None
    if col.type in _TEMPORAL and col.time_bounded:
        bounds = Interval(temporal_ordinal(col.time_lower), temporal_ordinal(col.time_upper))
    return ColumnInfo(col.name, col.type, bounds)


def row_column(scope: Any) -> Callable[[exp.Column], ColumnInfo]:
    """The column callback for row expressions of ``scope``'s table: the unit is refused."""
    table: TablePolicy = scope.table

    def info(node: exp.Column) -> ColumnInfo:
        name = scope.resolve(node)
        if scope.is_unit(name):
            raise UnsupportedQuery(
                f"the privacy unit column {name!r} may not appear in a row expression "
                f"({snippet(node.parent or node)}): it can only be counted, with "
                f"COUNT(DISTINCT {name}) or COUNT({name})",
                {"table": table.name, "column": name, "construct": snippet(node.parent or node)},
            )
        col = table.find_column(name)
        if col is None:  # pragma: no cover - resolve() raised already
            raise UnknownColumn(f"table {table.name!r} declares no column {name!r}",
                                {"table": table.name, "column": name})
        return column_info(col)

    return info


# --- the binder -------------------------------------------------------------------------------


def _common(types: list[str], node: exp.Expression) -> str:
    real = [t for t in types if t != "null"]
    if not real:
        return "null"
    if all(t in _NUMERIC for t in real):
        return "float" if "float" in real else "int"
    if all(t in _TEMPORAL for t in real):
        return "timestamp" if "timestamp" in real else "date"
    if all(t == real[0] for t in real):
        return real[0]
    raise unsupported(
        f"incompatible types ({', '.join(sorted(set(real)))}) in {snippet(node)}", node
    )


def _fit(r: Interval | None, type_: str) -> Interval | None:
    """``r`` if the engine can represent every value of it in ``type_``, else None."""
    if r is None:
        return None
    if type_ == "int":
        return r if r.magnitude <= MAX_INT else None
    if type_ == "float":
        # Outward to doubles: IEEE rounding is monotone, so an operation monotone in each
        # argument, applied to doubles inside double-bounded intervals, rounds into the
        # double-bounded interval of its exact image (induction over the tree).
        if r.magnitude > MAX_FLOAT:
            return None
        lo, hi = r.to_floats()
        return Interval(Fraction(lo), Fraction(hi))
    return r


class Binder:
    """Bind row expressions of one clause (``WHERE``, ``aggregate`` or ``HAVING``).

    Args:
        column: column node → :class:`ColumnInfo` (or a type string, for HAVING's outputs).
        clause: ``"WHERE"``, ``"aggregate"`` or ``"HAVING"``.
        is_aggregate: which calls are aggregates (HAVING refers to them as outputs); default
            :func:`is_aggregate`.
    """

    def __init__(self, column: Callable[[exp.Expression], Any], clause: str = "WHERE",
                 is_aggregate: Callable[[exp.Expression], bool] | None = None) -> None:
        self.column = column
        self.clause = clause
        self.is_aggregate = is_aggregate or globals()["is_aggregate"]

    # -- entry points

    def check_predicate(self, node: exp.Expression) -> Expr:
        """Bind ``node`` and require a boolean (UnsupportedQuery otherwise)."""
        e = self.bind(node)
        if e.type not in ("bool", "null"):
            what = "WHERE" if self.clause == "aggregate" else self.clause
            raise unsupported(
                f"{what} must be a condition, not a value of type {e.type}: {snippet(node)}", node
            )
        return e

    def type(self, node: exp.Expression) -> str:
        """Static type of ``node``: int, float, text, bool or null."""
        return self.bind(node).type

    def bind(self, node: exp.Expression) -> Expr:
        """The typed IR of ``node`` (UnsupportedQuery if refused)."""
        if self.clause == "HAVING":
            if self.is_aggregate(node):
                return Expr("other", self._info(node).type, node)
            if not isinstance(node, _HAVING_NODES):
                raise unsupported(f"{snippet(node)} is not supported in HAVING", node)
        return self._bind(node)

    # -- helpers

    def _info(self, node: exp.Expression) -> ColumnInfo:
        info = self.column(node)
        return info if isinstance(info, ColumnInfo) else ColumnInfo(node.name, info)

    def _expect(self, node: exp.Expression, allowed: tuple[str, ...], what: str) -> Expr:
        e = self.bind(node)
        if e.type != "null" and e.type not in allowed:
            raise unsupported(f"{what} needs a {' or '.join(allowed)} operand, got {e.type}: "
                              f"{snippet(node)}", node)
        return e

    def _pred(self, node: exp.Expression, args: list[Expr]) -> Expr:
        return Expr("predicate", "bool", node, tuple(args), _BOOL, True)

    @property
    def _values(self) -> bool:
        return self.clause == "aggregate"

    def _bind(self, node: exp.Expression) -> Expr:
        if isinstance(node, exp.Paren):
            return self.bind(node.this)
        if isinstance(node, exp.Column):
            info = self._info(node)
            bounds = info.bounds if info.type in _NUMERIC + _TEMPORAL else None
            return Expr("column", info.type, node, (), bounds, True, info.name, bounds)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return Expr("literal", "text", node, nullable=False)
            t = "int" if isinstance(number(node), int) else "float"
            # A float literal runs as the nearest double: its range holds that double.
            return Expr("literal", t, node, (), _fit(Interval.point(exact_number(node)), t), False)
        if isinstance(node, exp.Boolean):
            return Expr("predicate", "bool", node, (), Interval.point(1 if node.this else 0), False)
        if isinstance(node, exp.Null):
            return Expr("null", "null", node)
        if self.is_aggregate(node) or isinstance(node, exp.AggFunc):
            if self._values:
                raise unsupported(f"aggregates cannot be nested: {snippet(node)}", node)
            raise unsupported(
                f"aggregate {snippet(node)} is not allowed in WHERE (use HAVING)", node
            )
        if isinstance(node, exp.Div) and self.clause == "HAVING":
            a = self._expect(node.this, _NUMERIC, "division")
            b = self._expect(node.expression, _NUMERIC, "division")
            _check_typed_division(node, a, b)
            return Expr("div", "float", node, (a, b))
        if isinstance(node, exp.Div) and self._values:
            return self._divide(node)
        if isinstance(node, (exp.Div, exp.IntDiv, exp.Mod, exp.SafeDivide)):
            where = "inside aggregates" if self._values else "in WHERE"
            raise unsupported(
                f"division and modulo are not allowed {where} (they can fail on data): "
                f"{snippet(node)}" + (" (divide by a constant or an expression whose range "
                                      "excludes 0)" if self._values else ""),
                node,
            )
        if isinstance(node, NOW) or (isinstance(node, exp.Anonymous)
                                      and node.name.lower() in NOW_NAMES):
            raise unsupported(
                f"{snippet(node)} is not deterministic (its value depends on when the query "
                "runs, so a cached or repeated release would answer another question); write "
                "the date as a literal, e.g. DATE '2024-01-01'", node)
        temporal = _temporal_literal(node)
        if temporal is not None:
            return temporal
        if isinstance(node, exp.Cast) and self.clause == "HAVING":
            return self._released_cast(node)
        if isinstance(node, exp.Cast) and not isinstance(node, exp.TryCast):
            if self._values:
                return self._cast(node)
            raise unsupported(
                f"CAST can fail on data and is not allowed; use TRY_CAST: {snippet(node)}", node
            )
        if isinstance(node, exp.Try) and self.clause in ("WHERE", "aggregate"):
            only_args(node, {"this"})
            inner = self.bind(node.this)
            return Expr("predicate" if inner.type == "bool" else "other", inner.type, node,
                        (inner,), inner.range if inner.type == "bool" else None)
        if isinstance(node, exp.Neg):
            a = self._expect(node.this, _NUMERIC, "unary minus")
            return Expr("neg", a.type, node, (a,),
                        _fit(-a.range if a.range else None, a.type), a.nullable)
        if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.expression, exp.Interval):
            a = self._expect(node.this, _TEMPORAL, "INTERVAL arithmetic")
            check_interval(node.expression)
            # DuckDB: DATE ± INTERVAL is a TIMESTAMP; used in comparisons (no range needed).
            return Expr("other", "timestamp", node, (a,), None, a.nullable)
        if isinstance(node, exp.Interval):
            raise unsupported(f"an INTERVAL may only be added to or subtracted from a date or "
                              f"timestamp: {snippet(node)}", node)
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul)):
            a = self._expect(node.this, _NUMERIC, "arithmetic")
            b = self._expect(node.expression, _NUMERIC, "arithmetic")
            t = _common([a.type, b.type], node)
            r = None
            if a.range is not None and b.range is not None:
                r = (a.range + b.range if isinstance(node, exp.Add) else
                     a.range - b.range if isinstance(node, exp.Sub) else a.range * b.range)
            kind = {exp.Add: "add", exp.Sub: "sub", exp.Mul: "mul"}[type(node)]
            return Expr(kind, t, node, (a, b), _fit(r, t), a.nullable or b.nullable)
        if isinstance(node, exp.DPipe):
            only_args(node, {"this", "expression", "safe"})
            a = self._expect(node.this, ("text",), "||")
            b = self._expect(node.expression, ("text",), "||")
            return Expr("other", "text", node, (a, b))
        if isinstance(node, _COMPARISONS):
            a, b = self.bind(node.this), self.bind(node.expression)
            _common(_coerce_temporal([a, b], node), node)
            return self._pred(node, [a, b])
        if isinstance(node, exp.Is):
            a = self.bind(node.this)
            target = node.expression
            if isinstance(target, exp.Boolean):
                if a.type not in ("bool", "null"):
                    raise unsupported(f"IS TRUE/FALSE needs a boolean: {snippet(node)}", node)
            elif not isinstance(target, exp.Null):
                raise unsupported(f"{snippet(node)} is not supported", node)
            return Expr("predicate", "bool", node, (a,), _BOOL, False)
        if isinstance(node, exp.In):
            only_args(node, {"this", "expressions"})
            args = [self.bind(node.this)] + [self.bind(e) for e in node.expressions]
            _common(_coerce_temporal(args, node), node)
            return self._pred(node, args)
        if isinstance(node, exp.Between):
            only_args(node, {"this", "low", "high"})
            args = [self.bind(node.this), self.bind(node.args["low"]), self.bind(node.args["high"])]
            _common(_coerce_temporal(args, node), node)
            return self._pred(node, args)
        if isinstance(node, exp.Escape):
            raise unsupported(f"LIKE … ESCAPE is not supported: {snippet(node)}", node)
        if isinstance(node, (exp.Like, exp.ILike)):
            only_args(node, {"this", "expression", "negate"})
            a = self._expect(node.this, ("text",), "LIKE")
            b = self._expect(node.expression, ("text",), "LIKE")
            return self._pred(node, [a, b])
        if isinstance(node, (exp.And, exp.Or)):
            a = self._expect(node.this, ("bool",), node.key.upper())
            b = self._expect(node.expression, ("bool",), node.key.upper())
            return self._pred(node, [a, b])
        if isinstance(node, exp.Not):
            a = self._expect(node.this, ("bool",), "NOT")
            return self._pred(node, [a])
        if isinstance(node, exp.Case):
            if self._values:
                return self._case(node)
            raise unsupported(f"CASE expressions are not supported: {snippet(node)}", node)
        if isinstance(node, exp.If) and self._values:
            raise unsupported(f"{snippet(node)} is not supported (IF(c, a, b) is accepted as a "
                              "function call)", node)
        if isinstance(node, exp.Func):
            return self._function(node)
        raise unsupported(f"{snippet(node)} is not supported in a row predicate", node)

    def _divide(self, node: exp.Div) -> Expr:
        only_args(node, {"this", "expression", "typed", "safe"})
        a = self._expect(node.this, _NUMERIC, "division")
        b = self._expect(node.expression, _NUMERIC, "division")
        _check_typed_division(node, a, b)
        r = None
        if b.range is not None and b.range.contains_zero():
            raise unsupported(
                f"division by {snippet(_unquoted(node.expression))}, whose range {b.range} contains 0 "
                f"(from the policy's bounds): {snippet(node)} could divide by zero; divide by "
                "an expression whose range excludes 0 (e.g. x + 1 for x ≥ 0)",
                node,
            )
        if a.range is not None and b.range is not None:
            r = a.range / b.range
        return Expr("div", "float", node, (a, b), _fit(r, "float"), a.nullable or b.nullable)

    def _cast(self, node: exp.Cast) -> Expr:
        only_args(node, {"this", "to", "format", "safe", "action", "default"})
        to = node.args["to"]
        target = _CAST_TYPES.get(to.this) if isinstance(to, exp.DataType) else None
        if target is None or to.expressions or real_args(node) - {"this", "to"}:
            raise unsupported(f"CAST to {snippet(to)} is not supported inside aggregates "
                              "(BIGINT, INTEGER, DOUBLE)", node)
        a = self.bind(node.this)
        if a.type not in _NUMERIC + ("bool", "null"):
            raise unsupported(f"CAST of a {a.type} value is not supported inside aggregates: "
                              f"{snippet(node)}", node)
        return self._converted(node, a, target, to)

    def _released_cast(self, node: exp.Cast) -> Expr:
        """CAST/TRY_CAST/``::`` of a released value (HAVING, ORDER BY): post-processing on
        public keys and noisy values, evaluated with TRY semantics (a value that does not
        convert is NULL; :mod:`dpgate.postprocess.expressions`), so it cannot fail after
        the charge. Targets: those of TRY_CAST."""
        only_args(node, {"this", "to", "safe"})
        to = node.args["to"]
        target = _TRY_CAST_TYPES.get(to.this) if isinstance(to, exp.DataType) else None
        if target is None or to.expressions:
            raise unsupported(f"CAST to {snippet(to)} is not supported in {self.clause} (BIGINT, "
                              "INTEGER, DOUBLE, VARCHAR or BOOLEAN)", node)
        a = self.bind(node.this)
        if a.type in ("date", "timestamp"):
            raise unsupported(f"CAST of a {a.type} value is not supported in {self.clause}: "
                              f"{snippet(node)}", node)
        kind = "predicate" if target == "bool" else "cast"
        return Expr(kind, target, node, (a,), _BOOL if target == "bool" else None, True)

    def _converted(self, node: exp.Expression, a: Expr, target: str, to: exp.DataType) -> Expr:
        r = a.range
        if r is not None and target == "int":
            # DuckDB rounds to the nearest integer (ties to even for doubles, away from zero
            # for decimals): either way the result lies in [floor(lo), ceil(hi)].
            r = Interval(Fraction(math.floor(r.lo)), Fraction(math.ceil(r.hi)))
            if to.this == exp.DataType.Type.INT and r.magnitude >= 2**31:
                r = None
        return Expr("cast", target, node, (a,), _fit(r, target), a.nullable)

    def _case(self, node: exp.Case) -> Expr:
        only_args(node, {"ifs", "default"})
        args: list[Expr] = []
        branches: list[Expr] = []
        for branch in node.args["ifs"]:
            only_args(branch, {"this", "true"})
            cond = self._expect(branch.this, ("bool",), "CASE WHEN")
            value = self.bind(branch.args["true"])
            args += [cond, value]
            branches.append(value)
        default = node.args.get("default")
        dflt = self.bind(default) if default is not None else Expr("null", "null", exp.Null())
        args.append(dflt)
        branches.append(dflt)
        t = _common([b.type for b in branches], node)
        return Expr("case", t, node, tuple(args), _hull(branches, t),
                    any(b.nullable for b in branches))

    def _function(self, node: exp.Func) -> Expr:
        part = date_part(node)
        if part is not None:
            unit, arg = part
            a = self._expect(arg, _TEMPORAL, f"EXTRACT({unit.upper()} FROM …)")
            return Expr("extract", "int", node, (a,), _part_range(unit, a), a.nullable)
        if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
            unit = trunc_unit(node)
            a = self._expect(node.this, _TEMPORAL, "date_trunc")
            # DuckDB: date_trunc of a DATE is a TIMESTAMP (monotone; range in µs not needed).
            return Expr("other", "timestamp", node, (a,), None, a.nullable)
        if isinstance(node, (exp.Lower, exp.Upper)):
            only_args(node, {"this"})
            return Expr("other", "text", node, (self._expect(node.this, ("text",), node.key.upper()),))
        if isinstance(node, exp.Length):
            only_args(node, {"this"})
            return Expr("other", "int", node, (self._expect(node.this, ("text",), "LENGTH"),))
        if isinstance(node, exp.Trim):
            only_args(node, {"this", "expression", "position"})
            args = [self._expect(node.this, ("text",), "TRIM")]
            if node.args.get("expression") is not None:
                args.append(self._expect(node.args["expression"], ("text",), "TRIM"))
            return Expr("other", "text", node, tuple(args))
        if isinstance(node, exp.Concat):
            only_args(node, {"expressions", "safe", "coalesce"})
            return Expr("other", "text", node, tuple(self.bind(e) for e in node.expressions))
        if isinstance(node, (exp.StartsWith, exp.EndsWith, exp.Contains)):
            only_args(node, {"this", "expression"})
            a = self._expect(node.this, ("text",), node.key.upper())
            b = self._expect(node.expression, ("text",), node.key.upper())
            return self._pred(node, [a, b])
        if isinstance(node, (exp.Abs, exp.Sign, exp.Floor, exp.Ceil)):
            only_args(node, {"this"})
            a = self._expect(node.this, _NUMERIC, node.key.upper())
            r = a.range
            if isinstance(node, exp.Abs):
                return Expr("abs", a.type, node, (a,), _fit(r.abs() if r else None, a.type), a.nullable)
            if isinstance(node, exp.Sign):
                sign = lambda v: Fraction((v > 0) - (v < 0))  # noqa: E731
                return Expr("other", a.type, node, (a,), r.map_monotone(sign) if r else None,
                            a.nullable)
            f = math.floor if isinstance(node, exp.Floor) else math.ceil
            # DuckDB: FLOOR/CEIL return a DOUBLE for every numeric input.
            return Expr(node.key, "float", node, (a,),
                        _fit(r.map_monotone(lambda v: Fraction(f(v))) if r else None, "float"),
                        a.nullable)
        if isinstance(node, exp.Round):
            only_args(node, {"this", "decimals"})
            a = self._expect(node.this, _NUMERIC, "ROUND")
            digits = node.args.get("decimals")
            if digits is not None:
                lit = digits.this if isinstance(digits, exp.Neg) else digits
                if not (isinstance(lit, exp.Literal) and not lit.is_string
                        and isinstance(number(lit), int)):
                    raise unsupported("ROUND digits must be an integer constant", node)
            r = a.range
            if r is not None:
                if digits is None:
                    r = r.map_monotone(round_half_away)
                else:  # rounding to d digits moves a value by at most half a step
                    d = number(digits.this if isinstance(digits, exp.Neg) else digits)
                    d = -d if isinstance(digits, exp.Neg) else d
                    if abs(d) > 30:  # no range (and no 10**d of a huge d at planning)
                        r = None
                    else:
                        half = Fraction(1, 2) * Fraction(10) ** (-d)
                        r = Interval(r.lo - half, r.hi + half)
            kind = "round" if digits is None else "other"
            return Expr(kind, a.type, node, (a,), _fit(r, a.type), a.nullable)
        if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
            only_args(node, {"this", "expressions", "is_nvl", "is_null", "ignore_nulls"})
            args = [self.bind(a) for a in [node.this] + list(node.expressions)]
            t = _common([a.type for a in args], node)
            nullable = all(a.nullable for a in args)
            if isinstance(node, exp.Coalesce):
                # The first non-NULL argument: any argument that can be reached.
                reach: list[Expr] = []
                for a in args:
                    reach.append(a)
                    if not a.nullable:
                        break
                return Expr("coalesce", t, node, tuple(args), _hull(reach, t), nullable)
            kind = "least" if isinstance(node, exp.Least) else "greatest"
            r = None
            real = [a for a in args if a.type != "null"]
            if real and all(a.range is not None for a in real):
                # DuckDB skips NULL arguments: the result is the least (greatest) of the
                # arguments that are present; those that are never NULL always are.
                los, his = [a.range.lo for a in real], [a.range.hi for a in real]
                sure = [a.range for a in real if not a.nullable]
                if kind == "least":
                    r = Interval(min(los), min(x.hi for x in sure) if sure else max(his))
                else:
                    r = Interval(max(x.lo for x in sure) if sure else min(los), max(his))
            return Expr(kind, t, node, tuple(args), _fit(r, t), nullable)
        if isinstance(node, exp.Nullif):
            only_args(node, {"this", "expression"})
            a = self.bind(node.this)
            _common([a.type, self.type(node.expression)], node)
            return Expr("other", a.type, node, (a,), None)
        if isinstance(node, exp.TryCast):
            only_args(node, {"this", "to", "safe"})
            a = self.bind(node.this)
            to = node.args["to"]
            target = _TRY_CAST_TYPES.get(to.this) if isinstance(to, exp.DataType) else None
            if target is None or to.expressions:
                raise unsupported(
                    f"TRY_CAST to {snippet(to)} is not supported (BIGINT, INTEGER, DOUBLE, "
                    "VARCHAR or BOOLEAN)",
                    node,
                )
            if target in _NUMERIC and a.type in _NUMERIC:
                return self._converted(node, a, target, to)
            kind = "predicate" if target == "bool" else "other"
            return Expr(kind, target, node, (a,), _BOOL if target == "bool" else None)
        if self._values and isinstance(node, exp.Anonymous) and node.name.lower() == "if":
            raise unsupported(f"function {snippet(node)} is not allowed", node)  # pragma: no cover
        if isinstance(node, exp.Collate):
            raise unsupported(f"{snippet(node)}: COLLATE is not supported (compare with LOWER()/UPPER() "
                              "instead)", node)
        raise unsupported(f"function {snippet(node)} is not allowed", node)


# --- dates and timestamps ---------------------------------------------------------------------









def _temporal_literal(node: exp.Expression) -> Expr | None:
    """``DATE '…'`` / ``TIMESTAMP '…'`` (a cast of a string literal) as a typed literal."""
    from dpgate.policy import parse_temporal

    if not (isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal)
            and node.this.is_string and isinstance(node.args.get("to"), exp.DataType)):
        return None
    to = node.args["to"].this
    T = exp.DataType.Type
    type_ = ("date" if to == T.DATE else
             "timestamp" if to in (T.TIMESTAMP, T.TIMESTAMPNTZ, T.DATETIME) else None)
    if type_ is None:
        return None
    try:
        value = parse_temporal(node.this.this, type_)
    except ValueError as e:
        raise unsupported(f"{snippet(node)} is not a valid {type_}: {e}", node) from None
    return Expr("literal", type_, node, (), Interval.point(temporal_ordinal(value)), False)


def _coerce_temporal(args: list[Expr], node: exp.Expression) -> list[str]:
    """Types of compared operands, a string literal compared with a date/timestamp read as one.

    The string must be an ISO date (timestamp): DuckDB would cast it at run time, and a bad
    string would then be an error after the charge, so it is refused here.
    """
    from dpgate.policy import parse_temporal

    types = [a.type for a in args]
    temporal = [t for t in types if t in _TEMPORAL]
    if not temporal:
        return types
    target = "timestamp" if "timestamp" in temporal else "date"
    out = []
    for a in args:
        if a.type == "text" and a.kind == "literal":
            try:
                parse_temporal(a.node.this, "timestamp" if target == "timestamp" else "date")
            except ValueError as e:
                raise unsupported(f"{snippet(a.node)} compared with a {target} is not a valid "
                                  f"{target}: {e}", node) from None
            out.append(target)
        else:
            out.append(a.type)
    return out








def _part_range(unit: str, a: Expr) -> Interval | None:
    """Range of a date part of a (clamped) date/timestamp: the year from the bounds."""
    if unit == "year":
        if a.range is None or a.type not in _TEMPORAL:
            return None
        return Interval.of(from_ordinal(a.range.lo, a.type).year,
                           from_ordinal(a.range.hi, a.type).year)
    if unit in ("hour", "minute", "second") and a.type == "date":
        return Interval.point(0)
    lo, hi = PART_RANGES[unit]
    return Interval.of(lo, hi)




def _hull(branches: list[Expr], t: str) -> Interval | None:
    real = [b for b in branches if b.type != "null"]
    if not real or any(b.range is None for b in real):
        return None
    r = real[0].range
    for b in real[1:]:
        r = r.hull(b.range)
    return _fit(r, t)


# --- guards, canonical trees ----------------------------------------------------------------






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


def _searched_case(tree: exp.Expression) -> exp.Expression:
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


def plan_where(node: exp.Expression | None, scope: Any) -> str | None:
    """The canonical SQL of a WHERE predicate over declared columns, or None (always true).

    Raises:
        UnsupportedQuery, UnknownColumn, UnknownTable: a refused construct or name.
    """
    if node is None:
        return None
    node = cast_as_try_cast(node)
    binder = Binder(row_column(scope))
    binder.check_predicate(node)
    tree = canonical_columns(node, scope.resolve)
    tree = canonicalize_literals(tree)
    # Guard arithmetic before simplifying too, so that the canonical form is a fixed point
    # (planning the canonical SQL again gives the same plan).
    tree = guard_arithmetic(tree)
    tree = simplify_tree(tree)
    tree = canonicalize_literals(tree)
    # Validate what will actually run (simplify may fold constants).
    binder.check_predicate(tree)
    if isinstance(tree, exp.Boolean) and tree.this:
        return None
    tree = guard_arithmetic(tree)
    return tree.sql(dialect=DIALECT, comments=False)


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


def canonical_value(node: exp.Expression, scope: Any) -> tuple[Expr, exp.Expression]:
    """Bind an aggregate's argument: (the bound canonical expression, its canonical tree).

    The analyst's tree is bound first (refusals quote what was written); then the canonical
    tree (declared names, canonical literals, IF/simple CASE as searched CASE, simplified by
    sqlglot) is bound again, so that equivalent spellings give one expression.
    """
    binder = Binder(row_column(scope), "aggregate")
    tree = _searched_case(node.copy())
    binder.bind(tree)
    tree = canonical_columns(tree, scope.resolve)
    tree = canonicalize_literals(tree)
    simple = canonicalize_literals(simplify_tree(tree))
    try:
        e = binder.bind(simple)
        if e.range is None and binder.bind(tree).range is not None:
            raise UnsupportedQuery("simplified form is less precise")
        tree = simple
    except (UnsupportedQuery, UnknownColumn):
        e = binder.bind(tree)
    return e, tree


def bind_row_expression(node: exp.Expression, scope: Any) -> Expr:
    """The typed IR of one row expression over ``scope``'s table (see :mod:`dpgate.sql.expr`).

    ``node`` may be the analyst's tree; the result is bound on its canonical form (declared,
    quoted names; canonical literals; simplified). The privacy unit is refused.

    Raises:
        UnsupportedQuery, UnknownColumn, UnknownTable: a refused construct or name.
    """
    return canonical_value(node, scope)[0]


def bind_value(tree: exp.Expression, table: TablePolicy) -> Expr:
    """Bind a canonical aggregated expression (from a plan) against ``table``, as planned."""
    return Binder(row_column(TableScope(table)), "aggregate").bind(tree)


# --- a bounded value: its clamp and resolution -------------------------------------------------


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


def _unquoted(node: exp.Expression) -> exp.Expression:
    """A copy with plain identifiers (messages quote the analyst's spelling, not ours)."""
    def fix(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Identifier) and n.quoted and re.fullmatch(r"[A-Za-z_]\w*", n.name):
            return exp.to_identifier(n.name, quoted=False)
        return n
    return node.transform(fix, copy=True)


def unbounded_message(e: Expr, node: exp.Expression) -> str:
    """Why the value of an aggregate argument has no derived bounds (naming the sub-expression)."""
    bad = e.unbounded() or e
    what = snippet(_unquoted(bad.node))
    if bad.kind == "column":
        why = (f"column {bad.column!r} has no bounds in the policy (declare lower and upper)"
               if bad.type in _NUMERIC else f"column {bad.column!r} is {bad.type}, not numeric")
    elif bad.type == "int" and bad.args and all(a.range is not None for a in bad.args):
        why = "it can overflow 64-bit integers for values inside the policy's bounds"
    elif bad.type == "float" and bad.args and all(a.range is not None for a in bad.args):
        why = f"its range exceeds ±{limits.MAX_ABS_BOUND:g} for values inside the policy's bounds"
    elif bad.type not in _NUMERIC + ("bool",):
        why = f"it is a {bad.type} value, not a number"
    else:
        why = "no bounds follow from the policy"
    return (f"{snippet(node)}: the sub-expression {what} is unbounded ({why}); every value "
            "inside an aggregate needs bounds derived from the policy")
