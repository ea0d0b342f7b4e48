"""Private selection (issue 15): release the top-k keys of a public candidate set, not their scores.

A selection query (:mod:`dpgate.sql.selection_query`) — ``SELECT key FROM t GROUP BY key
ORDER BY <utility> DESC LIMIT k`` — is answered by the **exponential mechanism**, run as
OpenDP's Gumbel noisy top-k (:func:`dpgate.mechanisms.selection.select_top_k`): each candidate's bounded
score gets independent Gumbel noise of scale ``s`` and the k best noisy scores' keys are
released, best first. Only the keys leave the gateway: the scores, exact or noisy, are never
returned or stored.

**Utility and its sensitivity Δu.** The utility of candidate c is the noisy primitive of the
ORDER BY aggregate computed by the bounding rewrite (:mod:`dpgate.sql.bound`): a row count
(at most m = ``max_rows_per_unit`` rows of one unit per candidate), a count of distinct units
(at most 1 per candidate) or a clamped fixed-point sum (at most m·max(|L|, |U|) per candidate),
i.e. :func:`dpgate.sensitivity.primitive_linf`, in integer units. The exponential mechanism's
sensitivity is a maximum over candidates of one candidate's change,
Δu = max_c max_{D≃D'} |u(D, c) − u(D', c)| (McSherry & Talwar 2007, "Mechanism Design via
Differential Privacy", FOCS, Thm. 6; Dwork & Roth 2014, Def. 3.4 and Thm. 3.10) — the L∞
sensitivity, OpenDP's ``linf_distance`` input metric. It is *not* a sum over candidates: a unit
that contributes to every candidate (``max_groups_per_unit`` ≥ the number of candidates: one
row per user and candidate in an evaluation table) moves each score by at most the per-group
bound, so Δu stays that bound and does not grow with the number of candidates it touches.

**Monotone utilities.** Adding one unit can only raise every count, every distinct-unit count
and every sum of a column with L ≥ 0 (and only lower every sum with U ≤ 0): all scores move in
the same direction. Then the exponential mechanism is ε-DP with ε = Δu/s instead of 2Δu/s
(McSherry & Talwar 2007, remark after Thm. 6; Dwork & Roth 2014, remark after Thm. 3.10);
OpenDP's ``linf_distance(monotonic=True)`` implements this map. Sums over a column with
L < 0 < U are not monotone and use ε = 2Δu/s.

**Cost.** Pure ε₁ per selected key; k keys by peeling (Durfee & Rogers 2019, one-shot Gumbel
top-k) compose to k·ε₁. The ledger is charged in zCDP by the bounded-range conversion:
ρ = k·ε₁²/8 (an ε-bounded-range mechanism is ε²/8-zCDP, Cesar & Rogers 2021, ALT, Sec. 3; the
exponential mechanism is ε-bounded-range, Durfee & Rogers 2019, Sec. 3) — the value OpenDP's
privacy map of ``make_noisy_top_k`` with ``zero_concentrated_divergence`` returns, which is read
back and must agree with the formula. This conversion holds for the Gumbel-noise
(exponential) mechanism only; the design charges permute-and-flip or exponential-noise max
ρ = ε²/2, and dpgate does not offer them.

**Budget.** ``{"epsilon": ε}`` names the pure ε of the whole release (ε₁ = ε/k);
``{"rho": ρ}`` names its zCDP cost (ε₁ = √(8ρ/k)); none: the policy's ``default_query_rho``.
``{"ci95": …}`` is refused: a selection releases no value to put an interval on.

**Release cache.** A repeated identical selection (same plan, budget and data version) is
served from the release store at no cost: it is the same DP output shown again
(post-processing, Dwork & Roth 2014 Prop. 2.1). A fresh draw needs a different budget or data
version, and is charged.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from dpgate import accounting
from dpgate.cohorts import release_guarantee
from dpgate.errors import InvalidBudget, MechanismError, UnsupportedQuery
from dpgate.ledger.filter import charge_statement
from dpgate.mechanisms.selection import select_top_k, top_k_rho
from dpgate.policy import DatasetPolicy
from dpgate.releases import Release, new_release_id, now
from dpgate.representable import check_representable
from dpgate.sensitivity import primitive_linf
from dpgate.sql.bound import bounded_sql_template
from dpgate.sql.plan import KeyOutput
from dpgate.sql.primitives import primitive_kind
from dpgate.sql.selection_query import SelectionQuery

__all__ = ["MECHANISM", "SelectionCalibration", "calibrate_selection", "explain_selection", "noise_signature",
           "resolve_selection_budget", "selection_release"]

#: The mechanism named in every selection release.
MECHANISM = "exponential_mechanism"
#: Relative tolerance between OpenDP's privacy map and ρ = k·ε₁²/8.
_MAP_RTOL = 1e-9
#: Candidate sets up to this size are listed in the release (a public set: free to show).
_LIST_CANDIDATES = 1000


@dataclass(frozen=True)
class SelectionCalibration:
    """The calibrated exponential mechanism of one selection.

    Attributes:
        k: keys selected (peels).
        candidates: size of the public candidate set.
        delta_u: Δu in the utility's integer units (rows, units, ``resolution`` steps).
        delta_u_output: Δu in output units (rows, or column units for a sum).
        monotonic: every score moves the same way when one unit is added or removed.
        epsilon_per_selection: pure ε₁ of one peel.
        epsilon: pure ε of the release, k·ε₁.
        scale: Gumbel scale s in integer units (ε₁ = c·Δu/s, c = 1 monotonic else 2).
        rho: the zCDP charge, k·ε₁²/8 (OpenDP's privacy map).
    """

    k: int
    candidates: int
    delta_u: int
    delta_u_output: float
    monotonic: bool
    epsilon_per_selection: float
    epsilon: float
    scale: float
    rho: float

    @property
    def cost(self) -> accounting.Cost:
        """The ledger charge: ``Cost.zcdp(rho)``."""
        return accounting.Cost.zcdp(self.rho)

    def describe(self) -> dict[str, Any]:
        """JSON-ready description (what the release and explain show)."""
        return {
            "mechanism": MECHANISM,
            "opendp": "make_noisy_top_k(linf_distance(monotonic=%s), zero_concentrated_divergence): Gumbel "
                      "noise" % self.monotonic,
            "k": self.k,
            "candidates": self.candidates,
            "delta_u": self.delta_u_output,
            "delta_u_integer_units": self.delta_u,
            "monotonic": self.monotonic,
            "epsilon_per_selection": self.epsilon_per_selection,
            "epsilon": self.epsilon,
            "gumbel_scale": self.scale,
            "rho": self.rho,
            "conversion": "bounded range: rho = k * epsilon_per_selection^2 / 8 (Cesar & Rogers 2021)",
        }


def resolve_selection_budget(policy: DatasetPolicy, budget: Any) -> dict[str, float]:
    """``{"rho": ρ}`` or ``{"epsilon": ε}`` of a selection (None: the policy's default ρ).

    Raises:
        InvalidBudget: a ``ci95`` budget (a selection releases no value).
    """
    if budget is not None and getattr(budget, "ci95", None) is not None:
        raise InvalidBudget("a selection query releases keys, not values: a ci95 budget does not apply; "
                            "name rho or epsilon", {"field": "ci95"})
    if budget is not None and getattr(budget, "epsilon", None) is not None:
        return {"epsilon": float(budget.epsilon)}
    rho = getattr(budget, "rho", None) if budget is not None else None
    return {"rho": float(rho if rho is not None else policy.budget.default_query_rho)}


def _monotonic(sel: SelectionQuery, policy: DatasetPolicy) -> bool:
    if primitive_kind(sel.utility.kind).monotone:
        return True  # counts and distinct-unit counts only grow when a unit is added
    try:
        col = policy.table(sel.plan.table).column(sel.utility.column)
        return float(col.lower) >= 0 or float(col.upper) <= 0
    except Exception:  # noqa: BLE001 - not a declared bounded column (e.g. an expression): assume not monotone
        return False


def calibrate_selection(sel: SelectionQuery, policy: DatasetPolicy,
                        resolved: Mapping[str, float]) -> SelectionCalibration:
    """Gumbel scale and cost of ``sel`` for a resolved budget (reads no data).

    Returns:
        The calibration; its ρ is OpenDP's privacy map at d_in = Δu, checked against
        k·ε₁²/8 (relative 1e-9) and at most the requested ρ (the scale is widened by a few
        ulps when OpenDP's upward rounding would exceed it).
    Raises:
        UnsupportedQuery: the utility is a constant (Δu = 0: nothing to select privately), or
            some data could make the bounded query overflow (:func:`check_representable`).
        InvalidBudget: the budget is too small for a finite scale.
        MechanismError: OpenDP's map disagrees with the formula.
    """
    plan = sel.plan
    table = policy.table(plan.table)
    check_representable(plan, policy)  # no overflow on any data (dpgate.limits), before the charge
    delta_u = int(primitive_linf(sel.utility, policy, plan.table, plan))
    if delta_u <= 0:
        raise UnsupportedQuery("the selection's utility is constant (its bounds are [0, 0]): no key is "
                               "better than another", {"reason": "selection_constant"})
    k = sel.k
    if "epsilon" in resolved:
        eps_total = float(resolved["epsilon"])
        eps1 = eps_total / k
        target_rho = k * eps1 * eps1 / 8.0
    else:
        target_rho = float(resolved["rho"])
        eps1 = math.sqrt(8.0 * target_rho / k)
        eps_total = k * eps1
    mono = _monotonic(sel, policy)
    c = 1.0 if mono else 2.0
    scale = c * delta_u / eps1 if eps1 > 0 else math.inf
    if not math.isfinite(scale) or scale > 2.0**52:
        raise InvalidBudget("the budget is too small for this selection (Gumbel scale beyond 2^52 integer "
                            "units); raise it", {"scale": None if not math.isfinite(scale) else scale})
    rho = top_k_rho(delta_u, k, scale, monotonic=mono)
    for _ in range(64):  # OpenDP rounds its map upward: widen the scale until it certifies the budget
        if rho <= target_rho:
            break
        scale = math.nextafter(scale, math.inf)
        rho = top_k_rho(delta_u, k, scale, monotonic=mono)
    formula = k * (c * delta_u / scale) ** 2 / 8.0
    if abs(rho - formula) > _MAP_RTOL * max(formula, 1e-300) + 1e-15 or rho > target_rho * (1 + _MAP_RTOL):
        raise MechanismError("OpenDP's noisy top-k privacy map disagrees with rho = k*eps^2/8",
                             {"opendp": rho, "dpgate": formula})
    unit = 1.0
    if sel.utility.kind == "sum":
        try:
            unit = float(table.column(sel.utility.column).resolution or 1.0)
        except Exception:  # noqa: BLE001 - not a declared column: report Δu in integer units
            unit = 1.0
    return SelectionCalibration(k=k, candidates=plan.key_combinations(table), delta_u=delta_u,
                                delta_u_output=delta_u * unit, monotonic=mono, epsilon_per_selection=eps1,
                                epsilon=eps_total, scale=scale, rho=rho)


def _candidate_list(sel: SelectionQuery, policy: DatasetPolicy, n: int) -> list[Any] | None:
    if n > _LIST_CANDIDATES:
        return None
    table = policy.table(sel.plan.table)
    if len(sel.plan.group_by) != 1:
        return None
    keys = sel.plan.key_column(table, sel.plan.group_by[0]).public_keys
    return [_json_key(k) for k in keys] if keys is not None else None


def explain_selection(ledger: Any, dataset: str, policy: DatasetPolicy, sel: SelectionQuery,
                      budget: Any, fit: Callable[[accounting.Cost], Mapping[str, Any]]) -> dict[str, Any]:
    """What :meth:`dpgate.pipeline.gateway.Gateway.explain` shows for a selection: plan, bounded SQL,
    Δu, ε, the mechanism and the charge. Reads no data, charges nothing.

    Args:
        ledger: the ledger (the cap's δ the charge is stated at).
        fit: cost → whether it fits what is left (``cost.fits``, :func:`dpgate.pipeline.budget.fit`).
    """
    resolved = resolve_selection_budget(policy, budget)
    cal = calibrate_selection(sel, policy, resolved)
    cap = ledger.cap(policy.population)
    delta = cap.rho_delta
    plan = sel.plan
    return {
        "dataset": dataset,
        "kind": "selection",
        "canonical_sql": plan.canonical_sql,
        "plan_hash": plan.plan_hash,
        "plan": plan.canonical_dict(),
        "bounded_sql": bounded_sql_template(plan, policy),
        "sensitivity": {sel.utility.id: {"linf": float(cal.delta_u)}},
        "selection": cal.describe(),
        "mechanism": MECHANISM,
        "budget": resolved,
        "cost": {"rho": cal.rho, "epsilon": cal.epsilon,
                 **_stated(cal.cost, delta, cap.gdp),
                 **fit(cal.cost)},
    }


def _stated(cost: accounting.Cost, delta: float, gdp: bool = False) -> dict[str, float]:
    """``{epsilon_at_delta, delta}`` as the receipt will state them (the ledger's one conversion)."""
    eps, d = charge_statement(cost, delta, gdp)
    return {"epsilon_at_delta": eps, "delta": d}


def noise_signature(sel: SelectionQuery) -> str:
    """What a selection noises (its plan, k and direction): the release cache's noise key."""
    body = {"selection": sel.plan.plan_hash, "k": sel.k, "descending": sel.descending}
    return "selection:" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def selection_release(policy: DatasetPolicy, sel: SelectionQuery, cal: SelectionCalibration,
                      resolved: Mapping[str, float], receipt: Any, key: str, version: str,
                      values: Mapping[str, Any]) -> Release:
    """The release of a selection from the bounded query's result ``values``: the k keys the
    exponential mechanism picks (best first) as ``rows``, ``accuracy = {}``, and ``selection``
    (candidates, Δu, ε, the mechanism, ρ). The scores are never released or stored.

    Args:
        cal: the calibration that was charged. resolved: the resolved budget (dict form).
        receipt: the ledger's receipt. key: the noise cache key. version: the data version.
    """
    plan = sel.plan
    scores = np.asarray(values[sel.utility.id])
    picked = select_top_k(scores, sel.k, cal.scale, monotonic=cal.monotonic, descending=sel.descending)
    del scores
    visible = [o for o in plan.outputs if not o.hidden]
    columns = [o.label or o.name for o in visible]
    rows = [[_json_key(values[o.column][i]) for o in visible if isinstance(o, KeyOutput)] for i in picked]
    table = policy.table(plan.table)
    cap = receipt.cap.public() if getattr(receipt, "cap", None) is not None \
        else {"epsilon": policy.budget.epsilon, "delta": policy.budget.delta}
    release_id, created = new_release_id(), now()
    selection = cal.describe()
    utility = plan.output(plan.order_by[0].output)
    selection["utility"] = utility.label or utility.name
    selection["order"] = "desc" if sel.descending else "asc"
    selection["candidate_keys"] = _candidate_list(sel, policy, cal.candidates)
    selection["scores_released"] = False
    document = {
        "release_id": release_id,
        "dataset": policy.name,
        "table": plan.table,
        "kind": "selection",
        "columns": columns,
        "rows": rows,
        "accuracy": {},
        "charge": None if receipt is None else {
            "charge_id": receipt.charge_id, "rho": receipt.rho, "epsilon_at_delta": receipt.epsilon_at_delta,
            "delta": receipt.delta, "consumer": receipt.consumer,
        },
        "cached": False,
        "data_version": version,
        "created_at": created,
        "plan_hash": plan.plan_hash,
        "canonical_sql": plan.canonical_sql,
        "mechanism": MECHANISM,
        "noise_scales": {},
        "selection": selection,
        "budget": dict(resolved),
        "bounds": {
            "privacy_unit": table.privacy_unit,
            "max_groups_per_unit": table.max_groups_per_unit,
            "max_rows_per_unit": table.max_rows_per_unit,
            "columns": {c: {"lower": col.lower, "upper": col.upper, "resolution": col.resolution}
                        for c, col in table.columns.items() if col.bounded},
        },
        "guarantee": {"population": policy.population, "privacy_unit": table.privacy_unit or "record",
                      "cap": cap, **release_guarantee(policy, receipt)},
    }
    return Release(release_id, key, policy.name, plan.plan_hash, created, document, None)


def _json_key(value: Any) -> Any:
    """A key as a JSON scalar (NumPy scalars unwrapped; dates and other values as text)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
