"""What the gateway publishes about a population's budget beyond its cap (issue 23).

* the **renewal rule** — ``"fixed cap, no renewal"`` or ``"per cohort"`` with each cohort's
  spend (:func:`dpgate.ledger.renewal.guarantee_statement`);
* the **spend per cohort** for populations with cohorts: every declared cohort, those no
  charge touched yet at the whole cap;
* the **membership-attack bound** of the cap and of the current spend (:mod:`dpgate.attack`);
* the **proxy** a refused query may be answered from, with its provenance.

Used by :meth:`dpgate.service.Gateway.dataset` (``GET /v1/datasets/{name}``),
:meth:`~dpgate.service.Gateway.budget`, ``dpgate budget`` and the admin page. Reads the ledger
only; no data.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from dpgate import accounting
from dpgate.attack import cap_attack_bound, spend_attack_bound
from dpgate.ledger.filter import rho_epsilon
from dpgate.ledger.renewal import guarantee_statement
from dpgate.policy import DatasetPolicy

__all__ = ["cohort_table", "budget_cohort_views", "dataset_budget_views", "cohort_remaining", "cap_change_preview"]


def _fresh(report_cap: Any, allocations: dict[str, float]) -> dict[str, Any]:
    """A cohort no charge touched: the whole cap remains."""
    rho = report_cap.rho_cap

    def left_epsilon(share: float) -> float:  # a Gaussian-DP cap: the exact ε of √share·μ_cap ([DRS22] Cor. 2.13)
        if getattr(report_cap, "gdp", False):
            return accounting.gdp_epsilon(math.sqrt(share) * report_cap.mu_cap, report_cap.rho_delta)
        return rho_epsilon(share * rho, report_cap.rho_delta)

    eps = left_epsilon(1.0)
    consumers = {name: {"share": share, "spent_rho": 0.0, "remaining_rho": share * rho,
                        "remaining_epsilon": left_epsilon(share), "charges": 0}
                 for name, share in allocations.items()}
    return {"spent": {"rho": 0.0, "epsilon": 0.0}, "remaining": {"rho": rho, "epsilon": eps}, "charges": 0,
            "fresh": True, "consumers": consumers}


def cohort_table(ledger: Any, policy: DatasetPolicy) -> dict[str, dict[str, Any]] | None:
    """Cohort → ``{spent {rho, epsilon}, remaining {rho, epsilon}, charges, fresh, consumers}`` for
    every cohort the policy declares and every cohort charged (None without cohorts)."""
    cohorts = getattr(policy, "cohorts", None)
    if cohorts is None or ledger.cohort_column(policy.population) != cohorts.column:
        return None
    reports = ledger.cohort_spend(policy.population)
    cap = ledger.cap(policy.population)
    spend = ledger.spend(policy.population)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(cohorts.names) | set(reports)):
        rep = reports.get(name)
        if rep is None:
            out[name] = _fresh(cap, dict(spend.allocations))
            continue
        d = rep.to_dict()
        out[name] = {"spent": d["spent"], "remaining": d["remaining"], "charges": d["charges"], "fresh": False,
                     "consumers": {k: {"share": v["share"], "spent_rho": v["spent_rho"],
                                       "remaining_rho": v["remaining_rho"],
                                       "remaining_epsilon": v["remaining_epsilon"], "charges": v["charges"]}
                                   for k, v in d["consumers"].items()},
                     "declared": name in cohorts.names}
    for name in out:
        out[name].setdefault("declared", name in cohorts.names)
    return out


def _worst(ledger: Any, policy: DatasetPolicy) -> tuple[str | None, Any]:
    """The charged cohort with the largest spend and its report (None, population report otherwise)."""
    reports = ledger.cohort_spend(policy.population)
    if not reports:
        return None, None
    name = max(reports, key=lambda c: (reports[c].spent_rho, c))
    return name, reports[name]


def budget_cohort_views(ledger: Any, policy: DatasetPolicy) -> dict[str, Any]:
    """Extra fields of a spend report: ``renewal`` and, with cohorts, ``cohort_column``, ``cohorts``
    (every cohort's spend) and ``worst_cohort`` (the most spent; a unit's guarantee is its cohort's)."""
    cap = ledger.cap(policy.population)
    cohorts = getattr(policy, "cohorts", None)
    if cohorts is None or ledger.cohort_column(policy.population) != cohorts.column:  # the ledger's rule holds
        column = ledger.cohort_column(policy.population)
        return {"renewal": guarantee_statement(cap, column)}
    table = cohort_table(ledger, policy) or {}
    worst, _ = _worst(ledger, policy)
    spent = {c: {"epsilon": v["spent"]["epsilon"]} for c, v in table.items() if not v["fresh"]}
    return {"renewal": guarantee_statement(cap, cohorts.column, spent), "cohort_column": cohorts.column,
            "cohorts": table, "worst_cohort": worst,
            "note": "spent/remaining above sum every charge once over all cohorts; a unit's guarantee is its "
                    "cohort's spend (cohorts)"}


def dataset_budget_views(gateway: Any, policy: DatasetPolicy, cap: Any) -> dict[str, Any]:
    """Extra fields of ``GET /v1/datasets/{name}``: ``renewal``, ``cohorts`` (with cohorts),
    ``attack_bound`` ({cap, spent}) and ``proxy`` (or None)."""
    ledger = gateway.ledger
    views = budget_cohort_views(ledger, policy)
    out: dict[str, Any] = {"renewal": views["renewal"]}
    if "cohorts" in views:
        out["cohorts"] = {"column": views["cohort_column"], "worst_cohort": views["worst_cohort"],
                          "spend": views["cohorts"]}
        _, report = _worst(ledger, policy)
    else:
        report = ledger.spend(policy.population)
    out["attack_bound"] = {"cap": cap_attack_bound(cap),
                           "spent": spend_attack_bound(report) if report is not None else spend_attack_bound_none()}
    proxy = getattr(policy, "proxy", None)
    out["proxy"] = None if proxy is None else {
        "dataset": proxy, "provenance": gateway.policy(proxy).provenance,
        "default_for": list(policy.proxy_default_for),
        "note": "queries refused for budget may ask for \"fallback\": \"proxy\": the same plan answered exactly on "
                "this dataset, free, labelled source = proxy, dp = false"}
    return out


def spend_attack_bound_none() -> dict[str, Any]:
    """The bound of nothing spent (TPR = FPR)."""
    from dpgate.attack import attack_bound

    return attack_bound(0.0, 0.0)


def cohort_remaining(ledger: Any, policy: DatasetPolicy, consumer: str | None,
                     scope: Iterable[str]) -> tuple[float, str]:
    """The ρ a charge drawing on ``scope`` can still spend (the least over its cohorts), and who
    binds (for explain's ``cost.fits``)."""
    table = cohort_table(ledger, policy) or {}
    best: tuple[float, str] | None = None
    for cohort in scope:
        row = table.get(cohort)
        if row is None:
            continue
        if consumer is not None and consumer in row["consumers"]:
            left, who = row["consumers"][consumer]["remaining_rho"], f"consumer {consumer!r} in cohort {cohort!r}"
        else:
            left, who = row["remaining"]["rho"], f"cohort {cohort!r} of population {policy.population!r}"
        if best is None or left < best[0]:
            best = (left, who)
    if best is None:
        cap = ledger.cap(policy.population)
        return cap.rho_cap, f"population {policy.population!r}"
    return best


def cap_change_preview(ledger: Any, population: str, epsilon: float, delta: float) -> dict[str, Any]:
    """The attack bound of the cap in force and of a proposed one (the cap form shows both before a
    change). Raises InvalidBudget for an invalid proposal."""
    from dpgate.ledger.caps import validate_cap

    old = ledger.cap(population)
    sel = old.selection_delta if old.selection_delta < delta else 0.0
    new = validate_cap(epsilon, delta, selection_delta=sel, composition=old.composition)
    return {"population": population, "before": {"cap": old.public(), "attack_bound": cap_attack_bound(old)},
            "after": {"cap": new.public(), "attack_bound": cap_attack_bound(new)}}
