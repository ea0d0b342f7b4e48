"""Benchmark of DP COUNT(DISTINCT x): the bounded statement vs DuckDB's exact COUNT(DISTINCT).

    python -m bench.distinct_bench --rows 10000000 --units 1000000 --keys 1
    python -m bench.distinct_bench --rows 10000000 --units 1000000 --keys 50

Generates ``"bench"."events"(user_id, key, x)`` in memory (unit, key and x by hashing the row
number: ~rows/units rows per unit, x an integer among ``--values`` distinct values) and times,
interleaved, median of ``--runs`` (each round in the same order):

* ``exact``: ``SELECT [key,] COUNT(DISTINCT x) FROM events [GROUP BY key]`` in DuckDB;
* ``before``: the bounded statement as rendered before issue 25 item 4 (every (unit, group)
  pair's values ranked by the m-value window, then joined to the k-chosen pairs:
  :func:`bench.previous_plans.previous_distinct_ctes`);
* ``now``: the bounded statement the gateway runs today (:func:`dpgate.sql.bound.bounded_query`:
  one pass, the window only where a kept pair has more than m values).

Both bounded statements are rendered as ``DuckDBEngine.render`` does (the portable group hash,
integer units) and fetched; the benchmark checks that they return the same vector. Noise (one
OpenDP draw per group) is left out: it is the same for both and < 1 ms here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb
import sqlglot

import dpgate.sql.bound as bound_text
from dpgate.engines.base import TableInfo
from dpgate.engines.hashing import group_hash
from dpgate.policy import parse_policy
from dpgate.sql.bound import bounded_query, bounded_sql
from dpgate.sql.parse import parse_query
import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)

from bench.previous_plans import previous_distinct_ctes


def _policy(keys: int, k: int, m: int, values: int):
    raw = {
        "dataset": {"name": "bench", "population": "bench"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"events": {
            "source": "bench.parquet", "privacy_unit": "user_id",
            "max_groups_per_unit": k, "max_rows_per_unit": m,
            "columns": {"key": {"type": "int", "public_keys": f"range(0, {keys})"},
                        "x": {"type": "int", "lower": 0, "upper": values - 1}}}},
    }
    return parse_policy(raw, Path("bench/policies/bench.toml"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--units", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=1, help="1: ungrouped COUNT(DISTINCT x); more: GROUP BY key")
    ap.add_argument("--values", type=int, default=100_000, help="distinct values of x")
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--m", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    con = duckdb.connect()
    con.execute("CREATE SCHEMA bench")
    con.execute(f"""
        CREATE TABLE bench.events AS
        SELECT hash(i, 1) % {args.units} AS user_id, hash(i, 2) % {args.keys} AS key,
               hash(i, 3) % {args.values} AS x
        FROM range({args.rows}) t(i)""")
    policy = _policy(args.keys, args.k, args.m, args.values)
    grouped = args.keys > 1
    sql = "SELECT key, COUNT(DISTINCT x) FROM events GROUP BY key" if grouped else "SELECT COUNT(DISTINCT x) FROM events"
    exact_sql = ("SELECT key, COUNT(DISTINCT x) FROM bench.events GROUP BY key ORDER BY key" if grouped
                 else "SELECT COUNT(DISTINCT x) FROM bench.events")
    plan = parse_query(sql, policy)
    tables = {"events": TableInfo("events", "memory", unit_unique=False, unit_integer=True)}

    def text(tree) -> str:  # what DuckDBEngine.render does: the portable group-choosing hash, then text
        return group_hash(tree, policy, tables, "duckdb").sql(dialect="duckdb")

    now = text(bounded_query(plan, policy, salt=12345))
    saved = bound_text._distinct_ctes
    bound_text._distinct_ctes = previous_distinct_ctes
    try:
        before = text(sqlglot.parse_one(bounded_sql(plan, policy, salt=12345), read="duckdb"))
    finally:
        bound_text._distinct_ctes = saved
    assert con.execute(before).fetchall() == con.execute(now).fetchall(), "the two plans' vectors differ"

    times: dict[str, list[float]] = {"exact": [], "before": [], "now": []}
    for _ in range(args.runs):
        for name, statement in (("exact", exact_sql), ("before", before), ("now", now)):
            t0 = time.perf_counter()
            con.execute(statement).fetchall()
            times[name].append(time.perf_counter() - t0)
        print("  round: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in times.items()), flush=True)
    e, b, n = (statistics.median(times[k]) for k in ("exact", "before", "now"))
    print(f"rows={args.rows} units={args.units} groups={args.keys} values={args.values} k={args.k} m={args.m}")
    print(f"exact COUNT(DISTINCT) (DuckDB): {e:.3f} s   bounded before: {b:.3f} s ({b / e:.2f}x)   "
          f"bounded now: {n:.3f} s ({n / e:.2f}x)   median of {args.runs}")


if __name__ == "__main__":
    main()
