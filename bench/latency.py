"""In-process query latency: the gateway vs raw DuckDB on the same connection.

Usage (one data folder per process, so that peak RSS is per size)::

    python -m bench.latency --data bench/.data/rows_1m --runs 5 --json out.json

For a data folder written by :mod:`bench.datagen` this writes policies with
``max_groups_per_unit`` k = 1 and k = 3 (synthetic data; PUMS has one row per
person, k = m = 1) into a temporary project, opens a real
:class:`dpgate.service.Gateway` (SQLite ledger, release store, DuckDB engine)
and times, interleaved, median of ``--runs`` runs after one warm-up:

* ``gateway``: ``Gateway.query`` end to end — parse, plan, calibration, ledger
  charge (a durable SQLite commit), the bounded SQL, OpenDP noise,
  post-processing, storing the release. The release cache is bypassed by
  giving every run a distinct budget ρ·(1 + i·10⁻⁹), so each run is a miss
  and is charged.
* ``bounded``: only ``engine.execute(bounded_query(plan, policy, salt, unit_unique=…))``, as
  the gateway runs it (the unit-unique fast path where the load found one row per unit,
  e.g. PUMS); ``bounded_general``: the general form, timed too when the fast path applies.
* ``raw``: the same aggregate on the loaded table without bounding.
* ``per_unit``: the raw per-unit aggregation every bounding needs
  (``GROUP BY unit, key`` with COUNT and SUM), re-aggregated per key so that
  the result fetched into Python is as small as the gateway's.

All SQL runs on the gateway's own DuckDB connection (``gw.engine.execute``).
Queries (``QUERIES``): COUNT(*); GROUP BY key with COUNT(*) and AVG(x);
GROUP BY key with SUM(x). Prints (or writes with ``--json``) a JSON document
with per-run milliseconds, the load time and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import resource
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.datagen import events_table_toml, pums_table_toml
from dpgate import accounting
from dpgate.rendered import parse_generated

#: Analyst queries: name → template over ``{table}``, ``{key}`` (a public-key column), ``{x}`` (bounded).
QUERIES = {
    "count": "SELECT COUNT(*) AS n FROM {table}",
    "count_avg": "SELECT {key}, COUNT(*) AS n, AVG({x}) AS avg_x FROM {table} GROUP BY {key}",
    "sum": "SELECT {key}, SUM({x}) AS sum_x FROM {table} GROUP BY {key}",
    # PUMS only: SUM by a second key with fewer values than k allows (sex: 2 keys), issue 25's query
    "sum_key2": "SELECT {key2}, SUM({x}) AS sum_x FROM {table} GROUP BY {key2}",
}
#: Per-query privacy parameters shared with the peers: ε = 1 at δ = 1e-6, i.e. the ρ of the tight
#: zCDP conversion (Canonne–Kamath–Steinke 2020) for the gateway and Tumult.
QUERY_EPSILON = 1.0
QUERY_DELTA = 1e-6


def query_rho() -> float:
    """ρ of one benchmark query: the largest ρ whose tight conversion is (ε = 1, δ = 1e-6)."""
    return accounting.rho_for_cap(QUERY_EPSILON, QUERY_DELTA, "tight")


def columns_of(kind: str) -> dict[str, str]:
    """Table, unit, key and value column names of a ``bench.datagen`` data set kind."""
    if kind == "pums":
        return {"table": "pums", "unit": "pid", "key": "educ", "x": "income", "key2": "sex"}
    return {"table": "events", "unit": "unit_id", "key": "key", "x": "x"}


def queries_of(kind: str, queries: tuple[str, ...] = tuple(QUERIES)) -> tuple[str, ...]:
    """The queries of ``queries`` that a data set of ``kind`` has columns for (``sum_key2``: PUMS)."""
    return tuple(q for q in queries if "{key2}" not in QUERIES[q] or "key2" in columns_of(kind))


def analyst_sql(kind: str, query: str) -> str:
    """The analyst's SQL text of ``query`` on a data set of ``kind``."""
    c = columns_of(kind)
    return QUERIES[query].format(table=c["table"], key=c["key"], x=c["x"], key2=c.get("key2"))


