"""A WHERE on a key column narrows the released keys (issue 24, item 9; dpgate.sql.narrow).

``WHERE week < 4 GROUP BY week`` with public keys ``range(0, 52)`` releases weeks 0–3. The
predicate is evaluated on the policy's key list, never on data: the neighbouring-data tests
run the same query on D, on D′ (one unit's rows removed), on adversarial data (no row passes
the WHERE, or every row sits in a dropped key) and on empty data, and get the same key set.
"""

from __future__ import annotations

import math
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.policy import load_policies, load_policy
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.narrow import narrow_keys
from dpgate.sql.parse import parse_query

HERE = Path(__file__).parent
PLANNER = HERE / "fixtures" / "policies" / "planner.toml"

POLICY = """
[dataset]
name = "weeks"
population = "weekly-people"
data_version = "v1"

[budget]
epsilon = 8.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

[tables.events]
source = "{source}"
privacy_unit = "user_id"
max_groups_per_unit = 2
max_rows_per_unit = 2

[tables.events.columns]
user_id = {{ type = "int" }}
week    = {{ type = "int", public_keys = "range(0, 52)" }}
region  = {{ type = "text", public_keys = ["eu", "us", "apac"] }}
amount  = {{ type = "float", lower = 0, upper = 100, resolution = 1 }}
"""

REGIONS = ("eu", "us", "apac")


def _rows(users: range, *, weeks=lambda u: u % 52) -> list[str]:
    return [f"{u},{weeks(u)},{REGIONS[u % 3]},{(u * 37) % 101}" for u in users for _ in range(1 + u % 2)]


def _project(root: Path, rows: list[str]) -> Settings:
    root.mkdir(parents=True, exist_ok=True)
    csv = root / "events.csv"
    csv.write_text("\n".join(["user_id,week,region,amount", *rows]) + "\n")
    (root / "policies").mkdir(exist_ok=True)
    (root / "policies" / "weeks.toml").write_text(POLICY.format(source=csv.as_posix()))
    return Settings(policies=root / "policies", home=root / "state")


