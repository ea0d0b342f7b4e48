"""The row choice of a per-unit subquery (issue 21 item 9; dpgate.sql.per_unit._hash_parts).

Each unit keeps its first c = k·m rows in the order of md5 over parts with the same bytes on every
engine: ints as text, text as ``<length>.<text>``, NULL as ``n``, floats and dates by their
``dense_rank`` among the unit's rows. Checked here on DuckDB (the other engines run the same tree:
tests/test_engine_parity.py): the per-unit row of every other unit is unchanged, exactly, when one
unit is removed (the choice reads only the unit's own rows), and the choice does not depend on
the rows' storage order (ties agree on every column the aggregates read).
"""

from __future__ import annotations

import math

import duckdb
from hypothesis import HealthCheck, given, settings, strategies as st

from dpgate.policy import load_policies
from dpgate.sql.parse import parse_query
from dpgate.sql.sources import plan_policy

POLICY = """
[dataset]
name = "trips"
population = "riders"
data_version = "v1"

[budget]
epsilon = 4.0
delta = 1e-5
default_query_rho = 0.1

[tables.trips]
source = "{source}"
privacy_unit = "rider"
max_groups_per_unit = 1
max_rows_per_unit = 3

[tables.trips.columns]
rider = {{ type = "int" }}
km = {{ type = "float", lower = 0, upper = 100, resolution = 0.01 }}
note = {{ type = "text" }}
day = {{ type = "date" }}
"""
INNER = ("SELECT COUNT(*) AS n FROM (SELECT rider, SUM(km) AS s, MAX(km) AS mk, COUNT(note) AS nn, "
         "COUNT(DISTINCT note) AS dn, COUNT(DISTINCT day) AS dd FROM trips GROUP BY rider) AS u")


def _policy(tmp_path):
    src = tmp_path / "trips.csv"
    src.write_text("rider,km,note,day\n1,1.5,a,2024-01-01\n")
    (tmp_path / "p").mkdir(exist_ok=True)
    (tmp_path / "p" / "trips.toml").write_text(POLICY.format(source=src))
    return load_policies(tmp_path / "p")["trips"]


def _per_unit_rows(policy, rows) -> dict[int, tuple]:
    plan = parse_query(INNER, policy)
    view = plan_policy(plan, policy).table(plan.table)
    con = duckdb.connect()
    try:
        con.execute('CREATE SCHEMA "trips"')
        con.execute('CREATE TABLE "trips"."trips" (rider BIGINT, km DOUBLE, note VARCHAR, day DATE)')
        if rows:
            con.executemany('INSERT INTO "trips"."trips" VALUES (?, ?, ?, ?)', rows)
        # DuckDB's own hash() is what the engines replace: run the planner's tree through the DuckDB engine's
        # portable rendering, as every engine does
        from dpgate.engines.hashing import portable_group_hash

        sql = portable_group_hash(view.join_tree.copy()).sql(dialect="duckdb")
        return {r[0]: tuple(r[1:]) for r in con.execute(sql).fetchall()}
    finally:
        con.close()


_FLOATS = st.sampled_from([0.0, -0.0, 1.5, 2.25, 1e300, -1e300, math.inf, math.nan, 0.1, 100.0, None])
_ROWS = st.lists(st.tuples(st.integers(0, 4), _FLOATS, st.sampled_from(["a", "b:", ":b", "", None, "é"]),
                           st.sampled_from(["2024-01-01", "2024-02-29", None])), min_size=1, max_size=30)


def _same(a: tuple, b: tuple) -> bool:
    return all(x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a, b))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_ROWS, victim=st.integers(0, 4), seed=st.randoms(use_true_random=False))
def test_removing_a_unit_changes_no_other_units_row_and_storage_order_changes_nothing(tmp_path, rows, victim, seed):
    policy = _policy(tmp_path)
    full = _per_unit_rows(policy, rows)
    without = _per_unit_rows(policy, [r for r in rows if r[0] != victim])
    assert set(full) - set(without) <= {victim} and set(without) <= set(full)
    for unit, row in without.items():
        assert _same(row, full[unit]), (unit, row, full[unit])
    shuffled = list(rows)
    seed.shuffle(shuffled)
    again = _per_unit_rows(policy, shuffled)
    assert set(again) == set(full) and all(_same(again[u], full[u]) for u in full)


def test_the_hash_reads_ranks_for_floats_and_dates_and_never_a_float_text(tmp_path):
    policy = _policy(tmp_path)
    plan = parse_query(INNER, policy)
    sql = plan_policy(plan, policy).table(plan.table).join_sql
    assert 'DENSE_RANK() OVER (PARTITION BY "rider" ORDER BY "km")' in sql
    assert 'DENSE_RANK() OVER (PARTITION BY "rider" ORDER BY "day")' in sql
    assert "HASH(\"rider\", \"__dpg_h0\", COALESCE(CAST(LENGTH(\"note\") AS TEXT) || '.' || \"note\", 'n'), " \
           "\"__dpg_h1\")" in sql
    # a unit with more than c = 3 rows keeps 3, whatever their values
    rows = [(7, v, "x", "2024-01-01") for v in (5.0, 1.0, math.nan, None, 2.0)]
    s, mk, nn, dn, dd = _per_unit_rows(policy, rows)[7]
    assert (nn, dn, dd) == (3, 1, 1)


def test_rows_with_nulls_are_chosen_by_their_values_not_their_storage_order(tmp_path):
    # every row has a NULL: md5 of the rows' text joined with || was NULL for all of them, and the
    # rows kept (c = 3 of 5) followed the storage order; with NULL as 'n' they follow their values
    policy = _policy(tmp_path)
    rows = [(7, float(v), None, "2024-01-01") for v in (1, 2, 3, 4, 5)]
    forward, backward = _per_unit_rows(policy, rows)[7], _per_unit_rows(policy, rows[::-1])[7]
    assert forward == backward
    assert forward[2:] == (0, 0, 1)  # COUNT(note), COUNT(DISTINCT note), COUNT(DISTINCT day)
