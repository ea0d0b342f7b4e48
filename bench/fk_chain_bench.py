"""A three-table foreign-key chain (lineitem → orders → customer) vs the same query in plain DuckDB
(issue 21, "Done means": the bounded query over a table whose privacy unit is a foreign-key path).

``lineitem`` has no customer column: its unit is ``l_orderkey -> orders.o_orderkey -> o_custkey``
(``tests/fixtures/policies/corpus/tpch_fk.toml``, k = m = 225). The gateway's bounded query joins
along the path to attach the unit, then bounds; the baseline is the analyst's plain DuckDB query
with the same joins and aggregates and no bounding. Both run on the same in-memory DuckDB tables
(the engine's own connection), interleaved, median of ``--runs``; the ratio is what matters (this
machine is shared)::

    python bench/fk_chain_bench.py --sf 1.7 --runs 5      # ~10M lineitems
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator
from dpgate.engines.base import EngineOptions  # noqa: E402
from dpgate.engines.duckdb import DuckDBEngine  # noqa: E402
from dpgate.policy import load_policy  # noqa: E402
from dpgate.sql.bound import bounded_query  # noqa: E402
from dpgate.sql.parse import parse_query  # noqa: E402
from dpgate.sql.sources import plan_policy  # noqa: E402
from dpgate.tpch_generate import generate_tpch  # noqa: E402

#: (name, the analyst's query over the path table, the same query in plain DuckDB with the path's joins)
QUERIES = [
    ("count", "SELECT COUNT(*) AS n FROM lineitem",
     "SELECT COUNT(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey"),
    ("flag_sum", "SELECT l_returnflag, COUNT(*) AS n, SUM(l_quantity) AS q FROM lineitem GROUP BY l_returnflag",
     "SELECT l_returnflag, COUNT(*), SUM(l_quantity) FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
     "GROUP BY l_returnflag"),
    ("nation_revenue", "SELECT c_nationkey, SUM(l_extendedprice) AS revenue FROM lineitem JOIN orders ON "
     "l_orderkey = o_orderkey JOIN customer ON o_custkey = c_custkey GROUP BY c_nationkey",
     "SELECT c_nationkey, SUM(l_extendedprice) FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
     "JOIN customer ON o_custkey = c_custkey GROUP BY c_nationkey"),
]


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sf", type=float, default=1.7, help="TPC-H scale factor (6M lineitems per 1.0)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default=None, help="run only this query (count, flag_sum, nation_revenue)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "tpch"
        t0 = time.perf_counter()
        generate_tpch(data, args.sf, denormalised=False)
        text = (ROOT / "tests/fixtures/policies/corpus/tpch_fk.toml").read_text().replace("{tpch}", str(data))
        (Path(tmp) / "tpch_fk.toml").write_text(text)
        engine = DuckDBEngine(load_policy(Path(tmp) / "tpch_fk.toml"), EngineOptions(timeout_s=600.0))
        engine.load()
        con = engine._con  # the engine's own in-memory tables, for the plain baseline
        con.execute('SET schema = "tpch_fk"')  # the engine's tables live in the dataset's schema
        rows = con.execute("SELECT COUNT(*) FROM lineitem").fetchone()[0]
        print(f"TPC-H SF {args.sf}: {rows:,} lineitems (generated and loaded in {time.perf_counter() - t0:.1f} s)")
        print(f"{'query':16} {'bounded (s)':>12} {'plain (s)':>10} {'ratio':>7}")
        for name, sql, plain in QUERIES:
            if args.only and name != args.only:
                continue
            plan = parse_query(sql, engine.policy)
            tree = bounded_query(plan, plan_policy(plan, engine.policy), salt=12345)
            engine.execute(tree)  # warm-up (and the rendering's first use)
            con.execute(plain).fetchall()
            bounded, raw = [], []
            for _ in range(args.runs):  # interleaved
                bounded.append(_time(lambda: engine.execute(tree)))
                raw.append(_time(lambda: con.execute(plain).fetchall()))
            b, r = statistics.median(bounded), statistics.median(raw)
            print(f"{name:16} {b:12.3f} {r:10.3f} {b / r:6.1f}×")
        engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
