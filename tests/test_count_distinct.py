"""COUNT(DISTINCT col) of any non-unit column (issue 11, part 2).

Bounding: per (unit, kept group) at most m distinct values of the column (the m with the
smallest salted hash), and only the k groups a unit keeps. Removing one unit can only remove
values from the groups' sets, at most its own ≤ m per group, in ≤ k groups — the per-partition
contribution bounding argument of Wilson et al. 2020 ("Differentially private SQL with bounded
user contribution", PoPETs 2020(2), §3) applied to the set of distinct values: Δ∞ = m,
Δ1 = k_eff·m, Δ2 = √k_eff·m. The tests below check the exact values and the neighbouring bound.
"""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.policy import load_policies
from dpgate.sensitivity import sensitivities
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from tests.test_partition_selection import write_policy

BY_REGION = "SELECT region, COUNT(DISTINCT ngram) AS n FROM posts GROUP BY region"


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    out = {}
    for k, m in ((1, 1), (1, 2), (2, 2)):
        folder = tmp_path_factory.mktemp(f"k{k}m{m}")
        src = folder / "posts.csv"
        src.write_text("author,ngram,region,score\n")
        write_policy(folder / "policies", src, k=k, m=m)
        out[(k, m)] = load_policies(folder / "policies")["posts"]
    return out


def _run(policy, sql, rows, salt=99) -> dict:
    plan = parse_query(sql, policy)
    con = duckdb.connect()
    try:
        con.execute('CREATE SCHEMA "posts"')
        con.execute('CREATE TABLE "posts"."posts" (author VARCHAR, ngram VARCHAR, region VARCHAR, score BIGINT)')
        if rows:
            con.executemany('INSERT INTO "posts"."posts" VALUES (?, ?, ?, ?)', rows)
        res = con.execute(bounded_sql(plan, policy, salt=salt)).fetchall()
    finally:
        con.close()
    return {r[0]: int(r[1]) for r in res} if plan.group_by else {None: int(res[0][0])}


def test_parse_count_distinct_and_approx_count_distinct(policies):
    p = policies[(1, 1)]
    a = parse_query("SELECT COUNT(DISTINCT ngram) FROM posts", p)
    b = parse_query("SELECT APPROX_COUNT_DISTINCT(ngram) FROM posts", p)
    assert a.plan_hash == b.plan_hash
    assert [(x.kind, x.column) for x in a.primitives] == [("count_distinct", "ngram")]
    with pytest.raises(UnsupportedQuery):
        parse_query("SELECT COUNT(DISTINCT lower(ngram)) FROM posts", p)
    # COUNT(DISTINCT <unit>) keeps its own primitive (sensitivity 1)
    assert parse_query("SELECT COUNT(DISTINCT author) FROM posts", p).primitives[0].kind == "count_distinct_unit"


@pytest.mark.parametrize("k, m", [(1, 1), (1, 2), (2, 2)])
def test_sensitivity_is_m_per_group(policies, k, m):
    plan = parse_query(BY_REGION, policies[(k, m)])
    s = sensitivities(plan, policies[(k, m)])[plan.primitives[0].id]
    k_eff = min(k, 2)  # two public regions
    assert (s.linf, s.l1, s.l2) == (m, k_eff * m, pytest.approx(math.sqrt(k_eff) * m))


def test_exact_when_within_the_bounds(policies):
    """Each author has ≤ m = 2 distinct n-grams in one region: the bounded count is the true one
    (checked against DuckDB's own COUNT(DISTINCT) on the raw rows)."""
    rows = [(f"a{i}", f"g{i % 5}", "eu", 1) for i in range(40)] + [(f"a{i}", f"h{i % 3}", "eu", 1) for i in range(40)]
    rows += [(f"b{i}", "g1", "us", 1) for i in range(10)] + [(f"b{i}", None, "us", 1) for i in range(10)]
    got = _run(policies[(1, 2)], BY_REGION, rows)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (author VARCHAR, ngram VARCHAR, region VARCHAR, score BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    truth = dict(con.execute("SELECT region, COUNT(DISTINCT ngram) FROM t GROUP BY region").fetchall())
    assert got == truth == {"eu": 8, "us": 1}  # NULL is not a value


def test_a_unit_adds_at_most_m_values(policies):
    """One author with 10 distinct n-grams adds only m = 2 of them."""
    rows = [("solo", f"g{j}", "eu", 1) for j in range(10)]
    assert _run(policies[(1, 2)], BY_REGION, rows)["eu"] == 2
    assert _run(policies[(1, 1)], "SELECT COUNT(DISTINCT ngram) FROM posts", rows)[None] == 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c", "d", "e", None]),
                               st.sampled_from(["eu", "us"])), min_size=1, max_size=40),
       km=st.sampled_from([(1, 1), (1, 2), (2, 2)]), victim=st.integers(0, 5), salt=st.integers(0, 2**63 - 1))
def test_neighbouring_data_moves_each_group_by_at_most_m_in_at_most_k_groups(policies, rows, km, victim, salt):
    k, m = km
    full = [(f"u{u}", g, r, 1) for u, g, r in rows]
    without = [r for r in full if r[0] != f"u{victim}"]
    a, b = _run(policies[km], BY_REGION, full, salt), _run(policies[km], BY_REGION, without, salt)
    diffs = [a[key] - b[key] for key in a]
    assert all(0 <= d <= m for d in diffs)
    assert sum(1 for d in diffs if d) <= k
