"""Issue 21 item 7, the syntax the corpus met: STD, GROUP BY ALL, OFFSET, LEFT keys, int columns
compared with quoted numbers, SELECT * over a subquery or CTE that renames columns.

Each new spelling plans exactly as the query written the long way (same plan hash, so the same
bounded statement, sensitivity and release-cache entry); the neighbouring-data test checks the
bounded vectors of the new spellings directly; hostile spellings are refused before the charge.
The corpus entries are ``dd-*`` in tests/corpus/queries.toml.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.sql.parse import parse_query
from dpgate.sql.plan import QueryPlan
from tests.test_bound import load
from tests.test_keys import _datasets, _run

#: (new spelling, the same query written the long way)
SAME_PLAN = [
    ("SELECT region, STD(tokens) FROM prompts GROUP BY region",
     "SELECT region, STDDEV_POP(tokens) FROM prompts GROUP BY region"),
    ("SELECT region, week % 4 AS w, COUNT(*), SUM(tokens) FROM prompts GROUP BY ALL",
     "SELECT region, week % 4 AS w, COUNT(*), SUM(tokens) FROM prompts GROUP BY region, week % 4"),
    ("SELECT 'x' AS tag, region, COUNT(*) FROM prompts GROUP BY ALL",
     "SELECT 'x' AS tag, region, COUNT(*) FROM prompts GROUP BY region"),
    ("SELECT LEFT(region, 1) AS r1, COUNT(*), SUM(tokens) FROM prompts GROUP BY LEFT(region, 1)",
     "SELECT SUBSTRING(region, 1, 1) AS r1, COUNT(*), SUM(tokens) FROM prompts GROUP BY SUBSTRING(region, 1, 1)"),
    ("SELECT COUNT(*), SUM(tokens) FROM prompts WHERE week >= '10' AND age < ' 40 '",
     "SELECT COUNT(*), SUM(tokens) FROM prompts WHERE week >= 10 AND age < 40"),
    ("SELECT COUNT(*) FROM prompts WHERE week IN ('1', '+2') OR age BETWEEN '-3' AND '07'",
     "SELECT COUNT(*) FROM prompts WHERE week IN (1, 2) OR age BETWEEN -3 AND 7"),
    ("SELECT SUM(CASE WHEN age > '30' THEN tokens ELSE 0 END) FROM prompts",
     "SELECT SUM(CASE WHEN age > 30 THEN tokens ELSE 0 END) FROM prompts"),
    ("SELECT CASE WHEN age > '40' THEN 'old' ELSE 'young' END AS b, COUNT(*) FROM prompts GROUP BY b",
     "SELECT CASE WHEN age > 40 THEN 'old' ELSE 'young' END AS b, COUNT(*) FROM prompts GROUP BY b"),
    ("SELECT SUM(tokens) FROM prompts WHERE tokens < '1e3'",
     "SELECT SUM(tokens) FROM prompts WHERE tokens < 1000"),
    ("SELECT * FROM (SELECT region AS r, COUNT(*) AS n, SUM(tokens) AS s FROM prompts GROUP BY region) AS t",
     "SELECT region AS r, COUNT(*) AS n, SUM(tokens) AS s FROM prompts GROUP BY region"),
    ("WITH t (r, n) AS (SELECT region, COUNT(*) FROM prompts GROUP BY region) SELECT * FROM t",
     "SELECT region AS r, COUNT(*) AS n FROM prompts GROUP BY region"),
    ("SELECT * FROM (SELECT region, COUNT(*) FROM prompts GROUP BY region) AS t (r, n)",
     "SELECT region AS r, COUNT(*) AS n FROM prompts GROUP BY region"),
    ("WITH t (r, w) AS (SELECT region, week FROM prompts) SELECT r, COUNT(*) FROM t WHERE w < 5 GROUP BY r",
     "SELECT region AS r, COUNT(*) FROM prompts WHERE week < 5 GROUP BY region"),
]


@pytest.mark.parametrize("new, old", SAME_PLAN, ids=[p[0][:50] for p in SAME_PLAN])
def test_new_spellings_plan_as_the_long_form(policy, new, old):
    a, b = parse_query(new, policy), parse_query(old, policy)
    assert a.plan_hash == b.plan_hash
    if "SELECT *" in new:  # the inner query's names (a column list renames them)
        assert [o.label for o in a.visible_outputs] == [o.label for o in b.visible_outputs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=_datasets(), sql=st.sampled_from([new for new, _ in SAME_PLAN]), salt=st.integers(0, 2**63 - 1))
def test_neighbouring_data_moves_the_new_spellings_by_at_most_the_sensitivity(policy, data, sql, salt):
    """Removing one unit's rows changes each primitive's exact bounded vector by at most its Δ1,
    Δ2 and Δ∞ (planner fixture: k = 2, m = 5), for the queries in the new spellings."""
    rows, victim = data
    plan = parse_query(sql, policy)
    con = duckdb.connect()
    load(con, policy, "prompts", rows)
    full = _run(con, plan, policy, salt)
    load(con, policy, "prompts", [r for r in rows if r["user_id"] != victim])
    less = _run(con, plan, policy, salt)
    con.close()
    assert len(full) == len(less)
    sens = sensitivities(plan, policy)
    for p in plan.primitives:
        diffs = [abs((a[p.id] or 0) - (b[p.id] or 0)) for a, b in zip(full, less)]
        s = sens[p.id]
        assert max(diffs) <= s.linf + 1e-9
        assert sum(diffs) <= s.l1 + 1e-9
        assert sum(d * d for d in diffs) ** 0.5 <= s.l2 + 1e-9


def test_left_key_is_enumerated_from_the_public_keys(policy):
    plan = parse_query("SELECT LEFT(region, 1) AS r1, COUNT(*) FROM prompts GROUP BY 1", policy)
    (key,) = plan.computed_keys
    # region's public keys: eu, us, apac, latam, africa → first letters, each once
    assert sorted(key.domain) == ["a", "e", "l", "u"]


def test_offset_is_post_processing(policy):
    """OFFSET changes neither the primitives nor the bounded statement: only the rows shown."""
    base = "SELECT week, COUNT(*) AS n FROM prompts GROUP BY week ORDER BY week LIMIT 5"
    a, b = parse_query(base + " OFFSET 5", policy), parse_query(base, policy)
    assert a.primitives == b.primitives and a.group_by == b.group_by and a.where == b.where
    assert (a.offset, b.offset) == (5, 0)
    assert a.plan_hash != b.plan_hash
    assert "offset" not in b.canonical_dict() and a.canonical_dict()["offset"] == 5
    assert a.canonical_sql.endswith("LIMIT 5 OFFSET 5")
    assert QueryPlan.from_dict(a.to_dict()) == a
    assert parse_query(a.canonical_sql, policy).plan_hash == a.plan_hash


def test_offset_slices_the_sorted_released_rows():
    import numpy as np

    from dpgate.postprocess import limit_rows

    order = np.array([4, 2, 0, 3, 1])
    assert limit_rows(order, 2, 1).tolist() == [2, 0]
    assert limit_rows(order, None, 3).tolist() == [3, 1]
    assert limit_rows(order, 5, 9).tolist() == []


@pytest.mark.parametrize("sql, text", [
    # quoted numbers that are not numbers of the compared type (DuckDB: error or another meaning)
    ("SELECT COUNT(*) FROM prompts WHERE age = '8.5'", "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE age = '8a'", "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE age = ''", "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE age IN (1, '2; DROP TABLE prompts')", "not an int literal"),
    ("SELECT COUNT(*) FROM prompts WHERE age = '99999999999999999999'", "64-bit"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens < 'nan'", "not a float literal"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens < 'inf'", "not a float literal"),
    ("SELECT COUNT(*) FROM prompts WHERE tokens < '1e999'", "finite"),
    # the unit stays the unit, whatever the spelling
    ("SELECT COUNT(*) FROM prompts WHERE user_id = '42'", "privacy unit"),
    ("SELECT user_id, COUNT(*) FROM prompts GROUP BY ALL", "privacy unit"),
    ("SELECT * FROM (SELECT user_id, COUNT(*) AS n FROM prompts GROUP BY user_id) AS t", "privacy unit"),
    # SELECT * unwrapped to raw rows is raw rows
    ("SELECT * FROM (SELECT * FROM prompts) AS t", "SELECT *"),
    ("WITH t (a, b) AS (SELECT * FROM prompts) SELECT * FROM t", "SELECT *"),
    ("SELECT * FROM (SELECT region, COUNT(*) FROM prompts GROUP BY region) AS t (r)", "names 1 columns"),
    ("SELECT *, COUNT(*) FROM prompts GROUP BY ALL", "GROUP BY ALL with SELECT *"),
    # LEFT with a count the rewrite does not read as SUBSTRING's length
    ("SELECT LEFT(region, -1) AS r, COUNT(*) FROM prompts GROUP BY 1", "LEFT"),
    ("SELECT LEFT(region, week) AS r, COUNT(*) FROM prompts GROUP BY 1", "LEFT"),
    # OFFSET must be a literal count; not on a top-k selection or a public table
    ("SELECT week, COUNT(*) FROM prompts GROUP BY week ORDER BY week OFFSET -1", "OFFSET"),
    ("SELECT week, COUNT(*) FROM prompts GROUP BY week ORDER BY week OFFSET week", "OFFSET"),
    ("SELECT week, COUNT(*) FROM prompts GROUP BY week ORDER BY week OFFSET 9223372036854775808", "64-bit"),
    ("SELECT region FROM prompts GROUP BY region ORDER BY COUNT(*) DESC LIMIT 2 OFFSET 1", "top-k"),
])
def test_hostile_spellings_are_refused_before_the_charge(policy, sql, text):
    with pytest.raises(UnsupportedQuery) as info:
        parse_query(sql, policy)
    assert text.lower() in info.value.message.lower(), info.value.message


def test_refusals_through_the_gateway_charge_nothing(tmp_path):
    from _api_server import make_project

    from dpgate.errors import DpgateError
    from dpgate.service import Gateway, QueryBudget
    from dpgate.settings import Settings

    project = make_project(tmp_path / "p")
    with Gateway.open(Settings(policies=project / "policies", home=tmp_path / "h")) as gw:
        population = gw.population_of("usage")
        for sql in ("SELECT COUNT(*) FROM prompts WHERE week = '1x'",
                    "SELECT region, COUNT(*) FROM prompts GROUP BY region ORDER BY region OFFSET -1",
                    "SELECT * FROM (SELECT * FROM prompts) AS t"):
            with pytest.raises(DpgateError):
                gw.query("usage", sql, consumer="analysts", budget=QueryBudget(rho=0.01))
        assert gw.ledger.spend(population).charges == 0
        release = gw.query("usage", "SELECT region, COUNT(*) AS n FROM prompts GROUP BY ALL "
                           "ORDER BY region LIMIT 2 OFFSET 1", consumer="analysts",
                           budget=QueryBudget(rho=0.01))
        assert [r[0] for r in release["rows"]] == sorted(k for k in ("eu", "us", "apac", "latam", "africa"))[1:3]
        assert gw.ledger.spend(population).charges == 1
