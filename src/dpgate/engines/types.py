"""Types in bounded queries: the declared types of the columns a query reads (the group hash's
integer inputs), date parts and intervals, and the literal/float helpers every engine's rewrite
builds on (split from :mod:`dpgate.engines.base`). The static type of a row expression's nodes is
the planner's (:mod:`dpgate.sql.node_types`, read through :func:`dpgate.rendered.type_of`)."""

from __future__ import annotations

import re
from sqlglot import exp

from dpgate.policy import DatasetPolicy
from dpgate.engines.base import relations

#: Type names the engines' transforms cast to, built without parsing (``DataType.build`` parses
#: its argument); each equals ``exp.DataType.build(name)`` (tests/test_render_trees.py).
_DATATYPES = {"varchar": exp.DataType.Type.VARCHAR, "bigint": exp.DataType.Type.BIGINT,
              "double": exp.DataType.Type.DOUBLE, "date": exp.DataType.Type.DATE,
              "timestamp": exp.DataType.Type.TIMESTAMP, "numeric": exp.DataType.Type.DECIMAL,
              "timestamp_ntz": exp.DataType.Type.TIMESTAMPNTZ}


def datatype(name: str) -> exp.DataType:
    """``exp.DataType.build(name)`` for the plain type names of :data:`_DATATYPES`, without a parse
    (``decimal(38, 0)``: DECIMAL with its two parameters)."""
    key = name.lower()
    if key == "decimal(38, 0)":
        return exp.DataType(this=exp.DataType.Type.DECIMAL, nested=False, expressions=[
            exp.DataTypeParam(this=exp.Literal.number(38)), exp.DataTypeParam(this=exp.Literal.number(0))])
    return exp.DataType(this=_DATATYPES[key], nested=False)


# ---------------------------------------------------------------------------- predicates


#: Declared types whose values are dates or instants (``dpgate.policy.TEMPORAL_TYPES``).
TEMPORAL = ("date", "timestamp")

#: Date parts the planner admits (``dpgate.sql.bind``), by every spelling DuckDB reads, → the
#: canonical name each engine's rewrite works with.
DATE_PARTS = {
    "year": "year", "quarter": "quarter", "month": "month", "week": "week", "weekofyear": "week",
    "day": "day", "dayofmonth": "day", "dow": "dow", "dayofweek": "dow", "isodow": "isodow",
    "doy": "doy", "dayofyear": "doy", "hour": "hour", "minute": "minute", "second": "second",
}
_PART_FUNCTIONS = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day",
    exp.DayOfMonth: "day", exp.DayOfWeek: "dow", exp.DayOfYear: "doy", exp.Hour: "hour",
    exp.Minute: "minute", exp.Second: "second", exp.WeekOfYear: "week", exp.Week: "week",
}
#: Upper bound, in days, of one unit of a constant INTERVAL (a month is at most 31 days…).
_INTERVAL_DAYS = {"year": 366, "quarter": 92, "month": 31, "week": 7, "day": 1, "hour": 1, "minute": 1,
                  "second": 1}


def temporal_type(to: exp.Expression | None) -> str | None:
    """``"date"`` or ``"timestamp"`` for a DATE / TIMESTAMP data type, else None."""
    if not isinstance(to, exp.DataType):
        return None
    T = exp.DataType.Type
    if to.this == T.DATE:
        return "date"
    if to.this in (T.TIMESTAMP, T.TIMESTAMPNTZ, T.DATETIME):
        return "timestamp"
    return None


def date_part_call(node: exp.Expression) -> tuple[str, exp.Expression] | None:
    """(canonical part, argument) of ``EXTRACT(part FROM d)``, ``date_part('part', d)``,
    ``YEAR(d)``, ``MONTH(d)`` …, or None (not a date part, or a part the planner refuses)."""
    if isinstance(node, exp.Extract):
        name, arg = node.this.name.lower(), node.expression
    elif isinstance(node, exp.Anonymous) and node.name.lower() in ("date_part", "datepart"):
        if len(node.expressions) != 2 or not isinstance(node.expressions[0], (exp.Literal, exp.Var)):
            return None
        name, arg = node.expressions[0].name.lower(), node.expressions[1]
    elif type(node) in _PART_FUNCTIONS and isinstance(node.this, exp.Expression):
        name, arg = _PART_FUNCTIONS[type(node)], node.this
    else:
        return None
    part = DATE_PARTS.get(name)
    return (part, arg) if part is not None else None


