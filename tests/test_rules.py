"""Rewrite rules (dpgate.sql.rules), each alone, with golden files; then through the planner:
an inlined CTE or subquery has the flat query's plan and plan hash (issue 10 item 6).

Regenerate the golden file after an intended change with::

    DPGATE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/test_rules.py

and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import sqlglot

from dpgate.errors import UnknownColumn, UnsupportedQuery
from dpgate.sql import rules
from dpgate.sql.parse import parse_query

HERE = Path(__file__).parent
GOLDEN = HERE / "fixtures" / "golden" / "rules.json"
UPDATE = os.environ.get("DPGATE_UPDATE_GOLDEN") == "1"

CASES = {
    "inline_ctes": {
        "one": "WITH recent AS (SELECT * FROM prompts WHERE age > 30) SELECT COUNT(*) FROM recent",
        "chained": "WITH a AS (SELECT * FROM prompts WHERE age > 30), b AS (SELECT region FROM a) "
                   "SELECT region, COUNT(*) FROM b GROUP BY region",
        "aliased_use": "WITH r AS (SELECT * FROM prompts) SELECT COUNT(*) FROM r AS x WHERE x.age > 1",
        "unused": "WITH r AS (SELECT * FROM pums) SELECT COUNT(*) FROM prompts",
        "shadows_table": "WITH prompts AS (SELECT * FROM prompts WHERE flagged) "
                         "SELECT COUNT(*) FROM prompts",
        "none": "SELECT COUNT(*) FROM prompts",
    },
    "or_equalities_to_in": {
        "same_column": "SELECT COUNT(*) FROM prompts WHERE age = 1 OR age = 2 OR 3 = age",
        "with_in": "SELECT COUNT(*) FROM prompts WHERE region = 'eu' OR region IN ('us', 'apac')",
        "nested_in_and": "SELECT COUNT(*) FROM prompts WHERE flagged AND (week = 1 OR week = 2)",
        "mixed_columns": "SELECT COUNT(*) FROM prompts WHERE age = 1 OR week = 2",
        "not_equalities": "SELECT COUNT(*) FROM prompts WHERE age = 1 OR age > 90",
        "parenthesised": "SELECT COUNT(*) FROM prompts WHERE (age = 1 OR age = 2) OR (age = 3)",
    },
    "merge_derived_tables": {
        "star": "SELECT COUNT(*) FROM (SELECT * FROM prompts) AS s",
        "star_unaliased": "SELECT COUNT(*) FROM (SELECT * FROM prompts)",
        "where_both": "SELECT COUNT(*) FROM (SELECT * FROM prompts WHERE age > 30) AS s "
                      "WHERE s.region = 'eu'",
        "renames": "SELECT r, SUM(t) FROM (SELECT region AS r, tokens AS t FROM prompts p "
                   "WHERE p.age > 3) s GROUP BY r",
        "computed": "SELECT COUNT(*) FROM (SELECT age + 1 AS a1 FROM prompts) s WHERE a1 * 2 > 10",
        "nested": "SELECT COUNT(*) FROM (SELECT * FROM (SELECT * FROM prompts WHERE age > 1) a "
                  "WHERE age < 90) b WHERE flagged",
        "order_alias": "SELECT region, COUNT(*) AS n FROM (SELECT * FROM prompts) s "
                       "GROUP BY region ORDER BY n DESC",
        "qualified_dataset": "SELECT COUNT(*) FROM (SELECT * FROM planner.prompts) s",
    },
}


def _apply(rule: str, sql: str) -> str:
    stmt = sqlglot.parse_one(sql, read="duckdb")
    before = stmt.sql()
    out = getattr(rules, rule)(stmt)
    assert stmt.sql() == before, "a rule must not modify its input"
    return out.sql(dialect="duckdb")


def test_rules_golden():
    got = {rule: {name: {"in": sql, "out": _apply(rule, sql)} for name, sql in cases.items()}
           for rule, cases in CASES.items()}
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if UPDATE or not GOLDEN.exists():
        GOLDEN.write_text(text)
    assert json.loads(GOLDEN.read_text()) == got


def test_rules_are_idempotent():
    for rule, cases in CASES.items():
        for sql in cases.values():
            once = _apply(rule, sql)
            assert _apply(rule, once) == once


# --- through the planner: the flat query's plan -----------------------------------------------


FLAT = ("SELECT region, COUNT(*) AS n, SUM(tokens) FROM prompts WHERE age > 30 AND model = 'x' "
        "GROUP BY region")
SAME_AS_FLAT = [
    "WITH recent AS (SELECT * FROM prompts WHERE age > 30) SELECT region, COUNT(*) AS n, "
    "SUM(tokens) FROM recent WHERE model = 'x' GROUP BY region",
    "SELECT s.region, COUNT(*) AS n, SUM(s.tokens) FROM (SELECT * FROM prompts WHERE model = 'x') "
    "AS s WHERE s.age > 30 GROUP BY s.region",
    "SELECT r, COUNT(*) AS n, SUM(t) FROM (SELECT region AS r, tokens AS t, age FROM "
    "(SELECT * FROM prompts p WHERE p.age > 30) q WHERE model = 'x') s GROUP BY r",
    "WITH a AS (SELECT * FROM prompts WHERE age > 30), b AS (SELECT * FROM a WHERE model = 'x') "
    "SELECT region, COUNT(*) AS total, SUM(tokens) FROM b GROUP BY 1",
    "select REGION, count(*) n, sum(TOKENS) from (select * from planner.prompts) x where "
    "model = 'x' and 30 < age group by region",
]


@pytest.mark.parametrize("sql", SAME_AS_FLAT)
def test_inlined_query_has_the_flat_plan_hash(policy, sql):
    flat = parse_query(FLAT, policy)
    plan = parse_query(sql, policy)
    assert plan == flat
    assert plan.plan_hash == flat.plan_hash
    assert plan.canonical_sql == flat.canonical_sql


def test_titles_are_the_analysts(policy):
    plan = parse_query("SELECT r, SUM(t) FROM (SELECT region AS r, tokens AS t FROM prompts) s "
                       "GROUP BY r", policy)
    assert [o.label for o in plan.visible_outputs] == ["r", "SUM(t)"]


REFUSED = [
    # per-unit subqueries (dpgate.sql.per_unit, tests/test_per_unit.py) group by the unit only
    ("SELECT COUNT(*) FROM (SELECT user_id, SUM(tokens) AS s FROM prompts GROUP BY user_id "
     "HAVING SUM(tokens) > 5) x", UnsupportedQuery, "HAVING inside a per-unit subquery"),
    ("SELECT COUNT(*) FROM (SELECT SUM(tokens) AS s FROM prompts) x", UnsupportedQuery,
     "may only GROUP BY the privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT * FROM prompts LIMIT 10) x", UnsupportedQuery,
     "LIMIT inside a subquery"),
    ("SELECT COUNT(*) FROM (SELECT DISTINCT region FROM prompts) x", UnsupportedQuery,
     "SELECT DISTINCT inside a subquery"),
    ("SELECT COUNT(*) FROM (SELECT * FROM prompts JOIN pums ON TRUE) x", UnsupportedQuery,
     "SELECT * in a subquery with joins"),
    ("SELECT COUNT(*) FROM (SELECT * FROM prompts UNION ALL SELECT * FROM prompts) x",
     UnsupportedQuery, "only a plain SELECT"),
    ("WITH RECURSIVE r AS (SELECT * FROM prompts) SELECT COUNT(*) FROM r", UnsupportedQuery,
     "RECURSIVE"),
    # a column list is moved into the CTE as aliases (rule column_lists): only a wrong count is refused
    ("WITH r(a, b) AS (SELECT age FROM prompts) SELECT COUNT(*) FROM r", UnsupportedQuery,
     "names 2 columns, the query selects 1"),
    ("SELECT SUM(s.nope) FROM (SELECT age AS a FROM prompts) s", UnknownColumn, "no column 'nope'"),
    ("SELECT COUNT(*) FROM (SELECT age, age FROM prompts) s", UnsupportedQuery, "two columns"),
    ("SELECT COUNT(*) FROM prompts WHERE age IN (SELECT age FROM prompts)", UnsupportedQuery,
     "does not prove that the subquery reads only the outer row's own privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT row_number() OVER () AS r FROM prompts) s", UnsupportedQuery,
     "window"),
    # The privacy unit stays refused wherever it is renamed to.
    ("SELECT u, COUNT(*) FROM (SELECT user_id AS u FROM prompts) s GROUP BY u", UnsupportedQuery,
     "privacy unit"),
]


@pytest.mark.parametrize("sql, error, text", REFUSED)
def test_subqueries_that_do_more_are_refused(policy, sql, error, text):
    with pytest.raises(error) as e:
        parse_query(sql, policy)
    assert text in str(e.value)


def test_deep_nesting_is_refused_clearly(policy):
    sql = "SELECT * FROM prompts"
    for i in range(rules.MAX_DEPTH + 2):
        sql = f"SELECT * FROM ({sql}) s{i}"
    sql = "SELECT COUNT(*)" + sql[len("SELECT *"):]
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    assert f"nests subqueries more than {rules.MAX_DEPTH} levels deep" in str(e.value)
    assert e.value.details["reason"] == "nesting" and e.value.details["max"] == rules.MAX_DEPTH


def test_a_column_the_subquery_does_not_project_is_unknown(policy):
    with pytest.raises(UnknownColumn) as e:
        parse_query("SELECT SUM(tokens) FROM (SELECT age FROM prompts) s", policy)
    assert "has no column 'tokens'" in str(e.value)


def test_a_long_or_of_values_plans_like_the_in_list(policy):
    """A 1,000-value OR (nested 1,000 levels in the syntax tree) plans like the IN it means."""
    ors = parse_query("SELECT COUNT(*) FROM prompts WHERE "
                      + " OR ".join(f"age = {i}" for i in range(1000)), policy)
    ins = parse_query("SELECT COUNT(*) FROM prompts WHERE age IN ("
                      + ", ".join(str(i) for i in range(1000)) + ")", policy)
    assert ors.plan_hash == ins.plan_hash


def test_a_long_chain_of_other_conditions_gets_a_clear_limit(policy):
    sql = "SELECT COUNT(*) FROM prompts WHERE " + " OR ".join(
        f"(age = {i} AND region = 'eu')" for i in range(350))
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    msg = str(e.value)
    assert "nests" in msg and "200" in msg and "IN (" in msg and "nothing was charged" in msg