def _released_keys(settings: Settings, sql: str) -> list:
    with Gateway.open(settings, progress=None) as gw:
        release = gw.query("weeks", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
    cols = release["columns"]
    keys = [c for c in cols if c not in release["accuracy"]]
    return [tuple(r[cols.index(k)] for k in keys) for r in release["rows"]]


@pytest.fixture(scope="module")
def planner():
    return load_policy(PLANNER)


# --------------------------------------------------------------------------- the planner


def test_week_below_four_keeps_weeks_zero_to_three(planner):
    plan = parse_query("SELECT week, COUNT(*) AS n FROM prompts WHERE week < 4 GROUP BY week", planner)
    table = planner.table("prompts")
    assert plan.key_column(table, "week").public_keys == range(0, 4)
    assert plan.key_combinations(table) == 4
    assert plan.canonical_dict()["narrowed_keys"] == [{"column": "week", "range": [0, 4]}]
    # conjuncts over several key columns, and a non-key conjunct that does not narrow
    plan = parse_query("SELECT region, week, COUNT(*) FROM prompts WHERE region IN ('us', 'eu') AND "
                       "week BETWEEN 10 AND 12 AND age > 30 GROUP BY region, week", planner)
    assert plan.key_column(table, "region").public_keys == ("eu", "us")  # the policy's order
    assert plan.key_column(table, "week").public_keys == range(10, 13)
    assert plan.key_combinations(table) == 6
    # one conjunct over two key columns narrows each to the keys of its satisfying combinations
    plan = parse_query("SELECT region, week, COUNT(*) FROM prompts WHERE (region = 'eu' AND week < 2) OR "
                       "(region = 'apac' AND week = 30) GROUP BY region, week", planner)
    assert plan.key_column(table, "region").public_keys == ("eu", "apac")
    assert plan.key_column(table, "week").public_keys == (0, 1, 30)


@pytest.mark.parametrize("where", [
    "week < 4 OR age > 3",            # OR with a non-key column
    "age > 30",                       # no key column
    "week = 3",                       # a key column that is not a group key (GROUP BY region)
    "TRUE",
])
def test_predicates_that_do_not_narrow_keep_the_full_domain_and_the_plan_hash(planner, where):
    sql = f"SELECT region, COUNT(*) FROM prompts WHERE {where} GROUP BY region"
    plan = parse_query(sql, planner)
    assert plan.narrowed_keys == () and "narrowed_keys" not in plan.canonical_dict()
    assert plan.key_combinations(planner.table("prompts")) == 5


def test_narrowing_changes_the_plan_hash_of_such_queries_only(planner):
    narrowed = parse_query("SELECT week, COUNT(*) FROM prompts WHERE week < 4 GROUP BY week", planner)
    import dataclasses

    assert dataclasses.replace(narrowed, narrowed_keys=()).plan_hash != narrowed.plan_hash
    # a plan rebuilt from its stored form keeps the narrowing (and its hash)
    from dpgate.sql.plan import QueryPlan

    again = QueryPlan.from_dict(narrowed.to_dict())
    assert again == narrowed and again.plan_hash == narrowed.plan_hash


def test_a_where_that_leaves_no_key_is_refused_before_any_charge(planner):
    for where in ("week > 100", "week IS NULL", "region = 'mars'"):
        with pytest.raises(UnsupportedQuery, match="leaves no public key") as info:
            parse_query(f"SELECT region, week, COUNT(*) FROM prompts WHERE {where} GROUP BY region, week",
                        planner)
        assert info.value.details["charged"] is False


def test_quantiles_follow_the_narrowed_keys(planner):
    from dpgate.sql.quantile import histogram_sql

    plan = parse_query("SELECT week, MEDIAN(tokens) FROM prompts WHERE week < 3 GROUP BY week", planner)
    sql = histogram_sql(plan, planner, "tokens", salt=1)
    assert "range(0, 3)" in sql and "range(0, 52)" not in sql


def test_narrowing_lowers_k_to_the_released_groups_and_the_sensitivity_with_it(planner):
    # planner.toml: prompts has k = max_groups_per_unit and m = max_rows_per_unit; a COUNT(*) per
    # group moves by at most m per group and min(k, G) groups: L1 = m·min(k, G) (hand derivation)
    table = planner.table("prompts")
    from dpgate.sensitivity import sensitivities

    k, m = table.max_groups_per_unit, table.max_rows_per_unit
    assert k >= 2, "the fixture must allow several groups per unit for this test"
    one = parse_query("SELECT week, COUNT(*) FROM prompts WHERE week = 5 GROUP BY week", planner)
    all_weeks = parse_query("SELECT week, COUNT(*) FROM prompts GROUP BY week", planner)
    assert sensitivities(one, planner)["p0"].l1 == m * min(k, 1)
    assert sensitivities(all_weeks, planner)["p0"].l1 == m * min(k, 52)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["<", "<=", ">", ">=", "=", "<>"]), st.integers(-3, 55)),
                min_size=1, max_size=3),
       st.booleans())
def test_the_kept_keys_are_exactly_those_a_row_can_reach(planner, comparisons, use_or):
    """Exact: on data holding one row per public key, the keys whose row passes the WHERE are the
    kept keys (DuckDB evaluates the same predicate on rows)."""
    joiner = " OR " if use_or else " AND "
    where = joiner.join(f"week {op} {v}" for op, v in comparisons)
    con = duckdb.connect()
    reached = sorted(r[0] for r in con.execute(
        f"SELECT week FROM range(0, 52) AS t(week) WHERE {where}").fetchall())
    con.close()
    sql = f"SELECT week, COUNT(*) FROM prompts WHERE {where} GROUP BY week"
    if not reached:
        with pytest.raises(UnsupportedQuery, match="leaves no public key"):
            parse_query(sql, planner)
        return
    plan = parse_query(sql, planner)
    assert list(plan.key_column(planner.table("prompts"), "week").public_keys) == reached


def test_narrow_keys_skips_what_it_cannot_evaluate(planner):
    table = planner.table("prompts")
    assert narrow_keys(None, table, ["week"]) == ()
    assert narrow_keys('"week" < 4', table, []) == ()
    assert narrow_keys('"tokens" > 4', table, ["week"]) == ()  # no key column in the conjunct


# --------------------------------------------------------------------------- neighbouring data


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(weeks=st.lists(st.integers(0, 51), min_size=1, max_size=4, unique=True),
       other=st.lists(st.tuples(st.integers(2, 40), st.integers(0, 51), st.integers(0, 8000)), max_size=40),
       heavy=st.lists(st.integers(0, 51), min_size=1, max_size=52))
