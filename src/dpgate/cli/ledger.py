"""``dpgate ledger``: inspect, verify and export the privacy-budget ledger.

* ``dpgate ledger show [--population P] [--limit N]`` — spend per population
  (cap, spent and remaining in ρ and in ε by the ledger's conversion, per consumer) and the
  latest charges.
* ``dpgate ledger verify`` — recompute the spend from the entries and check the
  hash chain; exit status 1 if a problem is found.
* ``dpgate ledger export [--output FILE]`` — every entry (charges and governance
  events) as JSON lines, in chain order, so an auditor can re-check the chain.
  The stored JSON fields (a charge's ``cost`` and ``metadata``, an event's ``old``
  and ``new``) are written as JSON objects, not as JSON strings inside JSON, so
  ``jq '.new.epsilon'`` works. The hash is over the stored text: serialise each of
  those four fields with the canonical JSON (sorted keys, no spaces, shortest
  round-trip floats; :func:`dpgate.ledger.entries.hashed_entry`), then SHA-256 of
  the canonical JSON of the line without its ``hash`` field equals that field, and
  each ``prev_hash`` is the previous line's ``hash``. Exports written before issue 24
  (those fields as strings) check with the same function.

* ``dpgate ledger charge --population P --consumer C --purpose "…" --q Q --noise-multiplier S
  --steps T --sampler poisson|shuffle|fixed_batches|with_replacement [--curve-file F]
  [--cohort K …]`` — charge a DP-SGD run described by its parameters (issue 23): the gateway
  computes its RDP curve (amplified for ``poisson`` only); ``--curve-file`` (JSON ``{"orders",
  "curve"}`` or a list on the ledger's grid) is the caller's own accountant, checked to be at
  least the gateway's. The same as ``POST /v1/ledger/charges`` with ``dp_sgd``.

``show``, ``verify`` and ``export`` are read-only: they never create a ledger (a missing file
is an error) and never write to one; ``charge`` appends one charge (or is refused and writes
nothing). ``--json`` prints JSON instead of tables.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from dpgate.cli import add_common_options, print_json, print_table


def register(subparsers: Any) -> None:
    """Add ``ledger show|verify|export`` to the top-level sub-command parsers."""
    parser = subparsers.add_parser(
        "ledger", help="inspect, verify and export the privacy-budget ledger",
        description="Inspect, verify and export the privacy-budget ledger (read-only).",
    )
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION")
    actions.required = True

    show = actions.add_parser("show", help="spend per population and the latest charges")
    add_common_options(show)
    show.add_argument("--population", help="only this population")
    show.add_argument("--limit", type=_positive_int, default=20,
                      help="how many of the latest charges to list (default 20)")
    show.set_defaults(func=cmd_show)

    verify = actions.add_parser("verify", help="check the hash chain and recompute the spend (exit 1 on problems)")
    add_common_options(verify)
    verify.set_defaults(func=cmd_verify)

    charge = actions.add_parser("charge", help="charge a DP-SGD run described by its parameters (or a curve)")
    add_common_options(charge)
    charge.add_argument("--population", required=True)
    charge.add_argument("--consumer", required=True, help="the allocation that pays")
    charge.add_argument("--purpose", required=True, help="recorded with the charge (e.g. the run's name)")
    charge.add_argument("--q", type=float, help="sampling rate per step (batch size / dataset size)")
    charge.add_argument("--noise-multiplier", type=float, help="noise standard deviation / clipping norm")
    charge.add_argument("--steps", type=int, help="noisy gradient steps")
    charge.add_argument("--sampler", choices=("poisson", "shuffle", "fixed_batches", "with_replacement"),
                        help="how batches were drawn (only poisson is amplified)")
    charge.add_argument("--curve-file", help="your accountant's RDP curve: JSON {orders, curve} or a list on the "
                                             "ledger's grid (checked against the parameters if given)")
    charge.add_argument("--cohort", action="append", dest="cohorts",
                        help="for a population with cohorts: a cohort the run read (repeat; default: every "
                             "cohort the population's policies declare)")
    charge.add_argument("--actor", help="who charges (default: cli:<user>@<host>)")
    charge.set_defaults(func=cmd_charge)

    export = actions.add_parser("export", help="every entry and event as JSON lines, in chain order")
    add_common_options(export)
    export.add_argument("--output", "-o", help="write to this file instead of standard output")
    export.set_defaults(func=cmd_export)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _open(settings: Any):
    from dpgate.ledger import open_ledger

    return open_ledger(settings.resolved_ledger_url(), create=False)


def _fmt(x: Any, digits: int = 6) -> str:
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return "" if x is None else str(x)


def cmd_show(args: argparse.Namespace, settings: Any) -> int:
    """Print spend reports (all populations or ``--population``) and the latest ``--limit`` charges."""
    from dpgate.errors import UnknownPopulation

    led = _open(settings)
    try:
        names = led.populations()
        if args.population is not None:
            if args.population not in names:
                raise UnknownPopulation(f"no population {args.population!r} in the ledger",
                                        {"population": args.population})
            names = [args.population]
        reports = [led.spend(n) for n in names]
        entries = led.entries(args.population, limit=args.limit)
    finally:
        led.close()
    from dpgate.ledger.reports import entry_rho_checked

    caps = {r.population: r.cap for r in reports}
    entries = [{**e, "rho_checked": entry_rho_checked(e, caps.get(e["population"]))} for e in entries]
    if args.json:
        print_json({"populations": [r.to_dict() for r in reports], "entries": entries})
        return 0
    if not reports:
        print("the ledger has no populations yet")
        return 0
    print_table(
        ["population", "cap ε", "δ", "ρ cap", "spent ρ", "spent ε", "remaining ρ", "remaining ε", "charges"],
        [[r.population, _fmt(r.epsilon, 4), _fmt(r.delta, 3), _fmt(r.rho_cap), _fmt(r.spent_rho),
          _fmt(r.spent_epsilon, 4), _fmt(r.remaining_rho), _fmt(r.remaining_epsilon, 4), r.charges]
         for r in reports],
    )
    rows = [[r.population, c.name, _fmt(c.share, 4) if c.share is not None else "any", _fmt(c.cap_rho),
             _fmt(c.spent_rho), _fmt(c.spent_epsilon, 4), _fmt(c.remaining_rho), c.charges]
            for r in reports for c in r.consumers.values()]
    if rows:
        print()
        print_table(["population", "consumer", "share", "cap ρ", "spent ρ", "spent ε", "remaining ρ", "charges"],
                    rows)
    print()
    from dpgate.ledger.caps import CONVERSION_NOTE

    print(CONVERSION_NOTE)
    print()
    print(f"latest {len(entries)} charge(s) (ε is each charge alone at its δ; never add them up):")
    if entries:
        curves = any(e["rho_checked"] != e["rho"] for e in entries)
        print_table(
            ["seq", "created_at", "population", "consumer", "kind", "ρ", "ε alone", "purpose"],
            [[e["seq"], e["created_at"], e["population"], e["consumer"], e["kind"],
              _fmt(e["rho_checked"]) + ("*" if e["rho_checked"] != e["rho"] else ""),
              _fmt(e["epsilon_at_delta"], 4), (e["purpose"][:40] + "…") if len(e["purpose"]) > 41 else e["purpose"]]
             for e in entries],
        )
        if curves:
            print("* an RDP curve (e.g. a DP-SGD run): ρ at the orders the cap checks (α ≤ α_cap), the figure the "
                  "cap check used; the stored ρ bound over every order is ∞ or larger (--json: rho)")
    return 0



def cmd_verify(args: argparse.Namespace, settings: Any) -> int:
    """Verify the ledger; exit status 0 if sound, 1 if a problem was found."""
    led = _open(settings)
    try:
        report = led.verify()
    finally:
        led.close()
    if args.json:
        print_json(report.to_dict())
    elif report.ok:
        print(f"ledger OK: {report.entries} entries ({report.charges} charges, {report.events} events)")
        print(f"chain head: {report.head}")
    else:
        print(f"ledger FAILED verification: {len(report.problems)} problem(s) in {report.entries} entries")
        for p in report.problems:
            print(f"  - {p}")
        print(f"chain head: {report.head}")
    return 0 if report.ok else 1


def cmd_export(args: argparse.Namespace, settings: Any) -> int:
    """Write every chain entry as one JSON object per line (``--output`` or standard output),
    its stored JSON fields as objects (:func:`dpgate.ledger.entries.exported_entry`)."""
    from dpgate.ledger.base import canonical_json
    from dpgate.ledger.entries import exported_entry

    led = _open(settings)
    try:
        chain = led.chain()
    finally:
        led.close()
    lines = "".join(canonical_json(exported_entry(e)) + "\n" for e in chain)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(lines)
        summary = {"output": args.output, "entries": len(chain),
                   "head": chain[-1]["hash"] if chain else None}
        if args.json:
            print_json(summary)
        else:
            print(f"wrote {len(chain)} entries to {args.output}")
    else:
        sys.stdout.write(lines)
    return 0


def cmd_charge(args: argparse.Namespace, settings: Any) -> int:
    """Charge a DP-SGD run (or a caller's curve) to the ledger; print the receipt."""
    import json

    from dpgate.cli.caps import _actor
    from dpgate.cohorts import population_cohorts
    from dpgate.errors import InvalidBudget, InvalidRequest, UnknownPopulation
    from dpgate.policy import load_policies
    from dpgate.training import external_cost

    params = {"q": args.q, "noise_multiplier": args.noise_multiplier, "steps": args.steps, "sampler": args.sampler}
    given = {k: v for k, v in params.items() if v is not None}
    if given and len(given) < 4:
        missing = sorted(set(params) - set(given))
        raise InvalidBudget(f"a DP-SGD run needs --q, --noise-multiplier, --steps and --sampler (missing: "
                            f"{', '.join('--' + m.replace('_', '-') for m in missing)})", {"missing": missing})
    curve = orders = None
    if args.curve_file:
        try:
            with open(args.curve_file, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"cannot read the curve file: {exc}", {"field": "curve_file"}) from None
        dec = lambda v: float("inf") if v in ("inf", "Infinity") else v  # noqa: E731
        if isinstance(data, dict):
            curve, orders = [dec(v) for v in data.get("curve", [])], data.get("orders")
            orders = None if orders is None else [dec(a) for a in orders]
        else:
            curve = [dec(v) for v in data]
    if not given and curve is None:
        raise InvalidBudget("describe the run (--q, --noise-multiplier, --steps, --sampler) or give --curve-file", {})
    cost, how = external_cost(curve=curve, orders=orders, dp_sgd=params if given else None)
    declared = None
    try:
        declared = population_cohorts(load_policies(settings.policies), args.population)
    except Exception:  # noqa: BLE001 - no policies folder: the ledger alone decides (cohorts must be given)
        declared = None
    cohorts = args.cohorts or (list(declared) if declared else None)
    led = _open(settings)
    try:
        if args.population not in led.populations():
            raise UnknownPopulation(f"no population {args.population!r} in the ledger", {"population": args.population})
        receipt = led.charge(args.population, args.consumer, cost, purpose=args.purpose,
                             metadata={"actor": _actor(args), "external": True, **how}, cohorts=cohorts)
    finally:
        led.close()
    out = {**receipt.to_dict(), **{k: how[k] for k in ("accountant", "dp_sgd", "formula") if k in how}}
    if args.json:
        print_json(out)
        return 0
    print(f"charged {out['charge_id']} to {args.population}/{args.consumer}: rho (at the checked orders) = "
          f"{_fmt(receipt.rho_checked)}, epsilon alone = {_fmt(receipt.epsilon_at_delta, 4)} at delta = "
          f"{receipt.delta:g} ({how['accountant']}'s accountant)")
    if "formula" in how:
        print(f"curve: {how['formula']}")
    if receipt.cohorts:
        print(f"cohorts: {', '.join(receipt.cohorts)} (each charged the full cost)")
    return 0


__all__ = ["register", "cmd_show", "cmd_verify", "cmd_export", "cmd_charge"]

