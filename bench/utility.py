"""Utility of 52 weekly count releases under one total (ε = 4, δ = 1e-6): dpgate and its peers.

    python -m bench.utility --trials 3            # PUMS 120k under bench/.data (made once), peers if installed
    python -m bench.utility --data bench/.data/pums_120k --no-peers
    python -m bench.utility --split               # AVG/STDDEV: the optimal budget split vs equal

A PUMS policy whose cap is the total (ε, δ) (so the ledger enforces it), with clamping of
counts off (so the error is the noise alone). ρ_cap is read from the ledger
(``Ledger.cap(population).rho_cap``: the cap rule, a Rényi order α_cap of its grid, at δ less
the cap's selection reserve) — never a hand copy of a conversion — and each of the 52
releases of ``SELECT educ, COUNT(*) FROM pums GROUP BY educ`` asks for ρ_cap/52 (times
1 − 10⁻⁹ against rounding). After the 52 releases a 53rd is refused (``BudgetExhausted``),
which checks that the total is really enforced. RMSE is over all 52 × 16 cells of every
trial against the exact counts; each trial has its own fresh ledger.

Variants of dpgate (issue 22 item 2, "no idle δ reserve"):

* ``dpgate_default``: the bench's PUMS policy as written (``bench.datagen.pums_table_toml``).
  Its ``age`` column (int, bounds [0, 100]) has no public keys, so a GROUP BY age would
  need partition selection, and the default cap reserves δ/2 for it.
* ``dpgate_no_reserve``: the same policy with ``age`` given public keys ``range(0, 101)``:
  now no key column lacks public keys, the default reserve is 0 and ρ_cap is fixed at the
  full δ (the ledger's ``selection_delta`` is checked to be 0).

Variants of dpgate (issue 22 item 1, "tightest valid composition for Gaussian charges"):

* ``dpgate_gdp``: the default policy with ``[budget] composition = "gdp"`` (the policy field:
  the gateway creates the population with the Gaussian-DP filter). A Gaussian-DP population
  never selects keys privately, so its default selection reserve is 0 (checked on the ledger)
  even though ``age`` has no public keys: a ``_no_reserve`` GDP variant would be the same cap.
  Each release asks for the ρ whose discrete Gaussian μ (``accounting.discrete_gaussian_unit_mu``
  at σ = 1/√(2ρ), the largest μ a ρ can have for a sensitivity ≥ 1) is μ_cap/√52, μ_cap read
  from the ledger (``cap.mu_cap``: the exact GDP conversion of the cap at δ).

AVG and STDDEV at equal privacy (issue 22 item 5, ``--split``): ``SELECT educ, AVG(income)``
and ``STDDEV_POP(income)`` over PUMS (income bounds [0, 500000], one row per person) at one ρ,
with the gateway's calibration (its explain's ``noise_scales``: the error-minimising split of
:mod:`dpgate.postprocess.split`) against the equal split (``mechanisms.calibrate`` without
weights) at the same ρ. The exact clamped per-group sums, counts and sums of squares are
noised ``reps`` times with OpenDP's samplers (:func:`dpgate.mechanisms.sample`); the RMSE is
of the noise alone (the noisy ratio, clamped to the bounds as the release does, against the
ratio of the exact bounded values).

PipelineDP (its PLD accountant over the 52 declared aggregations) runs in its own venv
(:mod:`bench.peers`) when it is installed there or installable; otherwise its entry says why.

The data folder is made by :mod:`bench.datagen` on first use and reused afterwards (a checkout
that already has ``bench/.data/pums_120k`` reuses it; a folder without its Parquet file is
made again). Without ``../shared/data/smartnoise/PUMS.csv`` the benchmark is skipped with the
reason.
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

#: The PUMS bootstrap the experiment runs on (the error of a count does not depend on the size).
UTILITY_PUMS = ("pums_120k", 120_000)
#: The policy line of ``age`` in :func:`bench.datagen.pums_table_toml`, and with public keys.
_AGE = 'age     = { type = "int", lower = 0, upper = 100 }'
_AGE_KEYED = 'age     = { type = "int", lower = 0, upper = 100, public_keys = "range(0, 101)" }'
VARIANTS = ("dpgate_default", "dpgate_no_reserve", "dpgate_gdp")
#: The ``[budget]`` line after which the ``dpgate_gdp`` variant states its composition.
_RHO_LINE = "default_query_rho = 0.01\n"


def ensure_pums(data: Path | None) -> tuple[Path | None, str | None]:
    """The PUMS folder to use (made once under ``bench/.data``), or (None, why not)."""
    from bench import datagen

    if data is not None:
        if not (data / "manifest.json").is_file() or not (data / "pums.parquet").is_file():
            return None, f"{data} is not a PUMS folder written by bench.datagen (no manifest.json/pums.parquet)"
        return data, None
    folder, rows = UTILITY_PUMS
    out = Path(__file__).resolve().parent / ".data" / folder
    if (out / "manifest.json").is_file() and (out / "pums.parquet").is_file():
        return out, None
    if not (datagen.SHARED_DATA / "PUMS.csv").is_file():
        return None, f"skipped: {datagen.SHARED_DATA / 'PUMS.csv'} is absent (../shared/data/smartnoise)"
    return (out, None) if datagen.generate_pums(out, rows=rows) else (None, "PUMS bootstrap failed")


def measure(data: Path, *, weeks: int = 52, epsilon: float = 4.0, delta: float = 1e-6,
            true: dict[str, int] | None = None, variant: str = "dpgate_default", trials: int = 1) -> dict[str, Any]:
    """Run ``trials`` × ``weeks`` releases of one dpgate ``variant`` on the PUMS folder ``data``.

    Returns RMSE over every cell of every trial, the calibrated σ, the ledger's cap
    (ρ_cap, selection δ, α_cap) and whether the release after the last was refused.
    """
    from bench.latency import write_policies
    from dpgate.errors import BudgetExhausted
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    if true is None:
        from bench.peers import utility_spec

        true = utility_spec(data)["true"]
    sql = "SELECT educ, COUNT(*) AS n FROM pums GROUP BY educ"
    sq, n, sigma, refused, cap = 0.0, 0, None, [], None
    for trial in range(trials):
        tmp = Path(tempfile.mkdtemp(prefix="dpgate-utility-"))
        try:
            entry = write_policies(data, tmp / "policies", epsilon=epsilon, delta=delta, clamp_counts=False)[0]
            path = tmp / "policies" / f"{entry['dataset']}.toml"
            text = path.read_text()
            if _AGE not in text or _RHO_LINE not in text:
                raise RuntimeError("the PUMS policy's age or default_query_rho line changed; update bench/utility.py")
            if variant == "dpgate_no_reserve":
                path.write_text(text.replace(_AGE, _AGE_KEYED))
            elif variant == "dpgate_gdp":  # the policy field, not a cap change
                path.write_text(text.replace(_RHO_LINE, _RHO_LINE + 'composition = "gdp"\n', 1))
            with Gateway.open(Settings(policies=tmp / "policies", home=tmp / "home")) as gw:
                population = gw.policy(entry["dataset"]).population
                cap = gw.ledger.cap(population)  # the ledger's cap rule, not a hand copy
                if variant != "dpgate_default" and cap.selection_delta != 0.0:
                    raise RuntimeError(f"expected no selection reserve, the ledger has {cap.selection_delta}")
                if variant == "dpgate_gdp":
                    if not cap.gdp:
                        raise RuntimeError("the policy states composition = \"gdp\" but the ledger's cap is not GDP")
                    rho = gdp_rho_per_release(cap.mu_cap, weeks)
                else:
                    rho = cap.rho_cap / weeks * (1 - 1e-9)
                for i in range(weeks):
                    rel = gw.query(entry["dataset"], sql, consumer="analysts",
                                   budget=QueryBudget(rho=rho * (1 - i * 1e-12)))
                    sigma = next(iter(rel["noise_scales"].values()))
                    for key, cnt in rel["rows"]:
                        sq += (cnt - true[str(int(key))]) ** 2
                        n += 1
                try:
                    gw.query(entry["dataset"], sql, consumer="analysts", budget=QueryBudget(rho=rho * 0.999))
                    refused.append(False)
                except BudgetExhausted:
                    refused.append(True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return {"variant": variant, "rmse": math.sqrt(sq / n), "cells": n, "trials": trials, "releases": weeks,
            "rho_cap": cap.rho_cap, "composition": cap.composition,
            "mu_cap": cap.mu_cap if cap.gdp else None, "rho_requested_per_release": rho, "selection_delta": cap.selection_delta, "rho_delta": cap.rho_delta,
            "alpha_cap": cap.alpha_cap, "rho_per_release": cap.rho_cap / weeks, "noise_sigma": sigma,
            "release_after_last_refused": all(refused), "release_53_refused": all(refused),
            "releases_run": weeks * trials,
            "accountant": ("dpgate ledger: Gaussian-DP filter, μ_cap read from the ledger" if cap.gdp else
                           "dpgate ledger: Rényi filter at α_cap, ρ_cap read from the ledger"),
            "exact_gaussian_epsilon": accounting.gaussian_epsilon_exact(cap.rho_cap, cap.rho_delta)}


SPLIT_QUERIES = {"avg": "SELECT educ, AVG(income) AS a FROM pums GROUP BY educ",
                 "stddev": "SELECT educ, STDDEV_POP(income) AS a FROM pums GROUP BY educ"}


def measure_split(data: Path, *, rho: float = 0.01, reps: int = 2000) -> dict[str, Any]:
    """RMSE of AVG(income) and STDDEV_POP(income) by educ: the gateway's split vs the equal split (same ρ)."""
    import duckdb
    import numpy as np

    from bench.latency import write_policies
    from dpgate import mechanisms
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    lo, hi = 0.0, 500000.0
    con = duckdb.connect()
    x = f"LEAST(GREATEST(income, {lo}), {hi})"
    rows = con.execute(f"SELECT educ, SUM(ROUND({x}))::BIGINT, COUNT(income), SUM(ROUND({x}) * ROUND({x}))::HUGEINT "
                       f"FROM '{(data / 'pums.parquet').as_posix()}' GROUP BY educ ORDER BY educ").fetchall()
    exact = {"sum": np.array([r[1] for r in rows], dtype=np.int64), "count_column": np.array([r[2] for r in rows], dtype=np.int64),
             "sum_squares": np.array([int(r[3]) for r in rows], dtype=object)}
    out: dict[str, Any] = {"rho": rho, "reps": reps, "groups": len(rows), "bounds": [lo, hi]}
    tmp = Path(tempfile.mkdtemp(prefix="dpgate-split-"))
    try:
        entry = write_policies(data, tmp / "policies", epsilon=4.0, delta=1e-6, clamp_counts=False)[0]
        with Gateway.open(Settings(policies=tmp / "policies", home=tmp / "home")) as gw:
            for name, sql in SPLIT_QUERIES.items():
                doc = gw.explain(entry["dataset"], sql, budget=QueryBudget(rho=rho))
                kinds = {pid: doc["noise_scale_units"][pid]["kind"] for pid in doc["noise_scales"]}
                pairs = {pid: (v["l1"], v["l2"]) for pid, v in doc["sensitivity"].items()}
                cals = {"dpgate": mechanisms.calibrate(pairs, scales=doc["noise_scales"]),
                        "equal_split": mechanisms.calibrate(pairs, rho=rho)}
                res: dict[str, Any] = {"split": {pid: {"kind": kinds[pid], "rho": r["rho"]}
                                                 for pid, r in doc["primitive_split"]["primitives"].items()}}
                for label, cal in cals.items():
                    vals = {pid: np.tile(exact[kinds[pid]], reps) for pid in kinds}
                    noisy = {pid: v.astype(float) for pid, v in mechanisms.sample(cal, vals).items()}
                    ex = {pid: v.astype(float) for pid, v in vals.items()}
                    res[label] = {"rmse": _ratio_rmse(name, noisy, ex, kinds, lo, hi), "rho": cal.rho}
                res["rmse_ratio"] = res["dpgate"]["rmse"] / res["equal_split"]["rmse"]
                out[name] = res
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _ratio_rmse(name: str, noisy: dict, exact: dict, kinds: dict, lo: float, hi: float) -> float:
    """RMSE of the noisy AVG/STDDEV (clamped to its range, as the release does) against the exact one."""
    import numpy as np

    by = {kinds[p]: p for p in kinds}

    def value(v: dict) -> Any:
        n = np.maximum(v[by["count_column"]], 1.0)
        mean = np.clip(v[by["sum"]] / n, lo, hi)
        if name == "avg":
            return mean
        var = np.clip(v[by["sum_squares"]] / n - mean ** 2, 0.0, (hi - lo) ** 2 / 4)
        return np.sqrt(var)

    return float(np.sqrt(np.mean((value(noisy) - value(exact)) ** 2)))


