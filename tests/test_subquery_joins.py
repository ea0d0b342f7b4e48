"""Joins inside a FROM subquery or a CTE (issue 21 item 4): rule ``merge_derived_tables`` merges
a derived table over a join into an outer query that reads it alone, so the query gets the flat
join's plan — and with it the join's checks (unit connectivity, typed equalities) and its
bounding, whose neighbouring-data property test (tests/test_joins.py, which runs these spellings
too) covers them.

Checked here: the merge is sound (hypothesis: on random tables with NULLs, NaN and duplicate
keys, DuckDB gives the same rows for the written query and the merged one — the rule is an
equivalence of SQL, not only of plans); each spelling has the flat join's plan hash; what the
merge refuses, and that the join's own refusals still apply after it, with nothing charged.
"""

from __future__ import annotations

import math
from collections import Counter

import duckdb
import pytest
import sqlglot
from hypothesis import given, settings, strategies as st
from sqlglot import exp

from test_joins import gw  # noqa: F401  (the library gateway fixture)

from dpgate.errors import UnsupportedQuery
from dpgate.service import QueryBudget
from dpgate.sql.rules import apply_syntax_rules, merge_derived_tables

gw = gw  # re-exported fixture

#: (written with a subquery or CTE over a join, the flat join it means)
SPELLINGS = [
    ("SELECT genre, COUNT(*) AS n, SUM(p2) AS s FROM (SELECT c.genre, c.pages * 2 AS p2, m.age FROM checkouts c "
     "JOIN members m ON c.member_id = m.id WHERE m.age > 30) s WHERE s.p2 < 500 GROUP BY genre",
     "SELECT c.genre, COUNT(*) AS n, SUM(c.pages * 2) AS s FROM checkouts c JOIN members m ON c.member_id = m.id "
     "WHERE m.age > 30 AND c.pages * 2 < 500 GROUP BY c.genre"),
    ("WITH j AS (SELECT c.genre AS g, m.edu FROM checkouts c, members m WHERE c.member_id = m.id) "
     "SELECT g, edu, COUNT(*) FROM j GROUP BY g, edu",
     "SELECT c.genre AS g, m.edu, COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id "
     "GROUP BY c.genre, m.edu"),
    ("SELECT category, COUNT(*) FROM (SELECT g.category FROM checkouts c JOIN genres g ON c.genre = g.genre) x "
     "GROUP BY category",
     "SELECT g.category, COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre GROUP BY g.category"),
    ("SELECT genre, COUNT(age) FROM (SELECT c.genre, m.age FROM checkouts c LEFT JOIN members m "
     "ON c.member_id = m.id) t WHERE genre <> 'poetry' GROUP BY genre",
     "SELECT c.genre, COUNT(m.age) FROM checkouts c LEFT JOIN members m ON c.member_id = m.id "
     "WHERE c.genre <> 'poetry' GROUP BY c.genre"),
    ("SELECT edu, SUM(pages) FROM (SELECT * FROM (SELECT m.edu, c.pages FROM checkouts c JOIN members m "
     "ON c.member_id = m.id WHERE c.pages > 0) a) b GROUP BY edu",
     "SELECT m.edu, SUM(c.pages) FROM checkouts c JOIN members m ON c.member_id = m.id WHERE c.pages > 0 "
     "GROUP BY m.edu"),
]


@pytest.mark.parametrize("written,flat", SPELLINGS)
def test_a_subquery_over_a_join_has_the_flat_joins_plan(gw, written, flat):
    assert gw.compile("lib", written)[1].plan_hash == gw.compile("lib", flat)[1].plan_hash


