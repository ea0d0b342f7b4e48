"""The post-processing expression evaluator (:func:`evaluate`, :func:`evaluate_predicate`,
:func:`check_postprocess_expression`, :func:`order_by`, :func:`sort_rows`,
:func:`limit_rows`). A sqlglot expression whose column references name *cells*
(released aggregates, group keys, constants) is evaluated vectorised (NumPy)
over one value per released row, with SQL NULL semantics:

* arithmetic ``+ - * / % //`` and unary minus; ``/`` is real division unless
  sqlglot marks it *typed* (integer division of integers, as PostgreSQL and
  T-SQL read ``7 / 2``); ``//`` and ``DIV`` truncate toward zero, for floats
  too (DuckDB divides DOUBLEs exactly under ``//``; we keep the operator's
  meaning), as does typed ``/``; ``%`` takes the dividend's sign;
* ``POWER``, ``SQRT``, ``CBRT``, ``EXP``, ``LN``, ``LOG(x)`` (base 10, or the
  natural log where the dialect says so), ``LOG(b, x)``, ``LOG2``, ``LOG10``,
  ``ROUND(x[, d])`` (half away from zero), ``FLOOR``, ``CEIL``, ``TRUNC(x[, d])``,
  ``ABS``, ``SIGN``, ``PI()``, ``LEAST``/``GREATEST`` (NULLs ignored where the
  dialect ignores them: DuckDB, PostgreSQL, Spark), ``CASE``, ``IF``/``IIF``,
  ``COALESCE``/``IFNULL``/``NVL``, ``NULLIF``, ``CAST``/``TRY_CAST``/``::`` to
  integer, floating, decimal (rounded to its scale), text, boolean, date and
  timestamp types, comparisons (also ``IS [NOT] DISTINCT FROM``), ``AND``/``OR``/
  ``NOT`` (three-valued), ``IN``, ``BETWEEN``, ``IS [NOT] NULL``/``TRUE``/``FALSE``,
  string concatenation ``||`` and ``CONCAT`` (which skips NULLs where the dialect
  does), ``UPPER``/``LOWER``/``LENGTH`` of text keys;
* NULL in, NULL out; **the evaluator is total**: division or ``%`` by zero,
  ``SQRT`` of a negative, ``LN``/``LOG`` of a non-positive, a failed cast, an
  integer beyond ±9.2·10^18 and every non-finite float (NaN, ±inf) give NULL,
  never an error and never NaN/inf in a release. A charged release therefore
  cannot fail in post-processing because of the values it got; only a malformed
  expression raises, and :func:`check_postprocess_expression` finds those at
  planning time, before any charge;
* non-deterministic functions (``RANDOM``, ``RAND``, ``NOW``, ``CURRENT_DATE``,
  ``UUID``, …, see :data:`NONDETERMINISTIC_FUNCTIONS`) are refused: a release must be a function of
  its stored noisy values alone.

This is post-processing of released values ([DR14] Prop. 2.1): it costs no
privacy budget.

[DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential Privacy, 2014.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

import numpy as np
import sqlglot
from sqlglot import exp

from dpgate.errors import UnsupportedQuery

#: Value types of a :class:`Vector`.
VALUE_TYPES = ("int", "float", "bool", "text", "date", "timestamp", "null")
#: Integers beyond this magnitude become NULL (headroom below 2^63 for float rounding).
INT_LIMIT = 9.2e18
_I64_MIN = np.iinfo(np.int64).min


class ExpressionError(ValueError):
    """A post-processing expression that cannot be evaluated: an unsupported construct, a
    reference to an unknown cell, or operand types that do not fit (text + number).

    Never raised because of the *values* (the evaluator is total on values).
    :func:`check_postprocess_expression` turns it into
    :class:`~dpgate.errors.UnsupportedQuery` at planning time.

    Attributes:
        construct: the offending sub-expression as SQL text (≤ 80 characters), or None.
    """

    def __init__(self, message: str, node: exp.Expression | None = None) -> None:
        super().__init__(message)
        self.construct = _snippet(node) if node is not None else None


def _snippet(node: exp.Expression | None) -> str:
    if node is None:
        return ""
    try:
        text = node.sql(dialect="duckdb")
    except Exception:  # noqa: BLE001 - a snippet is only a hint
        text = type(node).__name__
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True, eq=False)
class Vector:
    """One column of released values, one per row, with SQL NULLs.

    Attributes:
        values: 1-D array: ``int64`` for ``int``, ``float64`` for ``float``,
            ``bool`` for ``bool``, ``object`` (``str``, ``datetime.date``,
            ``datetime.datetime``) for ``text``/``date``/``timestamp``, any dtype
            for ``null``. Entries at NULL positions are arbitrary.
        valid: boolean array of the same length, False where the value is NULL.
        type: one of :data:`VALUE_TYPES` (``null``: the type of a bare NULL literal).
    """

    values: np.ndarray
    valid: np.ndarray
    type: str

    def __len__(self) -> int:
        return len(self.valid)

    @classmethod
    def of(cls, data: Any) -> "Vector":
        """A :class:`Vector` from a NumPy array or a sequence (a Vector is returned as is).

        NULL is ``None``, or NaN/±inf in a float array (never released). Integer
        arrays are ``int``, float arrays ``float``, bool arrays ``bool``; object
        arrays take the type of their non-NULL elements (Python ints, floats,
        ``Decimal``, ``str``, ``bool``, dates, datetimes; ints and floats mixed are
        ``float``); ``datetime64`` arrays become dates (day unit) or timestamps.

        Raises:
            ExpressionError: not 1-D, or elements of incompatible types.
        """
        if isinstance(data, Vector):
            return data
        if isinstance(data, np.ndarray):
            arr = data
        elif isinstance(data, (list, tuple)):
            arr = np.empty(len(data), dtype=object)
            arr[:] = list(data)
        else:
            arr = np.asarray(data)
        if arr.ndim != 1:
            if arr.ndim == 0:
                arr = arr.reshape(1)
            else:
                raise ExpressionError(f"a cell must be a 1-D vector, got shape {arr.shape}")
        kind = arr.dtype.kind
        n = len(arr)
        if kind == "b":
            return cls(arr.astype(bool, copy=False), np.ones(n, dtype=bool), "bool")
        if kind == "i":
            return cls(arr.astype(np.int64, copy=False), np.ones(n, dtype=bool), "int")
        if kind == "u":
            if n and int(arr.max()) > INT_LIMIT:
                return cls.of(arr.astype(np.float64))
            return cls(arr.astype(np.int64), np.ones(n, dtype=bool), "int")
        if kind == "f":
            f = arr.astype(np.float64, copy=False)
            return cls(f, np.isfinite(f), "float")
        if kind in "US":
            return cls(arr.astype(object), np.ones(n, dtype=bool), "text")
        if kind == "M":
            unit = np.datetime_data(arr.dtype)[0]
            valid = ~np.isnat(arr)
            if unit in ("D", "W", "M", "Y"):
                vals = arr.astype("datetime64[D]").astype(object)
                return cls(np.asarray(vals, dtype=object), valid, "date")
            vals = arr.astype("datetime64[us]").astype(object)
            return cls(np.asarray(vals, dtype=object), valid, "timestamp")
        if kind != "O":
            raise ExpressionError(f"cells of dtype {arr.dtype} are not supported")
        return _vector_of_objects(arr)

    def to_list(self) -> list[Any]:
        """JSON-ready Python values: int, float (finite), bool, str (dates and
        timestamps as ISO 8601 text), ``None`` for NULL."""
        if self.type == "null":
            return [None] * len(self)
        if self.type in ("int", "float", "bool", "text") and self.values.dtype.kind in "iufbO":
            # fast path: NumPy's tolist gives Python scalars; valid floats are finite by construction
            out = self.values.tolist()
            if self.type == "float":
                out = [v if math.isfinite(v) else None for v in out]
        else:
            conv = _TO_PY[self.type]
            out = [conv(v) if ok else None for v, ok in zip(self.values, self.valid.tolist())]
        if not self.valid.all():
            for i in np.flatnonzero(~self.valid).tolist():
                out[i] = None
        return out

    def as_float(self) -> np.ndarray:
        """Float64 values with NaN for NULL (numeric and bool vectors only).

        Raises:
            ExpressionError: a text/date vector.
        """
        if self.type in ("int", "float", "bool", "null"):
            f = np.asarray(self.values, dtype=np.float64) if self.type != "null" else np.full(len(self), np.nan)
            return np.where(self.valid, f, np.nan)
        raise ExpressionError(f"a {self.type} value is not a number")

    def take(self, index: np.ndarray) -> "Vector":
        """The rows at ``index`` (an integer array), in that order."""
        return Vector(self.values[index], self.valid[index], self.type)


def _float_py(v: Any) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


def _iso(v: Any) -> str:
    return v.isoformat(sep=" ") if isinstance(v, _dt.datetime) else v.isoformat()


_TO_PY: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": _float_py,
    "bool": bool,
    "text": str,
    "date": _iso,
    "timestamp": _iso,
    "null": lambda v: None,
}


def _vector_of_objects(arr: np.ndarray) -> Vector:
    n = len(arr)
    items = arr.tolist()
    if all(type(v) is str for v in items):  # the common case: text keys
        return Vector(arr, np.ones(n, dtype=bool), "text")
    valid = np.ones(n, dtype=bool)
    kinds: set[str] = set()
    for i, v in enumerate(items):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            valid[i] = False
        elif isinstance(v, (bool, np.bool_)):
            kinds.add("bool")
        elif isinstance(v, (int, np.integer)):
            kinds.add("int" if abs(int(v)) <= INT_LIMIT else "float")
        elif isinstance(v, (float, np.floating, Decimal)):
            if isinstance(v, Decimal) and not v.is_finite():
                valid[i] = False
            elif not math.isfinite(float(v)):
                valid[i] = False
            else:
                kinds.add("float")
        elif isinstance(v, str):
            kinds.add("text")
        elif isinstance(v, _dt.datetime):
            kinds.add("timestamp")
        elif isinstance(v, _dt.date):
            kinds.add("date")
        elif isinstance(v, np.datetime64):
            kinds.add("timestamp")
        else:
            raise ExpressionError(f"cells of Python type {type(v).__name__} are not supported")
    if not kinds:
        return Vector(np.zeros(n, dtype=np.float64), valid, "null")
    t = _common_type(kinds)
    if t == "int":
        vals = np.array([int(v) if ok else 0 for v, ok in zip(items, valid)], dtype=np.int64)
    elif t == "float":
        vals = np.array([float(v) if ok else 0.0 for v, ok in zip(items, valid)], dtype=np.float64)
    elif t == "bool":
        vals = np.array([bool(v) if ok else False for v, ok in zip(items, valid)], dtype=bool)
    elif t == "timestamp":
        vals = np.empty(n, dtype=object)
        vals[:] = [_to_timestamp(v) if ok else None for v, ok in zip(items, valid)]
    else:
        vals = np.empty(n, dtype=object)
        vals[:] = [v if ok else None for v, ok in zip(items, valid)]
    return Vector(vals, valid, t)


def _to_timestamp(v: Any) -> _dt.datetime:
    if isinstance(v, _dt.datetime):
        return v
    if isinstance(v, _dt.date):
        return _dt.datetime(v.year, v.month, v.day)
    if isinstance(v, np.datetime64):
        return v.astype("datetime64[us]").astype(object)
    raise TypeError(v)


def _common_type(types: Iterable[str], node: exp.Expression | None = None) -> str:
    ts = {t for t in types if t != "null"}
    if not ts:
        return "null"
    if ts <= {"int"}:
        return "int"
    if ts <= {"int", "float"}:
        return "float"
    if len(ts) == 1:
        return next(iter(ts))
    if ts <= {"date", "timestamp"}:
        return "timestamp"
    raise ExpressionError(f"values of types {', '.join(sorted(ts))} cannot be combined", node)


def _convert(v: Vector, t: str) -> Vector:
    """``v`` as type ``t`` (a widening: int → float, date → timestamp, null → anything)."""
    if v.type == t:
        return v
    n = len(v)
    if v.type == "null":
        if t == "int":
            return Vector(np.zeros(n, dtype=np.int64), v.valid, t)
        if t == "float":
            return Vector(np.zeros(n, dtype=np.float64), v.valid, t)
        if t == "bool":
            return Vector(np.zeros(n, dtype=bool), v.valid, t)
        return Vector(np.full(n, None, dtype=object), v.valid, t)
    if v.type == "int" and t == "float":
        return Vector(v.values.astype(np.float64), v.valid, t)
    if v.type == "date" and t == "timestamp":
        vals = np.empty(n, dtype=object)
        vals[:] = [_to_timestamp(x) if ok else None for x, ok in zip(v.values, v.valid)]
        return Vector(vals, v.valid, t)
    raise ExpressionError(f"a {v.type} value cannot be used as {t}")


def _const(value: Any, t: str, n: int) -> Vector:
    ones = np.ones(n, dtype=bool)
    if t == "int":
        return Vector(np.full(n, value, dtype=np.int64), ones, t)
    if t == "float":
        f = float(value)
        return Vector(np.full(n, f, dtype=np.float64), np.full(n, math.isfinite(f)), t)
    if t == "bool":
        return Vector(np.full(n, bool(value), dtype=bool), ones, t)
    if t == "null":
        return Vector(np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), t)
    vals = np.empty(n, dtype=object)
    vals[:] = [value] * n
    return Vector(vals, ones, t)


def _null(n: int) -> Vector:
    return _const(None, "null", n)


def _int_checked(values: np.ndarray, valid: np.ndarray, approx: np.ndarray) -> Vector:
    """An int result with rows whose exact value (approximated by ``approx``) leaves int64 made NULL."""
    with np.errstate(invalid="ignore"):
        ok = valid & (np.abs(approx) < INT_LIMIT)
    return Vector(np.where(ok, values, 0).astype(np.int64), ok, "int")


def _float_result(values: np.ndarray, valid: np.ndarray) -> Vector:
    with np.errstate(invalid="ignore"):
        ok = valid & np.isfinite(values)
    return Vector(np.where(ok, values, 0.0).astype(np.float64), ok, "float")


def _round_half_away(x: np.ndarray, digits: int) -> np.ndarray:
    """Round half away from zero to ``digits`` decimals (SQL ROUND; numerically as DuckDB)."""
    if digits > 15:
        return x
    m = 10.0 ** digits
    with np.errstate(all="ignore"):
        y = np.abs(x) * m
        r = np.sign(x) * np.floor(y + 0.5) / m
    return np.where(np.isfinite(r), r, x)


# --- the evaluator ---------------------------------------------------------------------------------

#: Functions refused in post-processing because their value is not a function of the release.
NONDETERMINISTIC_FUNCTIONS = frozenset(
    "RANDOM RAND RANDN RANDOMBYTES SETSEED UUID GEN_RANDOM_UUID NEWID NOW GETDATE SYSDATE "
    "SYSDATETIME TODAY CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP LOCALTIME LOCALTIMESTAMP "
    "CLOCK_TIMESTAMP STATEMENT_TIMESTAMP TRANSACTION_TIMESTAMP GET_CURRENT_TIME UNIX_TIMESTAMP "
    "CURRENT_DATETIME UTC_TIMESTAMP UTC_DATE NEXTVAL CURRVAL TXID_CURRENT".split()
)
_NONDET_NODES: tuple[type, ...] = tuple(
    getattr(exp, name)
    for name in ("Rand", "Randn", "Uuid", "CurrentDate", "CurrentTime", "CurrentTimestamp",
                 "CurrentDatetime", "Localtime", "Localtimestamp", "CurrentTimestampLTZ",
                 "UnixSeconds", "Random")
    if hasattr(exp, name)
)
_NONDET_COLUMNS = frozenset({"SYSDATE", "CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP",
                             "LOCALTIME", "LOCALTIMESTAMP", "SYSTIMESTAMP"})

_CMP_OPS: dict[type, Callable[[Any, Any], Any]] = {
    exp.EQ: np.equal,
    exp.NEQ: np.not_equal,
    exp.GT: np.greater,
    exp.GTE: np.greater_equal,
    exp.LT: np.less,
    exp.LTE: np.less_equal,
}
_INT_TYPES = frozenset(exp.DataType.INTEGER_TYPES)
_REAL_TYPES = frozenset(exp.DataType.REAL_TYPES)
_TEXT_TYPES = frozenset(exp.DataType.TEXT_TYPES)
_DATE_TYPES = frozenset({exp.DataType.Type.DATE, exp.DataType.Type.DATE32})
_TIMESTAMP_TYPES = frozenset(exp.DataType.TEMPORAL_TYPES) - _DATE_TYPES - frozenset(
    {exp.DataType.Type.TIME, exp.DataType.Type.TIMETZ})
_TRUE_TEXT = frozenset({"true", "t", "yes", "y", "1", "on"})
_FALSE_TEXT = frozenset({"false", "f", "no", "n", "0", "off"})


def _cast_target(dtype: exp.DataType, node: exp.Expression) -> tuple[str, int | None]:
    """(value type, decimal scale or None) of a CAST target."""
    t = dtype.this
    if t == exp.DataType.Type.BOOLEAN:
        return "bool", None
    if t in _INT_TYPES:
        return "int", None
    if t in _REAL_TYPES:
        scale = None
        if t in (exp.DataType.Type.DECIMAL, exp.DataType.Type.BIGDECIMAL) and len(dtype.expressions) >= 2:
            try:
                scale = int(dtype.expressions[1].this.this)
            except (AttributeError, TypeError, ValueError):
                scale = None
        return "float", scale
    if t in _TEXT_TYPES:
        return "text", None
    if t in _DATE_TYPES:
        return "date", None
    if t in _TIMESTAMP_TYPES:
        return "timestamp", None
    raise ExpressionError(f"CAST to {dtype.sql(dialect='duckdb')} is not supported in post-processing", node)


class _Evaluator:
    """Evaluates one expression tree over ``cells`` (name → Vector), all of length ``n``."""

    def __init__(self, cells: Mapping[str, Vector], n: int) -> None:
        self.cells = cells
        self.n = n

    # -- dispatch
    def ev(self, node: exp.Expression) -> Vector:
        """Evaluate ``node`` (dispatch on its sqlglot type; unsupported nodes raise ExpressionError)."""
        method = _DISPATCH.get(type(node))
        if method is None:
            _refuse(node)
        return method(self, node)

    def num(self, node: exp.Expression) -> Vector:
        """Evaluate a numeric operand (bool counts as 0/1 only through CAST; NULL literal ok)."""
        v = self.ev(node)
        if v.type in ("int", "float"):
            return v
        if v.type == "null":
            return _convert(v, "int")
        if v.type == "text" and isinstance(node, exp.Literal):
            return _cast(v, "float", None)
        raise ExpressionError(f"{_snippet(node)} is {v.type}, not a number", node)

    def truth(self, node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        """(true, known) of a condition: bool, or a number (≠ 0 is true)."""
        v = self.ev(node)
        if v.type == "bool":
            return v.values.astype(bool) & v.valid, v.valid
        if v.type in ("int", "float"):
            return (v.values != 0) & v.valid, v.valid
        if v.type == "null":
            return np.zeros(self.n, dtype=bool), np.zeros(self.n, dtype=bool)
        raise ExpressionError(f"{_snippet(node)} is {v.type}, not a condition", node)

    # -- leaves
    def column(self, node: exp.Column) -> Vector:
        """A cell by name (unqualified)."""
        if node.args.get("table") is not None or not isinstance(node.this, exp.Identifier):
            raise ExpressionError(f"{_snippet(node)}: post-processing refers to released cells by name only",
                                  node)
        name = node.name
        if name not in self.cells:
            if name.upper() in _NONDET_COLUMNS:
                raise ExpressionError(f"non-deterministic {name.upper()} is not allowed", node)
            raise ExpressionError(f"{name!r} is not a released cell (an aggregate, a group key or an output)",
                                  node)
        return self.cells[name]

    def literal(self, node: exp.Literal) -> Vector:
        """A number (int if it fits int64, else float) or a string."""
        text = node.this
        if node.is_string:
            return _const(text, "text", self.n)
        try:
            i = int(text)
        except ValueError:
            return _const(float(text), "float", self.n)
        if abs(i) <= INT_LIMIT:
            return _const(i, "int", self.n)
        return _const(float(i), "float", self.n)

    def boolean(self, node: exp.Boolean) -> Vector:
        """TRUE / FALSE."""
        return _const(bool(node.this), "bool", self.n)

    def null(self, node: exp.Null) -> Vector:
        """NULL (type ``null``)."""
        return _null(self.n)

    def paren(self, node: exp.Paren) -> Vector:
        """( … )."""
        return self.ev(node.this)

    def pi(self, node: exp.Expression) -> Vector:
        """PI()."""
        return _const(math.pi, "float", self.n)

    # -- arithmetic
    def neg(self, node: exp.Neg) -> Vector:
        """Unary minus (int64 overflow → NULL)."""
        v = self.num(node.this)
        if v.type == "int":
            return _int_checked(-v.values, v.valid & (v.values != _I64_MIN), -v.values.astype(np.float64))
        return _float_result(-v.values, v.valid)

    def arith(self, node: exp.Expression) -> Vector:
        """+ - * / // %: ints stay ints (overflow → NULL); division by zero → NULL."""
        a, b = self.num(node.this), self.num(node.expression)
        valid = a.valid & b.valid
        op = type(node)
        ints = a.type == "int" and b.type == "int"
        if ints and (op in (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.IntDiv)
                     or (op is exp.Div and node.args.get("typed"))):
            av = np.where(valid, a.values, 0)
            bv = np.where(valid, b.values, 1)
            af, bf = av.astype(np.float64), bv.astype(np.float64)
            with np.errstate(all="ignore"):
                if op is exp.Add:
                    return _int_checked(av + bv, valid, af + bf)
                if op is exp.Sub:
                    return _int_checked(av - bv, valid, af - bf)
                if op is exp.Mul:
                    return _int_checked(av * bv, valid, af * bf)
                zero = bv == 0
                safe = np.where(zero, 1, bv)
                ok = valid & ~zero & ~((av == _I64_MIN) & (safe == -1))
                if op is exp.Mod:
                    return _int_checked(np.fmod(av, safe), ok, np.zeros(self.n))
                q = np.floor_divide(av, safe)
                q = np.where((q * safe != av) & ((av < 0) != (safe < 0)), q + 1, q)  # toward zero
                return _int_checked(q, ok, np.zeros(self.n))
        af = np.where(valid, a.values, 0).astype(np.float64)
        bf = np.where(valid, b.values, 1).astype(np.float64)
        with np.errstate(all="ignore"):
            if op is exp.Add:
                r = af + bf
            elif op is exp.Sub:
                r = af - bf
            elif op is exp.Mul:
                r = af * bf
            else:
                valid = valid & (bf != 0)
                if op is exp.Div:
                    r = af / bf
                elif op is exp.IntDiv:
                    r = np.trunc(af / bf)
                else:  # Mod
                    r = np.fmod(af, bf)
        return _float_result(r, valid)

    def power(self, node: exp.Pow) -> Vector:
        """POWER(x, y) as a float; NaN/inf → NULL."""
        a, b = self.num(node.this), self.num(node.expression)
        with np.errstate(all="ignore"):
            r = np.power(a.values.astype(np.float64), b.values.astype(np.float64))
        return _float_result(r, a.valid & b.valid)

    def unary_math(self, node: exp.Expression) -> Vector:
        """SQRT (negative → NULL), CBRT, EXP (overflow → NULL), LN (≤ 0 → NULL)."""
        v = self.num(node.this)
        x = v.values.astype(np.float64)
        valid = v.valid
        with np.errstate(all="ignore"):
            if isinstance(node, exp.Sqrt):
                valid = valid & (x >= 0)
                r = np.sqrt(np.where(x >= 0, x, 0.0))
            elif isinstance(node, exp.Cbrt):
                r = np.cbrt(x)
            elif isinstance(node, exp.Exp):
                r = np.exp(x)
            else:  # Ln
                valid = valid & (x > 0)
                r = np.log(np.where(x > 0, x, 1.0))
        return _float_result(r, valid)

    def log(self, node: exp.Log) -> Vector:
        """LOG(x) base 10, LOG(b, x); a non-positive x or base, or base 1 → NULL."""
        if node.expression is None:  # LOG(x): base 10 (dialects where LOG means LN parse to Ln)
            x = self.num(node.this)
            base = _const(10.0, "float", self.n)
        else:
            base, x = self.num(node.this), self.num(node.expression)
        xf, bf = x.values.astype(np.float64), base.values.astype(np.float64)
        valid = x.valid & base.valid & (xf > 0) & (bf > 0) & (bf != 1)
        with np.errstate(all="ignore"):
            r = np.log(np.where(xf > 0, xf, 1.0)) / np.log(np.where((bf > 0) & (bf != 1), bf, 2.0))
        return _float_result(r, valid)

    def _digits(self, node: exp.Expression | None) -> int:
        if node is None:
            return 0
        d = self.ev(node)
        if d.type != "int" or not isinstance(node, (exp.Literal, exp.Neg, exp.Paren)):
            raise ExpressionError(f"the number of decimals {_snippet(node)} must be an integer constant", node)
        return int(d.values[0]) if len(d) else 0

    def round_(self, node: exp.Round) -> Vector:
        """ROUND(x[, d]) half away from zero; ints stay ints (d < 0 rounds to tens)."""
        v = self.num(node.this)
        d = self._digits(node.args.get("decimals"))
        if v.type == "int":
            if d >= 0:
                return v
            f = 10 ** min(-d, 18)
            x = v.values
            with np.errstate(all="ignore"):
                r = np.sign(x) * ((np.abs(x) + f // 2) // f) * f
            return _int_checked(r, v.valid, np.sign(x) * (np.abs(x.astype(np.float64)) + f / 2))
        return _float_result(_round_half_away(v.values, d), v.valid)

    def trunc(self, node: exp.Expression) -> Vector:
        """TRUNC(x[, d]) toward zero."""
        v = self.num(node.this)
        d = self._digits(node.args.get("decimals"))
        if v.type == "int":
            return v
        m = 10.0 ** min(d, 15)
        with np.errstate(all="ignore"):
            r = np.trunc(v.values * m) / m
        return _float_result(np.where(np.isfinite(r), r, v.values), v.valid)

    def floor_ceil(self, node: exp.Expression) -> Vector:
        """FLOOR(x), CEIL(x); ints unchanged."""
        v = self.num(node.this)
        if node.args.get("decimals") is not None or node.args.get("to") is not None:
            raise ExpressionError(f"{_snippet(node)}: FLOOR/CEIL take one argument", node)
        if v.type == "int":
            return v
        fn = np.floor if isinstance(node, exp.Floor) else np.ceil
        return _float_result(fn(v.values), v.valid)

    def abs_(self, node: exp.Abs) -> Vector:
        """ABS(x)."""
        v = self.num(node.this)
        if v.type == "int":
            return _int_checked(np.abs(v.values), v.valid & (v.values != _I64_MIN), np.zeros(self.n))
        return _float_result(np.abs(v.values), v.valid)

    def sign(self, node: exp.Sign) -> Vector:
        """SIGN(x) as −1, 0, 1."""
        v = self.num(node.this)
        return Vector(np.sign(v.values).astype(np.int64), v.valid, "int")

    # -- choice
    def _unify(self, vectors: list[Vector], node: exp.Expression) -> tuple[list[Vector], str]:
        t = _common_type((v.type for v in vectors), node)
        return [_convert(v, t) for v in vectors], t

    def greatest_least(self, node: exp.Expression) -> Vector:
        """GREATEST/LEAST; NULLs ignored unless the dialect's node says otherwise."""
        args = [self.ev(node.this)] + [self.ev(e) for e in node.expressions]
        args, t = self._unify(args, node)
        ignore_nulls = node.args.get("ignore_nulls")
        ignore_nulls = True if ignore_nulls is None else bool(ignore_nulls)
        greatest = isinstance(node, exp.Greatest)
        if t == "null":
            return _null(self.n)
        valid = np.zeros(self.n, dtype=bool) if ignore_nulls else np.ones(self.n, dtype=bool)
        for a in args:
            valid = (valid | a.valid) if ignore_nulls else (valid & a.valid)
        if t in ("int", "float", "bool"):
            if t == "int":
                fill = np.iinfo(np.int64).min if greatest else np.iinfo(np.int64).max
            elif t == "float":
                fill = -np.inf if greatest else np.inf
            else:
                fill = not greatest
            stack = np.stack([np.where(a.valid, a.values, fill) for a in args])
            r = stack.max(axis=0) if greatest else stack.min(axis=0)
            return Vector(np.where(valid, r, args[0].values), valid, t)
        out = np.empty(self.n, dtype=object)
        for i in range(self.n):
            present = [a.values[i] for a in args if a.valid[i]]
            out[i] = (max(present) if greatest else min(present)) if (present and valid[i]) else None
        return Vector(out, valid, t)

    def _choose(self, conditions: list[tuple[np.ndarray, Vector]], default: Vector,
                node: exp.Expression) -> Vector:
        values = [v for _, v in conditions] + [default]
        values, t = self._unify(values, node)
        out_vals = values[-1].values.copy()
        out_valid = values[-1].valid.copy()
        taken = np.zeros(self.n, dtype=bool)
        for (cond, _), v in zip(conditions, values):
            pick = cond & ~taken
            out_vals = np.where(pick, v.values, out_vals)
            out_valid = np.where(pick, v.valid, out_valid)
            taken |= pick
        if t in ("text", "date", "timestamp"):
            out_vals = np.asarray(out_vals, dtype=object)
        return Vector(out_vals, out_valid.astype(bool), t)

    def case(self, node: exp.Case) -> Vector:
        """CASE [operand] WHEN … THEN … [ELSE …] END (the first TRUE branch; NULL conditions are not TRUE)."""
        operand = node.args.get("this")
        conditions = []
        for branch in node.args.get("ifs") or []:
            if operand is not None:
                true, _ = self._compare(exp.EQ, operand, branch.this, node)
            else:
                true, _ = self.truth(branch.this)
            conditions.append((true, self.ev(branch.args["true"])))
        default = node.args.get("default")
        return self._choose(conditions, self.ev(default) if default is not None else _null(self.n), node)

    def if_(self, node: exp.If) -> Vector:
        """IF/IIF(condition, then, else)."""
        true, _ = self.truth(node.this)
        other = node.args.get("false")
        return self._choose([(true, self.ev(node.args["true"]))],
                            self.ev(other) if other is not None else _null(self.n), node)

    def coalesce(self, node: exp.Coalesce) -> Vector:
        """COALESCE/IFNULL/NVL: the first non-NULL argument."""
        args = [self.ev(node.this)] + [self.ev(e) for e in node.expressions]
        args, t = self._unify(args, node)
        conditions = [(a.valid, a) for a in args]
        return self._choose(conditions, _convert(_null(self.n), t), node)

    def nullif(self, node: exp.Nullif) -> Vector:
        """NULLIF(a, b): NULL where a = b."""
        v = self.ev(node.this)
        equal, _ = self._compare(exp.EQ, node.this, node.expression, node)
        return Vector(v.values, v.valid & ~equal, v.type)

    # -- casts
    def cast(self, node: exp.Cast) -> Vector:
        """CAST/TRY_CAST/:: with TRY semantics (a failed conversion is NULL)."""
        target, scale = _cast_target(node.args["to"], node)
        return _cast(self.ev(node.this), target, scale)

    # -- comparisons and logic
    def _compare(self, op: type, left: exp.Expression, right: exp.Expression,
                 node: exp.Expression) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.ev(left), self.ev(right)
        a, b = _comparable(a, b, left, right, node)
        known = a.valid & b.valid
        fn = _CMP_OPS[op]
        if a.values.dtype.kind == "O" or b.values.dtype.kind == "O":
            if not known.any():
                return np.zeros(self.n, dtype=bool), known
            # NULL positions get a valid value of the same type (their result is masked anyway),
            # so that NumPy's object loop compares Python values without meeting None
            av, bv = _filled(a.values, known), _filled(b.values, known)
            r = np.asarray(fn(av, bv), dtype=bool)
        else:
            with np.errstate(invalid="ignore"):
                r = np.asarray(fn(a.values, b.values), dtype=bool)
        return r & known, known

    def comparison(self, node: exp.Expression) -> Vector:
        """= <> < <= > >= (NULL if either side is NULL)."""
        true, known = self._compare(type(node), node.this, node.expression, node)
        return Vector(true, known, "bool")

    def null_safe(self, node: exp.Expression) -> Vector:
        """IS [NOT] DISTINCT FROM (never NULL)."""
        a, b = self.ev(node.this), self.ev(node.expression)
        true, _ = self._compare(exp.EQ, node.this, node.expression, node)
        same = true | (~a.valid & ~b.valid)
        if isinstance(node, exp.NullSafeNEQ):
            same = ~same
        return Vector(same, np.ones(self.n, dtype=bool), "bool")

    def not_(self, node: exp.Not) -> Vector:
        """NOT (three-valued)."""
        true, known = self.truth(node.this)
        return Vector(~true & known, known, "bool")

    def and_or(self, node: exp.Expression) -> Vector:
        """AND / OR (three-valued)."""
        a, ka = self.truth(node.this)
        b, kb = self.truth(node.expression)
        true, known = _and3(a, ka, b, kb) if isinstance(node, exp.And) else _or3(a, ka, b, kb)
        return Vector(true, known, "bool")

    def in_(self, node: exp.In) -> Vector:
        """x IN (list) (three-valued)."""
        for arg in ("query", "unnest", "field"):
            if node.args.get(arg) is not None:
                raise ExpressionError(f"{_snippet(node)}: IN takes a list of values here", node)
        true = np.zeros(self.n, dtype=bool)
        unknown = np.zeros(self.n, dtype=bool)
        for e in node.expressions:
            t, k = self._compare(exp.EQ, node.this, e, node)
            true |= t
            unknown |= ~k
        return Vector(true, true | ~unknown, "bool")

    def between(self, node: exp.Between) -> Vector:
        """x BETWEEN lo AND hi."""
        if node.args.get("symmetric"):
            raise ExpressionError("BETWEEN SYMMETRIC is not supported", node)
        a, ka = self._compare(exp.GTE, node.this, node.args["low"], node)
        b, kb = self._compare(exp.LTE, node.this, node.args["high"], node)
        true, known = _and3(a, ka, b, kb)
        return Vector(true, known, "bool")

    def is_(self, node: exp.Is) -> Vector:
        """IS [NOT] NULL / TRUE / FALSE (never NULL)."""
        target = node.expression
        if isinstance(target, exp.Null):
            v = self.ev(node.this)
            r = ~v.valid
        elif isinstance(target, exp.Boolean):
            true, known = self.truth(node.this)
            r = (true if target.this else (known & ~true))
        else:
            raise ExpressionError(f"{_snippet(node)}: IS takes NULL, TRUE or FALSE", node)
        if node.args.get("negate"):
            r = ~r
        return Vector(r, np.ones(self.n, dtype=bool), "bool")

    # -- text
    def concat(self, node: exp.Expression) -> Vector:
        """|| (NULL propagates) and CONCAT (NULLs skipped where the dialect skips them)."""
        if isinstance(node, exp.DPipe):
            parts = [self.ev(node.this), self.ev(node.expression)]
            skip_nulls = False
        else:
            parts = [self.ev(e) for e in node.expressions]
            skip_nulls = bool(node.args.get("coalesce"))
        texts = [_cast(p, "text", None) for p in parts]
        valid = np.ones(self.n, dtype=bool)
        if not skip_nulls:
            for t in texts:
                valid &= t.valid
        out = np.full(self.n, "", dtype=object)
        for t in texts:  # NumPy's object loop: Python str + str per row
            out = out + np.where(t.valid, t.values, "")
        out[~valid] = None
        return Vector(out, valid, "text")

    def text_fn(self, node: exp.Expression) -> Vector:
        """UPPER, LOWER, LENGTH of text."""
        v = self.ev(node.this)
        if v.type not in ("text", "null"):
            raise ExpressionError(f"{_snippet(node)} takes text, got {v.type}", node)
        v = _convert(v, "text")
        if isinstance(node, exp.Length):
            vals = np.array([len(x) if ok else 0 for x, ok in zip(v.values, v.valid)], dtype=np.int64)
            return Vector(vals, v.valid, "int")
        fn = str.upper if isinstance(node, exp.Upper) else str.lower
        out = np.empty(self.n, dtype=object)
        out[:] = [fn(x) if ok else None for x, ok in zip(v.values, v.valid)]
        return Vector(out, v.valid, "text")


def _filled(values: np.ndarray, known: np.ndarray) -> np.ndarray:
    """``values`` with the positions not ``known`` replaced by a known value (object arrays)."""
    if values.dtype.kind != "O" or known.all():
        return values
    out = values.copy()
    out[~known] = values[np.argmax(known)]
    return out


def _and3(a: np.ndarray, ka: np.ndarray, b: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three-valued AND of (true, known) pairs: false if either is known false."""
    true = a & b
    false = (ka & ~a) | (kb & ~b)
    return true, true | false


def _or3(a: np.ndarray, ka: np.ndarray, b: np.ndarray, kb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Three-valued OR: true if either is true, false only if both are known false."""
    true = a | b
    false = ka & ~a & kb & ~b
    return true, true | false


def _refuse(node: exp.Expression) -> None:
    if isinstance(node, _NONDET_NODES) or (
            isinstance(node, exp.Anonymous) and str(node.name).upper() in NONDETERMINISTIC_FUNCTIONS):
        raise ExpressionError(
            f"non-deterministic {_snippet(node)} is not allowed: a release must be a function of its "
            "noisy values alone", node)
    if isinstance(node, exp.AggFunc):
        raise ExpressionError(f"{_snippet(node)}: an aggregate of released values is not supported", node)
    if isinstance(node, exp.Window):
        raise ExpressionError(f"{_snippet(node)}: window functions are not supported", node)
    if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
        raise ExpressionError(f"{_snippet(node)}: subqueries are not supported in post-processing", node)
    if isinstance(node, exp.Star):
        raise ExpressionError("* is not a released cell", node)
    if isinstance(node, (exp.Placeholder, exp.Parameter)):
        raise ExpressionError(f"{_snippet(node)}: query parameters are not supported", node)
    name = node.sql_name() if isinstance(node, exp.Func) else type(node).__name__
    if isinstance(node, exp.Anonymous):
        name = str(node.name).upper()
    raise ExpressionError(f"{name} ({_snippet(node)}) is not supported in post-processing", node)


def _comparable(a: Vector, b: Vector, left: exp.Expression, right: exp.Expression,
                node: exp.Expression) -> tuple[Vector, Vector]:
    """Bring two comparison operands to one type (string literals cast to the other side's type)."""
    if a.type == b.type or "null" in (a.type, b.type):
        t = b.type if a.type == "null" else a.type
        return _convert(a, t), _convert(b, t)
    numeric = {"int", "float"}
    if a.type in numeric and b.type in numeric:
        if a.type == "int" and b.type == "int":
            return a, b
        return _convert(a, "float"), _convert(b, "float")
    if {a.type, b.type} <= {"date", "timestamp"}:
        return _convert(a, "timestamp"), _convert(b, "timestamp")
    # a string literal compared with a typed value is read as that type (as SQL engines do)
    if a.type == "text" and isinstance(left, exp.Literal) and b.type != "text":
        return _cast(a, "float" if b.type in numeric else b.type, None), b
    if b.type == "text" and isinstance(right, exp.Literal) and a.type != "text":
        return a, _cast(b, "float" if a.type in numeric else a.type, None)
    # a text key compared with a number literal (``HAVING sex = 1`` on a text key): the key is
    # read as a number, NULL where it is not one (DuckDB's implicit cast, with TRY semantics)
    if a.type == "text" and b.type in numeric and _is_number_literal(right):
        return _cast(a, "float", None), _convert(b, "float")
    if b.type == "text" and a.type in numeric and _is_number_literal(left):
        return _convert(a, "float"), _cast(b, "float", None)
    if {a.type, b.type} <= {"int", "float", "bool"}:
        return _cast(a, "float", None), _cast(b, "float", None)
    raise ExpressionError(f"{_snippet(node)} compares {a.type} with {b.type}", node)


def _is_number_literal(node: exp.Expression) -> bool:
    while isinstance(node, (exp.Paren, exp.Neg)):
        node = node.this
    return isinstance(node, exp.Literal) and not node.is_string


def _parse_bool(s: str) -> bool | None:
    s = s.strip().lower()
    return True if s in _TRUE_TEXT else False if s in _FALSE_TEXT else None


def _parse_number(s: str) -> float | None:
    try:
        f = float(s.strip())
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def _parse_date(s: str) -> _dt.date | None:
    try:
        return _dt.date.fromisoformat(s.strip()[:10])
    except ValueError:
        return None


def _parse_timestamp(s: str) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromisoformat(s.strip())
    except ValueError:
        d = _parse_date(s)
        return _to_timestamp(d) if d is not None else None


def _cast(v: Vector, target: str, scale: int | None) -> Vector:
    """CAST with TRY semantics: a value that does not convert becomes NULL."""
    n = len(v)
    if v.type == "null":
        return _convert(v, target)
    if target == "int":
        if v.type == "int":
            return v
        if v.type == "bool":
            return Vector(v.values.astype(np.int64), v.valid, "int")
        if v.type == "float":
            r = _round_half_away(v.values, 0)
            return _int_checked(np.where(np.abs(r) < INT_LIMIT, r, 0).astype(np.int64), v.valid, r)
        if v.type == "text":
            return _cast(_cast(v, "float", None), "int", None)
        raise ExpressionError(f"a {v.type} value cannot be cast to an integer")
    if target == "float":
        if v.type in ("int", "bool", "float"):
            r = v.values.astype(np.float64)
        elif v.type == "text":
            parsed = [(_parse_number(x) if ok else None) for x, ok in zip(v.values, v.valid)]
            r = np.array([p if p is not None else 0.0 for p in parsed], dtype=np.float64)
            v = Vector(v.values, v.valid & np.array([p is not None for p in parsed], dtype=bool), v.type)
        else:
            raise ExpressionError(f"a {v.type} value cannot be cast to a number")
        if scale is not None:
            r = _round_half_away(r, scale)
        return _float_result(r, v.valid)
    if target == "text":
        if v.type == "text":
            return v
        if v.type in ("int", "float"):
            # NumPy's shortest round-trip repr: 10, 2.5, 3.0, 1e+20 (as DuckDB prints them)
            out = v.values.astype(str).astype(object)
        elif v.type == "bool":
            out = np.where(v.values, "true", "false").astype(object)
        else:
            out = np.empty(n, dtype=object)
            out[:] = [_iso(x) if ok else None for x, ok in zip(v.values, v.valid)]
        out[~v.valid] = None
        return Vector(out, v.valid, "text")
    if target == "bool":
        if v.type == "bool":
            return v
        if v.type in ("int", "float"):
            return Vector(v.values != 0, v.valid, "bool")
        if v.type == "text":
            parsed = [(_parse_bool(x) if ok else None) for x, ok in zip(v.values, v.valid)]
            return Vector(np.array([bool(p) for p in parsed], dtype=bool),
                          np.array([p is not None for p in parsed], dtype=bool), "bool")
        raise ExpressionError(f"a {v.type} value cannot be cast to a boolean")
    if target in ("date", "timestamp"):
        if v.type == target:
            return v
        if v.type == "text":
            parse = _parse_date if target == "date" else _parse_timestamp
            parsed = [(parse(x) if ok else None) for x, ok in zip(v.values, v.valid)]
        elif v.type == "timestamp" and target == "date":
            parsed = [(x.date() if ok else None) for x, ok in zip(v.values, v.valid)]
        elif v.type == "date":
            parsed = [(_to_timestamp(x) if ok else None) for x, ok in zip(v.values, v.valid)]
        else:
            raise ExpressionError(f"a {v.type} value cannot be cast to {target}")
        out = np.empty(n, dtype=object)
        out[:] = parsed
        return Vector(out, np.array([p is not None for p in parsed], dtype=bool), target)
    raise ExpressionError(f"CAST to {target} is not supported")  # pragma: no cover


_DISPATCH: dict[type, Callable[[_Evaluator, Any], Vector]] = {
    exp.Column: _Evaluator.column,
    exp.Literal: _Evaluator.literal,
    exp.Boolean: _Evaluator.boolean,
    exp.Null: _Evaluator.null,
    exp.Paren: _Evaluator.paren,
    exp.Pi: _Evaluator.pi,
    exp.Neg: _Evaluator.neg,
    exp.Add: _Evaluator.arith,
    exp.Sub: _Evaluator.arith,
    exp.Mul: _Evaluator.arith,
    exp.Div: _Evaluator.arith,
    exp.IntDiv: _Evaluator.arith,
    exp.Mod: _Evaluator.arith,
    exp.Pow: _Evaluator.power,
    exp.Sqrt: _Evaluator.unary_math,
    exp.Cbrt: _Evaluator.unary_math,
    exp.Exp: _Evaluator.unary_math,
    exp.Ln: _Evaluator.unary_math,
    exp.Log: _Evaluator.log,
    exp.Round: _Evaluator.round_,
    exp.Trunc: _Evaluator.trunc,
    exp.Floor: _Evaluator.floor_ceil,
    exp.Ceil: _Evaluator.floor_ceil,
    exp.Abs: _Evaluator.abs_,
    exp.Sign: _Evaluator.sign,
    exp.Greatest: _Evaluator.greatest_least,
    exp.Least: _Evaluator.greatest_least,
    exp.Case: _Evaluator.case,
    exp.If: _Evaluator.if_,
    exp.Coalesce: _Evaluator.coalesce,
    exp.Nullif: _Evaluator.nullif,
    exp.Cast: _Evaluator.cast,
    exp.TryCast: _Evaluator.cast,
    exp.EQ: _Evaluator.comparison,
    exp.NEQ: _Evaluator.comparison,
    exp.GT: _Evaluator.comparison,
    exp.GTE: _Evaluator.comparison,
    exp.LT: _Evaluator.comparison,
    exp.LTE: _Evaluator.comparison,
    exp.NullSafeEQ: _Evaluator.null_safe,
    exp.NullSafeNEQ: _Evaluator.null_safe,
    exp.Not: _Evaluator.not_,
    exp.And: _Evaluator.and_or,
    exp.Or: _Evaluator.and_or,
    exp.In: _Evaluator.in_,
    exp.Between: _Evaluator.between,
    exp.Is: _Evaluator.is_,
    exp.DPipe: _Evaluator.concat,
    exp.Concat: _Evaluator.concat,
    exp.Upper: _Evaluator.text_fn,
    exp.Lower: _Evaluator.text_fn,
    exp.Length: _Evaluator.text_fn,
}

#: sqlglot node types the evaluator accepts (children such as DataType and Identifier aside).
SUPPORTED_NODES: frozenset[type] = frozenset(_DISPATCH)
_STRUCTURAL = (exp.Identifier, exp.DataType, exp.DataTypeParam, exp.Var)


def _as_tree(expr: exp.Expression | str, dialect: str) -> exp.Expression:
    if isinstance(expr, exp.Expression):
        return expr
    if not isinstance(expr, str):
        raise ExpressionError(f"expected a sqlglot expression or SQL text, got {type(expr).__name__}")
    try:
        return sqlglot.parse_one(expr, read=dialect)
    except sqlglot.errors.ParseError as e:
        raise ExpressionError(f"the expression does not parse: {str(e).splitlines()[0]}") from None


def _cells_of(cells: Mapping[str, Any], rows: int | None) -> tuple[dict[str, Vector], int]:
    vectors = {name: Vector.of(v) for name, v in cells.items()}
    lengths = {len(v) for v in vectors.values()}
    if rows is not None:
        lengths.add(int(rows))
    if len(lengths) > 1:
        raise ExpressionError(f"cells have different lengths: {sorted(lengths)}")
    return vectors, (lengths.pop() if lengths else 1)


def evaluate(expr: exp.Expression | str, cells: Mapping[str, Any], *, rows: int | None = None,
             dialect: str = "duckdb") -> Vector:
    """Evaluate a post-processing expression over released cells (vectorised, SQL NULL semantics).

    Args:
        expr: a sqlglot expression (or SQL text, parsed in ``dialect``) whose column
            references name cells; unqualified names only.
        cells: cell name → 1-D values, one per released row: a :class:`Vector`, a
            NumPy array or a sequence (see :meth:`Vector.of` for NULLs and types).
        rows: number of rows; needed only when ``cells`` is empty (default 1 then).
        dialect: sqlglot dialect used to parse ``expr`` when it is text.

    Returns:
        A :class:`Vector` of the expression's values (NULL where SQL gives NULL,
        and wherever a float result is not finite).

    Raises:
        ExpressionError: an unsupported or non-deterministic construct, an unknown
            cell, operand types that do not fit, cells of different lengths. Never
            for values (division by zero and the like give NULL).
    """
    tree = _as_tree(expr, dialect)
    vectors, n = _cells_of(cells, rows)
    return _Evaluator(vectors, n).ev(tree)


def evaluate_predicate(predicate: exp.Expression | str, values: Mapping[str, Any], *,
                       rows: int | None = None, dialect: str = "duckdb") -> np.ndarray:
    """Evaluate a HAVING predicate over released (noisy) values: the rows to keep.

    SQL three-valued logic: a row is kept only where the predicate is TRUE (NULL,
    i.e. a suppressed cell, makes a comparison unknown, and unknown rows are
    dropped). Division by zero gives NULL. This is post-processing: it reads only
    noisy values and public keys.

    Args:
        predicate: a sqlglot expression or SQL text (e.g. ``plan.having``).
        values: cell name → 1-D values (see :func:`evaluate`).
        rows, dialect: as for :func:`evaluate`.

    Returns:
        Boolean array, True for rows to keep.

    Raises:
        ExpressionError (a ``ValueError``): as for :func:`evaluate`, or a predicate
            whose value is text or a date.
    """
    tree = _as_tree(predicate, dialect)
    vectors, n = _cells_of(values, rows)
    true, _ = _Evaluator(vectors, n).truth(tree)
    return np.asarray(true, dtype=bool)


def check_postprocess_expression(expr: exp.Expression, cell_names: Collection[str] | Mapping[str, str],
                                 *, dialect: str = "duckdb") -> None:
    """Planning-time check of a post-processing expression (select list, HAVING, ORDER BY).

    Walks the whole tree: every node must be one the evaluator supports, every
    column reference must name a cell, and non-deterministic functions
    (:data:`NONDETERMINISTIC_FUNCTIONS`: ``RANDOM``, ``NOW``,
    ``CURRENT_DATE``, …) are refused. When ``cell_names`` maps names to value
    types (:data:`VALUE_TYPES`), the expression is also type-checked by
    evaluating it on zero rows (no data involved), so that a charged release can
    never fail in post-processing.

    Args:
        expr: the expression, with aggregates already replaced by cell references.
        cell_names: the names it may refer to, or name → value type.
        dialect: for parsing ``expr`` when it is text.

    Raises:
        UnsupportedQuery: naming the construct (``details["construct"]``).
    """
    try:
        tree = _as_tree(expr, dialect)
        for node in tree.walk():
            if isinstance(node, _STRUCTURAL):
                continue
            if type(node) not in _DISPATCH:
                _refuse(node)
            if isinstance(node, exp.Column):
                _Evaluator({name: _null(0) for name in cell_names}, 0).column(node)
        if isinstance(cell_names, Mapping):
            typed = {}
            for name, t in cell_names.items():
                if t not in VALUE_TYPES:
                    raise ValueError(f"unknown value type {t!r} for cell {name!r}")
                typed[name] = _convert(_null(0), t) if t != "null" else _null(0)
            _Evaluator(typed, 0).ev(tree)
    except ExpressionError as e:
        details = {"construct": e.construct} if e.construct else {}
        raise UnsupportedQuery(str(e), details) from None


# --- ORDER BY and LIMIT ------------------------------------------------------------------------------


def _ranks(v: Vector, index: np.ndarray) -> np.ndarray:
    """Dense ranks (0, 1, …) of the valid values of ``v`` at ``index``; −1 at NULLs."""
    sub_valid = v.valid[index]
    ranks = np.full(len(index), -1, dtype=np.int64)
    present = index[sub_valid]
    if len(present) == 0:
        return ranks
    _, inverse = np.unique(v.values[present], return_inverse=True)  # object arrays: one Python type
    ranks[sub_valid] = inverse.reshape(-1)
    return ranks


def sort_rows(keys: Sequence[tuple[Any, bool, bool]], order: np.ndarray | None = None, *,
              rows: int | None = None) -> np.ndarray:
    """Stable multi-key sort of row indices with SQL NULL placement.

    Args:
        keys: ``(values, descending, nulls_first)`` per ORDER BY item, most
            significant first; ``values`` is a :class:`Vector` or array over *all*
            rows (NULL = None/NaN).
        order: the row indices to sort (default: all rows, ``0..n-1``), e.g. the
            rows HAVING kept; ties keep this order.
        rows: number of rows when ``keys`` is empty and ``order`` is None.

    Returns:
        The indices of ``order`` rearranged (int64 array).
    """
    vectors = [(Vector.of(v), bool(d), bool(nf)) for v, d, nf in keys]
    if order is None:
        n = len(vectors[0][0]) if vectors else int(rows or 0)
        order = np.arange(n, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    if not vectors or len(order) <= 1:
        return order
    columns = []
    big = len(order) + 1
    for v, descending, nulls_first in vectors:
        r = _ranks(v, order)
        null = r < 0
        r = -r if descending else r
        r = np.where(null, -big if nulls_first else big, r)
        columns.append(r)
    # np.lexsort sorts by the last key first; the position breaks ties (stability).
    perm = np.lexsort([np.arange(len(order))] + columns[::-1])
    return order[perm]


def order_by(items: Sequence[exp.Ordered | exp.Expression], cells: Mapping[str, Any], *,
             order: np.ndarray | None = None, rows: int | None = None,
             dialect: str = "duckdb") -> np.ndarray:
    """ORDER BY over post-processing expressions: evaluate each item and sort.

    Args:
        items: sqlglot ``Ordered`` nodes (their ``desc`` and ``nulls_first`` are
            used; sqlglot sets ``nulls_first`` from the dialect's default NULL
            ordering when the query does not say) or bare expressions (ascending,
            NULLS LAST).
        cells: as for :func:`evaluate`.
        order: the row indices to sort (default all rows).
        rows, dialect: as for :func:`evaluate`.

    Returns:
        Row indices in the requested order (stable; ties keep ``order``).

    Raises:
        ExpressionError: as for :func:`evaluate`.
    """
    vectors, n = _cells_of(cells, rows)
    ev = _Evaluator(vectors, n)
    keys = []
    for item in items:
        if isinstance(item, exp.Ordered):
            keys.append((ev.ev(item.this), bool(item.args.get("desc")), bool(item.args.get("nulls_first"))))
        else:
            keys.append((ev.ev(_as_tree(item, dialect)), False, False))
    return sort_rows(keys, order, rows=n)


def limit_rows(order: np.ndarray, limit: int | None, offset: int = 0) -> np.ndarray:
    """``order[offset : offset + limit]`` (LIMIT/OFFSET on sorted row indices; None = no limit).

    Raises:
        ValueError: a negative limit or offset.
    """
    if (limit is not None and limit < 0) or offset < 0:
        raise ValueError("LIMIT and OFFSET must be >= 0")
    end = None if limit is None else offset + int(limit)
    return np.asarray(order)[int(offset):end]


