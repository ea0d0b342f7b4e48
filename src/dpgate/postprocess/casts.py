"""CAST and comparison operands in post-processing: CAST targets (:class:`CastSpec`), text →
bool/number/date/timestamp, the cast of a :class:`~dpgate.postprocess.vectors.Vector` (a value
that does not convert, or that the target cannot hold, gives NULL), the planning-time refusal of
a CAST that could fail after the charge (:func:`refuse_unsafe_cast`), and the coercion of a
comparison's two sides.

Numbers convert as DuckDB converts them (``tests/test_postprocess_types.py`` compares with DuckDB
on the same values): a double → integer type is the nearest integer, ties to even (2.5 → 2),
NULL outside the type's range (TINYINT −128 … 127, UTINYINT 0 … 255, …; integers are 64-bit
here, so HUGEINT/UBIGINT/UHUGEINT hold what int64 holds and a value beyond is NULL); text →
integer rounds ties away from zero; DECIMAL(p, s) is x · 10^s rounded half away from zero, NULL
unless below 10^p in magnitude, released as the nearest double of that decimal (DuckDB's
DECIMAL is DECIMAL(18, 3); PostgreSQL's NUMERIC without precision keeps the value); FLOAT/REAL
rounds to float32 (NULL beyond ±3.4·10^38); VARCHAR prints the shortest round-trip text
(``1327.0``, ``1e+16``).

Part of :mod:`dpgate.postprocess.expressions`.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import dataclass
from typing import Any, Callable, Collection

import numpy as np
from sqlglot import exp

from dpgate.postprocess.vectors import (
    ExpressionError,
    Vector,
    _convert,
    _float_result,
    _iso,
    _snippet,
    _std_round,
    _to_timestamp,
)

_T = exp.DataType.Type
_TEXT_TYPES = frozenset(exp.DataType.TEXT_TYPES)
_DATE_TYPES = frozenset({_T.DATE, _T.DATE32})
_TIMESTAMP_TYPES = frozenset(exp.DataType.TEMPORAL_TYPES) - _DATE_TYPES - frozenset({_T.TIME, _T.TIMETZ})
_TRUE_TEXT = frozenset({"true", "t", "yes", "y", "1", "on"})
_FALSE_TEXT = frozenset({"false", "f", "no", "n", "0", "off"})
#: the integer CAST targets and the values each holds (DuckDB's HUGEINT is sqlglot's INT128)
_INT_RANGES: dict[Any, tuple[int, int]] = {
    _T.TINYINT: (-2 ** 7, 2 ** 7 - 1), _T.SMALLINT: (-2 ** 15, 2 ** 15 - 1),
    _T.MEDIUMINT: (-2 ** 23, 2 ** 23 - 1), _T.INT: (-2 ** 31, 2 ** 31 - 1),
    _T.BIGINT: (-2 ** 63, 2 ** 63 - 1), _T.INT128: (-2 ** 127, 2 ** 127 - 1),
    _T.INT256: (-2 ** 255, 2 ** 255 - 1), _T.UTINYINT: (0, 2 ** 8 - 1), _T.USMALLINT: (0, 2 ** 16 - 1),
    _T.UMEDIUMINT: (0, 2 ** 24 - 1), _T.UINT: (0, 2 ** 32 - 1), _T.UBIGINT: (0, 2 ** 64 - 1),
    _T.UINT128: (0, 2 ** 128 - 1), _T.UINT256: (0, 2 ** 256 - 1),
}
_DUCKDB_NAMES = {_T.INT128: "HUGEINT", _T.UINT128: "UHUGEINT", _T.INT: "INTEGER", _T.UINT: "UINTEGER"}
_DECIMAL_TYPES = frozenset({_T.DECIMAL, _T.BIGDECIMAL, _T.DECIMAL32, _T.DECIMAL64, _T.DECIMAL128,
                            _T.DECIMAL256})
_I64 = (-2 ** 63, 2 ** 63 - 1)
_F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class CastSpec:
    """A CAST target: its value type and the values it holds.

    Attributes:
        kind: the result's value type (``int``, ``float``, ``text``, ``bool``, ``date``, ``timestamp``).
        name: the target as SQL (``TINYINT``, ``DECIMAL(5,2)``), for messages.
        int_range: (lowest, highest) integer an integer target holds, or None.
        precision, scale: a DECIMAL(p, s) target's, or None (DOUBLE; an unconstrained NUMERIC).
        single: a 4-byte float target (FLOAT/REAL: rounded to float32, |x| ≤ 3.4·10^38).
    """

    kind: str
    name: str = ""
    int_range: tuple[int, int] | None = None
    precision: int | None = None
    scale: int | None = None
    single: bool = False

    @property
    def bounded(self) -> bool:
        """Whether some finite double is out of this target's range."""
        return self.int_range is not None or self.precision is not None or self.single

    def holds(self, lo: float, hi: float) -> bool:
        """Whether every number in [lo, hi] converts without leaving the target's range."""
        if self.int_range is not None:
            return self.int_range[0] <= lo and hi <= self.int_range[1]
        if self.precision is not None:
            return max(abs(lo), abs(hi)) < 10 ** (self.precision - self.scale) - 10.0 ** -self.scale
        if self.single:
            return max(abs(lo), abs(hi)) <= _F32_MAX
        return True

    def holds_text(self) -> str:
        """What the target holds, for messages."""
        if self.int_range is not None:
            lo, hi = self.int_range
            return f"{self.name} holds {lo} … {hi}" if hi < 2 ** 64 else f"{self.name} holds {lo:.3g} … {hi:.3g}"
        if self.precision is not None:
            return f"{self.name} holds less than 10^{self.precision - self.scale} in magnitude"
        return f"{self.name} holds at most 3.4e38 in magnitude"