@pytest.mark.parametrize("sql,words", [
    ("SELECT COUNT(*) FROM (SELECT * FROM checkouts c JOIN members m ON c.member_id = m.id) s",
     "SELECT * in a subquery with joins"),
    # SELECT * with no other clause is the join's own query: a raw column of a protected table
    ("SELECT * FROM (SELECT c.genre FROM checkouts c JOIN members m ON c.member_id = m.id) s", "raw column"),
    ("SELECT COUNT(*) FROM (SELECT c.genre FROM checkouts c JOIN members m ON c.member_id = m.id) s "
     "JOIN genres g ON s.genre = g.genre", "itself joined to other tables"),
    ("SELECT COUNT(*) FROM (SELECT c.genre FROM checkouts c JOIN (SELECT id FROM members) m "
     "ON c.member_id = m.id) s", "only declared tables can be joined"),
    # the join's own checks apply after the merge: two units paired, a cross join
    ("SELECT COUNT(*) FROM (SELECT c.genre FROM checkouts c JOIN members m ON c.pages = m.age) s",
     "must be joined to the other protected tables on the privacy unit"),
    ("SELECT COUNT(*) FROM (SELECT c.genre FROM checkouts c, members m) s", "cross joins are not supported"),
    ("SELECT COUNT(*) FROM (SELECT c.genre, COUNT(*) AS n FROM checkouts c JOIN members m "
     "ON c.member_id = m.id GROUP BY c.genre) s", "may only GROUP BY the privacy unit"),  # a join inside: issue 21 item 4
    ("SELECT COUNT(*) FROM (SELECT c.genre AS x, m.edu AS x FROM checkouts c JOIN members m "
     "ON c.member_id = m.id) s", "two columns named"),
    ("SELECT nope FROM (SELECT c.genre FROM checkouts c JOIN members m ON c.member_id = m.id) s GROUP BY nope",
     "no column"),
])
def test_refusals_name_the_construct_and_charge_nothing(gw, sql, words):
    before = gw.ledger.spend("members").charges
    with pytest.raises(Exception) as e:
        gw.query("lib", sql, consumer="analysts", budget=QueryBudget(rho=1.0))
    assert words in str(e.value)
    assert getattr(e.value, "status", 400) < 500 or isinstance(e.value, UnsupportedQuery)
    assert gw.ledger.spend("members").charges == before


def test_a_subquery_over_a_join_is_answered_like_the_flat_join(gw):
    written, flat = SPELLINGS[2]
    a = gw.query("lib", written, consumer="analysts", budget=QueryBudget(rho=100.0))
    b = gw.query("lib", flat, consumer="analysts", budget=QueryBudget(rho=100.0))
    assert b["cached"] is True and a["rows"] == b["rows"]  # the same release: one charge
    assert gw.ledger.spend("members").charges == 1


# -- the rule is an equivalence of SQL (DuckDB is the oracle) -------------------------------------

_ids = st.one_of(st.none(), st.integers(0, 4))
_pages = st.one_of(st.none(), st.integers(-3, 3), st.just(2**40))
_ages = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32))
_genres = st.one_of(st.none(), st.sampled_from(["fantasy", "mystery", "poetry"]))


@settings(max_examples=60, deadline=None)
@given(checkouts=st.lists(st.tuples(_ids, _genres, _pages), max_size=12),
       members=st.lists(st.tuples(_ids, st.sampled_from(["hs", "ba"]), _ages), max_size=6),
       genres=st.lists(st.tuples(_genres, st.sampled_from(["fiction", "nonfiction"])), max_size=5),
       index=st.integers(0, len(SPELLINGS) - 1))
def test_the_merge_gives_the_same_rows_as_the_written_query(checkouts, members, genres, index):
    con = duckdb.connect()
    con.execute("CREATE TABLE checkouts (member_id BIGINT, genre VARCHAR, pages BIGINT)")
    con.execute("CREATE TABLE members (id BIGINT, edu VARCHAR, age DOUBLE)")
    con.execute("CREATE TABLE genres (genre VARCHAR, category VARCHAR)")
    for name, rows in (("checkouts", checkouts), ("members", members), ("genres", genres)):
        if rows:
            con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    written = SPELLINGS[index][0]
    merged = merge_derived_tables(apply_syntax_rules(sqlglot.parse_one(written, read="duckdb")))
    assert merged.find(exp.Subquery) is None  # merged: no derived table left

    def rows(sql):
        return Counter(tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in r)
                       for r in con.execute(sql).fetchall())

    assert rows(merged.sql(dialect="duckdb")) == rows(written)

