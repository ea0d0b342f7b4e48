"""Engines side by side: DuckDB in memory, DuckDB in place over Parquet, Spark local, PostgreSQL.

    python -m bench.datagen --rows 10000000 --units 1000000 --keys 10 --max-groups 3 \\
        --out bench/.data/rows_10m_k3
    python -m bench.engines_bench --data bench/.data/rows_10m_k3 \\
        --engines duckdb_memory,duckdb_in_place,spark,postgres --runs 3
    python -m bench.engines_bench --fast-path bench/.data/pums_1m2 --runs 5

Each engine runs in its own child process (``--worker``) so that its peak memory is its
own: the resident set size of the process and all its children (Spark's JVM) is sampled
every 50 ms with psutil, separately during the load and during the queries. For each
engine: the load time (DuckDB: copy or views + the uniqueness scan; PostgreSQL: COPY into
a fresh schema of the ``test`` database is timed apart, the engine's load is a schema
check; Spark: session start + views), then the median of ``--runs`` runs of each query's
bounded SQL (fixed salts; the same exact values are checked across engines). PostgreSQL
also runs the raw aggregation (``GROUP BY key``) and the plain per-unit aggregation
(``GROUP BY unit, key``) directly, the baselines of the bounded query.

``--fast-path`` measures the skip of the per-unit aggregation when the unit is unique
(PUMS: one row per person): the bounded SQL in its general form against the same plan
rendered with ``unit_unique=True`` (what the gateway runs when the load found the unit
unique), interleaved on one DuckDB engine, exact values compared.

Results: one JSON line per engine on stdout (``--json FILE`` writes them all).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil

QUERIES = {
    "count_sum_by_key": "SELECT key, COUNT(*), SUM(x) FROM events GROUP BY key",
    "count_avg": "SELECT COUNT(*), AVG(x) FROM events",
}
PUMS_QUERIES = {
    "count_by_sex": "SELECT sex, COUNT(*) FROM pums GROUP BY sex",
    "avg_income_by_educ": "SELECT educ, COUNT(*), AVG(income) FROM pums GROUP BY educ",
    "sum_income_where": "SELECT race, SUM(income), AVG(age) FROM pums WHERE age >= 18 GROUP BY race",
}
PG_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


class PeakMemory:
    """Samples the RSS of this process and its descendants every ``interval`` seconds."""

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._proc = psutil.Process()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        total = 0
        for p in [self._proc, *self._proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            time.sleep(self.interval)

    def __enter__(self) -> "PeakMemory":
        self.peak = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())


def _policy_text(data: Path, lines: str, source: str | None = None) -> tuple[Path, str]:
    folder = data / "policies"
    path = next(folder.glob("*.toml"))
    text = path.read_text()
    text = text.replace("[dataset]\n", "[dataset]\n" + lines, 1)
    if source is not None:
        text = text.replace('source = "events.parquet"', f'source = "{source}"')
    return path, text


def _load_policy(data: Path, lines: str, source: str | None = None):
    from dpgate.policy import parse_policy

    import tomllib

    path, text = _policy_text(data, lines, source)
    return parse_policy(tomllib.loads(text), path)


def _median(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _digest(columns: dict) -> str:
    import hashlib

    h = hashlib.sha256()
    for name, values in columns.items():
        h.update(name.encode())
        h.update(repr([int(v) if hasattr(v, "__int__") else v for v in values.tolist()]).encode())
    return h.hexdigest()[:16]


def worker(engine: str, data: Path, runs: int, pg_schema: str | None) -> dict:
    """Load one engine and time the queries; returns the result record."""
    from dpgate.engines import EngineOptions, EngineSet
    from dpgate.sql.bound import bounded_query
    import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
    from dpgate.sql.parse import parse_query

    lines, source = {
        "duckdb_memory": ('load = "memory"\n', None),
        "duckdb_in_place": ('load = "in_place"\n', None),
        "spark": ('engine = "spark"\n', str((data / "events.parquet").resolve())),
        "postgres": (f'engine = "postgres"\nconnection = "{PG_URL}"\ndata_version = "bench"\n',
                     f"{pg_schema}.events"),
    }[engine]
    policy = _load_policy(data, lines, source)
    options = EngineOptions(timeout_s=3600, spark_master=os.environ.get("DPGATE_SPARK_MASTER", "local[*]"),
                            duckdb_memory_limit=os.environ.get("DPGATE_DUCKDB_MEMORY_LIMIT"))
    record: dict = {"engine": engine, "data": str(data),
                    "duckdb_memory_limit": options.duckdb_memory_limit}
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        engines = EngineSet(options=options)
        engines.load({policy.name: policy})
        record["load_s"] = round(time.perf_counter() - t0, 3)
    record["load_peak_rss_mb"] = round(mem.peak / 1e6)
    record["queries"] = {}
    with PeakMemory() as mem:
        for name, sql in QUERIES.items():
            plan = parse_query(sql, policy)
            bounded = bounded_query(plan, policy, salt=20261130)
            engines.execute(bounded)  # warm-up (caches, JIT, file system)
            seconds, out = _median(lambda: engines.execute(bounded), runs)
            record["queries"][name] = {"bounded_s": round(seconds, 3), "digest": _digest(out)}
        if engine == "postgres":
            import psycopg

            with psycopg.connect(PG_URL) as conn:
                for name, sql in {
                    "raw_group_by_key": f'SELECT key, count(*), sum(x) FROM "{pg_schema}".events GROUP BY key',
                    "plain_per_unit": f'SELECT count(*) FROM (SELECT unit_id, key, count(*), sum(x) '
                                      f'FROM "{pg_schema}".events GROUP BY unit_id, key) AS p',
                }.items():
                    conn.execute(sql).fetchall()
                    seconds, _ = _median(lambda: conn.execute(sql).fetchall(), runs)
                    record["queries"][name] = {"raw_s": round(seconds, 3)}
    record["query_peak_rss_mb"] = round(mem.peak / 1e6)
    engines.close()
    return record


def pg_copy(data: Path) -> tuple[str, float]:
    """COPY ``events.parquet`` into a fresh schema of the test database (CSV through the server)."""
    import psycopg
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    schema = f"dpgate_bench_{uuid.uuid4().hex[:8]}"
    t0 = time.perf_counter()
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE UNLOGGED TABLE "{schema}".events (unit_id bigint, key bigint, x double precision)')
        pf = pq.ParquetFile(data / "events.parquet")
        with conn.cursor() as cur:
            with cur.copy(f'COPY "{schema}".events FROM STDIN (FORMAT csv)') as copy:
                for batch in pf.iter_batches(batch_size=500_000, columns=["unit_id", "key", "x"]):
                    import io

                    buf = io.BytesIO()
                    pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
                    copy.write(buf.getvalue())
        conn.execute(f'ANALYZE "{schema}".events')
    return schema, time.perf_counter() - t0


def fast_path(data: Path, runs: int) -> dict:
    """Bounded SQL, general form vs unit-unique fast path of the same plan, on DuckDB in memory."""
    from dpgate.engines import EngineSet
    from dpgate.policy import parse_policy
    from dpgate.sql.bound import bounded_query
    import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
    from dpgate.sql.parse import parse_query

    import tomllib

    path = next((data / "policies").glob("*.toml"))
    policy = parse_policy(tomllib.loads(path.read_text().replace("[dataset]\n", '[dataset]\nload = "memory"\n', 1)),
                          path)
    engines = EngineSet()
    t0 = time.perf_counter()
    engines.load({policy.name: policy})
    record: dict = {"engine": "duckdb_memory", "data": str(data), "load_s": round(time.perf_counter() - t0, 3),
                    "unit_is_unique": engines.unit_is_unique(policy.name, "pums"), "queries": {}}
    for name, sql in PUMS_QUERIES.items():
        plan = parse_query(sql, policy)
        slow_sql = bounded_query(plan, policy, salt=7)
        fast_sql = bounded_query(plan, policy, salt=7, unit_unique=True)  # what the gateway runs here
        slow_t, fast_t = [], []
        a = engines.execute(slow_sql)
        b = engines.execute(fast_sql)
        same = all(a[k].tolist() == b[k].tolist() for k in a) and list(a) == list(b)
        for _ in range(runs):
            for sql, times in ((slow_sql, slow_t), (fast_sql, fast_t)):
                t = time.perf_counter()
                engines.execute(sql)
                times.append(time.perf_counter() - t)
        s, f = statistics.median(slow_t), statistics.median(fast_t)
        record["queries"][name] = {"bounded_s": round(s, 4), "fast_path_s": round(f, 4),
                                   "speedup": round(s / f, 2), "same_values": same}
    engines.close()
    return record


def main(argv: list[str] | None = None) -> int:
    """Entry point: parent (spawns one worker per engine) or ``--worker``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="a bench/datagen.py synthetic folder (events.parquet)")
    p.add_argument("--engines", default="duckdb_memory,duckdb_in_place,spark,postgres")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--fast-path", type=Path, help="a bench/datagen.py PUMS folder")
    p.add_argument("--json", type=Path, help="also write the records to this file")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--pg-schema", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.data, args.runs, args.pg_schema)), flush=True)
        return 0
    records = []
    if args.fast_path:
        records.append(fast_path(args.fast_path, args.runs))
        print(json.dumps(records[-1]), flush=True)
    if args.data:
        pg_schema = None
        engines = [e for e in args.engines.split(",") if e]
        try:
            for engine in engines:
                extra = []
                if engine == "postgres":
                    pg_schema, seconds = pg_copy(args.data)
                    print(json.dumps({"engine": "postgres", "copy_into_postgres_s": round(seconds, 1)}), flush=True)
                    extra = ["--pg-schema", pg_schema]
                out = subprocess.run([sys.executable, "-m", "bench.engines_bench", "--worker", engine, "--data",
                                      str(args.data), "--runs", str(args.runs), *extra],
                                     capture_output=True, text=True)
                if out.returncode != 0:
                    print(json.dumps({"engine": engine, "error": out.stderr[-2000:]}), flush=True)
                    continue
                records.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(json.dumps(records[-1]), flush=True)
        finally:
            if pg_schema:
                import psycopg

                with psycopg.connect(PG_URL, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
