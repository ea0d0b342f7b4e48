"""Benchmark of post-processing: the expression evaluator and the released table.

    python bench/postprocess_bench.py [--rows 1000 100000] [--runs 7]

For each size (released rows = groups), times (median of ``--runs``):

* ``evaluate``: select-list expressions over released cells (``COUNT * 5``, a ratio
  ``SUM / COUNT``, ``ROUND(POWER(AVG, 2), 1)``, a CASE with a text result, key
  concatenation) with :func:`dpgate.postprocess.evaluate`;
* ``accuracy``: :func:`dpgate.postprocess.propagate_accuracy` of the same expressions;
* ``having+order``: a HAVING predicate and a two-key ORDER BY (:func:`evaluate_predicate`,
  :func:`order_by`);
* ``to_list``: the JSON-ready conversion of one float column.

The inputs are synthetic noisy values (NumPy's seeded generator: benchmark data, not noise).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import sqlglot

from dpgate.postprocess import (
    CellNoise,
    PrimitiveNoise,
    Vector,
    evaluate,
    evaluate_predicate,
    order_by,
    propagate_accuracy,
)

EXPRESSIONS = ["n * 5", "s / n", "ROUND(POWER(a, 2), 1)", "CASE WHEN n > 500 THEN 'big' ELSE 'small' END",
               "k || '-' || CAST(w AS VARCHAR)"]


def _cells(rows: int):
    rng = np.random.default_rng(7)
    n = rng.integers(-5, 1000, rows)
    cells = {
        "n": Vector.of(np.maximum(n, 0)),
        "s": Vector.of(rng.normal(5e4, 1e4, rows)),
        "a": Vector.of(rng.uniform(0, 100, rows)),
        "k": Vector.of(np.array(["eu", "us", "apac", "latam", "africa"] * (rows // 5 + 1), dtype=object)[:rows]),
        "w": Vector.of(np.arange(rows) % 52),
    }
    noise = {"n": CellNoise.of_primitive("p0", clamped=n < 0), "s": CellNoise.of_primitive("p1"),
             "a": CellNoise.of_interval(cells["a"].values - 3, cells["a"].values + 3, ["p1", "p0"])}
    prims = {"p0": PrimitiveNoise("discrete_gaussian", 2.0, 4.0), "p1": PrimitiveNoise("discrete_gaussian", 50.0, 98.0)}
    return cells, noise, prims


def _median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> int:
    """Print the medians per size (ms)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1000, 100_000])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    trees = [sqlglot.parse_one(e, read="duckdb") for e in EXPRESSIONS]
    having = sqlglot.parse_one("n > 10 AND s / n > 40 OR k = 'eu'", read="duckdb")
    order = sqlglot.parse_one("SELECT 1 ORDER BY k, s / n DESC", read="duckdb").args["order"].expressions
    print(f"{'rows':>8} {'evaluate':>10} {'accuracy':>10} {'having+order':>13} {'to_list':>9}  (median ms)")
    for rows in args.rows:
        cells, noise, prims = _cells(rows)
        ev = _median_ms(lambda: [evaluate(t, cells) for t in trees], args.runs)
        acc = _median_ms(lambda: [propagate_accuracy(t, cells, noise, prims) for t in trees], args.runs)
        ho = _median_ms(lambda: order_by(order, cells, order=np.flatnonzero(evaluate_predicate(having, cells))),
                        args.runs)
        tl = _median_ms(lambda: cells["s"].to_list(), args.runs)
        print(f"{rows:>8} {ev:>10.2f} {acc:>10.2f} {ho:>13.2f} {tl:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
