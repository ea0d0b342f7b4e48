"""Gateway overhead: ``Gateway.query`` end to end minus the time DuckDB spends on its statements.

Usage::

    python -m bench.datagen --kind pums --rows 1200000 --out bench/.data/pums_1m2
    python -m bench.overhead --data bench/.data/pums_1m2 --runs 15 [--profile 25] [--json out.json]

Issue 20's measure ("Done means"): for a fast-path ``COUNT(*)`` on 1.2M PUMS rows (one row
per person, so the unit-unique fast path applies) the gateway's own work — parse, plan,
calibration, ledger charge (a durable SQLite commit), rendering, OpenDP noise,
post-processing, storing the release — is ``gateway − duckdb``, where

* ``gateway``: the median wall time of ``Gateway.query`` over ``--runs`` cache misses (each run
  asks a distinct ρ·(1 + i·10⁻⁹) so the release cache is bypassed and every run is charged),
  after one warm-up query;
* ``duckdb``: the statements the engine ran in that query (recorded at the DuckDB engine's ``check``
  and ``execute`` and rendered after the timed query), run again directly on the gateway's own DuckDB connection — ``EXPLAIN`` for
  each checked statement, ``to_arrow_table()`` for each executed one — median over the same runs.

``--profile N`` adds a cProfile of the gateway runs and prints the N functions with the largest
cumulative time (where the overhead goes). Other queries: ``--query count_avg`` / ``sum``
(see :data:`bench.latency.QUERIES`). One process, interleaved; this machine is noisy, so read
the medians and the spread together.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency import QUERIES, analyst_sql, query_rho, write_policies


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


class _Recorder:
    """Wraps a DuckDB engine's ``check``/``execute`` to record the rendered statements."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.checked: list[Any] = []
        self.executed: list[Any] = []
        self._check, self._execute = engine.check, engine.execute
        engine.check = self.check
        engine.execute = self.execute

    def check(self, query: Any) -> None:
        self.checked.append(query)  # rendered after the timed query, so the bench adds no work to it
        return self._check(query)

    def execute(self, query: Any) -> Any:
        self.executed.append(query)
        return self._execute(query)

    def reset(self) -> None:
        self.checked.clear()
        self.executed.clear()

    def replay(self) -> float:
        """Milliseconds DuckDB alone takes for the recorded statements (on the engine's connection)."""
        checked = [self.engine.render(q) for q in self.checked]
        executed = [self.engine.render(q) for q in self.executed]
        cursor = self.engine._cursor()  # the bench reads the engine's connection on purpose
        try:
            t = time.perf_counter()
            for sql in checked:
                cursor.execute("EXPLAIN " + sql)
            for sql in executed:
                cursor.sql(sql).to_arrow_table()
            return _ms(t)
        finally:
            cursor.close()


def measure(data: Path, *, runs: int = 15, query: str = "count", profile: int = 0) -> dict[str, Any]:
    """Open a gateway on ``data`` (a ``bench.datagen`` PUMS folder) and time ``query``; return the figures."""
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    tmp = Path(tempfile.mkdtemp(prefix="dpgate-overhead-"))
    try:
        entries = write_policies(data, tmp / "policies", (1,))
        gw = Gateway.open(Settings(policies=tmp / "policies", home=tmp / "home", query_timeout_s=600.0))
        try:
            e = entries[0]
            ds = e["dataset"]
            sql = analyst_sql(e["kind"], query)
            unique = gw.engine.unit_is_unique(ds, e["table"])
            rec = _Recorder(gw.engine.engine(ds))
            rho = query_rho()
            gw.query(ds, sql, consumer="analysts", budget=QueryBudget(rho=rho * 0.5))  # warm-up
            totals: list[float] = []
            duck: list[float] = []
            prof = cProfile.Profile() if profile else None
            for i in range(runs):
                rec.reset()
                budget = QueryBudget(rho=rho * (1 + (i + 1) * 1e-9))
                if prof:
                    prof.enable()
                t = time.perf_counter()
                release = gw.query(ds, sql, consumer="analysts", budget=budget)
                totals.append(_ms(t))
                if prof:
                    prof.disable()
                assert release["cached"] is False, "the release cache was hit"
                duck.append(rec.replay())
            overhead = [t - d for t, d in zip(totals, duck)]
            out: dict[str, Any] = {
                "dataset": ds, "rows": e["rows"], "query": sql, "unit_unique_fast_path": unique, "runs": runs,
                "gateway_ms": statistics.median(totals), "duckdb_ms": statistics.median(duck),
                "overhead_ms": statistics.median(overhead),
                "overhead_ms_min_max": [min(overhead), max(overhead)],
                "statements": {"checked": len(rec.checked), "executed": len(rec.executed)},
            }
            if prof:
                s = io.StringIO()
                pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(profile)
                out["profile"] = s.getvalue()
            return out
        finally:
            gw.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=Path("bench/.data/pums_1m2"),
                   help="a bench.datagen PUMS folder (default bench/.data/pums_1m2)")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--query", choices=tuple(QUERIES), default="count")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="print the N top cumulative functions")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    if not (a.data / "manifest.json").exists():
        print(f"{a.data}: no manifest.json; generate it with python -m bench.datagen --kind pums "
              f"--rows 1200000 --out {a.data}", file=sys.stderr)
        return 2
    out = measure(a.data, runs=a.runs, query=a.query, profile=a.profile)
    text = out.pop("profile", None)
    print(json.dumps(out, indent=2))
    if text:
        print(text)
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
