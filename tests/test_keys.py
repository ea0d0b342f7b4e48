"""Computed group keys (issue 10 item 4; dpgate.sql.keys): domains from the policy, released in
full, bounded per (unit, computed key), spelling-independent plans, refusals with hints."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
import tomllib

from dpgate.policy import load_policy, parse_policy as _parse_policy
from dpgate.sensitivity import sensitivities
from dpgate.sql import keys as keys_mod
from dpgate.sql.bound import bounded_sql
from dpgate.sql.explain import explain_query
from dpgate.sql.parse import parse_query
from tests.test_bound import load

FIXTURE = Path(__file__).parent / "fixtures" / "policies" / "planner.toml"


def parse_policy(text, path):
    return _parse_policy(tomllib.loads(text), path)


def key_of(sql, policy):
    plan = parse_query(sql, policy)
    (key,) = plan.computed_keys
    return plan, key


# --- domains ------------------------------------------------------------------------------------


@pytest.mark.parametrize("expr, rule, ktype, domain", [
    # CASE with literal results: the literals in order, NULL without ELSE
    ("CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' ELSE 'old' END",
     "case_literals", "text", ("young", "mid", "old")),
    ("CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' END",
     "case_literals", "text", ("young", "mid", None)),
    ("CASE WHEN age > 90 THEN 1 ELSE 0 END", "case_literals", "int", (1, 0)),
    ("CASE region WHEN 'eu' THEN 'europe' WHEN 'us' THEN 'america' ELSE 'other' END",
     "case_literals", "text", ("europe", "america", "other")),
    ("IF(model LIKE 'gpt%', 'openai', 'other')", "case_literals", "text", ("openai", "other")),
    ("CASE WHEN flagged THEN 1.5 ELSE 2 END", "case_literals", "float", (1.5, 2.0)),
    # a condition: false, true
    ("age > 90", "predicate", "bool", (False, True)),
    ("model IS NULL", "predicate", "bool", (False, True)),
    # integer binning of a bounded int column (age in [0, 100]), enumerated ascending
    ("FLOOR(age / 10) * 10", "enumerated", "float", tuple(float(10 * i) for i in range(11))),
    ("age // 10", "enumerated", "int", tuple(range(11))),
    ("age // 25 * 25", "enumerated", "int", (0, 25, 50, 75, 100)),
    # width_bucket (PostgreSQL semantics): 100 is the upper bound, so bucket n + 1
    ("width_bucket(age, 0, 100, 4)", "enumerated", "int", (1, 2, 3, 4, 5)),
    ("width_bucket(age, 20, 60, 2)", "enumerated", "int", (0, 1, 2, 3)),
    # expressions over public keys
    ("upper(region)", "enumerated", "text", ("AFRICA", "APAC", "EU", "LATAM", "US")),
    ("week // 13", "enumerated", "int", (0, 1, 2, 3)),
    ("LEAST(week, 10) + age // 50", "enumerated", "int", tuple(range(13))),
])
def test_domains(policy, expr, rule, ktype, domain):
    plan, key = key_of(f"SELECT {expr} AS k, COUNT(*) FROM prompts GROUP BY 1", policy)
    assert (key.rule, key.type, key.domain) == (rule, ktype, domain)
    assert plan.key_combinations(policy.table("prompts")) == len(domain)


def test_width_bucket_matches_postgres_semantics():
    """The rewrite agrees with PostgreSQL's width_bucket (values from its documentation:
    width_bucket(5.35, 0.024, 10.06, 5) = 3) and at the edges."""
    import sqlglot

    def wb(x, lo, hi, n):
        tree = keys_mod.width_bucket_to_case(sqlglot.parse_one(f"width_bucket({x}, {lo}, {hi}, {n})"))
        return duckdb.sql(f"SELECT {tree.sql(dialect='duckdb')}").fetchall()[0][0]

    assert wb(5.35, 0.024, 10.06, 5) == 3
    assert [wb(x, 0, 10, 5) for x in (-1, 0, 1.99, 2, 9.99, 10, 11)] == [0, 1, 1, 2, 5, 6, 6]


# --- spelling independence (issue 10 item 8) ---------------------------------------------------


SAME = [
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS band, COUNT(*) AS n FROM prompts "
    "GROUP BY band",
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS band, COUNT(*) AS n FROM prompts "
    "GROUP BY 1",
    "SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END, COUNT(*) FROM prompts "
    "GROUP BY CASE WHEN age < 30 THEN 'young' ELSE 'old' END",
    "select case when AGE<30.0 then 'young' else 'old' end as b2, count(1) as total\n"
    "from prompts p group by 1",
    "SELECT CASE WHEN 30 > age THEN 'young' ELSE 'old' END AS band, COUNT(*) AS n FROM "
    "(SELECT * FROM prompts) s GROUP BY band",
]


def test_computed_key_plan_is_spelling_independent(policy):
    hashes = {parse_query(sql, policy).plan_hash for sql in SAME}
    assert len(hashes) == 1


def test_different_keys_different_hashes(policy):
    a = parse_query("SELECT COUNT(*) FROM prompts GROUP BY age // 10", policy)
    b = parse_query("SELECT COUNT(*) FROM prompts GROUP BY age // 20", policy)
    c = parse_query("SELECT COUNT(*) FROM prompts GROUP BY age > 10", policy)
    assert len({a.plan_hash, b.plan_hash, c.plan_hash}) == 3


def test_key_order_is_canonical(policy):
    a = parse_query("SELECT region, age > 50, COUNT(*) FROM prompts GROUP BY age > 50, region",
                    policy)
    b = parse_query("SELECT age > 50, region, COUNT(*) FROM prompts GROUP BY region, 1", policy)
    assert a.group_by == b.group_by == ("region", "g0")
    assert a.canonical_dict()["computed_keys"] == b.canonical_dict()["computed_keys"]


def test_having_and_order_by_refer_to_a_computed_key(policy):
    plan = parse_query("SELECT age // 10 AS d, COUNT(*) AS n FROM prompts GROUP BY d "
                       "HAVING d > 2 ORDER BY age // 10 DESC", policy)
    assert plan.having == '"g0" > 2'
    assert plan.order_by[0].output == "g0" and plan.order_by[0].descending


def test_a_policy_change_changes_the_hash():
    base = load_policy(FIXTURE)
    text = FIXTURE.read_text().replace("age    = { type = \"int\", lower = 0, upper = 100 }",
                                       "age    = { type = \"int\", lower = 0, upper = 120 }")
    wider = parse_policy(text, FIXTURE)
    sql = "SELECT COUNT(*) FROM prompts GROUP BY age // 10"
    a, b = parse_query(sql, base), parse_query(sql, wider)
    assert len(b.computed_keys[0].domain) == 13 and a.plan_hash != b.plan_hash


def test_explain_shows_each_computed_keys_domain_size(policy):
    doc = explain_query("SELECT age // 10 AS d, region, COUNT(*) FROM prompts GROUP BY 1, 2",
                        policy)
    assert doc["computed_keys"] == [{"name": "g0", "expression": '"age" // 10',
                                     "rule": "enumerated", "type": "int", "domain_size": 11}]
    assert doc["contribution"]["groups"] == 55


# --- refusals ------------------------------------------------------------------------------------


REFUSED = [
    ("SELECT COUNT(*) FROM prompts GROUP BY FLOOR(tokens / 100)", "do not follow from the policy"),
    ("SELECT COUNT(*) FROM prompts GROUP BY lower(model)", "neither public keys nor integer bounds"),
    ("SELECT COUNT(*) FROM prompts GROUP BY CASE WHEN user_id > 5 THEN 'a' ELSE 'b' END",
     "privacy unit"),
    ("SELECT COUNT(*) FROM prompts GROUP BY age // (age - 50)", "fails for some value"),
    ("SELECT COUNT(*) FROM prompts GROUP BY age + random()", "RANDOM() is not allowed"),
    ("SELECT COUNT(*) FROM prompts GROUP BY age + SUM(tokens)", "cannot contain an aggregate"),
    ("SELECT COUNT(*) FROM prompts GROUP BY CASE WHEN age > 3 THEN 'a' ELSE 1 END", "mix types"),
    ("SELECT COUNT(*) FROM prompts GROUP BY CASE WHEN age > 3 THEN NULL END", "every result is NULL"),
    ("SELECT COUNT(*) FROM prompts GROUP BY width_bucket(age, 10, 0, 3)", "width_bucket needs"),
    ("SELECT COUNT(*) FROM prompts GROUP BY width_bucket(age, 0, 100, age)", "width_bucket needs"),
    ("SELECT COUNT(*) FROM prompts GROUP BY CASE WHEN age / 2 > 3 THEN 'a' END", "division"),
]


@pytest.mark.parametrize("sql, text", REFUSED)
def test_refusals(policy, sql, text):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    assert text in str(e.value)


def test_domain_larger_than_the_limit_is_refused_with_a_hint():
    text = FIXTURE.read_text().replace("age    = { type = \"int\", lower = 0, upper = 100 }",
                                       "age    = { type = \"int\", lower = 0, upper = 200000 }")
    pol = parse_policy(text, FIXTURE)
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT COUNT(*) FROM prompts GROUP BY age * 2", pol)
    assert "more than 100,000 keys" in str(e.value) and "coarser bins" in str(e.value)
    assert parse_query("SELECT COUNT(*) FROM prompts GROUP BY age // 1000", pol).computed_keys


def test_too_many_input_combinations_are_refused():
    text = FIXTURE.read_text().replace("age    = { type = \"int\", lower = 0, upper = 100 }",
                                       "age    = { type = \"int\", lower = 0, upper = 5000000 }")
    pol = parse_policy(text, FIXTURE)
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT COUNT(*) FROM prompts GROUP BY age // 100000", pol)
    assert "value combinations" in str(e.value)


# --- execution: released in full, bounded per (unit, computed key) -----------------------------


def _run(con, plan, policy, salt=11):
    res = con.execute(bounded_sql(plan, policy, salt=salt))
    names = [d[0] for d in res.description]
    return [dict(zip(names, r)) for r in res.fetchall()]


def test_every_key_of_the_domain_is_released_empty_ones_as_zero(policy):
    con = duckdb.connect()
    load(con, policy, "prompts", [{"user_id": 1, "age": 15, "region": "eu"},
                                  {"user_id": 2, "age": 95, "region": "us"},
                                  {"user_id": 3, "age": None, "region": "us"},
                                  {"user_id": 4, "age": 250, "region": "us"}])
    plan = parse_query("SELECT CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' END AS b, "
                       "COUNT(*) FROM prompts GROUP BY b", policy)
    rows = _run(con, plan, policy)
    assert [(r["g0"], r["p0"]) for r in rows] == [("young", 1), ("mid", 0), (None, 3)]
    # enumerated: NULL inputs and values outside [lower, upper] are dropped
    plan = parse_query("SELECT age // 10 AS d, COUNT(*) FROM prompts GROUP BY d", policy)
    rows = _run(con, plan, policy)
    assert [r["g0"] for r in rows] == list(range(11))
    assert {r["g0"]: r["p0"] for r in rows if r["p0"]} == {1: 1, 9: 1}


def test_pitfall_relabelling_is_bounded_after_the_computed_key():
    """Issue 10's pitfall: k = 100, m = 1, two units with rows g = 0..99, grouped by
    CASE WHEN g >= 0 THEN 'all' END. Bounded per (unit, g) and then relabelled, each unit
    would add 100 rows to 'all' (200 in total) while the sensitivity assumes m = 1 per group.
    Bounded per (unit, computed key), each adds min(100, m) = 1: the released count is 2."""
    pol = parse_policy("""
