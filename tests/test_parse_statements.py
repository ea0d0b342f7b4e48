"""Statement structure in the planner: aggregate spellings, output names, every plan shape
renders valid SQL (issue 10 item 2, issue 9 items 10 and 12)."""

from __future__ import annotations


import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from tests.test_bound import load



# --- aggregate spellings --------------------------------------------------------------------


@pytest.mark.parametrize(
    "dialect, agg, function",
    [
        ("duckdb", "VAR(tokens)", "var_pop"),
        ("tsql", "VAR(tokens)", "var_pop"),
        ("tsql", "VARP(tokens)", "var_pop"),
        ("duckdb", "VARIANCE(tokens)", "var_pop"),
        ("mysql", "VARIANCE(tokens)", "var_pop"),
        ("duckdb", "VAR_SAMP(tokens)", "var_pop"),
        ("duckdb", "VAR_POP(tokens)", "var_pop"),
        ("tsql", "STDEV(tokens)", "stddev_pop"),
        ("tsql", "STDEVP(tokens)", "stddev_pop"),
        ("duckdb", "STDDEV(tokens)", "stddev_pop"),
        ("mysql", "STDDEV(tokens)", "stddev_pop"),
        ("snowflake", "STDDEV_SAMP(tokens)", "stddev_pop"),
        ("duckdb", "STDDEV_POP(tokens)", "stddev_pop"),
        ("duckdb", "COUNT(1)", "count"),
        ("tsql", "COUNT(1)", "count"),
        ("duckdb", "COUNT(ALL model)", "count_column"),
        ("duckdb", "(SUM(tokens))", "sum"),
        ("duckdb", "((AVG(tokens)))", "avg"),
    ],
)
def test_aggregate_spellings(policy, dialect, agg, function):
    """Every common spelling maps to one of the planner's aggregates (population VAR/STDDEV)."""
    plan = parse_query(f"SELECT {agg} AS v FROM prompts", policy, dialect=dialect)
    (out,) = plan.outputs
    assert out.function == function


def test_sample_and_population_spellings_share_one_plan(policy):
    """VAR_SAMP and VAR_POP are one release: the DP estimate is the population variance."""
    a = parse_query("SELECT VAR_SAMP(tokens) FROM prompts", policy)
    b = parse_query("SELECT VAR_POP(tokens) FROM prompts", policy)
    c = parse_query("SELECT VAR(tokens) FROM prompts", policy)
    assert a.plan_hash == b.plan_hash == c.plan_hash


@pytest.mark.parametrize("agg", ["AVG(DISTINCT tokens)", "SUM(DISTINCT tokens)",
                                 "VAR(DISTINCT tokens)", "STDDEV(DISTINCT latency)"])
def test_distinct_inside_value_aggregates_is_refused_with_a_reason(policy, agg):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(f"SELECT {agg} FROM prompts", policy)
    assert "contribution bounding cannot cap" in str(e.value)


# --- output names (issue 9 item 12) ---------------------------------------------------------


@pytest.mark.parametrize("sql", [
    "SELECT SUM(tokens) AS v, COUNT(*) AS v FROM prompts",
    "SELECT SUM(tokens) AS v, COUNT(*) AS V FROM prompts",
    "SELECT region, COUNT(*) AS region FROM prompts GROUP BY region",
    "SELECT COUNT(*) AS n, AVG(tokens) AS \"n\" FROM prompts",
    # the same computation twice under one title (a fresh-user trial: released as ["n", "n"])
    "SELECT COUNT(*) AS n, COUNT(*) AS n FROM prompts",
    "SELECT COUNT(*), COUNT(*) FROM prompts",
    "SELECT region, region, COUNT(*) FROM prompts GROUP BY region",
])
def test_duplicate_output_names_are_refused(policy, sql):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    assert "two output columns are named" in str(e.value)


def test_distinct_output_names_are_fine(policy):
    plan = parse_query("SELECT SUM(tokens) AS v, COUNT(*) AS w FROM prompts", policy)
    assert [o.label for o in plan.outputs] == ["v", "w"]


