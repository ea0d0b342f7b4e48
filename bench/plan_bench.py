"""Benchmark of parsing and planning: :func:`dpgate.sql.parse.parse_query` over the analyst
corpus (``tests/corpus/queries.toml``).

    python bench/plan_bench.py [--runs 15]

For every corpus query whose fixture policy loads (the SmartNoise datasets need
``../shared/data``; without it they are left out and the count says so), times
``parse_query(sql, policy, dialect=…)`` — sqlglot parsing, the statement rules (CTE and
subquery inlining), the allow-list, computed-key domains and the canonical plan and hash —
``--runs`` times and keeps the query's median. Prints the median and the p99 over queries,
for answered queries and for refusals (a refusal raises before any engine sees the query),
plus the slowest queries. Reads no data; executes nothing but the in-memory DuckDB used to
enumerate computed-key domains (whose results are cached per expression: the first run of
such a query is reported separately as ``cold``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dpgate.errors import DpgateError  # noqa: E402
from dpgate.policy import PolicyError, load_policy  # noqa: E402
from dpgate.sql import keys as key_domains  # noqa: E402
from dpgate.sql.parse import parse_query  # noqa: E402
import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)
from tests.corpus.harness import POLICY_DIR, SHARED_DATASETS, load_corpus, shared_data_dir  # noqa: E402


def _policies(work: Path, smartnoise: Path | None) -> dict:
    paths = {"smartnoise": str(smartnoise) if smartnoise else "/nonexistent",
             "usage": str(work / "usage"), "library": str(work / "library")}
    out = {}
    for template in sorted(POLICY_DIR.glob("*.toml")):
        if template.stem in SHARED_DATASETS and smartnoise is None:
            continue
        text = template.read_text()
        for key, value in paths.items():
            text = text.replace("{" + key + "}", value)
        target = work / template.name
        target.write_text(text)
        tomllib.loads(text)
        try:
            out[template.stem] = load_policy(target)
        except PolicyError:
            continue
    return out


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main() -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpgate-plan-bench-"))
    try:
        policies = _policies(work, shared_data_dir())
        queries = [q for q in load_corpus() if q.dataset in policies]
        answered: list[float] = []
        refused: list[float] = []
        cold: list[float] = []
        slowest: list[tuple[float, str]] = []
        key_domains._enumerate_with.cache_clear()
        for q in queries:
            policy = policies[q.dataset]
            times = []
            ok = True
            for i in range(args.runs):
                t0 = time.perf_counter()
                try:
                    plan = parse_query(q.sql, policy, dialect=q.dialect)
                except DpgateError:
                    ok = False
                elapsed = (time.perf_counter() - t0) * 1000
                if i == 0 and ok and plan.computed_keys:
                    cold.append(elapsed)
                    continue
                times.append(elapsed)
            med = statistics.median(times)
            (answered if ok else refused).append(med)
            slowest.append((med, q.id))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = answered + refused
    print(f"corpus queries planned: {len(total)} of {len(load_corpus())} "
          f"({len(answered)} planned, {len(refused)} refused by the planner); runs = {args.runs}")
    print("| queries | n | median ms | p99 ms | max ms |")
    print("|---|---|---|---|---|")
    for name, vals in (("all", total), ("planned", answered), ("refused", refused),
                       ("computed keys, cold (first run)", cold)):
        if vals:
            print(f"| {name} | {len(vals)} | {statistics.median(vals):.2f} | {_pct(vals, 99):.2f} "
                  f"| {max(vals):.2f} |")
    print("slowest:", ", ".join(f"{i} {t:.1f} ms" for t, i in sorted(slowest, reverse=True)[:5]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
