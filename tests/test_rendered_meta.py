"""The planner's types and flags reach the engines on the tree (issue 20 steps 3 and 4; dpgate.rendered).

* every node of a plan's row expressions is typed once, by the planner (``sql.node_types``), and the
  types agree with the binder's on every node the binder binds;
* the bounded trees keep a type on every node an engine rewrites (inside ``TRY``, and the arguments
  of date parts), over every golden query;
* an engine that needs a type and finds none raises an internal error (a forgotten case fails);
* engines take trees only, read the renderer's flags (not generated names) and refuse an unmarked
  tree.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlglot import exp

import dpgate.pipeline.planning  # noqa: F401 - installs the planner's table-less evaluator
from _golden_render import duckdb_engine, postgres_engine, spark_engine
from dpgate.engines.postgres import _PgPredicates
from dpgate.errors import Conflict, ExecutionError, Internal, UnsupportedQuery
from dpgate.rendered import flags, mark, parse_generated, type_of
from dpgate.sql.bind import Binder, bind_value, row_column
from dpgate.sql.columns import TableScope
from dpgate.sql.bound import bounded_query
from dpgate.sql.parse import parse_query
from dpgate.sql.public import reads_public_only, releases_public_keys_only
from dpgate.sql.sources import plan_policy
from dpgate.sql.temporal import date_part
from tests.test_compile_golden import QUERIES, _policies

#: WHERE predicates over the quickstart's ``prompts`` (region text, week int, tokens float, model text).
WHERES = [
    "week * 2 + 1 > 10",
    "tokens - week * 3 < 100 AND -week < 0",
    "ABS(week - 20) <= 5 OR LOWER(model) LIKE 'g%'",
    "TRY_CAST(week AS DOUBLE) * 1.5 > tokens",
    "COALESCE(week, 0) + LENGTH(region) BETWEEN 3 AND 40",
    "region || model = 'eugpt' AND week IN (1, 2, 3)",
]

#: Nodes whose binder type is another than the engines' spelling type (sql.node_types docstring):
#: FLOOR/CEIL (DuckDB answers a double; the rewrite keeps the argument's type).
_SPELLED_AS_ARGUMENT = (exp.Floor, exp.Ceil)


@pytest.fixture(scope="module")
def policies():
    return _policies()


def _typed_nodes(tree: exp.Expression):
    return [n for n in tree.walk() if not isinstance(n, (exp.Identifier, exp.DataType, exp.Var, exp.DataTypeParam))]


@pytest.mark.parametrize("where", WHERES)
def test_the_planners_types_agree_with_the_binder(policies, where):
    policy = policies["usage"]
    plan = parse_query(f"SELECT COUNT(*) FROM prompts WHERE {where}", policy)
    tree = plan.where_tree()
    assert all(type_of(n) is not None for n in _typed_nodes(tree)), "every node typed once, by the planner"
    e = Binder(row_column(TableScope(policy.table("prompts")))).bind(tree)
    checked = 0
    for sub in e.walk():
        if sub.type == "null" or isinstance(sub.node, _SPELLED_AS_ARGUMENT) or sub.node is not None and \
                sub.kind == "literal" and sub.type in ("date", "timestamp"):
            continue
        assert type_of(sub.node) == sub.type, (where, sub.node.sql(), sub.type, type_of(sub.node))
        checked += 1
    assert checked >= 3


def test_aggregated_values_are_typed_as_bound(policies):
    policy = policies["usage"]
    plan = parse_query("SELECT SUM(CASE WHEN week > 3 THEN tokens * 2 ELSE 0 END) AS s FROM prompts", policy)
    (value,) = plan.values
    tree = plan.value_tree(value.expression)
    e = bind_value(tree, policy.table("prompts"))
    for sub in e.walk():
        if sub.type != "null":
            assert type_of(sub.node) == sub.type, sub.node.sql()


def _needs_type(tree: exp.Expression) -> list[exp.Expression]:
    """The nodes an engine rewrite reads a type of: everything inside TRY, the argument of every date part."""
    out = []
    for t in tree.find_all(exp.Try):
        out += _typed_nodes(t)
    for node in tree.walk():
        try:
            part = date_part(node)
        except UnsupportedQuery:
            part = None
        if part is not None:
            out.append(part[1])
    return out


def test_every_node_an_engine_rewrites_carries_the_planners_type(policies):
    checked = 0
    for name, (dataset, sql) in QUERIES.items():
        policy = policies[dataset]
        plan = parse_query(sql, policy)
        policy = plan_policy(plan, policy)
        base = replace(plan, primitives=tuple(p for p in plan.primitives if p.kind != "quantile"))
        if reads_public_only(plan, policy) or releases_public_keys_only(plan, policy) or not base.primitives:
            continue
        tree = bounded_query(base, policy, salt=1)
        missing = [n.sql() for n in _needs_type(tree) if type_of(n) is None]
        assert not missing, (name, missing[:3])
        checked += len(_needs_type(tree))
    assert checked > 50


def test_an_untyped_node_is_an_internal_error_never_a_guess():
    tree = parse_generated('SELECT count(*) AS n FROM "ds"."t" WHERE TRY("t"."a" + 1 > 0)')
    with pytest.raises(Internal, match="no planner type"):
        _PgPredicates("postgres").rewrite(tree)


def test_engines_take_trees_only_and_refuse_unmarked_trees(policies):
    policy = policies["usage"]
    engine = duckdb_engine(policy)
    with pytest.raises(ExecutionError, match="query tree"):
        engine.render('SELECT count(*) FROM "usage"."prompts"')  # type: ignore[arg-type]
    unmarked = exp.select(exp.Count(this=exp.Star())).from_(exp.table_("prompts", db="usage"))
    with pytest.raises(Internal, match="flags"):
        engine.render(unmarked)
    with pytest.raises(Internal):
        flags(unmarked)
    assert "count(*)" in engine.render(mark(unmarked, unit_unique=False, per_unit=False)).lower()


def test_the_unit_unique_flag_is_read_not_the_generated_name(policies):
    policy = policies["usage"]
    plan = parse_query("SELECT COUNT(*) FROM prompts", policy)
    general = bounded_query(plan, policy, salt=1)  # its CTE is "__dpg_rows"
    assert flags(general) == (False, False)
    flagged = mark(general.copy(), unit_unique=True, per_unit=False)  # the name says nothing any more
    for engine in (duckdb_engine(policy), postgres_engine(policy)):  # prompts not unique at this load
        engine.render(general)
        with pytest.raises(Conflict):
            engine.render(flagged)
    fast = bounded_query(plan, policy, salt=1, unit_unique=True)
    assert flags(fast) == (True, False)
    duckdb_engine(policy, unique=["prompts"]).render(fast)


def test_spark_renders_per_unit_trees(policies):
    # since issue 21 item 9 Spark runs per-unit subqueries (the row hash's parts have the same bytes
    # on every engine): the flag no longer makes it refuse
    policy = policies["usage"]
    spark = spark_engine(policy)
    if spark is None:
        pytest.skip("pyspark is not installed")
    plan = parse_query("SELECT COUNT(*) FROM prompts", policy)
    tree = bounded_query(plan, policy, salt=1)
    assert spark.render(mark(tree.copy(), unit_unique=False, per_unit=True)) == spark.render(tree)
