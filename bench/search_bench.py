"""Selections and search records (issue 15): latency per step, in one run.

Usage::

    python bench/search_bench.py [--ledger-sizes 1000,5000] [--queries 30]

For each ledger size (background charges already in the population's ledger, SQLite): the time
to record one search charge step (``POST /v1/ledger/charges`` with ``search_id``: the charge,
then the accountant's state recomputed from the ledger), and to read the record back with its
replay (``GET /v1/searches/{id}``, 10 steps). Then, on the synthetic evaluation table (200 users
× 5 candidates), the latency of a fresh selection query against the equivalent grouped SUM
released with Gaussian noise (the ratio is what to read). Not a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ledger-sizes", default="1000,5000")
    ap.add_argument("--queries", type=int, default=30)
    args = ap.parse_args(argv)
    from dpgate import accounting
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings
    from tests._eval_project import write_eval_project

    spec = {"purpose": "bench", "candidates": [{"name": "a"}], "selection": "private",
            "training": {"name": "t", "population": "eval-users"}, "validation": {"name": "v", "population": "eval-users"}}
    print("| ledger charges | record one search step (ms, median of 10) | read + replay a 10-step record (ms) |")
    print("|---|---|---|")
    for size in (int(s) for s in args.ledger_sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            settings = Settings(policies=write_eval_project(root, epsilon=1e6), home=root / "home",
                                ledger_url=f"sqlite:///{root / 'ledger.sqlite'}?synchronous=normal")
            with Gateway.open(settings) as gw:
                for _ in range(size):
                    gw.ledger.charge("eval-users", "analysts", accounting.Cost.zcdp(1e-6), purpose="background")
                sid = gw.create_search(spec, consumer="training", actor="bench")["search_id"]
                steps = []
                for _ in range(10):
                    t = time.perf_counter()
                    gw.charge_external("eval-users", "training", rho=1e-3, kind="zcdp", purpose="run", actor="bench",
                                       search_id=sid, candidate="a")
                    steps.append(time.perf_counter() - t)
                t = time.perf_counter()
                assert gw.search(sid)["replay"]["ok"]
                read = time.perf_counter() - t
        print(f"| {size:,} | {1e3 * statistics.median(steps):.0f} | {1e3 * read:.0f} |")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with Gateway.open(Settings(policies=write_eval_project(root, epsilon=1e6), home=root / "home")) as gw:
            sel, gauss = [], []
            for i in range(args.queries):
                t = time.perf_counter()
                gw.query("evals", "SELECT candidate FROM eval GROUP BY candidate ORDER BY SUM(correct) DESC LIMIT 1",
                         consumer="analysts", budget=QueryBudget(epsilon=1.0 + i * 1e-9))
                sel.append(time.perf_counter() - t)
                t = time.perf_counter()
                gw.query("evals", "SELECT candidate, SUM(correct) FROM eval GROUP BY candidate",
                         consumer="analysts", budget=QueryBudget(rho=0.1 + i * 1e-9))
                gauss.append(time.perf_counter() - t)
    s, g = statistics.median(sel), statistics.median(gauss)
    print()
    print("| fresh query (median of %d) | ms |" % args.queries)
    print("|---|---|")
    print(f"| selection (exponential mechanism, top-1 of 5) | {1e3 * s:.1f} |")
    print(f"| grouped SUM, discrete Gaussian | {1e3 * g:.1f} |")
    print(f"| ratio selection / Gaussian | {s / g:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
