"""PipelineDP peer runner (executed by ``bench/peers.py`` in ``bench/.venvs/pipelinedp``).

    bench/.venvs/pipelinedp/bin/python bench/peer_pipelinedp.py SPEC.json OUT.json

Reads the spec written by :mod:`bench.peers` (data sets, queries, ε, δ, runs,
the utility experiment) and writes timings and utility figures as JSON. Uses
PipelineDP's ``LocalBackend`` (plain Python iterables), public partitions (the
policy's keys), contribution bounds k (``max_partitions_contributed``) and m
(``max_contributions_per_partition``), value bounds from the policy, and
Gaussian noise. Timing per query: building the ``DPEngine``, ``aggregate``,
``compute_budgets`` and materialising the result; reading the Parquet file
into Python tuples is the one-time load, timed separately.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from importlib import metadata


def _load(path: str, cols: list[str]):
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=cols)
    return list(zip(*(t.column(c).to_pylist() for c in cols)))


def _run_query(pdp, rows, ds: dict, query: str, epsilon: float, delta: float):
    acc = pdp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    grouped = query != "count"
    metrics = {"count": [pdp.Metrics.COUNT], "count_avg": [pdp.Metrics.COUNT, pdp.Metrics.MEAN],
               "sum": [pdp.Metrics.SUM]}[query]
    params = pdp.AggregateParams(
        metrics=metrics, noise_kind=pdp.NoiseKind.GAUSSIAN,
        max_partitions_contributed=ds["k"] if grouped else 1,
        max_contributions_per_partition=ds["m"] if grouped else ds["m"] * ds["k"],
        min_value=ds["lower"], max_value=ds["upper"])
    extract = pdp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                 partition_extractor=(lambda r: r[1]) if grouped else (lambda r: 0),
                                 value_extractor=lambda r: r[2])
    out = engine.aggregate(rows, params, extract, public_partitions=ds["keys"] if grouped else [0])
    acc.compute_budgets()
    return list(out)


def _utility(pdp, spec: dict) -> dict:
    u = spec["utility"]
    rows = _load(u["path"], [u["unit"], u["key"]])
    rows = [(a, b, 0.0) for a, b in rows]
    true = {int(k): v for k, v in u["true"].items()}
    acc = pdp.PLDBudgetAccountant(total_epsilon=u["epsilon"], total_delta=u["delta"])
    engine = pdp.DPEngine(acc, pdp.LocalBackend())
    params = pdp.AggregateParams(metrics=[pdp.Metrics.COUNT], noise_kind=pdp.NoiseKind.GAUSSIAN,
                                 max_partitions_contributed=1, max_contributions_per_partition=1,
                                 output_noise_stddev=True)
    extract = pdp.DataExtractors(privacy_id_extractor=lambda r: r[0], partition_extractor=lambda r: r[1],
                                 value_extractor=lambda r: 0)
    outs = [engine.aggregate(rows, params, extract, public_partitions=u["keys"]) for _ in range(u["weeks"])]
    t0 = time.perf_counter()
    acc.compute_budgets()  # the PLD accountant splits (ε, δ) over all declared aggregations
    sq, n, sigma = 0.0, 0, None
    for out in outs[: u["run_weeks"]]:
        for key, res in out:
            sq += (res.count - true[int(key)]) ** 2
            n += 1
            sigma = getattr(res, "count_noise_stddev", sigma)
    return {"rmse": math.sqrt(sq / n), "cells": n, "releases_run": u["run_weeks"], "releases": u["weeks"],
            "noise_sigma": sigma, "accountant": "PLDBudgetAccountant (Gaussian noise)",
            "seconds": time.perf_counter() - t0}


def main() -> int:
    """Run the spec in ``sys.argv[1]`` and write the results to ``sys.argv[2]``."""
    spec = json.loads(open(sys.argv[1]).read())
    t0 = time.perf_counter()
    import pipeline_dp as pdp

    out = {"peer": "pipelinedp", "version": metadata.version("pipeline-dp"), "import_s": time.perf_counter() - t0,
           "load_s": {}, "results": {}, "errors": {}}
    for ds in spec["datasets"]:
        t0 = time.perf_counter()
        rows = _load(ds["path"], [ds["unit"], ds["key"], ds["x"]])
        out["load_s"][ds["name"]] = time.perf_counter() - t0
        for q in ds["queries"]:
            times = []
            try:
                for _ in range(spec["runs"]):
                    t = time.perf_counter()
                    res = _run_query(pdp, rows, ds, q, spec["epsilon"], spec["delta"])
                    times.append(time.perf_counter() - t)
                out["results"][f"{ds['name']}/{q}"] = {"runs_s": times, "median_s": statistics.median(times),
                                                      "sample": str(res[:2])[:300]}
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                out["errors"][f"{ds['name']}/{q}"] = f"{type(exc).__name__}: {exc}"[:500]
        del rows
    if spec.get("utility"):
        try:
            out["utility"] = _utility(pdp, spec)
        except Exception as exc:  # noqa: BLE001
            out["errors"]["utility"] = f"{type(exc).__name__}: {exc}"[:500]
    open(sys.argv[2], "w").write(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