def gdp_rho_per_release(mu_cap: float, weeks: int) -> float:
    """The largest ρ (to 1e-12) whose discrete Gaussian μ, at the smallest σ = 1/√(2ρ) a release of
    sensitivity ≥ 1 can have, is at most μ_cap/√weeks (times 1 − 1e-9 against rounding)."""
    target = mu_cap / math.sqrt(weeks) * (1 - 1e-9)
    lo, hi = 0.0, target * target / 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if accounting.discrete_gaussian_unit_mu(1.0 / math.sqrt(2 * mid)) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def measure_pipelinedp(data: Path, *, trials: int, install: bool, weeks: int = 52) -> dict[str, Any]:
    """PipelineDP's RMSE over ``trials`` runs of the same experiment (its own venv), or ``{"error": …}``."""
    from bench.peers import dataset_spec, run_peer, utility_spec

    spec = utility_spec(data, weeks=weeks, run_weeks=weeks)
    datasets = dataset_spec(data, queries=())
    sq, n, out = 0.0, 0, None
    for _ in range(trials):
        out = run_peer("pipelinedp", datasets, runs=1, utility=spec, install=install)
        u = out.get("utility")
        if not u:
            return {"variant": "pipelinedp", "error": out.get("error") or (out.get("errors") or {}).get("utility")
                    or "no utility result"}
        sq += u["rmse"] ** 2 * u["cells"]
        n += u["cells"]
    return {"variant": "pipelinedp", "version": out.get("version"), "rmse": math.sqrt(sq / n), "cells": n,
            "trials": trials, "releases": weeks, "noise_sigma": out["utility"].get("noise_sigma"),
            "accountant": out["utility"].get("accountant")}


