"""Joins (issue 12 item 2): protected tables joined on the privacy unit, public tables joined on
declared columns, bounding after the join (neighbouring-data property with fan-out), refusals."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings, strategies as st

from _library import checkouts_rows, csv_text, members_rows, write_library

from dpgate.errors import UnsupportedQuery
from dpgate.policy import load_policy
from dpgate.service import Gateway, QueryBudget
from dpgate.settings import Settings
from dpgate.sql.bound import bounded_sql
from dpgate.sql.sources import JoinSource, plan_policy
from dpgate.sql.parse import parse_query

TABLES = """
[tables.checkouts]
source = "checkouts.csv"
privacy_unit = "member_id"
max_groups_per_unit = 2
max_rows_per_unit = 3

[tables.checkouts.columns]
member_id = { type = "int" }
genre = { type = "text", public_keys = ["fantasy", "mystery", "history", "poetry"] }
pages = { type = "int", lower = 0, upper = 1000 }

[tables.members]
source = "members.csv"
privacy_unit = "id"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.members.columns]
id = { type = "int" }
edu = { type = "text", public_keys = ["hs", "ba", "ma"] }
age = { type = "int", lower = 0, upper = 120 }

[tables.genres]
source = "genres.csv"
public = true

[tables.genres.columns]
genre = { type = "text", public_keys = ["fantasy", "mystery", "history", "poetry"] }
category = { type = "text", public_keys = ["fiction", "nonfiction"] }
"""

GENRES = [("fantasy", "fiction"), ("mystery", "fiction"), ("history", "nonfiction"), ("poetry", "fiction")]


def write(root: Path) -> Path:
    return write_library(root, TABLES, genres_csv=csv_text("genre,category", GENRES), epsilon=100000.0,
                         members=True)


@pytest.fixture
def gw(tmp_path):
    g = Gateway.open(Settings(policies=write(tmp_path / "p"), home=tmp_path / "home"))
    yield g
    g.close()


def policy(tmp_path: Path):
    return load_policy(write(tmp_path) / "lib.toml")


# --- planning ------------------------------------------------------------------------------------


def test_spellings_of_one_unit_join_share_a_plan(tmp_path):
    pol = policy(tmp_path / "a")
    a = parse_query("SELECT m.edu, COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY m.edu", pol)
    b = parse_query("SELECT edu, COUNT(*) n FROM checkouts INNER JOIN members ON members.id = checkouts.member_id "
                    "GROUP BY edu", pol)
    assert a.plan_hash == b.plan_hash
    joined = plan_policy(a, pol).table(a.table)
    assert isinstance(a.source, JoinSource) and joined is a.source.table and joined.privacy_unit == "member_id"
    assert (joined.max_groups_per_unit, joined.max_rows_per_unit) == (2, 3)  # the largest of the tables'
    assert a.canonical_sql.endswith('FROM checkouts JOIN members ON checkouts.member_id = members.id GROUP BY "edu"')


@pytest.mark.parametrize("sql, words", [
    # an equality of other columns is an extra key (issue 21 item 2): it does not connect the unit graph
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.pages = m.age",
     "must be joined to the other protected tables on the privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c JOIN checkouts d ON c.genre = d.genre",
     "must be joined to the other protected tables on the privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.age", "which is not a privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c CROSS JOIN members m", "cross joins"),
    ("SELECT COUNT(*) FROM checkouts c, members m", "cross joins"),
    # an INNER JOIN's non-equality only filters rows (it moves to WHERE): alone it leaves a cross join
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON c.member_id < m.id", "cross join"),
    ("SELECT COUNT(*) FROM checkouts c LEFT JOIN members m ON c.member_id = m.id AND c.pages > 3", "non-equi"),
    ("SELECT COUNT(*) FROM checkouts c RIGHT JOIN members m ON c.member_id = m.id", "RIGHT JOIN"),
    ("SELECT COUNT(*) FROM checkouts c FULL JOIN members m ON c.member_id = m.id", "FULL JOIN"),
    ("SELECT COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre JOIN members m ON m.edu = g.category",
     "must be joined to the other protected tables on the privacy unit"),
    ("SELECT COUNT(*) FROM checkouts c JOIN (SELECT * FROM members) m ON c.member_id = m.id", "only declared tables"),
    ("SELECT genre, COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre GROUP BY genre", "ambiguous"),
    ("SELECT m.id, COUNT(*) FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY m.id", "privacy unit"),
    # a trial: a public table joined on the unit labelled each unit with a public key (one cell per person)
    ("SELECT g.category, COUNT(*) FROM checkouts c JOIN genres g ON c.member_id = g.genre GROUP BY g.category",
     "cannot be joined on the privacy unit"),
    ("SELECT g.category, COUNT(*) FROM genres g JOIN checkouts c ON g.genre = c.member_id GROUP BY g.category",
     "cannot be joined on the privacy unit"),
    # a self-join of six copies: r rows per unit become r^6 joined rows before the caps (limits)
    ("SELECT COUNT(*) FROM checkouts a JOIN checkouts b ON b.member_id = a.member_id JOIN checkouts c "
     "ON c.member_id = a.member_id JOIN checkouts d ON d.member_id = a.member_id JOIN checkouts e "
     "ON e.member_id = a.member_id JOIN members m ON m.id = a.member_id",
     "6 protected table occurrences, more than 5"),
])
def test_refusals_charge_nothing(gw, sql, words):
    before = gw.ledger.spend("members").charges
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("lib", sql, consumer="analysts")
    assert words in str(e.value)
    assert gw.ledger.spend("members").charges == before


# --- answers --------------------------------------------------------------------------------------


def _exact(tmp_path: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    for t in ("checkouts", "members", "genres"):
        con.execute(f"CREATE TABLE {t} AS SELECT * FROM read_csv('{tmp_path / 'p' / (t + '.csv')}')")
    return con.execute(sql).fetchall()


def test_unit_join_and_public_join_answers(gw, tmp_path):
    # members has one row per unit, so the join does not multiply; with m = 3 per group and
    # k = 2 the bounded count by edu is the exact join count capped per member
    r = gw.query("lib", "SELECT m.edu, COUNT(*) AS n FROM checkouts c JOIN members m "
                        "ON c.member_id = m.id GROUP BY m.edu", consumer="analysts", budget=QueryBudget(rho=1000.0))
    exact = dict(_exact(tmp_path, "SELECT edu, SUM(LEAST(n, 3)) FROM (SELECT m.id, m.edu, COUNT(*) n FROM checkouts c "
                                  "JOIN members m ON c.member_id = m.id GROUP BY m.id, m.edu) GROUP BY edu"))
    for edu, n in r["rows"]:
        assert abs(n - exact[edu]) <= 5 * r["accuracy"]["n"]["sigma"] + 1
    # a public table on a declared column, three tables, a quantile after the join
    r = gw.query("lib", "SELECT g.category, COUNT(*), MEDIAN(m.age) FROM checkouts c JOIN members m ON c.member_id = m.id "
                 "JOIN genres g ON g.genre = c.genre GROUP BY g.category", consumer="analysts",
                 budget=QueryBudget(rho=1000.0))
    assert [row[0] for row in r["rows"]] == ["fiction", "nonfiction"]
    assert all(0 <= row[2] <= 120 for row in r["rows"])
    ex = gw.explain("lib", "SELECT g.category, COUNT(*) FROM checkouts c JOIN genres g ON g.genre = c.genre "
                    "GROUP BY g.category")
    assert ex["join"]["tables"] == ["checkouts", "genres"] and "after the join" in ex["join"]["bounding"]
    assert "JOIN" in ex["bounded_sql"]


def test_public_table_as_key_source_releases_every_key(gw):
    r = gw.query("lib", "SELECT g.genre, COUNT(c.pages) AS n FROM genres g LEFT JOIN checkouts c ON c.genre = g.genre "
                 "GROUP BY g.genre", consumer="analysts", budget=QueryBudget(rho=1000.0))
    assert [row[0] for row in r["rows"]] == ["fantasy", "mystery", "history", "poetry"]
    assert abs(r["rows"][3][1]) <= 5 * r["accuracy"]["n"]["sigma"] + 1  # poetry: no checkouts, a noisy zero
    assert r["charge"] is not None


def test_public_only_join_is_exact_and_free(gw, tmp_path):
    r = gw.query("lib", "SELECT a.category, COUNT(*) FROM genres a JOIN genres b ON a.genre = b.genre "
                 "GROUP BY a.category", consumer="analysts")
    assert r["charge"] is None and r["public"] is True
    assert [tuple(x) for x in r["rows"]] == [("fiction", 3), ("nonfiction", 1)]


# --- bounding after the join: one unit's rows multiplying through the join ----------------------


def _load(con, checkouts, members, genres):
    con.execute("CREATE SCHEMA IF NOT EXISTS lib")
    con.execute("CREATE OR REPLACE TABLE lib.checkouts (member_id BIGINT, genre VARCHAR, pages BIGINT)")
    con.execute("CREATE OR REPLACE TABLE lib.members (id BIGINT, edu VARCHAR, age BIGINT)")
    con.execute("CREATE OR REPLACE TABLE lib.genres (genre VARCHAR, category VARCHAR)")
    for name, rows in (("checkouts", checkouts), ("members", members), ("genres", genres)):
        if rows:
            con.executemany(f"INSERT INTO lib.{name} VALUES ({', '.join('?' * len(rows[0]))})", rows)


@settings(max_examples=25, deadline=None)
@given(n_checkouts=st.integers(1, 30), n_member_rows=st.integers(1, 4), dup_genres=st.integers(0, 3),
       genres=st.lists(st.sampled_from(["fantasy", "mystery", "history", "poetry"]), min_size=1, max_size=30),
       pages=st.integers(-500, 5000),
       query=st.sampled_from([
           "SELECT m.edu, COUNT(*), SUM(c.pages) FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY m.edu",
           "SELECT g.category, COUNT(*), SUM(c.pages) FROM checkouts c JOIN genres g ON c.genre = g.genre "
           "GROUP BY g.category",
           "SELECT c.genre, COUNT(*), SUM(m.age) FROM checkouts c JOIN members m ON c.member_id = m.id "
           "JOIN genres g ON g.genre = c.genre GROUP BY c.genre",
           "SELECT g.genre, COUNT(c.pages), SUM(c.pages) FROM genres g LEFT JOIN checkouts c ON c.genre = g.genre "
           "GROUP BY g.genre",
           # joins inside a subquery or a CTE (issue 21 item 4; merged by rule merge_derived_tables)
           "SELECT edu, COUNT(*), SUM(pages) FROM (SELECT m.edu, c.pages FROM checkouts c JOIN members m "
           "ON c.member_id = m.id) AS s GROUP BY edu",
           "WITH j AS (SELECT g.category, c.pages FROM checkouts c, genres g WHERE c.genre = g.genre) "
           "SELECT category, COUNT(*), SUM(pages) FROM j GROUP BY category",
       ]))
def test_one_unit_moves_bounded_aggregates_by_at_most_the_sensitivity(tmp_path_factory, n_checkouts, n_member_rows,
                                                                     dup_genres, genres, pages, query):
    """Adding one unit with many checkouts AND several member rows (its rows multiply: n × r joined
    rows) and duplicated public genre rows (fan-out on a non-unique public key) moves each bounded
    count by ≤ m and each bounded sum by ≤ m·max|bound|, in at most k groups."""
    pol = policy(tmp_path_factory.mktemp("j"))
    plan = parse_query(query, pol)
    full = plan_policy(plan, pol)
    joined = full.table(plan.table)
    k, m = joined.max_groups_per_unit, joined.max_rows_per_unit
    genre_rows = GENRES + [g for g in GENRES for _ in range(dup_genres)]
    con = duckdb.connect()
    _load(con, checkouts_rows(60), members_rows(), genre_rows)
    sql = bounded_sql(plan, full, salt=7)
    before = con.execute(sql).fetchall()
    unit = 999
    con.executemany("INSERT INTO lib.checkouts VALUES (?, ?, ?)",
                    [(unit, genres[i % len(genres)], pages) for i in range(n_checkouts)])
    con.executemany("INSERT INTO lib.members VALUES (?, ?, ?)", [(unit, "ba", 200) for _ in range(n_member_rows)])
    after = con.execute(sql).fetchall()
    assert len(before) == len(after)
    sum_column = next(p for p in plan.primitives if p.kind == "sum").column
    bound = max(abs(joined.column(sum_column).lower), abs(joined.column(sum_column).upper))
    changed = 0
    for b, a in zip(before, after):
        assert b[0] == a[0]
        d_count, d_sum = abs(a[1] - b[1]), abs(a[2] - b[2])
        assert d_count <= m and d_sum <= m * bound
        changed += (d_count, d_sum) != (0, 0)
    assert 1 <= changed <= k  # the unit's joined rows do reach the release (the test is not vacuous)


def test_public_key_source_without_declared_keys(tmp_path):
    """genres.genre declares no public_keys: its values (public data) are the keys."""
    root = tmp_path / "p"
    write(root)
    text = (root / "policies" / "lib.toml").read_text().replace(
        'genre = { type = "text", public_keys = ["fantasy", "mystery", "history", "poetry"] }\ncategory',
        'genre = { type = "text" }\ncategory')
    (root / "policies" / "lib.toml").write_text(text)
    g = Gateway.open(Settings(policies=root / "policies", home=tmp_path / "home"))
    try:
        sql = ("SELECT g.genre, COUNT(c.pages) AS n FROM genres g LEFT JOIN checkouts c ON c.genre = g.genre "
               "GROUP BY g.genre")
        r = g.query("lib", sql, consumer="analysts", budget=QueryBudget(rho=1000.0))
        assert [row[0] for row in r["rows"]] == ["fantasy", "history", "mystery", "poetry"]  # the table's values
        assert abs(dict(r["rows"])["poetry"]) <= 5 * r["accuracy"]["n"]["sigma"] + 1
        # a protected table's key-less column is selected privately (issue 11)
        r2 = g.query("lib", "SELECT g.category, COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre "
                     "GROUP BY g.category, c.pages", consumer="analysts")
        assert "pages" in r2["partition_selection"]["selected_keys"]
    finally:
        g.close()


# --- the unit graph (issue 19 item 1) ------------------------------------------------------------

#: The audit's query: c2 and c3 (one member's rows) are linked to c1 only through the public genres
#: table, so every c1 member of the genre was credited with them.
AUDIT = ("SELECT COUNT(*), COUNT(DISTINCT c1.member_id) FROM checkouts c1 JOIN genres g ON c1.genre = g.genre "
         "JOIN checkouts c2 ON c2.genre = g.genre JOIN checkouts c3 ON c3.member_id = c2.member_id "
         "WHERE c2.pages = 999")


def test_the_audit_query_is_refused_before_the_charge_naming_the_table(gw):
    """Before the fix: adding one member with one checkout (genre fantasy, 999 pages) moved the exact
    bounded COUNT(*) from 0 to 101 and COUNT(DISTINCT c1.member_id) from 0 to 51 (the 50 members'
    2 fantasy checkouts each, and its own), against stated sensitivities 3 and 1 (m = 3)."""
    before = gw.ledger.spend("members").charges
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("lib", AUDIT, consumer="analysts", budget=QueryBudget(rho=1.0))
    assert "protected table checkouts (c2) must be joined to the other protected tables on the privacy unit" \
        in e.value.message and "through a public table" in e.value.message
    assert e.value.details["table"] == "checkouts (c2)" and e.value.details["charged"] is False
    assert gw.ledger.spend("members").charges == before


def test_the_audit_numbers_are_what_the_old_join_released(tmp_path):
    """The rows the refused join would have produced, computed by hand on the same data: what one
    member added (so the refusal is not a matter of taste). c1 is credited with c2's rows."""
    con = duckdb.connect()
    _load(con, checkouts_rows(300), members_rows(), GENRES)
    sql = ("SELECT COUNT(*), COUNT(DISTINCT c1.member_id) FROM (SELECT c1.member_id FROM lib.checkouts c1 "
           "JOIN lib.genres g ON c1.genre = g.genre JOIN lib.checkouts c2 ON c2.genre = g.genre "
           "JOIN lib.checkouts c3 ON c3.member_id = c2.member_id WHERE c2.pages = 999 "
           "QUALIFY row_number() OVER (PARTITION BY c1.member_id) <= 3) c1")
    assert con.execute(sql).fetchall() == [(0, 0)]
    con.execute("INSERT INTO lib.checkouts VALUES (999, 'fantasy', 999)")
    assert con.execute(sql).fetchall() == [(101, 51)]  # vs sensitivities m = 3 and 1


