"""Joins on the privacy unit plus extra keys, filters in an INNER JOIN's ON, comma joins (issue 21
items 2 and 3).

* Neighbouring data: for each accepted shape (the unit equality plus an extra key ``a.pk = b.pk``,
  in ON, USING-free comma form, LEFT, self-join, with a public table, with a non-equality filter in
  ON) removing one unit's rows moves each exact bounded aggregate by at most its L1/L2/L∞
  sensitivity (hypothesis; the data and helpers of ``tests/test_join_properties.py``: keys drawn
  from a small domain, so extra keys collide across units all the time). Shapes connected only by
  extra keys run through the same test and must be refused.
* Adversarial data: an extra key shared by two units never pairs their rows; NULL extra keys never
  match; type mismatches of an extra key, a unit compared with another column, and a LEFT JOIN's
  non-equality are refused before any charge.
* Spellings: the comma form and the ON filter have the plan (and hash) of the explicit JOIN and
  the WHERE filter.
* Engines: the bounded SQL of an extra-key join renders for DuckDB, PostgreSQL and Spark (no
  server: ``tests/_golden_render.py``), with the extra equality in the join's ON.
"""

from __future__ import annotations

import math

import pytest
import sqlglot
from _golden_render import duckdb_engine, postgres_engine, spark_engine
from hypothesis import HealthCheck, given, settings, strategies as st
from test_join_properties import _p_rows, _policy, _run, _units, _with_public_rows
from test_joins import write

from dpgate.errors import UnsupportedQuery
from dpgate.sensitivity import sensitivities
from dpgate.service import Gateway
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_query, bounded_sql
from dpgate.sql.sources import JoinSource, plan_policy
from dpgate.sql.parse import parse_query
from _engines import as_query

ACCEPTED = [
    "SELECT a.g, COUNT(*), SUM(b.w) FROM a JOIN b ON a.uid = b.uid AND a.pk = b.pk GROUP BY a.g",
    "SELECT COUNT(*), SUM(a.v), COUNT(DISTINCT a.uid) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk",
    "SELECT COUNT(*), SUM(a.v) FROM a, b WHERE uid = b.uid AND a.pk = b.pk AND a.v > 10",
    "SELECT a.g, COUNT(*), COUNT(b.w), SUM(b.w) FROM a LEFT JOIN b ON b.uid = a.uid AND b.pk = a.pk GROUP BY a.g",
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN a a2 ON a1.uid = a2.uid AND a1.pk = a2.pk AND a1.g = a2.g",
    "SELECT p.cat, COUNT(*), SUM(b.w) FROM a, b, p WHERE a.uid = b.uid AND a.pk = b.pk AND p.pk = a.pk GROUP BY p.cat",
    "SELECT COUNT(*), SUM(b.w) FROM a JOIN b ON a.uid = b.uid AND a.v < b.w",
    # the unit equality on the third table only: c1 ⋈ c2 on the extra key is restricted by b's INNER ON
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN a a2 ON a1.pk = a2.pk JOIN b ON b.uid = a1.uid AND b.uid = a2.uid",
    # a LEFT JOIN decided by an extra key alone, its unit tied by a later INNER ON: rows where b
    # matched another unit's row (or none) fail a2.uid = b.uid and are dropped
    "SELECT COUNT(*), COUNT(b.w), SUM(b.w) FROM a a1 LEFT JOIN b ON b.pk = a1.pk "
    "JOIN a a2 ON a2.uid = a1.uid AND a2.uid = b.uid",
]

#: Connected by extra keys only (or through a LEFT-joined hub): the unit graph refuses them.
REFUSED = [
    "SELECT COUNT(*), SUM(b.w) FROM a JOIN b ON a.pk = b.pk",
    "SELECT COUNT(*), SUM(b.w) FROM a, b WHERE a.pk = b.pk AND a.g = 'x'",
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN a a2 ON a1.pk = a2.pk AND a1.g = a2.g",
    "SELECT COUNT(*), SUM(a2.v) FROM a a1 JOIN a a2 ON a1.pk = a2.pk LEFT JOIN b ON b.uid = a1.uid AND b.uid = a2.uid",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=_units, p_rows=_p_rows, sql=st.sampled_from(ACCEPTED + REFUSED), data=st.data())
