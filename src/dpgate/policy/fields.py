"""Reading the fields of a policy file: unknown keys, sections, finite numbers, bounds, names.

Every problem raises :class:`~dpgate.errors.PolicyError` naming the file, table and column.
Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

from dpgate import limits
from dpgate.errors import policy_error as _policy_error
from dpgate.policy.fixed_point import _show

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --- validation helpers ----------------------------------------------------------------


def _check_keys(
    obj: Mapping[str, Any], allowed: set[str], path: Path, section: str,
    table: str | None = None, column: str | None = None,
) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise _policy_error(
            path,
            f"unknown key(s) {', '.join(map(repr, unknown))} in {section} "
            f"(allowed: {', '.join(sorted(allowed))})",
            table,
            column,
        )


def _section(raw: Mapping[str, Any], key: str, path: Path, required: bool = True) -> dict:
    value = raw.get(key)
    if value is None:
        if required:
            raise _policy_error(path, f"missing [{key}] section")
        return {}
    if not isinstance(value, dict):
        raise _policy_error(path, f"[{key}] must be a table")
    return value


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_number(v: Any, what: str, path: Path, table=None, column=None) -> float:
    if not _is_number(v):
        raise _policy_error(path, f"{what} must be a number, not {type(v).__name__}", table, column)
    try:
        value = float(v)
    except OverflowError:  # an int beyond the double range
        value = math.inf
    if not math.isfinite(value):
        raise _policy_error(path, f"{what} must be finite (got {_show(v)})", table, column)
    return value


def _bound(v: Any, what: str, ctype: str, path: Path, table: str, column: str) -> float | int:
    """A clamp bound: finite, |v| ≤ :data:`dpgate.limits.MAX_ABS_BOUND`, exact.

    Stored as a float, except an int column's bound beyond ±2**53 (not exactly a double),
    which stays an exact int so that the published bound is the one written.
    """
    value = _finite_number(v, what, path, table, column)
    if abs(value) > limits.MAX_ABS_BOUND:
        raise _policy_error(
            path,
            f"{what} = {_show(v)} is too large: bounds must be at most {limits.MAX_ABS_BOUND:g} in "
            "magnitude, so that sums, averages and variances of the clamped values (and their "
            "noise) are finite doubles for any data",
            table, column,
        )
    if ctype == "int" and isinstance(v, int) and abs(v) > 2**53:
        return v
    return value


def _name(v: Any, what: str, path: Path, table=None, strict: bool = True) -> str:
    if not isinstance(v, str) or not v:
        raise _policy_error(path, f"{what} must be a non-empty string", table)
    if strict and not _NAME_RE.match(v):
        raise _policy_error(
            path, f"{what} {v!r} must be a plain identifier (letters, digits, underscore)", table
        )
    if "\x00" in v:
        raise _policy_error(path, f"{what} must not contain NUL characters", table)
    return v
