"""Benchmark of the bounding rewrite: bounded COUNT + SUM GROUP BY vs the plain per-unit
aggregation, on the same DuckDB connection.

    python bench/planner_bench.py --rows 10000000 --units 1000000 --keys 10

Generates a synthetic table ``"bench"."events"(user_id, key, x)`` in memory (unit and
key drawn by hashing the row number, x in [0, 1000)), then times, median of ``--runs``
runs each:

* ``plain``:   ``SELECT key, COUNT(*), SUM(x) FROM t GROUP BY user_id, key`` (the
  per-unit partial aggregation any bounding needs, without clipping or key handling);
* ``bounded``: the bounded SQL of ``SELECT key, COUNT(*), SUM(x) FROM events GROUP BY key``
  (k groups per unit chosen with the salted hash, clipping, fixed-point sums, public
  keys joined) — what the gateway runs before adding noise.

Runs are interleaved (plain, bounded, plain, …). Prints both medians and their ratio
(goal: within 3×). Results are materialised with
``CREATE OR REPLACE TEMP TABLE … AS`` so that fetching rows into Python is not timed.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import time
from pathlib import Path

import duckdb

from dpgate.policy import parse_policy
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)


def _policy(keys: int, k: int, m: int):
    raw = {
        "dataset": {"name": "bench", "population": "bench"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {
            "events": {
                "source": "bench.parquet",
                "privacy_unit": "user_id",
                "max_groups_per_unit": k,
                "max_rows_per_unit": m,
                "columns": {
                    "key": {"type": "int", "public_keys": f"range(0, {keys})"},
                    "x": {"type": "float", "lower": 0, "upper": 1000, "resolution": 0.01},
                },
            }
        },
    }
    return parse_policy(raw, Path("bench/policies/bench.toml"))


def _time(con: duckdb.DuckDBPyConnection, sql: str) -> float:
    t0 = time.perf_counter()
    con.execute(f"CREATE OR REPLACE TEMP TABLE bench_out AS {sql}")
    return time.perf_counter() - t0


def main(argv=None) -> int:
    """Run the benchmark; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=10)
    ap.add_argument("--k", type=int, default=3, help="max_groups_per_unit (default 3)")
    ap.add_argument("--m", type=int, default=5, help="max_rows_per_unit (default 5)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    con = duckdb.connect()
    if args.threads:
        con.execute(f"SET threads = {args.threads}")
    con.execute("CREATE SCHEMA bench")
    t0 = time.perf_counter()
    con.execute(
        f"""CREATE TABLE bench.events AS
        SELECT CAST(hash(i, 1) % {args.units} AS BIGINT) AS user_id,
               CAST(hash(i, 2) % {args.keys} AS BIGINT) AS key,
               CAST(hash(i, 3) % 100000 AS DOUBLE) / 100.0 AS x
        FROM range({args.rows}) AS r(i)"""
    )
    print(f"generated {args.rows:,} rows, {args.units:,} units, {args.keys} keys "
          f"in {time.perf_counter() - t0:.1f} s; k={args.k}, m={args.m}, runs={args.runs}")

    policy = _policy(args.keys, args.k, args.m)
    plan = parse_query("SELECT key, COUNT(*), SUM(x) FROM events GROUP BY key", policy)
    bounded = bounded_sql(plan, policy, salt=secrets.randbits(63))
    plain = "SELECT key, COUNT(*), SUM(x) FROM bench.events GROUP BY user_id, key"

    _time(con, plain)  # warm-up
    plain_t, bounded_t = [], []
    for _ in range(args.runs):  # interleaved, so that background load hits both alike
        plain_t.append(_time(con, plain))
        bounded_t.append(_time(con, bounded))
    p, b = statistics.median(plain_t), statistics.median(bounded_t)
    print(f"plain per-unit aggregation  median {p:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in plain_t)})")
    print(f"bounded COUNT + SUM         median {b:.3f} s  (runs: {', '.join(f'{t:.3f}' for t in bounded_t)})")
    print(f"ratio bounded / plain       {b / p:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
