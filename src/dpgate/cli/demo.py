"""``dpgate demo``: build the sample data if missing, run a few queries, show the spend.

The demo keeps its own state (ledger and release store) in ``$DPGATE_HOME/demo``:
it never spends the budget of the gateway you run with ``dpgate serve``, and a
second run is served from its release store at no cost, so it can be run any
number of times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpgate.cli import add_common_options, print_json

DEMO_QUERIES = (
    ("dashboard", "SELECT region, COUNT(DISTINCT user_id) AS users FROM prompts WHERE week = 7 GROUP BY region",
     {"rho": 0.003}),
    ("analysts", "SELECT region, COUNT(*) AS prompts, AVG(tokens) AS avg_tokens FROM prompts GROUP BY region "
     "ORDER BY prompts DESC", {"rho": 0.004}),
    ("analysts", "SELECT week, SUM(tokens) AS tokens FROM prompts WHERE week < 4 GROUP BY week", {"epsilon": 0.5}),
    # the first query again, spelled differently: served from the release store at no cost
    ("dashboard", "select REGION, count(distinct USER_ID) n from prompts p where 7 = week group by region",
     {"rho": 0.003}),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser("demo", help="generate sample data, run a few queries, show the spend")
    add_common_options(p)
    p.set_defaults(func=run)


#: Sub-folder of the state folder that holds the demo's own ledger and releases.
DEMO_STATE = "demo"


def demo_settings(settings):
    """``settings`` with the demo's own state: ``$home/demo`` and its SQLite ledger."""
    return settings.model_copy(update={"home": Path(settings.home) / DEMO_STATE, "ledger_url": None})


def run(args: argparse.Namespace, settings) -> int:
    """Run the demo against the configured policies (default ``./policies``), in its own state."""
    from dpgate.cli.budget import print_report
    from dpgate.cli.query import format_release
    from dpgate.errors import PolicyError
    from dpgate.policy import load_policies
    from dpgate.sample_data import ensure_sample_data
    from dpgate.service import Gateway, QueryBudget

    policies = load_policies(Path(settings.policies))
    usage = policies.get("usage")
    if usage is None or not {"analysts", "dashboard"} <= set(usage.allocations):
        raise PolicyError(
            f"the demo runs on the quickstart dataset 'usage' (allocations 'dashboard' and 'analysts'), "
            f"which the policies folder {settings.policies} does not declare; run it from the repository "
            "root or pass --policies path/to/dpgate/policies",
            {"policies": str(settings.policies)},
        )
    root = Path(settings.policies).resolve().parent
    ensure_sample_data(root)
    settings = demo_settings(settings)
    if not args.json:
        print(f"demo state: {settings.home} (its own ledger; the gateway's budget is not spent)")
    out = []
    with Gateway.open(settings, progress=None if args.json else print) as gw:
        for consumer, sql, budget in DEMO_QUERIES:
            release = gw.query("usage", sql, consumer=consumer, budget=QueryBudget(**budget))
            out.append(release)
            if not args.json:
                print(f"\n[{consumer}] {sql}")
                format_release(release)
                charge = release["charge"]
                print("cost 0 (served from the release store)" if charge is None else
                      f"charged ρ = {charge['rho']:.6g} (ε = {charge['epsilon_at_delta']:.4g} at δ = {charge['delta']:g})")
        report = gw.budget("usage")
    if args.json:
        print_json({"releases": out, "budget": report})
    else:
        print()
        print_report(report)
    return 0
