"""The range each released aggregate can take, from the policy's declared bounds alone.

A bounded aggregate's true value — what the noise hides — lies in a range fixed by the
policy: a count is ≥ 0; an AVG, a quantile, MIN and MAX lie in the column's ``[lower,
upper]``; a VAR_POP in ``[0, (upper − lower)²/4]`` and a STDDEV_POP in ``[0, (upper −
lower)/2]`` (Popoviciu's inequality on variances, 1935); a SUM of values ≥ 0 is ≥ 0 (and
≤ 0 when every value is ≤ 0). The released document states it per column as
``value_ranges`` so that readers can

* clip an error bar (value ± its half-width) and a chart's axis to it — the part of an
  interval outside the range holds no possible true value, so clipping loses no coverage;
* tell a *clamped* value: post-processing clamps counts at 0 (``clamp_counts``) and AVG,
  VAR_POP, STDDEV_POP into their range (:mod:`dpgate.postprocess.release`), so a released
  value equal to a bound of a ``clamped`` range usually means the noisy estimate fell at
  or beyond it.

Derived outputs (expressions over released cells) have no entry. Pure function of the plan
and the policy (public); nothing here reads data.
"""

from __future__ import annotations

from typing import Any, Mapping

from dpgate.policy import DatasetPolicy
from dpgate.sql.plan import AggregateOutput, QueryPlan

__all__ = ["value_ranges", "clamped_at_bound"]

_COUNTS = ("count", "count_column", "count_distinct_unit", "count_distinct")


def _range(out: AggregateOutput, plan: QueryPlan, policy: DatasetPolicy, clamp_counts: bool) -> dict[str, Any] | None:
    if out.function in _COUNTS:
        return {"lower": 0, "upper": None, "clamped": bool(clamp_counts),
                "rule": "a count is at least 0"}
    table = policy.table(plan.table)
    try:
        col = plan.column_policy(table, out.column) if out.column else None
    except Exception:  # noqa: BLE001 - a column without a policy entry: no range
        return None
    if col is None or not col.bounded:
        return None
    lo, hi = float(col.lower), float(col.upper)
    name = out.column
    if out.function in ("avg", "quantile", "min", "max"):
        clamped = out.function == "avg"
        return {"lower": lo, "upper": hi, "clamped": clamped,
                "rule": f"{name}'s declared bounds"}
    if out.function == "var_pop":
        return {"lower": 0.0, "upper": (hi - lo) ** 2 / 4.0, "clamped": True,
                "rule": f"a variance of values in {name}'s bounds [{lo:g}, {hi:g}] is at most (upper − lower)²/4"}
    if out.function == "stddev_pop":
        return {"lower": 0.0, "upper": (hi - lo) / 2.0, "clamped": True,
                "rule": f"a standard deviation of values in {name}'s bounds [{lo:g}, {hi:g}] is at most (upper − lower)/2"}
    if out.function == "sum":
        if lo >= 0:
            return {"lower": 0.0, "upper": None, "clamped": False, "rule": f"a sum of {name} ≥ 0 is at least 0"}
        if hi <= 0:
            return {"lower": None, "upper": 0.0, "clamped": False, "rule": f"a sum of {name} ≤ 0 is at most 0"}
    return None


def value_ranges(plan: QueryPlan, policy: DatasetPolicy) -> dict[str, dict[str, Any]]:
    """Released column (label) → ``{"lower", "upper", "clamped", "rule"}``: the range its true
    value lies in (None: unbounded on that side) and whether post-processing clamps the
    released value into it (module docstring). Visible aggregate outputs only."""
    clamp = bool(getattr(policy.budget, "clamp_counts", True))
    out: dict[str, dict[str, Any]] = {}
    for o in plan.outputs:
        if o.hidden or not isinstance(o, AggregateOutput):
            continue
        r = _range(o, plan, policy, clamp)
        if r is not None:
            out[o.label or o.name] = r
    return out


def clamped_at_bound(value: Any, entry: Mapping[str, Any] | None) -> bool:
    """Whether a released ``value`` sits on a bound of a clamped range (``value_ranges`` entry):
    the noisy estimate was at or beyond that bound and was clamped to it."""
    if entry is None or not entry.get("clamped") or isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return any(b is not None and float(value) == float(b) for b in (entry.get("lower"), entry.get("upper")))
