"""Golden files: SQL → plan JSON and bounded SQL template (tests/fixtures/golden/).

Regenerate after an intended change with::

    DPGATE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_parse_golden.py

and review the diff: every change to a plan, a hash or the bounded SQL shows up there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dpgate.policy import load_policy
from dpgate.sql.explain import explain_query

HERE = Path(__file__).parent
GOLDEN = HERE / "fixtures" / "golden"
POLICY = HERE / "fixtures" / "policies" / "planner.toml"
UPDATE = os.environ.get("DPGATE_UPDATE_GOLDEN") == "1"

QUERIES = {
    "count_star": "SELECT COUNT(*) FROM prompts",
    "count_forms": "SELECT COUNT(*), COUNT(1), COUNT(user_id), COUNT(model), "
                   "COUNT(DISTINCT user_id) FROM prompts",
    "sum_avg": "SELECT SUM(tokens), AVG(tokens) FROM prompts",
    "variance_stddev": "SELECT VAR_POP(latency), VARIANCE(latency), STDDEV(latency) FROM prompts",
    "group_region": "SELECT region, COUNT(*) AS n, AVG(tokens) AS avg_tokens FROM prompts "
                    "GROUP BY region",
    "group_region_week": "SELECT region, week, COUNT(*), SUM(tokens) FROM prompts "
                         "GROUP BY region, week",
    "group_week_range": "SELECT week, COUNT(DISTINCT user_id) FROM prompts GROUP BY 1",
    "group_bool": "SELECT flagged, COUNT(*), SUM(age) FROM prompts GROUP BY flagged",
    "hidden_key": "SELECT COUNT(*) FROM prompts GROUP BY region",
    "where_simple": "SELECT COUNT(*) FROM prompts WHERE 30 < age AND region = 'eu'",
    "where_or_in_between": "SELECT COUNT(*) FROM prompts WHERE region IN ('us', 'eu') OR "
                           "(age BETWEEN 18 AND 65 AND NOT flagged)",
    "where_functions": "SELECT COUNT(*) FROM prompts WHERE lower(trim(model)) LIKE 'gpt%' AND "
                       "length(model) > 3 AND coalesce(TRY_CAST(model AS BIGINT), 0) = 0",
    "where_arithmetic": "SELECT SUM(tokens) FROM prompts WHERE abs(age - 40) * 2 < latency",
    "where_nulls": "SELECT COUNT(*) FROM prompts WHERE model IS NOT NULL AND latency IS NULL",
    "where_false": "SELECT region, COUNT(*) FROM prompts WHERE 1 = 0 GROUP BY region",
    "having_alias": "SELECT region, COUNT(*) AS n FROM prompts GROUP BY region HAVING n > 10",
    "having_hidden": "SELECT region, COUNT(*) FROM prompts GROUP BY region "
                     "HAVING AVG(tokens) BETWEEN 100 AND 2000",
    "order_limit": "SELECT region, SUM(tokens) AS s FROM prompts GROUP BY region "
                   "ORDER BY s DESC LIMIT 3",
    "order_hidden": "SELECT week, COUNT(*) FROM prompts GROUP BY week ORDER BY STDDEV(tokens)",
    "record_level": "SELECT sex, COUNT(*), AVG(income), VAR_POP(age) FROM pums GROUP BY sex",
    "record_level_where": "SELECT married, SUM(income) FROM pums WHERE age >= 18 GROUP BY married",
    "k1_count_distinct": "SELECT kind, COUNT(user_id), COUNT(DISTINCT user_id) FROM ev "
                         "GROUP BY kind",
    "count_columns": "SELECT COUNT(*), COUNT(a), COUNT(b) FROM sv",
    "wide_bounds": "SELECT SUM(x), AVG(x) FROM fx",
    # issue 24: a WHERE on key columns narrows the released keys (weeks 0-3, regions eu and us);
    # the only golden plans with ``narrowed_keys`` (every other hash is unchanged)
    "where_narrows_keys": "SELECT week, region, COUNT(*) FROM prompts WHERE week < 4 AND "
                          "region IN ('eu', 'us') AND age > 30 GROUP BY week, region",
}


def render(name: str, sql: str, policy) -> tuple[str, str]:
    result = explain_query(sql, policy)
    doc = {
        "sql": sql,
        "canonical_sql": result["canonical_sql"],
        "plan_hash": result["plan_hash"],
        "columns": result["columns"],
        "plan": result["plan"],
        "sensitivities": result["sensitivities"],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n", result["bounded_sql"] + "\n"


def test_enough_golden_queries():
    assert len(QUERIES) >= 20


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_golden(name):
    policy = load_policy(POLICY)
    plan_text, sql_text = render(name, QUERIES[name], policy)
    plan_file, sql_file = GOLDEN / f"{name}.plan.json", GOLDEN / f"{name}.bounded.sql"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        plan_file.write_text(plan_text)
        sql_file.write_text(sql_text)
    assert plan_file.exists(), f"missing {plan_file}; run with DPGATE_UPDATE_GOLDEN=1"
    assert plan_file.read_text() == plan_text
    assert sql_file.read_text() == sql_text


def test_every_golden_query_runs_on_empty_tables():
    """The bounded SQL of every golden query executes in DuckDB: one row per key combination."""
    import duckdb

    from dpgate.sql.bound import bounded_sql
    from dpgate.sql.parse import parse_query
    from test_bound import load

    policy = load_policy(POLICY)
    con = duckdb.connect()
    for table in policy.tables:
        load(con, policy, table, [])
    for name, sql in QUERIES.items():
        plan = parse_query(sql, policy)
        res = con.execute(bounded_sql(plan, policy, salt=42))
        rows = res.fetchall()
        expected = plan.key_combinations(policy.table(plan.table))
        assert len(rows) == expected, name
        assert [d[0] for d in res.description] == list(plan.group_by) + [
            p.id for p in plan.primitives]
        assert all(v == 0 for r in rows for v in r[len(plan.group_by):]), name
