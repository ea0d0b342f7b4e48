"""Joins inside per-unit subqueries and LEFT JOIN filters of the joined table's own rows (issue 21
item 4; TPC-H Q13: ``SELECT c_count, COUNT(*) FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count
FROM customer LEFT JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE … GROUP BY c_custkey)
GROUP BY c_count``).

The inner join is a :class:`~dpgate.sql.sources.JoinSource` (checked when built: its protected
tables joined on the unit), read by a :class:`~dpgate.sql.sources.PerUnitSource`: each unit keeps at
most k·m of its joined rows (k, m the largest of the joined tables') before the inner aggregates,
and is then one outer row. The neighbouring-data property runs in tests/test_join_properties.py
(the shapes are in its ACCEPTED and REFUSED lists); here the structure, the exact answer of LEFT
JOIN semantics (a unit without matching rows counts 0), and the refusals.
"""

from __future__ import annotations

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.errors import UnsupportedQuery
from dpgate.sql.bound import bounded_sql
from dpgate.sql.parse import parse_query
from dpgate.sql.sources import JoinSource, PerUnitSource, plan_policy
from test_join_properties import _policy, _run, _with_public_rows

Q13 = ("SELECT COUNT(*), SUM(n) FROM (SELECT a.uid, COUNT(b.w) AS n FROM a LEFT JOIN b ON b.uid = a.uid "
       "AND b.w > 0 GROUP BY a.uid) AS t WHERE n = 0")
P_ROWS = [(0, "c0", "u"), (1, "c1", "v")]


def test_the_inner_join_is_a_join_source_read_per_unit():
    policy = _with_public_rows(_policy(), P_ROWS)
    plan = parse_query(Q13, policy)
    node = plan.source
    assert isinstance(node, PerUnitSource) and isinstance(node.inner, JoinSource)
    assert [o.alias for o in node.inner.tables] == ["a", "b"] and node.inner.left_filters == ("b",)
    # k·m of the joined rows: the largest k (b: 3) and m (a: 3) of the two tables
    assert node.inner_bound == 9 and node.view.columns["n"].upper == 9
    assert "b.w > 0" in node.inner.name and "TRY" in node.inner.table.join_sql


_a_row = st.tuples(st.sampled_from(["x", "y"]), st.integers(0, 100), st.integers(0, 3))
_b_row = st.tuples(st.sampled_from(["p", "q"]), st.integers(-50, 50), st.integers(0, 3))
_units = st.lists(st.tuples(st.lists(_a_row, min_size=1, max_size=2), st.lists(_b_row, max_size=2)),
                  min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=_units)
def test_units_without_a_matching_row_count_zero_as_in_duckdb(units):
    """The exact bounded COUNT of units whose LEFT JOIN found no row (b.w > 0) equals DuckDB's answer to
    the analyst's query (the bounds do not bind: at most 2 × 2 joined rows per unit, k·m = 9)."""
    policy = _with_public_rows(_policy(), P_ROWS)
    plan = parse_query(Q13, policy)
    bounded = _run(bounded_sql(plan, plan_policy(plan, policy), salt=5), list(enumerate(units)), P_ROWS)
    con = duckdb.connect()
    try:
        con.execute("CREATE TABLE a (uid BIGINT, g VARCHAR, v BIGINT, pk BIGINT)")
        con.execute("CREATE TABLE b (uid BIGINT, h VARCHAR, w BIGINT, pk BIGINT)")
        for uid, (a_rows, b_rows) in enumerate(units):
            for r in a_rows:
                con.execute("INSERT INTO a VALUES (?, ?, ?, ?)", [uid, *r])
            for r in b_rows:
                con.execute("INSERT INTO b VALUES (?, ?, ?, ?)", [uid, *r])
        (count, total), = con.execute(Q13).fetchall()
    finally:
        con.close()
    expected = sum(1 for _, b_rows in units if not any(w > 0 for _, w, _ in b_rows))  # independently
    assert count == expected and (total or 0) == 0
    assert sorted(v[0] for v in bounded.values()) == sorted([expected, 0])


@pytest.mark.parametrize("sql, words", [
    # an inner join that pairs two units' rows (through a public table; on a non-unit key)
    ("SELECT SUM(n) FROM (SELECT a.uid, COUNT(*) AS n FROM a JOIN p ON a.pk = p.pk JOIN b ON b.pk = p.pk "
     "GROUP BY a.uid) AS t", "must be joined to the other protected tables on the privacy unit"),
    ("SELECT SUM(n) FROM (SELECT a.uid, COUNT(b.w) AS n FROM a JOIN b ON a.pk = b.pk GROUP BY a.uid) AS t",
     "must be joined to the other protected tables on the privacy unit"),
    # grouped by the unit of a table other than the join's first protected one: still the unit
    ("SELECT SUM(n) FROM (SELECT a.uid, COUNT(*) AS n FROM a JOIN b ON a.uid = b.uid GROUP BY b.h) AS t",
     "may only GROUP BY the privacy unit"),
    # public tables only: no unit to group by
    ("SELECT SUM(n) FROM (SELECT p.pk, COUNT(*) AS n FROM p JOIN p q ON p.pk = q.pk GROUP BY p.pk) AS t",
     "must read a protected table"),
    # a LEFT JOIN's ON filter naming an earlier table decides matches by another table's row: refused
    ("SELECT COUNT(*) FROM a LEFT JOIN b ON b.uid = a.uid AND a.v > 3", "non-equi"),
    ("SELECT COUNT(*) FROM a LEFT JOIN b ON b.uid = a.uid AND b.w > a.v", "non-equi"),
])
def test_unsafe_joins_in_per_unit_subqueries_and_left_filters_are_refused(sql, words):
    with pytest.raises(UnsupportedQuery) as e:
        parse_query(sql, _with_public_rows(_policy(), P_ROWS))
    assert words in e.value.message, e.value.message
