"""Private truncation of heavy contributors (issue 22 item 4; DESIGN.md "Policy additions").

A protected table declared ::

    [tables.lineitem]
    privacy_unit = { path = ["l_orderkey -> orders.o_orderkey", "o_custkey"] }
    max_groups_per_unit = 25
    max_rows_per_unit = { private = true, outer = 1024 }      # quantile = 0.99 by default

has no fixed row cap m: a query reading it first chooses m with DP among the geometric candidates
1, 2, 4, …, ``outer`` from the per-unit row counts of *its own* rows (after the unit path's and the
query's joins, its WHERE and per group: :mod:`dpgate.private_truncation` for the choice,
:mod:`dpgate.pipeline.private_truncation` for its charge and reuse). Until then, and wherever no
choice applies, m is ``outer`` — a bound from the policy, never from the data. The syntax mirrors a
column's ``bounds = "private", outer = [lo, hi]``: the word ``private`` and the widest value the data
owner allows.

Refused when the policy loads (:class:`~dpgate.errors.PolicyError`, code ``invalid_policy``): an
inline table with keys other than ``private``, ``outer``, ``quantile``; ``private`` other than
``true``; no ``outer``, or an ``outer`` that is not an integer in [1, MAX_CONTRIBUTION]; a
``quantile`` or ``sum_quantile`` (the quantile of a SUM's per-unit clamp τ, default 0.9) outside (0, 1); the string ``"private"`` alone (``outer`` is needed); private
truncation on a public or record-level table (no unit whose rows could be counted).

Part of :mod:`dpgate.policy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from dpgate.errors import policy_error as _policy_error
from dpgate.policy.fields import _is_number

__all__ = ["PrivateTruncation", "DEFAULT_QUANTILE", "DEFAULT_SUM_QUANTILE", "KEYS", "parse_private_truncation"]

#: Default quantile of the per-unit row counts taken as m.
DEFAULT_QUANTILE = 0.99
#: Default quantile of the per-unit |partial sums| taken as a SUM's per-unit clamp τ (lower than m's:
#: a SUM's noise grows like τ, and on TPC-H 0.9 chose the best fixed τ with hindsight where 0.99
#: overshot in a third of the trials; docs/BENCHMARKS.md "Private truncation").
DEFAULT_SUM_QUANTILE = 0.9
#: The keys of the inline table ``max_rows_per_unit = { … }``.
KEYS = frozenset({"private", "outer", "quantile", "sum_quantile"})


@dataclass(frozen=True)
class PrivateTruncation:
    """A table's ``max_rows_per_unit = { private = true, outer = N }``, and the choice in force (if any).

    Attributes:
        outer: the largest m the data owner allows (rows per unit and group, ≥ 1).
        quantile: the quantile of the per-unit row counts chosen as m, in (0, 1).
        chosen_in: the release id of the DP choice the table's ``max_rows_per_unit`` now holds; None
            while m is ``outer``.
        cost: that choice's charge, ``{"rho": …}`` or ``{"epsilon": …}``; None while none applies.
        sum_quantile: the quantile of the units' largest |partial sum| chosen as a SUM's τ, in (0, 1).
        sum_clamps: the per-unit sum clamps τ chosen privately for this query's SUMs (issue 22 item 4,
            :mod:`dpgate.private_sum_clamp`): ``(summed expression, τ in fixed-point steps, release id)``
            triples, sorted; empty while none applies (each SUM's per-unit partial is then clipped to
            ``m·[min(L, 0), max(U, 0)]``).
    """

    outer: int
    quantile: float = DEFAULT_QUANTILE
    chosen_in: str | None = None
    cost: Mapping[str, float] | None = None
    sum_clamps: tuple[tuple[str, int, str], ...] = ()
    sum_quantile: float = DEFAULT_SUM_QUANTILE

    def sum_clamp(self, column: str | None) -> int | None:
        """τ (fixed-point steps) chosen for SUM(``column``), or None (the partial keeps its m-row bound)."""
        return next((tau for c, tau, _ in self.sum_clamps if c == column), None)

    def to_dict(self) -> dict[str, Any]:
        """``{private: true, outer, quantile[, chosen_in, cost]}`` (JSON-ready)."""
        out: dict[str, Any] = {"private": True, "outer": self.outer, "quantile": self.quantile}
        if self.chosen_in is not None:
            out["chosen_in"] = self.chosen_in
            out["cost"] = dict(self.cost or {})
        if self.sum_quantile != DEFAULT_SUM_QUANTILE:  # only then: descriptions stay as they were
            out["sum_quantile"] = self.sum_quantile
        if self.sum_clamps:  # only then: descriptions without a chosen τ stay as they were
            out["sum_clamps"] = [{"column": c, "tau_steps": t, "chosen_in": r} for c, t, r in self.sum_clamps]
        return out


def parse_private_truncation(raw: Any, path: Path, table: str, max_contribution: int) -> PrivateTruncation | None:
    """The :class:`PrivateTruncation` that ``max_rows_per_unit``'s value ``raw`` declares, or None
    for an ordinary value (an integer, checked by the caller).

    Raises:
        PolicyError: see the module docstring.
    """
    if raw == "private":
        raise _policy_error(path, "max_rows_per_unit = \"private\" needs an outer limit: write "
                                  "max_rows_per_unit = { private = true, outer = 1024 } (the largest m allowed, "
                                  "from domain knowledge, never from the data)", table)
    if not isinstance(raw, dict):
        return None
    extra = sorted(set(raw) - KEYS)
    if extra:
        raise _policy_error(path, f"max_rows_per_unit = {{ … }} takes private, outer, quantile and sum_quantile "
                                  f"(got {extra[0]!r})", table)
    if raw.get("private") is not True:
        raise _policy_error(path, f"max_rows_per_unit = {{ … }} declares private truncation: private = true "
                                  f"(got {raw.get('private')!r}); a fixed cap is written max_rows_per_unit = 5", table)
    outer = raw.get("outer")
    if not isinstance(outer, int) or isinstance(outer, bool) or not 1 <= outer <= max_contribution:
        raise _policy_error(path, f"max_rows_per_unit's outer must be an integer in [1, {max_contribution}] "
                                  f"(got {outer!r})", table)
    q, sq = raw.get("quantile", DEFAULT_QUANTILE), raw.get("sum_quantile", DEFAULT_SUM_QUANTILE)
    for key, v in (("quantile", q), ("sum_quantile", sq)):
        if not _is_number(v) or not math.isfinite(float(v)) or not 0 < float(v) < 1:
            raise _policy_error(path, f"max_rows_per_unit's {key} must be a number in (0, 1) (got {v!r})", table)
    return PrivateTruncation(int(outer), float(q), sum_quantile=float(sq))