def _cast_spec(dtype: exp.DataType, node: exp.Expression) -> CastSpec:
    """The :class:`CastSpec` of a CAST target (ExpressionError for a target not supported)."""
    t = dtype.this
    name = _DUCKDB_NAMES.get(t) or dtype.sql(dialect="duckdb")
    if t == _T.BOOLEAN:
        return CastSpec("bool", name)
    if t in _INT_RANGES:
        return CastSpec("int", name, int_range=_INT_RANGES[t])
    if t == _T.DOUBLE:
        return CastSpec("float", name)
    if t == _T.FLOAT:
        return CastSpec("float", name, single=True)
    if t in _DECIMAL_TYPES:
        return _decimal_spec(dtype, name, node)
    if t in _TEXT_TYPES:
        return CastSpec("text", name)
    if t in _DATE_TYPES:
        return CastSpec("date", name)
    if t in _TIMESTAMP_TYPES:
        return CastSpec("timestamp", name)
    raise ExpressionError(f"CAST to {name} is not supported in post-processing (integer types, "
                          "DECIMAL(p, s), DOUBLE, FLOAT, VARCHAR, BOOLEAN, DATE, TIMESTAMP are)", node)


def _decimal_spec(dtype: exp.DataType, name: str, node: exp.Expression) -> CastSpec:
    params = dtype.expressions
    if not params:  # NUMERIC without precision (PostgreSQL): any value, unrounded
        return CastSpec("float", name)
    try:
        values = [int(p.this.this if isinstance(p, exp.DataTypeParam) else p.this) for p in params]
    except (AttributeError, TypeError, ValueError):
        raise ExpressionError(f"CAST to {name}: the precision and scale must be integers", node) from None
    precision, scale = values[0], (values[1] if len(values) > 1 else 0)
    if len(values) > 2 or not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise ExpressionError(f"CAST to {name}: DECIMAL(p, s) needs 1 ≤ p ≤ 38 and 0 ≤ s ≤ p", node)
    return CastSpec("float", name, precision=precision, scale=scale)


def _cast_target(dtype: exp.DataType, node: exp.Expression) -> tuple[str, int | None]:
    """(value type, decimal scale or None) of a CAST target."""
    spec = _cast_spec(dtype, node)
    return spec.kind, spec.scale


#: the values a vector of each numeric value type can hold
_TYPE_RANGES: dict[str, tuple[float, float]] = {"int": _I64, "bool": (0, 1),
                "float": (-float(np.finfo(np.float64).max), float(np.finfo(np.float64).max))}


