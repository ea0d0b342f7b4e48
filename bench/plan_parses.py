"""Parses of generated SQL while planning: every ``Dialect.parse`` call inside
:func:`dpgate.sql.parse.parse_query` over the analyst corpus (``tests/corpus/queries.toml``)
other than the analyst's own text, by the dpgate function that made it.

    python bench/plan_parses.py

Issue 20's target is zero (the analyst's text parsed once, nothing generated parsed again);
``tests/test_parse_count.py`` pins the per-query figures of the whole gateway.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import sqlglot  # noqa: E402
from sqlglot.dialects.dialect import Dialect  # noqa: E402

from bench.plan_bench import _policies  # noqa: E402
from dpgate.errors import DpgateError  # noqa: E402
from dpgate.sql.parse import DIALECTS, parse_query  # noqa: E402
import dpgate.pipeline.planning  # noqa: E402,F401 - installs the planner's table-less evaluator (dpgate.sql.evaluation)
from tests.corpus.harness import load_corpus, shared_data_dir  # noqa: E402


def main() -> int:
    """Count and print the generated parses, total and by caller."""
    calls: Counter[str] = Counter()
    state: dict = {"on": False, "depth": 0, "sql": None}
    original = Dialect.parse

    def counted(self, sql, *args, **kwargs):
        if state["on"] and state["depth"] == 0 and sql != state["sql"]:
            frames = [f for f in traceback.extract_stack()[:-1] if "/dpgate/" in f.filename]
            calls[f"{Path(frames[-1].filename).name}:{frames[-1].name}" if frames else "?"] += 1
        state["depth"] += 1
        try:
            return original(self, sql, *args, **kwargs)
        finally:
            state["depth"] -= 1

    policies = _policies(Path(tempfile.mkdtemp(prefix="dpgate-plan-parses-")), shared_data_dir())
    for dialect in DIALECTS:  # sqlglot parses its own templates once per process, on first use
        sqlglot.parse_one("SELECT 1", read=dialect).sql(dialect=dialect)
    Dialect.parse = counted
    planned = 0
    try:
        for q in load_corpus():
            if q.dataset not in policies:
                continue
            state["sql"], state["on"] = q.sql, True
            try:
                parse_query(q.sql, policies[q.dataset], dialect=q.dialect)
                planned += 1
            except DpgateError:
                pass
            finally:
                state["on"] = False
    finally:
        Dialect.parse = original
    print(f"corpus queries planned: {planned}; parses of generated SQL while planning them: {sum(calls.values())}")
    for caller, n in calls.most_common():
        print(f"  {n:5d}  {caller}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
