"""Planning parses the analyst's text once and no generated SQL (issue 20, "compile once"):
the canonical SQL, the policy digest's columns and the plan's expressions come from the
compiler's own trees (:mod:`dpgate.sql.compile`), not from parsing the plan's text back.

Counted at ``Dialect.parse`` (what ``sqlglot.parse``, ``parse_one`` and ``exp.maybe_parse``
reach), as in tests/test_parse_count.py; ``bench/plan_parses.py`` gives the corpus figure.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import sqlglot
from sqlglot.dialects.dialect import Dialect

import dpgate
from dpgate.policy import load_policy
from dpgate.sql.parse import parse_query

POLICY = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"
#: Modules still parsing generated SQL while planning, not counted here: none (sql/narrow.py reads
#: the plan's WHERE tree since issue 20 step 3).
PENDING: tuple[str, ...] = ()
#: Frames of dpgate itself (not of a venv inside a checkout whose path contains "/dpgate/").
PACKAGE = str(Path(dpgate.__file__).resolve().parent)


@pytest.fixture
def parses(monkeypatch):
    seen: list[str] = []
    original = Dialect.parse

    def counted(self, sql, *args, **kwargs):
        frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PACKAGE)]
        if not frames or not frames[-1].filename.endswith(PENDING):
            seen.append(sql)
        return original(self, sql, *args, **kwargs)

    sqlglot.parse_one("SELECT 1", read="duckdb").sql(dialect="duckdb")  # sqlglot's own templates, once
    monkeypatch.setattr(Dialect, "parse", counted)
    return seen


@pytest.mark.parametrize("sql", [
    "SELECT region, COUNT(*) AS n, SUM(tokens) * 2 AS twice FROM prompts WHERE age > 30 AND region <> 'eu' "
    "GROUP BY region HAVING COUNT(*) > 10 AND AVG(tokens) < 5 ORDER BY twice DESC LIMIT 3",
    "SELECT CASE WHEN age > 40 THEN 'old' ELSE 'young' END AS band, COUNT(DISTINCT user_id) FROM prompts "
    "GROUP BY band HAVING COUNT(DISTINCT user_id) > 1",
    "SELECT week, SUM(CASE WHEN flagged THEN tokens ELSE 0 END) / COUNT(*) AS share FROM prompts "
    "WHERE tokens BETWEEN 1 AND 100 GROUP BY week",
])
def test_planning_parses_only_the_analysts_text(parses, sql):
    policy = load_policy(POLICY)
    plan = parse_query(sql, policy)
    assert plan.canonical_sql and plan.plan_hash
    assert parses == [sql], f"generated SQL parsed while planning: {parses[1:]}"