def refuse_unsafe_cast(node: exp.Cast, spec: CastSpec, operand: Vector, noisy: Collection[str] | None,
                       constant: Callable[[exp.Expression], Vector]) -> None:
    """Planning time: refuse a plain CAST (not TRY_CAST) that could fail after the charge.

    * over a noisy value (one that reads a cell in ``noisy``; None: every cell): refused when the
      target cannot hold every value of the operand's type — a released value carries noise, so
      it can take any value of its type (an AVG any double, a count any 64-bit integer) — except
      integer targets of 64 bits or more (BIGINT, HUGEINT), which hold every released integer and
      give NULL for a double beyond int64;
    * over a constant: refused when the constant does not convert (as DuckDB refuses it).

    Public group keys keep TRY semantics (a key that does not convert is NULL), as documented.

    Raises:
        ExpressionError: naming the CAST, what the target holds and the TRY_CAST to write.
    """
    if isinstance(node, exp.TryCast) or node.args.get("safe"):
        return
    columns = [c.name for c in node.this.find_all(exp.Column)]
    if not columns:
        value = constant(node.this)
        if value.valid.any() and not _cast(value, spec).valid.any():
            raise ExpressionError(
                f"{_snippet(node)} fails: the value does not convert to {spec.name}; TRY_CAST gives NULL "
                "instead", node)
        return
    if noisy is not None and not any(c in noisy for c in columns):
        return
    if operand.type not in _TYPE_RANGES or not spec.bounded or spec.holds(*_TYPE_RANGES[operand.type]):
        return
    if spec.int_range is not None and spec.holds(*_I64):
        # BIGINT / HUGEINT: a released count or sum is a 64-bit integer (the samplers' i64), so the
        # analyst's everyday CAST(COUNT(*) AS BIGINT) holds it; a double beyond int64 (an AVG of a
        # column bounded beyond 9.2e18) is NULL there, as TRY_CAST (documented), not an error
        return
    raise ExpressionError(
        f"{_snippet(node)} could fail after the charge: a released value carries noise, so it can take "
        f"a value out of the target's range ({spec.holds_text()}), and CAST raises there. Write "
        f"TRY_CAST({_snippet(node.this)} AS {spec.name}), which gives NULL for a value out of range, or "
        "CAST to DOUBLE or VARCHAR", node)


def _to_int(v: Vector, spec: CastSpec) -> Vector:
    """An integer CAST: doubles to the nearest integer, ties to even (DuckDB's double → integer
    cast: 2.5 → 2, 3.5 → 4), text as a number with ties away from zero (DuckDB's text → integer);
    NULL outside the target's range (held here within int64: a value beyond is NULL)."""
    lo, hi = spec.int_range or _I64
    lo, hi = max(lo, _I64[0]), min(hi, _I64[1])
    if v.type == "bool":
        vals = v.values.astype(np.int64)
        return Vector(vals, v.valid & (vals >= lo) & (vals <= hi), "int")
    if v.type == "int":
        return Vector(v.values, v.valid & (v.values >= lo) & (v.values <= hi), "int")
    if v.type == "float":
        r = np.rint(v.values)
    elif v.type == "text":
        f = _cast(v, "float")
        v, r = f, _std_round(f.values)
    else:
        raise ExpressionError(f"a value of type {v.type} cannot be cast to an integer")
    with np.errstate(invalid="ignore"):
        # hi + 1 and lo are powers of two here, exact as doubles (2^63 − 1 + 1 = 2^63)
        ok = v.valid & (r >= float(lo)) & (r < float(hi) + 1.0)
    return Vector(np.where(ok, r, 0.0).astype(np.int64), ok, "int")


def _to_float(v: Vector, spec: CastSpec) -> Vector:
    """DOUBLE, FLOAT (rounded to float32; beyond ±3.4·10^38 NULL) and DECIMAL(p, s): DuckDB's
    double → decimal cast, x · 10^s rounded half away from zero and NULL unless below 10^p in
    magnitude, then released as the nearest double of that decimal; integers exactly."""
    if v.type in ("int", "bool", "float"):
        r = v.values.astype(np.float64)
    elif v.type == "text":
        parsed = [(_parse_number(x) if ok else None) for x, ok in zip(v.values, v.valid)]
        r = np.array([p if p is not None else 0.0 for p in parsed], dtype=np.float64)
        v = Vector(v.values, v.valid & np.array([p is not None for p in parsed], dtype=bool), v.type)
    else:
        raise ExpressionError(f"a value of type {v.type} cannot be cast to a number")
    valid = v.valid
    with np.errstate(all="ignore"):
        if spec.single:
            r = r.astype(np.float32).astype(np.float64)
        elif spec.scale is not None:
            m = 10.0 ** spec.scale
            if v.type in ("int", "bool"):  # exact: |x| < 10^(p − s)
                limit = 10 ** (spec.precision - spec.scale)
                valid = valid & np.array([abs(int(x)) < limit for x in v.values.tolist()], dtype=bool)
            else:
                scaled = _std_round(r * m)
                valid = valid & (np.abs(scaled) < 10.0 ** spec.precision)
                r = scaled / m
    return _float_result(r, valid)


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


def _cast(v: Vector, target: "str | CastSpec", scale: int | None = None) -> Vector:
    """CAST with TRY semantics: a value that does not convert, or that the target cannot hold,
    becomes NULL. Numbers convert as DuckDB converts them (module docstring)."""
    spec = target if isinstance(target, CastSpec) else CastSpec(
        target, precision=None if scale is None else 38, scale=scale)
    target = spec.kind
    n = len(v)
    if v.type == "null":
        return _convert(v, target)
    if target == "int":
        return _to_int(v, spec)
    if target == "float":
        return _to_float(v, spec)
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
