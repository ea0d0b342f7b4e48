"""``dpgate explain --dataset NAME "SQL"``: show the plan of a query without running it.

Prints the canonical SQL, plan hash, released columns, contribution bounds, the
noisy primitives with their sensitivities and the bounded SQL template (salt
hidden); or the refusal as one sentence (the documented error shape with
``--json``; exit status from :mod:`dpgate.cli.exits`). Reads no data and
charges nothing.
"""

from __future__ import annotations

import argparse

from dpgate.cli import add_common_options, add_dialect_option, print_json, print_table
from dpgate.errors import UnknownDataset
from dpgate.policy import load_policies
from dpgate.sql.explain import explain_query


def register(subparsers) -> None:
    """Add the ``explain`` sub-command to the ``dpgate`` parser."""
    parser = subparsers.add_parser(
        "explain",
        help="show the plan, bounded SQL and sensitivities of a query (reads no data)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--dataset", required=True, help="dataset name (a policy file)")
    parser.add_argument("sql", help="the SQL query (quote it)")
    add_dialect_option(parser)
    parser.add_argument("--trial", action="store_true",
                        help="also run the query on the dataset's proxy (free) and show the answer it would give "
                             "with each cell's ± at the budget (loads the proxy's data)")
    parser.add_argument("--rho", type=float, help="with --trial: the release's zCDP rho (default: the policy's)")
    add_common_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace, settings) -> int:
    """Explain ``args.sql`` on ``args.dataset`` with the policies of ``settings.policies``.

    Returns:
        0 (a refusal raises a DpgateError, which ``dpgate.cli.main`` prints).

    Raises:
        PolicyError: the policies folder is invalid.
        UnknownDataset: no policy declares the dataset.
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn: the query is refused.
    """
    if getattr(args, "trial", False):
        return _run_trial(args, settings)
    policies = load_policies(settings.policies)
    policy = policies.get(args.dataset)
    if policy is None:
        raise UnknownDataset.named(args.dataset, policies)
    result = explain_query(args.sql, policy, dialect=args.dialect)
    if args.json:
        print_json(result)
        return 0
    c = result["contribution"]
    print(f"dataset       {result['dataset']}")
    print(f"canonical SQL {result['canonical_sql']}")
    print(f"plan hash     {result['plan_hash']}")
    print(f"columns       {', '.join(result['columns'])}")
    for key in result.get("computed_keys", []):
        print(f"computed key  {key['name']} = {key['expression']} ({key['rule']}, "
              f"{key['domain_size']} key(s))")
    if result.get("public"):
        print("privacy unit  none: the query reads public tables only; it is answered exactly "
              "and charges nothing")
        print()
        print("exact SQL:")
        print(result["exact_sql"])
        return 0
    if result.get("public_keys_only"):
        print("keys only     over public keys: the release is the policy's key list; it reads no "
              "data and charges nothing")
        return 0
    unit = "record-level (each row is a unit)" if c["record_level"] else c["privacy_unit"]
    print(f"privacy unit  {unit}")
    print(f"bounds        k = {c['max_groups_per_unit']} groups per unit, "
          f"m = {c['max_rows_per_unit']} rows per unit and group; {c['groups']} group(s) released")
    print()
    sens = result["sensitivities"]
    rows = [
        [p["id"], p["kind"], p["column"] or "", _num(sens[p["id"]]["linf"]),
         _num(sens[p["id"]]["l1"]), _num(sens[p["id"]]["l2"])]
        for p in result["plan"]["primitives"] if p["id"] in sens
    ]
    if rows:
        print_table(["primitive", "kind", "column", "linf", "l1", "l2"], rows)
        print()
    for pid, sql in result.get("quantiles", {}).items():
        print(f"quantile {pid}: OpenDP's exponential mechanism over the bounded per-candidate "
              "counts of (salt hidden):")
        print(sql)
        print()
    if result["bounded_sql"] is not None:
        print("bounded SQL (salt hidden):")
        print(result["bounded_sql"])
    return 0


def _num(value: float) -> str:
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _run_trial(args: argparse.Namespace, settings) -> int:
    """``--trial``: the gateway's explain with a free run on the proxy (issue 23 item 6)."""
    from dpgate.cli.query import format_release
    from dpgate.service import Gateway, QueryBudget

    budget = QueryBudget(rho=args.rho) if args.rho is not None else None
    with Gateway.open(settings, progress=None) as gw:
        result = gw.explain(args.dataset, args.sql, budget=budget, dialect=args.dialect, trial=True)
    if args.json:
        print_json(result)
        return 0
    trial = result["trial"]
    cost = result["cost"]
    print(f"trial on proxy {trial['proxy']['dataset']!r} ({trial['proxy']['provenance']}): exact values of the "
          "same plan, ± as the DP release would state them")
    format_release(trial)
    print()
    print(f"the DP release would cost rho = {cost['rho']:.6g} (epsilon = {cost['epsilon_at_delta']:.4g} at "
          f"delta = {cost['delta']:g}); {cost['message']}")
    return 0
