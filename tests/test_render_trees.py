"""The generated SQL built as sqlglot trees (issue 20 step 4) is the statement the text
builders write (which explain shows, and DuckDB runs as is when no engine transform applies).

Over every golden query of tests/test_compile_golden.py, general and unit-unique forms:
``parse_one(text) == tree`` for the bounded query and each quantile histogram (so every engine
renders the tree as it rendered the parsed text), and building a tree parses no SQL.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import sqlglot
from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

from dpgate.engines.base import assumes_unique_units
from dpgate.engines.types import datatype
from dpgate.sql.bound import aggregates_per_unit, bounded_query, bounded_sql
from dpgate.sql.sources import plan_policy
from dpgate.sql.parse import parse_query
from dpgate.sql.public import reads_public_only, releases_public_keys_only
from dpgate.sql.quantile import histogram_query, histogram_sql
from tests.test_compile_golden import QUERIES, _policies

SALT = 6_148_914_691_236_517_205  # a 63-bit salt, not 0: the literal is compared too


@pytest.fixture(scope="module")
def plans():
    policies = _policies()
    out = []
    for name, (dataset, sql) in QUERIES.items():
        policy = policies[dataset]
        plan = parse_query(sql, policy)
        out.append((name, plan, plan_policy(plan, policy)))
    return out


def _noisy(plan, policy) -> bool:
    return not reads_public_only(plan, policy) and not releases_public_keys_only(plan, policy)


def test_bounded_tree_is_the_text(plans):
    checked = 0
    for name, plan, policy in plans:
        base = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))
        if not _noisy(plan, policy) or not base.primitives:
            continue
        for unique in (False, True):
            tree = bounded_query(base, policy, salt=SALT, unit_unique=unique)
            text = bounded_sql(base, policy, salt=SALT, unit_unique=unique)
            assert tree == sqlglot.parse_one(text, read="duckdb"), (name, unique)
            table = policy.table(base.table)
            assert tree.meta["unit_unique"] == (not aggregates_per_unit(table, unit_unique=unique)
                                                and not table.record_level)
            assert assumes_unique_units(tree) == tree.meta["unit_unique"]
            checked += 1
    assert checked >= 40


def test_histogram_tree_is_the_text(plans):
    checked = 0
    for name, plan, policy in plans:
        if not _noisy(plan, policy):
            continue
        for column in dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile"):
            tree = histogram_query(plan, policy, column, salt=SALT)
            assert tree == sqlglot.parse_one(histogram_sql(plan, policy, column, salt=SALT), read="duckdb"), name
            checked += 1
    assert checked >= 4


def test_building_the_trees_parses_nothing(plans, monkeypatch):
    calls = []
    for attr in ("parse", "parse_into"):
        original = getattr(Dialect, attr)
        monkeypatch.setattr(Dialect, attr, lambda self, *a, _o=original, **k: calls.append(a) or _o(self, *a, **k))
    checked = 0
    for name, plan, policy in plans:
        if not _noisy(plan, policy) or plan.where is not None or plan.computed_keys or plan.values \
                or getattr(policy.table(plan.table), "join_sql", ""):
            continue  # the WHERE, computed keys, derived values and joins are still text (steps 2, 3)
        base = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))
        calls.clear()
        if base.primitives:
            bounded_query(base, policy, salt=SALT)
        for column in dict.fromkeys(p.column for p in plan.primitives if p.kind == "quantile"):
            histogram_query(plan, policy, column, salt=SALT)
        assert calls == [], (name, calls[:2])
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("name", ["varchar", "bigint", "double", "date", "timestamp", "numeric",
                                  "decimal(38, 0)"])
def test_datatype_is_what_build_parses(name):
    assert datatype(name) == exp.DataType.build(name)


def test_timestamp_ntz_is_sparks():
    assert datatype("timestamp_ntz") == exp.DataType.build("timestamp_ntz", dialect="spark")


def test_join_trees_are_the_join_sql(plans):
    checked = 0
    for name, plan, policy in plans:
        table = policy.table(plan.table)
        if getattr(table, "join_sql", ""):
            assert table.join_tree is not None, name
            assert table.join_tree == sqlglot.parse_one(table.join_sql, read="duckdb"), name
            checked += 1
    assert checked >= 8


def test_exact_tree_is_the_text(plans):
    from dpgate.sql.public import exact_query, exact_sql

    checked = 0
    for name, plan, policy in plans:
        if reads_public_only(plan, policy):
            tree = exact_query(plan, policy)
            assert tree == sqlglot.parse_one(exact_sql(plan, policy), read="duckdb"), name
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("sql", [
    "SELECT genre, COUNT(*) AS n FROM genres GROUP BY genre ORDER BY n DESC LIMIT 3",
    "SELECT category, COUNT(*) AS n FROM genres WHERE genre <> 'x' GROUP BY category "
    "HAVING COUNT(*) > 1 ORDER BY category DESC NULLS FIRST",
    "SELECT genre, category FROM genres",
    "SELECT COUNT(*) + 1 AS m FROM genres",
])
def test_exact_tree_more_shapes(sql):
    from dpgate.sql.public import exact_query, exact_sql

    policy = _policies()["library_catalog"]
    plan = parse_query(sql, policy)
    assert reads_public_only(plan, policy)
    assert exact_query(plan, policy) == sqlglot.parse_one(exact_sql(plan, policy), read="duckdb")


def test_key_list_trees_are_the_text():
    from dpgate.sql.public import key_tuples_query, key_values_query

    table = _policies()["library_catalog"].table("genres")
    rel = table.relation
    assert key_values_query(table, "genre", 1001) == sqlglot.parse_one(
        f'SELECT DISTINCT "genre" AS v FROM {rel} WHERE "genre" IS NOT NULL ORDER BY v LIMIT 1001', read="duckdb")
    assert key_tuples_query(table, ["genre", "category"], 1001) == sqlglot.parse_one(
        f'SELECT DISTINCT "genre", "category" FROM {rel} LIMIT 1001', read="duckdb")


def test_per_unit_flag(plans):
    """The per-unit flag marks exactly the trees with per-unit rows (engines read it, not the ``__dpg_rn`` name)."""
    flagged = 0
    for name, plan, policy in plans:
        base = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))
        if not _noisy(plan, policy) or not base.primitives:
            continue
        tree = bounded_query(base, policy, salt=SALT)
        assert tree.meta["per_unit"] == any(c.name == "__dpg_rn" for c in tree.find_all(exp.Column)), name
        flagged += tree.meta["per_unit"]
    assert flagged >= 2


def test_duckdb_runs_the_tree_it_is_given(plans):
    """DuckDB renders the tree it receives (no stored text): a changed tree runs changed."""
    from tests._golden_render import duckdb_engine

    name, plan, policy = next(p for p in plans if p[0] == "count_star")
    engine = duckdb_engine(policy)
    try:
        tree = bounded_query(plan, policy, salt=SALT)
        assert engine.render(tree) == tree.sql(dialect="duckdb")
        assert "duckdb_sql" not in tree.meta
        changed = tree.copy()
        next(changed.find_all(exp.Table)).set("this", exp.to_identifier("other", quoted=True))
        assert "other" in engine.render(changed) and engine.render(changed) != engine.render(tree)
    finally:
        engine.close()


def test_plan_policy_reads_the_plans_source():
    """``plan_policy`` declares the view of the source node the plan carries (no parse, no
    registry): the same view object, whichever policy object it is added to."""
    import dataclasses

    policy = _policies()["library_catalog"]
    sql = "SELECT m.gender, COUNT(*) AS n FROM checkouts c JOIN members m ON c.member_id = m.id GROUP BY m.gender"
    plan = parse_query(sql, policy)
    planned = plan_policy(plan, policy)
    assert planned.table(plan.table) is plan.source.table and plan.source.rows() is not None
    assert plan_policy(plan, planned) is planned  # already declared
    other = plan_policy(plan, dataclasses.replace(policy))
    assert other is not planned and other.table(plan.table) is plan.source.table