def run(data: Path | None, *, trials: int = 1, peers: bool = True, install: bool = True,
        split: bool = False) -> dict[str, Any]:
    """Every variant in one run (see the module docstring); skipped with the reason without PUMS.
    ``split``: only the AVG/STDDEV split comparison (:func:`measure_split`)."""
    folder, why = ensure_pums(data)
    if folder is None:
        return {"skipped": why}
    if split:
        return {"data": str(folder), "split": {str(r): measure_split(folder, rho=r) for r in (0.001, 0.01, 0.1)}}
    from bench.peers import utility_spec

    true = utility_spec(folder)["true"]
    out: dict[str, Any] = {"data": str(folder), "epsilon": 4.0, "delta": 1e-6, "trials": trials, "results": {}}
    for v in VARIANTS:
        out["results"][v] = measure(folder, true=true, variant=v, trials=trials)
        _say(v, out["results"][v])
    if peers:
        out["results"]["pipelinedp"] = measure_pipelinedp(folder, trials=trials, install=install)
        _say("pipelinedp", out["results"]["pipelinedp"])
    return out


def _say(name: str, result: dict[str, Any]) -> None:
    """One line per finished variant on stderr (a long run's figures survive an interruption)."""
    print(f"[utility] {name}: {json.dumps(result)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point: print the results as JSON."""
    ap = argparse.ArgumentParser(prog="python -m bench.utility", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, help="a PUMS folder written by bench.datagen "
                    "(default: bench/.data/pums_120k, made on first use)")
    ap.add_argument("--trials", type=int, default=1, help="independent runs of the 52 releases per tool")
    ap.add_argument("--no-peers", action="store_true", help="dpgate only")
    ap.add_argument("--no-install", action="store_true", help="use PipelineDP only if already installed")
    ap.add_argument("--split", action="store_true", help="only AVG/STDDEV(income): the gateway's budget split "
                    "vs the equal split (issue 22 item 5)")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.data, trials=args.trials, peers=not args.no_peers, install=not args.no_install,
                         split=args.split), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
