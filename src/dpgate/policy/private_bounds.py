"""Private bounds of a numeric column (issue 22 item 3; DESIGN.md "Policy additions").

A column declared ::

    income = { type = "float", bounds = "private", outer = [0, 1e9] }      # quantile = 0.99 by default

has no clamp of its own: the first query that needs its clamp estimates one with DP over the
column's per-unit contributions, inside the *outer* range the data owner states
(:mod:`dpgate.private_bounds` for the estimate, :mod:`dpgate.pipeline.private_bounds` for its
charge and reuse). Until then, and wherever no estimate applies, the column is clamped to
``outer`` — a bound from the policy, never from the data.

Refused when the policy loads (:class:`~dpgate.errors.PolicyError`, code ``invalid_policy``):
``bounds`` other than ``"private"``; ``bounds = "private"`` on a non-numeric column, without
``outer``, with ``lower``/``upper`` as well, with ``public_keys`` (a group key's domain comes from
the policy, so a data-chosen clamp has no place there); an ``outer`` that is not two finite
numbers ``[lo, hi]`` with lo < hi; ``outer`` or ``quantile`` without ``bounds = "private"``;
a ``quantile`` outside (0, 1).

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dpgate.errors import policy_error as _policy_error
from dpgate.policy.fields import _is_number

__all__ = ["PrivateBounds", "DEFAULT_QUANTILE", "DEFAULT_SHARE", "DEFAULT_MAX_RANK_ERROR", "split_private_bounds"]

#: Default quantile of the per-unit contributions taken as the clamp's far end.
DEFAULT_QUANTILE = 0.99
#: Default share of a query's budget spent on estimating a missing clamp (``[budget] private_bounds_share``).
DEFAULT_SHARE = 0.1
#: Default largest 95 % rank error (units) of an estimate (``[budget] private_bounds_max_rank_error``).
DEFAULT_MAX_RANK_ERROR = 1000.0

#: The keys of a column entry this module reads.
KEYS = frozenset({"bounds", "outer", "quantile"})


@dataclass(frozen=True)
class PrivateBounds:
    """A column's ``bounds = "private"`` declaration, and the estimate in force (if any).

    Attributes:
        outer: ``(lo, hi)``, the widest clamp the data owner allows (column units, lo < hi).
        quantile: the quantile of the per-unit contributions (their distance from the point of
            ``outer`` nearest 0) chosen as the clamp's reach, in (0, 1).
        chosen_in: the release id of the DP estimate the column's ``lower``/``upper`` now hold;
            None while the column is clamped to ``outer``.
        cost: that estimate's charge, ``{"rho": …}`` (zCDP) or ``{"epsilon": …}`` (pure DP); None
            while no estimate applies.
    """

    outer: tuple[float, float]
    quantile: float = DEFAULT_QUANTILE
    chosen_in: str | None = None
    cost: Mapping[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{bounds: "private", outer, quantile[, chosen_in, cost]}`` (JSON-ready)."""
        out: dict[str, Any] = {"bounds": "private", "outer": list(self.outer), "quantile": self.quantile}
        if self.chosen_in is not None:
            out["chosen_in"] = self.chosen_in
            out["cost"] = dict(self.cost or {})
        return out


def split_private_bounds(raw: Mapping[str, Any], ctype: Any, path: Path, table: str,
                         column: str) -> tuple[dict[str, Any], PrivateBounds | None]:
    """The column entry with ``bounds``/``outer``/``quantile`` replaced by ``lower``/``upper`` = outer,
    and the :class:`PrivateBounds` it declares (None: an ordinary column, ``raw`` unchanged).

    Raises:
        PolicyError: see the module docstring.
    """
    if not KEYS & set(raw):
        return dict(raw), None
    bounds = raw.get("bounds")
    if bounds != "private":
        if bounds is None:
            extra = sorted(KEYS & set(raw))
            raise _policy_error(path, f"{' and '.join(extra)} go(es) with bounds = \"private\"", table, column)
        raise _policy_error(path, f"bounds must be \"private\" (got {bounds!r}); a fixed clamp is written "
                                  "lower = …, upper = …", table, column)
    if ctype not in ("int", "float"):
        raise _policy_error(path, f"bounds = \"private\" needs a numeric column (int or float), not {ctype!r}",
                            table, column)
    for key in ("lower", "upper"):
        if raw.get(key) is not None:
            raise _policy_error(path, f"bounds = \"private\" and {key} exclude each other: the clamp is "
                                      "estimated inside outer = [lo, hi]", table, column)
    if raw.get("public_keys") is not None:
        raise _policy_error(path, "bounds = \"private\" is refused on a column with public_keys: a group "
                                  "key's domain comes from the policy, never from a data-chosen clamp",
                            table, column)
    outer = raw.get("outer")
    if outer is None:
        raise _policy_error(path, "bounds = \"private\" needs outer = [lo, hi], the widest clamp allowed "
                                  "(from domain knowledge, never from the data)", table, column)
    if not isinstance(outer, list) or len(outer) != 2 or not all(_is_number(v) for v in outer):
        raise _policy_error(path, f"outer must be two numbers [lo, hi] (got {outer!r})", table, column)
    lo, hi = outer
    if not all(math.isfinite(float(v)) for v in (lo, hi)):
        raise _policy_error(path, f"outer must be finite (got [{lo}, {hi}])", table, column)
    if not lo < hi:
        raise _policy_error(path, f"outer = [{lo}, {hi}] is reversed or empty: lo < hi is needed",
                            table, column)
    q = raw.get("quantile", DEFAULT_QUANTILE)
    if not _is_number(q) or not math.isfinite(float(q)) or not 0 < float(q) < 1:
        raise _policy_error(path, f"quantile must be a number in (0, 1) (got {q!r})", table, column)
    rest = {k: v for k, v in raw.items() if k not in KEYS}
    rest["lower"], rest["upper"] = lo, hi
    return rest, PrivateBounds((lo, hi), float(q))
