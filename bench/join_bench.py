"""Benchmark of a join on the privacy unit: the bounded COUNT + SUM after the join vs the raw join.

    python bench/join_bench.py --facts 10000000 --units 1000000

Generates ``"bench"."events"(user_id, x)`` (``--facts`` rows, unit by hashing the row number,
x in [0, 1000)) and ``"bench"."users"(user_id, tier)`` (one row per unit, 10 tiers) in an
in-memory DuckDB, then times, interleaved, median of ``--runs``:

* ``raw``: ``SELECT u.tier, COUNT(*), SUM(e.x) FROM events e JOIN users u USING (user_id)
  GROUP BY u.tier`` (no bounding);
* ``bounded (text units)``: the gateway's bounded SQL for the same query (the join as the joined
  table's relation, then k groups and m rows per unit, clamped fixed-point sums, public keys) as
  DuckDBEngine rendered it before issue 25 item 5: the group hash made portable, the two units
  (undeclared in the policy) compared as ``CAST(… AS VARCHAR)``;
* ``bounded``: what DuckDBEngine renders now: the same, with the two integer-stored units compared
  as integers (:mod:`dpgate.engines.unit_joins`; the same joined rows).

Both bounded forms return the same rows (checked on every run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import duckdb

from dpgate.policy import parse_policy
from dpgate.engines.base import TableInfo
from dpgate.engines.hashing import group_hash
from dpgate.engines.unit_joins import integer_unit_joins
from dpgate.sql.bound import bounded_query
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query
import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)


def _policy(k: int, m: int):
    raw = {
        "dataset": {"name": "bench", "population": "bench"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {
            "events": {"source": "events.parquet", "privacy_unit": "user_id", "max_groups_per_unit": k,
                       "max_rows_per_unit": m,
                       "columns": {"x": {"type": "float", "lower": 0, "upper": 1000, "resolution": 0.01}}},
            "users": {"source": "users.parquet", "privacy_unit": "user_id", "max_groups_per_unit": 1,
                      "max_rows_per_unit": 1,
                      "columns": {"tier": {"type": "int", "public_keys": "range(0, 10)"}}},
        },
    }
    return parse_policy(raw, Path("bench/policies/bench.toml"))


def _time(con: duckdb.DuckDBPyConnection, sql: str) -> float:
    t0 = time.perf_counter()
    con.execute(f"CREATE OR REPLACE TEMP TABLE bench_out AS {sql}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--facts", type=int, default=10_000_000)
    ap.add_argument("--units", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--m", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    con = duckdb.connect()
    con.execute("CREATE SCHEMA bench")
    con.execute(f"CREATE TABLE bench.events AS SELECT hash(i, 1) % {args.units} AS user_id, "
                f"(hash(i, 2) % 100000) / 100.0 AS x FROM range({args.facts}) t(i)")
    con.execute(f"CREATE TABLE bench.users AS SELECT i AS user_id, i % 10 AS tier FROM range({args.units}) t(i)")
    policy = _policy(args.k, args.m)
    sql = "SELECT u.tier, COUNT(*), SUM(e.x) FROM events e JOIN users u USING (user_id) GROUP BY u.tier"
    plan = parse_query(sql, policy)
    tree = bounded_query(plan, plan_policy(plan, policy), salt=12345)
    tables = {n: TableInfo(n, "memory", unit_unique=(n == "users"), unit_integer=True) for n in ("events", "users")}
    text_units = group_hash(tree.copy(), policy, tables, "duckdb").sql(dialect="duckdb")  # DuckDBEngine.render before
    bounded = group_hash(integer_unit_joins(tree.copy(), policy, tables), policy, tables, "duckdb").sql(dialect="duckdb")
    raw = ("SELECT u.tier, COUNT(*), SUM(e.x) FROM bench.events e JOIN bench.users u USING (user_id) "
           "GROUP BY u.tier")
    t_raw, t_text, t_bounded = [], [], []
    for _ in range(args.runs):
        t_raw.append(_time(con, raw))
        t_text.append(_time(con, text_units))
        before = con.execute("SELECT * FROM bench_out").fetchall()
        t_bounded.append(_time(con, bounded))
        assert con.execute("SELECT * FROM bench_out").fetchall() == before, "the two renderings differ"
    r, t, b = statistics.median(t_raw), statistics.median(t_text), statistics.median(t_bounded)
    print(f"facts={args.facts} units={args.units} k={args.k} m={args.m}")
    print(f"raw join + GROUP BY: {r:.3f} s   bounded, text units (before): {t:.3f} s ({t / r:.2f}x)   "
          f"bounded, integer units (now): {b:.3f} s ({b / r:.2f}x)")


if __name__ == "__main__":
    main()
