"""The SQL planner: allow-list, refusals, plan structure and canonical hashing (dpgate.sql.parse)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dpgate.errors import InvalidSql, UnknownColumn, UnknownTable, UnsupportedQuery
from dpgate.policy import load_policy, parse_policy
from dpgate.sql.parse import parse_query
from dpgate.postprocess import evaluate_predicate
from dpgate.sql.plan import AggregateOutput, KeyOutput, QueryPlan

FIXTURE = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"


def plan(sql, policy):
    return parse_query(sql, policy)


# --- refusals ---------------------------------------------------------------------------------

REFUSED = [
    # (sql, error class, text the message must contain)
    ("SELECT * FROM prompts", UnsupportedQuery, "SELECT *"),
    ("SELECT prompts.* FROM prompts", UnsupportedQuery, "SELECT *"),
    ("SELECT model, COUNT(*) FROM prompts", UnsupportedQuery, "raw column 'model'"),
    ("SELECT region, COUNT(*) FROM prompts", UnsupportedQuery, "raw column 'region'"),
    ("SELECT age FROM prompts", UnsupportedQuery, "raw column 'age'"),
    ("SELECT user_id, COUNT(*) FROM prompts GROUP BY user_id", UnsupportedQuery,
     "GROUP BY the privacy unit (user_id)"),
    ("SELECT COUNT(*) FROM prompts GROUP BY user_id", UnsupportedQuery, "privacy unit (user_id)"),
    ("SELECT SUM(user_id) FROM prompts", UnsupportedQuery, "SUM(user_id)"),
    ("SELECT AVG(user_id) FROM prompts", UnsupportedQuery, "privacy unit"),
    # COUNT(DISTINCT <column>) of a non-unit column is planned (issue 11; tests/test_count_distinct.py)
    ("SELECT COUNT(DISTINCT lower(model)) FROM prompts", UnsupportedQuery, "one bare declared column"),
    ("SELECT SUM(CASE WHEN user_id = 42 THEN tokens * 1000000 ELSE 0 END) FROM prompts",
     UnsupportedQuery, "privacy unit column"),
    ("SELECT SUM(tokens / age) FROM prompts", UnsupportedQuery, "contains 0"),
    ("SELECT SUM(LENGTH(model)) FROM prompts", UnsupportedQuery, "LENGTH(model) is unbounded"),
    ("SELECT SUM(tokens * 1e300) FROM prompts", UnsupportedQuery, "1e300 is unbounded (a literal beyond ±1e+100"),
    ("SELECT SUM(tokens * model) FROM prompts", UnsupportedQuery, "arithmetic needs"),
    ("SELECT SUM(DISTINCT tokens) FROM prompts", UnsupportedQuery, "SUM(DISTINCT tokens)"),
    ("SELECT SUM(week) FROM prompts", UnsupportedQuery, "'week' has no bounds"),
    ("SELECT AVG(week) FROM prompts", UnsupportedQuery, "AVG(week)"),
    ("SELECT SUM(model) FROM prompts", UnsupportedQuery, "'model' is text"),
    # GROUP BY a column without public keys is planned for private partition selection
    # (issue 11; tests/test_partition_selection.py)
    ("SELECT COUNT(*) FROM prompts GROUP BY lower(model)", UnsupportedQuery,
     "do not follow from the policy"),
    ("SELECT COUNT(*) FROM prompts GROUP BY ROLLUP (region)", UnsupportedQuery, "ROLLUP"),
    ("SELECT *, COUNT(*) FROM prompts GROUP BY ALL", UnsupportedQuery, "GROUP BY ALL with SELECT *"),
    ("SELECT COUNT(*) FROM prompts JOIN pums ON TRUE", UnsupportedQuery, "JOIN"),
    ("SELECT COUNT(*) FROM prompts, pums", UnsupportedQuery, "JOIN"),
    ("SELECT COUNT(*) FROM (SELECT region, COUNT(*) AS c FROM prompts GROUP BY region) AS s",
     UnsupportedQuery, "may only GROUP BY the privacy unit"),
    ("SELECT COUNT(*) FROM prompts WHERE age IN (SELECT age FROM pums)", UnsupportedQuery,
     "does not prove that the subquery reads only the outer row's own privacy unit"),
    ("SELECT COUNT(*) FROM prompts WHERE model IN ()", UnsupportedQuery, "IN needs at least one value"),
    ("SELECT COUNT(*) FROM prompts WHERE EXISTS (SELECT 1)", UnsupportedQuery, "EXISTS"),
    ("(SELECT COUNT(*) FROM prompts)", UnsupportedQuery, "subqueries"),
    ("WITH a AS (SELECT * FROM prompts LIMIT 5) SELECT COUNT(*) FROM a", UnsupportedQuery,
     "LIMIT inside a subquery"),
    ("SELECT COUNT(*) FROM prompts UNION SELECT COUNT(*) FROM pums", UnsupportedQuery, "UNION"),
    ("SELECT COUNT(*) FROM prompts INTERSECT SELECT COUNT(*) FROM pums", UnsupportedQuery,
     "INTERSECT"),
    ("SELECT COUNT(*) FROM prompts EXCEPT SELECT COUNT(*) FROM pums", UnsupportedQuery, "EXCEPT"),
    ("SELECT COUNT(*) OVER () FROM prompts", UnsupportedQuery, "window functions"),
    ("SELECT region, SUM(tokens) OVER (PARTITION BY region) FROM prompts GROUP BY region",
     UnsupportedQuery, "window functions"),
    ("SELECT COUNT(*) FROM read_csv('/etc/passwd')", UnsupportedQuery, "READ_CSV('/etc/passwd')"),
    ("SELECT COUNT(*) FROM read_parquet('x.parquet')", UnsupportedQuery, "table functions"),
    ("SELECT COUNT(*) FROM range(10)", UnsupportedQuery, "table functions"),
    ("SELECT COUNT(*) FROM prompts WHERE random() < 0.5", UnsupportedQuery, "RANDOM()"),
    ("SELECT random() FROM prompts", UnsupportedQuery, "RANDOM()"),
    ("SELECT COUNT(*) FROM prompts WHERE setseed(0.5) IS NULL", UnsupportedQuery, "SETSEED(0.5)"),
    ("SELECT COUNT(*) FROM prompts WHERE getenv('HOME') = 'x'", UnsupportedQuery, "GETENV"),
    ("SELECT COUNT(*) FROM prompts WHERE regexp_matches(model, 'x')", UnsupportedQuery,
     "REGEXP"),
    ("SELECT COUNT(*) FROM prompts WHERE 1/(tokens-12345) > 0", UnsupportedQuery, "division"),
    ("SELECT COUNT(*) FROM prompts WHERE age % 2 = 0", UnsupportedQuery, "modulo"),
    ("SELECT COUNT(*) FROM prompts WHERE age // 2 = 0", UnsupportedQuery, "division"),
    ("SELECT COUNT(*) FROM prompts WHERE CAST(model AS DECIMAL(10, 2)) = 1", UnsupportedQuery,
     "TRY_CAST to DECIMAL"),
    ("SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS DECIMAL(10, 2)) = 1",
     UnsupportedQuery, "TRY_CAST to DECIMAL"),
    ("SELECT COUNT(*) FROM prompts WHERE CASE WHEN age > 3 THEN TRUE END", UnsupportedQuery,
     "CASE"),
    ("SELECT COUNT(*) FROM prompts WHERE age = 'abc'", UnsupportedQuery, "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE model = 1", UnsupportedQuery, "incompatible types"),
    ("SELECT COUNT(*) FROM prompts WHERE age IN (1, 'a')", UnsupportedQuery, "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE age LIKE '1%'", UnsupportedQuery, "LIKE needs a text"),
    ("SELECT COUNT(*) FROM prompts WHERE model LIKE 'a!%' ESCAPE '!'", UnsupportedQuery, "ESCAPE"),
    ("SELECT COUNT(*) FROM prompts WHERE lower(age) = 'a'", UnsupportedQuery, "LOWER needs a text"),
    ("SELECT COUNT(*) FROM prompts WHERE age", UnsupportedQuery, "WHERE must be a condition"),
    ("SELECT COUNT(*) FROM prompts WHERE COUNT(*) > 1", UnsupportedQuery, "use HAVING"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens > 1e400", UnsupportedQuery, "1e400"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens > 1e308 * 10", UnsupportedQuery, "finite"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 99999999999999999999", UnsupportedQuery,
     "64-bit range"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens > 'nan'::DOUBLE", UnsupportedQuery, "CAST"),
    ("SELECT COUNT(*) FROM prompts WHERE age > ?", UnsupportedQuery, "query parameters"),
    ("SELECT COUNT(*) FROM prompts WHERE age > $1", UnsupportedQuery, "query parameters"),
    ("SELECT COUNT(DISTINCT user_id) FILTER (WHERE age > 3) FROM prompts", UnsupportedQuery,
     "FILTER"),
    # MIN/MAX/MEDIAN are DP quantiles since issue 12 (tests/test_quantiles.py); on a text
    # column or an unbounded one they are still refused
    ("SELECT MIN(model) FROM prompts", UnsupportedQuery, "not numeric"),
    ("SELECT MEDIAN(model) FROM prompts", UnsupportedQuery, "MEDIAN(model)"),
    ("SELECT MODE(age) FROM prompts", UnsupportedQuery, "MODE(age)"),
    # (COUNT(*) + 1 and SUM(tokens) / COUNT(*) are select-list post-processing now: test_service)
    ("SELECT 1 FROM prompts", UnsupportedQuery, "computes no aggregate"),
    ("SELECT DISTINCT region, COUNT(*) FROM prompts GROUP BY region", UnsupportedQuery,
     "SELECT DISTINCT"),
    ("SELECT COUNT(*) FROM prompts QUALIFY TRUE", UnsupportedQuery, "QUALIFY"),
    ("SELECT COUNT(*) FROM prompts LIMIT 1 OFFSET week", UnsupportedQuery, "OFFSET must be a non-negative integer"),
    ("SELECT COUNT(*) FROM prompts LIMIT -1", UnsupportedQuery, "LIMIT must be a non-negative"),
    ("SELECT COUNT(*) FROM prompts LIMIT 1.5", UnsupportedQuery, "LIMIT must be"),
    ("SELECT COUNT(*) FROM prompts LIMIT '3'", UnsupportedQuery, "LIMIT must be"),
    ("SELECT COUNT(*) FROM prompts LIMIT ALL", UnsupportedQuery, "LIMIT must be"),
    ("SELECT COUNT(*) FROM prompts USING SAMPLE 10", UnsupportedQuery, "SAMPLE"),
    ("SELECT COUNT(*) FROM prompts TABLESAMPLE 10%", UnsupportedQuery, "TABLESAMPLE"),
    ("SELECT COUNT(*) FROM prompts AS p(a, b)", UnsupportedQuery, "column aliases"),
    ("SELECT COUNT(*) FROM prompts ORDER BY random()", UnsupportedQuery, "RANDOM()"),
    ("SELECT COUNT(*) FROM prompts ORDER BY age", UnsupportedQuery, "raw column"),
    ("SELECT COUNT(*) FROM prompts ORDER BY 2", UnsupportedQuery, "ORDER BY position 2"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY 3", UnsupportedQuery, "GROUP BY position 3"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region HAVING age > 3", UnsupportedQuery,
     "raw column"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region HAVING lower(region) = 'eu'",
     UnsupportedQuery, "not supported in HAVING"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region HAVING region > 5", UnsupportedQuery,
     "incompatible types"),
    ("SELECT region, COUNT(*) AS n, SUM(tokens) AS n FROM prompts GROUP BY region HAVING n > 1",
     UnsupportedQuery, "ambiguous"),
    ("SELECT COUNT(NULL) FROM prompts", UnsupportedQuery, "COUNT(NULL)"),
    ("SELECT VAR_POP(x) FROM fx", UnsupportedQuery, "more than 2**31 steps"),
    ("SELECT STDDEV(x) FROM fx", UnsupportedQuery, "STDDEV(x)"),
    # statements other than one SELECT
    ("INSERT INTO prompts VALUES (1)", UnsupportedQuery, "INSERT"),
    ("UPDATE prompts SET age = 1", UnsupportedQuery, "UPDATE"),
    ("DELETE FROM prompts", UnsupportedQuery, "DELETE"),
    ("DROP TABLE prompts", UnsupportedQuery, "DROP"),
    ("CREATE TABLE x AS SELECT COUNT(*) FROM prompts", UnsupportedQuery, "CREATE"),
    ("COPY prompts TO '/tmp/x.csv'", UnsupportedQuery, "COPY"),
    ("ATTACH 'other.db'", UnsupportedQuery, "ATTACH"),
    ("PRAGMA database_list", UnsupportedQuery, "PRAGMA"),
    ("INSTALL httpfs", UnsupportedQuery, "INSTALL"),
    ("LOAD httpfs", UnsupportedQuery, "LOAD"),
    ("SET threads = 1", UnsupportedQuery, "SET"),
    ("CALL pragma_version()", UnsupportedQuery, "CALL"),
    ("EXPLAIN SELECT COUNT(*) FROM prompts", UnsupportedQuery, "EXPLAIN"),
    ("DESCRIBE prompts", UnsupportedQuery, "DESCRIBE"),
    ("VALUES (1)", UnsupportedQuery, "VALUES"),
    ("SELECT COUNT(*) FROM prompts; SELECT COUNT(*) FROM pums", InvalidSql, "exactly one statement"),
    ("SELECT COUNT(*) FROM prompts; DROP TABLE prompts", InvalidSql, "exactly one statement"),
    # malformed
    ("SELEC COUNT(*) FROM prompts", InvalidSql, "does not parse"),
    ("SELECT COUNT(* FROM prompts", InvalidSql, "does not parse"),
    ("SELECT COUNT(*) FROM prompts WHERE", InvalidSql, "does not parse"),
    ("SELECT 'abc FROM prompts", InvalidSql, "does not parse"),
    ("", InvalidSql, "no SQL statement"),
    ("  -- only a comment", InvalidSql, "no SQL statement"),
    # unknown names
    ("SELECT COUNT(*) FROM salaries", UnknownTable, "salaries"),
    ("SELECT COUNT(*) FROM other.prompts", UnknownTable, "other"),
    ("SELECT COUNT(*) FROM prompts p WHERE q.age > 3", UnknownTable, "'q'"),
    ("SELECT COUNT(*) FROM prompts WHERE salary > 3", UnknownColumn, "salary"),
    ("SELECT SUM(salary) FROM prompts", UnknownColumn, "salary"),
    ("SELECT COUNT(*) FROM prompts GROUP BY salary", UnknownColumn, "salary"),
    ("SELECT COUNT(*) FROM prompts WHERE user_id = 42", UnsupportedQuery, "privacy unit column"),
]


@pytest.mark.parametrize("sql, cls, text", REFUSED, ids=[r[0][:60] for r in REFUSED])
def test_refusals(policy, sql, cls, text):
    with pytest.raises(cls) as info:
        parse_query(sql, policy)
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err.message}"
    assert err.code == cls.code
    assert text.lower() in err.message.lower(), err.message


def test_refusal_details_carry_the_construct(policy):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT SUM(LENGTH(model)) FROM prompts", policy)
    assert e.value.details["construct"] == "SUM(LENGTH(model))"
    assert e.value.to_dict()["error"]["code"] == "unsupported_query"


def test_non_string_and_oversized_sql(policy):
    with pytest.raises(InvalidSql):
        parse_query(None, policy)  # type: ignore[arg-type]
    with pytest.raises(InvalidSql, match="longer than"):
        parse_query("SELECT COUNT(*) FROM prompts WHERE " + " OR ".join(["age = 1"] * 20000),
                    policy)
    with pytest.raises(InvalidSql, match="NUL"):
        parse_query("SELECT COUNT(*) FROM prompts\x00", policy)


def test_messages_never_contain_data(policy):
    # Planning never reads data, so no message can; the refusal quotes only the query text.
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT COUNT(*) FROM prompts WHERE 1/(tokens-12345) > 0", policy)
    assert "1 / (tokens - 12345)" in e.value.message


# --- accepted queries and the plan's structure ---------------------------------------------------


def test_simple_grouped_plan(policy):
    p = plan("SELECT region, COUNT(*) AS n, AVG(tokens) FROM prompts WHERE age > 30 "
             "GROUP BY region", policy)
    assert p.dataset == "planner" and p.table == "prompts"
    assert p.where == '"age" > 30'
    assert p.group_by == ("region",)
    assert [(x.id, x.kind, x.column) for x in p.primitives] == [
        ("p0", "count", None), ("p1", "sum", "tokens"), ("p2", "count_column", "tokens")]
    assert p.outputs == (
        KeyOutput("region", "region", False, "region"),
        AggregateOutput("count", "count", None, ("p0",), False, "n"),
        AggregateOutput("avg_tokens", "avg", "tokens", ("p1", "p2"), False, "AVG(tokens)"),
    )
    assert [o.label for o in p.outputs] == ["region", "n", "AVG(tokens)"]
    assert p.canonical_sql == ('SELECT "region", COUNT(*) AS "count", AVG("tokens") AS '
                               '"avg_tokens" FROM "prompts" WHERE "age" > 30 GROUP BY "region"')
    assert len(p.plan_hash) == 64
    assert p.primitive("p1").column == "tokens"
    with pytest.raises(KeyError):
        p.primitive("p9")


@pytest.mark.parametrize(
    "agg, function, kinds",
    [
        ("COUNT(*)", "count", ["count"]),
        ("COUNT()", "count", ["count"]),
        ("COUNT(1)", "count", ["count"]),
        ("COUNT('x')", "count", ["count"]),
        ("COUNT(user_id)", "count", ["count"]),
        ("COUNT(model)", "count_column", ["count_column"]),
        ("COUNT(ALL model)", "count_column", ["count_column"]),
        ("COUNT(DISTINCT user_id)", "count_distinct_unit", ["count_distinct_unit"]),
        ("SUM(tokens)", "sum", ["sum"]),
        ("AVG(tokens)", "avg", ["sum", "count_column"]),
        ("MEAN(tokens)", "avg", ["sum", "count_column"]),
        ("VAR_POP(tokens)", "var_pop", ["sum_squares", "sum", "count_column"]),
        ("VARIANCE(tokens)", "var_pop", ["sum_squares", "sum", "count_column"]),
        ("VAR_SAMP(tokens)", "var_pop", ["sum_squares", "sum", "count_column"]),
        ("STDDEV_POP(tokens)", "stddev_pop", ["sum_squares", "sum", "count_column"]),
        ("STDDEV(tokens)", "stddev_pop", ["sum_squares", "sum", "count_column"]),
        ("STDDEV_SAMP(tokens)", "stddev_pop", ["sum_squares", "sum", "count_column"]),
        ("SUM(age)", "sum", ["sum"]),
    ],
)
def test_aggregate_mapping(policy, agg, function, kinds):
    p = plan(f"SELECT {agg} FROM prompts", policy)
    (out,) = p.outputs
    assert out.function == function
    assert [p.primitive(i).kind for i in out.primitives] == kinds


def test_primitives_are_shared_between_outputs(policy):
    p = plan("SELECT AVG(tokens), SUM(tokens), COUNT(tokens), STDDEV(tokens), COUNT(*), "
             "COUNT(1) FROM prompts", policy)
    assert [(x.kind, x.column) for x in p.primitives] == [
        ("sum", "tokens"), ("count_column", "tokens"), ("sum_squares", "tokens"), ("count", None)]
    names = [o.name for o in p.outputs]
    assert names == ["avg_tokens", "sum_tokens", "count_tokens", "stddev_pop_tokens", "count",
                     "count_2"]
    assert p.outputs[4].primitives == p.outputs[5].primitives == ("p3",)


def test_hidden_key_and_hidden_aggregates(policy):
    p = plan("SELECT COUNT(*) AS n FROM prompts GROUP BY region HAVING SUM(tokens) > 10 "
             "ORDER BY AVG(age) DESC NULLS FIRST LIMIT 2", policy)
    assert [(o.name, o.hidden) for o in p.outputs] == [
        ("count", False), ("region", True), ("sum_tokens", True), ("avg_age", True)]
    assert p.having == '"sum_tokens" > 10'
    assert [(o.output, o.descending, o.nulls_first) for o in p.order_by] == [
        ("avg_age", True, True)]
    assert p.limit == 2
    assert [o.name for o in p.visible_outputs] == ["count"]
    assert "HAVING SUM(\"tokens\") > 10" in p.canonical_sql
    assert 'ORDER BY AVG("age") DESC NULLS FIRST LIMIT 2' in p.canonical_sql


def test_having_and_order_by_references(policy):
    p = plan("SELECT region AS r, COUNT(*) AS n, SUM(tokens) s FROM prompts GROUP BY r "
             "HAVING n > 5 AND r <> 'us' AND s BETWEEN 1 AND 10 ORDER BY 3, n DESC, region",
             policy)
    assert p.group_by == ("region",)
    assert p.having == ('"count" > 5 AND "region" <> \'us\' AND "sum_tokens" <= 10 AND '
                        '"sum_tokens" >= 1')
    assert [o.output for o in p.order_by] == ["sum_tokens", "count", "region"]


def test_group_by_position_alias_and_order(policy):
    a = plan("SELECT week, region, COUNT(*) FROM prompts GROUP BY 1, 2", policy)
    b = plan("SELECT week AS w, region, COUNT(*) FROM prompts GROUP BY region, w", policy)
    assert a.group_by == b.group_by == ("region", "week")  # policy declaration order
    assert [o.name for o in a.outputs] == ["week", "region", "count"]


def test_case_insensitive_and_qualified_names(policy):
    p = plan('SELECT P.REGION, count(*) FROM planner.PROMPTS AS p WHERE "Age" > 3 '
             "GROUP BY p.Region", policy)
    assert p.group_by == ("region",) and p.where == '"age" > 3'
    assert p.outputs[0].label == "REGION"


def test_where_functions_and_arithmetic_guarded_by_try(policy):
    p = plan("SELECT COUNT(*) FROM prompts WHERE abs(age - latency) * 2 > 3 AND "
             "length(trim(model)) BETWEEN 1 AND 5 AND coalesce(TRY_CAST(model AS BIGINT), 0) = 1 "
             "AND starts_with(lower(model), 'gpt') AND model || 'x' ILIKE '%x' AND "
             "round(tokens, 2) <> 1.5 AND -age < 0 AND NOT flagged IS TRUE AND "
             "week IS NOT DISTINCT FROM 3", policy)
    where = p.where
    # every + - * / unary minus / ABS runs inside TRY: an overflow is NULL, never an error
    assert 'TRY(TRY(ABS(TRY("age" - "latency"))) * 2) > 3' in where
    assert 'TRY(-"age") < 0' in where
    assert "TRY(LENGTH" not in where  # nothing else is wrapped
    assert "ROUND(\"tokens\", 2) <> 1.5" in where
    # constants are folded, not guarded
    assert plan("SELECT COUNT(*) FROM prompts WHERE age > -3 * 2", policy).where == '"age" > -6'


def test_where_literals_are_checked_after_folding(policy):
    p = plan("SELECT COUNT(*) FROM prompts WHERE 1 = 1", policy)
    assert p.where is None
    p = plan("SELECT COUNT(*) FROM prompts WHERE 1 = 0", policy)
    assert p.where == "FALSE"
    p = plan("SELECT COUNT(*) FROM prompts WHERE age > -9223372036854775807", policy)
    assert p.where == '"age" > -9223372036854775807'


def test_primitive_ids_avoid_declared_columns():
    raw = {
        "dataset": {"name": "d", "population": "p"},
        "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
        "tables": {"t": {"source": "t.csv", "privacy_unit": "P1", "columns": {
            "p0": {"type": "text", "public_keys": ["a"]},
            "_p3": {"type": "int"},
            "x": {"type": "int", "lower": 0, "upper": 1}}}},
    }
    pol = parse_policy(raw, Path("x/policies/d.toml"))
    p = parse_query("SELECT p0, COUNT(*), SUM(x) FROM t GROUP BY p0", pol)
    assert [x.id for x in p.primitives] == ["__p0", "__p1"]


def test_plan_round_trips_through_dict(policy):
    p = plan("SELECT region, COUNT(*) n, STDDEV(latency) FROM prompts WHERE model LIKE 'g%' "
             "GROUP BY region HAVING n > 1 ORDER BY n DESC LIMIT 3", policy)
    q = QueryPlan.from_dict(p.to_dict())
    assert q == p and q.plan_hash == p.plan_hash and q.canonical_sql == p.canonical_sql
    assert [o.label for o in q.outputs] == [o.label for o in p.outputs]


# --- canonical form: same meaning, same hash; different meaning, different hash ---------------------

SAME = [
    ("SELECT COUNT(*) FROM prompts WHERE week IN (3)", "SELECT COUNT(*) FROM prompts WHERE week = 3.0"),
    ("SELECT COUNT(*) FROM prompts WHERE week NOT IN (3, 3)", "SELECT COUNT(*) FROM prompts WHERE week <> 3"),
    ("SELECT COUNT(*) FROM prompts", "select   count(*)\n  from PROMPTS ;"),
    ("SELECT COUNT(*) FROM prompts", 'SELECT COUNT(*) FROM "prompts" -- a comment'),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(1) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(user_id) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT() FROM planner.prompts"),
    ("SELECT COUNT(*) AS n FROM prompts", "SELECT COUNT(*) AS total FROM prompts"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30", "SELECT COUNT(*) FROM prompts WHERE 30 < age"),
    ("SELECT COUNT(*) FROM prompts WHERE age >= 30", "SELECT COUNT(*) FROM prompts WHERE 30 <= age"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30",
     "SELECT COUNT(*) FROM prompts AS p WHERE p.age > 30"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30",
     'SELECT COUNT(*) FROM prompts WHERE "AGE" > 30.0'),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30 AND region = 'eu'",
     "SELECT COUNT(*) FROM prompts WHERE region = 'eu' AND age > 30"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30 OR region = 'eu' OR model LIKE 'g%'",
     "SELECT COUNT(*) FROM prompts WHERE model LIKE 'g%' OR (region = 'eu' OR 30 < age)"),
    ("SELECT COUNT(*) FROM prompts WHERE (age > 1 OR week = 2) AND region = 'eu'",
     "SELECT COUNT(*) FROM prompts WHERE region = 'eu' AND (week = 2 OR age > 1)"),
    ("SELECT COUNT(*) FROM prompts WHERE age BETWEEN 1 AND 5",
     "SELECT COUNT(*) FROM prompts WHERE age <= 5 AND age >= 1"),
    ("SELECT COUNT(*) FROM prompts WHERE region IN ('eu', 'us')",
     "SELECT COUNT(*) FROM prompts WHERE region IN ('us', 'eu', 'us')"),
    ("SELECT COUNT(*) FROM prompts WHERE age <> 3", "SELECT COUNT(*) FROM prompts WHERE age != 3"),
    ("SELECT COUNT(*) FROM prompts WHERE model IS NOT NULL",
     "SELECT COUNT(*) FROM prompts WHERE NOT model IS NULL"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 3 AND age > 3",
     "SELECT COUNT(*) FROM prompts WHERE age > 3"),
    ("SELECT COUNT(*) FROM prompts WHERE lower(model) = 'x'",
     "SELECT COUNT(*) FROM prompts WHERE 'x' = LOWER(model)"),
    ("SELECT AVG(tokens) FROM prompts", "SELECT MEAN(tokens) AS m FROM prompts"),
    ("SELECT VAR_POP(tokens) FROM prompts", "SELECT VARIANCE(tokens) FROM prompts"),
    ("SELECT STDDEV_POP(tokens) FROM prompts", "SELECT STDDEV(tokens) FROM prompts"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT region AS r, COUNT(*) AS c FROM prompts GROUP BY 1"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT region AS r, COUNT(*) AS c FROM prompts GROUP BY r"),
    ("SELECT region, week, COUNT(*) FROM prompts GROUP BY region, week",
     "SELECT region, week, COUNT(*) FROM prompts GROUP BY week, region"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n > 5 ORDER BY n DESC",
     "SELECT region, COUNT(*) c FROM prompts GROUP BY region HAVING COUNT(*) > 5 "
     "ORDER BY COUNT(*) DESC"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n DESC",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY 2 DESC NULLS LAST"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n > 5 AND region = 'eu'",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING 'eu' = region AND 5 < n"),
    # a per-row CAST in WHERE runs as TRY_CAST (a value that does not convert filters the row
    # out instead of failing the charged query)
    ("SELECT COUNT(*) FROM prompts WHERE CAST(model AS INT) = 1",
     "SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS INT) = 1"),
    ("SELECT COUNT(*) FROM prompts WHERE model::INT = 1",
     "SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS INT) = 1"),
]

DIFFERENT = [
    ("SELECT COUNT(*) FROM prompts WHERE age > 30", "SELECT COUNT(*) FROM prompts WHERE age >= 30"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30", "SELECT COUNT(*) FROM prompts WHERE age > 31"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30", "SELECT COUNT(*) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts WHERE age > 30 AND week = 1",
     "SELECT COUNT(*) FROM prompts WHERE age > 30 OR week = 1"),
    ("SELECT COUNT(*) FROM prompts WHERE region = 'eu'",
     "SELECT COUNT(*) FROM prompts WHERE region = 'EU'"),
    ("SELECT COUNT(*) FROM prompts WHERE model LIKE 'g%'",
     "SELECT COUNT(*) FROM prompts WHERE model ILIKE 'g%'"),
    ("SELECT COUNT(*) FROM prompts WHERE model LIKE 'g%'",
     "SELECT COUNT(*) FROM prompts WHERE model NOT LIKE 'g%'"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(model) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(DISTINCT user_id) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(*) FROM ev"),
    ("SELECT SUM(tokens) FROM prompts", "SELECT AVG(tokens) FROM prompts"),
    ("SELECT SUM(tokens) FROM prompts", "SELECT SUM(latency) FROM prompts"),
    ("SELECT VAR_POP(tokens) FROM prompts", "SELECT STDDEV_POP(tokens) FROM prompts"),
    ("SELECT COUNT(*), SUM(tokens) FROM prompts", "SELECT SUM(tokens), COUNT(*) FROM prompts"),
    ("SELECT COUNT(*) FROM prompts", "SELECT COUNT(*) AS a, COUNT(*) AS b FROM prompts"),  # repeated: two outputs
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT week, COUNT(*) FROM prompts GROUP BY week"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT COUNT(*) FROM prompts GROUP BY region"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT COUNT(*), region FROM prompts GROUP BY region"),
    ("SELECT region, COUNT(*) FROM prompts GROUP BY region",
     "SELECT region, week, COUNT(*) FROM prompts GROUP BY region, week"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n > 5",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n >= 5"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n > 5",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n DESC"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n NULLS FIRST"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY n",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region ORDER BY region"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region LIMIT 3",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region LIMIT 4"),
    ("SELECT region, COUNT(*) n FROM prompts GROUP BY region LIMIT 3",
     "SELECT region, COUNT(*) n FROM prompts GROUP BY region"),
    ("SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS INT) = 1",
     "SELECT COUNT(*) FROM prompts WHERE TRY_CAST(model AS BIGINT) = 1"),
    ("SELECT COUNT(*) FROM prompts WHERE latency > 0.1",
     "SELECT COUNT(*) FROM prompts WHERE latency > 0.10000000000000002"),
]


@pytest.mark.parametrize("a, b", SAME, ids=[f"{i}" for i in range(len(SAME))])
def test_same_meaning_same_hash(policy, a, b):
    pa, pb = plan(a, policy), plan(b, policy)
    assert pa.plan_hash == pb.plan_hash, (pa.canonical_sql, pb.canonical_sql)
    assert pb.plan_hash == pa.plan_hash  # both ways (the hash is a pure function)
    assert pa.canonical_sql == pb.canonical_sql
    assert pa == pb
    assert plan(pa.canonical_sql, policy).plan_hash == pa.plan_hash  # canonical form is a fixed point


@pytest.mark.parametrize("a, b", DIFFERENT, ids=[f"{i}" for i in range(len(DIFFERENT))])
def test_different_meaning_different_hash(policy, a, b):
    pa, pb = plan(a, policy), plan(b, policy)
    assert pa.plan_hash != pb.plan_hash, pa.canonical_sql
    assert pa != pb
    for p in (pa, pb):
        assert plan(p.canonical_sql, policy).plan_hash == p.plan_hash


def test_policy_change_changes_hash(policy):
    sql = "SELECT region, SUM(tokens) FROM prompts GROUP BY region"
    base = plan(sql, policy)
    prompts = policy.table("prompts")
    for changed in (
        replace(prompts, max_groups_per_unit=3),
        replace(prompts, max_rows_per_unit=4),
        replace(prompts, columns={**prompts.columns,
                                  "tokens": replace(prompts.column("tokens"), upper=9000.0)}),
        replace(prompts, columns={**prompts.columns,
                                  "region": replace(prompts.column("region"),
                                                    public_keys=("eu", "us"))}),
    ):
        other = replace(policy, tables={**policy.tables, "prompts": changed})
        assert plan(sql, other).plan_hash != base.plan_hash
    # a column the query does not use does not matter
    unrelated = replace(prompts, columns={**prompts.columns,
                                          "latency": replace(prompts.column("latency"),
                                                             upper=5.0)})
    other = replace(policy, tables={**policy.tables, "prompts": unrelated})
    assert plan(sql, other).plan_hash == base.plan_hash


# --- HAVING on noisy values ---------------------------------------------------------------------


def test_evaluate_predicate_three_valued_logic():
    values = {
        "count": np.array([10.0, 3.0, np.nan, 7.0]),
        "region": np.array(["eu", "us", "eu", None], dtype=object),
        "sum_x": np.array([1.0, 2.0, 3.0, 0.0]),
    }
    mask = lambda s: evaluate_predicate(s, values).tolist()  # noqa: E731
    assert mask('"count" > 5') == [True, False, False, True]
    assert mask('"count" > 5 OR "region" = \'us\'') == [True, True, False, True]
    assert mask('NOT "count" > 5') == [False, True, False, False]  # NULL stays unknown
    assert mask('"count" IS NULL') == [False, False, True, False]
    assert mask('NOT "region" IS NULL AND "count" >= 3') == [True, True, False, False]
    assert mask('"region" IN (\'eu\', \'apac\')') == [True, False, True, False]
    assert mask('"count" / "sum_x" > 4') == [True, False, False, False]  # 7/0 is NULL
    assert mask('-"count" < -5 AND ABS("sum_x" - 2) <= 1') == [True, False, False, False]
    assert mask('"count" > 5 AND NULL') == [False, False, False, False]
    assert mask('"count" < 5 OR TRUE') == [True, True, True, True]
    assert mask('"count" BETWEEN 3 AND 7') == [False, True, False, True]


def test_evaluate_predicate_from_a_plan(policy):
    p = plan("SELECT region, COUNT(*) n FROM prompts GROUP BY region HAVING n > 5 "
             "AND region <> 'us'", policy)
    keep = evaluate_predicate(p.having, {"region": np.array(["eu", "us", "apac"], dtype=object),
                                         "count": np.array([9.0, 9.0, 2.0])})
    assert keep.tolist() == [True, False, False]
    with pytest.raises(ValueError):
        evaluate_predicate('"nope" > 1', {"count": np.array([1.0])})


# --- robustness: any text gives a plan or a DpgateError; an accepted plan runs on any data ----------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dpgate.errors import DpgateError  # noqa: E402

TOKENS = [
    "SELECT", "COUNT(*)", "SUM(tokens)", "AVG(age)", "COUNT(DISTINCT user_id)", "STDDEV(latency)",
    "region", "week", "model", "flagged", "age", "tokens", "latency", "user_id", "FROM", "prompts",
    "WHERE", "GROUP BY", "HAVING", "ORDER BY", "LIMIT", "AND", "OR", "NOT", "IN", "BETWEEN",
    "IS", "NULL", "LIKE", "ILIKE", "AS", "n", "DESC", ">", "<", "=", "<>", "+", "-", "*", "/",
    "%", "(", ")", ",", ";", "'eu'", "'%a%'", "30", "-1", "0.5", "1e400", "9223372036854775807",
    "TRUE", "lower(model)", "abs(age)", "length(model)", "round(tokens, 1)", "TRY_CAST(model AS INT)",
    "coalesce(age, 0)", "random()", "CAST(", "::INT", "JOIN", "UNION", "OVER ()", "DISTINCT",
]


def _fuzz_db():
    import duckdb

    from test_bound import load

    pol = load_policy(FIXTURE)
    con = duckdb.connect()
    extreme = [
        {"user_id": 1, "region": "eu", "week": 3, "tokens": float("nan"), "latency": float("inf"),
         "age": 2**63 - 1, "model": "", "flagged": True},
        {"user_id": 2, "region": "us", "week": 0, "tokens": -1e308, "latency": -float("inf"),
         "age": -(2**63), "model": "it's", "flagged": None},
        {"user_id": None, "region": None, "week": None, "tokens": None, "latency": None,
         "age": None, "model": None, "flagged": None},
        {"user_id": 3, "region": "apac", "week": 51, "tokens": 1e308, "latency": 5e-324,
         "age": 0, "model": "%_\\", "flagged": False},
    ]
    for table in pol.tables:
        load(con, pol, table, extreme if table == "prompts" else [])
    # moderate values (no overflow in the analyst's own SQL), to compare meanings
    con.execute('CREATE TABLE moderate AS SELECT * FROM "planner"."prompts" LIMIT 0')
    con.execute("""INSERT INTO moderate VALUES
        (1, 'eu', 3, 2.5, -1.0, 30, 'gpt-4', TRUE), (2, 'us', 0, NULL, 0.25, NULL, 'It''s', FALSE),
        (3, NULL, 51, 'nan', 7.0, -3, NULL, NULL), (4, 'apac', 7, 1000.0, 'inf', 1000, '', TRUE),
        (5, 'latam', 1, -2.5, NULL, 0, '%a%', FALSE), (6, 'eu', NULL, 0.0, -7.0, 7, 'eu', TRUE)""")
    return pol, con


_FUZZ = {}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=24).map(" ".join),
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=12).map(
        lambda t: "SELECT region, COUNT(*) FROM prompts WHERE " + " ".join(t) + " GROUP BY region"),
    st.text(max_size=120),
))
def test_any_text_plans_or_raises_a_dpgate_error_and_plans_run_on_extreme_data(sql):
    from dpgate.sql.bound import bounded_sql

    if not _FUZZ:
        _FUZZ["pol"], _FUZZ["con"] = _fuzz_db()
    pol, con = _FUZZ["pol"], _FUZZ["con"]
    try:
        p = parse_query(sql, pol)
    except DpgateError:
        return
    rows = con.execute(bounded_sql(p, pol, salt=5)).fetchall()  # never raises on data
    assert len(rows) == pol.table(p.table).key_combinations(p.group_by)


def _typed_predicates():
    """SQL row predicates that the allow-list accepts, built from typed pieces."""
    num_leaf = st.sampled_from(["age", "week", "tokens", "latency", "0", "-3", "2.5", "1000"])
    text_leaf = st.sampled_from(["model", "region", "'eu'", "'%a%'", "'it''s'", "''"])

    def num_ext(inner):
        n, t = inner.map(lambda p: p[0]), inner.map(lambda p: p[1])
        return st.one_of(
            st.tuples(n).map(lambda a: f"abs({a[0]})"),
            st.tuples(n).map(lambda a: f"round({a[0]}, 2)"),
            st.tuples(n).map(lambda a: f"floor({a[0]})"),
            st.tuples(n).map(lambda a: f"ceil({a[0]})"),
            st.tuples(n).map(lambda a: f"sign({a[0]})"),
            st.tuples(n).map(lambda a: f"-({a[0]})"),
            st.tuples(n, n, st.sampled_from("+-*")).map(lambda a: f"({a[0]} {a[2]} {a[1]})"),
            st.tuples(t).map(lambda a: f"length({a[0]})"),
            st.tuples(n, n).map(lambda a: f"coalesce({a[0]}, {a[1]})"),
            st.tuples(n, n).map(lambda a: f"greatest({a[0]}, {a[1]})"),
            st.tuples(n, n).map(lambda a: f"nullif({a[0]}, {a[1]})"),
            st.tuples(t).map(lambda a: f"TRY_CAST({a[0]} AS BIGINT)"),
            st.tuples(t).map(lambda a: f"TRY_CAST({a[0]} AS DOUBLE)"),
        )

    def text_ext(inner):
        n, t = inner.map(lambda p: p[0]), inner.map(lambda p: p[1])
        return st.one_of(
            st.tuples(t).map(lambda a: f"lower({a[0]})"),
            st.tuples(t).map(lambda a: f"upper({a[0]})"),
            st.tuples(t).map(lambda a: f"trim({a[0]})"),
            st.tuples(t, t).map(lambda a: f"({a[0]} || {a[1]})"),
            st.tuples(t, n).map(lambda a: f"concat({a[0]}, {a[1]})"),
            st.tuples(n).map(lambda a: f"TRY_CAST({a[0]} AS VARCHAR)"),
            st.tuples(t, t).map(lambda a: f"coalesce({a[0]}, {a[1]})"),
        )

    pair = st.recursive(
        st.tuples(num_leaf, text_leaf),
        lambda inner: st.tuples(num_ext(inner), text_ext(inner)),
        max_leaves=6,
    )
    num = pair.map(lambda p: p[0])
    text = pair.map(lambda p: p[1])
    big = st.sampled_from(["9223372036854775807", "-9223372036854775807", "1e308", "-1e308"])
    atom = st.one_of(
        st.just("flagged"),
        st.tuples(num, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), num | big).map(
            " ".join),
        st.tuples(text, st.sampled_from(["=", "<>", "<", ">="]), text).map(" ".join),
        st.tuples(text, st.sampled_from(["LIKE", "NOT LIKE", "ILIKE"]), text).map(" ".join),
        st.tuples(num).map(lambda a: f"{a[0]} IN (1, 2.5, -7)"),
        st.tuples(text).map(lambda a: f"{a[0]} IN ('eu', 'x')"),
        st.tuples(num, num, num).map(lambda a: f"{a[0]} BETWEEN {a[1]} AND {a[2]}"),
        st.tuples(num | text).map(lambda a: f"{a[0]} IS NULL"),
        st.tuples(num, num).map(lambda a: f"{a[0]} IS DISTINCT FROM {a[1]}"),
        st.tuples(text, text).map(lambda a: f"starts_with({a[0]}, {a[1]})"),
        st.tuples(text, text).map(lambda a: f"contains({a[0]}, {a[1]})"),
        st.just("flagged IS NOT TRUE"),
    )
    return st.recursive(
        atom,
        lambda b: st.one_of(
            st.tuples(b, b).map(lambda a: f"({a[0]} AND {a[1]})"),
            st.tuples(b, b).map(lambda a: f"({a[0]} OR {a[1]})"),
            b.map(lambda a: f"NOT ({a})"),
        ),
        max_leaves=4,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_typed_predicates())
def test_allowed_predicates_plan_and_never_fail_on_extreme_data(predicate):
    from dpgate.sql.bound import bounded_sql

    if not _FUZZ:
        _FUZZ["pol"], _FUZZ["con"] = _fuzz_db()
    pol, con = _FUZZ["pol"], _FUZZ["con"]
    sql = (f"SELECT region, COUNT(*), SUM(tokens), AVG(age), STDDEV(latency) FROM prompts "
           f"WHERE {predicate} GROUP BY region")
    keys = pol.table("prompts").column("region").public_keys
    listed = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
    reached = {r[0] for r in con.execute(  # the regions that rows of the moderate data reach through it
        f"SELECT DISTINCT region FROM moderate WHERE region IN ({listed}) AND ({predicate})").fetchall()}
    try:
        p = parse_query(sql, pol)  # every generated predicate is in the allow-list …
    except UnsupportedQuery as e:
        # … unless it holds for no public key of region: the WHERE narrows the released keys
        # (issue 24), evaluated on the key list; then no row can reach any key either
        assert "leaves no public key of group key 'region'" in str(e), e
        assert reached == set()
        return
    rows = con.execute(bounded_sql(p, pol, salt=9)).fetchall()
    kept = p.key_column(pol.table("prompts"), "region").public_keys
    assert len(rows) == len(kept) and set(kept) <= set(keys)
    assert reached <= set(kept)  # exact: no key that a row reaches is dropped
    # the canonical predicate means what the analyst wrote (same rows on moderate data)
    planned = p.where or "TRUE"
    ours = con.execute(f"SELECT list(user_id ORDER BY user_id) FILTER (WHERE {planned}) "
                       "FROM moderate").fetchone()[0]
    theirs = con.execute(f"SELECT list(user_id ORDER BY user_id) FILTER (WHERE {predicate}) "
                         "FROM moderate").fetchone()[0]
    assert ours == theirs, (predicate, planned)
    # and the canonical form is stable: planning the canonical SQL gives the same plan
    assert parse_query(p.canonical_sql, pol).plan_hash == p.plan_hash


def test_huge_or_deep_queries_are_refused_cleanly(policy):
    with pytest.raises(UnsupportedQuery, match="too large"):
        parse_query("SELECT COUNT(*) FROM prompts WHERE " +
                    " OR ".join(f"age = {i}" for i in range(7000)), policy)
    # a clear limit (issue 10 item 7), measured without recursion, instead of "nested too deeply"
    with pytest.raises(UnsupportedQuery, match=r"nests expressions 3000 levels deep; .* at most 12 "):
        parse_query("SELECT COUNT(*) FROM prompts WHERE " + " + ".join(["age"] * 3000) + " > 1",
                    policy)
    # 2,000 NOTs: sqlglot's parser itself runs out of recursion; the tokens name the limit
    with pytest.raises(UnsupportedQuery, match=r"nests expressions more than 12 levels deep"):
        parse_query("SELECT COUNT(*) FROM prompts WHERE " + "NOT " * 2000 + "flagged", policy)
    # a long IN list is fine (linear canonicalisation)
    p = parse_query("SELECT COUNT(*) FROM prompts WHERE age IN (" +
                    ", ".join(str(i) for i in range(2000, 0, -1)) + ")", policy)
    assert p.where.startswith('"age" IN (1, 10, 100, 1000, 1001')
