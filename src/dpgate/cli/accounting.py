"""``dpgate accounting epsilon|rho``: privacy-accounting calculator (reads no data, charges nothing).

The first row is always **the ledger's number** — the one conversion every dpgate surface
shows (receipts, spend reports, the console, the burn-down's ε axis): the cap rule,
Balle et al. 2020 Thm. 21 at the orders of the ledger's RDP grid (the best one, α_cap for a
cap), at δ less the δ reserved for partition selection (``--selection-delta``, default δ/2 as
in a policy). The textbook conversions follow for comparison, at the full δ.

* ``dpgate accounting epsilon --rho 0.25 --delta 1e-6`` prints the (ε, δ) of a
  total ρ: the ledger's, then simple ([BS16] Prop. 1.3), tight ([CKS20]
  Cor. 13) and exact (continuous Gaussians only, [BW18] Thm. 8). Instead of
  ``--rho``, ``--sigma S [--l2-sensitivity D] [--releases N]`` gives
  ρ = N·D²/(2S²).
* ``dpgate accounting attack --epsilon 4 --delta 1e-6 [--rho R | --mu M] [--fpr 0.01]`` prints
  the membership-attack bound: the largest true-positive rate of any test at each false-positive
  rate, TPR ≤ e^ε·FPR + δ ([KOV15] Thm. 2.1), tighter with a ρ-zCDP or μ-GDP guarantee
  (:mod:`dpgate.attack`).
* ``dpgate accounting rho --epsilon 4 --delta 1e-6`` prints the largest total ρ
  (ρ_cap) meeting the cap: the ledger's (what a policy with that cap is enforced as,
  with its α_cap), then by each textbook conversion; with ``--releases N`` also the
  per-release ρ and σ (for ``--l2-sensitivity``, default 1) of N equal releases,
  optionally for a ``--share`` of the cap.

See :mod:`dpgate.accounting` and :mod:`dpgate.ledger.caps` for the formulas and references.
"""

from __future__ import annotations

import argparse
import math

from dpgate import accounting
from dpgate.errors import InvalidBudget
from dpgate.limits import MAX_ABS_BOUND, MAX_QUERY_RHO

#: The calculator's documented range for ρ, ε and μ (totals): [0, 10⁴], the largest one request
#: may spend (:data:`dpgate.limits.MAX_QUERY_RHO`); beyond it the conversions overflow doubles.
MAX_PARAMETER: float = MAX_QUERY_RHO

_SOURCES = {
    "ledger": "dpgate's ledger (its cap rule): Balle et al. 2020, Thm. 21 at its RDP grid's orders, "
              "at delta - selection_delta",
    "simple": "Bun & Steinke 2016, Prop. 1.3 (at delta)",
    "tight": "Canonne, Kamath & Steinke 2020, Cor. 13 (at delta)",
    "exact": "Balle & Wang 2018, Thm. 8 (continuous Gaussian only, at delta)",
}
#: The order of the rows: the ledger's number first, then the textbook conversions.
_ROWS = ("ledger", *accounting.CONVERSIONS)


def _in_range(value: float | None, name: str, *, low: float = 0.0, high: float = MAX_PARAMETER,
              open_low: bool = False) -> None:
    """Refuse ``value`` (a command-line number; None: not given) outside ``[low, high]`` (or
    ``(low, high]`` with ``open_low``), NaN and ±inf included, with a sentence naming the range.

    Raises:
        ValueError: out of the documented range (the caller turns it into InvalidBudget).
    """
    if value is None:
        return
    inside = math.isfinite(value) and (value > low if open_low else value >= low) and value <= high
    if not inside:
        bracket = "(" if open_low else "["
        raise ValueError(f"{name} must be a finite number in {bracket}{low:g}, {high:g}] (the calculator's "
                         f"documented range), got {value!r}")