@pytest.mark.parametrize("sql", [
    # a chain on the unit up to limits.MAX_PROTECTED_OCCURRENCES (5) tables, through a public table too
    "SELECT COUNT(*) FROM checkouts c1 JOIN checkouts c2 ON c2.member_id = c1.member_id "
    "JOIN checkouts c3 ON c3.member_id = c2.member_id JOIN checkouts c4 ON c4.member_id = c3.member_id "
    "JOIN members m ON m.id = c4.member_id",
    "SELECT COUNT(*) FROM checkouts c1 JOIN genres g ON c1.genre = g.genre "
    "JOIN checkouts c2 ON c2.genre = g.genre AND c2.member_id = c1.member_id",
    # c3 (INNER) is unit-equal to c1 and c2 on every joined row
    "SELECT COUNT(*) FROM checkouts c1 JOIN genres g ON c1.genre = g.genre JOIN checkouts c2 ON c2.genre = g.genre "
    "JOIN checkouts c3 ON c3.member_id = c1.member_id AND c3.member_id = c2.member_id",
    "SELECT COUNT(*) FROM checkouts c LEFT JOIN members m ON m.id = c.member_id "
    "LEFT JOIN checkouts d ON d.member_id = m.id",
    "SELECT COUNT(*) FROM genres g LEFT JOIN checkouts c ON c.genre = g.genre LEFT JOIN members m "
    "ON m.id = c.member_id",
    "SELECT COUNT(*) FROM checkouts a JOIN checkouts b USING (member_id) JOIN checkouts c ON c.member_id = b.member_id",
])
def test_connected_joins_are_accepted(tmp_path, sql):
    pol = policy(tmp_path)
    plan = parse_query(sql, pol)
    assert isinstance(plan.source, JoinSource) and plan.source.unit_graph.unconnected() is None


