"""``dpgate budget NAME``: a dataset's population spend against its cap, per allocation.

The cap shown is the one the ledger enforces; if the policy file states other values, a
warning says so once per change (the ledger's hold until ``dpgate caps apply``; ``--json``
always reports ``policy_drift``). Nothing is written,
except that a population no ledger has yet is created from its policy file.
"""

from __future__ import annotations

import argparse

from dpgate.cli import add_common_options, print_json, print_table


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``budget`` sub-command."""
    p = subparsers.add_parser("budget", help="spend and remaining budget of a dataset's population")
    p.add_argument("dataset")
    add_common_options(p)
    p.set_defaults(func=run)


def print_report(report: dict, *, warn: bool = True) -> None:
    """Print a spend report (ρ and ε) as a table, after any policy-drift warning
    (``warn``: the caller decides whether it is new, see :mod:`dpgate.notices`)."""
    drift = report.get("policy_drift") or {}
    if drift.get("message") and warn:
        print(f"warning: {drift['message']}")
    cap = report["cap"]
    print(f"population {report['population']}: cap ε = {cap['epsilon']:g}, δ = {cap['delta']:g} "
          f"(enforced as ρ = {cap['rho']:.6g}); {report['charges']} charges")
    rows = [["(all)", "1", f"{cap['rho']:.6g}", f"{report['spent']['rho']:.6g}",
             f"{report['spent']['epsilon']:.4g}", f"{report['remaining']['rho']:.6g}", report["charges"]]]
    for name, c in sorted(report.get("consumers", {}).items()):
        rows.append([name, "any" if c["share"] is None else f"{c['share']:g}", f"{c['cap_rho']:.6g}", f"{c['spent_rho']:.6g}",
                     f"{c['spent_epsilon']:.4g}", f"{c['remaining_rho']:.6g}", c["charges"]])
    print_table(["allocation", "share", "cap ρ", "spent ρ", "spent ε", "remaining ρ", "charges"], rows)
    gdp = report.get("gdp")
    if report.get("composition") == "gdp" and gdp:  # issue 22 item 1: the Gaussian-DP filter holds
        delta = cap["delta"] - cap.get("selection_delta", 0.0)
        print(f"Gaussian-DP filter (composition gdp): mu_cap = {gdp['mu_cap']:.6g}, spent mu = "
              f"{report['spent']['mu']:.6g}, remaining mu = {report['remaining']['mu']:.6g}: remaining epsilon = "
              f"{report['remaining']['epsilon']:.4g} at delta = {delta:g} (exact GDP conversion, Dong, Roth & Su "
              "2022 Cor. 2.13; the rho columns are the fraction of mu_cap^2 as a share of the cap's rho)")
    if report.get("renewal"):
        print()
        print(f"guarantee: {report['renewal']}")
    cohorts = report.get("cohorts")
    if cohorts:  # issue 23: a unit's guarantee is its cohort's spend
        print()
        print(f"per cohort of {report['cohort_column']!r} (the rows above sum every charge once over all cohorts; "
              "each unit has spent only its cohort's):")
        crow = [[name, f"{c['spent']['rho']:.6g}", f"{c['spent']['epsilon']:.4g}", f"{c['remaining']['rho']:.6g}",
                 c["charges"], "fresh: whole cap" if c["fresh"] else ""] for name, c in sorted(cohorts.items())]
        print_table(["cohort", "spent ρ", "spent ε", "remaining ρ", "charges", ""], crow)
    from dpgate.ledger.caps import CONVERSION_NOTE

    print(CONVERSION_NOTE)


def run(args: argparse.Namespace, settings) -> int:
    """Print the spend report; reads the ledger only (no data is loaded)."""
    from dpgate.ledger import open_ledger
    from dpgate.policy import load_policies
    from dpgate.errors import UnknownDataset
    from dpgate.service import ensure_populations

    policies = load_policies(settings.policies)
    if args.dataset not in policies:
        raise UnknownDataset.named(args.dataset, policies)
    policy = policies[args.dataset]
    settings.home.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(settings.resolved_ledger_url())
    try:
        drift = ensure_populations(ledger, {args.dataset: policy})[policy.population]
        report = ledger.spend(policy.population).to_dict()
        from dpgate.budget_views import budget_cohort_views

        report.update(budget_cohort_views(ledger, policy))
    finally:
        ledger.close()
    report["dataset"] = args.dataset
    report["policy_drift"] = drift.to_dict()
    if args.json:
        print_json(report)
    else:
        from dpgate.notices import first_notice

        # the drift warning once per change (the JSON always has policy_drift)
        print_report(report, warn=first_notice(settings.home, "policy_drift", policy.population,
                                               report["policy_drift"].get("message") or ""))
    return 0
