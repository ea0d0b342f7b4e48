"""``dpgate query --dataset NAME "SQL" [--rho R | --epsilon E | --ci95 W [--expected-count N]] [--delta D] [--mechanism M]``.

Runs one query in-process (no HTTP): charges the consumer's allocation, prints
the released table with ± 95 % intervals, the charge and the remaining budget.
With ``--json`` it prints the release document exactly as ``POST /v1/queries``
answers it (``dpgate budget NAME --json`` gives the spend). The budget flags go
through the same validator as the HTTP API's ``budget``
(:class:`dpgate.service.QueryBudget`).
"""

from __future__ import annotations

import argparse

from dpgate.cli import add_common_options, add_dialect_option, print_json, print_table
from dpgate.policy import MECHANISMS


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``query`` sub-command."""
    p = subparsers.add_parser("query", help="answer one SQL query with a charged DP release")
    p.add_argument("sql", help="the aggregate SQL query")
    p.add_argument("--dataset", required=True)
    p.add_argument("--consumer", default="analysts", help="allocation that pays (default: analysts)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--rho", type=float, help="zCDP ρ of this release (total over its primitives)")
    g.add_argument("--epsilon", type=float, help="standalone ε of this release, at the δ it is charged at "
                                                 "(the cap's δ less its selection δ; pure ε for Laplace)")
    g.add_argument("--ci95", type=float, help="target 95%% half-width of each released cell")
    p.add_argument("--expected-count", type=float,
                   help="with --ci95: rows you expect per group (needed for AVG/VAR/STDDEV)")
    p.add_argument("--delta", type=float,
                   help="δ spent on private partition selection (GROUP BY keys without public keys)")
    p.add_argument("--mechanism", choices=tuple(MECHANISMS))
    add_dialect_option(p)
    p.add_argument("--search-id", help="record this selection query in an open search (dpgate search)")
    add_common_options(p)
    p.set_defaults(func=run)


def format_release(release: dict) -> None:
    """Print a release as a table with ± 95 % half-widths per column."""
    acc = release.get("accuracy", {})
    headers = list(release["columns"])
    rows = []
    for row in release["rows"]:
        cells = []
        for name, value in zip(headers, row):
            a = acc.get(name)
            if value is None:
                cells.append("(suppressed)" if a else "")
            elif a and a.get("ci95") is not None:
                v = f"{value:.6g}" if isinstance(value, float) else str(value)
                approx = "~" if a.get("approximate") else ""
                cells.append(f"{v} ± {approx}{a['ci95']:.3g}")
            else:
                cells.append(str(value))
        rows.append(cells)
    print_table(headers, rows)


def run(args: argparse.Namespace, settings) -> int:
    """Run the query and print the release, its charge and the remaining budget.

    Raises:
        UnknownConsumer: ``--consumer`` has no allocation (the message lists the ones there are).
    """
    from dpgate.errors import UnknownConsumer
    from dpgate.service import Gateway, QueryBudget

    budget = QueryBudget(rho=args.rho, epsilon=args.epsilon, ci95=args.ci95, expected_count=args.expected_count,
                         delta=args.delta)
    with Gateway.open(settings, progress=None if args.json else print) as gw:
        try:
            release = gw.query(args.dataset, args.sql, consumer=args.consumer, budget=budget,
                               mechanism=args.mechanism, dialect=args.dialect, search_id=args.search_id)
        except UnknownConsumer as e:  # the default consumer is a guess: say how to name the right one
            names = _allocations(gw, args.dataset)
            e.message += (f"; pass --consumer NAME (this dataset's allocations: {', '.join(names)})" if names
                          else "; pass --consumer NAME")
            e.args = (e.message,)
            raise
        report = None if args.json else gw.budget(args.dataset)
    if args.json:
        print_json(release)  # the same document as the HTTP API's answer
        return 0
    format_release(release)
    if release.get("kind") == "selection":
        sel = release["selection"]
        print(f"selected by the exponential mechanism among {sel['candidates']} public candidates "
              f"(Δu = {sel['delta_u']:g}, ε = {sel['epsilon']:.4g}); scores are not released")
    charge = release.get("charge")
    print()
    if charge is None:
        print(f"served from the release store ({release['release_id']}): cost 0")
    else:
        rho = charge.get("rho")
        print(f"release {release['release_id']}: charged ρ = {rho:.6g} "
              f"(ε = {charge['epsilon_at_delta']:.4g} at δ = {charge['delta']:g}, the ledger's conversion) "
              f"to {charge['consumer']}")
    _print_remaining(report, args.consumer)
    return 0


def _allocations(gw, dataset: str) -> list[str]:
    """The consumers with an allocation on ``dataset``'s population (empty if unknown)."""
    try:
        return sorted(next(d for d in gw.datasets() if d["name"] == dataset).get("allocations", {}))
    except Exception:  # noqa: BLE001 - a hint only
        return []


def _print_remaining(report: dict, consumer: str) -> None:
    c = report.get("consumers", {}).get(consumer)
    rem = report["remaining"]
    print(f"population {report['population']}: remaining ρ = {rem['rho']:.6g} "
          f"(ε {rem['epsilon']:.4g} at δ = {report['cap']['delta']:g})", end="")
    if c is not None:
        print(f"; {consumer}: remaining ρ = {c['remaining_rho']:.6g}")
    else:
        print()