def raw_sql(kind: str, query: str, relation: str) -> tuple[str, str]:
    """(raw aggregate, raw per-unit aggregation) SQL on the loaded ``relation`` — no bounding."""
    c = columns_of(kind)
    unit, key, x = c["unit"], c["key"], c["x"]
    if query == "count":
        return (f"SELECT COUNT(*) AS n FROM {relation}",
                f"SELECT SUM(c) AS n FROM (SELECT {unit}, COUNT(*) AS c FROM {relation} GROUP BY {unit})")
    if query == "count_avg":
        return (f"SELECT {key}, COUNT(*) AS n, AVG({x}) AS avg_x FROM {relation} GROUP BY {key} ORDER BY {key}",
                f"SELECT {key}, SUM(c) AS n, SUM(s) / SUM(c) AS avg_x FROM (SELECT {unit}, {key}, COUNT(*) AS c,"
                f" SUM({x}) AS s FROM {relation} GROUP BY {unit}, {key}) GROUP BY {key} ORDER BY {key}")
    if query == "sum":
        return (f"SELECT {key}, SUM({x}) AS sum_x FROM {relation} GROUP BY {key} ORDER BY {key}",
                f"SELECT {key}, SUM(s) AS sum_x FROM (SELECT {unit}, {key}, SUM({x}) AS s FROM {relation}"
                f" GROUP BY {unit}, {key}) GROUP BY {key} ORDER BY {key}")
    if query == "sum_key2" and "key2" in c:
        return (
            f"SELECT {c['key2']}, SUM({x}) AS sum_x FROM {relation} GROUP BY {c['key2']} ORDER BY {c['key2']}",
            f"SELECT {c['key2']}, SUM(s) AS sum_x FROM (SELECT {unit}, {c['key2']}, SUM({x}) AS s FROM {relation}"
            f" GROUP BY {unit}, {c['key2']}) GROUP BY {c['key2']} ORDER BY {c['key2']}")
    raise KeyError(query)


