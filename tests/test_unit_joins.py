"""Issue 25 item 5: a join of two integer-stored, undeclared privacy units compares them as integers
(dpgate.engines.unit_joins): the same joined rows, hence the same bounded vector for the same salt,
as the ``CAST(… AS VARCHAR)`` equality the planner writes; text-stored units keep the cast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings, strategies as st

from _engines import PG_URL, pg_load, pg_schema, pg_unavailable

from dpgate.engines.base import query_tree
from dpgate.engines.duckdb import DuckDBEngine
from dpgate.engines.hashing import group_hash
from dpgate.policy import load_policy
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query
from dpgate.sql.quantile import histogram_query
from dpgate.sql.sources import plan_policy
import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator

POLICY = """
[dataset]
name = "shop"
population = "people"

[budget]
epsilon = 10.0
delta = 1e-6
default_query_rho = 0.01

[allocations]
analysts = 1.0

[tables.events]
source = "events.parquet"
privacy_unit = "user_id"
max_groups_per_unit = {k}
max_rows_per_unit = 3

[tables.events.columns]
x = {{ type = "float", lower = 0, upper = 100, resolution = 1 }}
day = {{ type = "int", public_keys = "range(0, 3)" }}

[tables.users]
source = "users.parquet"
privacy_unit = "user_id"
max_groups_per_unit = 1
max_rows_per_unit = 1

[tables.users.columns]
tier = {{ type = "int", public_keys = "range(0, 3)" }}
"""

QUERIES = [
    "SELECT u.tier, COUNT(*) AS n, SUM(e.x) AS s FROM events e JOIN users u USING (user_id) GROUP BY u.tier",
    "SELECT e.day, u.tier, COUNT(*) AS n FROM events e JOIN users u ON e.user_id = u.user_id GROUP BY e.day, u.tier",
    "SELECT COUNT(*) AS n, SUM(x) AS s FROM events e JOIN users u ON u.user_id = e.user_id WHERE u.tier < 2",
]


def _parquet(path: Path, header: str, rows) -> None:
    """Typed columns (Parquet keeps an integer unit an integer; a CSV unit loads as text)."""
    names = header.split(",")
    pq.write_table(pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}), path)


def _engine(root: Path, events, users, k: int = 2) -> DuckDBEngine:
    root.mkdir(parents=True, exist_ok=True)
    _parquet(root / "events.parquet", "user_id,x,day", events)
    _parquet(root / "users.parquet", "user_id,tier", users)
    (root / "policies").mkdir(exist_ok=True)
    (root / "policies" / "shop.toml").write_text(POLICY.format(k=k))  # sources relative to root
    engine = DuckDBEngine(load_policy(root / "policies" / "shop.toml"))
    engine.load()
    return engine


def _old_text(engine: DuckDBEngine, tree):
    """The rendering before the rewrite (the group hash only), handed back as a generated tree
    with the original's flags (engines take trees only)."""
    from dpgate.rendered import flags, parse_generated

    text = group_hash(query_tree(tree), engine.policy, engine._tables, "duckdb").sql(dialect="duckdb")
    unit_unique, per_unit = flags(tree)
    return parse_generated(text, unit_unique=unit_unique, per_unit=per_unit)


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        np.testing.assert_array_equal(np.asarray(a[name], dtype=object), np.asarray(b[name], dtype=object))


def _statements(engine: DuckDBEngine, sql: str, salt: int):
    plan = parse_query(sql, engine.policy)
    yield bounded_query(plan, plan_policy(plan, engine.policy), salt=salt)
    if "SUM(" in sql:
        qplan = parse_query(sql.replace("SUM(e.x) AS s", "MEDIAN(e.x) AS med").replace("COUNT(*) AS n, ", ""),
                            engine.policy)
        yield histogram_query(qplan, plan_policy(qplan, engine.policy), "x", salt=salt)