def test_duplicate_names_through_the_gateway_charge_nothing(tmp_path):
    from tests.test_service import DATA, make_gateway

    if not (DATA / "PUMS_dup.csv").exists():
        pytest.skip("../shared/data not present")
    gw = make_gateway(tmp_path)
    try:
        before = len(gw.ledger_entries())
        with pytest.raises(UnsupportedQuery) as e:
            gw.query("pums", "SELECT SUM(income) AS v, COUNT(*) AS v FROM persons",
                     consumer="analysts")
        assert e.value.http_status == 400 and e.value.code == "unsupported_query"
        assert len(gw.ledger_entries()) == before
    finally:
        gw.close()


# --- every plan shape renders valid SQL (issue 9 item 10) -----------------------------------

_AGGS = {
    "prompts": ["COUNT(*)", "COUNT(model)", "COUNT(DISTINCT user_id)", "SUM(tokens)",
                "AVG(latency)", "VAR_POP(age)", "STDDEV(tokens)", "COUNT(user_id)"],
    "pums": ["COUNT(*)", "COUNT(1)", "COUNT(age)", "SUM(income)", "AVG(age)", "VAR_POP(income)",
             "STDDEV(age)"],
    "ev": ["COUNT(*)", "COUNT(DISTINCT user_id)", "COUNT(kind)"],
    "sv": ["COUNT(*)", "COUNT(a)", "SUM(b)", "AVG(a)", "COUNT(id)"],
    "fx": ["COUNT(*)", "SUM(x)", "AVG(x)", "COUNT(x)"],
}
_KEYS = {"prompts": ["region", "week", "flagged"], "pums": ["sex", "married"], "ev": ["kind"],
         "sv": [], "fx": []}
_WHERE = {"prompts": ["age > 30", "region = 'eu'", "FALSE", "model IS NULL"],
          "pums": ["age >= 18", "sex = '1'", "1 = 0"], "ev": ["kind <> 'a'"],
          "sv": ["a < b"], "fx": ["x > 0"]}


@st.composite
def _queries(draw):
    table = draw(st.sampled_from(sorted(_AGGS)))
    aggs = draw(st.lists(st.sampled_from(_AGGS[table]), min_size=1, max_size=3, unique=True))
    keys = draw(st.lists(st.sampled_from(_KEYS[table]), max_size=2, unique=True)
                if _KEYS[table] else st.just([]))
    shown = draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []
    where = draw(st.none() | st.sampled_from(_WHERE[table]))
    items = list(shown) + [f"{a} AS c{i}" for i, a in enumerate(aggs)]
    sql = f"SELECT {', '.join(items)} FROM {table}"
    if where:
        sql += f" WHERE {where}"
    if keys:
        sql += " GROUP BY " + ", ".join(keys)
    return table, sql


@pytest.fixture(scope="module")
def loaded(policy):
    con = duckdb.connect()
    load(con, policy, "prompts", [
        {"user_id": 1, "region": "eu", "week": 3, "tokens": 10.0, "latency": 1.5, "age": 40,
         "model": "m", "flagged": True},
        {"user_id": 2, "region": "us", "week": 4, "tokens": 20.0, "age": 20}])
    load(con, policy, "pums", [{"age": 30, "sex": "1", "income": 1000, "married": 1},
                               {"age": 50, "sex": "0", "income": None, "married": 0}])
    load(con, policy, "ev", [{"user_id": 1, "kind": "a"}])
    load(con, policy, "sv", [{"id": 1, "a": 3, "b": 4}])
    load(con, policy, "fx", [{"uid": 1, "x": 2.0}])
    yield con
    con.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=_queries())
def test_every_plan_shape_renders_valid_sql(policy, loaded, q):
    """For every table kind (record-level, unit-level, unit declared or not, k=1 or k<groups),
    the bounded SQL of any accepted plan executes and returns one row per key combination."""
    table, sql = q
    plan = parse_query(sql, policy)
    rows = loaded.execute(bounded_sql(plan, policy, salt=7)).fetchall()
    assert len(rows) == plan.key_combinations(policy.table(table))  # narrowed by a WHERE on a key (issue 24)


def test_record_level_count_star_executes(policy, loaded):
    plan = parse_query("SELECT COUNT(*) FROM pums", policy)
    assert loaded.execute(bounded_sql(plan, policy, salt=1)).fetchall() == [(2,)]


# --- messages (issue 10 item 7, from a trial) -------------------------------------------------


def test_group_by_position_quotes_the_expression_not_the_number(policy):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT CASE WHEN tokens > 10 THEN tokens END, COUNT(*) FROM prompts "
                    "GROUP BY 1", policy)
    assert "CASE WHEN tokens > 10" in str(e.value)
    assert "GROUP BY 1:" not in str(e.value)


