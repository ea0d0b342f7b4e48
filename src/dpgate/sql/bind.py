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
from fractions import Fraction
from typing import Any, Callable, NoReturn

from sqlglot import exp

from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.policy import TablePolicy
from dpgate.sql.expr import MAX_FLOAT, MAX_INT, Expr, Interval, guard_arithmetic, round_half_away

# concept groups moved to their own modules (literals, canonical trees, column info, derived
# values); every name stays importable from here
from dpgate.sql.columns import ColumnInfo, Scope, TableScope, column_info, row_column  # noqa: F401 - re-exported
from dpgate.sql.derived import Derived, derived_value, unbounded_message, unquoted  # noqa: F401 - re-exported
from dpgate.sql.literals import text_slice_problem
from dpgate.sql.literals import (  # noqa: F401 - re-exported
    canonical_number_text,
    canonicalize_literals,
    exact_number,
    number,
    quoted_numbers,
)
from dpgate.sql.trees import canonical_columns, cast_as_try_cast, searched_case, simplify_tree  # noqa: F401 - re-exported
# the message helpers, date helpers and TRY guard (sql.messages, sql.temporal, sql.expr: expr
# no longer imports this module)
from dpgate.sql.messages import SOURCE, as_written  # noqa: F401 - re-exported
from dpgate.sql.messages import DIALECT, only_args, real_args, snippet, unsupported
from dpgate.sql.temporal import TRUNC_UNITS, date_part_of, temporal_sql  # noqa: F401 - re-exported
from dpgate.sql.temporal_binding import coerce_temporal, part_range, temporal_literal
from dpgate.sql.temporal import (
    NOW,
    NOW_NAMES,
    PART_FUNCS,
    check_interval,
    date_part,
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
    exp.CountIf,  # COUNT_IF(cond): dpgate.sql.aggregates.count_if_aggregate
)
_AGGREGATES = AGGREGATES
_ANON_AGGREGATES = {"mean": "avg", "var": "var_pop", "varp": "var_pop", "stdevp": "stddev_pop",
                    "std": "stddev_pop"}
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