def test_integer_units_join_without_text_casts(tmp_path):
    engine = _engine(tmp_path, [(1, 5.0, 0), (1, 7.0, 1), (2, 9.0, 2)], [(1, 0), (2, 1)])
    tree = next(_statements(engine, QUERIES[0], 7))
    assert 'CAST("events"."user_id" AS TEXT) = CAST("users"."user_id" AS TEXT)' in \
        _old_text(engine, tree).sql(dialect="duckdb")  # what the planner writes (undeclared units)
    text = engine.render(tree)
    assert "AS TEXT) = CAST(" not in text and '"events"."user_id" = "users"."user_id"' in text
    _same(engine.execute(tree), engine.execute(_old_text(engine, tree)))


def test_text_units_keep_the_casts(tmp_path):
    """'07' and '7' are two units of a text column: the join still compares text."""
    engine = _engine(tmp_path, [("07", 5.0, 0), ("7", 7.0, 1), ("a", 1.0, 0)], [("7", 0), ("a", 1)])
    tree = next(_statements(engine, QUERIES[0], 7))
    assert 'CAST("events"."user_id" AS TEXT) = CAST("users"."user_id" AS TEXT)' in engine.render(tree)
    res = engine.execute(tree)
    assert int(np.sum(res["p0"])) == 2  # '7' (one row) and 'a' (one row); '07' meets no user


_ids = st.one_of(st.none(), st.integers(-3, 6))
_events = st.lists(st.tuples(_ids, st.one_of(st.none(), st.sampled_from([-5.0, 0.0, 3.0, 50.0, 100.0, 250.0])),
                             st.integers(0, 3)), min_size=1, max_size=40)
_users = st.lists(st.tuples(_ids, st.integers(0, 3)), min_size=1, max_size=12)  # duplicates and gaps allowed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_events, users=_users, salt=st.integers(0, 2**40), k=st.integers(1, 3))
def test_same_bounded_vector_as_the_text_equality(tmp_path_factory, events, users, salt, k):
    """Random units (NULL, negative, missing on one side, several user rows per unit): every
    bounded vector and quantile histogram equals the one of the VARCHAR-equality rendering."""
    engine = _engine(tmp_path_factory.mktemp("j"), events, users, k)
    try:
        for sql in QUERIES:
            for tree in _statements(engine, sql, salt):
                if engine._tables["events"].unit_integer and engine._tables["users"].unit_integer:
                    assert "AS TEXT) = CAST(" not in engine.render(tree)
                _same(engine.execute(tree), engine.execute(_old_text(engine, tree)))
    finally:
        engine.close()


@pytest.mark.postgres
def test_postgres_compares_integer_units_as_integers_with_the_same_rows(tmp_path):
    """PostgreSQL (int8 units, undeclared): the rewrite fires and the bounded vector equals DuckDB's."""
    reason = pg_unavailable()
    if reason:
        pytest.skip(reason)
    events = [(1, 5.0, 0), (1, 7.0, 1), (2, 9.0, 2), (None, 3.0, 0), (-3, 50.0, 1), (4, 250.0, 2), (4, 1.0, 0)]
    users = [(1, 0), (2, 1), (-3, 2), (4, 1), (4, 2), (9, 0)]
    duck = _engine(tmp_path / "duck", events, users)
    from dpgate.engines.postgres import PostgresEngine

    with pg_schema() as schema:
        pg_load(schema, "events", pa.table({"user_id": pa.array([r[0] for r in events], pa.int64()),
                                            "x": [r[1] for r in events], "day": [r[2] for r in events]}))
        pg_load(schema, "users", pa.table({"user_id": pa.array([r[0] for r in users], pa.int64()),
                                           "tier": [r[1] for r in users]}))
        text = POLICY.format(k=2).replace('source = "events.parquet"', f'source = "{schema}.events"').replace(
            'source = "users.parquet"', f'source = "{schema}.users"').replace(
            '[budget]', f'engine = "postgres"\nconnection = "{PG_URL}"\n\n[budget]')
        (tmp_path / "pg").mkdir()
        (tmp_path / "pg" / "shop.toml").write_text(text)
        pg = PostgresEngine(load_policy(tmp_path / "pg" / "shop.toml"))
        pg.load()
        try:
            for sql in QUERIES:
                for tree in _statements(duck, sql, 11):
                    assert "AS TEXT) = CAST(" not in pg.render(tree) and "AS VARCHAR) = CAST(" not in pg.render(tree)
                    _same(pg.execute(tree), duck.execute(tree))
        finally:
            pg.close()
            duck.close()
