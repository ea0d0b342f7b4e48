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
    p.add_argument("--consumer", help="allocation that pays (default: analysts; with --search-id, the "
                                      "search's consumer, the only one that may pay for its steps)")
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
    p.add_argument("--fallback", choices=("proxy", "none"),
                   help="when the budget refuses the query: 'proxy' answers it exactly on the dataset's proxy "
                        "(free, not DP, not stored); 'none' never falls back (default: the policy's "
                        "proxy_default_for)")
    add_common_options(p)
    p.set_defaults(func=run)


def _value(value) -> str:
    """A released value: 6 significant digits; whole thousands separated from 10⁶ on (no exponent)."""
    if isinstance(value, float):
        return f"{value:,.0f}" if 1e6 <= abs(value) < 1e15 else f"{value:.6g}"
    return str(value)


def _pm(x: float) -> str:
    """A half-width for people: whole numbers with separators from 1000 on, else 3 digits."""
    return f"{round(x):,}" if abs(x) >= 1000 else f"{x:.3g}"


def _range_text(entry: dict) -> str:
    lo, hi = entry.get("lower"), entry.get("upper")
    if hi is None:
        return f"≥ {lo:g}"
    if lo is None:
        return f"≤ {hi:g}"
    return f"[{lo:g}, {hi:g}]"


def format_release(release: dict) -> None:
    """Print a release as a table, each noisy cell with its accuracy, then what the marks mean.

    * ``v ± t``: the cell's own 95 % half-width (a count's or sum's exact interval for its noise);
    * ``v ± ~t``: an approximate interval, per row (AVG, VAR, STDDEV: the release's ``ci95_rows``),
      of the coverage the release states (``accuracy[column].coverage``);
    * ``v (± r ranks)``: a DP quantile (MEDIAN, PERCENTILE, MIN, MAX), whose accuracy is a rank error;
    * ``*``: the value sits on a bound of its range (``value_ranges``): the noisy estimate was at or
      beyond it and was clamped (a count at 0, an AVG at the column's lower or upper bound).
    """
    from dpgate.postprocess.ranges import clamped_at_bound

    acc = release.get("accuracy", {}) or {}
    ranges = release.get("value_ranges") or {}
    headers = list(release["columns"])
    rows, clamped, approximate, exact, ranked = [], set(), {}, False, {}
    for i, row in enumerate(release["rows"]):
        cells = []
        for name, value in zip(headers, row):
            a = acc.get(name)
            if value is None:
                cells.append("(suppressed)" if a else "")
                continue
            if not a:
                cells.append(str(value))
                continue
            text = _value(value)
            if a.get("rank_error95") is not None:
                text += f" (± {_pm(a['rank_error95'])} ranks)"
                ranked[name] = a
            else:
                per_row = a.get("ci95_rows")
                ci = per_row[i] if isinstance(per_row, list) and i < len(per_row) else a.get("ci95")
                if ci is not None:
                    if a.get("approximate"):
                        text += f" ± ~{_pm(ci)}"
                        approximate[name] = a
                    else:
                        text += f" ± {_pm(ci)}"
                        exact = True
            if clamped_at_bound(value, ranges.get(name)):
                text += " *"
                clamped.add(name)
            cells.append(text)
        rows.append(cells)
    print_table(headers, rows)
    notes = []
    if exact:
        notes.append("± t: the 95 % half-width of the cell's noise (exact)")
    for name, a in approximate.items():
        coverage = a.get("coverage")
        cover = f"coverage ≥ {coverage * 100:g} %" if isinstance(coverage, (int, float)) else "approximate coverage"
        notes.append(f"{name}: ± ~t per row, an interval of {cover} for the noise ({a.get('method', 'approximate')}), "
                     "not for the clamping bias")
    for name, a in ranked.items():
        q = a.get("quantile")
        where = f"{q:g}·n" if isinstance(q, (int, float)) else "q·n"
        notes.append(f"{name}: a DP quantile, no value interval: with probability ≥ 95 % the released value has "
                     f"{where} ± {_pm(a['rank_error95'])} of the group's n values below it")
    for name in sorted(clamped):
        r = ranges[name]
        notes.append(f"{name}: * = on a bound of {_range_text(r)} ({r.get('rule', 'its range')}): the noisy estimate "
                     "was at or beyond it and was clamped")
    for note in notes:
        print(f"  {note}")


def run(args: argparse.Namespace, settings) -> int:
    """Run the query and print the release, its charge and the remaining budget.

    Raises:
        UnknownConsumer: ``--consumer`` has no allocation (the message lists the ones there are).
    """
    from dpgate.errors import InvalidRequest, UnknownConsumer
    from dpgate.service import Gateway, QueryBudget

    budget = QueryBudget(rho=args.rho, epsilon=args.epsilon, ci95=args.ci95, expected_count=args.expected_count,
                         delta=args.delta)
    with Gateway.open(settings, progress=None if args.json else print) as gw:
        consumer = args.consumer
        if args.search_id is not None:  # the operator sees every search; its own consumer pays its steps
            owner = gw.searches.owned(args.search_id, owner=None)["body"]["consumer"]
            if consumer is not None and consumer != owner:
                raise InvalidRequest(f"search {args.search_id} belongs to consumer {owner!r}: its steps are "
                                     f"charged to {owner!r}, not {consumer!r} (drop --consumer)",
                                     {"search_id": args.search_id, "consumer": consumer, "search_consumer": owner})
            consumer = owner
        consumer = consumer or "analysts"
        try:
            release = gw.query(args.dataset, args.sql, consumer=consumer, budget=budget,
                               mechanism=args.mechanism, dialect=args.dialect, search_id=args.search_id,
                               fallback=args.fallback)
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
    if release.get("source") == "proxy":  # issue 23: a proxy answer, not a DP release
        proxy = release["proxy"]
        print(f"refused for budget: {release['refused']['message']}")
        print()
        print(f"answered instead on proxy {proxy['dataset']!r} ({proxy['provenance']}): exact, free, NOT a "
              "differentially private release of the protected data, not stored")
        format_release(release)
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
    _print_remaining(report, consumer)
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