@pytest.mark.parametrize("sql, table, words", [
    (AUDIT, "checkouts (c2)", "through a public table"),
    ("SELECT COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre JOIN members m ON m.edu = g.category",
     "members (m)", "through a public table"),
    # a self-join through a public table (LEFT or not)
    ("SELECT COUNT(*) FROM checkouts a JOIN genres g ON a.genre = g.genre JOIN checkouts b ON b.genre = g.genre",
     "checkouts (b)", "through a public table"),
    ("SELECT COUNT(*) FROM checkouts a JOIN genres g USING (genre) LEFT JOIN checkouts b ON b.genre = g.genre",
     "checkouts (b)", "through a public table"),
    # c2 and c1 meet only through a LEFT-joined c3: where c3 has no row, their units are not compared
    ("SELECT COUNT(*) FROM checkouts c1 JOIN genres g ON c1.genre = g.genre JOIN checkouts c2 ON c2.genre = g.genre "
     "LEFT JOIN checkouts c3 ON c3.member_id = c1.member_id AND c3.member_id = c2.member_id", "checkouts (c2)",
     "LEFT JOIN"),
    # the last table of a long chain is linked to the chain only through the public table
    ("SELECT COUNT(*) FROM checkouts c1 JOIN members m ON m.id = c1.member_id JOIN checkouts c2 "
     "ON c2.member_id = m.id JOIN genres g ON g.genre = c2.genre JOIN checkouts c3 ON c3.genre = g.genre",
     "checkouts (c3)", "through a public table"),
])
def test_unconnected_protected_tables_are_refused(gw, sql, table, words):
    before = gw.ledger.spend("members").charges
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("lib", sql, consumer="analysts", budget=QueryBudget(rho=1.0))
    assert e.value.details["table"] == table and words in e.value.message
    assert gw.ledger.spend("members").charges == before


