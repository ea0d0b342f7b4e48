"""Tumult Analytics peer runner (executed by ``bench/peers.py`` in ``bench/.venvs/tumult``).

    bench/.venvs/tumult/bin/python bench/peer_tumult.py SPEC.json OUT.json

Spark in local mode (``local[2]``, ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP``
set by the caller; ``spark.sql.shuffle.partitions`` = 8 rather than 200, the
usual setting for a single machine). Start-up (SparkSession) and the data load
(Parquet read, cached and counted) are timed separately from the queries.

The session protects a privacy unit with ``AddRowsWithID(unit)``; each query
enforces the policy's bounds: ``MaxGroupsPerID(key, k)`` and
``MaxRowsPerGroupPerID(key, m)`` for grouped queries (public keys as a
``KeySet``), ``MaxRowsPerID(k·m)`` for the ungrouped count. Budgets are ρ
(``RhoZCDPBudget``), the same ρ as the gateway's; COUNT + AVG is two Tumult
queries (Tumult evaluates one aggregate per query) with ρ/2 each, both timed.

Utility: 52 releases of ``COUNT(*) GROUP BY educ`` on the PUMS table
(``AddOneRow``: one row per person) in one session whose ρ budget is the
total (ε, δ) converted by the standard zCDP bound ε = ρ + 2√(ρ ln(1/δ))
(Bun–Steinke 2016 Prop. 1.3, the conversion Tumult's documentation states),
ρ/52 per release.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from importlib import metadata


def _spark():
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("dpgate-bench-tumult")
            .config("spark.driver.memory", "6g").config("spark.sql.shuffle.partitions", "8")
            .config("spark.ui.enabled", "false").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.warehouse.dir", os.path.abspath("spark-warehouse"))
            .getOrCreate())


def _queries(ta, ds: dict, query: str, rho: float):
    """(query, budget) pairs making up one benchmark query."""
    QB, KeySet = ta.QueryBuilder, ta.KeySet
    key, x, k, m = ds["key"], ds["x"], ds["k"], ds["m"]
    keys = KeySet.from_dict({key: list(ds["keys"])})

    def grouped():
        return (QB("data").enforce(ta.MaxGroupsPerID(key, k)).enforce(ta.MaxRowsPerGroupPerID(key, m))
                .groupby(keys))

    if query == "count":
        return [(QB("data").enforce(ta.MaxRowsPerID(k * m)).count(), ta.RhoZCDPBudget(rho))]
    if query == "count_avg":
        return [(grouped().count(), ta.RhoZCDPBudget(rho / 2)),
                (grouped().average(x, ds["lower"], ds["upper"]), ta.RhoZCDPBudget(rho / 2))]
    if query == "sum":
        return [(grouped().sum(x, ds["lower"], ds["upper"]), ta.RhoZCDPBudget(rho))]
    raise KeyError(query)


def _utility(ta, spark, spec: dict) -> dict:
    u = spec["utility"]
    df = spark.read.parquet(u["path"]).select(u["unit"], u["key"]).cache()
    df.count()
    # BS16 Prop. 1.3: ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP; solve for the largest ρ with ε ≤ total.
    L = math.log(1 / u["delta"])
    s = -math.sqrt(L) + math.sqrt(L + u["epsilon"])
    rho_total = s * s
    sess = ta.Session.from_dataframe(privacy_budget=ta.RhoZCDPBudget(rho_total), source_id="data", dataframe=df,
                                     protected_change=ta.AddOneRow())
    q = ta.QueryBuilder("data").groupby(ta.KeySet.from_dict({u["key"]: list(u["keys"])})).count()
    true = {int(k): v for k, v in u["true"].items()}
    sq, n = 0.0, 0
    for _ in range(u["run_weeks"]):
        pdf = sess.evaluate(q, ta.RhoZCDPBudget(rho_total / u["weeks"])).toPandas()
        for key, cnt in zip(pdf[u["key"]], pdf["count"]):
            sq += (float(cnt) - true[int(key)]) ** 2
            n += 1
    return {"rmse": math.sqrt(sq / n), "cells": n, "releases_run": u["run_weeks"], "releases": u["weeks"],
            "rho_total": rho_total, "rho_per_release": rho_total / u["weeks"],
            "noise_sigma": math.sqrt(u["weeks"] / (2 * rho_total)),
            "accountant": "Tumult RhoZCDPBudget, ε→ρ by BS16 Prop. 1.3"}


def main() -> int:
    """Run the spec in ``sys.argv[1]`` and write the results to ``sys.argv[2]``."""
    spec = json.loads(open(sys.argv[1]).read())
    t0 = time.perf_counter()
    import tmlt.analytics as ta

    out = {"peer": "tumult", "version": metadata.version("tmlt.analytics"),
           "import_s": time.perf_counter() - t0, "load_s": {}, "results": {}, "errors": {}}
    t0 = time.perf_counter()
    spark = _spark()
    spark.range(10).count()
    out["spark_startup_s"] = time.perf_counter() - t0
    out["pyspark_version"] = spark.version
    for ds in spec["datasets"]:
        t0 = time.perf_counter()
        df = spark.read.parquet(ds["path"]).select(ds["unit"], ds["key"], ds["x"]).cache()
        df.count()
        sess = (ta.Session.Builder().with_privacy_budget(ta.RhoZCDPBudget(float("inf"))).with_id_space("units")
                .with_private_dataframe("data", df, protected_change=ta.AddRowsWithID(ds["unit"], "units")).build())
        out["load_s"][ds["name"]] = time.perf_counter() - t0
        for q in ds["queries"]:
            times = []
            try:
                for _ in range(spec["runs"]):
                    t = time.perf_counter()
                    res = [sess.evaluate(query, budget).toPandas() for query, budget in
                           _queries(ta, ds, q, spec["rho"])]
                    times.append(time.perf_counter() - t)
                out["results"][f"{ds['name']}/{q}"] = {"runs_s": times, "median_s": statistics.median(times),
                                                      "sample": str(res[-1].head(3).to_dict("records"))[:300]}
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                out["errors"][f"{ds['name']}/{q}"] = f"{type(exc).__name__}: {exc}"[:500]
        df.unpersist()
    if spec.get("utility"):
        try:
            out["utility"] = _utility(ta, spark, spec)
        except Exception as exc:  # noqa: BLE001
            out["errors"]["utility"] = f"{type(exc).__name__}: {exc}"[:500]
    open(sys.argv[2], "w").write(json.dumps(out, indent=1, default=str))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
