"""``dpgate explain --dataset NAME "SQL" [--rho R | --epsilon E | --ci95 W [--expected-count N]] [--delta D] [--consumer C] [--mechanism M]``.

Shows the plan of a query without running it: the canonical SQL, plan hash,
released columns, keys narrowed by the WHERE, contribution bounds, the noisy
primitives with their sensitivities *and their unit* (rows, or integer steps of
the column's resolution, with the figure in the column's own units), and the
bounded SQL template (salt hidden); or the refusal as one sentence (the
documented error shape with ``--json``; exit status from :mod:`dpgate.cli.exits`).

With a budget (``--rho``/``--epsilon``/``--ci95``, ``--delta``, ``--expected-count``:
the same validator as the HTTP API's ``budget``, :class:`dpgate.service.QueryBudget`)
or ``--consumer``, it also opens the ledger and prints what the console shows: the
cost (ρ, and ε of this release alone), whether it fits what is left for the
consumer's allocation (default ``analysts``) and the population, and the expected
± (95 %) of each output, named as the query names it. ``--json`` then prints the
document ``POST /v1/queries/explain`` answers, with ``expected_accuracy``. Reads no
data and charges nothing.
"""

from __future__ import annotations

import argparse

from dpgate.cli import add_common_options, add_dialect_option, print_json, print_table
from dpgate.errors import UnknownDataset
from dpgate.policy import MECHANISMS, load_policies
from dpgate.postprocess.expected import sensitivity_unit
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
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--rho", type=float, help="zCDP ρ of this release: show its cost and whether it fits")
    g.add_argument("--epsilon", type=float, help="standalone ε of this release at the cap's δ")
    g.add_argument("--ci95", type=float, help="target 95%% half-width of each released cell")
    parser.add_argument("--expected-count", type=float,
                        help="with --ci95: rows you expect per group (needed for AVG/VAR/STDDEV)")
    parser.add_argument("--delta", type=float,
                        help="δ spent on private partition selection (GROUP BY keys without public keys)")
    parser.add_argument("--consumer", help="the allocation whose remaining budget the cost is checked "
                                           "against (default: analysts); implies the cost section")
    parser.add_argument("--mechanism", choices=tuple(MECHANISMS))
    add_dialect_option(parser)
    add_common_options(parser)
    parser.set_defaults(func=run)


def _budget(args: argparse.Namespace):
    """The requested budget (:class:`QueryBudget`, the API's validator), or None without flags.

    Raises:
        InvalidBudget: as the API refuses the same values.
    """
    from dpgate.service import QueryBudget

    fields = {"rho": args.rho, "epsilon": args.epsilon, "ci95": args.ci95,
              "expected_count": args.expected_count, "delta": args.delta}
    if all(v is None for v in fields.values()):
        return None
    return QueryBudget(**fields)


def _wants_cost(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None for k in ("rho", "epsilon", "ci95", "expected_count", "delta",
                                                       "consumer", "mechanism"))


