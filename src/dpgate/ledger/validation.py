"""Validation of what a ledger is handed: names, free text, allocations and costs.

Every check raises a :class:`~dpgate.errors.DpgateError` subclass (the caller
picks which one where it matters: a policy file's mistake is a
:class:`~dpgate.errors.PolicyError`, an HTTP request's an
:class:`~dpgate.errors.InvalidRequest` or :class:`~dpgate.errors.InvalidBudget`)
and runs before any store access, so a refused input never writes anything.
Caps are validated in :mod:`dpgate.ledger.caps`, where they are also fixed
into their budget curve.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

import numpy as np

from dpgate.accounting import ORDERS, Cost
from dpgate.errors import DpgateError, InvalidBudget, InvalidRequest, PolicyError, UnknownConsumer, UnknownPopulation

__all__ = [
    "TOLERANCE",
    "json_float",
    "real",
    "validate_name",
    "validate_text",
    "validate_limit",
    "validate_governance",
    "validate_allocations",
    "validate_cost",
    "unknown_population",
    "allocation_share",
    "is_utf8",
]

#: Relative tolerance of the filter comparisons and of allocation sums (exactly-fitting
#: charges and shares summing to 1 in floating point are admitted).
TOLERANCE = 1e-12

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,127}$")


def json_float(x: float) -> float | str:
    """A float for a JSON report: ``"inf"`` for infinity (strict JSON has none)."""
    return "inf" if math.isinf(x) else float(x)


def real(value: Any, what: str, error: type[DpgateError]) -> float:
    """``value`` as a float if it is a real number (not bool, not NaN); else raise ``error``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{what} must be a number, got {value!r}", {what: repr(value)})
    v = float(value)
    if math.isnan(v):
        raise error(f"{what} must not be NaN", {what: "NaN"})
    return v


def is_utf8(text: str) -> bool:
    """True if ``text`` encodes as UTF-8 (no lone surrogates: the hash chain hashes UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_name(value: Any, what: str, error: type[DpgateError] = InvalidRequest) -> str:
    """Check a population or consumer name: 1–128 characters ``[A-Za-z0-9._:@/+-]``,
    starting with a letter or digit.

    Raises:
        ``error`` (default :class:`~dpgate.errors.InvalidRequest`): not such a string.
    """
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise error(
            f"{what} must be 1-128 characters of letters, digits and ._:@/+- "
            f"starting with a letter or digit, got {value!r}",
            {what: repr(value)},
        )
    return value


def validate_text(value: Any, what: str, *, optional: bool = False, limit: int = 10_000) -> str | None:
    """Check a free-text field (purpose, release key, actor, reason).

    Args:
        value: the text.
        what: its name, for the error.
        optional: None is allowed (and returned).
        limit: maximum length in characters.

    Returns:
        ``value`` unchanged (None if optional and None).

    Raises:
        InvalidRequest: not a string, blank, longer than ``limit``, containing a NUL
            character (which PostgreSQL text cannot store) or not encodable as UTF-8
            (a lone surrogate: the hash chain hashes UTF-8).
    """
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value \
            or not is_utf8(value):
        raise InvalidRequest(f"{what} must be a non-empty string of at most {limit} characters "
                             "(UTF-8, without NUL characters)", {what: repr(value)[:200]})
    return value


def validate_limit(limit: Any) -> int | None:
    """Check an ``entries(limit=…)`` argument: None or a positive integer. Raises InvalidRequest."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidRequest(f"limit must be a positive integer, got {limit!r}", {})
    return limit


def validate_governance(actor: Any, reason: Any) -> None:
    """Check the actor and reason of a governance event (non-empty; ≤ 200 and ≤ 2000 characters).

    Raises:
        InvalidRequest: either is blank, too long or not a string.
    """
    validate_text(actor, "actor", limit=200)
    validate_text(reason, "reason", limit=2000)


