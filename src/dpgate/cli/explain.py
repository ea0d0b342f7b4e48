"""``dpgate explain --dataset NAME "SQL" [--rho R | --epsilon E | --ci95 W [--expected-count N]] [--delta D] [--consumer C] [--mechanism M] [--trial]``.

Shows what a query would do without running it: the canonical SQL, plan hash,
released columns, keys narrowed by the WHERE, contribution bounds (and the join or
per-unit subquery it bounds), the noisy primitives with their sensitivities *and their
unit* (rows, or integer steps of the column's resolution, with the figure in the
column's own units), the bounded SQL template (salt hidden), the cost (ρ, and ε of this
release alone), whether it fits what is left for the consumer's allocation and the
population, and the expected ± (95 %) of each output, named as the query names it; or
the refusal as one sentence (the documented error shape with ``--json``; exit status
from :mod:`dpgate.cli.exits`). Reads no protected rows and charges nothing.

It goes through the same path as ``POST /v1/queries/explain``
(:meth:`dpgate.service.Gateway.explain`): the gateway is opened as for ``dpgate query``
(policies, data sources, ledger; its loading lines go to stderr), so joins, per-unit
subqueries, the keys of public tables and the remaining budget are those a query would
meet, and ``--json`` prints the HTTP answer's document (with ``expected_accuracy``). The
budget flags are those of ``dpgate query`` (the same validator as the HTTP API's
``budget``, :class:`dpgate.service.QueryBudget`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dpgate.cli import add_common_options, add_dialect_option, print_json, print_table
from dpgate.errors import UnknownDataset
from dpgate.policy import MECHANISMS, load_policies
from dpgate.postprocess.expected import expected_accuracy


def register(subparsers) -> None:
    """Add the ``explain`` sub-command to the ``dpgate`` parser."""
    parser = subparsers.add_parser(
        "explain",
        help="show the plan, bounded SQL, sensitivities and cost of a query (charges nothing)",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--dataset", required=True, help="dataset name (a policy file)")
    parser.add_argument("sql", help="the SQL query (quote it)")
    parser.add_argument("--consumer", help="the allocation whose remaining budget the cost is checked "
                        "against (default: analysts when the dataset has it, else the population's)")
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--rho", type=float, help="zCDP ρ of the release (total over its primitives)")
    g.add_argument("--epsilon", type=float, help="standalone ε of the release at the cap's δ")
    g.add_argument("--ci95", type=float, help="target 95%% half-width of each released cell")
    parser.add_argument("--expected-count", type=float,
                        help="with --ci95: rows you expect per group (needed for AVG/VAR/STDDEV)")
    parser.add_argument("--delta", type=float,
                        help="δ spent on private partition selection (GROUP BY keys without public keys)")
    parser.add_argument("--mechanism", choices=tuple(MECHANISMS))
    parser.add_argument("--reference-rows", type=float,
                        help="the group size (rows) at which each output's ± is compared with its column's bounds "
                             "for the warnings (default: --expected-count, else 100)")
    add_dialect_option(parser)
    parser.add_argument("--trial", action="store_true",
                        help="also run the query on the dataset's proxy (free) and show the answer it would give "
                             "with each cell's ± at the budget (loads the proxy's data)")
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


def _consumer(args: argparse.Namespace, policy) -> str | None:
    """The allocation the cost is checked against: ``--consumer``, else ``analysts`` when the
    dataset has that allocation (``dpgate explain`` is an analyst's tool), else None (the
    population's remaining budget)."""
    if args.consumer:
        return args.consumer
    return "analysts" if "analysts" in policy.allocations else None


def run(args: argparse.Namespace, settings) -> int:
    """Explain ``args.sql`` on ``args.dataset`` through :meth:`~dpgate.service.Gateway.explain`.

    Returns:
        0 (a refusal raises a DpgateError, which ``dpgate.cli.main`` prints).

    Raises:
        PolicyError: the policies folder is invalid, or a data source does not load.
        UnknownDataset: no policy declares the dataset (checked before any data is loaded).
        InvalidSql, UnsupportedQuery, UnknownTable, UnknownColumn, InvalidBudget: the query is
            refused (nothing is charged).
    """
    from dpgate.service import Gateway

    budget = _budget(args)  # a bad budget is refused before anything is read (invalid_budget, exit 2)
    policies = load_policies(settings.policies)
    if args.dataset not in policies:  # before loading any data: a typo answers at once
        raise UnknownDataset.named(args.dataset, policies)
    if args.trial:
        return _run_trial(args, settings, budget)
    # loading lines go to stderr: stdout holds the explanation only (or its JSON document)
    with Gateway.open(settings, progress=None if args.json else lambda line: print(line, file=sys.stderr)) as gw:
        doc = gw.explain(args.dataset, args.sql, budget=budget, mechanism=args.mechanism,
                         consumer=_consumer(args, policies[args.dataset]), dialect=args.dialect,
                         reference_rows=args.reference_rows)
    if args.json:
        print_json(doc)  # the same document as POST /v1/queries/explain answers
        return 0
    print_explanation(doc)
    return 0


def print_explanation(doc: dict[str, Any]) -> None:
    """Print a :meth:`~dpgate.service.Gateway.explain` document as text."""
    print(f"dataset       {doc['dataset']}")
    print(f"canonical SQL {doc['canonical_sql']}")
    print(f"plan hash     {doc['plan_hash']}")
    print(f"columns       {', '.join(doc.get('columns', []))}")
    if doc.get("union_all"):  # issue 21 item 6: each part as a standalone explain, then the one charge
        print(f"UNION ALL     {len(doc['parts'])} parts; {doc['composition']['note']}")
        print(f"budget split  {doc['budget_split']['rule']}")
        for part in doc["parts"]:
            print()
            print(f"--- part {part['part']} of {len(doc['parts'])} ---")
            print_explanation(part)
        print()
        print("--- the release (one charge) ---")
        print(f"mechanism     {doc.get('mechanism')}")
        print_cost(doc)
        return
    for key in (doc.get("plan") or {}).get("narrowed_keys", []):
        kept = (f"{key['range'][0]} … {key['range'][1] - 1}" if key.get("range")
                else ", ".join(str(k) for k in key.get("keys", [])))
        print(f"keys narrowed {key['column']}: {kept} (the WHERE, evaluated on the policy's key list, not on data)")
    for key in doc.get("computed_keys", []):
        print(f"computed key  {key['name']} = {key['expression']} ({key['rule']}, "
              f"{key['domain_size']} key(s))")
    if doc.get("public"):
        print("privacy unit  none: the query reads public tables only; it is answered exactly "
              "and charges nothing")
        print()
        print("exact SQL:")
        print(doc["exact_sql"])
        return
    if doc.get("public_keys_only"):
        print("keys only     over public keys: the release is the policy's key list; it reads no "
              "data and charges nothing")
        return
    c = doc.get("contribution") or {}
    unit = "record-level (each row is a unit)" if c.get("record_level") else c.get("privacy_unit")
    print(f"privacy unit  {unit}")
    groups = (f"{c.get('groups')} group(s) released" if c.get("groups") is not None else
              f"groups of {', '.join(c.get('selected_keys') or [])} selected privately")
    print(f"bounds        k = {c.get('max_groups_per_unit')} groups per unit, "
          f"m = {c.get('max_rows_per_unit')} rows per unit and group; {groups}")
    if doc.get("join"):
        j = doc["join"]
        print(f"join          {' ⋈ '.join(j['tables'])}: {j['bounding']}")
    if doc.get("per_unit"):
        u = doc["per_unit"]
        print(f"per unit      {u.get('table')} (unit {u.get('privacy_unit')}): {u.get('bounding')}")
    if doc.get("partition_selection"):
        print(f"partition selection {_short(doc['partition_selection'])}")
    if doc.get("selection"):
        print(f"selection     {_short(doc['selection'])}")
    print()
    sens = doc.get("sensitivity", {})
    scales = doc.get("noise_scales", {})
    units = {p["id"]: p for p in (doc.get("expected_accuracy") or expected_accuracy(doc))["primitives"]}
    rows = []
    for p in doc["plan"]["primitives"]:
        if p["id"] not in sens:
            continue
        u = units.get(p["id"], {})
        in_units = (f"{_num(u['l1_value'])} / {_num(u['l2_value'])}"
                    if u.get("l1_value") is not None and u.get("l1_value") != u.get("l1") else "")
        rows.append([p["id"], p["kind"], p["column"] or "", _num(sens[p["id"]].get("linf")),
                     _num(sens[p["id"]].get("l1")), _num(sens[p["id"]].get("l2")), u.get("unit", ""), in_units,
                     _num(scales.get(p["id"]))])
    if rows:
        print_table(["primitive", "kind", "column", "linf", "l1", "l2", "in", "l1 / l2 in the column's units",
                     "noise scale"], rows)
        print()
    for pid, q in (doc.get("quantiles") or {}).items():
        print(f"quantile {pid}: OpenDP's exponential mechanism over the bounded per-candidate "
              "counts of (salt hidden):")
        print(q.get("histogram_sql") if isinstance(q, dict) else q)
        print()
    if doc.get("bounded_sql") is not None:
        print("bounded SQL (salt hidden):")
        print(doc["bounded_sql"])
        print()
    if doc.get("cost"):
        print(f"mechanism     {doc.get('mechanism')}")
        print_cost(doc)


def print_cost(doc: dict) -> None:
    """The cost section of ``dpgate explain`` (``doc``: :meth:`Gateway.explain` with
    ``expected_accuracy``): cost, whether it fits, the expected ± per output."""
    cost = doc.get("cost") or {}
    budget = doc.get("budget") or {}
    asked = ", ".join(f"{k} {_num(v)}" for k, v in budget.items() if isinstance(v, (int, float))) or "policy default"
    print(f"budget        {asked}")
    rho, eps = cost.get("rho"), cost.get("epsilon_at_delta")
    pure = cost.get("epsilon")
    if isinstance(rho, (int, float)):
        line = f"cost          ρ {_num(rho)}"
        if isinstance(pure, (int, float)):
            line += f" (pure ε {_num(pure)})"
    elif isinstance(pure, (int, float)):  # Laplace: a pure-ε charge (its RDP curve, ρ ≤ ε²/2: BS16 Prop. 1.4)
        line = f"cost          pure ε {_num(pure)}"
    else:
        line = "cost          0"
    if isinstance(eps, (int, float)) and isinstance(cost.get("delta"), (int, float)):
        line += f"; ε {_num(eps)} at δ {cost['delta']:g} for this release alone"
    print(line)
    left = cost.get("remaining_rho")
    who = f"allocation {cost['consumer']}" if cost.get("consumer") else "the population"
    if cost.get("filter") == "gdp" and cost.get("fits") is not None:  # Gaussian-DP filter: μ², not ρ
        print(f"fits          {'yes' if cost['fits'] else 'NO'}: {cost.get('message', '')}")
    elif cost.get("fits") is True:
        print(f"fits          yes: {who} has ρ {_num(left)} left" if isinstance(left, (int, float))
              else "fits          yes")
    elif cost.get("fits") is False:
        print(f"fits          NO: {who} has only ρ {_num(left)} left; running it would be refused "
              "(budget_exhausted) and charge nothing")
    if cost.get("message") and cost.get("fits") is None:
        print(f"              {cost['message']}")
    expected = doc.get("expected_accuracy") or {}
    outputs = expected.get("outputs") or []
    if outputs:
        print()
        n0 = expected.get("reference_rows")
        print("expected accuracy (95 %):")
        print_table(["output", "±", "note", "bounds"],
                    [[o["label"], _plus_minus(o, n0), o["note"], _bounds(o.get("bounds"))] for o in outputs])
    if doc.get("warnings"):
        print()
        print("warnings (before paying: the noise would swamp these outputs):")
        for w in doc["warnings"]:
            print(f"  ! {w}")


def _plus_minus(o: dict, n0: Any) -> str:
    if o.get("ci95") is not None:
        return ("± ~" if o.get("approximate") else "± ") + _num(o["ci95"])
    if o.get("ci95_at_reference_rows") is not None:  # AVG: at a group of n0 rows (issue 22 item 6)
        return f"± ≤ {_num(o['ci95_at_reference_rows'])} at {_num(n0)} rows"
    return ""


def _bounds(b: Any) -> str:
    return f"[{_num(b['lower'])}, {_num(b['upper'])}]" if isinstance(b, dict) else ""


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} = {_num(v) if isinstance(v, float) else v}" for k, v in value.items()
                         if not isinstance(v, (dict, list)))
    return str(value)


def _num(value) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "" if value is None else str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}" if abs(value) >= 10000 else str(int(value))
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _run_trial(args: argparse.Namespace, settings, budget) -> int:
    """``--trial``: the gateway's explain with a free run on the proxy (issue 23 item 6);
    ``budget`` is the request's :class:`~dpgate.service.QueryBudget` (None: the policy's)."""
    from dpgate.cli.query import format_release
    from dpgate.service import Gateway

    with Gateway.open(settings, progress=None) as gw:
        result = gw.explain(args.dataset, args.sql, budget=budget, mechanism=args.mechanism,
                            consumer=_consumer(args, load_policies(settings.policies)[args.dataset]),
                            dialect=args.dialect, trial=True)
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
