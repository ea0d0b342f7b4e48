"""Dates and timestamps in the planner: exact ordinals, literals, date parts, truncation units.

A date is its number of days since 1970-01-01, a timestamp its number of microseconds since
then (:func:`temporal_ordinal`, exact :class:`~fractions.Fraction`); the binder's ranges of
temporal values are ranges of ordinals, and :func:`temporal_sql` renders an ordinal back as
``CAST('iso' AS DATE|TIMESTAMP)``. Date parts (EXTRACT, date_part, YEAR(…)) and the units of
``date_trunc`` and INTERVAL are checked here against the parts the planner supports.
"""

from __future__ import annotations

import datetime as _dt
import re
from fractions import Fraction

from sqlglot import exp

from dpgate.sql.messages import snippet, unsupported

_INT_RE = re.compile(r"^\d+$")

EPOCH = _dt.datetime(1970, 1, 1)


#: Date parts of EXTRACT / date_part / YEAR(…) and the range of each (the year's from bounds).
PART_RANGES = {
    "quarter": (1, 4), "month": (1, 12), "week": (1, 53), "day": (1, 31), "dow": (0, 6),
    "isodow": (1, 7), "doy": (1, 366), "hour": (0, 23), "minute": (0, 59), "second": (0, 59),
}


PART_ALIASES = {"dayofweek": "dow", "dayofyear": "doy", "weekofyear": "week",
                 "dayofmonth": "day", "yearofweek": None, "epoch": None}


PART_FUNCS = {
    exp.Year: "year", exp.Quarter: "quarter", exp.Month: "month", exp.Day: "day",
    exp.DayOfWeek: "dow", exp.DayOfYear: "doy", exp.DayOfMonth: "day", exp.Hour: "hour",
    exp.Minute: "minute", exp.Second: "second", exp.WeekOfYear: "week", exp.Week: "week",
}


TRUNC_UNITS = ("year", "quarter", "month", "week", "day", "hour")


NOW = (exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.CurrentDatetime)


NOW_NAMES = {"now", "today", "current_date", "current_timestamp", "localtimestamp",
              "get_current_timestamp", "transaction_timestamp", "getdate", "sysdate"}


INTERVAL_UNITS = {"year", "years", "quarter", "quarters", "month", "months", "week", "weeks",
                   "day", "days", "hour", "hours", "minute", "minutes", "second", "seconds"}


def temporal_ordinal(v: _dt.date) -> Fraction:
    """A date as days since 1970-01-01, a timestamp as microseconds since then (exact)."""
    if isinstance(v, _dt.datetime):
        d = v - EPOCH
        return Fraction((d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds)
    return Fraction((v - EPOCH.date()).days)


def from_ordinal(v: Fraction, type_: str) -> _dt.date:
    """Inverse of :func:`temporal_ordinal` for a value of ``type_`` (date or timestamp)."""
    if type_ == "date":
        return EPOCH.date() + _dt.timedelta(days=int(v))
    return EPOCH + _dt.timedelta(microseconds=int(v))


def temporal_sql(v: Fraction, type_: str) -> exp.Expression:
    """``CAST('iso' AS DATE|TIMESTAMP)`` of an ordinal (:func:`temporal_ordinal`)."""
    value = from_ordinal(v, type_)
    text = value.isoformat(sep=" ") if isinstance(value, _dt.datetime) else value.isoformat()
    return exp.Cast(this=exp.Literal.string(text), to=exp.DataType.build(type_.upper()))


def check_interval(node: exp.Interval) -> None:
    """An INTERVAL must be a constant count of a known unit (``INTERVAL 30 DAY``)."""
    unit = node.args.get("unit")
    unit_name = (unit.name if unit is not None else "").lower()
    value = node.this
    ok = isinstance(value, exp.Literal) and _INT_RE.match(str(value.this).strip() or "x")
    if not ok or unit_name not in INTERVAL_UNITS:
        raise unsupported(f"{snippet(node)}: an INTERVAL must be a constant whole number of "
                          "years, quarters, months, weeks, days, hours, minutes or seconds, "
                          "e.g. INTERVAL 30 DAY", node)


def date_part(node: exp.Expression) -> tuple[str, exp.Expression] | None:
    """(part, argument) of EXTRACT(part FROM d), date_part('part', d), YEAR(d), …, or None."""
    if isinstance(node, exp.Extract):
        unit, arg = node.this.name.lower(), node.expression
    elif isinstance(node, exp.Anonymous) and node.name.lower() in ("date_part", "datepart"):
        if len(node.expressions) != 2 or not isinstance(node.expressions[0], (exp.Literal, exp.Var)):
            raise unsupported(f"{snippet(node)}: date_part needs a constant part name", node)
        unit, arg = node.expressions[0].name.lower(), node.expressions[1]
    elif type(node) in PART_FUNCS:
        unit, arg = PART_FUNCS[type(node)], node.this
    else:
        return None
    written = unit
    unit = PART_ALIASES.get(unit, unit) or ""
    if unit != "year" and unit not in PART_RANGES:
        raise unsupported(f"{snippet(node)}: the date part {written or 'given'!r} is not supported "
                          f"(year, {', '.join(PART_RANGES)})", node)
    return unit, arg


def date_part_of(node: exp.Expression) -> str:
    """The canonical part name (``year``, ``month``, ``dow``…) of a bound date-part node."""
    part = date_part(node)
    if part is None:  # pragma: no cover - only called on extract nodes
        raise ValueError("not a date part")
    return part[0]


def trunc_unit(node: exp.Expression) -> str:
    """The unit of a ``date_trunc`` call (lower case), if supported.

    Raises: UnsupportedQuery (an unsupported unit).
    """
    unit = node.args.get("unit")
    name = (unit.name if unit is not None else "").lower()
    if name not in TRUNC_UNITS:
        raise unsupported(f"{snippet(node)}: date_trunc to {name or '?'!r} is not supported "
                          f"({', '.join(TRUNC_UNITS)})", node)
    return name