def test_a_unit_moves_narrowed_aggregates_by_at_most_the_derived_sensitivity(planner, weeks, other, heavy):
    """Adversarial neighbours: unit 1 has rows in many weeks (inside and outside the narrowed set);
    removing it moves the bounded COUNT and SUM per released week by at most their sensitivities
    (which use min(k, G) with G the narrowed weeks), and the released weeks stay the same."""
    from test_bound import load

    from dpgate.sensitivity import sensitivities
    from dpgate.sql.bound import bounded_sql

    listed = ", ".join(str(w) for w in weeks)
    sql = f"SELECT week, COUNT(*) AS n, SUM(tokens) AS t FROM prompts WHERE week IN ({listed}) GROUP BY week"
    plan = parse_query(sql, planner)
    sens = sensitivities(plan, planner)
    rows = [{"user_id": u, "region": "eu", "week": w, "tokens": float(t)} for u, w, t in other]
    unit = [{"user_id": 1, "region": "eu", "week": w, "tokens": 8000.0} for w in heavy for _ in range(7)]
    con = duckdb.connect()
    out = []
    for data in (rows + unit, rows):
        load(con, planner, "prompts", data)
        res = con.execute(bounded_sql(plan, planner, salt=3))
        out.append({r[0]: r[1:] for r in res.fetchall()})
    con.close()
    assert list(out[0]) == list(out[1]) == sorted(weeks)  # the same released keys on D and D′
    ids = [p.id for p in plan.primitives]
    for j, pid in enumerate(ids):
        moved = [abs(out[0][w][j] - out[1][w][j]) for w in out[0]]
        assert sum(moved) <= sens[pid].l1 + 1e-9 and math.sqrt(sum(m * m for m in moved)) <= sens[pid].l2 + 1e-9
        assert max(moved) <= sens[pid].linf + 1e-9


def test_the_released_key_set_never_depends_on_the_data(tmp_path):
    sql = "SELECT week, COUNT(*) AS n, SUM(amount) AS s FROM events WHERE week < 4 GROUP BY week"
    d = _rows(range(200))
    d_prime = [r for r in d if not r.startswith("0,")]  # one unit (user 0, week 0) removed
    nowhere = _rows(range(200), weeks=lambda u: 4 + u % 48)  # no row passes the WHERE
    variants = {"D": d, "D'": d_prime, "adversarial": nowhere, "empty": []}
    keys = {name: _released_keys(_project(tmp_path / name.replace("'", "p"), rows), sql)
            for name, rows in variants.items()}
    expected = [(0,), (1,), (2,), (3,)]
    assert all(k == expected for k in keys.values()), keys


def test_quantile_and_two_key_releases_keep_the_narrowed_key_sets_on_any_data(tmp_path):
    queries = {
        "median": "SELECT week, MEDIAN(amount) AS med FROM events WHERE week IN (2, 9) GROUP BY week",
        "two keys": "SELECT region, week, COUNT(*) AS n FROM events WHERE region <> 'us' AND week < 2 "
                    "GROUP BY region, week",
    }
    expected = {"median": [(2,), (9,)],
                "two keys": [("eu", 0), ("eu", 1), ("apac", 0), ("apac", 1)]}
    for name, rows in {"D": _rows(range(120)), "empty": []}.items():
        settings = _project(tmp_path / name, rows)
        for q, sql in queries.items():
            assert sorted(_released_keys(settings, sql)) == sorted(expected[q]), (name, q)


def test_the_demo_policy_releases_the_four_weeks_it_asks_for(tmp_path):
    """``dpgate demo``'s third query (issue 24): four weekly sums, not 52 rows of noisy zeros."""
    from dpgate.cli.demo import DEMO_QUERIES

    policies = load_policies(HERE.parent / "policies")
    (sql,) = [q for _, q, _ in DEMO_QUERIES if "week < 4" in q]
    plan = parse_query(sql, policies["usage"])
    assert plan.key_combinations(policies["usage"].table("prompts")) == 4


def test_the_planners_duckdb_reads_nothing_is_locked_and_kept_per_thread():
    import threading

    from dpgate.engines import duckdb as engine

    engine.evaluate_tableless("SELECT 1")
    con = engine._TABLELESS.con
    engine.evaluate_tableless("SELECT 2")
    assert engine._TABLELESS.con is con  # kept: opening one costs tens of milliseconds
    with pytest.raises(ValueError, match="disabled by configuration"):
        engine.evaluate_tableless("SELECT * FROM read_csv('/etc/passwd')")
    assert engine._TABLELESS.con is None  # dropped after a failure
    with pytest.raises(ValueError, match="locked"):
        engine.evaluate_tableless("SET enable_external_access = true")
    seen = []
    t = threading.Thread(target=lambda: (engine.evaluate_tableless("SELECT 3"), seen.append(engine._TABLELESS.con)))
    t.start()
    t.join()
    assert seen and seen[0] is not engine._TABLELESS.con
