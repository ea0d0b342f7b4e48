"""Partition selection at scale (issue 25 item 2): selection over many candidates vs the raw GROUP BY, in one run.

    python -m bench.selection_scale_bench --rows 2000000 --units 200000 --keys 200000 --runs 3

The table is :mod:`bench.partition_bench`'s ``events(unit, key, x)`` (DuckDB-written Parquet,
deterministic, skewed keys: most candidates are rare). Each round, interleaved, times

* ``raw``: DuckDB's ``SELECT key, COUNT(*), SUM(x) FROM read_parquet(…) GROUP BY key``, fetched
  as NumPy (no privacy at all: the floor);
* ``selected``: ``SELECT key, COUNT(*) AS n, SUM(x) AS s FROM events GROUP BY key`` end to end
  through :meth:`dpgate.service.Gateway.query` with no public keys for ``key`` (bounding, the
  candidate histogram, the threshold mechanism — :func:`dpgate.mechanisms.selection.threshold_select`,
  chunks over threads — noise on the kept rows, release);
* ``reference`` (unless ``--no-reference``): the same query with the pre-issue-25 threshold step,
  OpenDP's map measurement on a Python dict of every candidate
  (:func:`dpgate.mechanisms.selection.threshold_select_opendp_map`), patched in for that call only;
* ``mechanism`` / ``mechanism_1_thread`` / ``mechanism_reference``: the threshold step alone
  (chunks over threads; chunks in one thread; the old dict path) on a vector as long as the
  number of candidates (the raw per-key unit counts).

Inside each ``selected`` query the bench also records where the time went (timers wrapped
around the engine's ``execute`` and the pipeline's ``threshold_select``, no other change):
``selected_engine`` (the bounded SQL in DuckDB, fetched as Arrow/NumPy), ``selected_threshold``
(the threshold mechanism) and ``selected_rest`` (plan, charge, calibration, noise on the kept
rows, release), each also as a ratio to ``raw``; ``candidates_selected``, how many candidates
the mechanism noised (after the k-bounding; ``candidates_raw`` counts the keys before it); and
``cpu_us_per_draw``, the process CPU time of the one-thread threshold step per raw candidate
(OpenDP's exact sampler: the floor of that step).

Each query gets a fresh budget (no cache hit). Medians and ratios go out as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.partition_bench import POLICY, SQL, generate


def run(args: argparse.Namespace) -> dict:
    import duckdb
    import numpy as np

    from dpgate import partition_selection
    from dpgate.engines.duckdb import DuckDBEngine
    from dpgate.mechanisms import selection as mechanisms
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    root = Path(args.dir or tempfile.mkdtemp(prefix="dpgate-selscale-"))
    root.mkdir(parents=True, exist_ok=True)
    data = root / f"events_{args.rows}_{args.units}_{args.keys}.parquet"
    if not data.exists():
        t0 = time.perf_counter()
        generate(data, args.rows, args.units, args.keys)
        print(f"# generated {data} in {time.perf_counter() - t0:.1f} s", flush=True)
    folder = root / "policies_selected"
    folder.mkdir(exist_ok=True)
    (folder / "bench.toml").write_text(POLICY.format(name="selected", source=data, k=args.k, m=args.m, keys=""))
    settings = Settings(policies=folder, home=root / f"home_{time.time_ns()}", query_timeout_s=args.timeout)

    con = duckdb.connect()
    raw_sql = f"SELECT key, COUNT(*) AS n, SUM(x) AS s, COUNT(DISTINCT unit) AS u FROM read_parquet('{data}') GROUP BY key"
    unit_counts = np.asarray(con.execute(raw_sql).fetchnumpy()["u"], dtype=np.int64)
    raw_only = f"SELECT key, COUNT(*) AS n, SUM(x) AS s FROM read_parquet('{data}') GROUP BY key"
    times: dict[str, list[float]] = {"raw": [], "selected": [], "mechanism": [], "mechanism_1_thread": []}
    if args.reference:
        times.update(reference=[], mechanism_reference=[])
    out: dict = {"rows": args.rows, "units": args.units, "key_domain": args.keys,
                 "candidates_raw": int(unit_counts.size), "k": args.k, "m": args.m, "runs": args.runs}
    original = partition_selection.threshold_select
    phases: dict[str, float] = {}
    execute = DuckDBEngine.execute

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    def counted(cal, counts, **kw):
        out["candidates_selected"] = int(len(counts))  # after the bounding: what the mechanism noises
        return original(cal, counts, **kw)

    for key in ("selected_engine", "selected_threshold", "selected_rest", "cpu_us_per_draw"):
        times[key] = []
    with Gateway.open(settings) as gw:
        for i in range(args.runs):
            t0 = time.perf_counter()
            con.execute(raw_only).fetchnumpy()
            times["raw"].append(time.perf_counter() - t0)

            phases.clear()
            DuckDBEngine.execute = timed("engine", execute)
            partition_selection.threshold_select = timed("threshold", counted)
            try:
                t0 = time.perf_counter()
                r = gw.query("selected", SQL, consumer="default", budget=QueryBudget(rho=0.01 + 1e-6 * (2 * i)))
                times["selected"].append(time.perf_counter() - t0)
            finally:
                DuckDBEngine.execute = execute
                partition_selection.threshold_select = original
            times["selected_engine"].append(phases["engine"])
            times["selected_threshold"].append(phases["threshold"])
            times["selected_rest"].append(times["selected"][-1] - phases["engine"] - phases["threshold"])
            out["keys_released"] = len(r["rows"])
            out["threshold"] = r["partition_selection"]["threshold"]
            out["sigma"] = r["partition_selection"].get("sigma")

            if args.reference:
                partition_selection.threshold_select = mechanisms.threshold_select_opendp_map
                try:
                    t0 = time.perf_counter()
                    r = gw.query("selected", SQL, consumer="default",
                                 budget=QueryBudget(rho=0.01 + 1e-6 * (2 * i + 1)))
                    times["reference"].append(time.perf_counter() - t0)
                finally:
                    partition_selection.threshold_select = original
                out["keys_released_reference"] = len(r["rows"])

            cal = mechanisms.calibrate_selection("gaussian", float(out["sigma"] or 10.0), args.k, 1e-7)
            t0 = time.perf_counter()
            mechanisms.threshold_select(cal, unit_counts)
            times["mechanism"].append(time.perf_counter() - t0)
            t0, c0 = time.perf_counter(), time.process_time()
            mechanisms.threshold_select(cal, unit_counts, workers=1)
            times["mechanism_1_thread"].append(time.perf_counter() - t0)
            times["cpu_us_per_draw"].append((time.process_time() - c0) / unit_counts.size * 1e6)
            if args.reference:
                t0 = time.perf_counter()
                mechanisms.threshold_select_opendp_map(cal, unit_counts)
                times["mechanism_reference"].append(time.perf_counter() - t0)
            print(f"# round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in times.items()), flush=True)
    con.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out["median_s"] = med
    out["times_s"] = times
    out["ratio_selected_over_raw"] = med["selected"] / med["raw"]
    for key in ("selected_engine", "selected_threshold", "selected_rest"):
        out[f"ratio_{key}_over_raw"] = med[key] / med["raw"]
    out["candidates_per_s_mechanism"] = unit_counts.size / med["mechanism"]
    out["ratio_mechanism_1_thread_over_threads"] = med["mechanism_1_thread"] / med["mechanism"]
    if args.reference:
        out["ratio_reference_over_raw"] = med["reference"] / med["raw"]
        out["ratio_mechanism_reference_over_new"] = med["mechanism_reference"] / med["mechanism"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--units", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=200_000, help="key domain (candidates ≈ the keys seen)")
    p.add_argument("--k", type=int, default=3, help="max_groups_per_unit")
    p.add_argument("--m", type=int, default=5, help="max_rows_per_unit")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-reference", dest="reference", action="store_false",
                   help="skip the pre-issue-25 threshold step (OpenDP's map measurement on a dict)")
    p.add_argument("--timeout", type=float, default=900.0, help="engine timeout per query, seconds")
    p.add_argument("--dir", help="where the data and ledgers go (default: a temporary folder)")
    args = p.parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