def _check_inputs(args: argparse.Namespace) -> None:
    """Every number of an ``accounting`` command inside its documented range, before any
    conversion runs (a huge ρ or ε would overflow the conversions' doubles)."""
    for name in ("rho", "epsilon", "mu"):
        _in_range(getattr(args, name, None), name)
    delta = args.delta
    if not (math.isfinite(delta) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must be a finite number in [0, 1), got {delta!r}")
    _in_range(getattr(args, "sigma", None), "sigma", high=math.inf, open_low=True)
    _in_range(getattr(args, "l2_sensitivity", None), "l2 sensitivity", high=MAX_ABS_BOUND, open_low=True)
    releases = getattr(args, "releases", None)
    if releases is not None and not 1 <= releases <= 10**9:
        raise ValueError(f"releases must be an integer in [1, 10^9], got {releases}")


def _selection_delta(args: argparse.Namespace) -> float:
    """The δ reserved for partition selection: ``--selection-delta``, default δ/2 (a policy's default)."""
    sel = args.delta / 2 if args.selection_delta is None else args.selection_delta
    if not (0 <= sel < args.delta or sel == args.delta == 0) or math.isnan(sel):
        raise ValueError(f"selection delta must be in [0, delta) = [0, {args.delta:g}), got {sel:g}")
    return sel


def _note(d_rho: float, sel: float) -> str:
    from dpgate.ledger.caps import LEDGER_RULE_DIFFERENCE

    return (f"ledger = what dpgate shows and enforces, at delta - selection_delta = {d_rho:.3g} (selection_delta = "
            f"{sel:.3g}); {LEDGER_RULE_DIFFERENCE} (README: \"One conversion: the ledger's\")")


def _num(value: float):
    """JSON-friendly number: ∞ as the string "inf" (strict JSON has no infinity)."""
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def _fmt(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.6g}"


def _epsilon(args: argparse.Namespace, settings) -> int:
    from dpgate.cli import print_json, print_table

    try:
        _check_inputs(args)
        if args.rho is not None:
            if args.sigma is not None:
                raise ValueError("give either --rho or --sigma, not both")
            rho = args.rho  # validated by the conversions below
        elif args.sigma is not None:
            if args.releases < 1:
                raise ValueError(f"releases must be >= 1, got {args.releases}")
            try:
                rho = args.releases * accounting.gaussian_rho(args.l2_sensitivity, args.sigma)
            except (ZeroDivisionError, OverflowError):  # sigma² underflows to 0
                rho = math.inf
            if not rho <= MAX_PARAMETER:
                raise ValueError(f"the total rho of --sigma {args.sigma:g} (releases x l2^2 / (2 sigma^2) = {rho:g}) "
                                 f"is out of the calculator's documented range [0, {MAX_PARAMETER:g}]: sigma is too small")
        else:
            raise ValueError("give --rho (total ρ) or --sigma (noise scale of each release)")
        from dpgate.ledger.caps import ledger_epsilon

        sel = _selection_delta(args)
        d_rho = args.delta - sel
        results = {"ledger": ledger_epsilon(rho, d_rho) if rho > 0 else 0.0}
        results.update({name: accounting.zcdp_epsilon(rho, args.delta, name) for name in accounting.CONVERSIONS})
    except (ValueError, OverflowError) as exc:
        raise InvalidBudget(str(exc), {"command": "accounting epsilon"}) from None
    if args.json:
        print_json(
            {
                "rho": rho,
                "delta": args.delta,
                "selection_delta": sel,
                "ledger_delta": d_rho,
                "epsilon": {name: _num(v) for name, v in results.items()},
                "sources": _SOURCES,
                "note": _note(d_rho, sel),
            }
        )
        return 0
    print(f"total rho = {rho:.6g}, delta = {args.delta:g}")
    print_table(["conversion", "epsilon", "source"], [[n, _fmt(results[n]), _SOURCES[n]] for n in _ROWS])
    print(_note(d_rho, sel))
    return 0


def _rho(args: argparse.Namespace, settings) -> int:
    from dpgate.cli import print_json, print_table

    try:
        _check_inputs(args)
        if not 0.0 < args.share <= 1.0 or math.isnan(args.share):
            raise ValueError(f"share must be in (0, 1], got {args.share}")
        if args.releases is not None and args.releases < 1:
            raise ValueError(f"releases must be >= 1, got {args.releases}")
        from dpgate.ledger.caps import fix_epsilon_cap

        sel = _selection_delta(args)
        d_rho = args.delta - sel
        ledger_rho, alpha_cap = fix_epsilon_cap(args.epsilon, d_rho) if d_rho > 0 else (0.0, None)
        caps = {"ledger": ledger_rho}
        caps.update({name: accounting.rho_for_cap(args.epsilon, args.delta, name) for name in accounting.CONVERSIONS})
        per_release = {}
        if args.releases is not None:
            for name, rho_cap in caps.items():
                rho_each = args.share * rho_cap / args.releases
                sigma = accounting.gaussian_sigma(args.l2_sensitivity, rho_each) if rho_each > 0 else math.inf
                per_release[name] = {"rho": rho_each, "sigma": sigma}
    except (ValueError, OverflowError) as exc:
        raise InvalidBudget(str(exc), {"command": "accounting rho"}) from None
    if args.json:
        out = {
            "epsilon": args.epsilon,
            "delta": args.delta,
            "selection_delta": sel,
            "ledger_delta": d_rho,
            "alpha_cap": alpha_cap,
            "rho_cap": caps,
            "sources": _SOURCES,
            "note": _note(d_rho, sel),
        }
        if per_release:
            out.update(
                share=args.share,
                releases=args.releases,
                l2_sensitivity=args.l2_sensitivity,
                per_release={n: {k: _num(v) for k, v in d.items()} for n, d in per_release.items()},
            )
        print_json(out)
        return 0
    print(f"cap epsilon = {args.epsilon:g}, delta = {args.delta:g}"
          + (f" (the ledger enforces it as rho_cap = {ledger_rho:.6g} at alpha_cap = {alpha_cap:g})"
             if alpha_cap is not None else ""))
    headers = ["conversion", "rho_cap"]
    if per_release:
        headers += [f"rho/release ({args.share:g} over {args.releases})", f"sigma (l2 {args.l2_sensitivity:g})"]
    rows = []
    for name in _ROWS:
        row = [name, _fmt(caps[name])]
        if per_release:
            row += [_fmt(per_release[name]["rho"]), _fmt(per_release[name]["sigma"])]
        source = _SOURCES[name] + (f" (alpha_cap = {alpha_cap:g})" if name == "ledger" and alpha_cap else "")
        rows.append(row + [source])
    print_table(headers + ["source"], rows)
    print(_note(d_rho, sel))
    return 0


def _attack(args: argparse.Namespace, settings) -> int:
    from dpgate.attack import FPR_GRID, attack_bound
    from dpgate.cli import print_json, print_table

    try:
        _check_inputs(args)
        if args.rho is not None and args.mu is not None:
            raise ValueError("give at most one of --rho and --mu")
        if not 0.0 < args.fpr < 1.0:
            raise ValueError(f"fpr must be in (0, 1), got {args.fpr}")
        fprs = sorted(set(FPR_GRID) | {args.fpr})
        out = attack_bound(args.epsilon, args.delta, rho=args.rho, mu=args.mu, fpr=args.fpr, fprs=fprs)
    except (ValueError, OverflowError) as exc:
        raise InvalidBudget(str(exc), {"command": "accounting attack"}) from None
    if args.json:
        print_json(out)
        return 0
    print(f"membership attack at (epsilon = {args.epsilon:g}, delta = {args.delta:g})"
          + (f", rho = {args.rho:g}" if args.rho is not None else "")
          + (f", mu = {args.mu:g}" if args.mu is not None else "")
          + f": at FPR = {args.fpr:g} any test has TPR <= {out['tightest']['tpr']:.4g} "
          f"({out['tightest']['bound']} bound; TPR <= e^epsilon * FPR + delta = {out['dp']['tpr']:.4g})")
    headers = ["FPR", "TPR <= (eps, delta)"] + [f"TPR <= {k}" for k in ("zcdp", "gdp") if k in out]
    rows = []
    for i, f in enumerate(out["fprs"]):
        row = [f"{f:g}", f"{out['dp']['curve'][i]:.4g}"] + [f"{out[k]['curve'][i]:.4g}" for k in ("zcdp", "gdp")
                                                           if k in out]
        rows.append(row)
    print_table(headers, rows)
    print("sources: Kairouz, Oh & Viswanath 2015 Thm. 2.1 (epsilon, delta); Mironov 2017 Prop. 10 with "
          "Canonne, Kamath & Steinke 2020 Cor. 13 (zCDP); Dong, Roth & Su 2022 Def. 2.6 (GDP: continuous Gaussians only)")
    return 0


def register(subparsers) -> None:
    """Add the ``accounting`` command with its ``epsilon`` and ``rho`` sub-commands."""
    from dpgate.cli import add_common_options

    parser = subparsers.add_parser(
        "accounting",
        help="privacy-accounting calculator: rho <-> (epsilon, delta)",
        description="Convert zCDP rho to (epsilon, delta) and back, by each conversion. "
        "Reads no data and charges nothing.",
    )
    sub = parser.add_subparsers(dest="accounting_command", metavar="ACTION")
    sub.required = True

    p_eps = sub.add_parser("epsilon", help="epsilon of a total rho at delta, by each conversion")
    p_eps.add_argument("--rho", type=float, help="total (composed) rho, in [0, 1e4]")
    p_eps.add_argument("--sigma", type=float, help="Gaussian noise scale of each release (instead of --rho)")
    p_eps.add_argument("--l2-sensitivity", type=float, default=1.0, help="L2 sensitivity (with --sigma; default 1)")
    p_eps.add_argument("--releases", type=int, default=1, help="number of releases (with --sigma; default 1)")
    p_eps.add_argument("--delta", type=float, required=True, help="delta in [0, 1) (a cap's total delta)")
    p_eps.add_argument("--selection-delta", type=float, default=None,
                       help="the part of delta reserved for partition selection (default delta/2, as in a policy with a key column without public keys; 0 for a policy whose key columns all have public keys)")
    add_common_options(p_eps)
    p_eps.set_defaults(func=_epsilon)

    p_rho = sub.add_parser("rho", help="largest total rho meeting an (epsilon, delta) cap, by each conversion")
    p_rho.add_argument("--epsilon", type=float, required=True, help="cap epsilon, in (0, 1e4]")
    p_rho.add_argument("--delta", type=float, required=True, help="cap delta in [0, 1)")
    p_rho.add_argument("--selection-delta", type=float, default=None,
                       help="the part of delta reserved for partition selection (default delta/2, as in a policy with a key column without public keys; 0 for a policy whose key columns all have public keys)")
    p_rho.add_argument("--releases", type=int, help="split the cap over this many equal releases")
    p_rho.add_argument("--share", type=float, default=1.0, help="share of the cap to split (default 1)")
    p_rho.add_argument("--l2-sensitivity", type=float, default=1.0, help="L2 sensitivity for sigma (default 1)")
    add_common_options(p_rho)
    p_rho.set_defaults(func=_rho)

    p_att = sub.add_parser("attack", help="membership-attack bound: largest TPR at each FPR for (epsilon, delta)")
    p_att.add_argument("--epsilon", type=float, required=True, help="total epsilon (of a cap or a spend), in [0, 1e4]")
    p_att.add_argument("--delta", type=float, required=True, help="total delta in [0, 1)")
    p_att.add_argument("--rho", type=float, help="also a total rho-zCDP guarantee (tighter curve)")
    p_att.add_argument("--mu", type=float, help="also a mu-GDP guarantee (continuous Gaussians only)")
    p_att.add_argument("--fpr", type=float, default=0.01, help="the false-positive rate to quote (default 0.01)")
    add_common_options(p_att)
    p_att.set_defaults(func=_attack)
