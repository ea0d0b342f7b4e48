"""Private partition selection (issue 11) vs the same GROUP BY over public keys, in one run.

    python -m bench.partition_bench --rows 10000000 --units 1000000 --keys 100000 --runs 3

One synthetic Parquet table ``events(unit, key, x)`` is written by DuckDB (deterministic: keys
from ``hash(row)``, skewed so that a few keys are common and most are rare), then two gateways
load it: one whose policy declares ``key`` with ``public_keys = "range(0, keys)"`` (every key
released, noisy zeros included), one without public keys (keys selected by OpenDP's Gaussian
threshold mechanism). Each runs ``SELECT key, COUNT(*) AS n, SUM(x) AS s FROM events GROUP BY
key`` end to end through :meth:`dpgate.service.Gateway.query` (plan, charge, bounded SQL in
DuckDB, noise, release), ``--runs`` times with a fresh budget each time (no cache hit); the
medians and their ratio are printed as one JSON line, with the number of keys released.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

POLICY = """
[dataset]
name = "{name}"
population = "{name}-people"
data_version = "bench"

[budget]
epsilon = 1e6
delta = 1e-6
default_query_rho = 0.1

[tables.events]
source = "{source}"
privacy_unit = "unit"
max_groups_per_unit = {k}
max_rows_per_unit = {m}

[tables.events.columns]
key = {{ type = "int"{keys} }}
x = {{ type = "float", lower = 0, upper = 100, resolution = 0.01 }}
"""

SQL = "SELECT key, COUNT(*) AS n, SUM(x) AS s FROM events GROUP BY key"


def generate(path: Path, rows: int, units: int, keys: int) -> None:
    """Write the table with DuckDB (no randomness: keys and values are hashes of the row number)."""
    import duckdb

    con = duckdb.connect()
    # u ∈ [0, 1): key = floor(keys · u³) — a skewed key distribution (many rare keys)
    con.execute(f"""
        COPY (
          SELECT i % {units} AS unit,
                 CAST(floor({keys} * pow((hash(i) % 1000003) / 1000003.0, 3)) AS BIGINT) AS key,
                 ((hash(i * 7 + 1) % 10000) / 100.0) AS x
          FROM range({rows}) t(i)
        ) TO '{path}' (FORMAT PARQUET)
    """)
    con.close()


def run(args: argparse.Namespace) -> dict:
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    root = Path(args.dir or tempfile.mkdtemp(prefix="dpgate-partition-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"events_{args.rows}_{args.units}_{args.keys}.parquet"
    if not data.exists():
        t0 = time.perf_counter()
        generate(data, args.rows, args.units, args.keys)
        print(f"# generated {data} in {time.perf_counter() - t0:.1f} s", flush=True)
    out: dict = {"rows": args.rows, "units": args.units, "candidate_keys": args.keys, "k": args.k, "m": args.m,
                 "runs": args.runs}
    for name, keys in (("public", f', public_keys = "range(0, {args.keys})"'), ("selected", "")):
        folder = root / f"policies_{name}"
        folder.mkdir(exist_ok=True)
        (folder / "bench.toml").write_text(POLICY.format(name=name, source=data, k=args.k, m=args.m, keys=keys))
        settings = Settings(policies=folder, home=root / f"home_{name}_{time.time_ns()}", query_timeout_s=args.timeout)
        with Gateway.open(settings) as gw:
            times, released = [], None
            for i in range(args.runs):
                t0 = time.perf_counter()
                r = gw.query(name, SQL, consumer="default", budget=QueryBudget(rho=0.01 + 1e-6 * i))
                times.append(time.perf_counter() - t0)
                released = len(r["rows"])
            out[name] = {"median_s": statistics.median(times), "times_s": times, "keys_released": released}
            if name == "selected":
                out[name]["threshold"] = r["partition_selection"]["threshold"]
                out[name]["delta"] = r["partition_selection"]["delta"]
    out["ratio_selected_over_public"] = out["selected"]["median_s"] / out["public"]["median_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--units", type=int, default=1_000_000)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--k", type=int, default=3, help="max_groups_per_unit")
    p.add_argument("--m", type=int, default=5, help="max_rows_per_unit")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600.0, help="engine timeout per query, seconds")
    p.add_argument("--dir", help="where the data and ledgers go (default: a temporary folder)")
    args = p.parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
