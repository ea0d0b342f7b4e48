"""``dpgate caps``: compare the policy files' caps with the ledger's, and adopt them on purpose.

The ledger owns each population's cap and allocations once the population exists:
restarts, deploys and other commands never put a policy file's values back.

* ``dpgate caps show [--population P]`` — per population, the cap and allocations the
  ledger enforces, what the policy files state, and how they differ (read-only).
* ``dpgate caps apply [--population P] --reason "…" [--actor NAME]`` — adopt the policy
  files' values as recorded governance events (``cap_changed``, ``allocations_changed``,
  with the actor and the reason). A cap lowered below what was already spent is allowed
  and said so (every further charge is then refused); charges are never refunded. Caps
  fixed by an earlier dpgate (every RDP order checked) are re-fixed by the α_cap rule.

* ``dpgate caps renew --population P --reason "…"`` — always refused (issue 23): spent budget is
  never restored to the same units. The refusal states what a unit present in every period would
  lose after 12 and 36 periods at the cap's rate; a population with cohorts renews only by opening
  new cohorts. Raising the cap (``caps apply`` of a larger ε, or the admin form) stays possible.

``caps apply`` prints the membership-attack bound (TPR at FPR = 1 %) of each changed cap before
and after. ``--json`` prints JSON instead of tables. Exit status 0; 2 on an error (e.g. no
policy names the population, or a refused renewal).
"""

from __future__ import annotations

import argparse
import getpass
import socket
from typing import Any

from dpgate.cli import add_common_options, print_json, print_table


def register(subparsers: Any) -> None:
    """Add ``caps show|apply`` to the top-level sub-command parsers."""
    parser = subparsers.add_parser(
        "caps", help="compare policy caps with the ledger's and adopt them (a recorded governance event)",
        description="The ledger owns caps and allocations; adopt a policy file's values on purpose.",
    )
    actions = parser.add_subparsers(dest="caps_action", metavar="ACTION")
    actions.required = True

    show = actions.add_parser("show", help="the ledger's caps and allocations against the policy files'")
    add_common_options(show)
    show.add_argument("--population", help="only this population")
    show.set_defaults(func=cmd_show)

    apply = actions.add_parser("apply", help="adopt the policy files' caps and allocations (governance event)")
    add_common_options(apply)
    apply.add_argument("--population", help="only this population (default: every population the policies name)")
    apply.add_argument("--reason", required=True, help="why the values are adopted (recorded with the event)")
    apply.add_argument("--actor", help="who adopts them (default: cli:<user>@<host>)")
    apply.set_defaults(func=cmd_apply)

    renew = actions.add_parser("renew", help="renew (reset) a population's spent budget: always refused, with why")
    add_common_options(renew)
    renew.add_argument("--population", required=True)
    renew.add_argument("--reason", required=True)
    renew.add_argument("--actor", help="who asks (default: cli:<user>@<host>)")
    renew.set_defaults(func=cmd_renew)


def _actor(args: argparse.Namespace) -> str:
    if args.actor:
        return args.actor
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        user = "unknown"
    return f"cli:{user}@{socket.gethostname()}"


def _fmt_cap(cap: dict[str, Any]) -> str:
    sel = f", selection δ = {cap['selection_delta']:g}" if cap.get("selection_delta") else ""
    return f"ε = {cap['epsilon']:.6g}, δ = {cap['delta']:g}{sel} (ρ = {cap['rho']:.6g}, α_cap = {cap['alpha_cap']:g})"


