"""Binding dates and timestamps (the binder's temporal helpers, :mod:`dpgate.sql.bind`): typed
literals, a string compared with a date read as one, and the range of a date part."""

from __future__ import annotations

from sqlglot import exp

from dpgate.sql.expr import Expr, Interval
from dpgate.sql.messages import snippet, unsupported
from dpgate.sql.temporal import PART_RANGES, from_ordinal, temporal_ordinal

_TEMPORAL = ("date", "timestamp")


def temporal_literal(node: exp.Expression) -> Expr | None:
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


def coerce_temporal(args: list[Expr], node: exp.Expression) -> list[str]:
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


def part_range(unit: str, a: Expr) -> Interval | None:
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