def test_messages_quote_the_analysts_text(policy):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT COUNT(DISTINCT region, model) FROM prompts", policy)
    assert "COUNT(DISTINCT region, model)" in str(e.value)
    assert "CASE WHEN" not in str(e.value)
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT COUNT(*) FROM prompts WHERE random() < 0.5", policy)
    assert "random()" in str(e.value)


@pytest.mark.parametrize("sql", [
    "SELECT SUM(model) FROM prompts",
    "SELECT COUNT(*) FROM nowhere",
    "SELECT nope, COUNT(*) FROM prompts GROUP BY nope",
    "SELEC COUNT(*) FROM prompts",
    "SELECT COUNT(NULL) FROM prompts",
])
def test_planner_refusals_say_nothing_was_charged(policy, sql):
    from dpgate.errors import DpgateError

    with pytest.raises(DpgateError) as e:
        parse_query(sql, policy)
    assert str(e.value).endswith("(nothing was charged)")
    assert e.value.details["charged"] is False


def test_constant_queries_are_refused_alike_and_charge_nothing(tmp_path):
    """COUNT(NULL) and a WHERE that is always false both have the same answer on any data: both
    are refused before the charge (the trial found the first refused, the second charged)."""
    from tests.test_service import DATA, make_gateway

    if not (DATA / "PUMS_dup.csv").exists():
        pytest.skip("../shared/data not present")
    gw = make_gateway(tmp_path)
    try:
        before = len(gw.ledger_entries())
        for sql in ["SELECT COUNT(NULL) FROM persons", "SELECT COUNT(*) FROM persons WHERE FALSE",
                    "SELECT sex, SUM(income) FROM persons WHERE 1 = 0 GROUP BY sex",
                    "SELECT COUNT(*) FROM persons WHERE NULL"]:
            with pytest.raises(UnsupportedQuery) as e:
                gw.query("pums", sql, consumer="analysts")
            assert "nothing was charged" in str(e.value)
            with pytest.raises(UnsupportedQuery):
                gw.explain("pums", sql)
        assert len(gw.ledger_entries()) == before
    finally:
        gw.close()


@pytest.mark.parametrize("where", ["tokens = NULL", "tokens IN (NULL)", "NOT tokens = NULL", "NULL = NULL",
                                   "week > 3 AND tokens <> NULL", "tokens = NULL OR week < NULL",
                                   # x IN (…, NULL) is TRUE or NULL, so its NOT is never TRUE (a trial)
                                   "week NOT IN (0, NULL)", "NOT (week IN (3, NULL)) AND tokens > 1"])
def test_a_where_that_no_row_can_satisfy_is_refused_before_the_charge(policy, where):
    """A comparison with a NULL literal is NULL on every row, so such a WHERE selects nothing on
    any data, like ``WHERE FALSE`` (the trial branch found ``WHERE tokens = NULL`` charged)."""
    from dpgate.sql.constant import refuse_constant_plan

    plan = parse_query(f"SELECT COUNT(*) FROM prompts WHERE {where}", policy)
    with pytest.raises(UnsupportedQuery, match="nothing was charged"):
        refuse_constant_plan(plan)


@pytest.mark.parametrize("where", ["tokens IS NULL", "NOT tokens IS NULL", "week > 3 OR tokens = NULL",
                                   "NOT (tokens = NULL AND week > 3)", "COALESCE(tokens, 1) > 0",
                                   "tokens IN (NULL, 3)", "NOT FALSE AND week > 1"])
def test_a_where_that_some_row_may_satisfy_is_planned(policy, where):
    from dpgate.sql.constant import refuse_constant_plan

    refuse_constant_plan(parse_query(f"SELECT COUNT(*) FROM prompts WHERE {where}", policy))


@pytest.mark.parametrize("where", ["week NOT IN (0, 1)", "week IN (0, NULL)", "NOT (week IN (0, NULL) OR tokens > 1) OR week = 3"])
def test_a_where_some_row_can_satisfy_is_not_refused(policy, where):
    from dpgate.sql.constant import refuse_constant_plan

    refuse_constant_plan(parse_query(f"SELECT COUNT(*) FROM prompts WHERE {where}", policy))