def cmd_show(args: argparse.Namespace, settings: Any) -> int:
    """Print, per population, the ledger's cap and allocations, the policy files' and the drift."""
    from dpgate.errors import UnknownPopulation
    from dpgate.ledger import open_ledger
    from dpgate.ledger.base import PolicyDrift, validate_population
    from dpgate.policy import load_policies
    from dpgate.service import population_policies

    chosen = population_policies(load_policies(settings.policies))
    if args.population is not None:
        if args.population not in chosen:
            raise UnknownPopulation(f"no policy file names population {args.population!r}",
                                    {"population": args.population, "populations": sorted(chosen)})
        chosen = {args.population: chosen[args.population]}
    settings.home.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(settings.resolved_ledger_url())
    out = []
    try:
        existing = set(ledger.populations())
        for pop, policy in chosen.items():
            cap, allocs = validate_population(pop, policy.budget.epsilon, policy.budget.delta,
                                              dict(policy.allocations), "cli", "show", None,
                                              getattr(policy.budget, "selection_delta", None))
            if pop not in existing:
                out.append({"population": pop, "in_ledger": False, "policy": {"cap": cap.public(),
                                                                               "allocations": allocs}})
                continue
            report = ledger.spend(pop)
            drift = PolicyDrift(pop, ledger.cap(pop), dict(report.allocations), cap, allocs)
            out.append({"population": pop, "in_ledger": True, **drift.to_dict()})
    finally:
        ledger.close()
    if args.json:
        print_json({"populations": out})
        return 0
    rows = []
    for item in out:
        if not item["in_ledger"]:
            rows.append([item["population"], "(not in the ledger yet)", _fmt_cap(item["policy"]["cap"]),
                         "created from the policy file on first use"])
            continue
        state = "drift" if item["drifted"] else ("legacy rule" if item["legacy_rule"] else "in sync")
        rows.append([item["population"], _fmt_cap(item["ledger"]["cap"]), _fmt_cap(item["policy"]["cap"]), state])
    print_table(["population", "ledger enforces", "policy files state", "state"], rows)
    for item in out:
        if item.get("message"):
            print()
            print(item["message"])
    return 0


def cmd_apply(args: argparse.Namespace, settings: Any) -> int:
    """Adopt the policy files' caps and allocations; print what was recorded."""
    from dpgate.ledger import open_ledger
    from dpgate.policy import load_policies
    from dpgate.service import apply_policies

    from dpgate.attack import cap_attack_bound

    policies = load_policies(settings.policies)
    settings.home.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(settings.resolved_ledger_url())
    try:
        before = {p: ledger.cap(p) for p in ledger.populations()}
        results = apply_policies(ledger, policies, actor=_actor(args), reason=args.reason,
                                 population=args.population)
        for r in results:  # issue 23: the attack bound before and after each cap change
            old = before.get(r["population"])
            if old is not None and r["changed"]:
                r["attack_bound"] = {"before": cap_attack_bound(old)["tightest"]["tpr"],
                                     "after": cap_attack_bound(ledger.cap(r["population"]))["tightest"]["tpr"],
                                     "fpr": 0.01}
    finally:
        ledger.close()
    if args.json:
        print_json({"results": results})
        return 0
    rows = [[r["population"], "yes" if r["changed"] else "no", ", ".join(e["kind"] for e in r["events"]) or "-",
             f"ε = {r['cap']['epsilon']:.6g}, δ = {r['cap']['delta']:g}",
             "EXHAUSTED" if r["exhausted"] else f"{r['remaining']['rho']:.6g}"] for r in results]
    print_table(["population", "changed", "events", "cap now", "remaining ρ"], rows)
    for r in results:
        if r["over_by"] is not None or r["exhausted"]:
            print(f"warning: {r['message']}")
        if "attack_bound" in r:
            a = r["attack_bound"]
            print(f"{r['population']}: at FPR = 1 % a membership test has TPR <= {a['before']:.4g} under the old cap, "
                  f"<= {a['after']:.4g} under the new one")
    return 0


def cmd_renew(args: argparse.Namespace, settings: Any) -> int:
    """Refuse a renewal with the arithmetic (raises RenewalRefused; ``dpgate`` prints it, exit 2)."""
    from dpgate.errors import UnknownPopulation
    from dpgate.ledger import open_ledger
    from dpgate.ledger.renewal import renewal_refused

    settings.home.mkdir(parents=True, exist_ok=True)
    ledger = open_ledger(settings.resolved_ledger_url())
    try:
        if args.population not in ledger.populations():
            raise UnknownPopulation(f"no population {args.population!r} in the ledger", {"population": args.population})
        raise renewal_refused(args.population, ledger.cap(args.population), f"renewing population {args.population!r}",
                              cohort_column=ledger.cohort_column(args.population))
    finally:
        ledger.close()


__all__ = ["register", "cmd_show", "cmd_apply", "cmd_renew"]
