"""``dpgate demo``: build the sample data if missing, run a few queries, show the spend."""

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


def run(args: argparse.Namespace, settings) -> int:
    """Run the demo against the configured policies (default ``./policies``)."""
    from dpgate.cli.budget import print_report
    from dpgate.cli.query import format_release
    from dpgate.sample_data import ensure_sample_data
    from dpgate.service import Gateway, QueryBudget

    root = Path(settings.policies).resolve().parent
    ensure_sample_data(root)
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
