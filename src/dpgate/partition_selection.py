"""Private partition selection in the query pipeline (issue 11): budget, calibration, release.

The partition-selection runner (:class:`dpgate.pipeline.runners.PartitionSelectionRunner`) calls
these for a plan with privately selected keys (:attr:`~dpgate.sql.plan.QueryPlan.selected_keys`; plan side in
:mod:`dpgate.sql.partition_selection`, the OpenDP threshold mechanism in
:mod:`dpgate.mechanisms`):

* :func:`selection_budget` — the δ_q the query will spend: the request's
  ``budget.delta``, else the policy's ``default_selection_delta``; refused (no
  charge) when the policy turns selection off (``selection_delta = 0``), when the
  population's ledger cap reserves no selection δ (adopt the policy with
  ``dpgate caps apply``), when δ_q exceeds the reserve, or with a ``ci95`` budget.
* :func:`calibrate_selecting` — the query's ρ (or ε) is split equally over the
  noisy primitives *and* the selection histogram (one more vector of sensitivity
  (ℓ0, ℓ2, ℓ∞) = (k, √k, 1)); the histogram's scale then fixes the threshold T
  (smallest integer with OpenDP's δ ≤ δ_q). Cost: (ρ, δ) approximate zCDP by
  composition (Bun & Steinke 2016, Lemma 2.3, for the ρ parts; the δ parts add,
  a union bound over the bad events, Bun & Steinke 2016 Def. 1.2 / Rogers 2023
  §3). The primitives that *are* the unit count (:func:`~dpgate.sql.partition_selection.reused_primitives`)
  take the threshold mechanism's noisy counts and get no share of their own.
* :func:`select_rows` — after the bounded SQL: the threshold mechanism on the
  candidates' unit counts (NumPy vectors, noised in chunks over threads by
  :func:`~dpgate.mechanisms.selection.threshold_select`; why that is OpenDP's one mechanism on
  the whole histogram is stated there), the rows of the selected candidates kept, the
  other primitives noised (:func:`~dpgate.mechanisms.sample`) on those rows only.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from dpgate.errors import InvalidBudget, UnsupportedQuery
from dpgate.mechanisms import Calibration, calibrate, mechanism_name, sample
from dpgate.mechanisms.selection import calibrate_selection, threshold_select
from dpgate.policy import DatasetPolicy
from dpgate.sql import partition_selection as selection
from dpgate.sql.plan import QueryPlan


def selection_budget(policy: DatasetPolicy, plan: QueryPlan, cap_selection_delta: float,
                     requested: float | None, ci95: bool) -> float | None:
    """δ_q of this query (None when it selects no keys).

    Args:
        cap_selection_delta: the ``selection_delta`` of the cap the ledger enforces.
        requested: the request's ``budget.delta`` (None: the policy's default).
        ci95: the request's budget is a ``ci95`` target.
    Raises:
        UnsupportedQuery: selection off in the policy, or the ledger's cap reserves none.
        InvalidBudget: ``budget.delta`` on a query that selects nothing, δ_q above the
            reserve, or a ``ci95`` budget.
    """
    if not plan.selected_keys:
        if requested is not None:
            raise InvalidBudget(
                "budget.delta is the δ spent on private partition selection, and this query selects no "
                "keys (every GROUP BY key has public keys); leave it out", {"field": "delta"})
        return None
    cols = ", ".join(plan.selected_keys)
    details = {"selected_keys": list(plan.selected_keys), "population": policy.population}
    stated = getattr(policy.budget, "selection_delta_stated", True)
    if getattr(policy.budget, "composition", "renyi") == "gdp":  # issue 22 item 1: no GDP claim for δ
        raise UnsupportedQuery(
            f"GROUP BY {cols} needs public keys in the policy: population {policy.population!r} composes in "
            "Gaussian DP ([budget] composition = \"gdp\"), whose filter admits no partition selection (its δ "
            "has no Gaussian-DP claim); give the key column public keys",
            {**details, "selection_delta": 0.0, "composition": "gdp"})
    if not policy.budget.selection_delta and stated:
        raise UnsupportedQuery(
            f"GROUP BY {cols} needs public keys in the policy: private partition selection is turned off "
            "for this dataset ([budget] selection_delta = 0)", {**details, "selection_delta": 0.0})
    if not cap_selection_delta:
        if not policy.budget.selection_delta:  # issue 22: the default reserve is 0 for this population
            raise UnsupportedQuery(
                f"GROUP BY {cols} needs public keys in the policy or private partition selection, and the "
                f"cap of population {policy.population!r} reserves no δ for it (the default when every "
                f"text/int/bool/date column of its protected tables has public keys); state "
                f"[budget] selection_delta (e.g. δ/2 = {policy.budget.delta / 2:g}) and adopt it with "
                f"`dpgate caps apply --population {policy.population} --reason \"…\"`",
                {**details, "selection_delta": 0.0, "hint": "[budget] selection_delta; dpgate caps apply"})
        raise UnsupportedQuery(
            f"GROUP BY {cols} needs private partition selection, but the cap the ledger enforces for "
            f"population {policy.population!r} reserves no selection delta; an admin adopts the policy "
            f"file's selection_delta with `dpgate caps apply --population {policy.population} "
            "--reason \"…\"`", {**details, "selection_delta": 0.0, "hint": "dpgate caps apply"})
    if ci95:
        raise InvalidBudget("a ci95 budget is not supported for queries with private partition selection; "
                            "give rho or epsilon", {"selected_keys": list(plan.selected_keys)})
    # a default-0 policy over a ledger cap that kept its reserve (a population created before issue 22)
    default = policy.budget.default_selection_delta or cap_selection_delta / 100
    delta = default if requested is None else requested
    if not delta <= cap_selection_delta:
        raise InvalidBudget(
            f"budget.delta {delta:g} exceeds the selection delta of the cap ({cap_selection_delta:g})",
            {"field": "delta", "max": cap_selection_delta})
    return float(delta)


def calibrate_selecting(plan: QueryPlan, policy: DatasetPolicy, pairs: Mapping[str, tuple[float, float]],
                        *, mechanism: str, delta: float, rho: float | None = None,
                        epsilon: float | None = None) -> Calibration:
    """Calibrate a selecting query: the primitives and the selection histogram share the budget.

    Args:
        pairs: primitive id → (Δ1, Δ2) (:func:`dpgate.sensitivity.sensitivities`, k_eff = k).
        delta: δ_q (from :func:`selection_budget`).
        rho, epsilon: the release's budget (as for :func:`~dpgate.mechanisms.calibrate`).
    Returns:
        A :class:`~dpgate.mechanisms.Calibration` whose ``cost`` is the whole ρ (or ε), with
        ``selection`` set and ``scales`` covering every primitive (reused ones at the
        selection's σ). Raises as :func:`calibrate` and :func:`calibrate_selection`.
    """
    k = policy.table(plan.table).max_groups_per_unit
    reused = selection.reused_primitives(plan, policy)
    own = {pid: pair for pid, pair in pairs.items() if pid not in reused}
    own[selection.SELECTION_ID] = (float(k), math.sqrt(k))  # (Δ1, Δ2) of the unit-count histogram
    cal = calibrate(own, mechanism=mechanism, rho=rho, epsilon=epsilon)
    sel_scale = cal.scales[selection.SELECTION_ID]
    sel = calibrate_selection(mechanism, sel_scale, k, delta)
    scales = {pid: s for pid, s in cal.scales.items() if pid != selection.SELECTION_ID}
    scales.update({pid: sel_scale for pid in reused})
    costs = dict(cal.primitive_costs)
    costs.pop(selection.SELECTION_ID)
    costs.update({pid: 0.0 for pid in reused})  # paid by the selection
    d_in = {pid: v for pid, v in cal.sensitivities.items() if pid != selection.SELECTION_ID}
    d_in.update({pid: cal.sensitivities[selection.SELECTION_ID] for pid in reused})
    return dataclasses.replace(cal, scales={p.id: scales[p.id] for p in plan.primitives},
                               primitive_costs=costs, sensitivities=d_in, selection=sel, reused=reused)


def select_rows(plan: QueryPlan, policy: DatasetPolicy, cal: Calibration,
                values: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Run the threshold mechanism and noise the selected rows.

    Args:
        values: the bounded SQL's columns (keys, primitives, the candidates' unit counts).
    Returns:
        (keys, noisy): group-key column → values of the released rows; primitive id → noisy
        integer vector on those rows.
    """
    per = selection.public_combinations(plan, policy)
    counts = selection.candidate_counts(dict(values), per)
    chosen = threshold_select(cal.selection, counts)  # NumPy arrays, chunks over threads
    mask = selection.row_mask(chosen.index, len(counts), per)
    keys = {c: np.asarray(values[c])[mask] for c in plan.group_by}
    rest = dataclasses.replace(cal, scales={pid: s for pid, s in cal.scales.items() if pid not in cal.reused},
                               selection=None, reused=())
    noisy = sample(rest, {pid: np.asarray(values[pid])[mask] for pid in rest.scales}) if rest.scales else {}
    for pid in cal.reused:  # P = 1 here: one row per selected candidate, in index order
        noisy[pid] = chosen.noisy.copy()
    return keys, noisy


def describe(plan: QueryPlan, cal: Calibration, requested_delta: float) -> dict[str, Any]:
    """The ``partition_selection`` block of a release and of explain."""
    sel = cal.selection
    out = {
        "selected_keys": list(plan.selected_keys),
        "public_keys": list(plan.public_group_by),
        **sel.describe(),
        "delta_requested": requested_delta,
        "counts_from_selection": [p for p in cal.reused],
        "note": ("keys released only if their noisy count of distinct privacy units exceeds the "
                 "threshold (OpenDP's " + ("Gaussian" if mechanism_name(cal.mechanism) == "discrete_gaussian"
                                           else "Laplace") + " threshold mechanism); NULL is a key like any other"),
    }
    if getattr(cal, "quantiles", None):  # issue 21 item 8: selection, then the selected groups' quantiles
        out["composition"] = cal.composition()
    return out
