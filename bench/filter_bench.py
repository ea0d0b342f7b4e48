"""The ledger's filter decision in isolation (no I/O): microseconds per decision.

Usage::

    python bench/filter_bench.py [--src SRC] [--repeat N]

Times :func:`dpgate.ledger.base.filter_decision` on a history of 1,000 mixed charges for a
zCDP request (the zCDP filter) and an RDP-curve request (the Rényi filter), for a legacy
budget (every finite grid order and α* checked) and, when the code has it, a budget of the
α_cap rule (grid orders up to α_cap). ``--src`` points at another checkout's ``src`` folder
to time that code in the same run (e.g. ``--src ../main/src``). Not a test.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(Path(__file__).resolve().parents[1] / "src"),
                    help="the src folder whose dpgate to time (default: this checkout's)")
    ap.add_argument("--repeat", type=int, default=5, help="repetitions (best is reported)")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.src)
    from dpgate import accounting
    from dpgate.accounting import Cost
    from dpgate.ledger import base

    cap = base.validate_cap(4.0, 1e-6)
    budgets = {"legacy": base.BudgetCurve(cap.rho_cap * 1e6, cap.alpha_star)}
    if hasattr(base.BudgetCurve, "of"):
        budgets["alpha_cap"] = base.BudgetCurve.of(base.CapSpec(**{**cap.__dict__, "rho_cap": cap.rho_cap * 1e6}))
    totals = base.Totals()
    for i in range(1000):
        totals = totals.add(Cost.zcdp(1e-6) if i % 2 else Cost.pure(1e-3))
    requests = {"zcdp request": Cost.zcdp(1e-6), "rdp request": Cost.rdp(accounting.gaussian_rdp(1e-6))}
    print(f"dpgate from {args.src}")
    print(f"{'budget':10} {'request':14} {'µs/decision':>12}")
    for bname, budget in budgets.items():
        for rname, req in requests.items():
            assert base.filter_decision(totals, req, budget).ok
            n = 2000
            best = min(timeit.repeat(lambda: base.filter_decision(totals, req, budget), number=n,
                                     repeat=args.repeat))
            print(f"{bname:10} {rname:14} {best / n * 1e6:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