[dataset]
name = "pit"
population = "pit-people"
[budget]
epsilon = 1.0
delta = 1e-6
default_query_rho = 0.01
[tables.t]
source = "t.csv"
privacy_unit = "uid"
max_groups_per_unit = 100
max_rows_per_unit = 1
[tables.t.columns]
g = { type = "int", lower = 0, upper = 99 }
""", Path("pit.toml"))
    con = duckdb.connect()
    load(con, pol, "t", [{"uid": u, "g": g} for u in (1, 2) for g in range(100)])
    plan = parse_query("SELECT CASE WHEN g >= 0 THEN 'all' END AS k, COUNT(*) FROM t GROUP BY k",
                       pol)
    rows = _run(con, plan, pol)
    assert [(r["g0"], r["p0"]) for r in rows] == [("all", 2), (None, 0)]
    sens = sensitivities(plan, pol)["p0"]
    # one unit changes at most min(k, |domain|) = 2 groups by at most m = 1 row each
    assert (sens.linf, sens.l1, sens.groups) == (1, 2, 2)
    # the same holds for an enumerated relabelling: g // 100 maps every g to 0
    plan = parse_query("SELECT g // 100 AS k, COUNT(*) FROM t GROUP BY k", pol)
    assert [(r["g0"], r["p0"]) for r in _run(con, plan, pol)] == [(0, 2)]


_KEY_EXPRS = [
    "CASE WHEN age < 30 THEN 'young' WHEN age < 60 THEN 'mid' END",
    "age // 20",
    "age > 50",
    "width_bucket(age, 0, 100, 3)",
    "CASE region WHEN 'eu' THEN 'europe' ELSE 'other' END",
]


@st.composite
def _datasets(draw):
    units = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True))
    rows = []
    for u in units:
        for _ in range(draw(st.integers(1, 8))):
            rows.append({"user_id": u,
                         "age": draw(st.none() | st.integers(-5, 110)),
                         "region": draw(st.sampled_from(["eu", "us", "apac", "xx"])),
                         "tokens": draw(st.floats(-10, 9000, allow_nan=False)),
                         "week": draw(st.integers(0, 51))})
    return rows, draw(st.sampled_from(units))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=_datasets(), key=st.sampled_from(_KEY_EXPRS), second=st.booleans(),
       salt=st.integers(0, 2**63 - 1))
def test_neighbouring_data_moves_the_bounded_vector_by_at_most_the_sensitivity(policy, data, key,
                                                                             second, salt):
    """Removing one unit's rows changes each primitive's exact bounded vector by at most its
    derived Δ1, Δ2 and Δ∞ (k = 2, m = 5 in the fixture), computed keys included."""
    rows, victim = data
    keys = f"{key}, region" if second else key
    plan = parse_query(f"SELECT COUNT(*), SUM(tokens), COUNT(DISTINCT user_id) FROM prompts "
                       f"GROUP BY {keys}", policy)
    con = duckdb.connect()
    load(con, policy, "prompts", rows)
    full = _run(con, plan, policy, salt)
    load(con, policy, "prompts", [r for r in rows if r["user_id"] != victim])
    less = _run(con, plan, policy, salt)
    con.close()
    assert len(full) == len(less) == plan.key_combinations(policy.table("prompts"))
    sens = sensitivities(plan, policy)
    for p in plan.primitives:
        diffs = [abs(a[p.id] - b[p.id]) for a, b in zip(full, less)]
        s = sens[p.id]
        assert max(diffs) <= s.linf
        assert sum(diffs) <= s.l1
        assert sum(d * d for d in diffs) ** 0.5 <= s.l2 + 1e-9


def test_gateway_explain_and_cli_show_computed_keys(tmp_path, capsys):
    from _api_server import make_project

    from dpgate.cli import main
    from dpgate.service import Gateway
    from dpgate.settings import Settings

    project = make_project(tmp_path / "p")
    sql = "SELECT CASE WHEN tokens > 1000 THEN 'long' ELSE 'short' END AS kind, COUNT(*) FROM prompts GROUP BY 1"
    settings = Settings(policies=project / "policies", home=tmp_path / "h")
    with Gateway.open(settings) as gw:
        doc = gw.explain("usage", sql)
    assert doc["computed_keys"][0]["domain_size"] == 2
    assert main(["explain", "--dataset", "usage", "--policies", str(project / "policies"),
                 "--home", str(tmp_path / "h2"), sql]) == 0
    assert "case_literals, 2 key(s)" in capsys.readouterr().out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(upper=st.booleans(), spaces=st.sampled_from([" ", "  ", "\n", "\t "]),
       alias=st.sampled_from(["band", "b", "AgeBand", '"x y"']), by=st.sampled_from(["pos", "alias", "expr"]),
       lit=st.sampled_from(["30", "30.0", "3e1"]), flip=st.booleans(), count=st.sampled_from(["COUNT(*)", "COUNT(1)"]),
       wrap=st.booleans())
def test_canonical_form_is_spelling_independent(policy, upper, spaces, alias, by, lit, flip, count, wrap):
    """Case, whitespace, aliases, GROUP BY position/alias/expression, equivalent literals,
    operand order and an inlined subquery never change the plan hash of a computed-key query."""
    cond = f"{lit} > age" if flip else f"age < {lit}"
    key = f"CASE WHEN {cond} THEN 'young' ELSE 'old' END"
    target = {"pos": "1", "alias": alias, "expr": key}[by]
    source = "(SELECT * FROM prompts) AS s" if wrap else "prompts"
    sql = f"SELECT {key} AS {alias},{spaces}{count} AS n FROM {source} WHERE region = 'eu' GROUP BY {target}"
    if upper:
        sql = sql.replace("SELECT", "select").replace("FROM", "from").replace("GROUP BY", "group by")
    base = parse_query("SELECT CASE WHEN age < 30 THEN 'young' ELSE 'old' END AS band, COUNT(*) AS n "
                       "FROM prompts WHERE region = 'eu' GROUP BY band", policy)
    assert parse_query(sql, policy).plan_hash == base.plan_hash


def test_key_combinations_are_limited_before_the_charge(policy):
    # a trial: three computed keys of 101 values each (age in [0, 100]) released 1,030,301 cells
    # after the charge, though one computed key may have at most 100,000; the product is limited
    with pytest.raises(UnsupportedQuery) as e:
        parse_query("SELECT age + 0 AS a, age + 1 AS b, age + 2 AS c, COUNT(*) FROM prompts GROUP BY a, b, c",
                    policy)
    assert "key combinations" in str(e.value) and "100,000" in str(e.value)
    assert e.value.details["groups"] == 101 ** 3
    # two keys (10,201 combinations) are fine
    assert parse_query("SELECT age + 0 AS a, age + 1 AS b, COUNT(*) FROM prompts GROUP BY a, b", policy)