def test_removing_one_unit_moves_each_extra_key_join_aggregate_by_at_most_the_sensitivity(units, p_rows, sql, data):
    policy = _with_public_rows(_policy(), p_rows)
    try:
        plan = parse_query(sql, policy)
    except UnsupportedQuery as e:
        assert sql in REFUSED, (sql, e.message)
        assert "must be joined to the other protected tables on the privacy unit" in e.message
        return
    assert sql not in REFUSED, f"accepted a join its unit equalities do not connect: {sql}"
    full = plan_policy(plan, policy)
    sens = sensitivities(plan, full)
    bounded = bounded_sql(plan, full, salt=11)
    everyone = list(enumerate(units))
    victim = data.draw(st.integers(0, len(everyone) - 1), label="victim")
    before = _run(bounded, everyone, p_rows)
    after = _run(bounded, [u for u in everyone if u[0] != victim], p_rows)
    for pid, va in before.items():
        diff = [abs(x - y) for x, y in zip(va, after[pid])]
        assert len(va) == len(after[pid])
        assert sum(diff) <= sens[pid].l1, (sql, pid, diff, sens[pid])
        assert max(diff, default=0) <= sens[pid].linf, (sql, pid, diff, sens[pid])
        assert math.sqrt(sum(d * d for d in diff)) <= sens[pid].l2 + 1e-9, (sql, pid, diff, sens[pid])


def test_the_shape_lists_are_what_the_planner_does():
    policy = _with_public_rows(_policy(), [(0, "c0", "u"), (1, "c1", "v")])
    for sql in ACCEPTED:
        assert isinstance(parse_query(sql, policy).source, JoinSource)
    for sql in REFUSED:
        with pytest.raises(UnsupportedQuery, match="on the privacy unit"):
            parse_query(sql, policy)


# --- adversarial data ----------------------------------------------------------------------------

def _count(sql: str, units) -> int:
    policy = _with_public_rows(_policy(), [(0, "c0", "u")])
    plan = parse_query(sql, policy)
    out = _run(bounded_sql(plan, plan_policy(plan, policy), salt=3), list(enumerate(units)), [(0, "c0", "u")])
    (count,) = [v for p, v in zip(plan.primitives, out.values()) if p.kind == "count"][:1]
    return count[0]


def test_an_extra_key_shared_by_two_units_never_pairs_their_rows():
    # units 0 and 1 both have a and b rows with pk = 2: on the extra key alone they would make 4
    # pairs (2 across units); with the unit equality, one pair per unit
    units = [([("x", 1, 2)], [("p", 1, 2)]), ([("y", 1, 2)], [("q", 1, 2)])]
    assert _count("SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.pk = b.pk", units) == 2
    assert _count("SELECT COUNT(*) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk", units) == 2
    # the extra key restricts within a unit: unit 0's b row has another pk
    units = [([("x", 1, 2)], [("p", 1, 3)]), ([("y", 1, 2)], [("q", 1, 2)])]
    assert _count("SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.pk = b.pk", units) == 1


def test_null_extra_keys_never_match():
    units = [([("x", 1, None)], [("p", 1, None)]), ([("y", 1, 1)], [("q", 1, 1)])]
    assert _count("SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.pk = b.pk", units) == 1
    assert _count("SELECT COUNT(*) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk", units) == 1
    # LEFT: unit 0's a row is kept, unmatched (COUNT(b.w) does not count it)
    policy = _with_public_rows(_policy(), [(0, "c0", "u")])
    plan = parse_query("SELECT COUNT(*), COUNT(b.w) FROM a LEFT JOIN b ON b.uid = a.uid AND b.pk = a.pk", policy)
    out = _run(bounded_sql(plan, plan_policy(plan, policy), salt=3), list(enumerate(units)), [(0, "c0", "u")])
    assert [v[0] for v in out.values()] == [2, 1]


@pytest.fixture
def gw(tmp_path):
    g = Gateway.open(Settings(policies=write(tmp_path / "p"), home=tmp_path / "home"))
    yield g
    g.close()