def run(args: argparse.Namespace, settings) -> int:
    """Explain ``args.sql`` on ``args.dataset`` with the policies of ``settings.policies``.

    Returns:
        0 (a refusal raises a DpgateError, which ``dpgate.cli.main`` prints).

    Raises:
        PolicyError: the policies folder is invalid.
        UnknownDataset: no policy declares the dataset.
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn: the query is refused.
    """
    budget = _budget(args)  # a bad budget is refused before anything is read (invalid_budget, exit 2)
    policies = load_policies(settings.policies)
    policy = policies.get(args.dataset)
    if policy is None:
        raise UnknownDataset.named(args.dataset, policies)
    result = explain_query(args.sql, policy, dialect=args.dialect)
    cost = None
    if _wants_cost(args):
        from dpgate.postprocess.expected import expected_accuracy
        from dpgate.service import Gateway

        with Gateway.open(settings, progress=None) as gw:
            cost = gw.explain(args.dataset, args.sql, budget=budget, consumer=args.consumer or "analysts",
                              mechanism=args.mechanism, dialect=args.dialect)
        cost["expected_accuracy"] = expected_accuracy(cost)
    if args.json:
        print_json(cost if cost is not None else result)
        return 0
    c = result["contribution"]
    print(f"dataset       {result['dataset']}")
    print(f"canonical SQL {result['canonical_sql']}")
    print(f"plan hash     {result['plan_hash']}")
    print(f"columns       {', '.join(result['columns'])}")
    for key in result["plan"].get("narrowed_keys", []):
        kept = (f"{key['range'][0]} … {key['range'][1] - 1}" if key.get("range")
                else ", ".join(str(k) for k in key.get("keys", [])))
        print(f"keys narrowed {key['column']}: {kept} (the WHERE, evaluated on the policy's key list, not on data)")
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
    groups = (f"{c['groups']} public key combination(s) × the keys of {', '.join(c['selected_keys'])} that "
              "private partition selection releases" if c.get("selected_keys") else f"{c['groups']} group(s) released")
    print(f"bounds        k = {c['max_groups_per_unit']} groups per unit, "
          f"m = {c['max_rows_per_unit']} rows per unit and group; {groups}")
    print()
    sens = result["sensitivities"]
    rows = []
    for p in result["plan"]["primitives"]:
        if p["id"] not in sens:
            continue
        step = _step(policy, result, p)
        s_ = sens[p["id"]]
        in_units = "" if step == 1.0 else f"{_num(s_['l1'] * step)} / {_num(s_['l2'] * step)}"
        rows.append([p["id"], p["kind"], p["column"] or "", _num(s_["linf"]), _num(s_["l1"]), _num(s_["l2"]),
                     sensitivity_unit(p["kind"], p["column"], step), in_units])
    if rows:
        print_table(["primitive", "kind", "column", "linf", "l1", "l2", "in", "l1 / l2 in the column's units"], rows)
        print()
    for pid, sql in result.get("quantiles", {}).items():
        print(f"quantile {pid}: OpenDP's exponential mechanism over the bounded per-candidate "
              "counts of (salt hidden):")
        print(sql)
        print()
    if result["bounded_sql"] is not None:
        print("bounded SQL (salt hidden):")
        print(result["bounded_sql"])
    if cost is not None:
        print()
        print_cost(cost)
    else:
        print()
        print("cost: give --rho, --epsilon or --ci95 (or --consumer) to see what a release costs, whether it fits "
              "what is left, and the expected ± of each output")
    return 0


def _step(policy, result, p) -> float:
    """Output units per integer unit of primitive ``p`` (1, the resolution, resolution²)."""
    from dpgate.postprocess.release import output_unit
    from dpgate.sql.plan import QueryPlan

    if p["kind"] not in ("sum", "sum_squares"):
        return 1.0
    plan = QueryPlan.from_dict(result["plan"])
    col = plan.column_policy(policy.table(plan.table), p["column"])
    return output_unit(p["kind"], col.resolution)


def print_cost(doc: dict) -> None:
    """The cost section of ``dpgate explain`` (``doc``: :meth:`Gateway.explain` with
    ``expected_accuracy``): cost, whether it fits, the expected ± per output."""
    cost = doc.get("cost") or {}
    budget = doc.get("budget") or {}
    asked = ", ".join(f"{k} {_num(v)}" for k, v in budget.items() if isinstance(v, (int, float))) or "policy default"
    print(f"budget        {asked}")
    rho, eps = cost.get("rho"), cost.get("epsilon_at_delta")
    line = f"cost          ρ {_num(rho)}" if isinstance(rho, (int, float)) else "cost          0"
    if isinstance(cost.get("epsilon"), (int, float)):
        line += f" (pure ε {_num(cost['epsilon'])})"
    if isinstance(eps, (int, float)) and isinstance(cost.get("delta"), (int, float)):
        line += f"; ε {_num(eps)} at δ {cost['delta']:g} for this release alone"
    print(line)
    left = cost.get("remaining_rho")
    who = f"allocation {cost['consumer']}" if cost.get("consumer") else "the population"
    if cost.get("fits") is True:
        print(f"fits          yes: {who} has ρ {_num(left)} left" if isinstance(left, (int, float))
              else "fits          yes")
    elif cost.get("fits") is False:
        print(f"fits          NO: {who} has only ρ {_num(left)} left; running it would be refused "
              "(budget_exhausted) and charge nothing")
    if cost.get("message") and cost.get("fits") is None:
        print(f"              {cost['message']}")
    outputs = (doc.get("expected_accuracy") or {}).get("outputs") or []
    if outputs:
        print()
        print("expected accuracy (95 %):")
        print_table(["output", "±", "note"],
                    [[o["label"], "" if o["ci95"] is None else ("± ~" if o.get("approximate") else "± ") + _num(o["ci95"]),
                      o["note"]] for o in outputs])


def _num(value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "" if value is None else str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}" if abs(value) >= 10000 else str(int(value))
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
