"""Utility of 52 weekly count releases under one total (ε = 4, δ = 1e-6): the gateway's side.

    python -m bench.utility --data bench/.data/pums_120k

A PUMS policy whose cap is the total (ε, δ) (so the ledger enforces it), with
clamping of counts off (so the error is the noise alone). ρ_cap is the budget
ρ the ledger fixed for the cap (its rule: a Rényi order α_cap of its grid, δ less the selection δ) —
the ledger's own currency — and each of the 52 releases of
``SELECT educ, COUNT(*) FROM pums GROUP BY educ`` asks for ρ_cap/52 (times
1 − 10⁻⁹ against rounding). After the 52 releases a 53rd is refused
(``BudgetExhausted``), which checks that the total is really enforced. RMSE
is over all 52 × 16 cells against the exact counts.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from dpgate import accounting


def measure(data: Path, *, weeks: int = 52, epsilon: float = 4.0, delta: float = 1e-6,
            true: dict[str, int] | None = None) -> dict[str, Any]:
    """Run the ``weeks`` releases on the PUMS folder ``data``; return RMSE, σ and the refusal check."""
    from bench.latency import write_policies
    from dpgate.errors import BudgetExhausted
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    if true is None:
        from bench.peers import utility_spec

        true = utility_spec(data)["true"]
    tmp = Path(tempfile.mkdtemp(prefix="dpgate-utility-"))
    try:
        entry = write_policies(data, tmp / "policies", epsilon=epsilon, delta=delta, clamp_counts=False)[0]
        sql = "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ"
        sq, n, sigma = 0.0, 0, None
        # its own state folder (tmp/home) per run; ρ_cap as the ledger fixed it (its cap rule: grid
        # order α_cap, δ less the selection δ), not a textbook conversion that can exceed it
        with Gateway.open(Settings(policies=tmp / "policies", home=tmp / "home")) as gw:
            rho_cap = float(gw.dataset(entry["dataset"])["cap"]["rho"])
            rho = rho_cap / weeks * (1 - 1e-9)
            for i in range(weeks):
                rel = gw.query(entry["dataset"], sql, consumer="analysts",
                               budget=QueryBudget(rho=rho * (1 - i * 1e-12)))
                sigma = next(iter(rel["noise_scales"].values()))
                for key, cnt in rel["rows"]:
                    sq += (cnt - true[str(int(key))]) ** 2
                    n += 1
            try:
                gw.query(entry["dataset"], sql, consumer="analysts", budget=QueryBudget(rho=rho * 0.999))
                refused = False
            except BudgetExhausted:
                refused = True
            spend = gw.budget(entry["dataset"])
        return {"rmse": math.sqrt(sq / n), "cells": n, "releases": weeks, "releases_run": weeks,
                "rho_cap": rho_cap, "rho_per_release": rho, "noise_sigma": sigma,
                "spent_epsilon": spend["spent"]["epsilon"], "release_53_refused": refused,
                "accountant": "dpgate ledger: zCDP filter, ρ_cap as the ledger fixed it (grid order α_cap)",
                "exact_gaussian_epsilon": accounting.gaussian_epsilon_exact(rho_cap, delta)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: print the results as JSON."""
    ap = argparse.ArgumentParser(prog="python -m bench.utility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a PUMS folder written by bench.datagen")
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.data), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
