"""Old and new bounded plans release the same vectors (issue 25 items 3 and 4).

Each rewrite of a bounded statement for speed must keep the released distribution exactly: for
the same data and the same salt, the pre-noise vector (COUNT(DISTINCT col): the per-group
distinct counts; quantiles: the per-(group, candidate) histogram the exponential mechanism
scores) must be equal. The previous rendering is frozen here, verbatim, as the reference
(:mod:`bench.previous_plans`: the text forms before these rewrites), and both statements run
through the DuckDB engine's hash rendering (:func:`dpgate.engines.hashing.group_hash`: the
arithmetic group hash for integer units and keys, md5 of the text for the m-value choice), on
hypothesis data with units in several groups and more than m distinct values, NULL values and
NULL or out-of-domain keys.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
import sqlglot
from hypothesis import HealthCheck, example, given, settings, strategies as st

import dpgate.sql.bound as bound_text
from dpgate.engines.base import TableInfo
from dpgate.engines.hashing import group_hash
from dpgate.policy import parse_policy
from dpgate.sql.bound import bounded_query, bounded_sql
from dpgate.sql.parse import parse_query
from dpgate.sql.quantile import histogram_query

from bench.previous_plans import previous_distinct_ctes, previous_histogram_sql


def _policy(k: int, m: int, dtype: str = "int"):
    raw = {"dataset": {"name": "eq", "population": "eq"},
           "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
           "tables": {"t": {"source": "t.parquet", "privacy_unit": "u", "max_groups_per_unit": k,
                            "max_rows_per_unit": m,
                            "columns": {"g": {"type": "int", "public_keys": "range(1, 5)"},
                                        "d": {"type": dtype},
                                        "x": {"type": "float", "lower": 0, "upper": 20, "resolution": 1}}}}}
    return parse_policy(raw, Path("policies/eq.toml"))


_TABLES = {"t": TableInfo("t", "memory", unit_unique=False, unit_integer=True)}


def _run(con, tree, policy) -> list[tuple]:
    text = group_hash(tree, policy, _TABLES, "duckdb").sql(dialect="duckdb")
    return con.execute(text).fetchall()


def _load(con, rows, dtype: str) -> None:
    con.execute("CREATE SCHEMA IF NOT EXISTS eq")
    sql_type = "BIGINT" if dtype == "int" else "VARCHAR"
    con.execute(f"CREATE OR REPLACE TABLE eq.t (u BIGINT, g BIGINT, d {sql_type}, x DOUBLE)")
    if rows:
        conv = (lambda v: v) if dtype == "int" else (lambda v: None if v is None else f"v{v}")
        data = pa.table({"u": pa.array([r[0] for r in rows], pa.int64()),
                         "g": pa.array([r[1] for r in rows], pa.int64()),
                         "d": pa.array([conv(r[2]) for r in rows], pa.int64() if dtype == "int" else pa.string()),
                         "x": pa.array([r[3] for r in rows], pa.float64())})
        con.register("__rows", data)
        con.execute("INSERT INTO eq.t SELECT * FROM __rows")
        con.unregister("__rows")


@pytest.fixture()
def con():
    c = duckdb.connect()
    yield c
    c.close()


_DISTINCT_QUERIES = [
    "SELECT g, COUNT(DISTINCT d) AS n FROM t GROUP BY g",
    "SELECT COUNT(DISTINCT d) AS n FROM t",
    "SELECT g, COUNT(*) AS c, COUNT(DISTINCT d) AS n, SUM(x) AS s FROM t GROUP BY g",
]


def _distinct_both(con, sql: str, policy, salt: int, monkeypatch) -> tuple[list, list]:
    plan = parse_query(sql, policy)
    new = _run(con, bounded_query(plan, policy, salt=salt), policy)
    with monkeypatch.context() as mp:
        mp.setattr(bound_text, "_distinct_ctes", previous_distinct_ctes)
        old_text = bounded_sql(plan, policy, salt=salt)
    old = _run(con, sqlglot.parse_one(old_text, read="duckdb"), policy)
    return old, new


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 5)),
                               st.one_of(st.none(), st.integers(0, 12)), st.floats(0, 20)), max_size=80),
       km=st.sampled_from([(1, 1), (1, 3), (2, 2), (4, 2), (3, 5)]), salt=st.integers(0, 2**63 - 1),
       query=st.sampled_from(_DISTINCT_QUERIES), dtype=st.sampled_from(["int", "text"]))
def test_count_distinct_one_pass_equals_the_previous_plan(con, monkeypatch, rows, km, salt, query, dtype):
    k, m = km
    _load(con, rows, dtype)
    old, new = _distinct_both(con, query, _policy(k, m, dtype), salt, monkeypatch)
    assert new == old


def test_count_distinct_equivalence_is_not_vacuous(con, monkeypatch):
    # units with more than m distinct values in several groups: the choice binds (the counts
    # are below the unbounded ones) and depends on the salt, and old == new for each salt
    rows = [(u, g, (7 * u + 3 * g + i) % 40, 1.0) for u in range(20) for g in (1, 2, 3) for i in range(6)]
    _load(con, rows, "int")
    policy = _policy(2, 3)
    outs = set()
    for salt in range(6):
        old, new = _distinct_both(con, _DISTINCT_QUERIES[0], policy, salt, monkeypatch)
        assert new == old
        outs.add(tuple(new))
    raw = dict(con.execute("SELECT g, COUNT(DISTINCT d) FROM eq.t WHERE g BETWEEN 1 AND 4 GROUP BY g").fetchall())
    assert all(n <= raw.get(g, 0) for g, n in next(iter(outs)))
    assert len(outs) > 1  # the salt changes which values and groups are kept
    assert sum(n for _, n in next(iter(outs))) < sum(raw.values())


def _quantile_policy(k: int, m: int):
    raw = {"dataset": {"name": "eq", "population": "eq"},
           "budget": {"epsilon": 1.0, "delta": 1e-6, "default_query_rho": 0.01},
           "tables": {"t": {"source": "t.parquet", "privacy_unit": "u", "max_groups_per_unit": k,
                            "max_rows_per_unit": m,
                            "columns": {"g": {"type": "int", "public_keys": "range(1, 5)"},
                                        "c": {"type": "text", "public_keys": ["a", "b", "c"]},
                                        "s": {"type": "int"},
                                        "x": {"type": "float", "lower": 0, "upper": 20, "resolution": 1}}}}}
    return parse_policy(raw, Path("policies/eq.toml"))


def _load_quantile(con, rows) -> None:
    con.execute("CREATE SCHEMA IF NOT EXISTS eq")
    con.execute("CREATE OR REPLACE TABLE eq.t (u BIGINT, g BIGINT, c VARCHAR, s BIGINT, x DOUBLE)")
    if rows:
        data = pa.table({"u": pa.array([r[0] for r in rows], pa.int64()),
                         "g": pa.array([r[1] for r in rows], pa.int64()),
                         "c": pa.array([None if r[1] is None else "abcd"[r[1] % 4] for r in rows], pa.string()),
                         "s": pa.array([r[1] for r in rows], pa.int64()),
                         "x": pa.array([r[2] for r in rows], pa.float64())})
        con.register("__rows", data)
        con.execute("INSERT INTO eq.t SELECT * FROM __rows")
        con.unregister("__rows")


_QUANTILE_QUERIES = [
    "SELECT g, MEDIAN(x) AS q FROM t GROUP BY g",
    "SELECT c, g, QUANTILE_CONT(x, 0.9) AS q FROM t GROUP BY c, g",
    "SELECT s, MEDIAN(x) AS q FROM t GROUP BY s",  # privately selected keys: NULL is a key
    "SELECT MEDIAN(x) AS q FROM t",
]


def _histograms_both(con, sql: str, policy, salt: int) -> tuple[list, list]:
    plan = parse_query(sql, policy)
    new = _run(con, histogram_query(plan, policy, "x", salt=salt), policy)
    old = _run(con, sqlglot.parse_one(previous_histogram_sql(plan, policy, "x", salt=salt), read="duckdb"), policy)
    return old, new


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 5)),
                               st.one_of(st.none(), st.floats(-3, 25, allow_nan=False), st.just(float("nan")))),
                     max_size=80),
       km=st.sampled_from([(1, 1), (1, 3), (2, 2), (1, 10), (3, 2)]), salt=st.integers(0, 2**63 - 1),
       query=st.sampled_from(_QUANTILE_QUERIES))
@example(rows=[(1, None, 3.0), (1, None, 4.0), (2, 1, 5.0), (2, 2, 6.0), (3, None, 1.0), (3, 4, 2.0)],
         km=(1, 2), salt=7, query=_QUANTILE_QUERIES[2])  # a unit whose one group is the NULL key (NULL hash)
def test_quantile_histogram_equals_the_previous_plan(con, rows, km, salt, query):
    k, m = km
    _load_quantile(con, rows)
    old, new = _histograms_both(con, query, _quantile_policy(k, m), salt)
    assert new == old


def test_quantile_equivalence_is_not_vacuous(con):
    # k = 1 binds (each unit has values in 3 groups) and the salt moves the chosen groups
    rows = [(u, g, float((3 * u + 5 * g + i) % 21)) for u in range(30) for g in (1, 2, 3) for i in range(4)]
    _load_quantile(con, rows)
    policy = _quantile_policy(1, 2)
    outs = set()
    for salt in range(5):
        old, new = _histograms_both(con, _QUANTILE_QUERIES[0], policy, salt)
        assert new == old
        outs.add(tuple(new))
    assert len(outs) > 1
    assert all(sum(r[-1] for r in out) == 30 * 2 for out in outs)  # one group, m = 2 values per unit
