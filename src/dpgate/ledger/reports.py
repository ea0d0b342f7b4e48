"""What the ledger reports: charge receipts, spend reports, cap changes and policy drift.

Reported ε ("ε used so far") is the ledger's one conversion, the cap rule itself
(:func:`dpgate.ledger.caps.ledger_epsilon`, via :meth:`dpgate.ledger.filter.Totals.spent_epsilon`):
[BBG+20] Thm. 21 at the orders of the ledger's RDP grid, the best one, for whatever was composed
(zCDP charges as the curve α·ρ, [BS16] Def. 1.1), at δ − selection_delta (the part of δ that ρ is
converted at; the spent selection δ adds to it). A spend equal to ρ_cap is therefore stated as
the cap's ε, and a request's ε is turned into ρ by the inverse (:func:`~dpgate.ledger.caps.ledger_rho`).
The textbook conversions ([CKS20] Cor. 13 at a continuous order, exact Gaussian DP [BW18]) are
slightly tighter and are shown beside it by ``dpgate accounting`` only. A pure-ε charge's receipt
states its own ε at δ = 0 (:func:`~dpgate.ledger.filter.charge_statement`).

References: [CKS20] Canonne, Kamath, Steinke 2020 (arXiv:2004.00010);
[BBG+20] Balle, Barthe, Gaboardi, Hsu, Sato 2020 (arXiv:1905.09982);
[BW18] Balle & Wang 2018.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from dpgate import accounting
from dpgate.accounting import Cost
from dpgate.ledger.caps import CapSpec
from dpgate.ledger.filter import BudgetCurve, Totals, rho_epsilon
from dpgate.ledger.validation import json_float

__all__ = [
    "ChargeReceipt",
    "ConsumerSpend",
    "SpendReport",
    "PolicyDrift",
    "build_spend_report",
    "receipt_from_entry",
    "cap_change_result",
    "cap_standing",
]


@dataclass(frozen=True)
class ChargeReceipt:
    """What :meth:`Ledger.charge` returns.

    Attributes:
        charge_id: ``chg_`` + 24 hex characters.
        population, consumer: who was charged.
        cost: the charged :class:`~dpgate.accounting.Cost` (this charge alone).
        rho: the cost's ρ, or for an RDP curve the smallest ρ' with
            curve(α) ≤ α·ρ' at every finite grid order (``Cost.rho_bound``; may be ∞
            for a curve that makes no claim at high orders).
        epsilon_at_delta: this charge alone as ε at ``delta`` (the ledger's conversion)
            (``accounting.cost_epsilon``; never to be summed across charges).
        created_at: ISO-8601 UTC timestamp of the entry.
        duplicate: True if ``release_key`` had already been charged and this is
            the stored receipt (nothing new was charged).
        delta: the δ at which ``epsilon_at_delta`` is stated: the δ the charge was made at (the
            cap's δ less its selection δ), or 0 for a pure-ε charge.
        release_key: the single-flight key given with the charge, or None.
        seq: the entry's position in the ledger's hash chain.
        cap: the cap the ledger enforced when it answered (None if unknown).
        selection_delta: the δ_q the charge spent on partition selection.
        cohorts: the cohorts the charge drew on (each charged its full cost), or None for a
            population without cohorts.
    """

    charge_id: str
    population: str
    consumer: str
    cost: Cost
    rho: float
    epsilon_at_delta: float
    created_at: str
    duplicate: bool = False
    delta: float | None = None
    release_key: str | None = None
    seq: int | None = None
    cap: CapSpec | None = None
    selection_delta: float = 0.0
    cohorts: tuple[str, ...] | None = None

    @property
    def filter(self) -> str | None:
        """The filter that admitted the charge: ``"gdp"`` (the Gaussian-DP filter of a population
        whose cap composes in Gaussian DP) or ``"renyi"`` (the Rényi/zCDP filter); None if the
        cap is unknown."""
        return None if self.cap is None else ("gdp" if self.cap.gdp else "renyi")

    @property
    def rho_checked(self) -> float:
        """The charge in ρ units at the orders the cap checks (:meth:`CapSpec.rho_checked`);
        ``rho`` (the stored bound over every order) when the cap is unknown."""
        return self.rho if self.cap is None else self.cap.rho_checked(self.cost)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form (``cost`` via ``Cost.to_dict``; ∞ as ``"inf"``; ``cap`` as
        :meth:`CapSpec.public`). ``rho`` is the stored column (ρ, or for an RDP curve the
        bound over every finite order: ∞ for a DP-SGD curve); ``rho_checked`` is the ρ
        the cap check compared (orders ≤ α_cap, :meth:`CapSpec.rho_checked`)."""
        return {
            "charge_id": self.charge_id,
            "population": self.population,
            "consumer": self.consumer,
            "cost": self.cost.to_dict(),
            "rho": json_float(self.rho),
            "rho_checked": json_float(self.rho_checked),
            "epsilon_at_delta": json_float(self.epsilon_at_delta),
            "delta": self.delta,
            "selection_delta": self.selection_delta,
            "created_at": self.created_at,
            "duplicate": self.duplicate,
            "release_key": self.release_key,
            "seq": self.seq,
            "cap": None if self.cap is None else self.cap.public(),
            **({"cohorts": list(self.cohorts)} if self.cohorts is not None else {}),
            **({"filter": "gdp", "gdp_mu": self.cost.gdp_bound} if self.filter == "gdp" else {}),
        }


@dataclass(frozen=True)
class ConsumerSpend:
    """One consumer's part of a :class:`SpendReport` (ρ totals, ε at the cap's δ less its selection δ).

    Attributes:
        name: consumer name.
        share: its allocation share (None for a consumer of an open population,
            or one whose allocation was since removed: 0 then).
        cap_rho: share × ρ_cap.
        spent_rho, spent_epsilon: its spend (ρ units as in :class:`SpendReport`).
        remaining_rho, remaining_epsilon: the largest zCDP charge it can still
            make (bounded by its own and the population's remaining ρ; ≥ 0), and
            that charge's ε alone.
        charges: number of its charges.
        selection_delta_spent: δ it spent on partition selection.
        remaining_mu2: in a Gaussian-DP population, the Σμ² it can still spend (share × μ_cap²
            less its Σμ², bounded by the population's; None otherwise); ``remaining_epsilon`` is
            then the exact ε of √remaining_mu2-GDP ([DRS22] Cor. 2.13).
    """

    name: str
    share: float | None
    cap_rho: float
    spent_rho: float
    spent_epsilon: float
    remaining_rho: float
    remaining_epsilon: float
    charges: int
    selection_delta_spent: float = 0.0
    remaining_mu2: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{share, cap_rho, spent_rho, spent_epsilon, remaining_rho, remaining_epsilon, charges,
        selection_delta_spent}`` (and ``remaining_mu`` in a Gaussian-DP population)."""
        gdp = {} if self.remaining_mu2 is None else {"remaining_mu": math.sqrt(self.remaining_mu2)}
        return {**gdp,
            "share": self.share,
            "cap_rho": self.cap_rho,
            "spent_rho": json_float(self.spent_rho),
            "spent_epsilon": json_float(self.spent_epsilon),
            "remaining_rho": self.remaining_rho,
            "remaining_epsilon": json_float(self.remaining_epsilon),
            "charges": self.charges,
            "selection_delta_spent": self.selection_delta_spent,
        }


@dataclass(frozen=True)
class SpendReport:
    """Spent and remaining budget of one population (and each consumer).

    Attributes:
        population: the population.
        epsilon, delta, rho_cap: the current cap ((ε, δ) and its ρ; totals).
        spent_rho: ρ spent (Σρ for ρ-only histories; for histories with RDP
            curves the smallest ρ' with S(α) ≤ α·ρ' at every checked order).
        spent_epsilon: ε of everything composed, at the cap's δ less the selection δ, by the
            ledger's one conversion (``conversion`` names it).
        remaining_rho: ρ_cap − spent_rho, clamped at 0: the largest zCDP charge
            that still fits the population.
        remaining_epsilon: the ε (at δ) of one zCDP charge of ``remaining_rho``
            (ε is not additive: spent + remaining ε ≠ cap ε in general).
        charges: number of charges.
        conversion: ``"none"`` (nothing spent) or ``"ledger"`` (the ledger's one conversion,
            :data:`dpgate.ledger.caps.LEDGER_RULE`).
        consumers: consumer name → :class:`ConsumerSpend` (allocated consumers and
            any that charged).
        allocations: the current allocations (empty: open population).
        cap: the cap in force (:class:`~dpgate.ledger.caps.CapSpec`).
        selection_delta_spent: δ spent on partition selection (Σδ_q).
        continuous_gaussian: every charge is a continuous Gaussian (``Cost.kind`` "gaussian",
            e.g. a DP-SGD run without amplification): the history is then exactly √(2ρ)-GDP
            ([DRS19] Cor. 3.3), which the membership-attack bound uses; reported ε stays the
            ledger's one conversion.
        spent_mu2, remaining_mu2: in a Gaussian-DP population (``cap.gdp``), Σμ² spent and
            μ_cap² − Σμ² (≥ 0); None otherwise. ``spent_epsilon`` and ``remaining_epsilon`` are
            then the exact ε of √spent_mu2- and √remaining_mu2-GDP ([DRS22] Cor. 2.13,
            :func:`dpgate.accounting.gdp_epsilon`), not the Rényi conversion of a ρ.
    """

    population: str
    epsilon: float
    delta: float
    rho_cap: float
    spent_rho: float
    spent_epsilon: float
    remaining_rho: float
    remaining_epsilon: float
    charges: int
    conversion: str
    consumers: Mapping[str, ConsumerSpend] = field(default_factory=dict)
    allocations: Mapping[str, float] = field(default_factory=dict)
    cap: CapSpec | None = None
    selection_delta_spent: float = 0.0
    continuous_gaussian: bool = False
    spent_mu2: float | None = None
    remaining_mu2: float | None = None

    @property
    def gdp(self) -> bool:
        """True if the population composes in Gaussian DP (its figures are μ-based)."""
        return self.remaining_mu2 is not None

    def to_dict(self) -> dict[str, Any]:
        """``{population, cap {epsilon, delta, rho, alpha_cap, selection_delta, rule}, spent
        {rho, epsilon, selection_delta}, remaining {rho, epsilon, selection_delta}, charges,
        conversion, consumers {name: {...}}}``; in a Gaussian-DP population also ``composition``
        ("gdp"), ``spent.mu``/``remaining.mu`` and ``gdp {mu_cap, spent_mu2, remaining_mu2}``."""
        cap = self.cap.public() if self.cap is not None else {"epsilon": self.epsilon, "delta": self.delta,
                                                              "rho": self.rho_cap}
        sel = self.cap.selection_delta if self.cap is not None else 0.0
        out = {
            "population": self.population,
            "cap": cap,
            "spent": {"rho": json_float(self.spent_rho), "epsilon": json_float(self.spent_epsilon),
                      "selection_delta": self.selection_delta_spent},
            "remaining": {"rho": self.remaining_rho, "epsilon": json_float(self.remaining_epsilon),
                          "selection_delta": max(0.0, sel - self.selection_delta_spent)},
            "charges": self.charges,
            "conversion": self.conversion,
            "consumers": {k: v.to_dict() for k, v in self.consumers.items()},
        }
        if self.gdp:
            s2, r2 = self.spent_mu2 or 0.0, self.remaining_mu2 or 0.0
            out["composition"] = "gdp"
            out["spent"]["mu"] = math.sqrt(s2)
            out["remaining"]["mu"] = math.sqrt(r2)
            out["gdp"] = {"mu_cap": self.cap.mu_cap if self.cap is not None else None, "spent_mu2": s2,
                          "remaining_mu2": r2,
                          "note": "Gaussian-DP filter (Smith & Thakurta 2022): mu_i^2 add up to at most mu_cap^2; "
                                  "epsilon is the exact conversion of mu (Dong, Roth & Su 2022, Cor. 2.13)"}
        return out


def _gdp_epsilon(mu2: float, delta: float) -> float:
    """The exact ε at δ of √mu2-GDP ([DRS22] Cor. 2.13)."""
    return accounting.gdp_epsilon(math.sqrt(max(0.0, mu2)), delta)


def build_spend_report(
    population: str,
    cap: CapSpec,
    allocations: Mapping[str, float],
    population_totals: Totals,
    consumer_totals: Mapping[str, Totals],
) -> SpendReport:
    """Build a :class:`SpendReport` from a population's cap, allocations and totals (pure).

    Args:
        population: name.
        cap: the current cap.
        allocations: the current allocations (empty: open population).
        population_totals: the population's totals.
        consumer_totals: consumer → totals (consumers that charged).

    Returns:
        The report (ε at ``cap.rho_delta``; remaining never negative).
    """
    d = cap.rho_delta
    pb = BudgetCurve.of(cap)
    p_spent = population_totals.rho_equivalent(pb)
    p_eps, conversion = population_totals.spent_epsilon(pb, d)
    p_rem = max(0.0, cap.rho_cap - p_spent)
    # Gaussian-DP population: remaining Σμ² and its exact ε (not the Rényi ε of a remaining ρ)
    p_mu2 = population_totals.gdp_mu2 if pb.gdp else None
    p_rem_mu2 = None if p_mu2 is None else max(0.0, pb.mu2 - p_mu2)  # type: ignore[operator]
    p_rem_eps = rho_epsilon(p_rem, d) if p_rem_mu2 is None else _gdp_epsilon(p_rem_mu2, d)
    consumers: dict[str, ConsumerSpend] = {}
    names = list(allocations) + sorted(n for n in consumer_totals if n not in allocations)
    for name in names:
        t = consumer_totals.get(name, Totals())
        share: float | None = allocations.get(name, 0.0) if allocations else None
        cb = BudgetCurve.of(cap, 1.0 if share is None else share)
        spent = t.rho_equivalent(cb)
        eps, _ = t.spent_epsilon(cb, d)
        rem = max(0.0, min(cb.rho - spent, p_rem))
        c_mu2 = t.gdp_mu2 if p_rem_mu2 is not None else None
        if c_mu2 is None:
            consumers[name] = ConsumerSpend(name, share, cb.rho, spent, eps, rem, rho_epsilon(rem, d), t.charges,
                                            t.selection_value)
        else:
            rem_mu2 = max(0.0, min(cb.mu2 - c_mu2, p_rem_mu2))  # type: ignore[operator,type-var]
            consumers[name] = ConsumerSpend(name, share, cb.rho, spent, eps, rem, _gdp_epsilon(rem_mu2, d),
                                            t.charges, t.selection_value, rem_mu2)
    return SpendReport(population, cap.epsilon, cap.delta, cap.rho_cap, p_spent, p_eps, p_rem,
                       p_rem_eps, population_totals.charges, conversion, consumers,
                       dict(allocations), cap, population_totals.selection_value,
                       population_totals.continuous_gaussian_only,
                       None if p_rem_mu2 is None else p_mu2, p_rem_mu2)


def entry_rho_checked(entry: Mapping[str, Any], cap: CapSpec | None) -> Any:
    """The ρ to show for a displayed charge entry (:meth:`Ledger.entries`): its stored ``rho``
    for a zCDP/Gaussian charge; for an RDP curve the ρ at the orders ``cap`` checks
    (:meth:`CapSpec.rho_checked`, JSON-safe: ∞ as ``"inf"``). Display only: the entry, its
    hash and what replay reads are unchanged."""
    if cap is None or entry.get("kind") != "rdp":
        return entry["rho"]
    cost = entry["cost"]
    return json_float(cap.rho_checked(Cost.from_dict(json.loads(cost) if isinstance(cost, str) else cost)))


def receipt_from_entry(entry: Mapping[str, Any], *, duplicate: bool, cost: Cost | None = None,
                       cap: CapSpec | None = None) -> ChargeReceipt:
    """The :class:`ChargeReceipt` of a stored (or just written) charge entry."""
    return ChargeReceipt(
        charge_id=entry["charge_id"],
        population=entry["population"],
        consumer=entry["consumer"],
        cost=cost if cost is not None else Cost.from_dict(json.loads(entry["cost"])),
        rho=entry["rho"],
        epsilon_at_delta=entry["epsilon_at_delta"],
        created_at=entry["created_at"],
        duplicate=duplicate,
        delta=entry["delta"],
        release_key=entry["release_key"],
        seq=entry["seq"],
        cap=cap,
        selection_delta=entry.get("selection_delta") or 0.0,
        cohorts=None if entry.get("cohorts") is None else tuple(json.loads(entry["cohorts"])),
    )


def cap_standing(cap: CapSpec, population_totals: Totals) -> dict[str, Any]:
    """Where a population stands against ``cap``: ``{exhausted, spent, remaining, over_by}``.

    ``spent``/``remaining`` are ``{rho, epsilon}`` (ε at the cap's δ less its selection δ); ``over_by`` is None
    unless the spend exceeds the cap, then ``{rho, epsilon}``: how much more ρ was spent than
    the cap allows, and how much the ε of the spend exceeds the cap's ε.
    """
    b = BudgetCurve.of(cap)
    spent = population_totals.rho_equivalent(b)
    eps, _ = population_totals.spent_epsilon(b, cap.rho_delta)
    rem = max(0.0, cap.rho_cap - spent)
    mu2 = population_totals.gdp_mu2 if b.gdp else None
    rem_eps = rho_epsilon(rem, cap.rho_delta) if mu2 is None else _gdp_epsilon(b.mu2 - mu2, cap.rho_delta)  # type: ignore[operator]
    over = None
    if spent > cap.rho_cap:
        over = {"rho": spent - cap.rho_cap, "epsilon": json_float(max(0.0, eps - cap.epsilon))}
    return {
        "exhausted": spent >= cap.rho_cap,
        "spent": {"rho": spent, "epsilon": json_float(eps)},
        "remaining": {"rho": rem, "epsilon": json_float(rem_eps)},
        "over_by": over,
    }


def cap_change_result(
    population: str,
    old: CapSpec,
    new: CapSpec,
    event: Mapping[str, Any] | None,
    actor: str,
    reason: str,
    standing: Mapping[str, Any],
) -> dict[str, Any]:
    """The return value of :meth:`Ledger.set_cap` (``event`` None: the cap was unchanged).

    ``{population, changed, old, new, event_id, actor, reason, created_at, exhausted, spent,
    remaining, over_by, message}``; ``standing`` is :func:`cap_standing` under the cap now in force.
    """
    out: dict[str, Any] = {"population": population, "changed": event is not None, "old": old.to_dict(),
                           "new": (new if event is not None else old).to_dict(),
                           "event_id": None if event is None else event["event_id"],
                           "actor": actor, "reason": reason,
                           "created_at": None if event is None else event["created_at"]}
    out.update(standing)
    cap = new if event is not None else old
    if standing["over_by"] is not None:
        o = standing["over_by"]
        out["message"] = (f"the cap of {population!r} is now below what was already spent: rho {o['rho']:.6g} "
                          f"over the cap's rho = {cap.rho_cap:.6g} (epsilon {o['epsilon']} over "
                          f"{cap.epsilon:.4g}); every further charge is refused, and past charges stay")
    elif standing["exhausted"]:
        out["message"] = f"the cap of {population!r} is now exactly spent; every further charge is refused"
    else:
        out["message"] = (f"the cap of {population!r} is epsilon = {cap.epsilon:.4g}, delta = {cap.delta:.3g}; "
                          f"rho = {standing['remaining']['rho']:.6g} remains")
    return out


@dataclass(frozen=True)
class PolicyDrift:
    """How a policy file's cap and allocations compare with the ledger's (which hold).

    Attributes:
        population: the population.
        ledger_cap, ledger_allocations: what the ledger enforces.
        policy_cap, policy_allocations: what the policy file states (its cap fixed by the
            current rule, as ``dpgate caps apply`` would adopt it).
        created: True if the population was created from this policy file just now.
        ledger_cohort_column, policy_cohort_column: the cohort column the ledger enforces and
            the one the file states (None: no cohorts; issue 23).
        policy_composition: the file's ``[budget] composition`` (``"renyi"``/``"gdp"``), or None
            when the caller states none (then the ledger's is not compared).
    """

    population: str
    ledger_cap: CapSpec
    ledger_allocations: Mapping[str, float]
    policy_cap: CapSpec
    policy_allocations: Mapping[str, float]
    created: bool = False
    ledger_cohort_column: str | None = None
    policy_cohort_column: str | None = None
    policy_composition: str | None = None

    @property
    def composition_differs(self) -> bool:
        """The file states another composition rule than the ledger enforces (fixed once charged)."""
        return self.policy_composition is not None and self.policy_composition != self.ledger_cap.composition

    @property
    def cohorts_differ(self) -> bool:
        """The file states another cohort column (or cohorts on/off) than the ledger enforces."""
        return self.ledger_cohort_column != self.policy_cohort_column

    @property
    def cap_differs(self) -> bool:
        """The file states another (ε, δ) (or ρ, or selection δ) than the ledger enforces."""
        return not self.ledger_cap.same_values(self.policy_cap)

    @property
    def allocations_differ(self) -> bool:
        """The file states other allocations than the ledger's."""
        return dict(self.ledger_allocations) != dict(self.policy_allocations)

    @property
    def legacy_rule(self) -> bool:
        """The ledger's cap was fixed by the legacy rule (every order checked)."""
        return self.ledger_cap.alpha_cap is None

    @property
    def drifted(self) -> bool:
        """The file's values differ from the ledger's (cap, allocations or cohort column)."""
        return self.cap_differs or self.allocations_differ or self.cohorts_differ or self.composition_differs

    def differences(self) -> list[str]:
        """One sentence per difference (empty: none)."""
        out = []
        lc, pc = self.ledger_cap, self.policy_cap
        if self.cap_differs:
            out.append(f"cap: the policy file states epsilon = {pc.epsilon:.6g}, delta = {pc.delta:.3g}"
                       f"{f', selection_delta = {pc.selection_delta:.3g}' if pc.selection_delta else ''}; "
                       f"the ledger enforces epsilon = {lc.epsilon:.6g}, delta = {lc.delta:.3g}"
                       f"{f', selection_delta = {lc.selection_delta:.3g}' if lc.selection_delta else ''}")
        if self.composition_differs:
            out.append(f"composition: the policy file states composition = {self.policy_composition!r}; the ledger "
                       f"enforces {lc.composition!r} (fixed before the population's first charge: `dpgate caps "
                       "apply` adopts it only while the population has no charge)")
        if self.allocations_differ:
            out.append(f"allocations: the policy file states {dict(self.policy_allocations)}; "
                       f"the ledger enforces {dict(self.ledger_allocations)}")
        if self.cohorts_differ:
            out.append(f"cohorts: the policy file states cohort_column = {self.policy_cohort_column!r}; "
                       f"the ledger enforces {self.ledger_cohort_column!r} (one budget "
                       f"{'per cohort' if self.ledger_cohort_column else 'for the whole population'})")
        return out

    def message(self) -> str:
        """A warning for logs and ``dpgate budget`` ('' when there is nothing to say)."""
        if self.drifted:
            return (f"population {self.population!r}: the policy file differs from the ledger, whose values "
                    f"hold — {'; '.join(self.differences())}. Adopt the file's values with "
                    f"`dpgate caps apply --population {self.population} --reason \"…\"`")
        if self.legacy_rule:
            return (f"population {self.population!r}: its cap was fixed before dpgate checked only the orders up "
                    f"to alpha_cap; `dpgate caps apply --population {self.population} --reason \"…\"` re-fixes "
                    "it (same epsilon and delta) so that curves exploding only at high orders can fit")
        return ""

    def to_dict(self) -> dict[str, Any]:
        """``{drifted, legacy_rule, differences, ledger {cap, allocations}, policy {cap, allocations},
        message}`` (JSON-ready; caps as :meth:`CapSpec.public`)."""
        return {
            "drifted": self.drifted,
            "legacy_rule": self.legacy_rule,
            "differences": self.differences(),
            "ledger": {"cap": self.ledger_cap.public(), "allocations": dict(self.ledger_allocations)},
            "policy": {"cap": self.policy_cap.public(), "allocations": dict(self.policy_allocations)},
            "cohort_column": {"ledger": self.ledger_cohort_column, "policy": self.policy_cohort_column},
            "message": self.message(),
        }