# --- typed division, aggregate calls -------------------------------------------------------


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
        # the steps of :meth:`bind`, in order (bound once: bind runs for every node)
        self._steps = (self._leaf, self._refusal_or_division, self._conversion, self._arithmetic,
                       self._predicate, self._case_or_if)
        self._function_steps = (self._temporal_function, self._text_function, self._numeric_function,
                                self._choice_function, self._try_cast)

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
        """The typed IR of ``node`` (UnsupportedQuery if refused).

        Each step binds the nodes it knows and returns None for the others; the steps run
        from this frame (a nested expression costs as few Python frames as before the split:
        the depth limits of :mod:`dpgate.sql.rules` hold from a caller 300 frames deep).
        """
        if self.clause == "HAVING":
            if self.is_aggregate(node):
                return Expr("other", self._info(node).type, node)
            if not isinstance(node, _HAVING_NODES):
                raise unsupported(f"{snippet(node)} is not supported in HAVING", node)
        for step in self._steps:
            e = step(node)
            if e is not None:
                return e
        if isinstance(node, exp.Func):
            for step in self._function_steps:
                e = step(node)
                if e is not None:
                    return e
            self._refuse_function(node)
        raise unsupported(f"{snippet(node)} is not supported in a row predicate", node)

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

    def _leaf(self, node: exp.Expression) -> Expr | None:
        """Leaves: parentheses, columns, literals, booleans, NULL."""
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
        return None

    def _refusal_or_division(self, node: exp.Expression) -> Expr | None:
        """Nested or misplaced aggregates, division (where it cannot fail), the clock."""
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
        return None

    def _conversion(self, node: exp.Expression) -> Expr | None:
        """Date/timestamp literals, CAST and TRY_CAST, TRY."""
        temporal = temporal_literal(node)
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
        return None

    def _arithmetic(self, node: exp.Expression) -> Expr | None:
        """Unary minus, ``+ - *``, INTERVAL arithmetic, ``||``."""
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
        return None

    def _predicate(self, node: exp.Expression) -> Expr | None:
        """Comparisons, IS, IN, BETWEEN, LIKE, AND/OR/NOT."""
        if isinstance(node, _COMPARISONS):
            a, b = self.bind(node.this), self.bind(node.expression)
            _common(coerce_temporal([a, b], node), node)
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
            if not node.expressions:  # `x IN ()`: not SQL any engine runs (DuckDB cannot parse it back)
                raise unsupported(f"IN needs at least one value: {snippet(node)}", node)
            args = [self.bind(node.this)] + [self.bind(e) for e in node.expressions]
            _common(coerce_temporal(args, node), node)
            return self._pred(node, args)
        if isinstance(node, exp.Between):
            only_args(node, {"this", "low", "high"})
            args = [self.bind(node.this), self.bind(node.args["low"]), self.bind(node.args["high"])]
            _common(coerce_temporal(args, node), node)
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
        return None

    def _case_or_if(self, node: exp.Expression) -> Expr | None:
        """CASE (inside aggregates) and the refusal of IF(…) as a node."""
        if isinstance(node, exp.Case):
            if self._values:
                return self._case(node)
            raise unsupported(f"CASE expressions are not supported: {snippet(node)}", node)
        if isinstance(node, exp.If) and self._values:
            raise unsupported(f"{snippet(node)} is not supported (IF(c, a, b) is accepted as a "
                              "function call)", node)
        return None
    def _divide(self, node: exp.Div) -> Expr:
        only_args(node, {"this", "expression", "typed", "safe"})
        a = self._expect(node.this, _NUMERIC, "division")
        b = self._expect(node.expression, _NUMERIC, "division")
        _check_typed_division(node, a, b)
        r = None
        if b.range is not None and b.range.contains_zero():
            raise unsupported(
                f"division by {snippet(unquoted(node.expression))}, whose range {b.range} contains 0 "
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
            raise unsupported(f"CAST of a value of type {a.type} is not supported inside aggregates: "
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
            raise unsupported(f"CAST of a value of type {a.type} is not supported in {self.clause}: "
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

    def _refuse_function(self, node: exp.Func) -> NoReturn:
        """The refusal of a function call outside the allow-list."""
        if self._values and isinstance(node, exp.Anonymous) and node.name.lower() == "if":
            raise unsupported(f"function {snippet(node)} is not allowed", node)  # pragma: no cover
        if isinstance(node, exp.Collate):
            raise unsupported(f"{snippet(node)}: COLLATE is not supported (compare with LOWER()/UPPER() "
                              "instead)", node)
        raise unsupported(f"function {snippet(node)} is not allowed", node)

    def _temporal_function(self, node: exp.Func) -> Expr | None:
        """EXTRACT / date_part / YEAR(…) and date_trunc."""
        part = date_part(node)
        if part is not None:
            unit, arg = part
            a = self._expect(arg, _TEMPORAL, f"EXTRACT({unit.upper()} FROM …)")
            return Expr("extract", "int", node, (a,), part_range(unit, a), a.nullable)
        if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
            unit = trunc_unit(node)
            a = self._expect(node.this, _TEMPORAL, "date_trunc")
            # DuckDB: date_trunc of a DATE is a TIMESTAMP (monotone; range in µs not needed).
            return Expr("other", "timestamp", node, (a,), None, a.nullable)
        return None

    def _text_function(self, node: exp.Func) -> Expr | None:
        """LOWER, UPPER, LENGTH, TRIM, SUBSTRING/LEFT, CONCAT, STARTS_WITH, ENDS_WITH, CONTAINS."""
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
        if isinstance(node, (exp.Substring, exp.Left)):
            slice_problem = text_slice_problem(node)
            if slice_problem:
                raise unsupported(f"{snippet(node)}: {slice_problem}", node)
            return Expr("other", "text", node, (self._expect(node.this, ("text",), node.key.upper()),))
        if isinstance(node, exp.Concat):
            only_args(node, {"expressions", "safe", "coalesce"})
            return Expr("other", "text", node, tuple(self.bind(e) for e in node.expressions))
        if isinstance(node, (exp.StartsWith, exp.EndsWith, exp.Contains)):
            only_args(node, {"this", "expression"})
            a = self._expect(node.this, ("text",), node.key.upper())
            b = self._expect(node.expression, ("text",), node.key.upper())
            return self._pred(node, [a, b])
        return None

    def _numeric_function(self, node: exp.Func) -> Expr | None:
        """ABS, SIGN, FLOOR, CEIL and ROUND, with their ranges."""
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
        return None

    def _choice_function(self, node: exp.Func) -> Expr | None:
        """COALESCE, GREATEST, LEAST and NULLIF."""
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
        return None

    def _try_cast(self, node: exp.Func) -> Expr | None:
        """TRY_CAST to the types of :data:`_TRY_CAST_TYPES`."""
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
        return None


# --- dates and timestamps ---------------------------------------------------------------------


def _hull(branches: list[Expr], t: str) -> Interval | None:
    real = [b for b in branches if b.type != "null"]
    if not real or any(b.range is None for b in real):
        return None
    r = real[0].range
    for b in real[1:]:
        r = r.hull(b.range)
    return _fit(r, t)


# --- entry points: WHERE, aggregated values, row expressions ------------------------------


def plan_where(node: exp.Expression | None, scope: Any) -> str | None:
    """The canonical SQL of a WHERE predicate over declared columns, or None (always true):
    the text of :func:`plan_where_tree`.

    Raises:
        UnsupportedQuery, UnknownColumn, UnknownTable: a refused construct or name.
    """
    tree = plan_where_tree(node, scope)
    return None if tree is None else tree.sql(dialect=DIALECT, comments=False)


def plan_where_tree(node: exp.Expression | None, scope: Any) -> exp.Expression | None:
    """The canonical tree of a WHERE predicate over declared columns (names declared and quoted,
    literals canonical, arithmetic guarded by TRY, simplified), or None (always true).

    Raises:
        UnsupportedQuery, UnknownColumn, UnknownTable: a refused construct or name.
    """
    if node is None:
        return None
    binder = Binder(row_column(scope))
    node = quoted_numbers(cast_as_try_cast(node), binder.type)
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
    return guard_arithmetic(tree)


def canonical_value(node: exp.Expression, scope: Any) -> tuple[Expr, exp.Expression]:
    """Bind an aggregate's argument: (the bound canonical expression, its canonical tree).

    The analyst's tree is bound first (refusals quote what was written); then the canonical
    tree (declared names, canonical literals, IF/simple CASE as searched CASE, simplified by
    sqlglot) is bound again, so that equivalent spellings give one expression.
    """
    binder = Binder(row_column(scope), "aggregate")
    tree = quoted_numbers(searched_case(node.copy()), binder.type)
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


