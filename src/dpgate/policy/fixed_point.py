"""Fixed-point sums of a policy's numeric columns: step limits, default resolutions, exact bounds.

A clamp ``[lower, upper]`` with resolution ``r`` is summed as integers in units of ``r``; the
bounds must be exact multiples of ``r`` (compared in decimal, as written in the file) and lie
within :data:`MAX_FIXED_POINT_STEPS` steps (see :mod:`dpgate.limits`). Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from dpgate import limits

#: Largest |bound| / resolution (:data:`dpgate.limits.MAX_STEPS`, 2**62).
MAX_FIXED_POINT_STEPS = limits.MAX_STEPS
#: Largest |bound| / resolution of a column whose sum of squares (VAR/STDDEV) is computed:
#: squares fit in a BIGINT (√(2**62) = 2**31).
MAX_SQUARED_STEPS = math.isqrt(limits.MAX_STEPS)


def _exact(v: int | float) -> Fraction:
    """The number as written in the file: an int exactly, a float as its shortest decimal repr.

    TOML floats are decimal texts; ``repr`` gives back the shortest decimal that reads as
    the same double (``0.3``, not 0.299999999999999988897…), i.e. what the user wrote.
    """
    return Fraction(v) if isinstance(v, int) else Fraction(repr(float(v)))


@lru_cache(maxsize=4096)
def _fixed_point_bounds(lower: float, upper: float, resolution: float) -> tuple[int, int]:
    res = _exact(resolution)
    lo, hi = _exact(lower) / res, _exact(upper) / res
    if lo.denominator != 1 or hi.denominator != 1:  # pragma: no cover - refused at load
        raise ValueError("bounds are not multiples of the resolution")
    return int(lo), int(hi)


def _decimal_exponent(v: int | float) -> float:
    """Exponent of the last non-zero decimal digit of ``v`` as written (+inf for 0)."""
    if v == 0:
        return math.inf
    d = Decimal(v) if isinstance(v, int) else Decimal(repr(float(v)))
    return d.normalize().as_tuple().exponent


def _power_of_ten(e: int) -> float:
    return float(f"1e{e}")


def _default_float_resolution(lower: float, upper: float, digits: int = 6) -> float:
    """The coarsest power of ten ≤ 10**(floor(log10(max |bound|)) − digits) dividing both bounds.

    ``digits`` = 6 for declared bounds; a ``bounds = "private"`` column's outer range asks for 12
    (its estimated clamp is usually orders of magnitude inside the outer range, and the resolution
    is the step both the estimate's candidates and the clamped values are rounded to)."""
    big = max(abs(lower), abs(upper))
    if big == 0:
        return 10.0 ** -digits
    top = Decimal(repr(float(big))).adjusted() - digits  # floor(log10(big)) − digits, exactly
    return _power_of_ten(int(min(top, _decimal_exponent(lower), _decimal_exponent(upper))))


def _show(v: int | float | Fraction) -> str:
    """A bound or resolution as a user would write it (``1``, ``0.9``, ``1e+100``)."""
    if isinstance(v, Fraction):
        v = int(v) if v.denominator == 1 else float(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        v = int(v)
    return str(v) if isinstance(v, int) else repr(v)


def _not_a_multiple(name: str, bound: int | float, lower: float, upper: float,
                    resolution: float, ctype: str) -> str:
    q = _exact(bound) / _exact(resolution)
    below, above = (math.floor(q) * _exact(resolution), math.ceil(q) * _exact(resolution))
    text = (
        f"{name} = {_show(bound)} is not a multiple of the resolution {_show(resolution)}, so "
        f"the clamp applied would differ from the published one: use {name} = {_show(below)} "
        f"or {_show(above)}"
    )
    finest = min(Decimal(repr(float(resolution))).adjusted(), _decimal_exponent(lower),
                 _decimal_exponent(upper))
    if ctype == "int" and finest < 0:  # an int column's bounds are whole numbers
        return text + " (an int column's bounds are whole numbers)"
    return text + (", or a resolution that divides both bounds, such as "
                   f"{_show(_power_of_ten(int(finest)))}")
