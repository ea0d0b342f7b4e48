"""The admin page's budget panel (issue 23): renewal rule, spend per cohort, the attack bound.

For each population: the published renewal rule ("fixed cap, no renewal" or per cohort), the
spend of every cohort (a cohort no charge touched shows the whole cap), and a chart of the
membership-attack bound — the largest true-positive rate any test can reach at each
false-positive rate — for the cap and for the current spend (:mod:`dpgate.attack`), with the
numbers as a table. With a proposed cap (``preview``) the panel shows the bound before and after,
so that an admin sees what a cap change means before making it.
"""

from __future__ import annotations

from typing import Any, Mapping

from dpgate.attack import cap_attack_bound, spend_attack_bound
from dpgate.budget_views import budget_cohort_views, cap_change_preview
from markupsafe import Markup

from dpgate.ui.charts import Series, line_chart

__all__ = ["budget_panel"]


def _policy_of(gateway: Any, population: str) -> Any:
    from dpgate.service import population_policies

    return population_policies(gateway.policies).get(population)


def budget_panel(gateway: Any, population: str, anchor: str,
                 preview: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The panel's data: ``renewal``, ``cohorts`` (rows or None), ``chart`` (SVG), ``rows`` (the chart's
    numbers), ``tpr_at_1pct`` {cap, spent[, proposed]}, ``preview`` (the before/after or None, or
    ``{"error": message}``)."""
    ledger = gateway.ledger
    policy = _policy_of(gateway, population)
    cap = ledger.cap(population)
    views = budget_cohort_views(ledger, policy) if policy is not None else {}
    cohorts = None
    report = ledger.spend(population)
    if views.get("cohorts") is not None:
        cohorts = [{"name": n, **c} for n, c in sorted(views["cohorts"].items())]
        charged = ledger.cohort_spend(population)
        report = max(charged.values(), key=lambda r: r.spent_rho) if charged else None
    cap_bound = cap_attack_bound(cap)
    spent_bound = spend_attack_bound(report) if report is not None else None
    series = [Series("cap", list(cap_bound["fprs"]), list(cap_bound["tightest"]["curve"]))]
    if spent_bound is not None and spent_bound["epsilon"] != 0.0:
        series.append(Series("spent so far" + (" (most spent cohort)" if cohorts else ""),
                             list(spent_bound["fprs"]), list(spent_bound["tightest"]["curve"])))
    from dpgate.ledger.renewal import renewal_arithmetic

    arith = renewal_arithmetic(cap.rho_cap, cap.rho_delta)
    out: dict[str, Any] = {"renewal": views.get("renewal"), "cohorts": cohorts,
                           "cohort_column": views.get("cohort_column"), "preview": None,
                           "renewal_cost": {a["periods"]: a["epsilon"] for a in arith["after"]},
                           "period_epsilon": arith["per_period"]["epsilon"]}
    tpr = {"cap": cap_bound["tightest"]["tpr"], "spent": spent_bound["tightest"]["tpr"] if spent_bound else 0.01}
    if preview is not None:
        try:
            pv = cap_change_preview(ledger, population, float(preview["epsilon"]), float(preview["delta"]))
        except Exception as exc:  # noqa: BLE001 - a bad proposal is shown, not raised
            out["preview"] = {"error": getattr(exc, "message", str(exc))}
        else:
            after = pv["after"]["attack_bound"]
            series.append(Series(f"proposed cap ε {preview['epsilon']:g}", list(after["fprs"]),
                                 list(after["tightest"]["curve"]), dashed=True))
            tpr["proposed"] = after["tightest"]["tpr"]
            out["preview"] = {"epsilon": preview["epsilon"], "delta": preview["delta"],
                              "before": pv["before"]["attack_bound"]["tightest"]["tpr"],
                              "after": after["tightest"]["tpr"], "after_cap": pv["after"]["cap"]}
    series.append(Series("no information (TPR = FPR)", list(cap_bound["fprs"]), list(cap_bound["fprs"]), dashed=True))
    chart = line_chart(series, ident=f"{anchor}-attack", title="Membership-attack bound",
                       x_label="false-positive rate", y_label="largest true-positive rate")
    # its own class: the population's "chart" is its burn-down (pages and tests count those)
    out["chart"] = Markup(str(chart).replace('class="chart"', 'class="chart-attack"', 1))
    out["rows"] = [{"fpr": f, **{s.name: s.y[i] for s in series[:-1]}} for i, f in enumerate(cap_bound["fprs"])]
    out["series"] = [s.name for s in series[:-1]]
    out["tpr_at_1pct"] = tpr
    out["assumption"] = cap_bound["assumption"]
    return out