def interval_days(node: exp.Expression) -> int | None:
    """An upper bound of the magnitude, in whole days, of a constant ``INTERVAL n unit``
    (None: not a constant the planner admits)."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    unit = node.args.get("unit")
    name = (unit.name if unit is not None else "").lower().rstrip("s")
    text = str(node.this.this).strip()
    if name not in _INTERVAL_DAYS or not re.fullmatch(r"[+-]?\d{1,18}", text):
        return None
    n = abs(int(text))
    return n * _INTERVAL_DAYS[name] if name not in ("hour", "minute", "second") else n // {
        "hour": 24, "minute": 1440, "second": 86400}[name] + 1


def column_types(policy: DatasetPolicy, tree: exp.Expression) -> dict[str, str]:
    """Declared type (int/float/text/bool/date/timestamp) of each column name of the tables a query reads.

    A name declared with different types in two read tables maps to ``"?"``.
    """
    out: dict[str, str] = {}
    for ds, name in relations(tree):
        if ds != policy.name:
            continue
        try:
            table = policy.table(name)
        except Exception:  # noqa: BLE001 - not a table of this dataset
            continue
        for cname, col in table.columns.items():
            key = cname.casefold()
            out[key] = col.type if out.get(key, col.type) == col.type else "?"
    return out


#: The largest finite double.
DBL_MAX = 1.7976931348623157e308
#: 2**52: doubles at or above it in magnitude are integers.
TWO_52 = 4503599627370496.0


def dbl(value: float) -> exp.Expression:
    """A DOUBLE literal (``CAST('…' AS DOUBLE)``, exact on every engine)."""
    return exp.Cast(this=exp.Literal.string(repr(float(value))), to=datatype("double"))


def finite(value: exp.Expression) -> exp.Expression:
    """``v > -inf AND v < inf``: true for finite doubles, false for NaN (the greatest value
    on DuckDB, PostgreSQL and Spark), ±inf; NULL for NULL. Replaces DuckDB's ``isfinite``."""
    return exp.and_(
        exp.GT(this=value.copy(), expression=dbl(float("-inf"))),
        exp.LT(this=value.copy(), expression=dbl(float("inf"))),
    )


def round_half_away(value: exp.Expression) -> exp.Expression:
    """DuckDB's ``ROUND(x)`` of a double (half away from zero), exactly, with IEEE
    operations every engine performs identically:
    ``CASE WHEN |x| >= 2**52 OR x <> x THEN x ELSE sign(x) · (floor(|x|) + (|x| − floor(|x|) >= 0.5)) END``
    (``|x| − floor(|x|)`` is exact, so ``0.49999999999999994`` rounds to 0).
    NaN stays NaN; ±inf stay."""
    ax = exp.Abs(this=value.copy())
    fl = exp.Floor(this=ax.copy())
    frac_up = exp.Case(
        ifs=[exp.If(this=exp.GTE(this=exp.Sub(this=ax.copy(), expression=fl.copy()), expression=dbl(0.5)),
                    true=dbl(1.0))],
        default=dbl(0.0),
    )
    rounded = exp.Mul(
        this=exp.Cast(this=exp.Sign(this=value.copy()), to=datatype("double")),
        expression=exp.Paren(this=exp.Add(this=exp.Cast(this=fl, to=datatype("double")),
                                          expression=frac_up)),
    )
    big = exp.or_(
        exp.GTE(this=ax.copy(), expression=dbl(TWO_52)),
        exp.Not(this=exp.LT(this=value.copy(), expression=dbl(float("inf")))),
    )
    return exp.Case(ifs=[exp.If(this=big, true=value.copy())], default=rounded)


