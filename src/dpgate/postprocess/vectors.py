"""Vectors of released cell values for the post-processing evaluator (:class:`Vector`: values, a
validity mask for SQL NULL, one value type of :data:`VALUE_TYPES`), their conversions, and
:class:`ExpressionError`.

Integers beyond ±:data:`INT_LIMIT` and non-finite floats become NULL (the evaluator is total on
values). Part of :mod:`dpgate.postprocess.expressions`; post-processing of released values
([DR14] Prop. 2.1), no privacy cost.

[DR14] C. Dwork, A. Roth, The Algorithmic Foundations of Differential Privacy, 2014.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Iterable

import numpy as np
from sqlglot import exp

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
        raise ExpressionError(f"a value of type {self.type} is not a number")

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
    raise ExpressionError(f"a value of type {v.type} cannot be used as {t}")


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


def _pow10(k: int) -> float:
    """10.0 ** k as C's ``pow(10, k)`` gives it (inf beyond the double range, 0 below it; no OverflowError)."""
    if k > 308:
        return math.inf
    if k < -400:
        return 0.0
    return 10.0 ** k


def _std_round(x: np.ndarray) -> np.ndarray:
    """C's ``round``: to the nearest integer, halves away from zero (exact: no ``x + 0.5``)."""
    with np.errstate(all="ignore"):
        t = np.trunc(x)
        return t + np.copysign((np.abs(x - t) >= 0.5).astype(np.float64), x)


def _round_half_away(x: np.ndarray, digits: int) -> np.ndarray:
    """SQL ROUND(x, digits) of doubles, as DuckDB computes it: with m = 10^|d|, ``round(x · m) / m``
    for d ≥ 0 (x itself where that is not finite: d beyond the double range) and ``round(x / m) · m``
    for d < 0 (0 where that is not finite: ROUND(x, -400) = 0); halves away from zero, a half
    that only the double product x · m shows (2.675 · 100 = 267.5) decided on the exact product
    for 0 ≤ d ≤ 22, where m is exact (ROUND(2.675, 2) = 2.67). Total for every integer ``digits``."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if digits < 0:
            m = _pow10(-digits)
            r = _std_round(x / m) * m
            return np.where(np.isfinite(r), r, 0.0)
        m = _pow10(digits)
        y = x * m
        r = _std_round(y)
        if digits <= 22:
            ties = np.flatnonzero(np.isfinite(y) & (np.abs(y - np.trunc(y)) == 0.5))
            for i in ties.tolist():  # rare: the exact product decides (it is below or above the half)
                q = Fraction(float(x[i])) * Fraction(m)
                n = math.floor(abs(q))
                n += 1 if abs(q) - n >= Fraction(1, 2) else 0
                r[i] = float(n if q >= 0 else -n)
        r = r / m
        return np.where(np.isfinite(r), r, x)


def _trunc_digits(x: np.ndarray, digits: int) -> np.ndarray:
    """SQL TRUNC(x, digits) of doubles, as DuckDB computes it: with m = 10^|d|, ``trunc(x · m) / m``
    for d ≥ 0 and ``trunc(x / m) · m`` for d < 0; x itself where that is not finite (TRUNC(x, 400)
    and TRUNC(x, -400) are x, as in DuckDB). Total for every integer ``digits``."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        if digits < 0:
            m = _pow10(-digits)
            r = np.trunc(x / m) * m
        else:
            m = _pow10(digits)
            r = np.trunc(x * m) / m
        return np.where(np.isfinite(r), r, x)


def _int_round_digits(v: "Vector", digits: int, *, truncate: bool) -> "Vector":
    """ROUND/TRUNC(x, digits) of an integer vector (digits < 0: to a multiple of 10^−digits;
    halves away from zero for ROUND), exact (unsigned 64-bit magnitudes); a result beyond int64
    is NULL (DuckDB raises "Overflow in ROUND of integer")."""
    if digits >= 0:
        return v
    k = -digits
    x = np.where(v.valid, v.values, 0).astype(np.int64)
    neg = x < 0
    mag = np.where(neg, (-(x + 1)).astype(np.uint64) + np.uint64(1), x.astype(np.uint64))  # |x|, INT64_MIN too
    if k >= 19:  # 10^19 > |x| for every int64: 0, or ±10^19 (beyond int64) when ROUND(x, -19) reaches the half
        over = (mag >= np.uint64(5 * 10 ** 18)) if (k == 19 and not truncate) else np.zeros(len(v), dtype=bool)
        return Vector(np.zeros(len(v), dtype=np.int64), v.valid & ~over, "int")
    f = np.uint64(10 ** k)
    q, rem = np.divmod(mag, f)
    if not truncate:
        q = q + (rem >= f - rem).astype(np.uint64)
    r = q * f  # ≤ |x| + 10^18 < 2^64: no wrap
    ok = v.valid & np.where(neg, r <= np.uint64(2 ** 63), r < np.uint64(2 ** 63))
    r = np.where(ok, r, np.uint64(0))
    pos = r.astype(np.int64)  # wraps only at r = 2^63 (negative results), fixed below
    negv = -((r - np.uint64(1)).astype(np.int64)) - 1
    out = np.where(neg & (r > 0), negv, pos)
    return Vector(np.where(ok, out, 0).astype(np.int64), ok, "int")
