"""Benchmark of DP quantiles: the bounded histogram + OpenDP selection vs DuckDB's exact MEDIAN.

    python bench/quantile_bench.py --rows 1000000 --units 100000 --keys 1
    python bench/quantile_bench.py --rows 10000000 --units 1000000 --keys 50

Generates ``"bench"."events"(user_id, key, x)`` in memory (unit and key by hashing the row
number, x = a normal(500, 100)-shaped value from a sum of hashed uniforms, clamped to
[0, 1000], resolution 0.1 → 10,000 candidates) and times, interleaved, median of ``--runs``:

* ``exact``: ``SELECT key, MEDIAN(x) FROM events GROUP BY key`` in DuckDB (no bounding);
* ``dp``: what the gateway runs for ``SELECT key, MEDIAN(x) FROM events GROUP BY key``:
  the bounded histogram SQL (clamp, grid, ≤ m values per unit and group, ≤ k groups per
  unit, counts per (group, candidate)), fetched into NumPy, scored, and one OpenDP
  noisy-max selection per group (ρ = 0.1 for the query);
* ``before``: the same with the histogram statement as rendered before issue 25 item 3
  (:func:`bench.previous_plans.previous_histogram_sql`); the benchmark checks that both
  statements return the same histogram.

Prints the medians, the ratios to the exact MEDIAN and the largest |DP median − exact median|
over the groups next to the stated 95 % rank error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import sqlglot

from dpgate.engines.base import TableInfo
from dpgate.engines.hashing import group_hash
from dpgate.mechanisms import calibrate
from dpgate.policy import parse_policy
from dpgate.quantile_release import calibrate_plan, run
from dpgate.sql.parse import parse_query
from dpgate.sql.quantile import histogram_query
import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)

if not __package__:  # run as a script (python bench/quantile_bench.py): the repository root for bench.*
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.previous_plans import previous_histogram_sql  # noqa: E402


def _policy(keys: int, k: int, m: int):
    raw = {
        "dataset": {"name": "bench", "population": "bench"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"events": {
            "source": "bench.parquet", "privacy_unit": "user_id",
            "max_groups_per_unit": k, "max_rows_per_unit": m,
            "columns": {"key": {"type": "int", "public_keys": f"range(0, {keys})"},
                        "x": {"type": "float", "lower": 0, "upper": 1000, "resolution": 0.1}}}},
    }
    return parse_policy(raw, Path("bench/policies/bench.toml"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--m", type=int, default=10)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rho", type=float, default=0.1)
    args = ap.parse_args()

    con = duckdb.connect()
    con.execute("CREATE SCHEMA bench")
    con.execute(f"""
        CREATE TABLE bench.events AS
        SELECT hash(i, 1) % {args.units} AS user_id, hash(i, 2) % {args.keys} AS key,
               LEAST(GREATEST(500 + 100 * ((hash(i, 3) % 1000000) / 1e6 + (hash(i, 4) % 1000000) / 1e6
                     + (hash(i, 5) % 1000000) / 1e6 - 1.5) * 2, 0), 1000) AS x
        FROM range({args.rows}) t(i)""")
    policy = _policy(args.keys, args.k, args.m)
    grouped = args.keys > 1
    sql = ("SELECT key, MEDIAN(x) FROM events GROUP BY key" if grouped else "SELECT MEDIAN(x) FROM events")
    plan = parse_query(sql, policy)
    cal = calibrate_plan(plan, policy, "gaussian", {"rho": args.rho}, {}, calibrate)
    q = next(iter(cal.quantiles.values()))
    exact_sql = ("SELECT key, MEDIAN(x) AS m FROM bench.events GROUP BY key ORDER BY key" if grouped
                 else "SELECT MEDIAN(x) AS m FROM bench.events")

    tables = {"events": TableInfo("events", "memory", unit_unique=False, unit_integer=True)}

    def execute(tree):  # what DuckDBEngine.render does: the portable group-choosing hash, then text
        text = group_hash(tree.copy(), policy, tables, "duckdb").sql(dialect="duckdb")
        return {k: np.asarray(v) for k, v in con.execute(text).fetchnumpy().items()}

    previous = {"x": sqlglot.parse_one(previous_histogram_sql(plan, policy, "x", salt=12345), read="duckdb")}
    same = execute(previous["x"]), execute(histogram_query(plan, policy, "x", salt=12345))
    assert all(np.array_equal(same[0][c], same[1][c]) for c in same[1]), "the two plans' histograms differ"
    t_exact, t_dp, t_before = [], [], []
    released = exact = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        exact = con.execute(exact_sql).fetchall()
        t_exact.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        run(plan, policy, cal, execute, salt=12345, statements=previous)
        t_before.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _, noisy = run(plan, policy, cal, execute, salt=12345)
        t_dp.append(time.perf_counter() - t0)
        released = q.grid.value(noisy[q.primitive])
        print(f"  round: exact {t_exact[-1]:.3f} s, before {t_before[-1]:.3f} s, now {t_dp[-1]:.3f} s", flush=True)
    e, d, before = statistics.median(t_exact), statistics.median(t_dp), statistics.median(t_before)
    exact_values = np.array([row[-1] for row in exact], dtype=float)
    err = float(np.max(np.abs(released - exact_values)))
    print(f"rows={args.rows} units={args.units} groups={args.keys} k={args.k} m={args.m} "
          f"candidates={q.grid.size} rho={args.rho}")
    print(f"exact MEDIAN (DuckDB): {e:.3f} s   DP median (bounded histogram + OpenDP): {d:.3f} s   "
          f"ratio {d / e:.2f}x   before issue 25 item 3: {before:.3f} s, ratio {before / e:.2f}x")
    print(f"largest |DP - exact| over groups: {err:.2f} (column units); stated rank error "
          f"±{q.rank_error95:.0f} ranks per group")


if __name__ == "__main__":
    main()