@pytest.mark.parametrize("sql, words", [
    # a LEFT JOIN's condition on two earlier tables decides matches, not rows
    ("SELECT COUNT(*) FROM checkouts c JOIN genres g ON c.genre = g.genre LEFT JOIN genres h "
     "ON h.genre = c.genre AND g.category = c.genre", "in the ON of LEFT JOIN genres (h)"),
    ("SELECT COUNT(*) FROM checkouts c LEFT JOIN genres g ON g.genre = c.genre JOIN genres h "
     "ON h.genre = c.genre AND g.genre = c.genre", "would move into the ON of LEFT JOIN genres (g)"),
    ("SELECT COUNT(*) FROM checkouts c JOIN members m ON m.id = c.member_id JOIN genres g ON m.id = c.member_id",
     "groups with no equality between them: checkouts (c), members (m) and genres (g)"),
    ("SELECT COUNT(*) FROM (SELECT member_id, COUNT(*) AS n FROM checkouts GROUP BY member_id) u "
     "JOIN genres g ON u.n = g.genre", "a per-unit subquery cannot be joined"),
    # the LEFT-joined table's unit is not the joined rows' unit where it has no row: an anti-join
    # (WHERE c.member_id IS NULL) would have become "the unit is NULL" (every row dropped)
    ("SELECT m.edu, COUNT(*) FROM members m LEFT JOIN checkouts c ON c.member_id = m.id "
     "WHERE c.member_id IS NULL GROUP BY m.edu", "c.member_id is the privacy unit of a LEFT-joined table"),
    ("SELECT COUNT(c.member_id) FROM members m LEFT JOIN checkouts c ON c.member_id = m.id",
     "c.member_id is the privacy unit of a LEFT-joined table"),
])
def test_joins_whose_meaning_the_rewrite_would_change_are_refused(gw, sql, words):
    with pytest.raises(UnsupportedQuery) as e:
        gw.query("lib", sql, consumer="analysts", budget=QueryBudget(rho=1.0))
    assert words in e.value.message and gw.ledger.spend("members").charges == 0


def test_unit_graph_is_checked_when_it_is_built():
    from dpgate.sql.joins import UnitGraph

    UnitGraph((("a", "a"), ("b", "b"), ("c", "c")), frozenset(), (("a", "b"), ("b", "c")))
    UnitGraph((("a", "a"), ("b", "b"), ("c", "c")), frozenset(), (("a", "c"), ("b", "c")))  # c INNER: a hub
    UnitGraph((("a", "a"), ("b", "b")), frozenset({"b"}), (("a", "b"),))  # b LEFT-joined to a
    with pytest.raises(UnsupportedQuery, match="protected table b must be joined"):
        UnitGraph((("a", "a"), ("b", "b"), ("c", "c")), frozenset({"c"}), (("a", "c"), ("b", "c")))
    with pytest.raises(UnsupportedQuery, match="protected table c must be joined"):
        UnitGraph((("a", "a"), ("b", "b"), ("c", "c")), frozenset(), (("a", "b"),))
    assert UnitGraph(()).unconnected() is None