def write_policies(data: Path, folder: Path, ks: tuple[int, ...] = (1, 3), *, epsilon: float = 1000.0,
                   delta: float = 1e-6, clamp_counts: bool = True) -> list[dict[str, Any]]:
    """Write policies for the data set in ``data`` into ``folder``; return one entry per dataset.

    Synthetic data get one dataset per k in ``ks`` (m = 5, x in the manifest's
    [lower, upper] at resolution 0.01); PUMS gets one (k = m = 1). Sources are
    absolute paths. Entries: {dataset, kind, k, m, rows, units, table}.
    """
    manifest = json.loads((data / "manifest.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    kind = manifest["kind"]
    base = manifest["dataset"]
    out = []
    head = f"""[budget]
epsilon = {epsilon!r}
delta = {delta!r}
default_query_rho = 0.01
clamp_counts = {"true" if clamp_counts else "false"}

[allocations]
analysts = 1.0
"""
    if kind == "pums":  # k = m = 1 unless datagen --persons wrote several rows per person
        pk, pm = int(manifest.get("max_groups_per_unit", 1)), int(manifest.get("max_rows_per_unit", 1))
        name = f"{base}"
        (folder / f"{name}.toml").write_text(f"""[dataset]
name = "{name}"
population = "{name}-persons"

{head}
{pums_table_toml(str((data / 'pums.parquet').resolve()), k=pk, m=pm)}""")
        out.append({"dataset": name, "kind": kind, "k": pk, "m": pm, "rows": manifest["rows"],
                    "units": manifest["units"], "table": "pums"})
        return out
    m = int(manifest.get("max_rows_per_unit", 5))
    for k in ks:
        name = f"{base}_k{k}"
        (folder / f"{name}.toml").write_text(f"""[dataset]
name = "{name}"
population = "{name}-units"

{head}
{events_table_toml(str((data / 'events.parquet').resolve()), k=k, m=m, keys=manifest['keys'],
                    lower=manifest['lower'], upper=manifest['upper'])}""")
        out.append({"dataset": name, "kind": kind, "k": k, "m": m, "rows": manifest["rows"],
                    "units": manifest["units"], "table": "events", "keys": manifest["keys"]})
    return out


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def measure(data: Path, *, runs: int = 5, ks: tuple[int, ...] = (1, 3), queries: tuple[str, ...] = tuple(QUERIES),
            threads: int | None = None) -> dict[str, Any]:
    """Open a gateway on ``data`` and time every query (see the module docstring); return the results."""
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings
    from dpgate.sql.bound import bounded_query
    from dpgate.sql.parse import parse_query

    tmp = Path(tempfile.mkdtemp(prefix="dpgate-latency-"))
    try:
        entries = write_policies(data, tmp / "policies", ks)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        gw = Gateway.open(Settings(policies=tmp / "policies", home=tmp / "home", duckdb_threads=threads,
                                   query_timeout_s=600.0))
        load_s = time.perf_counter() - t0
        rho = query_rho()
        results: dict[str, Any] = {}
        try:
            for e in entries:
                ds, kind = e["dataset"], e["kind"]
                policy = gw.policy(ds)
                relation = policy.table(e["table"]).relation
                for q in queries_of(kind, queries):
                    sql = analyst_sql(kind, q)
                    plan = parse_query(sql, policy)
                    # hand-written baselines: DuckDB text as trees, parsed once outside the timings
                    raw, per_unit = (parse_generated(t) for t in raw_sql(kind, q, relation))
                    unique = gw.engine.unit_is_unique(ds, e["table"])  # the gateway takes the fast path
                    times: dict[str, list[float]] = {"gateway": [], "bounded": [], "raw": [], "per_unit": []}
                    if unique:
                        times["bounded_general"] = []
                    release = None
                    for i in range(runs + 1):  # run 0 is the warm-up
                        budget = QueryBudget(rho=rho * (1 + (i + 1) * 1e-9) if i else rho * 0.5)
                        t = time.perf_counter()
                        release = gw.query(ds, sql, consumer="analysts", budget=budget)
                        g = _ms(t)
                        assert release["cached"] is False, "the release cache was hit"
                        t = time.perf_counter()
                        gw.engine.execute(bounded_query(plan, policy, salt=secrets.randbits(63), unit_unique=unique))
                        b = _ms(t)
                        if unique:  # the general form too, to show what the fast path saves
                            t = time.perf_counter()
                            gw.engine.execute(bounded_query(plan, policy, salt=secrets.randbits(63)))
                            if i:
                                times["bounded_general"].append(_ms(t))
                        t = time.perf_counter()
                        gw.engine.execute(raw)
                        r = _ms(t)
                        t = time.perf_counter()
                        gw.engine.execute(per_unit)
                        p = _ms(t)
                        if i:
                            for name, v in (("gateway", g), ("bounded", b), ("raw", r), ("per_unit", p)):
                                times[name].append(v)
                    med = {name: statistics.median(v) for name, v in times.items()}
                    results[f"{ds}/{q}"] = {
                        **e, "query": q, "sql": sql, "unit_unique": unique, "runs_ms": times, "median_ms": med,
                        "gateway_over_per_unit": med["gateway"] / med["per_unit"],
                        "gateway_over_raw": med["gateway"] / med["raw"],
                        "sample_rows": release["rows"][:3] if release else None,
                    }
        finally:
            gw.close()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return {"data": str(data), "runs": runs, "load_s": load_s, "rho_per_query": rho,
                "epsilon_per_query": QUERY_EPSILON, "delta": QUERY_DELTA, "peak_rss_mb": rss / 1024,
                "rss_before_open_mb": rss_before / 1024, "results": results}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a folder written by bench.datagen")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ks", default="1,3", help="max_groups_per_unit values for synthetic data (default 1,3)")
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--json", type=Path, help="write the results here (default: stdout)")
    args = ap.parse_args(argv)
    out = measure(args.data, runs=args.runs, ks=tuple(int(k) for k in args.ks.split(",")),
                  queries=tuple(args.queries.split(",")))
    text = json.dumps(out, indent=1, default=str)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
