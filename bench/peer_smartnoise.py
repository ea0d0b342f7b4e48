"""SmartNoise SQL peer runner (executed by ``bench/peers.py`` in ``bench/.venvs/smartnoise``).

    bench/.venvs/smartnoise/bin/python bench/peer_smartnoise.py SPEC.json OUT.json

SmartNoise SQL 1.0 with its pandas reader (``snsql.from_df``, which copies the
DataFrame into an in-memory SQLite database once: the one-time load, timed
with the Parquet read). Metadata: ``pid`` is the private id, ``max_ids`` = k·m
rows per person, bounds from the dataset's policy, ``censor_dims: False``
(the keys are public, as in the gateway), ``clamp_counts: True``.
Per query: ``reader.execute(sql)`` with ``Privacy(epsilon, delta)``.

Utility: 52 releases of ``COUNT(*) … GROUP BY key`` under one total
(ε, δ): the per-query ε is the largest whose composition by SmartNoise's own
odometer (``OdometerHeterogeneous``, Kairouz–Oh–Viswanath 2015 Thm. 3.5,
as in ``PrivateReader.get_privacy_cost``) over 52 releases stays within (ε, δ).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import warnings
from importlib import metadata


def _meta(ds: dict) -> dict:
    cols = {ds["unit"]: {"type": "int", "private_id": True}, ds["key"]: {"type": "int"}}
    if ds.get("key2"):
        cols[ds["key2"]] = {"type": "int"}
    if ds.get("x"):
        cols[ds["x"]] = {"type": "float", "lower": ds["lower"], "upper": ds["upper"]}
    table = {"rows": ds["rows"], "max_ids": ds["k"] * ds["m"], "censor_dims": False, "clamp_counts": True,
             "sample_max_ids": True, **cols}
    return {"": {"bench": {"data": table}}}


def _sql(ds: dict, query: str) -> str:
    t, key, x = "bench.data", ds["key"], ds.get("x")
    return {"count": f"SELECT COUNT(*) AS n FROM {t}",
            "count_avg": f"SELECT {key}, COUNT(*) AS n, AVG({x}) AS avg_x FROM {t} GROUP BY {key}",
            "sum": f"SELECT {key}, SUM({x}) AS sum_x FROM {t} GROUP BY {key}",
            "sum_key2": f"SELECT {ds.get('key2')}, SUM({x}) AS sum_x FROM {t} GROUP BY {ds.get('key2')}"}[query]


def _load(ds: dict, snsql, privacy):
    import pyarrow.parquet as pq

    cols = [ds["unit"], ds["key"]] + ([ds["key2"]] if ds.get("key2") else []) + ([ds["x"]] if ds.get("x") else [])
    df = pq.read_table(ds["path"], columns=cols).to_pandas()
    return snsql.from_df(df, privacy=privacy, metadata=_meta(ds))


def _utility(snsql, spec: dict) -> dict:
    from snsql.sql.odometer import OdometerHeterogeneous

    u = spec["utility"]
    ds = {"path": u["path"], "unit": u["unit"], "key": u["key"], "x": None, "k": 1, "m": 1, "rows": u["rows"]}
    sql = _sql(ds, "count").replace("COUNT(*) AS n FROM bench.data",
                                    f"{u['key']}, COUNT(*) AS n FROM bench.data GROUP BY {u['key']}")
    # The odometer adds a slack δ' = privacy.delta / 2 to the mechanisms' δ (0 for discrete Laplace
    # counts), so Privacy(delta = 2δ) lets the composed δ reach the total δ.
    pdelta = 2 * u["delta"]
    probe = _load(ds, snsql, snsql.Privacy(epsilon=1.0, delta=pdelta))

    def spent(eps: float) -> tuple[float, float]:
        probe.privacy = snsql.Privacy(epsilon=eps, delta=pdelta)
        costs = [c for c in probe._get_mechanism_costs(sql) if c]
        odo = OdometerHeterogeneous(snsql.Privacy(epsilon=eps, delta=pdelta))
        for _ in range(u["weeks"]):
            for e, d in costs:
                odo.spend(snsql.Privacy(epsilon=e, delta=d))
        return odo.spent

    lo, hi = 1e-6, u["epsilon"]
    for _ in range(60):
        mid = (lo + hi) / 2
        e, d = spent(mid)
        # the odometer reports δ a few ulps above the total for δ = 0 mechanisms (float sum)
        if e <= u["epsilon"] and d <= u["delta"] * (1 + 1e-9):
            lo = mid
        else:
            hi = mid
    eps_q = lo
    total = spent(eps_q)
    reader = _load(ds, snsql, snsql.Privacy(epsilon=eps_q, delta=pdelta))
    true = {int(k): v for k, v in u["true"].items()}
    sq, n = 0.0, 0
    for _ in range(u["run_weeks"]):
        res = reader.execute(sql)
        for key, cnt in res[1:]:
            sq += (cnt - true[int(key)]) ** 2
            n += 1
    return {"rmse": math.sqrt(sq / n), "cells": n, "releases_run": u["run_weeks"], "releases": u["weeks"],
            "epsilon_per_release": eps_q, "composed": list(map(float, total)),
            "mechanism": "discrete Laplace (SmartNoise default for counts)",
            "noise_scale": 1.0 / eps_q, "accountant": "SmartNoise OdometerHeterogeneous (KOV15 Thm 3.5)"}


def main() -> int:
    """Run the spec in ``sys.argv[1]`` and write the results to ``sys.argv[2]``."""
    warnings.filterwarnings("ignore")
    spec = json.loads(open(sys.argv[1]).read())
    t0 = time.perf_counter()
    import snsql

    out = {"peer": "smartnoise", "version": metadata.version("smartnoise-sql"),
           "import_s": time.perf_counter() - t0, "load_s": {}, "results": {}, "errors": {}}
    for ds in spec["datasets"]:
        t0 = time.perf_counter()
        try:
            reader = _load(ds, snsql, snsql.Privacy(epsilon=spec["epsilon"], delta=spec["delta"]))
        except Exception as exc:  # noqa: BLE001 - reported, not hidden
            out["errors"][ds["name"]] = f"{type(exc).__name__}: {exc}"[:500]
            continue
        out["load_s"][ds["name"]] = time.perf_counter() - t0
        for q in ds["queries"]:
            sql = _sql(ds, q)
            times = []
            try:
                for _ in range(spec["runs"]):
                    t = time.perf_counter()
                    res = reader.execute(sql)
                    times.append(time.perf_counter() - t)
                out["results"][f"{ds['name']}/{q}"] = {"runs_s": times, "median_s": statistics.median(times),
                                                      "sql": sql, "sample": str(res[:3])[:300]}
            except Exception as exc:  # noqa: BLE001
                out["errors"][f"{ds['name']}/{q}"] = f"{type(exc).__name__}: {exc}"[:500]
        del reader
    if spec.get("utility"):
        try:
            out["utility"] = _utility(snsql, spec)
        except Exception as exc:  # noqa: BLE001
            out["errors"]["utility"] = f"{type(exc).__name__}: {exc}"[:500]
    open(sys.argv[2], "w").write(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
