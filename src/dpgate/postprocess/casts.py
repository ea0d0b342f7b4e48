"""CAST and comparison operands in post-processing: CAST targets, text → bool/number/date/timestamp,
the cast of a :class:`~dpgate.postprocess.vectors.Vector` (a failed cast gives NULL), and the
coercion of a comparison's two sides.

Part of :mod:`dpgate.postprocess.expressions`.
"""

from __future__ import annotations

import datetime as _dt
import math

import numpy as np
from sqlglot import exp

from dpgate.postprocess.vectors import (
    INT_LIMIT,
    ExpressionError,
    Vector,
    _convert,
    _float_result,
    _int_checked,
    _iso,
    _round_half_away,
    _snippet,
    _to_timestamp,
)

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
        raise ExpressionError(f"a value of type {v.type} cannot be cast to an integer")
    if target == "float":
        if v.type in ("int", "bool", "float"):
            r = v.values.astype(np.float64)
        elif v.type == "text":
            parsed = [(_parse_number(x) if ok else None) for x, ok in zip(v.values, v.valid)]
            r = np.array([p if p is not None else 0.0 for p in parsed], dtype=np.float64)
            v = Vector(v.values, v.valid & np.array([p is not None for p in parsed], dtype=bool), v.type)
        else:
            raise ExpressionError(f"a value of type {v.type} cannot be cast to a number")
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
        raise ExpressionError(f"a value of type {v.type} cannot be cast to a boolean")
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
            raise ExpressionError(f"a value of type {v.type} cannot be cast to {target}")
        out = np.empty(n, dtype=object)
        out[:] = parsed
        return Vector(out, np.array([p is not None for p in parsed], dtype=bool), target)
    raise ExpressionError(f"CAST to {target} is not supported")  # pragma: no cover