def validate_allocations(
    allocations: Mapping[str, float] | Iterable[tuple[str, float]] | None,
    error: type[DpgateError] = PolicyError,
) -> dict[str, float]:
    """Validate allocations: consumer name → share in [0, 1], shares summing to ≤ 1.

    An empty mapping means an *open* population: any consumer may charge and is
    held only to the population's budget.

    Args:
        allocations: mapping (or pairs) consumer → share of the population's budget.
        error: the error class to raise (default :class:`~dpgate.errors.PolicyError`).

    Returns:
        A plain dict, sorted by consumer name.

    Raises:
        ``error``: a bad name, a share not a finite number in [0, 1], a duplicate
        consumer, or shares summing past 1 (``math.fsum``, tolerance 1e-12).
    """
    if allocations is None:
        return {}
    items = list(allocations.items()) if isinstance(allocations, Mapping) else list(allocations)
    out: dict[str, float] = {}
    for item in items:
        try:
            name, share = item
        except (TypeError, ValueError):
            raise error("allocations must map consumer names to shares", {}) from None
        validate_name(name, "consumer", error)
        s = real(share, f"allocation share of {name!r}", error)
        if not 0.0 <= s <= 1.0:
            raise error(f"allocation share of consumer {name!r} must be in [0, 1], got {s!r}",
                        {"consumer": name, "share": json_float(s)})
        if name in out:
            raise error(f"consumer {name!r} is allocated twice", {"consumer": name})
        out[name] = s
    total = math.fsum(out.values())
    if total > 1.0 + TOLERANCE:
        raise error(f"allocations sum to {total!r}, more than 1 (the whole budget)",
                    {"sum": total, "allocations": out})
    return dict(sorted(out.items()))


def validate_cost(cost: Any) -> Cost:
    """Check that ``cost`` is a usable :class:`~dpgate.accounting.Cost` for a charge.

    Re-checks what ``Cost`` validates on construction (a frozen dataclass can
    still be built around its checks). An RDP curve may be ``+inf`` ("no claim")
    at orders above those a population's cap checks (e.g. a subsampled Gaussian
    evaluated by its accountant only up to order 64); whether it fits is the
    filter's decision (:func:`dpgate.ledger.filter.check_charge`).

    Raises:
        InvalidBudget: not a Cost; unknown kind; ρ NaN, negative, infinite or 0;
            a curve of the wrong length, NaN or negative values, all zero, or
            infinite at every finite order.
    """
    if not isinstance(cost, Cost):
        raise InvalidBudget(f"a charge needs an accounting.Cost, got {type(cost).__name__}", {})
    if cost.kind in ("zcdp", "gaussian"):
        r = cost.rho
        if isinstance(r, bool) or not isinstance(r, (int, float)) or math.isnan(r) or r < 0 or math.isinf(r):
            raise InvalidBudget(f"rho must be a finite number >= 0, got {r!r}", {"rho": repr(r)})
        if r == 0:
            raise InvalidBudget("a charge must cost something (rho > 0); post-processing needs no charge",
                                {"rho": 0.0})
        return cost
    if cost.kind != "rdp":
        raise InvalidBudget(f"unknown cost kind {cost.kind!r}", {"kind": repr(cost.kind)})
    c = cost.curve
    if not isinstance(c, tuple) or len(c) != len(ORDERS):
        raise InvalidBudget(f"an RDP curve needs one value per order of accounting.ORDERS ({len(ORDERS)})", {})
    arr = np.asarray(c, dtype=float)
    if np.isnan(arr).any() or (arr < 0).any():
        raise InvalidBudget("an RDP curve must be non-negative and not NaN", {})
    finite_orders = np.isfinite(np.asarray(ORDERS, dtype=float))
    if np.isinf(arr[finite_orders]).all():
        raise InvalidBudget("the RDP curve is infinite at every finite order: no budget can admit it "
                            "(give ε(α) at the orders your accountant computed)", {})
    if not (arr > 0).any():
        raise InvalidBudget("a charge must cost something (the curve is zero)", {})
    return cost


def unknown_population(name: str) -> UnknownPopulation:
    """The :class:`~dpgate.errors.UnknownPopulation` error for ``name``."""
    return UnknownPopulation(f"no population {name!r} in the ledger", {"population": name})


def allocation_share(population: str, consumer: str, allocations: Mapping[str, float]) -> float:
    """The share of the population's budget that ``consumer`` may spend.

    Returns:
        Its allocation share, or 1.0 for any consumer of an open population (no allocations).

    Raises:
        UnknownConsumer: the population allocates nothing to ``consumer``.
    """
    if not allocations:
        return 1.0
    try:
        return allocations[consumer]
    except KeyError:
        raise UnknownConsumer(
            f"population {population!r} has no allocation for consumer {consumer!r}",
            {"population": population, "consumer": consumer},
        ) from None
