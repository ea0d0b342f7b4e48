"""Declared columns of a policy table: types, clamps, resolutions, public keys, temporal bounds.

:class:`ColumnPolicy` and the reading of ``[tables.<t>.columns]`` entries. Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import re
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, Mapping, get_args

from dpgate import limits
from dpgate.errors import policy_error as _policy_error
from dpgate.policy.fields import _bound, _check_keys, _finite_number, _is_number
from dpgate.policy.private_bounds import KEYS as _PRIVATE_KEYS, PrivateBounds, split_private_bounds
from dpgate.policy.fixed_point import (
    MAX_FIXED_POINT_STEPS,
    _default_float_resolution,
    _exact,
    _fixed_point_bounds,
    _not_a_multiple,
    _show,
)

ColumnType = Literal["int", "float", "text", "bool", "date", "timestamp"]
#: The declared column types (one definition: the values of :data:`ColumnType`).
COLUMN_TYPES: tuple[str, ...] = get_args(ColumnType)
#: Significant digits of a ``bounds = "private"`` float column's default resolution against its
#: outer range (:func:`dpgate.policy.fixed_point._default_float_resolution`).
PRIVATE_DIGITS = 12

#: The column types that may carry bounds and a resolution (SUM/AVG/VAR).
NUMERIC_TYPES: tuple[str, ...] = ("int", "float")
#: The column types whose bounds are ISO date / timestamp strings (no SUM/AVG; date parts,
#: comparisons and computed keys such as ``date_trunc`` use the bounds).
TEMPORAL_TYPES: tuple[str, ...] = ("date", "timestamp")
#: DuckDB type the engine casts each declared column type to (with TRY_CAST).
DUCKDB_TYPES: Mapping[str, str] = MappingProxyType(
    {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "bool": "BOOLEAN", "date": "DATE",
     "timestamp": "TIMESTAMP"}
)
_RANGE_RE = re.compile(r"^\s*range\(\s*(-?\d+)\s*,\s*(-?\d+)\s*\)\s*$")


@dataclass(frozen=True)
class ColumnPolicy:
    """One declared column of a table.

    Attributes:
        name: column name as in the data (matched case-insensitively by the SQL parser,
            as DuckDB does).
        type: ``"int"`` | ``"float"`` | ``"text"`` | ``"bool"``.
        lower, upper: clamp bounds (in the column's units), or None when unbounded;
            both or neither; exact multiples of ``resolution`` (ints for int columns).
        resolution: fixed-point step of sums (column units), or None for text/bool
            columns. Defaults: 1 for int, ~6 significant digits of the largest bound
            for float (see the module docstring).
        public_keys: the released group keys in release order: a tuple of values of
            the column's type, or a :class:`range` when declared as ``"range(a, b)"``;
            None when the keys are not declared (a GROUP BY on the column then selects its keys
            privately, :mod:`dpgate.sql.partition_selection`).
        time_lower, time_upper: for ``date`` / ``timestamp`` columns, the declared range
            as :class:`datetime.date` / :class:`datetime.datetime` (naive, UTC), both or
            neither (``lower``/``upper`` stay None: a date is not summed).
        unique: ``unique = true``: the data owner declares that no two rows share a
            non-NULL value (a key). Required of every key a privacy unit path references
            (:class:`UnitPath`); verified on the data when an engine loads it (DuckDB and Spark
            count values against distinct values; PostgreSQL requires a UNIQUE or PRIMARY KEY
            index), the dataset refused otherwise.
        private_bounds: ``bounds = "private"`` (:class:`~dpgate.policy.private_bounds.PrivateBounds`):
            ``lower``/``upper`` are the outer range until a DP estimate replaces them; None otherwise.
    """

    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    resolution: float | None = None
    public_keys: tuple | range | None = None
    time_lower: _dt.date | None = None
    time_upper: _dt.date | None = None
    unique: bool = False
    private_bounds: PrivateBounds | None = None

    @property
    def time_bounded(self) -> bool:
        """True for a date/timestamp column with a declared ``[lower, upper]``."""
        return self.time_lower is not None and self.time_upper is not None

    @property
    def bounded(self) -> bool:
        """True when the column has a clamp ``[lower, upper]`` (SUM/AVG/VAR allowed)."""
        return self.lower is not None and self.upper is not None

    @property
    def duckdb_type(self) -> str:
        """DuckDB type of the loaded column: BIGINT, DOUBLE, VARCHAR or BOOLEAN."""
        return DUCKDB_TYPES[self.type]

    @property
    def fixed_point_bounds(self) -> tuple[int, int]:
        """The clamp in integer units of ``resolution``: ``(lo, hi)`` with lo ≤ hi.

        ``lo = lower / resolution`` and ``hi = upper / resolution`` exactly: the loader
        refuses bounds that are not multiples of the resolution (compared in decimal, as
        written), so ``[lo·resolution, hi·resolution]`` is the published clamp. The
        bounding rewrite clamps every value to this range after rounding it to the
        nearest step, and the sensitivity is derived from it.

        Raises:
            ValueError: the column has no bounds.
        """
        if not self.bounded or self.resolution is None:
            raise ValueError(f"column {self.name!r} has no bounds")
        return _fixed_point_bounds(self.lower, self.upper, self.resolution)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (public keys as a list, or ``"range(a, b)"``; ``unique`` only
        when declared, so that the policy digests of plans over other columns do not change)."""
        keys: Any = None
        if isinstance(self.public_keys, range):
            keys = f"range({self.public_keys.start}, {self.public_keys.stop})"
        elif self.public_keys is not None:
            keys = list(self.public_keys)
        out = {
            "name": self.name,
            "type": self.type,
            "lower": self.time_lower.isoformat() if self.time_lower is not None else self.lower,
            "upper": self.time_upper.isoformat() if self.time_upper is not None else self.upper,
            "resolution": self.resolution,
            "public_keys": keys,
        }
        if self.unique:
            out["unique"] = True
        if self.private_bounds is not None:  # only then: other columns' digests stay as they were
            out.update(self.private_bounds.to_dict())
        return out


def _parse_public_keys(v: Any, ctype: str, path: Path, table: str, column: str) -> tuple | range:
    if isinstance(v, str):
        m = _RANGE_RE.match(v)
        if not m:
            raise _policy_error(
                path, f'public_keys string must be "range(a, b)", not {v!r}', table, column
            )
        if ctype != "int":
            raise _policy_error(
                path, f"public_keys as a range need an int column (column type is {ctype})",
                table, column,
            )
        a, b = int(m.group(1)), int(m.group(2))
        if a >= b:
            raise _policy_error(path, f"public_keys range({a}, {b}) is empty", table, column)
        if b - a > 10_000_000:
            raise _policy_error(
                path, f"public_keys range({a}, {b}) has more than 10,000,000 keys", table, column
            )
        if max(abs(a), abs(b)) >= 2**63:
            raise _policy_error(path, "public_keys range exceeds the 64-bit range", table, column)
        return range(a, b)
    if not isinstance(v, list):
        raise _policy_error(
            path, 'public_keys must be a list or the string "range(a, b)"', table, column
        )
    if not v:
        raise _policy_error(path, "public_keys must not be empty", table, column)
    keys = []
    for i, key in enumerate(v):
        ok = {
            "int": isinstance(key, int) and not isinstance(key, bool) and abs(key) < 2**63,
            "float": _is_number(key) and math.isfinite(key),
            "text": isinstance(key, str) and "\x00" not in key,
            "bool": isinstance(key, bool),
        }[ctype]
        if not ok:
            raise _policy_error(
                path,
                f"public key #{i + 1} ({type(key).__name__}) is not a valid {ctype} value",
                table,
                column,
            )
        keys.append(float(key) if ctype == "float" else key)
    seen: set = set()
    for key in keys:
        if key in seen:
            raise _policy_error(path, f"duplicate public key {key!r}", table, column)
        seen.add(key)
    return tuple(keys)


_COLUMN_KEYS = {"type", "lower", "upper", "resolution", "public_keys", "unique"} | _PRIVATE_KEYS


def _parse_column(name: str, raw: Any, path: Path, table: str) -> ColumnPolicy:
    if "\x00" in name or not name:
        raise _policy_error(path, "column names must be non-empty without NUL", table, name)
    if isinstance(raw, str):  # shorthand: region = "text"
        raw = {"type": raw}
    if not isinstance(raw, dict):
        raise _policy_error(path, "a column must be a table like { type = \"int\" }", table, name)
    _check_keys(raw, _COLUMN_KEYS, path, "the column", table, name)
    unique = raw.get("unique", False)
    if not isinstance(unique, bool):
        raise _policy_error(path, f"unique must be true or false (got {unique!r})", table, name)
    raw, private = split_private_bounds(raw, raw.get("type"), path, table, name)  # issue 22 item 3
    if private is not None and raw.get("type") == "float" and raw.get("resolution") is None \
            and raw.get("lower") is not None:
        # the default step of a private column is fine against its outer range (12 digits, not 6):
        # with 6 an outer range of [0, 1e9] rounded every value to a multiple of 1000, and the
        # estimated clamp could only be 1000, 2000, … (trial finding, 2026-12-03)
        raw = {**raw, "resolution": _default_float_resolution(raw["lower"], raw["upper"], PRIVATE_DIGITS)}
    col = _parse_column_fields(name, raw, path, table)
    if private is not None:
        col = dataclasses.replace(col, private_bounds=dataclasses.replace(private, outer=(col.lower, col.upper)))
    return dataclasses.replace(col, unique=True) if unique else col


def _parse_column_fields(name: str, raw: Mapping[str, Any], path: Path, table: str) -> ColumnPolicy:
    ctype = raw.get("type")
    if ctype not in COLUMN_TYPES:
        raise _policy_error(
            path, f"unknown type {ctype!r} (expected one of {', '.join(COLUMN_TYPES)})", table, name
        )
    lower, upper, resolution = raw.get("lower"), raw.get("upper"), raw.get("resolution")
    if ctype in TEMPORAL_TYPES:
        return _parse_temporal_column(name, ctype, raw, path, table)
    if ctype not in NUMERIC_TYPES:
        for key in ("lower", "upper", "resolution"):
            if raw.get(key) is not None:
                raise _policy_error(path, f"{key} is not allowed on a {ctype} column", table, name)
    if (lower is None) != (upper is None):
        raise _policy_error(path, "lower and upper must be given together", table, name)
    if lower is not None:
        lower = _bound(lower, "lower", ctype, path, table, name)
        upper = _bound(upper, "upper", ctype, path, table, name)
        if lower > upper:
            raise _policy_error(path, f"lower ({_show(lower)}) > upper ({_show(upper)})", table, name)
    if ctype in NUMERIC_TYPES:
        if resolution is None:
            if ctype == "int":
                resolution = 1.0
            elif lower is not None:
                resolution = _default_float_resolution(lower, upper)
        else:
            resolution = _finite_number(resolution, "resolution", path, table, name)
            if resolution <= 0:
                raise _policy_error(path, f"resolution must be > 0 (got {resolution:g})", table, name)
            if ctype == "int" and resolution != int(resolution):
                raise _policy_error(
                    path, f"resolution of an int column must be a whole number (got {resolution:g})",
                    table, name,
                )
        if resolution is not None and not limits.MIN_RESOLUTION <= resolution <= limits.MAX_RESOLUTION:
            given = raw.get("resolution") is not None
            raise _policy_error(
                path,
                f"resolution must be between {limits.MIN_RESOLUTION:g} and "
                f"{limits.MAX_RESOLUTION:g} (got {resolution:g}"
                + ("" if given else ", the default for these bounds") + "), so that released "
                "values and their noise are finite doubles"
                + ("" if given else "; round the bounds to fewer decimals"),
                table, name,
            )
        if lower is not None:
            for key, bound in (("lower", lower), ("upper", upper)):
                if (_exact(bound) / _exact(resolution)).denominator != 1:
                    raise _policy_error(
                        path, _not_a_multiple(key, bound, lower, upper, resolution, ctype), table, name
                    )
            lo, hi = _fixed_point_bounds(lower, upper, resolution)
            steps = max(abs(lo), abs(hi))
            if steps > MAX_FIXED_POINT_STEPS:
                raise _policy_error(
                    path,
                    f"bad resolution: the bounds span {steps:.3g} steps of {_show(resolution)} "
                    f"(at most 2**62); choose a coarser resolution that divides both bounds"
                    + ("" if raw.get("resolution") is not None else
                       " (the default is the coarsest power of ten ≤ 10**(floor(log10(max "
                       "|bound|)) − 6) that divides both bounds; round the bounds or give one)"),
                    table,
                    name,
                )
    keys = None
    if raw.get("public_keys") is not None:
        keys = _parse_public_keys(raw["public_keys"], ctype, path, table, name)
    return ColumnPolicy(
        name=name,
        type=ctype,
        lower=lower,
        upper=upper,
        resolution=resolution,
        public_keys=keys,
    )


#: Widest declared range of a date/timestamp column (DuckDB's DATE and TIMESTAMP hold it).
TEMPORAL_MIN = _dt.datetime(1, 1, 1)
TEMPORAL_MAX = _dt.datetime(9999, 12, 31, 23, 59, 59)


def parse_temporal(text: Any, ctype: str) -> _dt.date:
    """An ISO ``YYYY-MM-DD`` (date) or ``YYYY-MM-DD[ HH:MM[:SS[.ffffff]]]`` (timestamp) value.

    A TOML date / datetime value is accepted as well. Timestamps are naive (UTC); an offset
    is refused (the engine stores no time zone).

    Raises:
        ValueError: not such a value (message says what is expected).
    """
    if isinstance(text, _dt.datetime):
        value: _dt.date = text
    elif isinstance(text, _dt.date):
        value = text
    elif isinstance(text, str):
        try:
            value = (_dt.date.fromisoformat(text.strip()) if ctype == "date"
                     else _dt.datetime.fromisoformat(text.strip()))
        except ValueError:
            raise ValueError(f"{text!r} is not an ISO {ctype} "
                             + ("(YYYY-MM-DD)" if ctype == "date" else "(YYYY-MM-DD HH:MM:SS)")) from None
    else:
        raise ValueError(f"expected an ISO {ctype} string, not {type(text).__name__}")
    if ctype == "date":
        if isinstance(value, _dt.datetime):
            if value.time() != _dt.time(0):
                raise ValueError(f"{text!r} has a time of day; a date column's bounds are dates")
            value = value.date()
    else:
        if not isinstance(value, _dt.datetime):
            value = _dt.datetime(value.year, value.month, value.day)
        if value.tzinfo is not None:
            raise ValueError(f"{text!r} has a time zone; timestamps are naive (UTC)")
    return value


def _parse_temporal_column(name: str, ctype: str, raw: Mapping, path: Path, table: str) -> ColumnPolicy:
    if raw.get("resolution") is not None:
        raise _policy_error(path, f"resolution is not allowed on a {ctype} column", table, name)
    if raw.get("public_keys") is not None:
        raise _policy_error(
            path, f"public_keys are not supported on a {ctype} column; group by "
            "date_trunc(...) or EXTRACT(...) of it (the domain follows from lower/upper)",
            table, name,
        )
    lower, upper = raw.get("lower"), raw.get("upper")
    if (lower is None) != (upper is None):
        raise _policy_error(path, "lower and upper must be given together", table, name)
    if lower is None:
        return ColumnPolicy(name=name, type=ctype)  # type: ignore[arg-type]
    try:
        lo, hi = parse_temporal(lower, ctype), parse_temporal(upper, ctype)
    except ValueError as e:
        raise _policy_error(path, f"bad bound: {e}", table, name) from None
    if lo > hi:
        raise _policy_error(path, f"lower ({lo.isoformat()}) > upper ({hi.isoformat()})", table, name)
    return ColumnPolicy(name=name, type=ctype, time_lower=lo, time_upper=hi)  # type: ignore[arg-type]
