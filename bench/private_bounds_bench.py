"""Utility of private bounds (issue 22 item 3): SUM/AVG(income) RMSE with a privately chosen clamp
vs the outer range vs the codebook's bounds, at the same total ρ (the estimate's share included).

    python bench/private_bounds_bench.py --trials 100 --rho 1.0
    python bench/private_bounds_bench.py --trials 100 --rho 1.0 --rows 100000 --quantile 0.99

Data: ``../shared/data/smartnoise/PUMS.csv`` (1,000 people, one row each; skipped with a message
when absent), or with ``--rows N`` a bootstrap of it to N people (:func:`bench.datagen.pums_chunks`).
Each trial runs, through the real gateway (a fresh data version per trial, so the estimate and
the releases are made afresh), ``SELECT SUM(income), AVG(income) FROM pums`` under three policies
of the same data, resolution 1:

* ``private``: ``income = { bounds = "private", outer = [0, 1e9] }`` — the first query spends
  ``private_bounds_share`` (0.1) of ρ on the estimate, the rest on the query;
* ``outer``: ``lower = 0, upper = 1e9`` at the whole ρ;
* ``codebook``: ``lower = 0, upper = 500000`` (the PUMS codebook's top code) at the whole ρ.

RMSE against the exact SUM and AVG of the raw incomes (so clamping bias counts).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from dpgate.pipeline.budget import QueryBudget  # noqa: E402
from dpgate.service import Gateway  # noqa: E402
from dpgate.settings import Settings  # noqa: E402

PUMS = ROOT.parent / "shared" / "data" / "smartnoise" / "PUMS.csv"
if not PUMS.is_file():
    PUMS = Path("/work/shared/data/smartnoise/PUMS.csv")

POLICY = """
[dataset]
name = "pums"
population = "people-{name}"
data_version = "t0"

[budget]
epsilon = 100000.0
delta = 1e-6
default_query_rho = 0.1
private_bounds_max_rank_error = {max_rank}

[tables.pums]
source = "{source}"

[tables.pums.columns]
income = {{ type = "float", resolution = 1, {income} }}
"""
INCOME = {"private": 'bounds = "private", outer = [0, 1000000000], quantile = {q}',
          "outer": "lower = 0, upper = 1000000000",
          "codebook": "lower = 0, upper = 500000"}


def _data(rows: int, folder: Path) -> tuple[Path, np.ndarray]:
    import pyarrow.csv as pacsv

    if rows <= 0:
        table = pacsv.read_csv(PUMS)
        path = PUMS
    else:
        import pyarrow as pa
        from bench.datagen import pums_chunks

        table = pa.concat_tables(list(pums_chunks(rows, seed=7)))
        path = folder / "pums.csv"
        pacsv.write_csv(table.select(["pid", "income"]), path)
    return path, np.asarray(table["income"].to_numpy(), dtype=float)


def _gateway(folder: Path, name: str, source: Path, q: float, max_rank: float) -> Gateway:
    pol = folder / name / "policies"
    pol.mkdir(parents=True)
    (pol / "pums.toml").write_text(POLICY.format(name=name, source=source.as_posix(), max_rank=max_rank,
                                                 income=INCOME[name].format(q=q)))
    return Gateway.open(Settings(policies=pol, home=folder / name / "home"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--rho", type=float, default=1.0, help="total ρ per query (the estimate's share included)")
    ap.add_argument("--rows", type=int, default=0, help="bootstrap PUMS to this many people (0: PUMS.csv as is)")
    ap.add_argument("--quantile", type=float, default=0.99)
    ap.add_argument("--max-rank-error", type=float, default=1000.0)
    args = ap.parse_args()
    if not PUMS.is_file():
        print(f"skipped: {PUMS} is absent")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source, income = _data(args.rows, folder)
        exact_sum, exact_avg = float(income.sum()), float(income.mean())
        print(f"n = {income.size:,} people, exact SUM = {exact_sum:,.0f}, AVG = {exact_avg:,.1f}, "
              f"q{args.quantile:g} = {np.quantile(income, args.quantile):,.0f}, max = {income.max():,.0f}; "
              f"total ρ = {args.rho:g} per query, {args.trials} trials")
        rows = {}
        for name in INCOME:
            gw = _gateway(folder, name, source, args.quantile, args.max_rank_error)
            errs_s, errs_a, uppers = [], [], []
            try:
                for t in range(args.trials):
                    gw.data_versions["pums"] = f"t{t}"  # fresh estimate and releases per trial
                    doc = gw.query("pums", "SELECT SUM(income) AS s, AVG(income) AS a FROM pums",
                                   consumer="default", budget=QueryBudget(rho=args.rho))
                    s, a = doc["rows"][0]
                    errs_s.append((s - exact_sum) ** 2)
                    errs_a.append((a - exact_avg) ** 2)
                    uppers.append(doc["bounds"]["columns"]["income"]["upper"])
                charged = sum(e["rho"] for e in gw.ledger_entries() if e.get("type") == "charge") / args.trials
            finally:
                gw.close()
            rows[name] = (math.sqrt(statistics.fmean(errs_s)), math.sqrt(statistics.fmean(errs_a)),
                          statistics.median(uppers), charged)
        print("| clamp | SUM RMSE | AVG RMSE | median upper | ρ charged per query |")
        print("|---|---|---|---|---|")
        for name, (rs, ra, up, ch) in rows.items():
            print(f"| {name} | {rs:,.0f} | {ra:,.1f} | {up:,.0f} | {ch:.6g} |")
        out, priv, book = rows["outer"], rows["private"], rows["codebook"]
        print(f"outer / private: SUM {out[0] / priv[0]:,.1f}×, AVG {out[1] / priv[1]:,.1f}×; "
              f"private / codebook: SUM {priv[0] / book[0]:.2f}×, AVG {priv[1] / book[1]:.2f}×")


if __name__ == "__main__":
    main()