@pytest.mark.parametrize("sql, words", [
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id AND c.genre = m.age", "compares c.genre (text)"),
    ("SELECT COUNT(*) FROM checkouts c, members m WHERE c.member_id = m.id AND c.pages = m.edu", "compares c.pages (int)"),
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id AND c.member_id = m.age",
     "which is not a privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c, members m WHERE c.pages = m.age", "on the privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c, members m WHERE c.pages > 3", "cross joins"),
    ("SELECT COUNT(*) FROM checkouts c LEFT JOIN members m ON c.member_id = m.id AND c.pages < m.age", "LEFT JOIN"),
    ("SELECT COUNT(*) FROM checkouts c LEFT JOIN members m ON c.member_id = m.id AND c.pages = 3", "LEFT JOIN"),
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id AND g.category = 'x' "
     "JOIN genres g ON g.genre = c.genre", "joined after it"),
    ("SELECT COUNT(*) FROM genres g, genres h", "cross joins"),
])
def test_adversarial_joins_are_refused_before_the_charge(gw, sql, words):
    before = gw.ledger.spend("members").charges
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("lib", sql, consumer="analysts")
    assert words in str(e.value)
    assert gw.ledger.spend("members").charges == before


def test_public_comma_join_is_exact_and_free(gw):
    before = gw.ledger.spend("members").charges
    r = gw.query("lib", "SELECT g.category, COUNT(*) AS n FROM genres g, genres h WHERE g.genre = h.genre "
                        "GROUP BY g.category", consumer="analysts")
    assert sorted(map(tuple, r["rows"])) == [("fiction", 3), ("nonfiction", 1)]
    assert gw.ledger.spend("members").charges == before


# --- spellings ------------------------------------------------------------------------------------

@pytest.mark.parametrize("written, explicit", [
    ("SELECT a.g, COUNT(*) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk AND b.w > 0 GROUP BY a.g",
     "SELECT a.g, COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.pk = b.pk WHERE b.w > 0 GROUP BY a.g"),
    ("SELECT g, COUNT(*) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk GROUP BY g",
     "SELECT g, COUNT(*) FROM a JOIN b ON b.uid = a.uid AND b.pk = a.pk GROUP BY g"),
    ("SELECT p.cat, COUNT(*) FROM a, b, p WHERE a.uid = b.uid AND p.pk = a.pk GROUP BY p.cat",
     "SELECT p.cat, COUNT(*) FROM a JOIN b ON a.uid = b.uid JOIN p ON p.pk = a.pk GROUP BY p.cat"),
    ("SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid AND a.v < b.w AND b.h = 'p'",
     "SELECT COUNT(*) FROM a JOIN b ON a.uid = b.uid WHERE a.v < b.w AND b.h = 'p'"),
])
def test_comma_joins_and_on_filters_have_the_explicit_query_plan(written, explicit):
    policy = _with_public_rows(_policy(), [(0, "c0", "u"), (1, "c1", "v")])
    assert parse_query(written, policy).plan_hash == parse_query(explicit, policy).plan_hash


def test_extra_keys_are_in_the_canonical_join_and_rebuilt_from_it():
    policy = _with_public_rows(_policy(), [(0, "c0", "u")])
    plan = parse_query("SELECT COUNT(*) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk", policy)
    assert plan.table == "JOIN a JOIN b ON a.uid = b.uid AND a.pk = b.pk"
    assert [c.unit_edge for c in plan.source.conditions] == [True, False]
    assert plan.source.unit_graph.edges == plan.source.unit_edges == (("a", "b"),)


# --- engines ---------------------------------------------------------------------------------------

def test_extra_key_joins_render_on_every_engine():
    policy = _with_public_rows(_policy(), [(0, "c0", "u")])
    plan = parse_query("SELECT a.g, COUNT(*), SUM(b.w) FROM a, b WHERE a.uid = b.uid AND a.pk = b.pk "
                       "AND a.v < b.w GROUP BY a.g", policy)
    full = plan_policy(plan, policy)
    sql = bounded_query(plan, full, salt=0)  # the planner's tree (typed: PostgreSQL/Spark rewrite its TRY)
    engines = {"duckdb": duckdb_engine(full), "postgres": postgres_engine(full), "spark": spark_engine(full)}
    dialects = {"duckdb": "duckdb", "postgres": "postgres", "spark": "spark"}
    rendered = 0
    for name, engine in engines.items():
        if engine is None:  # pyspark not installed
            continue
        text = engine.render(as_query(sql))
        tree = sqlglot.parse_one(text, read=dialects[name])  # valid in the engine's dialect
        ons = [j.args.get("on") for j in tree.find_all(sqlglot.exp.Join) if j.args.get("on") is not None]
        assert any(len([c for c in on.find_all(sqlglot.exp.EQ)]) == 2 for on in ons), (name, text)
        rendered += 1
    assert rendered >= 2
