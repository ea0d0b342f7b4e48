"""The portable group hashes read a NULL key as a key (trial finding, 2026-12-04).

md5 of a text concatenation with a NULL is NULL, and so was the arithmetic hash of a NULL key; a
NULL hash sorts after every other, so a unit never kept its NULL-key group when it had k others
(``GROUP BY CASE WHEN tokens > 1000 THEN 'big' END`` released 'big' as if every unit kept it). Now
both hashes give a NULL key a value of its own; on non-NULL inputs they are unchanged (the same
groups are kept for the same salt as before).
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot

from dpgate.engines.hashing import arithmetic_group_hash, portable_group_hash

SALT = 987654321


def _hashes(con, sql_hash: str) -> list[tuple]:
    return con.execute(f"SELECT __dpg_u, __dpg_g0, {sql_hash} AS h FROM t ORDER BY 1, 2 NULLS LAST").fetchall()


@pytest.fixture
def con():
    c = duckdb.connect()
    # 2000 units, each with a NULL-key group and a group 1 (the arithmetic hash) / 'a' (md5)
    c.execute("CREATE TABLE t AS SELECT u AS __dpg_u, g AS __dpg_g0 FROM range(2000) r(u), "
              "(VALUES (1), (NULL)) v(g)")
    return c


def _rendered(portable: bool) -> str:
    tree = sqlglot.parse_one(f"SELECT hash(__dpg_u, __dpg_g0, {SALT}) FROM t", read="duckdb")
    tree = (portable_group_hash(tree) if portable
            else arithmetic_group_hash(tree, "duckdb", {"__dpg_u", "__dpg_g0"}))
    return tree.expressions[0].sql(dialect="duckdb")


@pytest.mark.parametrize("portable", [True, False])
def test_a_null_key_has_a_hash_and_is_kept_about_half_the_time(con, portable):
    rows = _hashes(con, _rendered(portable))
    assert all(h is not None for _, _, h in rows)
    # k = 1: each unit keeps its group of smallest hash; NULL should win ~half of 2000 units
    best: dict[int, tuple] = {}
    for u, g, h in rows:
        if u not in best or (h, g is None) < best[u]:
            best[u] = (h, g is None)
    null_wins = sum(is_null for _, is_null in best.values())
    # Binomial(2000, 1/2): mean 1000, sd ≈ 22.4; ± 6 sd. Before the fix: 0.
    assert 865 <= null_wins <= 1135, null_wins


def test_non_null_inputs_hash_as_before(con):
    new = _hashes(con, _rendered(True))
    old = _hashes(con, f"md5(CAST(__dpg_u AS TEXT) || ':' || CAST(__dpg_g0 AS TEXT) || ':' || CAST({SALT} AS TEXT))")
    assert [r for r in new if r[1] is not None] == [r for r in old if r[1] is not None]
    assert all(r[2] is None for r in old if r[1] is None)  # the defect the COALESCE removes
