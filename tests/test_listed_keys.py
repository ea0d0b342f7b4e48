"""Keys listed by the query (issue 21 item 7; dpgate.sql.keys, rule ``listed``): a text key over a
column without public keys (``SUBSTRING(c_phone, 1, 2)``, TPC-H Q22) whose WHERE restricts it to
literals releases exactly those literals — a key set from the query text, never from data.

The neighbouring-data test removes one unit and checks the bounded vector moves by at most the
derived sensitivity on the same key set; the adversarial test gives data whose keys all lie
outside the list, NULL keys, and keys that differ from a listed one only by case or padding.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from tests.test_bound import load


def _key(sql, policy):
    plan = parse_query(sql, policy)
    (key,) = plan.computed_keys
    return plan, key


def _run(con, plan, policy, salt=7):
    res = con.execute(bounded_sql(plan, policy, salt=salt))
    names = [d[0] for d in res.description]
    return [dict(zip(names, r)) for r in res.fetchall()]


@pytest.mark.parametrize("sql, domain", [
    ("SELECT SUBSTRING(model, 1, 3) AS p, COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 3) IN ('gpt', 'cla') "
     "GROUP BY p", ("cla", "gpt")),
    # the same key spelled differently in WHERE and GROUP BY; duplicates and NULL in the list
    ("SELECT substr(model, 1, 3), COUNT(*) FROM prompts WHERE SUBSTRING(model FROM 1 FOR 3) IN ('gpt', 'gpt', NULL) "
     "GROUP BY 1", ("gpt",)),
    # one literal by =, and LEFT; two conjuncts intersect
    ("SELECT LEFT(model, 2), COUNT(*) FROM prompts WHERE LEFT(model, 2) = 'gp' GROUP BY 1", ("gp",)),
    ("SELECT LOWER(model) AS m, COUNT(*) FROM prompts WHERE LOWER(model) IN ('a', 'b', 'c') "
     "AND LOWER(model) IN ('b', 'c', 'd') AND age > 3 GROUP BY m", ("b", "c")),
    # a plain text column without public keys is a key of its own (partition selection), but an
    # expression of it takes the list: the empty string and quotes are keys like any other
    ("SELECT TRIM(model) AS m, COUNT(*) FROM prompts WHERE TRIM(model) IN ('', 'it''s') GROUP BY m", ("", "it's")),
    # parenthesised conjunctions, and an OR chain of equalities (trial findings)
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE (SUBSTRING(model, 1, 2) IN ('sm') AND week > 3) "
     "GROUP BY 1", ("sm",)),
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE (SUBSTRING(model, 1, 2) = 'sm' "
     "OR SUBSTRING(model, 1, 2) = 'me') AND age > 1 GROUP BY 1", ("me", "sm")),
])
def test_the_domain_is_the_listed_literals(policy, sql, domain):
    plan, key = _key(sql, policy)
    assert (key.rule, key.type, key.domain) == ("listed", "text", domain)
    assert plan.key_combinations(policy.table("prompts")) == len(domain)


@pytest.mark.parametrize("sql, text", [
    # no list: the policy gives no domain (the hint names the WHERE list)
    ("SELECT SUBSTRING(model, 1, 3), COUNT(*) FROM prompts GROUP BY 1", "WHERE <key> IN"),
    # the list sits under OR / NOT: it does not restrict every kept row
    ("SELECT SUBSTRING(model, 1, 3), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 3) IN ('a') OR age > 3 "
     "GROUP BY 1", "WHERE <key> IN"),
    ("SELECT SUBSTRING(model, 1, 3), COUNT(*) FROM prompts WHERE NOT SUBSTRING(model, 1, 3) IN ('a') GROUP BY 1",
     "WHERE <key> IN"),
    # an OR with another condition keeps rows outside the list
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 2) = 'sm' OR week > 3 "
     "GROUP BY 1", "WHERE <key> IN"),
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 2) = 'a' "
     "AND SUBSTRING(model, 9223372036854775807, 2) = 'a' "
     "GROUP BY 1", "[1, 2147483647]"),
    # a list that is not literals (another column; a subquery is refused elsewhere)
    ("SELECT SUBSTRING(model, 1, 3), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 3) IN ('a', model) "
     "GROUP BY 1", "WHERE <key> IN"),
    # numbers listed for a text key
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 2) IN (13, 31) GROUP BY 1",
     "list quoted text literals"),
    # positions the engines read differently, or on which PostgreSQL fails
    ("SELECT SUBSTRING(model, 0, 2), COUNT(*) FROM prompts WHERE SUBSTRING(model, 0, 2) IN ('a') GROUP BY 1",
     "start must be an integer literal"),
    ("SELECT SUBSTRING(model, 1, -1), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, -1) IN ('a') GROUP BY 1",
     "length must be an integer literal"),
    ("SELECT LEFT(model, age), COUNT(*) FROM prompts WHERE LEFT(model, age) IN ('a') GROUP BY 1",
     "LEFT"),
    # functions that could fail or overflow on some text are not admitted without enumeration
    ("SELECT LENGTH(model) + 1, COUNT(*) FROM prompts WHERE LENGTH(model) + 1 IN (3) GROUP BY 1", "text functions"),
    # only the row filter's IN list counts, never a subquery over data
    ("SELECT SUBSTRING(model, 1, 2), COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 2) IN "
     "(SELECT SUBSTRING(model, 1, 2) FROM prompts) GROUP BY 1", ""),
])
def test_refusals(policy, sql, text):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, policy)
    assert text in e.value.message


def test_the_where_slice_is_type_checked_as_a_row_predicate(policy):
    """SUBSTRING/LEFT/RIGHT in WHERE are text functions of the binder: a number argument is refused."""
    with pytest.raises(UnsupportedQuery, match="SUBSTRING"):
        parse_query("SELECT COUNT(*) FROM prompts WHERE SUBSTRING(age, 1, 2) = '1'", policy)
    plan = parse_query("SELECT COUNT(*) FROM prompts WHERE LEFT(model, 2) = 'xl' OR SUBSTRING(model, 3) = 't'", policy)
    assert plan.computed_keys == ()
    with pytest.raises(UnsupportedQuery, match="RIGHT"):  # no engine-independent rendering yet
        parse_query("SELECT COUNT(*) FROM prompts WHERE RIGHT(model, 2) = 'xl'", policy)


def test_adversarial_data_releases_the_listed_keys_only(policy):
    """Keys outside the list, NULLs and near-misses ('GPT', 'gpt ') are dropped; every listed key is
    released, empty ones as zero: the key set is the list whatever the data."""
    sql = ("SELECT SUBSTRING(model, 1, 3) AS p, COUNT(*) FROM prompts WHERE SUBSTRING(model, 1, 3) IN ('gpt', 'cla') "
           "GROUP BY p")
    plan = parse_query(sql, policy)
    con = duckdb.connect()
    rows = [{"user_id": 1, "model": "gpt-4"}, {"user_id": 2, "model": "GPT-4"}, {"user_id": 3, "model": None},
            {"user_id": 4, "model": "gp"}, {"user_id": 5, "model": "llama"}, {"user_id": 6, "model": "gpt"}]
    load(con, policy, "prompts", rows)
    assert [(r["g0"], r["p0"]) for r in _run(con, plan, policy)] == [("cla", 0), ("gpt", 2)]
    load(con, policy, "prompts", [{"user_id": 9, "model": "zzz"}])  # no row passes
    assert [(r["g0"], r["p0"]) for r in _run(con, plan, policy)] == [("cla", 0), ("gpt", 0)]
    load(con, policy, "prompts", [])
    assert [(r["g0"], r["p0"]) for r in _run(con, plan, policy)] == [("cla", 0), ("gpt", 0)]


@st.composite
def _datasets(draw):
    units = draw(st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True))
    rows = [{"user_id": u, "model": draw(st.none() | st.sampled_from(["gpt-4", "gpt-3", "claude", "cl", "", "x"])),
             "tokens": draw(st.floats(-10, 9000, allow_nan=False))}
            for u in units for _ in range(draw(st.integers(1, 8)))]
    return rows, draw(st.sampled_from(units))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=_datasets(), salt=st.integers(0, 2**63 - 1))
def test_neighbouring_data_moves_the_bounded_vector_by_at_most_the_sensitivity(policy, data, salt):
    """Removing one unit changes each primitive's bounded vector by at most its derived Δ∞, Δ1 and Δ2
    (k = 2, m = 5), and never the released key set."""
    rows, victim = data
    plan = parse_query("SELECT COUNT(*), SUM(tokens) FROM prompts WHERE SUBSTRING(model, 1, 2) IN ('gp', 'cl', 'x') "
                       "GROUP BY SUBSTRING(model, 1, 2)", policy)
    con = duckdb.connect()
    load(con, policy, "prompts", rows)
    full = _run(con, plan, policy, salt)
    load(con, policy, "prompts", [r for r in rows if r["user_id"] != victim])
    less = _run(con, plan, policy, salt)
    assert [r["g0"] for r in full] == [r["g0"] for r in less] == ["cl", "gp", "x"]
    sens = sensitivities(plan, policy)
    for p in plan.primitives:
        diffs = [abs(a[p.id] - b[p.id]) for a, b in zip(full, less)]
        s = sens[p.id]
        assert max(diffs) <= s.linf
        assert sum(diffs) <= s.l1
        assert sum(d * d for d in diffs) ** 0.5 <= s.l2 + 1e-9
